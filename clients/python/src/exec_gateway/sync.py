"""A blocking wrapper of the async API, for scripts and code without an
event loop: each client runs its calls on an event loop of its own, in a
daemon thread. The methods are the async API's, without `await`.

    from exec_gateway.sync import connect

    with connect("grpc://127.0.0.1:8766", token=TOKEN) as client:
        session = client.session()
        print(session.run(["echo", "hello"]).stdout)
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from typing import (Any, AsyncIterable, AsyncIterator, Awaitable, Iterable, Iterator,
                    Optional, TypeVar, Union)

from . import _client
from ._client import SESSION_KEEPALIVE_INTERVAL
from ._errors import ConnectionLost
from ._files import Files as _AsyncFiles
from ._files import PathLike
from ._link import DEFAULT_RESUME_WITHIN, PemSource, Token
from ._process import Process as _AsyncProcess
from ._types import (DirEntry, EgressPolicy, EnvironmentInfo, Event, ExitStatus, Metadata,
                     Preview, Previews, ProcessInfo, Result, SignalName, Snapshot, WalkResult)

T = TypeVar("T")


class _Loop:
    """An event loop in a daemon thread, and a way to wait for its work."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.closed = False
        self._thread = threading.Thread(target=self.loop.run_forever,
                                        name="exec-gateway-sync", daemon=True)
        self._thread.start()

    def run(self, coro: Awaitable[T]) -> T:
        if threading.current_thread() is self._thread:
            _discard(coro)
            raise RuntimeError("a sync exec-gateway call from inside its own event loop")
        if self.closed:
            _discard(coro)
            raise ConnectionLost("the client is closed", code="CANCELLED")
        future = asyncio.run_coroutine_threadsafe(_await(coro), self.loop)
        try:
            return future.result()
        except concurrent.futures.CancelledError:
            # Another thread closed the client under this call.
            raise ConnectionLost("the client was closed", code="CANCELLED") from None

    def iterate(self, agen: AsyncIterator[T]) -> Iterator[T]:
        try:
            while True:
                try:
                    yield self.run(agen.__anext__())
                except StopAsyncIteration:
                    return
        finally:
            aclose = getattr(agen, "aclose", None)
            if aclose is not None and not self.closed:
                self.run(aclose())

    def stop(self) -> None:
        """Ends every call still under way (their callers get
        `ConnectionLost`), then the loop and its thread."""
        if self.closed:
            return
        self.closed = True

        async def cancel_all() -> None:
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        try:
            asyncio.run_coroutine_threadsafe(cancel_all(), self.loop).result(timeout=10)
        except (concurrent.futures.TimeoutError, RuntimeError):
            pass
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=5)
        if not self._thread.is_alive():
            self.loop.close()


def _discard(aw: Awaitable[object]) -> None:
    """A coroutine that will not run, closed (no "never awaited" warning)."""
    close = getattr(aw, "close", None)
    if close is not None:
        close()


async def _await(aw: Awaitable[T]) -> T:
    return await aw


def connect(target: str, *, token: Token = None, ca: PemSource = None,
            cert: PemSource = None, key: PemSource = None,
            resume_within: float = DEFAULT_RESUME_WITHIN,
            keepalive_interval: float = SESSION_KEEPALIVE_INTERVAL,
            allow_plaintext: bool = False,
            client_name: str = "exec-gateway-python") -> "Client":
    """As `exec_gateway.connect`, blocking."""
    loop = _Loop()
    try:
        inner = loop.run(_client.connect(target, token=token, ca=ca, cert=cert, key=key,
                                         resume_within=resume_within,
                                         keepalive_interval=keepalive_interval,
                                         allow_plaintext=allow_plaintext,
                                         client_name=client_name))
    except BaseException:
        loop.stop()
        raise
    return Client(loop, inner)


class Client:
    def __init__(self, loop: _Loop, inner: _client.Client) -> None:
        self._loop = loop
        self._inner = inner
        self.files = Files(loop, inner.files)

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def session(self, resume: Optional[str] = None, *,
                image: Optional[str] = None,
                snapshot: Union[str, Snapshot, None] = None) -> "Session":
        return Session(self._loop, self._loop.run(
            self._inner.session(resume, image=image, snapshot=snapshot)))

    def fork(self, snapshot: Union[str, Snapshot], n: int = 1) -> list["Session"]:
        return [Session(self._loop, s) for s in self._loop.run(self._inner.fork(snapshot, n))]

    def snapshots(self) -> list[Snapshot]:
        return self._loop.run(self._inner.snapshots())

    def get_snapshot(self, snapshot_id: str) -> Snapshot:
        return self._loop.run(self._inner.get_snapshot(snapshot_id))

    def delete_snapshot(self, snapshot: Union[str, Snapshot]) -> None:
        self._loop.run(self._inner.delete_snapshot(snapshot))

    def push_snapshot(self, snapshot: Union[str, Snapshot]) -> Snapshot:
        return self._loop.run(self._inner.push_snapshot(snapshot))

    def promote_snapshot(self, snapshot: Union[str, Snapshot]) -> Snapshot:
        return self._loop.run(self._inner.promote_snapshot(snapshot))

    def get_egress(self) -> EgressPolicy:
        return self._loop.run(self._inner.get_egress())

    def set_egress(self, names: list[str]) -> EgressPolicy:
        return self._loop.run(self._inner.set_egress(names))

    def environment_info(self) -> EnvironmentInfo:
        return self._loop.run(self._inner.environment_info())

    def close(self) -> None:
        if self._loop.closed:
            return
        try:
            self._loop.run(self._inner.close())
        finally:
            self._loop.stop()


