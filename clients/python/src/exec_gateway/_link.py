"""The channel to the gateway: target and TLS, the bearer token on every
call, and the retry policy that resumes calls across a dropped connection."""

from __future__ import annotations

import asyncio
import ipaddress
import os
import pathlib
from typing import Awaitable, Callable, Optional, TypeVar, Union

import grpc

from ._errors import (ConnectionLost, DeadlineExceeded, ExecGatewayError, _Transport, classify,
                      connection_lost)
from .v1 import (environment_pb2_grpc, file_pb2_grpc, process_pb2_grpc,
                 session_pb2_grpc)

T = TypeVar("T")

Token = Union[str, Callable[[], str], None]
PemSource = Union[str, bytes, os.PathLike, None]

#: How long calls keep trying to reach the gateway again after the
#: connection drops (the Rust client's default too).
DEFAULT_RESUME_WITHIN = 60.0

#: The gateway's message limit is 16 MiB; files move in 1 MiB messages.
MAX_MESSAGE_BYTES = 16 << 20
FILE_CHUNK_BYTES = 1 << 20

#: How long one attempt of a unary call waits for its answer. The gateway
#: answers within its own request deadline (60 s by default): past this, the
#: connection is presumed dead rather than the call slow.
CALL_TIMEOUT = 90.0

_RETRY_FIRST = 0.05
_RETRY_MAX = 1.0

_CHANNEL_OPTIONS = [
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES + (1 << 16)),
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    # A silently dead connection (a balancer dropped it) is noticed within
    # ~30 s, under a stream too; the gateway accepts pings this often.
    ("grpc.keepalive_time_ms", 20_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    ("grpc.http2.max_pings_without_data", 0),
    # Reconnect fast after a drop (grpc's default starts at 1 s and grows to
    # 2 min, longer than a detached session lives).
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 2_000),
]


def _pem(source: PemSource) -> Optional[bytes]:
    if source is None:
        return None
    if isinstance(source, bytes):
        return source
    text = os.fspath(source)
    if isinstance(text, str) and text.lstrip().startswith("-----BEGIN"):
        return text.encode()
    return pathlib.Path(text).read_bytes()


def _loopback(address: str) -> bool:
    host = address.rsplit(":", 1)[0] if not address.endswith("]") else address
    host = host.strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def parse_target(target: str, tls_asked: bool) -> tuple[str, bool]:
    """`grpc://H:P` (plaintext), `grpcs://H:P` (TLS), or `H:P` (TLS only if a
    CA or client certificate is given)."""
    if target.startswith("grpcs://"):
        return target[len("grpcs://"):].rstrip("/"), True
    if target.startswith("grpc://"):
        if tls_asked:
            raise ValueError("a CA or client certificate was given for a grpc:// (plaintext) "
                             "target: use grpcs://")
        return target[len("grpc://"):].rstrip("/"), False
    if "://" in target:
        raise ValueError(f"unsupported target {target!r}: use grpc://HOST:PORT or grpcs://HOST:PORT")
    return target, tls_asked


