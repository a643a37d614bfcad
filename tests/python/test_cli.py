"""The client commands (`exec-gateway exec`, `cp`, `ps`) as users run them:
under a real terminal (tmux: keys sent with send-keys, the screen read with
capture-pane), in pipes, across a connection the gateway closes, and
copying files both ways, against a real gateway with tokens minted here."""

import asyncio
import hashlib
import json
import os
import pathlib
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
import uuid

import jwt
import pytest
import websockets

from conftest import gateway_binary

WAIT = 60  # seconds any one condition may take on a loaded CI machine


class CliGateway:
    def __init__(self, url, grpc, secret, root):
        self.url, self.grpc, self.secret, self.root = url, grpc, secret, root

    def token(self, tenant="cli", **extra):
        claims = {"sub": "py", "tenant": tenant, "scope": "exec fs:read fs:write",
                  "exp": int(time.time()) + 3600}
        claims.update(extra)
        return jwt.encode(claims, self.secret, algorithm="HS256")

    def env(self, **extra):
        """The environment the CLI finds its gateway and token in."""
        e = dict(os.environ, EXEC_GATEWAY_URL=self.url, EXEC_GATEWAY_TOKEN=self.token())
        e.pop("RUST_LOG", None)
        e.update(extra)
        return e


def start_gateway(tmp, server_extra=""):
    secret = secrets.token_hex(32).encode()
    conf = pathlib.Path(tempfile.mkdtemp(prefix="exec-gateway-cli-conf-"))
    (conf / "hs256.key").write_bytes(secret)
    root = pathlib.Path(tempfile.mkdtemp(prefix="exec-gateway-cli-root-"))
    root.chmod(0o1777)
    (conf / "gateway.toml").write_text(
        f"[server]\n{server_extra}\n"
        "[[auth.keys]]\nalgorithm = \"HS256\"\n"
        f"secret_file = \"{conf}/hs256.key\"\n"
        f"[tenants.cli]\nroot = \"{root}\"\n"
        "[tenants.other]\nroot = \"/\"\n")
    proc = subprocess.Popen(
        [gateway_binary(), "serve", "--listen", "ws://127.0.0.1:0",
         "--grpc-listen", "127.0.0.1:0", "--admin-listen", "off",
         "--config", str(conf / "gateway.toml")],
        stdout=subprocess.PIPE, text=True)
    url = proc.stdout.readline().strip()
    grpc = proc.stdout.readline().strip()
    assert url.startswith("ws://") and grpc.startswith("grpc://"), (url, grpc)
    return proc, CliGateway(url, grpc, secret, root), [conf, root]


@pytest.fixture
def gw(tmp_path):
    proc, g, dirs = start_gateway(tmp_path)
    yield g
    proc.terminate()
    proc.wait(timeout=20)
    for d in dirs:
        shutil.rmtree(d, ignore_errors=True)


def cli(g, *args, input=None, env=None, timeout=WAIT):
    return subprocess.run([gateway_binary(), *args], input=input, capture_output=True,
                          env=env or g.env(), timeout=timeout)


# --- a real terminal -------------------------------------------------------


