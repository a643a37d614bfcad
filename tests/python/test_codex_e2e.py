"""End to end: the real Codex CLI (0.130.0 and 0.169.0) drives the gateway.

`codex exec` is given a remote exec-server environment (the gateway) and a
model provider that is a scripted mock of the Responses API
(`mock_responses.py`). The mock answers with tool calls one request at a
time: exec_command (pipes), exec_command with a PTY then write_stdin, a tty
probe, and an apply_patch; then a final message. Codex runs each tool call
through the gateway (`process/*`, `fs/*`) and sends the result back in the
next model request, where the test reads it.

The codex <-> gateway websocket passes through `ws_recorder.RecordingProxy`,
a transparent relay (same path and query, same Authorization header, frames
verbatim) that records every JSON-RPC frame, so the assertions can name the
exchange that served each step and a failure prints the transcript.

Nothing leaves 127.0.0.1: the mock, the proxy and the gateway listen on
loopback, and codex gets HTTP(S)_PROXY/ALL_PROXY pointing at a dead
loopback port (with loopback exempt), plus update checks, analytics,
feedback and plugin/app sync turned off.

Binaries: scripts/fetch-codex puts them in .ci/.tools/codex/VERSION/codex
(`CODEX_E2E_BIN_DIR` overrides the directory holding the VERSION dirs).
"""

from __future__ import annotations

import base64
import json
import os
import pathlib
import re
import secrets
import shutil
import subprocess
import tempfile
import time
import urllib.request

import jwt
import pytest

from mock_responses import (MockResponses, assistant_message, custom_tool_call,
                            function_call, offered_namespaces, session_id_in,
                            tool_names, tool_search_call)
from ws_recorder import RecordingProxy, path_of

ROOT = pathlib.Path(__file__).resolve().parents[2]
CODEX_DIR = pathlib.Path(os.environ.get("CODEX_E2E_BIN_DIR", ROOT / ".ci" / ".tools" / "codex"))
VERSIONS = ["0.130.0", "0.169.0"]
DEAD_PROXY = "http://127.0.0.1:9"  # discard port: nothing listens, a connect fails at once
CODEX_WAIT = 120  # seconds to wait for one `codex exec` (a bound, not a measurement)


def redact(text: str) -> str:
    """Tokens out of failure messages (codex prints the URL it dialled)."""
    return re.sub(r"(access_token=)[^&\s'\"`]+", r"\1<redacted>", text)


def gateway_binary() -> str:
    return os.environ.get("EXEC_GATEWAY_BIN", str(ROOT / "target" / "debug" / "exec-gateway"))


def codex_binary(version: str) -> pathlib.Path:
    path = CODEX_DIR / version / "codex"
    if not os.access(path, os.X_OK):
        pytest.skip(f"codex {version} binary absent at {path} (run scripts/fetch-codex)")
    return path


# --------------------------------------------------------------------------
# The gateway, one tenant rooted in a scratch directory
# --------------------------------------------------------------------------