class Session:
    def __init__(self, loop: _Loop, inner: _client.Session) -> None:
        self._loop = loop
        self._inner = inner
        self.id = inner.id
        self.files = Files(loop, inner.files)

    def __repr__(self) -> str:
        return f"Session({self.id!r})"

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def run(self, argv: list[str], *, cwd: Optional[str] = None,
            env: Optional[dict[str, str]] = None, timeout: Optional[float] = None,
            stdin: Optional[bytes] = None,
            max_output_bytes: int = _client.RUN_MAX_OUTPUT_BYTES) -> Result:
        return self._loop.run(self._inner.run(argv, cwd=cwd, env=env, timeout=timeout,
                                              stdin=stdin, max_output_bytes=max_output_bytes))

    def start(self, argv: list[str], *, cwd: Optional[str] = None,
              env: Optional[dict[str, str]] = None, tty: bool = False, stdin: bool = False,
              process_id: Optional[str] = None) -> "Process":
        return Process(self._loop, self._loop.run(self._inner.start(
            argv, cwd=cwd, env=env, tty=tty, stdin=stdin, process_id=process_id)))

    def process(self, process_id: str) -> "Process":
        return Process(self._loop, self._inner.process(process_id))

    def list(self) -> list[ProcessInfo]:
        return self._loop.run(self._inner.list())

    def environment_info(self) -> EnvironmentInfo:
        return self._loop.run(self._inner.environment_info())

    def snapshot(self, name: Optional[str] = None,
                 labels: Optional[dict[str, str]] = None) -> Snapshot:
        return self._loop.run(self._inner.snapshot(name, labels))

    def create_preview(self, port: int, public: bool = False,
                       expires_in_secs: Optional[int] = None) -> Preview:
        return self._loop.run(self._inner.create_preview(port, public, expires_in_secs))

    def revoke_preview(self, port: int) -> None:
        self._loop.run(self._inner.revoke_preview(port))

    def list_previews(self) -> Previews:
        return self._loop.run(self._inner.list_previews())

    def detach(self) -> None:
        self._loop.loop.call_soon_threadsafe(self._inner.detach)

    def close(self) -> None:
        self._loop.run(self._inner.close())


class Process:
    def __init__(self, loop: _Loop, inner: _AsyncProcess) -> None:
        self._loop = loop
        self._inner = inner
        self.id = inner.id

    def __repr__(self) -> str:
        return f"Process({self.id!r})"

    def __iter__(self) -> Iterator[Event]:
        return self.events()

    def events(self, after_seq: int = 0) -> Iterator[Event]:
        return self._loop.iterate(self._inner.events(after_seq))

    def write(self, data: Union[bytes, str]) -> None:
        self._loop.run(self._inner.write(data))

    def close_stdin(self) -> None:
        self._loop.run(self._inner.close_stdin())

    def signal(self, name: SignalName) -> None:
        self._loop.run(self._inner.signal(name))

    def resize(self, rows: int, cols: int) -> None:
        self._loop.run(self._inner.resize(rows, cols))

    def terminate(self) -> bool:
        return self._loop.run(self._inner.terminate())

    def wait(self, timeout: Optional[float] = None) -> ExitStatus:
        return self._loop.run(self._inner.wait(timeout))


class Files:
    def __init__(self, loop: _Loop, inner: _AsyncFiles) -> None:
        self._loop = loop
        self._inner = inner

    def read(self, path: PathLike, offset: int = 0, length: int = 0) -> Iterator[bytes]:
        return self._loop.iterate(self._inner.read(path, offset, length))

    def read_bytes(self, path: PathLike, offset: int = 0, length: int = 0) -> bytes:
        return self._loop.run(self._inner.read_bytes(path, offset, length))

    def read_text(self, path: PathLike, encoding: str = "utf-8") -> str:
        return self._loop.run(self._inner.read_text(path, encoding))

    def write(self, path: PathLike, data: Union[bytes, str, Iterable[bytes]]) -> int:
        if isinstance(data, (bytes, bytearray, memoryview, str)):
            return self._loop.run(self._inner.write(path, data))
        # The chunks are pulled on the caller's side of the loop: an
        # iterator is not handed to another thread.
        return self._loop.run(self._inner.write(path, _from_thread(data)))

    def write_text(self, path: PathLike, text: str, encoding: str = "utf-8") -> int:
        return self._loop.run(self._inner.write_text(path, text, encoding))

    def list(self, path: PathLike) -> list[DirEntry]:
        return self._loop.run(self._inner.list(path))

    def stat(self, path: PathLike) -> Metadata:
        return self._loop.run(self._inner.stat(path))

    def exists(self, path: PathLike) -> bool:
        return self._loop.run(self._inner.exists(path))

    def mkdir(self, path: PathLike, parents: bool = False) -> None:
        self._loop.run(self._inner.mkdir(path, parents))

    def remove(self, path: PathLike, recursive: bool = False, force: bool = False) -> None:
        self._loop.run(self._inner.remove(path, recursive, force))

    def copy(self, source: PathLike, destination: PathLike, recursive: bool = False) -> None:
        self._loop.run(self._inner.copy(source, destination, recursive))

    def canonicalize(self, path: PathLike) -> str:
        return self._loop.run(self._inner.canonicalize(path))

    def walk(self, path: PathLike, **options: Any) -> WalkResult:
        return self._loop.run(self._inner.walk(path, **options))


async def _from_thread(chunks: Iterable[bytes]) -> AsyncIterable[bytes]:
    it = iter(chunks)
    loop = asyncio.get_running_loop()
    done = object()
    while True:
        chunk = await loop.run_in_executor(None, next, it, done)
        if chunk is done:
            return
        yield chunk  # type: ignore[misc]