class Tmux:
    def __init__(self, tmp):
        self.sock = f"egw-{uuid.uuid4().hex[:8]}"
        self.tmp = tmp

    def run(self, *args, check=True):
        return subprocess.run(["tmux", "-L", self.sock, *args], capture_output=True,
                              text=True, check=check)

    def start(self, script, cols=100, rows=30):
        path = self.tmp / "pane.sh"
        path.write_text(script)
        path.chmod(0o755)
        self.run("-f", "/dev/null", "new-session", "-d", "-s", "t", "-x", str(cols),
                 "-y", str(rows), str(path))

    def exec_in_pane(self, gw, args):
        """Run `exec-gateway exec ARGS` in the pane; then `CLIENT-DONE` is
        printed and the client's exit code written to the file returned."""
        exit_file = self.tmp / "client-exit"
        env = gw.env()
        self.start(
            "#!/bin/sh\n"
            f"export EXEC_GATEWAY_URL='{env['EXEC_GATEWAY_URL']}' "
            f"EXEC_GATEWAY_TOKEN='{env['EXEC_GATEWAY_TOKEN']}'\n"
            f"'{gateway_binary()}' exec {args}\n"
            f"echo $? > '{exit_file}'\n"
            "echo CLIENT-DONE\n"
            "sleep 600\n")
        return exit_file

    def screen(self):
        return self.run("capture-pane", "-p", "-J", "-S", "-200", "-t", "t",
                        check=False).stdout

    def keys(self, *keys):
        self.run("send-keys", "-t", "t", *keys)

    def wait_for(self, text, what=None):
        deadline = time.monotonic() + WAIT
        while time.monotonic() < deadline:
            if text in self.screen():
                return
            time.sleep(0.05)
        raise AssertionError(f"{what or text!r} never appeared; screen:\n{self.screen()}")

    def kill(self):
        self.run("kill-server", check=False)


@pytest.fixture
def tmux(tmp_path):
    if shutil.which("tmux") is None:
        pytest.skip("tmux is not installed (.ci/run installs it)")
    t = Tmux(tmp_path)
    yield t
    t.kill()


def test_interactive_shell_under_a_real_terminal(gw, tmux, tmp_path):
    exit_file = tmux.exec_in_pane(gw, "-it -e PS1='remote$ ' -- bash --norc --noprofile -i")
    tmux.wait_for("remote$ ", "the remote prompt")

    # A command typed at the remote shell, and its output.
    tmux.keys("echo hello-$((6*7))", "Enter")
    tmux.wait_for("hello-42")
    # It runs in the tenant's root, behind a terminal.
    tmux.keys("pwd; tty", "Enter")
    tmux.wait_for(str(gw.root))
    tmux.wait_for("/dev/pts/")

    # The remote terminal has the local one's size, and follows a resize.
    tmux.keys("stty size", "Enter")
    tmux.wait_for("30 100", "stty size 30 100")
    tmux.run("resize-window", "-t", "t", "-x", "120", "-y", "40")
    tmux.keys("stty size", "Enter")
    tmux.wait_for("40 120", "stty size 40 120 after the resize")

    # Ctrl-C interrupts the running command, not the client.
    tmux.keys("echo ar''med; sleep 1000; echo not-reached", "Enter")
    tmux.wait_for("\narmed")
    tmux.keys("C-c")
    tmux.keys("echo after-$?", "Enter")
    tmux.wait_for("after-130", "the shell's status after Ctrl-C")
    assert "not-reached\n" not in tmux.screen().replace("echo not-reached", "")

    # The client exits with the shell's code.
    tmux.keys("exit 3", "Enter")
    tmux.wait_for("CLIENT-DONE", "the client's exit")
    assert exit_file.read_text().strip() == "3"


def test_a_pipe_program_under_a_terminal_reads_the_keys_typed(gw, tmux, tmp_path):
    """`-t` without a shell: a line typed goes through the remote
    terminal's line discipline (echoed, edited) to the program."""
    exit_file = tmux.exec_in_pane(
        gw, "-it -- sh -c 'echo ready; read l; echo \"got:$l\"; exit 5'")
    tmux.wait_for("ready")
    tmux.keys("abcx", "BSpace", "d", "Enter")
    tmux.wait_for("got:abcd")
    tmux.wait_for("CLIENT-DONE")
    assert exit_file.read_text().strip() == "5"


# --- pipes -----------------------------------------------------------------


def test_piped_stdin_reaches_the_process_and_eof_closes_it(gw):
    blob = os.urandom(3 * 1024 * 1024 + 17)
    r = cli(gw, "exec", "-i", "--", "sh", "-c", "sha256sum; echo done >&2; exit 4",
            input=blob)
    assert r.returncode == 4, r.stderr
    assert r.stdout.decode().split()[0] == hashlib.sha256(blob).hexdigest()
    assert r.stderr.decode().endswith("done\n")


