"""The gateway's error table as exception classes, and the one function that
maps a gRPC status (and its `x-exec-gateway-error-data` trailer) to them."""

from __future__ import annotations

import json
from typing import Any, Optional

import grpc

ERROR_DATA_KEY = "x-exec-gateway-error-data"

# The gateway's own UNAVAILABLE answers that carry no data; any other
# UNAVAILABLE is the transport's (a dropped or refused connection).
_OVERLOADED_TEXT = "Server overloaded; retry later."
_SHUTTING_DOWN_TEXT = "server is shutting down"


class ExecGatewayError(Exception):
    """Any error of the gateway or of the way to it.

    `code` is the gRPC status name (`"NOT_FOUND"`), `message` the gateway's
    text and `data` its machine-readable details, if any."""

    def __init__(self, message: str, *, code: str = "UNKNOWN",
                 data: Optional[dict[str, Any]] = None) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.data = data or {}

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.message!r}, code={self.code!r})"


class ConnectionLost(ExecGatewayError):
    """The gateway could not be reached again within `resume_within`."""


class Unauthenticated(ExecGatewayError):
    """No token, or a forged, expired or unknown one."""


class Forbidden(ExecGatewayError):
    """The token lacks the scope the call needs (`required_scope`)."""

    @property
    def required_scope(self) -> Optional[str]:
        return self.data.get("requiredScope")


class NotFound(ExecGatewayError):
    """A path, process or session that does not exist for this tenant."""


class OwnerRestarted(NotFound):
    """The session's replica restarted since; its processes are gone."""

    @property
    def replica(self) -> Optional[str]:
        return self.data.get("replica")


class AlreadyExists(ExecGatewayError):
    """A process id already in use in the session."""


class InvalidArgument(ExecGatewayError):
    """Bad parameters."""


class SessionAttached(ExecGatewayError):
    """The session is attached to another connection."""


class Unavailable(ExecGatewayError):
    """The gateway answered that it cannot serve the call now."""


class Overloaded(Unavailable):
    """The gateway's or the tenant's in-flight limit: retry later."""


class RateLimited(Overloaded):
    """The tenant's request rate; `retry_after` is in seconds."""

    @property
    def retry_after(self) -> Optional[float]:
        ms = self.data.get("retryAfterMs")
        return ms / 1000 if isinstance(ms, (int, float)) else None


class ShuttingDown(Unavailable):
    """This replica is draining: reconnect (a balancer sends you elsewhere)."""


class OwnerUnavailable(Unavailable):
    """The replica that owns the session cannot be reached (`replica`)."""

    @property
    def replica(self) -> Optional[str]:
        return self.data.get("replica")


class ExecutorUnavailable(Unavailable):
    """The session's remote executor is gone, or none of the pool is free."""

    @property
    def pool(self) -> Optional[str]:
        return self.data.get("pool")

    @property
    def executor(self) -> Optional[str]:
        return self.data.get("executor")


class QuotaExceeded(ExecGatewayError):
    """A tenant quota (`quota`, its `limit`, and `retry_after` seconds when
    waiting helps)."""

    @property
    def quota(self) -> Optional[str]:
        return self.data.get("quota")

    @property
    def limit(self) -> Optional[int]:
        return self.data.get("limit")

    @property
    def retry_after(self) -> Optional[float]:
        ms = self.data.get("retryAfterMs")
        return ms / 1000 if isinstance(ms, (int, float)) else None


class DeadlineExceeded(ExecGatewayError):
    """The call ran past its deadline (the gateway's or the caller's)."""


class Aborted(ExecGatewayError):
    """A stream the gateway had to end (a reader too slow for the live feed).
    Event streams re-attach on their own; this is raised only past
    `resume_within`."""


class Unimplemented(ExecGatewayError):
    """A method this gateway does not serve."""


class Internal(ExecGatewayError):
    """An OS or internal failure."""


class StdinClosed(ExecGatewayError):
    """The process's stdin is closed, or it never had a pipe (`stdin=True`)."""


class CommandTimeout(ExecGatewayError):
    """`run`'s timeout passed; the process was terminated. `stdout` and
    `stderr` hold what it printed until then."""

    def __init__(self, message: str, *, stdout: bytes, stderr: bytes) -> None:
        super().__init__(message, code="DEADLINE_EXCEEDED")
        self.stdout = stdout
        self.stderr = stderr


