"""Protocol conformance: every check runs against the official Codex
exec-server binary of its protocol revision and against exec-gateway.

Revisions:
  may  Codex 0.130.0: plain absolute paths
  nov  Codex 0.169.0: file:// URIs, writeId, environmentInfo, newer methods

A check is an `async def test_*(t)`; `t` is a `Check` (see below) bound to
one server. Modules say which revisions their checks speak with
`REVISIONS = ("may", "nov")`; each check is collected once per revision and
target, with ids like `test_x[nov-reference]` and `test_x[nov-gateway]`.

Servers are started once per module and target (module-scoped); every check
opens its own sessions and works in its own fresh directory under the
server's workspace root. The gateway serves one tenant whose root is that
workspace; the reference is started in its workspace with HOME pointing
there, so host-dependent answers (environmentInfo.cwd, userHomeDir) name the
same directory on both.

`@pytest.mark.reference_quirk(reason)` marks a check where the gateway
deliberately answers differently from the reference; such a check asserts
the shape on both and each target's own value.
"""

import asyncio
import inspect
import itertools
import os
import pathlib
import secrets
import select
import shutil
import signal
import subprocess
import tempfile
import time
import tomllib
import urllib.parse

import jwt
import pytest

from .harness import Conn, Run, b64, connect

REPO = pathlib.Path(__file__).resolve().parents[3]
CODEX_VERSIONS = {"may": "0.130.0", "nov": "0.169.0"}
KINDS = ("reference", "gateway")
# Upper bound on one check (a hang guard, not a speed assertion).
CHECK_TIMEOUT = 120
STARTUP_TIMEOUT = 60


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "reference_quirk(reason): the gateway deliberately differs from the official "
        "exec-server here; the check asserts the shape on both targets and each "
        "target's own value")


def pytest_collection_modifyitems(config, items):
    for item in items:
        for mark in item.iter_markers("reference_quirk"):
            reason = mark.kwargs.get("reason") or (mark.args[0] if mark.args else "")
            if not reason:
                raise pytest.UsageError(f"{item.nodeid}: reference_quirk needs a reason")


def pytest_generate_tests(metafunc):
    if "t" not in metafunc.fixturenames:
        return
    revisions = getattr(metafunc.module, "REVISIONS", ("may", "nov"))
    params = [f"{rev}-{kind}" for rev in revisions for kind in KINDS]
    metafunc.parametrize("server", params, indirect=True, scope="module")


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem):
    """Run `async def` checks on a fresh event loop; close their sessions."""
    fn = pyfuncitem.obj
    if not inspect.iscoroutinefunction(fn):
        return None
    kwargs = {name: pyfuncitem.funcargs[name] for name in pyfuncitem._fixtureinfo.argnames}

    async def main():
        try:
            await asyncio.wait_for(fn(**kwargs), CHECK_TIMEOUT)
        finally:
            check = pyfuncitem.funcargs.get("t")
            if isinstance(check, Check):
                await check.aclose()

    asyncio.run(main())
    return True


# -- servers ----------------------------------------------------------------

def codex_binary(version: str) -> pathlib.Path:
    """Where scripts/fetch-codex puts an official binary (CODEX_TOOLS_DIR overrides)."""
    tools = os.environ.get("CODEX_TOOLS_DIR", str(REPO / ".ci" / ".tools" / "codex"))
    return pathlib.Path(tools) / version / "codex"


def gateway_binary() -> pathlib.Path:
    return pathlib.Path(os.environ.get(
        "EXEC_GATEWAY_BIN", str(REPO / "target" / "debug" / "exec-gateway")))


def gateway_version() -> str:
    with open(REPO / "Cargo.toml", "rb") as f:
        return tomllib.load(f)["package"]["version"]


def _default_signals():
    # A server started from a non-interactive shell's background job would
    # otherwise hand SIGINT/SIGQUIT "ignored" down to its children.
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGQUIT, signal.SIG_DFL)