def test_stdout_and_stderr_are_kept_apart_and_exit_codes_pass_through(gw):
    r = cli(gw, "exec", "--env", "GREETING=hi there", "--cwd", ".", "--",
            "sh", "-c", 'echo "$GREETING"; echo to-err >&2; pwd; exit 42')
    assert r.returncode == 42
    assert r.stdout.decode() == f"hi there\n{gw.root}\n"
    assert r.stderr.decode() == "to-err\n"
    # Without -i the process's stdin is empty.
    r = cli(gw, "exec", "--", "sh", "-c", "cat; echo end", input=b"ignored")
    assert (r.returncode, r.stdout) == (0, b"end\n")


def test_a_signal_death_exits_128_plus_n_and_signals_are_forwarded(gw):
    r = cli(gw, "exec", "--", "sh", "-c", "kill -TERM $$")
    assert r.returncode == 128 + signal.SIGTERM, r.stderr
    # SIGINT to the client goes to the process (a trap there answers it).
    p = subprocess.Popen(
        [gateway_binary(), "exec", "--", "sh", "-c",
         "trap 'echo got-int; exit 9' INT; echo armed; while :; do sleep 0.05; done"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=gw.env())
    assert p.stdout.readline() == b"armed\n"
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=WAIT)
    assert p.returncode == 9, err
    assert out == b"got-int\n"


def test_client_errors_are_named_and_exit_125_126_127(gw):
    r = cli(gw, "exec", "--", "no-such-command-here")
    assert r.returncode == 127
    assert b"No such file or directory" in r.stderr
    forged = jwt.encode({"tenant": "cli", "scope": "exec", "exp": int(time.time()) + 60},
                        b"x" * 32, algorithm="HS256")
    r = cli(gw, "exec", "--", "true", env=gw.env(EXEC_GATEWAY_TOKEN=forged))
    assert r.returncode == 125
    assert b"401" in r.stderr and b"invalid signature" in r.stderr
    # No token and a gateway elsewhere: refused before connecting.
    env = gw.env(EXEC_GATEWAY_URL="ws://192.0.2.1:8765")
    env.pop("EXEC_GATEWAY_TOKEN")
    r = cli(gw, "exec", "--", "true", env=env)
    assert r.returncode == 125 and b"no token" in r.stderr
    # A working directory outside the tenant's root.
    r = cli(gw, "exec", "--cwd", "/etc", "--", "true")
    assert r.returncode == 125 and b"outside the tenant root" in r.stderr


def test_exec_over_grpc(gw):
    r = cli(gw, "exec", "--grpc", "--url", gw.grpc, "-i", "--", "sh", "-c",
            "cat; echo err >&2; exit 6", input=b"via grpc\n")
    assert (r.returncode, r.stdout, r.stderr) == (6, b"via grpc\n", b"err\n")


# --- resume ----------------------------------------------------------------


@pytest.fixture
def aging_gw(tmp_path):
    proc, g, dirs = start_gateway(tmp_path, 'max_connection_age = "1s"')
    yield g
    proc.terminate()
    proc.wait(timeout=20)
    for d in dirs:
        shutil.rmtree(d, ignore_errors=True)


def test_a_connection_the_gateway_closes_is_resumed_without_losing_output(aging_gw):
    """The gateway closes every connection after a second (1001); output
    keeps flowing for several seconds. The client resumes each time and
    re-attaches from its last seq: every line arrives exactly once."""
    script = ("i=0; while [ $i -lt 30000 ]; do i=$((i+1)); echo \"line $i\"; "
              "case $i in *000) sleep 0.15;; esac; done; exit 2")
    r = cli(aging_gw, "exec", "--", "sh", "-c", script,
            env=aging_gw.env(RUST_LOG="exec_gateway::client=info"), timeout=120)
    assert r.returncode == 2, r.stderr[-2000:]
    expected = "".join(f"line {i}\n" for i in range(1, 30001))
    assert r.stdout.decode() == expected
    resumed = r.stderr.decode().count("session resumed")
    assert resumed >= 2, r.stderr.decode()[-2000:]
    assert "1001" in r.stderr.decode()


