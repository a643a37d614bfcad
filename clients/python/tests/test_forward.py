"""Port forwarding (`session.connect_port`, `session.port_forward`): bytes
both ways with an echo server in the session, half-close, a local port
whose connections each become a stream, and the refusals."""

from __future__ import annotations

import asyncio
import functools
import os

import pytest

import exec_gateway
from exec_gateway import _forward

SCOPE = "exec fs:read fs:write forward"
PORT = 7000

# An echo server: each connection gets back what it sends and, at the end
# of its input, `bye N` (N: the bytes it read), then the server closes it.
ECHO = f"""
import socket
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", {PORT}))
s.listen(16)
print("listening", flush=True)
while True:
    c, _ = s.accept()
    n = 0
    while True:
        d = c.recv(65536)
        if not d:
            break
        n += len(d)
        c.sendall(d)
    c.sendall(b"bye %d\\n" % n)
    c.close()
"""

needs_netns = pytest.mark.skipif(
    os.geteuid() != 0 or not all(
        any(os.path.isfile(os.path.join(d, t)) for d in ("/usr/sbin", "/usr/bin", "/sbin", "/bin"))
        for t in ("slirp4netns", "nft")),
    reason="forwarding needs network namespaces: root, slirp4netns and nft")


def aio(test):
    """Runs an async test on a fresh event loop (no plugin needed)."""
    @functools.wraps(test)
    def run(*args, **kwargs):
        return asyncio.run(test(*args, **kwargs))
    return run


async def echoing(session: exec_gateway.Session) -> exec_gateway.Process:
    server = await session.start(["python3", "-c", ECHO])
    async for event in server.events():
        if isinstance(event, exec_gateway.Output):
            assert event.data.startswith(b"listening"), event
            return server
    raise AssertionError("the echo server ended")


@needs_netns
@aio
async def test_a_stream_carries_bytes_both_ways_and_half_closes(gateway):
    async with await exec_gateway.connect(gateway.target,
                                          token=gateway.token(scope=SCOPE)) as client:
        session = await client.session()
        await echoing(session)
        async with await session.connect_port(PORT) as conn:
            sent = b"hello\n" + bytes(range(256)) * 1024  # over 64 KiB: split
            await conn.send(sent)
            # The server answers `bye` only once it has read the end.
            await conn.close_write()
            got = b""
            async for chunk in conn:
                assert len(chunk) <= exec_gateway.FORWARD_CHUNK_BYTES
                got += chunk
            assert got == sent + f"bye {len(sent)}\n".encode()


@needs_netns
@aio
async def test_a_local_port_forwards_each_connection(gateway):
    async with await exec_gateway.connect(gateway.target,
                                          token=gateway.token(scope=SCOPE)) as client:
        session = await client.session()
        await echoing(session)
        forward = await session.port_forward(PORT)
        assert forward.host == "127.0.0.1" and forward.port > 0
        assert forward.address == f"127.0.0.1:{forward.port}"
        for n in range(2):
            reader, writer = await asyncio.open_connection(forward.host, forward.port)
            writer.write(b"ping %d" % n)
            await writer.drain()
            writer.write_eof()
            assert await reader.read() == b"ping %d" % n + b"bye 6\n"
            writer.close()
        await forward.close()
        with pytest.raises(OSError):
            await asyncio.open_connection(forward.host, forward.port)


@needs_netns
@aio
async def test_forwards_are_refused_like_the_websocket_door(gateway):
    async with await exec_gateway.connect(gateway.target,
                                          token=gateway.token(scope=SCOPE)) as client:
        session = await client.session()
        # Nothing listening.
        with pytest.raises(exec_gateway.Unavailable, match="nothing accepts connections"):
            await session.connect_port(PORT)
        with pytest.raises(exec_gateway.Unavailable):
            await session.port_forward(PORT)
        # Another tenant's session is unknown, with the same words.
        async with await exec_gateway.connect(
                gateway.target, token=gateway.token("beta", scope=SCOPE)) as other:
            theirs = await other.session()
            with pytest.raises(exec_gateway.NotFound) as e:
                await _forward.connect_port(client.link, theirs.id, PORT)
            assert str(e.value) == f"unknown session id {theirs.id}"
            with pytest.raises(exec_gateway.NotFound) as e:
                await _forward.connect_port(client.link, "no-such-session", PORT)
            assert str(e.value) == "unknown session id no-such-session"
    # No `forward` scope.
    async with await exec_gateway.connect(gateway.target, token=gateway.token()) as client:
        session = await client.session()
        with pytest.raises(exec_gateway.Forbidden):
            await session.connect_port(PORT)


@needs_netns
@aio
async def test_a_stream_ends_with_its_session(gateway):
    async with await exec_gateway.connect(gateway.target,
                                          token=gateway.token(scope=SCOPE)) as client:
        session = await client.session()
        await echoing(session)
        conn = await session.connect_port(PORT)
        await session.close()
        with pytest.raises(exec_gateway.Unavailable, match="the session ended"):
            await conn.receive()
