"""A process in a session: its events (resumed from the last seq after a
dropped connection), stdin, signals, terminal size and exit."""

from __future__ import annotations

import asyncio
import uuid
from typing import TYPE_CHECKING, AsyncIterator, Callable, Optional, Union

import grpc

from ._errors import (Aborted, AlreadyExists, DeadlineExceeded, ExecGatewayError, Internal,
                      InvalidArgument, NotFound, StdinClosed, _Transport, classify,
                      classify_status)
from ._link import FILE_CHUNK_BYTES, Retrying
from ._types import (Closed, Event, Exited, ExitStatus, Output, OutputLost, SignalName,
                     StreamName)
from .v1 import process_pb2 as pb

if TYPE_CHECKING:
    from ._client import Session

_STREAMS: dict[int, StreamName] = {
    pb.OUTPUT_STREAM_STDOUT: "stdout",
    pb.OUTPUT_STREAM_STDERR: "stderr",
    pb.OUTPUT_STREAM_PTY: "pty",
}

_SIGNALS: dict[str, int] = {
    "interrupt": pb.SIGNAL_KIND_INTERRUPT,
    "terminate": pb.SIGNAL_KIND_TERMINATE,
    "kill": pb.SIGNAL_KIND_KILL,
    "hangup": pb.SIGNAL_KIND_HANGUP,
    "quit": pb.SIGNAL_KIND_QUIT,
    "user1": pb.SIGNAL_KIND_USER1,
    "user2": pb.SIGNAL_KIND_USER2,
}

# The gateway's answer to a write whose pipe has no reader any more.
_BROKEN_STDIN_TEXT = "failed to write to process stdin"



def new_process_id() -> str:
    return "p-" + uuid.uuid4().hex[:16]


def spec(process_id: str, argv: list[str], cwd: str, env: Optional[dict[str, str]],
         tty: bool, stdin: bool) -> pb.ProcessSpec:
    """The spec the Rust client sends too: `env` over the tenant's whole base
    environment."""
    if not argv:
        raise ValueError("argv must not be empty")
    return pb.ProcessSpec(
        process_id=process_id, argv=list(argv), cwd=cwd, env=dict(env or {}),
        tty=tty, pipe_stdin=stdin and not tty,
        env_policy=pb.EnvPolicy(inherit=pb.ENV_INHERIT_ALL))


def _event(ev: pb.ProcessEvent) -> Optional[Event]:
    kind = ev.WhichOneof("event")
    if kind == "output":
        return Output(ev.seq, _STREAMS.get(ev.output.stream, "stdout"), ev.output.data)
    if kind == "exited":
        signal = ev.exited.signal if ev.exited.HasField("signal") else None
        return Exited(ev.seq, ev.exited.exit_code, signal)
    if kind == "closed":
        return Closed(ev.seq)
    return None


