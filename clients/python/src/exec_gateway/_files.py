"""File operations, in a session (where it runs) or in the tenant's root."""

from __future__ import annotations

import os
import posixpath
from typing import (TYPE_CHECKING, AsyncIterable, AsyncIterator, Awaitable, Callable, Iterable,
                    Union)

import grpc

from ._errors import AlreadyExists, ExecGatewayError, NotFound, _Transport, classify
from ._link import FILE_CHUNK_BYTES, Retrying
from ._types import DirEntry, Metadata, WalkEntry, WalkError, WalkResult
from .v1 import file_pb2 as pb

if TYPE_CHECKING:
    from ._link import Link

PathLike = Union[str, "os.PathLike[str]"]
Data = Union[bytes, bytearray, memoryview, str, Iterable[bytes], AsyncIterable[bytes]]

#: `walk`'s default limits (each must be at least 1).
WALK_MAX_DEPTH = 64
WALK_MAX_DIRECTORIES = 10_000
WALK_MAX_ENTRIES = 100_000

_KINDS = {pb.WALK_ENTRY_KIND_FILE: "file", pb.WALK_ENTRY_KIND_DIRECTORY: "directory"}




def _exists(err: ExecGatewayError) -> bool:
    return isinstance(err, AlreadyExists) or "exists" in err.message.lower()