class TenantGateway:
    """A gateway serving tenant t1 rooted at `root`, with one HS256 key bound
    to t1 (so a token without a tenant claim, like Codex's own, is t1's).
    t1's base_env carries EXEC_GW_PROBE=<probe>: a process sees that value
    only if the gateway started it (envPolicy inherits the tenant's base_env,
    and the codex process itself is run without that variable)."""

    def __init__(self, scratch: pathlib.Path):
        self.root = scratch / "tenant"
        self.root.mkdir()
        self.secret = secrets.token_hex(32).encode()
        self.probe = "tenant-t1-" + secrets.token_hex(6)
        (scratch / "hs256.key").write_bytes(self.secret)
        (scratch / "gateway.toml").write_text(
            "[[auth.keys]]\n"
            'algorithm = "HS256"\n'
            f'secret_file = "{scratch}/hs256.key"\n'
            'tenant = "t1"\n'
            "\n[tenants.t1]\n"
            f'root = "{self.root}"\n'
            f'base_env = {{ PATH = "/usr/local/bin:/usr/bin:/bin", HOME = "{self.root}", '
            f'LANG = "C.UTF-8", SHELL = "/bin/bash", EXEC_GW_PROBE = "{self.probe}" }}\n'
        )
        self.stderr_path = scratch / "gateway.stderr"
        self._stderr = open(self.stderr_path, "wb")
        self.proc = subprocess.Popen(
            [gateway_binary(), "serve", "--listen", "ws://127.0.0.1:0",
             "--admin-listen", "127.0.0.1:0",
             "--config", str(scratch / "gateway.toml")],
            stdout=subprocess.PIPE, stderr=self._stderr, text=True,
            env={**os.environ, "RUST_LOG": os.environ.get("RUST_LOG", "info"),
                 "XDG_STATE_HOME": str(scratch / "state")},
        )
        self.url = self.proc.stdout.readline().strip()
        if not self.url.startswith("ws://127.0.0.1:"):
            self.close()
            raise AssertionError(f"gateway did not start: {self.url!r}\n{self.log()}")
        self.admin_url = self.proc.stdout.readline().strip().removeprefix("admin ")

    def token(self, **claims) -> str:
        """Like Codex's signed bearer tokens: no tenant, no scope claim."""
        body = {"sub": "codex-e2e", "exp": int(time.time()) + 3600}
        body.update(claims)
        return jwt.encode(body, self.secret, algorithm="HS256")

    def metrics(self) -> dict[tuple[str, str], float]:
        """exec_gateway_requests_total for t1: (method, outcome) -> count."""
        with urllib.request.urlopen(f"{self.admin_url}/metrics", timeout=30) as r:
            text = r.read().decode()
        out = {}
        for m in re.finditer(r'^exec_gateway_requests_total\{([^}]*)\} (\S+)$', text, re.M):
            labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1)))
            if labels.get("tenant") == "t1":
                out[(labels["method"], labels["outcome"])] = float(m.group(2))
        return out

    def log(self) -> str:
        self._stderr.flush()
        return self.stderr_path.read_text(errors="replace")[-6000:]

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._stderr.close()


