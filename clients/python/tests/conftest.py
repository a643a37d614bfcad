"""The SDK's suite runs against real gateways this file starts: the binary
from EXEC_GATEWAY_BIN (default: the repository's target/debug build), HS256
keys made here, tokens minted with PyJWT, tenants from a template rooted in
a fresh directory (each its own root and uid)."""

from __future__ import annotations

import asyncio
import os
import pathlib
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from typing import Optional

import jwt
import pytest

REPO = pathlib.Path(__file__).resolve().parents[3]


def gateway_binary() -> str:
    return os.environ.get("EXEC_GATEWAY_BIN", str(REPO / "target" / "debug" / "exec-gateway"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Gateway:
    """One `exec-gateway serve` process."""

    def __init__(self, workdir: pathlib.Path, config: str, secret: bytes,
                 env: Optional[dict[str, str]] = None, grpc_port: int = 0,
                 args: tuple[str, ...] = ()) -> None:
        self.workdir = workdir
        self.secret = secret
        (workdir / "gateway.toml").write_text(config)
        self.proc = subprocess.Popen(
            [gateway_binary(), "serve", "--listen", "ws://127.0.0.1:0",
             "--grpc-listen", f"127.0.0.1:{grpc_port}", "--admin-listen", "off",
             "--config", str(workdir / "gateway.toml"), *args],
            stdout=subprocess.PIPE, stderr=open(workdir / "gateway.log", "wb"), text=True,
            env={**os.environ, "XDG_STATE_HOME": str(workdir / "state"), **(env or {})})
        ws = self.proc.stdout.readline().strip()
        grpc_line = self.proc.stdout.readline().strip()
        if not grpc_line.startswith(("grpc://", "grpcs://")):
            self.stop()
            raise RuntimeError(f"the gateway did not start: {ws!r} {grpc_line!r}")
        self.ws_url = ws
        self.target = grpc_line
        self.address = grpc_line.split("://", 1)[1]

    def token(self, tenant: str = "alpha", scope: str = "exec fs:read fs:write",
              **extra: object) -> str:
        claims = {"sub": "sdk-test", "tenant": tenant, "scope": scope,
                  "exp": int(time.time()) + 3600, **extra}
        return jwt.encode(claims, self.secret, algorithm="HS256")

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class Site:
    """A key, a directory of tenant roots, and the gateways started on them."""

    def __init__(self) -> None:
        self.dir = pathlib.Path(tempfile.mkdtemp(prefix="exec-gateway-sdk-"))
        # Tenants run as their own uids: they must traverse to their roots.
        self.dir.chmod(0o755)
        self.secret = secrets.token_hex(32).encode()
        (self.dir / "hs256.key").write_bytes(self.secret)
        self.gateways: list[Gateway] = []

    def config(self, extra: str = "", template: str = "") -> str:
        return ("[[auth.keys]]\nalgorithm = \"HS256\"\n"
                f"secret_file = \"{self.dir}/hs256.key\"\n"
                f"[tenant_template]\nroot = \"{self.dir}/roots/{{tenant}}\"\n{template}\n"
                f"{extra}")

    def start(self, extra: str = "", template: str = "", name: str = "",
              env: Optional[dict[str, str]] = None, grpc_port: int = 0,
              config: Optional[str] = None, args: tuple[str, ...] = ()) -> Gateway:
        workdir = self.dir / f"gw{len(self.gateways)}{name}"
        workdir.mkdir()
        gw = Gateway(workdir, config if config is not None else self.config(extra, template),
                     self.secret, env, grpc_port, args)
        self.gateways.append(gw)
        return gw

    def close(self) -> None:
        for gw in self.gateways:
            gw.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture
def site():
    s = Site()
    yield s
    s.close()


@pytest.fixture
def gateway(site: Site) -> Gateway:
    """A gateway serving any tenant under the template."""
    return site.start()


class Proxy:
    """A TCP proxy between the client and a gateway whose connections the
    test can cut (a dropped connection, as a balancer or network drops it)
    and whose listener it can close and open again."""

    def __init__(self, upstream: str) -> None:
        host, port = upstream.rsplit(":", 1)
        self.upstream = (host, int(port))
        self.port = free_port()
        self.target = f"grpc://127.0.0.1:{self.port}"
        self._server: Optional[asyncio.AbstractServer] = None
        self._conns: set[asyncio.StreamWriter] = set()
        self.cuts = 0
        #: While set, what the gateway sends is dropped (a call's answer
        #: lost after the gateway acted on it).
        self.swallow_replies = False

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", self.port,
                                                  reuse_address=True)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_r, up_w = await asyncio.open_connection(*self.upstream)
        except OSError:
            writer.close()
            return
        self._conns.update((writer, up_w))

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter,
                       replies: bool) -> None:
            try:
                while data := await src.read(65536):
                    if replies and self.swallow_replies:
                        continue
                    dst.write(data)
                    await dst.drain()
            except (ConnectionError, OSError):
                pass
            finally:
                dst.close()

        await asyncio.gather(pipe(reader, up_w, False), pipe(up_r, writer, True))
        self._conns.discard(writer)
        self._conns.discard(up_w)

    def cut(self) -> None:
        """Drops every connection through the proxy now (a reset, not a
        goodbye: the client sees its connection die)."""
        self.cuts += 1
        for w in list(self._conns):
            sock = w.get_extra_info("socket")
            if sock is not None:
                try:
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                    b"\x01\x00\x00\x00\x00\x00\x00\x00")
                except OSError:
                    pass
            w.transport.abort()
        self._conns.clear()

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None
        self.cut()