class Files:
    """Files where the session runs (`session.files`), or in the tenant's
    root (`client.files`, no session)."""

    def __init__(self, link: "Link", root: Callable[[], Awaitable[str]],
                 session_id: str = "") -> None:
        self._link = link
        self._root = root
        self._session_id = session_id

    async def _path(self, p: PathLike) -> str:
        """An absolute path as it is; a relative one under the tenant's root
        (the gateway confines both to it)."""
        path = os.fspath(p)
        if not path:
            raise ValueError("an empty path")
        return path if path.startswith("/") else posixpath.join(await self._root(), path)

    async def read(self, path: PathLike, offset: int = 0,
                   length: int = 0) -> AsyncIterator[bytes]:
        """The file's bytes from `offset`, `length` of them (0: to the end),
        in chunks of up to 1 MiB. A dropped connection continues from the
        offset reached."""
        link, path = self._link, await self._path(path)
        retrying = Retrying(link.resume_within)
        done = 0
        while True:
            left = length - done if length else 0
            call = link.files.ReadFile(
                pb.ReadFileRequest(path=path, offset=offset + done, length=left,
                                   session_id=self._session_id),
                metadata=link.metadata())
            try:
                async for msg in call:
                    data = msg.data
                    if length and done + len(data) > length:
                        # More than asked for is not the gateway's answer.
                        data = data[:length - done]
                    if data:
                        done += len(data)
                        retrying.progressed()
                        yield data
                    if length and done >= length:
                        return
                return
            except grpc.aio.AioRpcError as e:
                err = classify(e)
                if not isinstance(err, _Transport):
                    raise err from None
                why, lasting = err.message, err.lasting
            finally:
                call.cancel()
            if length and done >= length:
                return
            await retrying.wait(why, lasting)

    async def read_bytes(self, path: PathLike, offset: int = 0, length: int = 0) -> bytes:
        return b"".join([chunk async for chunk in self.read(path, offset, length)])

    async def read_text(self, path: PathLike, encoding: str = "utf-8") -> str:
        return (await self.read_bytes(path)).decode(encoding)

    async def write(self, path: PathLike, data: Data) -> int:
        """Writes (creates or truncates) the file; the bytes written. Bytes
        are sent again whole after a dropped connection; an iterator's chunks
        cannot be, and a drop under one raises `ConnectionLost`."""
        link, path = self._link, await self._path(path)
        if isinstance(data, str):
            data = data.encode()
        if isinstance(data, (bytes, bytearray, memoryview)):
            whole = bytes(data)

            async def attempt() -> int:
                resp = await link.files.WriteFile(self._messages(path, _pieces(whole)),
                                                  metadata=link.metadata())
                return resp.bytes_written

            return await link.call(attempt)

        async def once() -> int:
            resp = await link.files.WriteFile(self._messages(path, data),
                                              metadata=link.metadata())
            return resp.bytes_written

        return await link.call(once, retry=False)

    async def _messages(self, path: str, chunks: Union[Iterable[bytes], AsyncIterable[bytes]],
                        ) -> AsyncIterator[pb.WriteFileRequest]:
        first = True
        async for chunk in _aiter(chunks):
            for start in range(0, len(chunk), FILE_CHUNK_BYTES):
                piece = bytes(chunk[start:start + FILE_CHUNK_BYTES])
                if first:
                    first = False
                    yield pb.WriteFileRequest(path=path, data=piece, session_id=self._session_id)
                else:
                    yield pb.WriteFileRequest(data=piece)
        if first:
            # An empty file: the path still has to be named.
            yield pb.WriteFileRequest(path=path, session_id=self._session_id)

    async def write_text(self, path: PathLike, text: str, encoding: str = "utf-8") -> int:
        return await self.write(path, text.encode(encoding))

    async def list(self, path: PathLike) -> list[DirEntry]:
        link, path = self._link, await self._path(path)
        resp = await link.call(lambda: link.files.ReadDirectory(
            pb.ReadDirectoryRequest(path=path, session_id=self._session_id),
            metadata=link.metadata()))
        return [DirEntry(e.file_name, e.is_directory, e.is_file) for e in resp.entries]

    async def stat(self, path: PathLike) -> Metadata:
        link, path = self._link, await self._path(path)
        m = await link.call(lambda: link.files.GetMetadata(
            pb.GetMetadataRequest(path=path, session_id=self._session_id),
            metadata=link.metadata()))
        return Metadata(m.is_directory, m.is_file, m.is_symlink, m.size, m.created_at_ms,
                        m.modified_at_ms)

    async def exists(self, path: PathLike) -> bool:
        try:
            await self.stat(path)
        except NotFound:
            return False
        return True

    async def mkdir(self, path: PathLike, parents: bool = False) -> None:
        """Creates a directory (and its parents with `parents`)."""
        link, path = self._link, await self._path(path)
        await link.call(lambda: link.files.CreateDirectory(
            pb.CreateDirectoryRequest(path=path, recursive=parents,
                                      session_id=self._session_id),
            metadata=link.metadata()), done_if=_exists, done=lambda: None)

    async def remove(self, path: PathLike, recursive: bool = False, force: bool = False) -> None:
        """Removes a file, or a directory (its contents too with `recursive`);
        `force`: a missing path is not an error."""
        link, path = self._link, await self._path(path)
        await link.call(lambda: link.files.Remove(
            pb.RemoveRequest(path=path, recursive=recursive, force=force,
                             session_id=self._session_id),
            metadata=link.metadata()),
            done_if=lambda e: isinstance(e, NotFound), done=lambda: None)

    async def copy(self, source: PathLike, destination: PathLike,
                   recursive: bool = False) -> None:
        link = self._link
        src, dst = await self._path(source), await self._path(destination)
        await link.call(lambda: link.files.Copy(
            pb.CopyRequest(source_path=src, destination_path=dst, recursive=recursive,
                           session_id=self._session_id),
            metadata=link.metadata()))

    async def canonicalize(self, path: PathLike) -> str:
        link, path = self._link, await self._path(path)
        resp = await link.call(lambda: link.files.Canonicalize(
            pb.CanonicalizeRequest(path=path, session_id=self._session_id),
            metadata=link.metadata()))
        return resp.path

    async def walk(self, path: PathLike, *, max_depth: int = WALK_MAX_DEPTH,
                   max_directories: int = WALK_MAX_DIRECTORIES,
                   max_entries: int = WALK_MAX_ENTRIES, follow_directory_symlinks: bool = False,
                   prune_hidden_directories: bool = False) -> WalkResult:
        """The tree under `path`, breadth first: levels down to `max_depth`
        (the root's entries are level 0), at most `max_directories` read and
        `max_entries` listed (the gateway caps both at 100,000); `truncated`
        when a limit was reached."""
        link, path = self._link, await self._path(path)
        resp = await link.call(lambda: link.files.Walk(
            pb.WalkRequest(path=path, max_depth=max_depth, max_directories=max_directories,
                           max_entries=max_entries,
                           follow_directory_symlinks=follow_directory_symlinks,
                           prune_hidden_directories=prune_hidden_directories,
                           session_id=self._session_id),
            metadata=link.metadata()))
        return WalkResult(
            [WalkEntry(e.path, _KINDS.get(e.kind, "unknown")) for e in resp.entries],  # type: ignore[arg-type]
            [WalkError(e.path, e.message) for e in resp.errors],
            resp.truncated)


def _pieces(data: bytes) -> Iterable[bytes]:
    return (data[i:i + FILE_CHUNK_BYTES] for i in range(0, len(data), FILE_CHUNK_BYTES))


async def _aiter(chunks: Union[Iterable[bytes], AsyncIterable[bytes]]) -> AsyncIterator[bytes]:
    if hasattr(chunks, "__aiter__"):
        async for chunk in chunks:  # type: ignore[union-attr]
            yield chunk
    else:
        for chunk in chunks:  # type: ignore[union-attr]
            yield chunk



