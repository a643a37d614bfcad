"""Port forwarding (docs/forward.md): a TCP stream to a port on a session's
own loopback, over `SessionService/ForwardPort`. `Session.connect_port`
gives one stream to send and receive bytes on; `Session.port_forward`
listens on a local port and makes each connection it accepts a stream of
its own."""

from __future__ import annotations

import asyncio
from typing import AsyncIterator, Optional

import grpc

from ._errors import ExecGatewayError, Unavailable, _Transport, classify, connection_lost
from ._link import Link
from .v1 import session_pb2 as spb

#: Most bytes of one message either way (the gateway's bound); `send`
#: splits larger data.
FORWARD_CHUNK_BYTES = 64 << 10


def _error(e: grpc.aio.AioRpcError) -> ExecGatewayError:
    """What a failed ForwardPort call raises. Its UNAVAILABLE (nothing
    listening, the session ended) is the gateway's answer, not a dropped
    connection; FAILED_PRECONDITION is the tenant's network, not a
    session's attachment."""
    if e.code() == grpc.StatusCode.FAILED_PRECONDITION:
        return ExecGatewayError(e.details() or "", code="FAILED_PRECONDITION")
    err = classify(e)
    if isinstance(err, _Transport):
        if e.code() == grpc.StatusCode.UNAVAILABLE and err.message.startswith(_GATEWAY_UNAVAILABLE):
            return Unavailable(err.message, code="UNAVAILABLE")
        return connection_lost(err.message)
    return err


#: The gateway's UNAVAILABLE answers of a forward, which are not a dropped
#: connection.
_GATEWAY_UNAVAILABLE = ("nothing accepts connections", "the session ended",
                        "the connection reached its maximum age",
                        "the server's connection failed")


class PortConnection:
    """One forwarded TCP stream: `send` bytes to the server, `receive` its
    bytes (b"" once it closed its side, with everything delivered),
    `close_write` to end what is sent (the server reads the end of its
    input; what it says goes on arriving), `close` to end it now. An end
    for any other reason (the session ended, the token expired, a message
    over 64 KiB) raises from `receive` or `send`."""

    def __init__(self, call: grpc.aio.StreamStreamCall, port: int) -> None:
        self._call = call
        self.port = port
        self._done_writing = False

    async def __aenter__(self) -> "PortConnection":
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self._chunks()

    async def _chunks(self) -> AsyncIterator[bytes]:
        while chunk := await self.receive():
            yield chunk

    async def send(self, data: bytes) -> None:
        """Sends `data` to the server, in messages of at most 64 KiB."""
        if self._done_writing:
            raise ValueError("the sending side is closed (close_write)")
        try:
            for i in range(0, len(data), FORWARD_CHUNK_BYTES):
                await self._call.write(
                    spb.ForwardPortRequest(data=bytes(data[i:i + FORWARD_CHUNK_BYTES])))
        except grpc.aio.AioRpcError as e:
            raise _error(e) from None
        except asyncio.InvalidStateError:
            # The call ended: `receive` tells how.
            raise await self._ended() from None

    async def _ended(self) -> ExecGatewayError:
        code = await self._call.code()
        details = await self._call.details()
        if code == grpc.StatusCode.OK:
            return ExecGatewayError("the forward ended: the server closed the connection",
                                    code="OK")
        return _error(grpc.aio.AioRpcError(code, await self._call.initial_metadata(),
                                           await self._call.trailing_metadata(), details))

    async def receive(self) -> bytes:
        """The server's next bytes (at most 64 KiB); b"" once it closed its
        side and everything it sent was delivered."""
        try:
            msg = await self._call.read()
        except grpc.aio.AioRpcError as e:
            raise _error(e) from None
        if msg is grpc.aio.EOF:
            code = await self._call.code()
            if code == grpc.StatusCode.OK:
                return b""
            raise await self._ended()
        return msg.data

    async def close_write(self) -> None:
        """Ends what is sent: the server reads the end of its input."""
        if not self._done_writing:
            self._done_writing = True
            await self._call.done_writing()

    def close(self) -> None:
        """Ends the stream now (the gateway closes the connection)."""
        self._call.cancel()


async def connect_port(link: Link, session_id: str, port: int) -> PortConnection:
    """A stream to `port` on the session's loopback, once the gateway has
    made the connection; refused with the gateway's error otherwise."""
    if not 1 <= port <= 65535:
        raise ValueError("the port must be 1 to 65535")
    call = link.sessions.ForwardPort(metadata=link.metadata())
    try:
        await call.write(spb.ForwardPortRequest(
            open=spb.ForwardPortOpen(session_id=session_id, port=port)))
        first = await call.read()
    except grpc.aio.AioRpcError as e:
        raise _error(e) from None
    if first is grpc.aio.EOF:
        code = await call.code()
        raise _error(grpc.aio.AioRpcError(code, await call.initial_metadata(),
                                          await call.trailing_metadata(), await call.details()))
    if first.WhichOneof("kind") != "opened":
        call.cancel()
        raise ExecGatewayError("the gateway did not open the forward", code="INTERNAL")
    return PortConnection(call, port)


class PortForward:
    """A local listening socket (`address`, `host`, `port`) whose
    connections each become a stream to `remote_port` on the session's
    loopback. `close` (or leaving `async with`) stops listening and ends
    the streams."""

    def __init__(self, link: Link, session_id: str, remote_port: int) -> None:
        self._link = link
        self._session_id = session_id
        self.remote_port = remote_port
        self._server: Optional[asyncio.AbstractServer] = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.host = ""
        self.port = 0

    @property
    def address(self) -> str:
        """`HOST:PORT` listened on."""
        return f"{self.host}:{self.port}"

    async def _listen(self, host: str, port: int) -> None:
        self._server = await asyncio.start_server(self._accepted, host, port)
        self.host, self.port = self._server.sockets[0].getsockname()[:2]

    async def __aenter__(self) -> "PortForward":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _accepted(self, reader: asyncio.StreamReader,
                        writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
        try:
            await self._splice(reader, writer)
        except (ExecGatewayError, ConnectionError, OSError):
            pass
        finally:
            writer.close()
            if task is not None:
                self._tasks.discard(task)

    async def _splice(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = await connect_port(self._link, self._session_id, self.remote_port)

        async def up() -> None:
            while data := await reader.read(FORWARD_CHUNK_BYTES):
                await conn.send(data)
            # The local client shut its sending side: so does the stream.
            await conn.close_write()

        sending = asyncio.ensure_future(up())
        try:
            async for chunk in conn:
                writer.write(chunk)
                await writer.drain()
            if writer.can_write_eof():
                writer.write_eof()
        finally:
            sending.cancel()
            conn.close()

    async def close(self) -> None:
        """Stops listening and ends every stream."""
        if self._server is not None:
            self._server.close()
        for t in list(self._tasks):
            t.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()


async def port_forward(link: Link, session_id: str, remote_port: int, *, local_port: int = 0,
                       local_host: str = "127.0.0.1") -> PortForward:
    """Listens on `local_host:local_port` (0: a free port), each connection
    a stream to `remote_port`. One stream is opened first, so that a
    refusal (an unknown session, nothing listening, no `forward` scope) is
    raised here rather than at the first connection."""
    probe = await connect_port(link, session_id, remote_port)
    probe.close()
    forward = PortForward(link, session_id, remote_port)
    await forward._listen(local_host, local_port)
    return forward