class Process:
    """A handle on a process of a session. Iterate it for its events from the
    start (`async for event in process`), or call `events(after_seq)`."""

    def __init__(self, session: "Session", process_id: str) -> None:
        self.session = session
        self.id = process_id
        self._exit: Optional[ExitStatus] = None
        #: The `Exec` stream that started it, until a reader takes it.
        self._held: Optional[grpc.aio.UnaryStreamCall] = None

    def __repr__(self) -> str:
        return f"Process({self.id!r}, session={self.session.id!r})"

    def __aiter__(self) -> AsyncIterator[Event]:
        return self.events()

    def release(self) -> None:
        """Gives up the start's stream unread (the process goes on; a later
        reader attaches from the retained output)."""
        held, self._held = self._held, None
        if held is not None:
            held.cancel()

    def _ids(self) -> dict[str, str]:
        return {"session_id": self.session.id, "process_id": self.id}

    def events(self, after_seq: int = 0) -> AsyncIterator[Event]:
        """Events with seq > `after_seq`, in order, ending after `Closed`. A
        dropped connection, or a live feed this reader fell behind, is resumed
        from the last seq yielded: nothing repeated, nothing lost while the
        gateway retains it (`OutputLost` says what it no longer does)."""
        link = self.session.client.link

        def attach(cursor: int) -> grpc.aio.UnaryStreamCall:
            held, self._held = self._held, None
            if held is not None:
                # The start's own stream, from seq 0: what is not past the
                # cursor is skipped.
                return held
            return link.processes.Attach(
                pb.AttachRequest(after_seq=cursor, **self._ids()), metadata=link.metadata())

        return self._follow(attach, after_seq)

    async def _follow(self, open_call: Callable[[int], grpc.aio.UnaryStreamCall],
                      cursor: int) -> AsyncIterator[Event]:
        """Events from `open_call(cursor)`, opened again from the last seq
        yielded whenever the stream breaks."""
        link = self.session.client.link
        retrying = Retrying(link.resume_within)
        while True:
            call = open_call(cursor)
            try:
                async for msg in call:
                    event = _event(msg.event)
                    if event is None or event.seq <= cursor:
                        continue
                    retrying.progressed()
                    if event.seq > cursor + 1:
                        yield OutputLost(cursor + 1, event.seq - cursor - 1)
                    cursor = event.seq
                    if isinstance(event, Exited):
                        self._exit = ExitStatus(event.exit_code, event.signal)
                    yield event
                    if isinstance(event, Closed):
                        return
                why, lasting = "the event stream ended before the process closed", False
            except grpc.aio.AioRpcError as e:
                err = classify(e)
                # Resumed as after a drop: a process another client started a
                # moment ago (attach once it has), and a stream the gateway
                # dropped because this reader left it unread too long.
                starting = isinstance(err, InvalidArgument) and err.message.endswith(" is starting")
                unread = isinstance(err, DeadlineExceeded) and "stopped reading" in err.message
                if not (starting or unread or isinstance(err, (_Transport, Aborted))):
                    raise err from None
                why, lasting = err.message, isinstance(err, _Transport) and err.lasting
            finally:
                call.cancel()
            await retrying.wait(why, lasting)

    async def write(self, data: Union[bytes, str]) -> None:
        """Writes to stdin (a pipe, or the terminal). Each 1 MiB piece carries
        a write id, so a piece retried after a dropped connection is applied
        once."""
        if isinstance(data, str):
            data = data.encode()
        link = self.session.client.link
        for start in range(0, max(len(data), 1), FILE_CHUNK_BYTES):
            piece = data[start:start + FILE_CHUNK_BYTES]
            # A process still starting is waited for, within resume_within.
            starting = Retrying(link.resume_within)
            while True:
                write_id = uuid.uuid4().hex
                try:
                    resp = await link.call(lambda: link.processes.Write(
                        pb.WriteRequest(data=piece, write_id=write_id, **self._ids()),
                        metadata=link.metadata()))
                except Internal as e:
                    if e.message == _BROKEN_STDIN_TEXT:
                        # The pipe's reader is gone (closed, or exited).
                        raise StdinClosed(f"stdin of process {self.id} is closed: {e.message}",
                                          code=e.code) from None
                    raise
                if resp.status == pb.WRITE_STATUS_STARTING:
                    # Not applied: tried again with a new id.
                    await starting.wait(f"process {self.id} is still starting")
                    continue
                break
            if resp.status == pb.WRITE_STATUS_UNKNOWN_PROCESS:
                raise NotFound(f"unknown process id {self.id}", code="NOT_FOUND")
            if resp.status == pb.WRITE_STATUS_STDIN_CLOSED:
                raise StdinClosed(f"stdin of process {self.id} is closed",
                                  code="FAILED_PRECONDITION")
            if resp.status != pb.WRITE_STATUS_ACCEPTED:
                raise Internal(f"unknown write status {resp.status}", code="INTERNAL")

    async def close_stdin(self) -> None:
        link = self.session.client.link
        await link.call(lambda: link.processes.CloseStdin(
            pb.CloseStdinRequest(**self._ids()), metadata=link.metadata()))

    async def signal(self, name: SignalName) -> None:
        """Sends a signal to the process's group. Not retried after a dropped
        connection (it may have been delivered): `ConnectionLost` then."""
        kind = _SIGNALS.get(name)
        if kind is None:
            raise ValueError(f"unknown signal {name!r}: one of {', '.join(_SIGNALS)}")
        link = self.session.client.link
        await link.call(lambda: link.processes.Signal(
            pb.SignalRequest(signal=kind, **self._ids()), metadata=link.metadata()),
            retry=False)

    async def resize(self, rows: int, cols: int) -> None:
        link = self.session.client.link
        await link.call(lambda: link.processes.Resize(
            pb.ResizeRequest(rows=rows, cols=cols, **self._ids()), metadata=link.metadata()))

    async def terminate(self) -> bool:
        """Kills the process; whether it was still running."""
        link = self.session.client.link
        resp = await link.call(lambda: link.processes.Terminate(
            pb.TerminateRequest(**self._ids()), metadata=link.metadata()))
        return resp.running

    async def wait(self, timeout: Optional[float] = None) -> ExitStatus:
        """The exit status, once the process has exited (its output may still
        be streaming to other readers)."""
        if self._exit is not None:
            return self._exit

        async def until_exit() -> ExitStatus:
            async for event in self.events():
                if isinstance(event, Exited):
                    return ExitStatus(event.exit_code, event.signal)
            raise ExecGatewayError(f"process {self.id} closed without an exit", code="INTERNAL")

        status = await asyncio.wait_for(until_exit(), timeout)
        self._exit = status
        return status


async def launch(process: Process, request: pb.ExecRequest) -> None:
    """Starts the process with `Exec`, whose stream it then holds for the
    first reader: output from seq 0 with back-pressure, none of it lost to
    the gateway's 1 MiB retention however fast the process writes. The
    gateway answers the stream's headers once the process is started, or
    ends the call at once with the start's error. If the connection drops
    before either, `Start` is retried with the same process id ("already
    exists" then means the first attempt started it)."""
    link = process.session.client.link
    call = link.processes.Exec(request, metadata=link.metadata())
    try:
        await call.initial_metadata()
        if call.done():
            code = await call.code()
            if code != grpc.StatusCode.OK:
                err = classify_status(code, await call.details(),
                                      await call.trailing_metadata())
                if not isinstance(err, _Transport):
                    raise err
                raise _Dropped(err.message)
        process._held = call
        return
    except grpc.aio.AioRpcError as e:
        err = classify(e)
        if not isinstance(err, _Transport):
            raise err from None
    except _Dropped:
        pass
    call.cancel()
    # The broken Exec may have started it: "already exists" is success.
    await link.call(lambda: link.processes.Start(
        pb.StartRequest(session_id=request.session_id, spec=request.spec),
        metadata=link.metadata()),
        done_if=lambda e: isinstance(e, AlreadyExists), done=lambda: None, after_drop=True)


class _Dropped(Exception):
    """The connection dropped before `Exec` said whether it started."""