@pytest.fixture
def scratch():
    """Scratch space under /var/tmp (not /tmp): CODEX_HOME, tenant root, HOME."""
    path = pathlib.Path(tempfile.mkdtemp(prefix="exec-gw-codex-e2e-", dir="/var/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def tenant_gateway(scratch):
    gw = TenantGateway(scratch)
    yield gw
    gw.close()


# --------------------------------------------------------------------------
# Codex
# --------------------------------------------------------------------------

CONFIG_TOML = """\
model = "gpt-5.5"
model_provider = "mock"
approval_policy = "never"
sandbox_mode = "danger-full-access"
check_for_update_on_startup = false

[analytics]
enabled = false

[feedback]
enabled = false

[history]
persistence = "none"

[features]
plugins = false
apps = false

[model_providers.mock]
name = "mock"
base_url = "{base_url}"
wire_api = "responses"
env_key = "CODEX_E2E_API_KEY"
request_max_retries = 0
stream_max_retries = 0
"""


class CodexRun:
    def __init__(self, proc: subprocess.CompletedProcess):
        self.returncode = proc.returncode
        self.stdout = proc.stdout
        self.stderr = proc.stderr
        self.events = []
        for line in proc.stdout.splitlines():
            try:
                self.events.append(json.loads(line))
            except ValueError:
                pass

    def items(self, kind: str) -> list[dict]:
        return [e["item"] for e in self.events
                if e.get("type") == "item.completed" and e.get("item", {}).get("type") == kind]

    def describe(self) -> str:
        return (f"codex exit {self.returncode}\n--- stdout ---\n{self.stdout[-8000:]}"
                f"\n--- stderr ---\n{self.stderr[-4000:]}")


def run_codex(version: str, scratch: pathlib.Path, workdir: pathlib.Path, mock: MockResponses,
              *, exec_server_url: str | None = None, environments_toml: str | None = None,
              name: str = "run", extra_config: str = "") -> CodexRun:
    binary = codex_binary(version)
    codex_home = scratch / f"codex-home-{name}"
    codex_home.mkdir()
    (codex_home / "config.toml").write_text(
        CONFIG_TOML.format(base_url=mock.base_url) + extra_config)
    if environments_toml is not None:
        (codex_home / "environments.toml").write_text(environments_toml)
    home = scratch / f"home-{name}"
    home.mkdir()
    # A clean environment: nothing of ours (no EXEC_GW_PROBE, no real keys).
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "LANG": "C.UTF-8",
        "CODEX_HOME": str(codex_home),
        "CODEX_E2E_API_KEY": "sk-e2e-dummy",
        "RUST_LOG": os.environ.get("CODEX_E2E_RUST_LOG", "warn"),
        "NO_PROXY": "127.0.0.1,localhost",
        "no_proxy": "127.0.0.1,localhost",
    }
    for var in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"):
        env[var] = env[var.lower()] = DEAD_PROXY
    if exec_server_url is not None:
        env["CODEX_EXEC_SERVER_URL"] = exec_server_url
    proc = subprocess.run(
        [str(binary), "exec", "--json", "--skip-git-repo-check",
         "--dangerously-bypass-approvals-and-sandbox", "-C", str(workdir),
         "Follow the scripted steps."],
        cwd=workdir, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
        timeout=CODEX_WAIT,
    )
    return CodexRun(proc)


def connect_codex(version, gw: TenantGateway, ws_url: str) -> dict:
    """How each version is pointed at the gateway (through `ws_url`, the
    recording proxy): 0.130.0 takes only CODEX_EXEC_SERVER_URL and sends no
    header, so the token rides in `access_token`; 0.169.0 takes
    $CODEX_HOME/environments.toml, whose auth_bearer_token it sends as
    `Authorization: Bearer`."""
    token = gw.token()
    if version == "0.130.0":
        return {"exec_server_url": f"{ws_url}/?access_token={token}"}
    return {"environments_toml": environments_toml(f"{ws_url}/", token)}


def environments_toml(url: str, token: str, include_local: bool = False) -> str:
    """0.169.0's $CODEX_HOME/environments.toml naming the gateway as the
    default environment. `include_local = false`: without it, a refused
    handshake makes codex quietly run the commands on its own machine
    instead (see test_codex_0169_falls_back_to_local_by_default)."""
    return ('default = "gw"\n'
            + ("" if include_local else "include_local = false\n")
            + f'\n[[environments]]\nid = "gw"\nurl = "{url}"\nauth_bearer_token = "{token}"\n')


# --------------------------------------------------------------------------
# The scripted model
# --------------------------------------------------------------------------

def scenario(marker: str):
    """The model's turns. Each step sees the request Codex sent (with the
    output of the step before) and answers with the next tool call."""
    patch = (
        "*** Begin Patch\n"
        "*** Add File: created.txt\n"
        f"+created by apply_patch {marker}\n"
        "+second line\n"
        "*** Update File: existing.txt\n"
        "@@\n"
        " keep this line\n"
        "-old line\n"
        f"+new line {marker}\n"
        "*** End Patch\n"
    )

    def probe(body, mock):
        tools = tool_names(body)
        for needed in ("exec_command", "write_stdin", "apply_patch"):
            assert needed in tools, f"codex offered no {needed} tool: {sorted(tools)}"
        # Pipes, not a PTY: stdin is not a terminal. $PPID is the process
        # that spawned the shell: a gateway worker if the gateway ran it.
        return function_call("call-probe", "exec_command", {
            "cmd": 'echo "probe=$EXEC_GW_PROBE"; echo "parent=$(readlink /proc/$PPID/exe)"; '
                   'echo "cwd=$(pwd)"; if [ -t 0 ]; then echo pipe-tty=yes; '
                   'else echo pipe-tty=no; fi',
            "tty": False, "yield_time_ms": 10000})

    def stdin_start(body, mock):
        # A PTY process that waits for a line on stdin; it is still running
        # when the call yields, so Codex answers with its session id.
        return function_call("call-stdin", "exec_command", {
            "cmd": 'read -r line; echo "got:$line"', "tty": True, "yield_time_ms": 1500})

    def stdin_write(body, mock):
        out = mock.outputs().get("call-stdin", "")
        session = session_id_in(out)
        assert session is not None, f"no session id in the exec_command output: {out!r}"
        return function_call("call-write", "write_stdin", {
            "session_id": session, "chars": "hello-stdin\n", "yield_time_ms": 10000})

    def tty_probe(body, mock):
        return function_call("call-tty", "exec_command", {
            "cmd": 'if [ -t 0 ] && [ -t 1 ]; then echo tty=yes; else echo tty=no; fi; tty',
            "tty": True, "yield_time_ms": 10000})

    def apply_patch(body, mock):
        if tool_names(body).get("apply_patch") == "custom":  # freeform: the patch itself
            return custom_tool_call("call-patch", "apply_patch", patch)
        return function_call("call-patch", "apply_patch", {"input": patch})

    def done(body, mock):
        return assistant_message(f"finished {marker}")

    return [probe, stdin_start, stdin_write, tty_probe, apply_patch, done]


def agents_md_messages(body: dict) -> list[str]:
    """Texts of input messages that carry AGENTS.md instructions."""
    texts = []
    for item in body.get("input") or []:
        if item.get("type") != "message":
            continue
        for part in item.get("content") or []:
            text = part.get("text") or ""
            if "AGENTS.md" in text:
                texts.append(text)
    return texts


def failure_context(run: CodexRun, mock: MockResponses, proxy: RecordingProxy,
                    gw: TenantGateway) -> str:
    return redact(f"{run.describe()}\n--- mock errors ---\n{mock.errors}\n"
                  f"--- tool outputs ---\n{json.dumps(mock.outputs(), indent=1)}\n"
                  f"--- exec-server frames ---\n{proxy.transcript()}\n"
                  f"--- gateway log ---\n{gw.log()}")


def probe_script():
    """One exec_command that prints the tenant-only variable, then done."""
    return [lambda body, mock: function_call("call-probe", "exec_command", {
        "cmd": 'echo "probe=${EXEC_GW_PROBE:-unset}"', "tty": False, "yield_time_ms": 10000})]


# --------------------------------------------------------------------------
# The tests
# --------------------------------------------------------------------------

@pytest.mark.parametrize("version", VERSIONS)
def test_codex_drives_gateway(version, scratch, tenant_gateway):
    """(a) stdin via write_stdin, (b) a PTY, (c) apply_patch, (d) AGENTS.md,
    each served by the gateway, for both Codex versions."""
    codex_binary(version)  # skipped, with the reason, when the binary is absent
    gw = tenant_gateway
    marker = "AGENTS-MARKER-" + secrets.token_hex(8)
    workdir = gw.root / "project"
    workdir.mkdir()
    (workdir / "AGENTS.md").write_text(f"# Project rules\n\nAlways mention {marker}.\n")
    (workdir / "existing.txt").write_text("keep this line\nold line\n")
    before = gw.metrics()

    with MockResponses(scenario(marker)) as mock, RecordingProxy(gw.url) as proxy:
        run = run_codex(version, scratch, workdir, mock,
                        **connect_codex(version, gw, proxy.url))
        outputs = mock.outputs()
        after = gw.metrics()
        context = failure_context(run, mock, proxy, gw)

        assert run.returncode == 0, context
        assert not mock.errors, context
        types = [e.get("type") for e in run.events]
        assert "turn.completed" in types and "turn.failed" not in types, context
        assert "error" not in types, context
        assert proxy.connections and all(c["status"] == 101 for c in proxy.connections), context
        bodies = mock.response_bodies()
        assert len(bodies) == len(scenario(marker)), context

        # Through the gateway, not locally: the command sees t1's base_env
        # value (codex itself runs without EXEC_GW_PROBE, and envPolicy
        # inherits from the tenant's base_env on the gateway), the shell's
        # parent is hidden from it (the gateway's worker is not dumpable: a
        # local parent would be readable), and the gateway's process/start
        # carried the command. Each alone would do; together they rule out
        # a local run however codex is configured.
        probe = outputs.get("call-probe", "")
        assert f"probe={gw.probe}" in probe, context
        assert re.search(r"^parent=$", probe, re.M), context
        assert f"cwd={workdir}" in probe, context
        assert "pipe-tty=no" in probe, context
        starts = proxy.exchanges("process/start")
        assert any("EXEC_GW_PROBE" in " ".join(e["params"]["argv"]) and e["error"] is None
                   for e in starts), context
        for ex in proxy.exchanges():
            if ex["method"].startswith("process/"):
                assert ex["error"] is None, (ex, context)

        # (a) stdin: a PTY process waits on `read`, write_stdin feeds it a line,
        # and its answer comes back to the model.
        assert session_id_in(outputs.get("call-stdin", "")) is not None, context
        written = outputs.get("call-write", "")
        assert "got:hello-stdin" in written, context
        writes = proxy.exchanges("process/write")
        assert any(e["error"] is None and (e["result"] or {}).get("status") == "accepted"
                   for e in writes), context

        # (b) a PTY: stdin and stdout are terminals, `tty` names a pty device.
        tty_out = outputs.get("call-tty", "")
        assert "tty=yes" in tty_out and "/dev/pts/" in tty_out, context
        assert any(e["params"].get("tty") is True for e in starts), context

        # (c) apply_patch: the files on disk, written through the gateway's fs/writeFile.
        assert (workdir / "created.txt").read_text() == \
            f"created by apply_patch {marker}\nsecond line\n", context
        assert (workdir / "existing.txt").read_text() == \
            f"keep this line\nnew line {marker}\n", context
        fs_writes = {path_of(e["params"].get("path")): e for e in proxy.exchanges("fs/writeFile")}
        for name in ("created.txt", "existing.txt"):
            ex = fs_writes.get(str(workdir / name))
            assert ex is not None and ex["error"] is None, (name, context)
        assert after.get(("fs/writeFile", "ok"), 0) - before.get(("fs/writeFile", "ok"), 0) >= 2, \
            context
        patch_out = outputs.get("call-patch", "")
        assert "created.txt" in patch_out and "existing.txt" in patch_out, context
        changes = run.items("file_change")
        assert changes and all(c.get("status") == "completed" for c in changes), context

        # (d) AGENTS.md, read through the gateway (fs/readFile), reached the model.
        reads = [e for e in proxy.exchanges("fs/readFile")
                 if path_of(e["params"].get("path")) == str(workdir / "AGENTS.md")]
        assert reads and reads[0]["error"] is None, context
        assert marker in base64.b64decode(reads[0]["result"]["dataBase64"]).decode(), context
        for body in bodies:
            assert any(marker in t for t in agents_md_messages(body)), context

        # The --json events: every command completed with exit code 0.
        commands = run.items("command_execution")
        assert commands, context
        for item in commands:
            assert item.get("status") == "completed" and item.get("exit_code") == 0, \
                (item, context)
        assert any("got:hello-stdin" in (c.get("aggregated_output") or "") for c in commands), \
            context
        messages = run.items("agent_message")
        assert messages and marker in messages[-1].get("text", ""), context


@pytest.mark.parametrize("mode", ["env-only", "both"])
def test_codex_0169_exec_server_url(mode, scratch, tenant_gateway):
    """0.169.0 still honours CODEX_EXEC_SERVER_URL (no header, so the token
    rides in `access_token`); with environments.toml present as well, the
    file wins: codex dials only the URL from the file. The two URLs differ by
    a `via` query parameter, which the recording proxy sees."""
    codex_binary("0.169.0")
    gw = tenant_gateway
    workdir = gw.root / "project"
    workdir.mkdir()
    with MockResponses(probe_script()) as mock, RecordingProxy(gw.url) as proxy:
        token = gw.token()
        kw = {"exec_server_url": f"{proxy.url}/?via=env&access_token={token}"}
        if mode == "both":
            kw["environments_toml"] = environments_toml(f"{proxy.url}/?via=toml", token)
        run = run_codex("0.169.0", scratch, workdir, mock, **kw)
        context = failure_context(run, mock, proxy, gw)
        assert run.returncode == 0, context
        assert f"probe={gw.probe}" in mock.outputs().get("call-probe", ""), context
        vias = {re.search(r"via=(\w+)", c["path"]).group(1) for c in proxy.connections}
        assert vias == ({"env"} if mode == "env-only" else {"toml"}), context
        assert all(c["status"] == 101 for c in proxy.connections), context
        if mode == "both":
            assert all(c["bearer"] for c in proxy.connections), context


def bad_token() -> str:
    """Well formed, signed with a key the gateway does not hold."""
    return jwt.encode({"sub": "codex-e2e", "exp": int(time.time()) + 3600},
                      secrets.token_hex(32).encode(), algorithm="HS256")


@pytest.mark.parametrize("version,via", [("0.130.0", "url"), ("0.169.0", "toml"),
                                         ("0.169.0", "url")])
def test_codex_with_a_bad_token_runs_nothing(version, via, scratch, tenant_gateway):
    """A token the gateway refuses (wrong signature): every handshake gets
    401, the model is told the command failed, and the command ran nowhere
    (codex does not run it locally instead)."""
    codex_binary(version)
    gw = tenant_gateway
    workdir = gw.root / "project"
    workdir.mkdir()
    with MockResponses(probe_script()) as mock, RecordingProxy(gw.url) as proxy:
        if via == "url":
            kw = {"exec_server_url": f"{proxy.url}/?access_token={bad_token()}"}
        else:
            kw = {"environments_toml": environments_toml(f"{proxy.url}/", bad_token())}
        run = run_codex(version, scratch, workdir, mock, **kw)
        context = failure_context(run, mock, proxy, gw)
        assert proxy.connections, context
        assert all(c["status"] == 401 for c in proxy.connections), context
        assert not proxy.frames, context
        out = mock.outputs().get("call-probe")
        assert out is not None, context
        assert "probe=unset" not in out and gw.probe not in out, context
        assert "Process exited" not in out, context
        assert gw.metrics().get(("process/start", "ok"), 0) == 0, context


def test_codex_0169_falls_back_to_local_by_default(scratch, tenant_gateway):
    """Client behaviour worth knowing (not the gateway's): with
    environments.toml lacking `include_local = false`, a gateway that
    refuses the handshake does not stop 0.169.0: the command runs on the
    codex machine itself (no tenant variable, no frames, no process/start on
    the gateway). Hence `include_local = false` in every environments.toml
    here."""
    codex_binary("0.169.0")
    gw = tenant_gateway
    workdir = gw.root / "project"
    workdir.mkdir()
    with MockResponses(probe_script()) as mock, RecordingProxy(gw.url) as proxy:
        run = run_codex("0.169.0", scratch, workdir, mock, environments_toml=environments_toml(
            f"{proxy.url}/", bad_token(), include_local=True))
        context = failure_context(run, mock, proxy, gw)
        assert proxy.connections and all(c["status"] == 401 for c in proxy.connections), context
        assert "probe=unset" in mock.outputs().get("call-probe", ""), context
        assert gw.metrics().get(("process/start", "ok"), 0) == 0, context


@pytest.mark.parametrize("version", VERSIONS)
def test_codex_uses_the_gateway_as_an_mcp_server(version, scratch, tenant_gateway):
    """Codex as an MCP client: `exec-gateway mcp` in its [mcp_servers]; the
    mock model calls the gateway's run_command tool, whose command runs in
    t1's sandbox (it sees t1's base_env), and the result reaches the model.

    How Codex offers an MCP server's tools differs by version, and the mock
    model does what a real one is told to. 0.130.0 puts them in the request's
    `tools` as one `namespace` tool, `mcp__gw__`. 0.169.0 offers none of
    them up front: it always defers MCP tools behind its client-side
    `tool_search` tool (`codex features list` shows
    `tool_search_always_defer_mcp_tools` as removed and on; we found no
    config or per-server switch), so the model first calls `tool_search`,
    and Codex answers with a `tool_search_output` item carrying the matching
    tools as the namespace `mcp__gw`, callable from the next request on.
    Either way the call names the namespace Codex offered and the tool."""
    codex_binary(version)
    gw = tenant_gateway
    workdir = scratch / "local-workdir"
    workdir.mkdir()
    marker = "MCP-" + secrets.token_hex(6)
    config, mcp_state = scratch / "gateway.toml", scratch / "mcp-state"
    extra = (
        "\n[mcp_servers.gw]\n"
        f'command = "{gateway_binary()}"\n'
        f'args = ["mcp", "--config", "{config}"]\n'
        "startup_timeout_sec = 60\n"
        f'env = {{ EXEC_GATEWAY_TOKEN = "{gw.token()}", XDG_STATE_HOME = "{mcp_state}" }}\n'
    )
    state = {"called": None, "tries": 0, "searched": False}
    wanted = {"run_command", "read_file", "write_file"}

    def gateway_namespace(body):
        # The namespace holding the gateway's tools: named after the server
        # (`mcp__gw__` in 0.130.0, `mcp__gw` in 0.169.0).
        for name, (how, space) in offered_namespaces(body).items():
            if name.rstrip("_") == "mcp__gw":
                return name, how, space
        return None

    def step(body, mock):
        if state["called"]:
            return assistant_message(f"finished {marker}")
        found = gateway_namespace(body)
        if found is None:
            # Not offered yet: search for it if Codex has a tool_search,
            # else (or if the last search found nothing, the server still
            # starting) a short local wait.
            assert state["tries"] < 5, \
                f"codex offered no namespace for the gateway: {sorted(tool_names(body))}"
            state["tries"] += 1
            if tool_names(body).get("tool_search") == "tool_search" and not state["searched"]:
                state["searched"] = True
                return tool_search_call(f"call-search-{state['tries']}",
                                        "exec-gateway sandbox " + " ".join(sorted(wanted)),
                                        limit=20)
            state["searched"] = False
            return function_call(f"call-wait-{state['tries']}", "exec_command",
                                 {"cmd": "sleep 1", "yield_time_ms": 5000})
        name, how, space = found
        inner = {t["name"] for t in space.get("tools", [])}
        assert wanted <= inner, (name, how, sorted(inner))
        state["called"] = (name, how)
        item = function_call("call-mcp", "run_command", {
            "command": f'echo "probe=$EXEC_GW_PROBE"; echo {marker} > mcp-made.txt; pwd'})
        item["namespace"] = name
        return item

    with MockResponses([step] * 8) as mock:
        run = run_codex(version, scratch, workdir, mock, extra_config=extra, name="mcp")
        out = mock.outputs().get("call-mcp", "")
        context = (f"{run.describe()}\n--- offered as ---\n{state['called']}"
                   f"\n--- tool output ---\n{out}\n--- mock ---\n{mock.errors}")
        assert run.returncode == 0, context
        assert not mock.errors, context
        assert state["called"] is not None, context
        # Codex ran it as an MCP tool call of server gw, and it completed.
        calls = [i for i in run.items("mcp_tool_call")
                 if i.get("server") == "gw" and i.get("tool") == "run_command"]
        assert calls and all(c.get("status") == "completed" for c in calls), context
        # Ran in the gateway's sandbox: t1's base_env and root, not codex's.
        assert f"probe={gw.probe}" in out, context
        assert str(gw.root) in out, context
        assert (gw.root / "mcp-made.txt").read_text() == f"{marker}\n", context
        assert not (workdir / "mcp-made.txt").exists(), context