class OutputLimitExceeded(ExecGatewayError):
    """`run`'s output went past `max_output_bytes`; the process was killed.
    `stdout` and `stderr` hold what it printed until then."""

    def __init__(self, message: str, *, stdout: bytes, stderr: bytes) -> None:
        super().__init__(message, code="RESOURCE_EXHAUSTED")
        self.stdout = stdout
        self.stderr = stderr


class _Transport(Exception):
    """A transport failure, before the retry policy decides (internal).
    `lasting`: one that waiting does not mend (a certificate not trusted)."""

    def __init__(self, message: str, lasting: bool = False) -> None:
        super().__init__(message)
        self.message = message
        self.lasting = lasting


_BY_CODE: dict[grpc.StatusCode, type[ExecGatewayError]] = {
    grpc.StatusCode.UNAUTHENTICATED: Unauthenticated,
    grpc.StatusCode.PERMISSION_DENIED: Forbidden,
    grpc.StatusCode.NOT_FOUND: NotFound,
    grpc.StatusCode.ALREADY_EXISTS: AlreadyExists,
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgument,
    grpc.StatusCode.OUT_OF_RANGE: InvalidArgument,
    grpc.StatusCode.FAILED_PRECONDITION: SessionAttached,
    grpc.StatusCode.RESOURCE_EXHAUSTED: QuotaExceeded,
    grpc.StatusCode.DEADLINE_EXCEEDED: DeadlineExceeded,
    grpc.StatusCode.ABORTED: Aborted,
    grpc.StatusCode.UNIMPLEMENTED: Unimplemented,
}


def _error_data(*metadata: Any) -> dict[str, Any]:
    for md in metadata:
        for key, value in md or ():
            if key == ERROR_DATA_KEY:
                try:
                    data = json.loads(value)
                except (TypeError, ValueError, RecursionError):
                    # Not the gateway's (it sends a flat object): ignored.
                    return {}
                return data if isinstance(data, dict) else {}
    return {}


def classify(e: grpc.aio.AioRpcError) -> ExecGatewayError | _Transport:
    """The exception a failed call stands for; `_Transport` when the
    connection, not the gateway, failed it."""
    return classify_status(e.code(), e.details(), e.trailing_metadata(), e.initial_metadata())


def classify_status(code: Optional[grpc.StatusCode], details: Optional[str],
                    *metadata: Any) -> ExecGatewayError | _Transport:
    """`classify` of a status read off a call."""
    message = details or ""
    data = _error_data(*metadata)
    reason = data.get("reason")
    name = code.name if code is not None else "UNKNOWN"
    if code == grpc.StatusCode.UNAVAILABLE:
        if reason == "rateLimited":
            return RateLimited(message, code=name, data=data)
        if reason == "serverShuttingDown" or message == _SHUTTING_DOWN_TEXT:
            return ShuttingDown(message, code=name, data=data)
        if reason == "ownerUnavailable":
            return OwnerUnavailable(message, code=name, data=data)
        if reason == "executorUnavailable":
            return ExecutorUnavailable(message, code=name, data=data)
        if "quota" in data:
            return QuotaExceeded(message, code=name, data=data)
        if message == _OVERLOADED_TEXT or data:
            return Overloaded(message, code=name, data=data)
        return _Transport(message, lasting="handshake failed" in message.lower())
    if code == grpc.StatusCode.NOT_FOUND and reason == "ownerRestarted":
        return OwnerRestarted(message, code=name, data=data)
    if code in (grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN) and _broken_stream(message):
        # What grpc-core reports when the connection breaks under a stream.
        return _Transport(message)
    return _BY_CODE.get(code, Internal)(message, code=name, data=data)


def _broken_stream(message: str) -> bool:
    m = message.lower()
    return any(s in m for s in ("rst_stream", "connection reset", "socket closed",
                                "broken pipe", "goaway", "stream removed"))


def connection_lost(why: str) -> ConnectionLost:
    return ConnectionLost(f"connection to the gateway lost: {why}", code="UNAVAILABLE")
