"""A dropped connection is resumed: streams continue from their last seq,
byte-exact, and calls retried across it take effect once."""

from __future__ import annotations

import asyncio
import os
import signal

import pytest

import exec_gateway
from exec_gateway import ConnectionLost, Output
from conftest import Gateway, Proxy
from test_processes import aio

# 3,000 numbered lines of 64 bytes, paced so that the stream is still
# running when the test cuts the connection under it.
LINES = 3000
PRINTER = ('i=0; while [ $i -lt %d ]; do i=$((i+1)); printf "line %%08d %%s\\n" $i '
           '$(printf "%%046d" 0); [ $((i %% 200)) = 0 ] && sleep 0.05; done; echo end >&2'
           % LINES)
EXPECTED = b"".join(b"line %08d %s\n" % (i, b"0" * 46) for i in range(1, LINES + 1))


async def wait_for_output(direct_session, process_id: str, needle: bytes) -> None:
    """Reads the process's output over a connection of its own (not through
    the proxy) until `needle` has appeared."""
    seen = b""
    async for event in direct_session.process(process_id).events():
        if isinstance(event, Output):
            seen += event.data
            if needle in seen:
                return
    raise AssertionError(f"{needle!r} never appeared in {seen!r}")


@aio
async def test_a_stream_cut_three_times_is_resumed_byte_exact(gateway):
    proxy = Proxy(gateway.address)
    await proxy.start()
    async with await exec_gateway.connect(proxy.target, token=gateway.token()) as client:
        session = await client.session()
        proc = await session.start(["sh", "-c", PRINTER])
        out, seqs, cut_at = b"", [], [LINES // 5, LINES // 2, LINES * 4 // 5]
        async for event in proc:
            seqs.append(event.seq)
            if isinstance(event, Output) and event.stream == "stdout":
                out += event.data
                if cut_at and out.count(b"\n") >= cut_at[0]:
                    cut_at.pop(0)
                    proxy.cut()
        assert proxy.cuts == 3
        assert out == EXPECTED
        assert seqs == list(range(1, len(seqs) + 1))

        # `run` (one Exec stream) resumes the same way.
        task = asyncio.ensure_future(session.run(["sh", "-c", PRINTER]))
        await wait_for_output_through(proxy, gateway, session.id, task)
        result = await task
        assert result.stdout == EXPECTED and result.stderr == b"end\n"
        assert result.exit_code == 0
    await proxy.close()


async def wait_for_output_through(proxy, gateway, session_id, task) -> None:
    """Cuts the proxy once the run's process has printed a third of its
    lines (seen over a direct connection)."""
    async with await exec_gateway.connect(gateway.target, token=gateway.token()) as direct:
        session = await direct.session(resume=session_id)
        while not task.done():
            procs = await session.list()
            if procs:
                await wait_for_output(session, procs[0].process_id, b"line %08d" % (LINES // 3))
                proxy.cut()
                return
            await asyncio.sleep(0.01)
        session.detach()


@aio
async def test_a_write_whose_answer_was_lost_is_applied_once(gateway):
    proxy = Proxy(gateway.address)
    await proxy.start()
    token = gateway.token()
    async with await exec_gateway.connect(proxy.target, token=token) as client, \
            await exec_gateway.connect(gateway.target, token=token) as direct:
        session = await client.session()
        proc = await session.start(["sh", "-c", "while read l; do echo got:$l; done"],
                                   stdin=True)
        watcher = await direct.session(resume=session.id)
        await proc.write(b"first\n")
        await wait_for_output(watcher, proc.id, b"got:first\n")

        # The gateway gets the write and applies it; its answer is lost, and
        # the connection then drops: the client retries with the same id.
        proxy.swallow_replies = True
        write = asyncio.ensure_future(proc.write(b"second\n"))
        await wait_for_output(watcher, proc.id, b"got:second\n")
        assert not write.done()
        proxy.swallow_replies = False
        proxy.cut()
        await write
        await proc.write(b"third\n")
        await proc.close_stdin()
        out = b"".join([e.data async for e in proc if isinstance(e, Output)])
        assert out == b"got:first\ngot:second\ngot:third\n"
        watcher.detach()
    await proxy.close()


@aio
async def test_a_gateway_gone_for_longer_than_resume_within_is_connection_lost(gateway):
    proxy = Proxy(gateway.address)
    await proxy.start()
    async with await exec_gateway.connect(proxy.target, token=gateway.token(),
                                          resume_within=1.5) as client:
        session = await client.session()
        proc = await session.start(["sleep", "600"])
        await proxy.close()
        with pytest.raises(ConnectionLost):
            await session.list()
        with pytest.raises(ConnectionLost):
            async for _ in proc:
                pass
        # A signal is never retried: it may have been delivered.
        with pytest.raises(ConnectionLost):
            await proc.signal("kill")
        session.detach()

    # A gateway never reached is an error at once, not after resume_within.
    async with await exec_gateway.connect(proxy.target, token=gateway.token()) as client:
        with pytest.raises(ConnectionLost, match="cannot reach the gateway"):
            await client.session()


@aio
async def test_a_new_clients_first_call_cut_mid_flight_is_a_lost_connection(site, gateway):
    """The gateway reached, then killed under the client's very first call
    (a write fed from an iterator, held after its first chunk): what any
    later call cut so reports, a lost connection, not "cannot reach"."""
    path = site.dir / "roots" / "alpha" / "first.bin"
    chunk = b"x" * 4096
    release = asyncio.Event()

    async def chunks():
        yield chunk
        await release.wait()
        yield chunk

    async with await exec_gateway.connect(gateway.target, token=gateway.token()) as client:
        write = asyncio.ensure_future(client.files.write(str(path), chunks()))
        # The first chunk on disk: the gateway has the call, which waits for more.
        while not (path.exists() and path.stat().st_size == len(chunk)):
            assert not write.done(), write
            await asyncio.sleep(0.01)
        gateway.stop(signal.SIGKILL)
        with pytest.raises(ConnectionLost) as lost:
            await write
        release.set()
        assert "cannot reach" not in lost.value.message, lost.value.message
        assert lost.value.message.startswith("connection to the gateway lost"), lost.value.message


@aio
async def test_a_new_clients_first_call_cut_mid_flight_is_retried_once_the_gateway_is_back(site):
    """The client's first call, a write of bytes (sent again whole after a
    drop), caught mid-write: the gateway is frozen, killed, and started
    again on its port. The write is resumed as under any later call."""
    gw = site.start()
    port = int(gw.address.rsplit(":", 1)[1])
    data = os.urandom(64 << 20)
    for attempt in range(5):
        path = site.dir / "roots" / "alpha" / f"first-{attempt}.bin"
        async with await exec_gateway.connect(gw.target, token=gw.token()) as client:
            write = asyncio.ensure_future(client.files.write(str(path), data))
            while not (path.exists() and path.stat().st_size > 0):
                assert not write.done() or write.exception() is None, write
                await asyncio.sleep(0.01)
            # Frozen with part of the file written: the call is in flight.
            gw.proc.send_signal(signal.SIGSTOP)
            if path.stat().st_size < len(data):
                gw.stop(signal.SIGKILL)
                gw = Gateway(gw.workdir, (gw.workdir / "gateway.toml").read_text(), gw.secret,
                             grpc_port=port)
                site.gateways.append(gw)
                assert await write == len(data)
                assert path.read_bytes() == data
                return
            # All of it written before the freeze: once more.
            gw.proc.send_signal(signal.SIGCONT)
            await write
    raise AssertionError("the write was never caught mid-flight")
