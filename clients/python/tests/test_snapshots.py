"""Snapshots and forks (`session.snapshot()`, `client.fork(snapshot, n)`):
each fork sees the snapshot and only its own changes."""

from __future__ import annotations

import asyncio
import functools

import pytest

import exec_gateway

SCOPE = "exec fs:read fs:write snapshot"


def aio(test):
    """Runs an async test on a fresh event loop (no plugin needed)."""
    @functools.wraps(test)
    def run(*args, **kwargs):
        return asyncio.run(test(*args, **kwargs))
    return run


@aio
async def test_forks_start_from_the_snapshot_and_stay_apart(gateway):
    async with await exec_gateway.connect(gateway.target,
                                          token=gateway.token(scope=SCOPE)) as client:
        origin = await client.session()
        root = (await origin.environment_info()).cwd
        await origin.files.write(f"{root}/state", b"saved")
        snap = await origin.snapshot(name="checkpoint", labels={"step": "3"})
        assert (snap.name, snap.labels, snap.image) == ("checkpoint", {"step": "3"}, None)
        assert snap.digest.startswith("sha256:")
        await origin.files.write(f"{root}/state", b"moved on")

        forks = await client.fork(snap, 3)
        assert len({s.id for s in forks}) == 3
        for n, s in enumerate(forks):
            assert await s.files.read_bytes(f"{root}/state") == b"saved"
            r = await s.run(["/bin/sh", "-c", f"echo fork{n} > state && cat state"], cwd=root)
            assert (r.stdout, r.exit_code) == (f"fork{n}\n".encode(), 0)
        for n, s in enumerate(forks):
            assert await s.files.read_bytes(f"{root}/state") == f"fork{n}\n".encode()
        assert await origin.files.read_bytes(f"{root}/state") == b"moved on"

        one = await client.session(snapshot=snap.id)
        assert await one.files.read_bytes(f"{root}/state") == b"saved"
        assert [s.id for s in await client.snapshots()] == [snap.id]
        assert (await client.get_snapshot(snap.id)).digest == snap.digest
        assert snap.expires_at_ms and snap.pushed is None
        # No snapshot registry on this gateway: nowhere to push; promoting
        # keeps it until it is deleted.
        with pytest.raises(exec_gateway.InvalidArgument):
            await client.push_snapshot(snap)
        kept = await client.promote_snapshot(snap)
        assert (kept.id, kept.expires_at_ms, kept.pushed) == (snap.id, None, None)
        await client.delete_snapshot(snap)
        with pytest.raises(exec_gateway.NotFound):
            await client.get_snapshot(snap.id)
        with pytest.raises(exec_gateway.NotFound):
            await client.fork(snap, 1)
        # The live forks keep their workspace.
        assert await forks[0].files.read_bytes(f"{root}/state") == b"fork0\n"
        with pytest.raises(ValueError):
            await client.session(origin.id, snapshot=snap.id)


@aio
async def test_without_the_scope_nothing_is_saved(gateway):
    async with await exec_gateway.connect(gateway.target, token=gateway.token()) as client:
        session = await client.session()
        with pytest.raises(exec_gateway.Forbidden):
            await session.snapshot()
        with pytest.raises(exec_gateway.Forbidden):
            await client.snapshots()