class Link:
    """One gRPC channel, its stubs, and how calls on it are retried."""

    def __init__(self, target: str, *, token: Token = None, ca: PemSource = None,
                 cert: PemSource = None, key: PemSource = None,
                 resume_within: float = DEFAULT_RESUME_WITHIN,
                 allow_plaintext: bool = False) -> None:
        if (cert is None) != (key is None):
            raise ValueError("a client certificate needs both cert and key")
        address, tls = parse_target(target, ca is not None or cert is not None)
        if not tls and token is not None and not _loopback(address) and not allow_plaintext:
            # A bearer token in the clear is anyone's on the path to it.
            raise ValueError(f"refusing to send a token over plaintext to {address}: use "
                             "grpcs:// (or allow_plaintext=True on a network you trust)")
        self.target = target
        self.resume_within = resume_within
        #: Whether the gateway was ever reached (the channel connected to
        #: it, or it answered a call): until then a failed call is an error
        #: at once (a wrong address, not a drop); after, even under the
        #: first call, a broken connection is a drop, retried as any other.
        self.reached = False
        self._watch: Optional[asyncio.Task[None]] = None
        self._token = token
        if tls:
            creds = grpc.ssl_channel_credentials(root_certificates=_pem(ca),
                                                 private_key=_pem(key),
                                                 certificate_chain=_pem(cert))
            self.channel = grpc.aio.secure_channel(address, creds, options=_CHANNEL_OPTIONS)
        else:
            # No HTTP proxy from the environment (http_proxy, grpc_proxy):
            # the token would cross it in the clear, whatever the target.
            self.channel = grpc.aio.insecure_channel(
                address, options=[*_CHANNEL_OPTIONS, ("grpc.enable_http_proxy", 0)])
        self.sessions = session_pb2_grpc.SessionServiceStub(self.channel)
        self.processes = process_pb2_grpc.ProcessServiceStub(self.channel)
        self.files = file_pb2_grpc.FileServiceStub(self.channel)
        self.environment = environment_pb2_grpc.EnvironmentServiceStub(self.channel)
        try:
            self._watch = asyncio.get_running_loop().create_task(self._watch_ready())
        except RuntimeError:
            # No loop yet: only an answer then tells that it was reached.
            self._watch = None

    async def _watch_ready(self) -> None:
        """Sets `reached` once the channel is connected to the gateway
        (TCP, TLS and HTTP/2 settings done), before any call's answer."""
        state = self.channel.get_state(try_to_connect=False)
        while state != grpc.ChannelConnectivity.READY:
            if state == grpc.ChannelConnectivity.SHUTDOWN:
                return
            await self.channel.wait_for_state_change(state)
            state = self.channel.get_state(try_to_connect=False)
        self.reached = True

    def metadata(self) -> tuple[tuple[str, str], ...]:
        token = self._token() if callable(self._token) else self._token
        return (("authorization", f"Bearer {token}"),) if token else ()

    async def close(self) -> None:
        if self._watch is not None:
            self._watch.cancel()
        await self.channel.close()

    async def call(self, fn: Callable[[], Awaitable[T]], *, retry: bool = True,
                   done_if: Optional[Callable[[ExecGatewayError], bool]] = None,
                   done: Optional[Callable[[], T]] = None, after_drop: bool = False,
                   timeout: Optional[float] = CALL_TIMEOUT) -> T:
        """`fn()` (one attempt of a unary call), retried while the connection
        is down and `retry` allows, for up to `resume_within`; each attempt
        given up after `timeout` seconds without an answer. An error the
        gateway answers to a retry (or, `after_drop`, to a first attempt
        following one that broke elsewhere) that `done_if` accepts (an
        "already exists" an earlier attempt caused) returns `done()`."""
        retrying = Retrying(self.resume_within)
        while True:
            try:
                value = await (fn() if timeout is None else asyncio.wait_for(fn(), timeout))
                self.reached = True
                return value
            except asyncio.TimeoutError:
                raise DeadlineExceeded(f"no answer from the gateway within {timeout} s",
                                       code="DEADLINE_EXCEEDED") from None
            except grpc.aio.AioRpcError as e:
                err = classify(e)
            if not isinstance(err, _Transport):
                self.reached = True
            elif not self.reached:
                raise ConnectionLost(f"cannot reach the gateway at {self.target}: {err.message}",
                                     code="UNAVAILABLE") from None
            if isinstance(err, _Transport):
                if retry and not err.lasting:
                    await retrying.wait(err.message)
                    continue
                raise connection_lost(err.message) from None
            if ((retrying.attempts or after_drop) and done_if is not None and done is not None
                    and done_if(err)):
                return done()
            raise err


class Retrying:
    """Backoff between attempts, and when to stop: `resume_within` after the
    first failure since the last progress."""

    def __init__(self, resume_within: float) -> None:
        self.resume_within = resume_within
        self.attempts = 0
        self._deadline: Optional[float] = None
        self._delay = _RETRY_FIRST

    def progressed(self) -> None:
        self._deadline = None
        self._delay = _RETRY_FIRST

    async def wait(self, why: str, lasting: bool = False) -> None:
        """Sleeps before the next attempt; `ConnectionLost` past the deadline
        (at once for a `lasting` failure)."""
        if lasting:
            raise connection_lost(why)
        loop = asyncio.get_running_loop()
        now = loop.time()
        if self._deadline is None:
            self._deadline = now + self.resume_within
        if now >= self._deadline:
            raise connection_lost(f"no progress within {self.resume_within} s: {why}")
        await asyncio.sleep(min(self._delay, self._deadline - now))
        self._delay = min(self._delay * 2, _RETRY_MAX)
        self.attempts += 1