# --- cp --------------------------------------------------------------------


def sha(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def tree(root):
    out = {}
    for p in sorted(pathlib.Path(root).rglob("*")):
        rel = str(p.relative_to(root))
        out[rel] = "dir" if p.is_dir() else sha(p)
    return out


def test_cp_a_50_mib_file_both_ways(gw, tmp_path):
    src = tmp_path / "big.bin"
    with open(src, "wb") as f:
        for _ in range(50):
            f.write(os.urandom(1 << 20))
    r = cli(gw, "cp", str(src), ":big.bin", timeout=300)
    assert r.returncode == 0, r.stderr
    assert sha(gw.root / "big.bin") == sha(src)
    back = tmp_path / "back.bin"
    r = cli(gw, "cp", ":big.bin", str(back), timeout=300)
    assert r.returncode == 0, r.stderr
    assert sha(back) == sha(src)
    # The same over gRPC, into an existing directory (keeps the name).
    into = tmp_path / "into"
    into.mkdir()
    r = cli(gw, "cp", "--grpc", "--url", gw.grpc, ":big.bin", str(into), timeout=300)
    assert r.returncode == 0, r.stderr
    assert sha(into / "big.bin") == sha(src)


def test_cp_a_directory_tree_both_ways(gw, tmp_path):
    src = tmp_path / "proj"
    (src / "a" / "b").mkdir(parents=True)
    (src / "empty").mkdir()
    (src / "a" / "b" / "deep.txt").write_text("deep\n")
    (src / "top.bin").write_bytes(os.urandom(3 * 1024 * 1024 + 5))
    (src / "zero").write_bytes(b"")
    (src / "link").symlink_to("/etc/passwd")  # not followed, not copied
    r = cli(gw, "cp", str(src), ":")
    assert r.returncode == 0, r.stderr
    assert b"skipped 1" in r.stderr
    want = {k: v for k, v in tree(src).items() if k != "link"}
    assert tree(gw.root / "proj") == want
    out = tmp_path / "out"
    r = cli(gw, "cp", ":proj", str(out))
    assert r.returncode == 0, r.stderr
    assert tree(out) == want
    # Into an existing directory: the tree keeps its name.
    r = cli(gw, "cp", "--grpc", "--url", gw.grpc, ":proj", str(out))
    assert r.returncode == 0, r.stderr
    assert tree(out / "proj") == want


def test_cp_stays_inside_the_tenant_root(gw, tmp_path):
    r = cli(gw, "cp", ":../../../../etc/passwd", str(tmp_path / "x"))
    assert r.returncode == 125
    assert b"outside the tenant root" in r.stderr
    assert not (tmp_path / "x").exists()
    r = cli(gw, "cp", "/etc/hostname", ":/etc/hostname-copy")
    assert r.returncode == 125 and b"outside the tenant root" in r.stderr
    r = cli(gw, "cp", "a", "b")
    assert r.returncode == 125 and b"exactly one" in r.stderr


# --- ps --------------------------------------------------------------------


def test_ps_lists_a_sessions_processes(gw):
    async def detached_session():
        async with websockets.connect(gw.url, additional_headers={
                "Authorization": f"Bearer {gw.token()}"}) as ws:
            await ws.send(json.dumps({"id": 1, "method": "initialize",
                                      "params": {"clientName": "py"}}))
            sid = json.loads(await ws.recv())["result"]["sessionId"]
            await ws.send(json.dumps({"method": "initialized"}))
            for pid, argv in (("sleeper", ["sleep", "30"]), ("quick", ["true"])):
                await ws.send(json.dumps({"id": pid, "method": "process/start", "params": {
                    "processId": pid, "argv": argv, "cwd": str(gw.root), "env": {},
                    "tty": False}}))
                while json.loads(await ws.recv()).get("id") != pid:
                    pass
            await ws.send(json.dumps({"id": 9, "method": "process/read", "params": {
                "processId": "quick", "waitMs": 10000}}))
            while json.loads(await ws.recv()).get("id") != 9:
                pass
            return sid

    sid = asyncio.run(detached_session())
    r = None
    for _ in range(100):  # the old connection may not have let go yet
        r = cli(gw, "ps", "--session", sid, "--json")
        if r.returncode == 0:
            break
        time.sleep(0.1)
    assert r.returncode == 0, r.stderr
    rows = {p["processId"]: p for p in map(json.loads, r.stdout.decode().splitlines())}
    assert rows["sleeper"]["state"] == "running"
    assert rows["quick"]["exitCode"] == 0
    # Another tenant's token does not find the session.
    r = cli(gw, "ps", "--session", sid, env=gw.env(EXEC_GATEWAY_TOKEN=gw.token("other")))
    assert r.returncode == 125 and b"unknown session id" in r.stderr


def test_finished_commands_free_their_sessions(gw, tmp_path):
    """Each exec and cp ends its session when done (session/close,
    CloseSession) instead of leaving it for a resume: more runs than the
    tenant's 64 sessions go through back to back, on both doors."""
    for i in range(70):
        grpc = ["--grpc", "--url", gw.grpc] if i % 2 else []
        r = cli(gw, "exec", *grpc, "--", "true")
        assert r.returncode == 0, (i, r.stderr)
    (tmp_path / "f").write_text("x")
    for i in range(70):
        r = cli(gw, "cp", str(tmp_path / "f"), f":f{i % 3}")
        assert r.returncode == 0, (i, r.stderr)


def test_session_close_kills_what_is_left_and_forgets_the_session(gw):
    async def run():
        headers = {"Authorization": f"Bearer {gw.token()}"}
        async with websockets.connect(gw.url, additional_headers=headers) as ws:
            async def call(i, method, params=None):
                await ws.send(json.dumps({"id": i, "method": method, "params": params}))
                while True:
                    m = json.loads(await ws.recv())
                    if m.get("id") == i:
                        return m
            sid = (await call(1, "initialize", {"clientName": "py"}))["result"]["sessionId"]
            # Before `initialized`: refused, nothing closed.
            early = await call(2, "session/close")
            assert early["error"]["code"] == -32600
            await ws.send(json.dumps({"method": "initialized"}))
            await call(3, "process/start", {"processId": "s", "argv": ["sleep", "300"],
                                            "cwd": str(gw.root), "env": {}, "tty": False})
            assert (await call(4, "session/close")) == {"id": 4, "result": {}}
            with pytest.raises(websockets.ConnectionClosedOK):
                await ws.recv()
        async with websockets.connect(gw.url, additional_headers=headers) as ws:
            await ws.send(json.dumps({"id": 1, "method": "initialize",
                                      "params": {"clientName": "py", "resumeSessionId": sid}}))
            m = json.loads(await ws.recv())
            assert m["error"]["message"] == f"unknown session id {sid}"
    asyncio.run(run())
    deadline = time.monotonic() + WAIT
    while subprocess.run(["pgrep", "-f", "^sleep 300$"], capture_output=True).returncode == 0:
        assert time.monotonic() < deadline, "the session's process outlived session/close"
        time.sleep(0.05)


def test_a_slow_reader_loses_nothing(gw):
    """The client's stdout read slower than the process writes: the
    client stops reading its connection and the gateway holds the process
    back, as a pipe would; every byte arrives, in order."""
    blob = os.urandom(24 * 1024 * 1024)
    (gw.root / "blob").write_bytes(blob)
    p = subprocess.Popen([gateway_binary(), "exec", "--", "cat", "blob"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=gw.env())
    h, got = hashlib.sha256(), 0
    while chunk := p.stdout.read(64 * 1024):
        h.update(chunk)
        got += len(chunk)
        time.sleep(0.002)  # a slow consumer: ~30 MB/s at most
    assert p.wait(timeout=WAIT) == 0, p.stderr.read()
    assert (got, h.hexdigest()) == (len(blob), hashlib.sha256(blob).hexdigest())


def test_output_lost_across_a_drop_is_reported_never_silent(aging_gw):
    """Bulk output while the gateway closes the connection every second:
    what the gateway no longer retains when the client is back cannot be
    recovered, but the client must say so and fail, never exit 0 with a
    short or reordered stream."""
    blob = os.urandom(30 * 1024 * 1024)
    (aging_gw.root / "blob").write_bytes(blob)
    for _ in range(3):
        r = cli(aging_gw, "exec", "--", "sh", "-c", "cat blob; cat blob", timeout=120)
        if r.returncode == 0:
            assert r.stdout == blob + blob
        else:
            # Lost output, or (on a loaded machine) a resume that did not
            # make it in time: a failure either way, and said.
            assert r.returncode == 125, r.stderr
            assert b"were lost while the connection was away" in r.stderr \
                or b"could not resume" in r.stderr, r.stderr


def test_a_minted_token_goes_only_to_a_listener_of_this_user(gw, tmp_path):
    """Without --token the client mints one with the embedded key for a
    loopback gateway; another local user squatting on the port gets none."""
    import socket
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    squatter = subprocess.Popen(
        ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "python3", "-c",
         f"import socket,time; s=socket.socket(); s.bind(('127.0.0.1',{port})); s.listen(); "
         "print('up', flush=True); time.sleep(60)"],
        stdout=subprocess.PIPE, text=True)
    try:
        assert squatter.stdout.readline().strip() == "up"
        env = gw.env(EXEC_GATEWAY_URL=f"ws://127.0.0.1:{port}",
                     XDG_STATE_HOME=str(tmp_path / "state"))
        env.pop("EXEC_GATEWAY_TOKEN")
        r = cli(gw, "exec", "--", "true", env=env)
        assert r.returncode == 125
        assert b"listened on by uid 65534" in r.stderr, r.stderr
    finally:
        squatter.kill()
        squatter.wait()


def test_cp_skips_links_and_does_not_copy_a_tree_into_itself(gw, tmp_path):
    # A tenant's link loop: skipped, not copied without end.
    r = cli(gw, "exec", "--", "sh", "-c",
            "mkdir -p bomb/sub && echo data > bomb/file && ln -s . bomb/a && ln -s .. bomb/sub/up")
    assert r.returncode == 0, r.stderr
    out = tmp_path / "bomb"
    r = cli(gw, "cp", ":bomb", str(out))
    assert r.returncode == 0, r.stderr
    assert b"skipped 2" in r.stderr
    assert tree(out) == {"file": sha(gw.root / "bomb" / "file"), "sub": "dir"}
    # A destination inside the source: the tree as listed before copying.
    (gw.root / "self" / "d").mkdir(parents=True)
    (gw.root / "self" / "d" / "f").write_text("f\n")
    r = cli(gw, "cp", ":self", str(gw.root / "self"))
    assert r.returncode == 0, r.stderr
    assert sorted(tree(gw.root / "self")) == ["d", "d/f", "self", "self/d", "self/d/f"]
    # A FIFO as the source of an upload is refused, not read forever.
    os.mkfifo(tmp_path / "fifo")
    r = cli(gw, "cp", str(tmp_path / "fifo"), ":fifo")
    assert r.returncode == 125 and b"not a regular file or directory" in r.stderr
