"""Sessions and processes, through the async API and the sync wrapper."""

from __future__ import annotations

import asyncio
import functools
import hashlib

import pytest

import exec_gateway
from exec_gateway import (Closed, CommandTimeout, Exited, Output, StdinClosed)
from exec_gateway.sync import connect as connect_sync


def aio(test):
    """Runs an async test on a fresh event loop (no plugin needed)."""
    @functools.wraps(test)
    def run(*args, **kwargs):
        return asyncio.run(test(*args, **kwargs))
    return run


@aio
async def test_run_returns_output_exit_code_and_signal(gateway):
    async with await exec_gateway.connect(gateway.target, token=gateway.token()) as client:
        session = await client.session()
        r = await session.run(["sh", "-c", 'echo out; echo err >&2; printf "$GREETING"; exit 3'],
                              env={"GREETING": "hi there"})
        assert (r.stdout, r.stderr, r.exit_code, r.signal) == (b"out\nhi there", b"err\n", 3, None)
        assert not r.ok

        # A signal death: the signal's number, and exit code -1 (the README's).
        r = await session.run(["sh", "-c", "kill -TERM $$"])
        assert (r.exit_code, r.signal) == (-1, 15)

        # The default cwd is the tenant's root; another is honoured.
        root = (await session.environment_info()).cwd
        assert (await session.run(["pwd"])).stdout.decode().strip() == root
        await session.files.mkdir(f"{root}/sub")
        assert (await session.run(["pwd"], cwd=f"{root}/sub")).stdout == f"{root}/sub\n".encode()

        # stdin is written while the output is read (cat would never end
        # without its EOF).
        blob = bytes(range(256)) * 8192  # 2 MiB: more than one write
        r = await session.run(["sh", "-c", "cat | sha256sum"], stdin=blob)
        assert r.stdout.split()[0].decode() == hashlib.sha256(blob).hexdigest()

        # What `run` holds is bounded: past it, the process is killed.
        with pytest.raises(exec_gateway.OutputLimitExceeded) as e:
            await session.run(["sh", "-c", "echo first; exec cat /dev/zero"],
                              max_output_bytes=1 << 20)
        assert e.value.stdout.startswith(b"first\n") and len(e.value.stdout) > 1 << 20
        assert {p.state for p in await session.list()} <= {"exited", "closed"}
        await session.close()


@aio
async def test_run_past_its_timeout_is_killed_and_says_what_it_printed(gateway):
    async with await exec_gateway.connect(gateway.target, token=gateway.token()) as client:
        session = await client.session()
        with pytest.raises(CommandTimeout) as e:
            await session.run(["sh", "-c", "echo started; exec sleep 600"], timeout=1.5)
        assert e.value.stdout == b"started\n"
        procs = await session.list()
        assert len(procs) == 1 and procs[0].state in ("exited", "closed"), procs


@aio
async def test_a_process_streams_events_in_seq_order_and_takes_stdin(gateway):
    async with await exec_gateway.connect(gateway.target, token=gateway.token()) as client:
        session = await client.session()
        proc = await session.start(["sh", "-c", "while read l; do echo got:$l; done; exit 7"],
                                   stdin=True, process_id="reader")
        assert proc.id == "reader"
        await proc.write(b"one\n")
        await proc.write("two\n")
        seen, out = [], b""
        async for event in proc:
            seen.append(event)
            if isinstance(event, Output):
                out += event.data
                if out == b"got:one\ngot:two\n":
                    await proc.close_stdin()
        assert out == b"got:one\ngot:two\n"
        assert [e.seq for e in seen] == list(range(1, len(seen) + 1))
        assert isinstance(seen[-1], Closed)
        exited = [e for e in seen if isinstance(e, Exited)]
        assert len(exited) == 1 and exited[0].exit_code == 7
        assert (await proc.wait()).exit_code == 7

        # Writing after stdin closed is refused with its own class, and so is
        # writing to a process started without a stdin pipe.
        with pytest.raises(StdinClosed):
            await proc.write(b"late\n")
        no_stdin = await session.start(["sleep", "600"])
        with pytest.raises(StdinClosed):
            await no_stdin.write(b"x")
        await no_stdin.terminate()

        # Any client may take up the process by id and read from any seq.
        again = [e async for e in session.process("reader").events(after_seq=1)]
        assert [e.seq for e in again] == [e.seq for e in seen[1:]]


@aio
async def test_signal_resize_terminate_and_list(gateway):
    async with await exec_gateway.connect(gateway.target, token=gateway.token()) as client:
        session = await client.session()
        tty = await session.start(
            ["sh", "-c", "trap 'stty size; exit 4' INT; echo ready; while :; do sleep 0.05; done"],
            tty=True)
        events = tty.events()
        out = b""
        async for event in events:
            if isinstance(event, Output):
                out += event.data
                if b"ready" in out:
                    break
        await tty.resize(33, 101)
        await tty.signal("interrupt")
        async for event in events:
            if isinstance(event, Output):
                out += event.data
        assert b"33 101" in out, out
        status = await tty.wait()
        assert status.exit_code == 4 or status.signal is not None

        sleeper = await session.start(["sleep", "600"])
        listed = {p.process_id: p for p in await session.list()}
        assert listed[sleeper.id].state == "running" and listed[tty.id].tty
        assert await sleeper.terminate() is True
        status = await sleeper.wait()
        assert status.signal == 9 or status.exit_code != 0
        assert await sleeper.terminate() is False

        with pytest.raises(ValueError):
            await sleeper.signal("bogus")  # type: ignore[arg-type]


