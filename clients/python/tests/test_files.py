"""Files and the environment, in a session and in the tenant's root."""

from __future__ import annotations

import os

import pytest

import exec_gateway
from exec_gateway import Internal, NotFound

from test_processes import aio


@aio
async def test_every_file_operation_in_a_session_and_without_one(gateway):
    async with await exec_gateway.connect(gateway.target, token=gateway.token()) as client:
        session = await client.session()
        info = await session.environment_info()
        root = info.cwd
        assert root.endswith("/roots/alpha") and info.platform_os
        assert (await client.environment_info()).cwd == root
        files = session.files

        # Streamed both ways, byte-exact, across message boundaries.
        blob = os.urandom(5 * (1 << 20) + 12345)
        assert await files.write(f"{root}/blob", blob) == len(blob)
        chunks = [c async for c in files.read(f"{root}/blob")]
        assert len(chunks) > 1 and b"".join(chunks) == blob
        assert await files.read_bytes(f"{root}/blob", offset=(1 << 20) - 3, length=10) == \
            blob[(1 << 20) - 3:(1 << 20) + 7]

        async def pieces():
            for i in range(3):
                yield bytes([65 + i]) * (700 * 1024)
        assert await files.write(f"{root}/gen", pieces()) == 3 * 700 * 1024
        assert await files.read_bytes(f"{root}/gen", offset=700 * 1024 - 1, length=2) == b"AB"
        assert await files.write(f"{root}/empty", b"") == 0
        assert await files.read_bytes(f"{root}/empty") == b""
        await files.write_text(f"{root}/t.txt", "héllo")
        assert await files.read_text(f"{root}/t.txt") == "héllo"

        await files.mkdir(f"{root}/a/b/c", parents=True)
        await files.write(f"{root}/a/b/c/f", b"x")
        with pytest.raises(NotFound):
            await files.mkdir(f"{root}/nope/deeper")
        st = await files.stat(f"{root}/blob")
        assert st.is_file and not st.is_directory and st.size == len(blob)
        assert st.modified_at_ms > 0
        assert (await files.stat(f"{root}/a")).is_directory
        names = {e.name: e for e in await files.list(root)}
        assert {"blob", "gen", "empty", "t.txt", "a"} <= names.keys()
        assert names["a"].is_directory and names["blob"].is_file

        await files.copy(f"{root}/a", f"{root}/a2", recursive=True)
        assert await files.read_bytes(f"{root}/a2/b/c/f") == b"x"
        walk = await files.walk(f"{root}/a2")
        kinds = {e.path: e.kind for e in walk.entries}
        assert kinds[f"{root}/a2/b/c/f"] == "file" and kinds[f"{root}/a2/b"] == "directory"
        assert not walk.truncated and not walk.errors
        assert (await files.walk(root, max_entries=2)).truncated

        os_link_target = f"{root}/a/b"
        assert await files.canonicalize(f"{root}/a/../a/b") == os_link_target

        await files.remove(f"{root}/a2", recursive=True)
        assert not await files.exists(f"{root}/a2")
        with pytest.raises(NotFound):
            await files.remove(f"{root}/a2")
        await files.remove(f"{root}/a2", force=True)

        # Outside the tenant's root is not found; a relative path is under it.
        with pytest.raises(NotFound):
            await files.read_bytes("/etc/passwd")
        with pytest.raises(NotFound):
            await files.read_bytes("../../../etc/passwd")
        assert (await files.stat("a/b/c/f")).size == 1

        # The sessionless door sees the same root.
        assert await client.files.read_bytes(f"{root}/t.txt") == "héllo".encode()
        # A process sees what the files API wrote.
        r = await session.run(["cat", "t.txt"])
        assert r.stdout == "héllo".encode()
        # A directory is not read (the gateway's OS text, as documented).
        with pytest.raises(Internal, match="Is a directory"):
            await files.read_bytes(root)