def _read_lines(proc, count, log_path):
    """The first `count` stdout lines of a starting server."""
    lines, buf = [], b""
    deadline = time.monotonic() + STARTUP_TIMEOUT
    fd = proc.stdout.fileno()
    while len(lines) < count:
        left = deadline - time.monotonic()
        if left <= 0 or proc.poll() is not None:
            break
        ready, _, _ = select.select([fd], [], [], left)
        if not ready:
            continue
        chunk = os.read(fd, 4096)
        if not chunk:
            break
        buf += chunk
        while b"\n" in buf and len(lines) < count:
            line, buf = buf.split(b"\n", 1)
            lines.append(line.decode().strip())
    if len(lines) < count:
        if proc.poll() is None:
            proc.kill()
        rc = proc.wait()
        log = pathlib.Path(log_path).read_text(errors="replace")[-4000:]
        raise RuntimeError(f"server exited ({rc}) after printing {lines!r}; stderr:\n{log}")
    return lines


class Server:
    """One running exec-server (reference or gateway) and its workspace."""

    def __init__(self, kind, revision, root, url, headers, version, codex_home=None):
        self.kind = kind
        self.revision = revision
        self.root = root
        self.url = url
        self.headers = headers
        self.version = version
        self.codex_home = codex_home
        self.proc = None
        self.scratch = []  # directories outside pytest's tmp to remove afterwards
        self._counter = itertools.count()

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=20)


def start_reference(revision, base: pathlib.Path) -> Server:
    version = CODEX_VERSIONS[revision]
    binary = codex_binary(version)
    if not binary.exists():
        pytest.skip(f"official Codex {version} binary absent: run scripts/fetch-codex")
    root = base / "workspace"
    root.mkdir()
    codex_home = pathlib.Path(tempfile.mkdtemp(prefix="codex-home-", dir="/var/tmp"))
    env = {k: v for k, v in os.environ.items() if k not in ("TMPDIR", "CODEX_HOME")}
    env.update(HOME=str(root), CODEX_HOME=str(codex_home))
    log = base / "server.log"
    proc = subprocess.Popen(
        [str(binary), "exec-server", "--listen", "ws://127.0.0.1:0"],
        cwd=root, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
        stderr=open(log, "wb"), preexec_fn=_default_signals, start_new_session=True)
    (url,) = _read_lines(proc, 1, log)
    assert url.startswith("ws://127.0.0.1:"), url
    server = Server("reference", revision, root, url, {}, version, codex_home)
    server.proc = proc
    server.scratch.append(codex_home)
    return server


def start_gateway(revision, base: pathlib.Path) -> Server:
    binary = gateway_binary()
    if not binary.exists():
        pytest.skip(f"exec-gateway binary absent at {binary}: build it first")
    root = base / "workspace"
    root.mkdir()
    # The key lies outside everything the tenant may read (its root, /tmp).
    conf = pathlib.Path(tempfile.mkdtemp(prefix="exec-gateway-conf-", dir="/var/tmp"))
    secret = secrets.token_hex(32)
    (conf / "hs256.key").write_text(secret)
    (conf / "gateway.toml").write_text(
        "[[auth.keys]]\n"
        'algorithm = "HS256"\n'
        f'secret_file = "{conf / "hs256.key"}"\n'
        'tenant = "t1"\n'
        "[server]\n"
        'shutdown_grace = "1s"\n'
        "[tenants.t1]\n"
        f'root = "{root}"\n')
    log = base / "server.log"
    proc = subprocess.Popen(
        [str(binary), "serve", "--listen", "ws://127.0.0.1:0", "--admin-listen", "127.0.0.1:0",
         "--grpc-listen", "127.0.0.1:0", "--config", str(conf / "gateway.toml")],
        # Its own state dir: the tenant's private /tmp is not shared with
        # other gateways.
        env={**os.environ, "XDG_STATE_HOME": str(conf / "state")},
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=open(log, "wb"),
        preexec_fn=_default_signals, start_new_session=True)
    url, grpc = _read_lines(proc, 2, log)
    assert url.startswith("ws://127.0.0.1:"), url
    assert grpc.startswith("grpc://127.0.0.1:"), grpc
    # No tenant claim: the key is bound to tenant t1.
    token = jwt.encode({"sub": "conformance", "scope": "exec fs:read fs:write",
                        "exp": int(time.time()) + 6 * 3600}, secret, algorithm="HS256")
    server = Server("gateway", revision, root, url,
                    {"Authorization": f"Bearer {token}"}, gateway_version())
    server.proc = proc
    server.scratch.append(conf)
    return server