@aio
async def test_a_session_is_resumed_by_another_client_and_kept_alive_while_open(site):
    gateway = site.start(extra="[server]\ndetach_ttl = \"6s\"\n")
    token = gateway.token()
    async with await exec_gateway.connect(gateway.target, token=token) as first:
        session = await first.session()
        proc = await session.start(["sh", "-c", "echo one; read x; echo two:$x"], stdin=True)
        # Idle past the detach TTL twice over: the open session is kept.
        await asyncio.sleep(10)
        async with await exec_gateway.connect(gateway.target, token=token) as second:
            resumed = await second.session(resume=session.id)
            handle = resumed.process(proc.id)
            await handle.write(b"x\n")
            out = b"".join([e.data async for e in handle if isinstance(e, Output)])
            assert out == b"one\ntwo:x\n"
        session.detach()
    # Detached and unused, it is gone after the TTL.
    await asyncio.sleep(9)
    async with await exec_gateway.connect(gateway.target, token=token) as third:
        with pytest.raises(exec_gateway.NotFound):
            await third.session(resume=session.id)


def test_the_sync_wrapper_runs_streams_and_moves_files(gateway):
    with connect_sync(gateway.target, token=gateway.token()) as client:
        session = client.session()
        assert session.run(["echo", "sync"]).stdout == b"sync\n"
        proc = session.start(["sh", "-c", "cat; echo done"], stdin=True)
        proc.write(b"abc\n")
        proc.close_stdin()
        out = b"".join(e.data for e in proc if isinstance(e, Output))
        assert out == b"abc\ndone\n"
        assert proc.wait().exit_code == 0
        root = session.environment_info().cwd
        assert session.files.write(f"{root}/s.txt", iter([b"a", b"b" * 10])) == 11
        assert session.files.read_bytes(f"{root}/s.txt") == b"a" + b"b" * 10
        assert b"".join(session.files.read(f"{root}/s.txt", offset=1, length=3)) == b"bbb"
        session.close()


@aio
async def test_a_cancelled_run_leaves_no_process_running(gateway):
    async with await exec_gateway.connect(gateway.target, token=gateway.token()) as client:
        session = await client.session()
        task = asyncio.ensure_future(session.run(["sh", "-c", "echo up; exec sleep 600"]))
        while not await session.list():
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert [p.state for p in await session.list()] in (["exited"], ["closed"])
        # Cancelled while the start itself is under way: still killed.
        for _ in range(5):
            task = asyncio.ensure_future(session.run(["sleep", "600"]))
            await asyncio.sleep(0)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
        assert all(p.state in ("exited", "closed") for p in await session.list())
        # And a start cancelled during its own call.
        for _ in range(5):
            task = asyncio.ensure_future(session.start(["sleep", "600"]))
            await asyncio.sleep(0)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
        for _ in range(100):
            if all(p.state in ("exited", "closed") for p in await session.list()):
                break
            await asyncio.sleep(0.05)
        assert all(p.state in ("exited", "closed") for p in await session.list())


@aio
async def test_relative_paths_and_cwd_are_under_the_root_and_a_gone_session_is_let_go(gateway):
    async with await exec_gateway.connect(gateway.target, token=gateway.token(),
                                          keepalive_interval=0.2) as client:
        session = await client.session()
        root = (await session.environment_info()).cwd
        await session.files.mkdir("rel/dir", parents=True)
        await session.files.write("rel/dir/f.txt", b"relative")
        assert await client.files.read_bytes(f"{root}/rel/dir/f.txt") == b"relative"
        assert (await session.run(["cat", "f.txt"], cwd="rel/dir")).stdout == b"relative"
        # Closed by another client: this one's keepalive stops asking.
        async with await exec_gateway.connect(gateway.target, token=gateway.token()) as other:
            await (await other.session(resume=session.id)).close()
        for _ in range(100):
            if session not in client._sessions:
                break
            await asyncio.sleep(0.05)
        assert session not in client._sessions


def test_closing_a_sync_client_ends_a_call_blocked_in_another_thread(gateway):
    import threading
    client = connect_sync(gateway.target, token=gateway.token())
    proc = client.session().start(["sleep", "600"])
    outcome = []

    def waiter():
        try:
            proc.wait()
        except exec_gateway.ConnectionLost as e:
            outcome.append(e)

    t = threading.Thread(target=waiter)
    t.start()
    import time
    time.sleep(0.5)
    client.close()
    t.join(timeout=20)
    assert not t.is_alive() and len(outcome) == 1
    with pytest.raises(exec_gateway.ConnectionLost):
        client.session()
    client.close()  # twice is fine
