"""The MCP server, driven by the official MCP Python SDK (PyPI `mcp`).

Streamable HTTP on the client listener (`[mcp] path`, default /mcp) and
`exec-gateway mcp` over stdio: the tools run commands and processes and
work on files in the tenant's sandbox, listed and callable by the token's
scopes; an MCP session is its caller's only (another tenant is told it does
not exist), bounded per tenant, and its end ends its processes.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import subprocess
import time
import urllib.error
import urllib.request

import jwt
import pytest

mcp = pytest.importorskip("mcp", reason="the MCP Python SDK (tests/python/requirements.txt)")
from mcp import ClientSession, StdioServerParameters  # noqa: E402
from mcp.client.stdio import stdio_client  # noqa: E402
from mcp.client.streamable_http import streamable_http_client  # noqa: E402
from mcp.shared._httpx_utils import create_mcp_http_client  # noqa: E402

from conftest import gateway_binary  # noqa: E402

ALL = "exec fs:read fs:write"


class McpGateway:
    """A gateway with tenants t1 and t2, each rooted in its own directory,
    and at most two MCP sessions per tenant."""

    def __init__(self, scratch, extra=""):
        self.dir = scratch
        self.secret = secrets.token_hex(32).encode()
        (scratch / "hs256.key").write_bytes(self.secret)
        self.roots = {}
        tenants = ""
        for t in ("t1", "t2"):
            root = scratch / t
            root.mkdir()
            root.chmod(0o1777)
            self.roots[t] = root
            tenants += (f'[tenants.{t}]\nroot = "{root}"\n'
                        'base_env = { PATH = "/usr/local/bin:/usr/bin:/bin", LANG = "C.UTF-8" }\n')
        self.config = scratch / "gateway.toml"
        self.config.write_text(
            "[[auth.keys]]\nalgorithm = \"HS256\"\n"
            f"secret_file = \"{scratch}/hs256.key\"\n"
            + extra + "[mcp]\nmax_sessions_per_tenant = 2\n" + tenants)
        self.env = {**os.environ, "XDG_STATE_HOME": str(scratch / "state")}
        self.proc = subprocess.Popen(
            [gateway_binary(), "serve", "--listen", "ws://127.0.0.1:0",
             "--admin-listen", "127.0.0.1:0", "--config", str(self.config)],
            stdout=subprocess.PIPE, text=True, env=self.env)
        ws = self.proc.stdout.readline().strip()
        assert ws.startswith("ws://127.0.0.1:"), ws
        self.base = ws.replace("ws://", "http://")
        self.url = self.base + "/mcp"
        self.admin = self.proc.stdout.readline().strip().removeprefix("admin ")

    def token(self, tenant="t1", scope=ALL, sub="agent") -> str:
        return jwt.encode({"sub": sub, "tenant": tenant, "scope": scope,
                           "exp": int(time.time()) + 3600}, self.secret, algorithm="HS256")

    def close(self):
        self.proc.terminate()
        self.proc.wait(timeout=30)


@pytest.fixture
def gw(scratch):
    g = McpGateway(scratch)
    yield g
    g.close()


class Session:
    """One MCP session over streamable HTTP, with its session id."""

    def __init__(self, gw: McpGateway, **token):
        self.gw, self.token = gw, gw.token(**token)

    async def __aenter__(self):
        self.http = create_mcp_http_client(headers={"Authorization": f"Bearer {self.token}"})
        self._stack = [self.http, streamable_http_client(self.gw.url, http_client=self.http)]
        await self.http.__aenter__()
        self._transport = self._stack[1]
        r, w = await self._transport.__aenter__()
        self.session = ClientSession(r, w)
        await self.session.__aenter__()
        self.init = await self.session.initialize()
        return self

    async def __aexit__(self, *exc):
        await self.session.__aexit__(*exc)
        await self._transport.__aexit__(*exc)
        await self.http.__aexit__(*exc)

    async def call(self, name, args=None):
        return await self.session.call_tool(name, args or {})

    async def ok(self, name, args=None) -> dict:
        r = await self.call(name, args)
        assert not r.is_error, f"{name}: {r.content}"
        # The same result as text, for clients that read only content.
        assert json.loads(r.content[0].text) == r.structured_content
        return r.structured_content


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 120))


def post(url, body, token=None, session=None):
    headers = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    if session:
        headers["Mcp-Session-Id"] = session
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers=headers, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, {k.lower(): v for k, v in r.headers.items()}, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, {k.lower(): v for k, v in e.headers.items()}, e.read().decode()


INIT = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-11-25", "capabilities": {},
                   "clientInfo": {"name": "raw", "version": "1"}}}


def test_tools_run_commands_and_work_on_files(gw):
    async def go():
        async with Session(gw) as s:
            assert s.init.server_info.name == "exec-gateway"
            names = {t.name for t in (await s.session.list_tools()).tools}
            assert {"run_command", "process_start", "process_read", "process_write",
                    "process_terminate", "process_list", "read_file", "write_file",
                    "list_directory", "search_files"} <= names
            # Scopes this token lacks: their tools are not listed.
            assert not names & {"snapshot_create", "fork_snapshot", "preview_create"}

            r = await s.ok("run_command", {"command": "echo out; echo err >&2; pwd; exit 3"})
            assert r["exit_code"] == 3 and r["timed_out"] is False
            assert r["stdout"] == f"out\n{gw.roots['t1']}\n" and r["stderr"] == "err\n"

            # Output in many chunks arrives whole and in order.
            r = await s.ok("run_command", {
                "command": "for i in $(seq 1 60); do echo line$i; sleep 0.005; done"})
            assert r["stdout"] == "".join(f"line{i}\n" for i in range(1, 61))

            # Output bounded, the cut counted; stdin given.
            r = await s.ok("run_command", {"argv": ["head", "-c", "5000", "/dev/zero"],
                                           "max_output_bytes": 100})
            assert len(r["stdout"]) == 100 and r["stdout_cut_bytes"] == 4900
            r = await s.ok("run_command", {"command": "tr a-z A-Z", "stdin": "shout"})
            assert r["stdout"] == "SHOUT"

            # A command that leaves a process running (`server &`): its own
            # exit is the answer, at once, and what it left keeps running.
            r = await s.ok("run_command", {"command": "sleep 30 & echo started"})
            assert r["exit_code"] == 0 and r["stdout"] == "started\n"
            assert r["timed_out"] is False and r["still_running_in_background"] is True

            # Past its timeout the command is terminated.
            r = await s.ok("run_command", {"command": "echo started; sleep 60", "timeout_ms": 500})
            assert r["timed_out"] is True and r["exit_code"] is None
            assert r["stdout"] == "started\n"

            w = await s.ok("write_file", {"path": "src/app/main.py", "create_parents": True,
                                          "content": "def main():\n    return 'needle'\n"})
            assert w["path"] == f"{gw.roots['t1']}/src/app/main.py"
            assert (gw.roots["t1"] / "src/app/main.py").read_text().endswith("'needle'\n")
            await s.ok("write_file", {"path": "src/other.txt", "content": "no match here\n"})
            await s.ok("write_file", {"path": "blob.bin", "encoding": "base64",
                                      "content": "AAEC/w=="})
            assert (gw.roots["t1"] / "blob.bin").read_bytes() == b"\x00\x01\x02\xff"

            r = await s.ok("read_file", {"path": "src/app/main.py"})
            assert r["content"].startswith("def main") and r["eof"] is True
            r = await s.ok("read_file", {"path": "src/app/main.py", "offset": 4, "max_bytes": 4})
            assert r["content"] == "main" and r["eof"] is False
            r = await s.ok("read_file", {"path": "blob.bin"})
            assert r["encoding"] == "base64" and r["content"] == "AAEC/w=="

            r = await s.ok("list_directory", {"path": "src"})
            assert r["entries"] == [{"name": "app", "kind": "directory"},
                                    {"name": "other.txt", "kind": "file"}]

            # A directory larger than a listing: 2,000 entries, marked cut.
            await s.ok("run_command", {"command": "mkdir big && cd big && seq 1 2100 | xargs touch"})
            r = await s.ok("list_directory", {"path": "big"})
            assert len(r["entries"]) == 2000 and r["truncated"] is True

            r = await s.ok("search_files", {"pattern": "needle", "path": "src"})
            assert [(m["path"], m["line"]) for m in r["matches"]] == [
                (f"{gw.roots['t1']}/src/app/main.py", 2)]
            r = await s.ok("search_files", {"pattern": "ne+dle|match", "regex": True, "path": "src",
                                            "name_suffix": ".txt"})
            assert [m["text"] for m in r["matches"]] == ["no match here"]

            # A long-running process: start, write, read to its exit.
            p = (await s.ok("process_start", {"command": "read l; echo got:$l"}))["process_id"]
            await s.ok("process_write", {"process_id": p, "data": "hi\n", "close_stdin": True})
            out, seq = "", 0
            for _ in range(50):
                r = await s.ok("process_read", {"process_id": p, "after_seq": seq,
                                                "wait_ms": 2000})
                out, seq = out + r["stdout"], r["next_after_seq"]
                if r["closed"] and not r["stdout"]:
                    break
            assert out == "got:hi\n" and r["exit_code"] == 0
            # Read in pieces: each after_seq picks up where the last ended.
            p = (await s.ok("process_start", {
                "command": "for i in 1 2 3 4 5; do echo part$i; sleep 0.05; done"}))["process_id"]
            out, seq = "", 0
            for _ in range(100):
                r = await s.ok("process_read", {"process_id": p, "after_seq": seq,
                                                "wait_ms": 1000})
                out, seq = out + r["stdout"], r["next_after_seq"]
                if r["closed"] and not r["stdout"]:
                    break
            assert out == "part1\npart2\npart3\npart4\npart5\n"
            listed = (await s.ok("process_list"))["processes"]
            assert any(x["process_id"] == p for x in listed)

            # Bad arguments and gateway refusals are tool errors the model reads.
            r = await s.call("run_command", {"command": "true", "argv": ["true"]})
            assert r.is_error and "either command or argv" in r.content[0].text
            r = await s.call("read_file", {"path": "/etc/shadow"})
            assert r.is_error
            r = await s.call("read_file", {"path": "../t2/x"})
            assert r.is_error
            r = await s.call("process_read", {"process_id": "nope"})
            assert r.is_error
    run(go())


def test_scopes_decide_which_tools_are_listed_and_run(gw):
    async def go():
        async with Session(gw, scope="fs:read") as s:
            names = {t.name for t in (await s.session.list_tools()).tools}
            assert names == {"read_file", "list_directory", "search_files"}
            # Called anyway: refused, naming the scope; nothing ran.
            r = await s.call("run_command", {"command": f"touch {gw.roots['t1']}/ran"})
            assert r.is_error and "`exec` scope" in r.content[0].text
            r = await s.call("write_file", {"path": "w.txt", "content": "x"})
            assert r.is_error and "`fs:write` scope" in r.content[0].text
            tools = {t.name: t for t in (await s.session.list_tools()).tools}
            assert tools["read_file"].annotations.read_only_hint is True
        assert not (gw.roots["t1"] / "ran").exists()
        assert not (gw.roots["t1"] / "w.txt").exists()
    run(go())


def test_a_session_is_its_callers_only_and_bounded(gw):
    # No credential, or a forged one: 401 before any MCP.
    status, headers, _ = post(gw.url, INIT)
    assert status == 401 and headers["www-authenticate"].startswith("Bearer")
    forged = jwt.encode({"sub": "x", "tenant": "t1", "exp": int(time.time()) + 60},
                        b"not-the-key" * 4, algorithm="HS256")
    assert post(gw.url, INIT, forged)[0] == 401

    t1 = gw.token("t1")
    status, headers, _ = post(gw.url, INIT, t1)
    assert status == 200, status
    sid = headers["mcp-session-id"]
    listing = {"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {}}
    # Another tenant, or another subject of the same tenant, with the id:
    # no such session (the same answer as an unknown id).
    assert post(gw.url, listing, gw.token("t2"), sid)[0] == 404
    assert post(gw.url, listing, gw.token("t1", sub="someone-else"), sid)[0] == 404
    assert post(gw.url, listing, t1, "unknown-session")[0] == 404
    assert post(gw.url, listing, t1, sid)[0] == 200

    # Two per tenant: the third is refused with Retry-After; t2 unaffected.
    assert post(gw.url, INIT, t1)[0] == 200
    status, headers, _ = post(gw.url, INIT, t1)
    assert status == 429 and headers["retry-after"] == "5"
    assert post(gw.url, INIT, gw.token("t2"))[0] == 200
    # Closing one frees its slot.
    req = urllib.request.Request(gw.url, method="DELETE", headers={
        "Authorization": f"Bearer {t1}", "Mcp-Session-Id": sid})
    with urllib.request.urlopen(req, timeout=30) as r:
        assert r.status < 300
    assert post(gw.url, INIT, t1)[0] == 200


def test_closing_the_session_ends_its_processes(gw):
    marker = "mcp-end-" + secrets.token_hex(4)

    async def go():
        async with Session(gw) as s:
            await s.ok("process_start", {"argv": ["sleep", "300", marker]})
            r = await s.ok("run_command", {"command": f"pgrep -f '{marker}' | wc -l"})
            assert r["stdout"].strip() != "0"
    run(go())
    for _ in range(100):
        if subprocess.run(["pgrep", "-f", f"sleep 300 {marker}"]).returncode != 0:
            break
        time.sleep(0.1)
    assert subprocess.run(["pgrep", "-f", f"sleep 300 {marker}"]).returncode != 0, \
        "the session's process outlived its MCP session"


def test_stdio(gw):
    async def go():
        params = StdioServerParameters(
            command=gateway_binary(), args=["mcp", "--config", str(gw.config)],
            env={**gw.env, "EXEC_GATEWAY_TOKEN": gw.token("t2")})
        async with stdio_client(params) as (r, w), ClientSession(r, w) as s:
            await s.initialize()
            res = await s.call_tool("run_command", {"command": "echo via-stdio > f.txt; pwd"})
            assert not res.is_error, res.content
            assert res.structured_content["stdout"] == f"{gw.roots['t2']}\n"
        assert (gw.roots["t2"] / "f.txt").read_text() == "via-stdio\n"
    run(go())


def test_stdio_refuses_a_bad_token(gw):
    p = subprocess.run([gateway_binary(), "mcp", "--config", str(gw.config)],
                       env={**gw.env, "EXEC_GATEWAY_TOKEN": "garbage"}, input="",
                       capture_output=True, text=True, timeout=60)
    assert p.returncode != 0 and "token refused" in p.stderr, p.stderr
    assert p.stdout == ""


@pytest.fixture
def gw_places(scratch):
    """A gateway whose tenant can snapshot and preview (root only: forks
    and previews need the namespaces and network layers)."""
    if os.geteuid() != 0:
        pytest.skip("snapshots' forks and previews need namespaces (root)")
    g = McpGateway(scratch, f'[snapshots]\nstore = "{scratch}/snapshots"\n'
                            '[preview]\nbase_url = "http://preview.test"\n')
    yield g
    g.close()


def test_snapshot_fork_and_preview_tools(gw_places):
    gw = gw_places
    scopes = "exec fs:read fs:write snapshot preview"

    async def go():
        async with Session(gw, scope=scopes) as s:
            names = {t.name for t in (await s.session.list_tools()).tools}
            assert {"snapshot_create", "snapshot_list", "fork_snapshot",
                    "preview_create", "preview_revoke"} <= names
            await s.ok("write_file", {"path": "state.txt", "content": "before"})
            snap = await s.ok("snapshot_create", {"name": "mcp-snap"})
            sid = snap["id"]
            assert sid.startswith("snap-")
            assert sid in [x["id"] for x in (await s.ok("snapshot_list"))["snapshots"]]
            await s.ok("write_file", {"path": "state.txt", "content": "after"})

            forked = await s.ok("fork_snapshot", {"snapshot_id": sid})
            assert forked["snapshot_id"] == sid
            # The session now works in the fork: the snapshot's file, and
            # its writes stay in the fork.
            assert (await s.ok("read_file", {"path": "state.txt"}))["content"] == "before"
            await s.ok("write_file", {"path": "fork-only.txt", "content": "x"})
            assert not (gw.roots["t1"] / "fork-only.txt").exists()
            assert (gw.roots["t1"] / "state.txt").read_text() == "after"
            r = await s.call("fork_snapshot", {"snapshot_id": "snap-" + "0" * 32})
            assert r.is_error
            # The failed fork left the session as it was.
            assert (await s.ok("read_file", {"path": "fork-only.txt"}))["content"] == "x"

            # A preview of a server the agent starts in its session.
            await s.ok("write_file", {"path": "site/index.html", "content": "hello preview",
                                      "create_parents": True})
            await s.ok("process_start", {"argv": ["python3", "-m", "http.server", "8123",
                                                  "--bind", "127.0.0.1"], "cwd": "site"})
            p = await s.ok("preview_create", {"port": 8123})
            assert p["port"] == 8123 and p["url"].startswith("http://8123-")
            body = None
            for _ in range(100):
                req = urllib.request.Request(gw.base + p["path"], headers={
                    "Authorization": f"Bearer {gw.token(scope=scopes)}"})
                try:
                    with urllib.request.urlopen(req, timeout=10) as r:
                        body = r.read().decode()
                        break
                except urllib.error.HTTPError as e:
                    if e.code != 502:
                        raise
                    await asyncio.sleep(0.1)  # the server is not listening yet
            assert body == "hello preview"
            assert (await s.ok("preview_revoke", {"port": 8123}))["revoked"] is True
    run(go())