@pytest.fixture(scope="module")
def server(request, tmp_path_factory):
    revision, kind = request.param.split("-")
    base = tmp_path_factory.mktemp(f"{revision}-{kind}")
    srv = (start_reference if kind == "reference" else start_gateway)(revision, base)
    try:
        yield srv
    finally:
        srv.stop()
        for path in srv.scratch:
            shutil.rmtree(path, ignore_errors=True)


# -- one check ----------------------------------------------------------------

class Check:
    """What a check sees: its server, its own directory, and sessions.

    Paths are written in the revision's form with `wire` (plain for May,
    file:// URIs for Nov); `dir` is this check's fresh directory.
    """

    def __init__(self, server: Server, name: str):
        self.server = server
        self.kind = server.kind
        self.revision = server.revision
        self.root = server.root
        self.dir = server.root / f"{name}-{next(server._counter)}"
        self.dir.mkdir()
        self.conns = []
        self._write_ids = itertools.count(1)

    # target and revision
    @property
    def gateway(self):
        return self.kind == "gateway"

    @property
    def reference(self):
        return self.kind == "reference"

    @property
    def nov(self):
        return self.revision == "nov"

    @property
    def may(self):
        return self.revision == "may"

    def pick(self, may, nov):
        """The value for this revision."""
        return nov if self.nov else may

    # paths
    def wire(self, path, revision=None):
        """A host path in the revision's wire form."""
        path = str(path)
        if (revision or self.revision) == "nov":
            return "file://" + urllib.parse.quote(path)
        return path

    def p(self, rel=""):
        """This check's directory (or a path under it) in wire form."""
        return self.wire(self.dir / rel if rel else self.dir)

    def other_form(self, path):
        """A host path in the other revision's form."""
        return self.wire(path, "may" if self.nov else "nov")

    def unwire(self, text):
        if self.nov:
            assert text.startswith("file:///"), text
            return urllib.parse.unquote(text[len("file://"):])
        return text

    # sessions
    async def connect(self) -> Conn:
        conn = await connect(self.server.url, self.server.headers)
        self.conns.append(conn)
        return conn

    async def session(self, **init) -> Conn:
        """A new connection with a new (or resumed) session, initialized."""
        conn = await self.connect()
        conn.init_result = await conn.initialize(**init)
        await conn.notify("initialized")
        return conn

    async def aclose(self):
        for conn in self.conns:
            await conn.close()

    async def tell(self, conn):
        """A harmless request that carries a path in the revision's form, so
        a server that learns the revision per session has learned it."""
        await conn.call("fs/getMetadata", {"path": self.p()})

    # processes
    def start_params(self, process_id, argv, **extra):
        params = {"processId": process_id, "argv": argv, "cwd": self.p(),
                  "env": {"PATH": "/usr/bin:/bin"}, "tty": False}
        params.update(extra)
        return params

    async def start(self, conn, process_id, argv, **extra):
        return await conn.call("process/start", self.start_params(process_id, argv, **extra))

    async def run(self, conn, process_id, argv, **extra) -> Run:
        """Start a process and collect its notifications up to the end."""
        await self.start(conn, process_id, argv, **extra)
        return Run(await conn.process_events(process_id))

    def write_params(self, process_id, data, write_id=None):
        """process/write params; a 0.169 client always sends a writeId."""
        params = {"processId": process_id, "chunk": b64(data)}
        if self.nov:
            params["writeId"] = write_id or f"w{next(self._write_ids)}"
        elif write_id is not None:
            params["writeId"] = write_id
        return params

    async def write(self, conn, process_id, data, write_id=None):
        return await conn.call("process/write", self.write_params(process_id, data, write_id))


@pytest.fixture
def t(server, request):
    return Check(server, request.node.originalname)
