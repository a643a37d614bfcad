"""Lifecycle webhooks (docs/webhooks.md), end to end: the real gateway
POSTs to a real HTTP receiver in this process, which verifies every
delivery with the Standard Webhooks reference library (`standardwebhooks`
from PyPI). Events come from real clients: websocket sessions running real
processes, a quota refused, an idle tenant retired, a real
`exec-gateway executor` joining and leaving its pool; and, where the host
has slirp4netns and nft, a name refused by a tenant's egress rules."""

import asyncio
import collections
import http.server
import json
import os
import pathlib
import secrets as pysecrets
import shutil
import signal
import subprocess
import threading
import time
import base64

import jwt
import pytest
import websockets
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from conftest import Gateway, gateway_binary

WAIT = 30


def whsec() -> str:
    return "whsec_" + base64.b64encode(os.urandom(32)).decode()


class Receiver:
    """An HTTP server on 127.0.0.1 that keeps every POST (path, headers,
    body, the status it answered). `answer(path, id, nth)` picks the
    status: nth is how many times this id reached this path before."""

    def __init__(self, answer=None):
        self.lock = threading.Lock()
        self.requests = []
        self.answer = answer or (lambda path, mid, nth: 200)
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("content-length", "0")))
                headers = {k.lower(): v for k, v in self.headers.items()}
                mid = headers.get("webhook-id")
                with receiver.lock:
                    nth = sum(1 for r in receiver.requests
                              if r["path"] == self.path and r["id"] == mid)
                    status = receiver.answer(self.path, mid, nth)
                    receiver.requests.append({"path": self.path, "id": mid, "headers": headers,
                                              "body": body, "status": status})
                self.send_response(status)
                if status == 503:
                    self.send_header("Retry-After", "0")
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()

    def delivered(self, path):
        """Requests to `path` answered 2xx, each webhook-id once (the
        receiver's dedupe)."""
        with self.lock:
            seen, out = set(), []
            for r in self.requests:
                if r["path"] == path and 200 <= r["status"] < 300 and r["id"] not in seen:
                    seen.add(r["id"])
                    out.append(r)
            return out

    def events(self, path):
        return [json.loads(r["body"]) for r in self.delivered(path)]

    def wait_for(self, path, pred, what):
        deadline = time.time() + WAIT
        while time.time() < deadline:
            found = [e for e in self.events(path) if pred(e)]
            if found:
                return found
            time.sleep(0.05)
        raise AssertionError(f"no {what} at {path}; got {[e['type'] for e in self.events(path)]}")


def of_type(t, **data):
    return lambda e: e["type"] == t and all(e["data"].get(k) == v for k, v in data.items())


class Served:
    """One `exec-gateway serve` with the given config; stopped by SIGTERM."""

    def __init__(self, tmp, config_text):
        self.tmp = tmp
        (tmp / "gateway.toml").write_text(config_text)
        self.proc = subprocess.Popen(
            [gateway_binary(), "serve", "--listen", "ws://127.0.0.1:0",
             "--admin-listen", "127.0.0.1:0", "--config", str(tmp / "gateway.toml")],
            stdout=subprocess.PIPE, text=True,
            env={**os.environ, "XDG_STATE_HOME": str(tmp / "state")},
        )
        self.url = self.proc.stdout.readline().strip()
        assert self.url.startswith("ws://127.0.0.1:"), self.url
        admin = self.proc.stdout.readline().strip()
        assert admin.startswith("admin http://"), admin
        self.admin = admin.removeprefix("admin ")
        self.gw = Gateway(self.url, (tmp / "hs256.key").read_bytes())

    def metrics(self):
        import urllib.request
        with urllib.request.urlopen(self.admin + "/metrics", timeout=10) as r:
            return r.read().decode()

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


def base_config(tmp, extra_tenants="", server=""):
    (tmp / "hs256.key").write_bytes(pysecrets.token_hex(32).encode())
    return (
        f"[server]\ntenant_idle_timeout = \"1s\"\nshutdown_grace = \"2s\"\n{server}"
        f"[[auth.keys]]\nalgorithm = \"HS256\"\nsecret_file = \"{tmp}/hs256.key\"\n"
        "[tenants.t1]\nroot = \"/\"\n"
        "[tenants.t2]\nroot = \"/\"\nmax_processes = 1\n"
        f"{extra_tenants}"
    )


def endpoint(tmp, name, url, secrets, extra=""):
    files = []
    for i, s in enumerate(secrets):
        f = tmp / f"{name}-{i}.secret"
        f.write_text(s + "\n")
        files.append(f'"{f}"')
    return (f"[[webhooks.endpoints]]\nname = \"{name}\"\nurl = \"{url}\"\n"
            f"secret_files = [{', '.join(files)}]\n"
            "retry_initial = \"50ms\"\nretry_max = \"500ms\"\nmax_attempts = 1000\n"
            f"{extra}\n")


class Session:
    def __init__(self, ws):
        self.ws, self.next_id, self.pending = ws, 1, []

    async def call(self, method, params):
        rid = self.next_id
        self.next_id += 1
        await self.ws.send(json.dumps({"id": rid, "method": method, "params": params}))
        while True:
            for i, m in enumerate(self.pending):
                if m.get("id") == rid:
                    return self.pending.pop(i)
            m = json.loads(await asyncio.wait_for(self.ws.recv(), WAIT))
            if m.get("id") == rid and ("result" in m or "error" in m):
                return m
            self.pending.append(m)

    async def exited(self, pid):
        while True:
            for i, m in enumerate(self.pending):
                if m.get("method") == "process/exited" and m["params"]["processId"] == pid:
                    return self.pending.pop(i)
            self.pending.append(json.loads(await asyncio.wait_for(self.ws.recv(), WAIT)))

    async def start(self, pid, script, cwd="/tmp"):
        return await self.call("process/start", {
            "processId": pid, "argv": ["sh", "-c", script], "cwd": cwd,
            "env": {}, "tty": False, "pipeStdin": False})


async def open_session(gw, tenant):
    ws = await websockets.connect(gw.url, compression=None,
                                  additional_headers=gw.headers(tenant=tenant))
    s = Session(ws)
    r = await s.call("initialize", {"clientName": "webhooks-test"})
    await ws.send(json.dumps({"method": "initialized"}))
    return s, r["result"]["sessionId"]


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 120))


def start_executor(tmp, served, pool_secret, executor_id):
    d = tmp / f"executor-{executor_id}"
    (d / "root").mkdir(parents=True)
    (d / "k").write_text(pysecrets.token_hex(32))
    (d / "executor.toml").write_text(
        f"[[auth.keys]]\nalgorithm = \"HS256\"\nsecret_file = \"{d}/k\"\n"
        f"[tenants.here]\nroot = \"{d}/root\"\n")
    token = jwt.encode({"sub": "ci", "pool": "p", "scope": "executor",
                        "exp": int(time.time()) + 3600}, pool_secret, algorithm="HS256")
    host = served.url.removeprefix("ws://")
    return subprocess.Popen(
        [gateway_binary(), "executor", "--config", str(d / "executor.toml"),
         "--remote", f"http://{host}/", "--executor-id", executor_id, "--slots", "1"],
        env={**os.environ, "CODEX_EXEC_SERVER_REMOTE_BEARER_TOKEN": token,
             "XDG_STATE_HOME": str(d / "state")},
        stdout=subprocess.DEVNULL,
    )


def verify_all(requests, secrets):
    """Every request verifies with each of `secrets` alone (rotation: the
    receiver may hold either), and carries one signature per secret."""
    for r in requests:
        assert len(r["headers"]["webhook-signature"].split(" ")) == len(secrets), r["headers"]
        for s in secrets:
            payload = Webhook(s).verify(r["body"], r["headers"])
            assert payload["type"] and payload["data"] is not None


def test_every_event_signed_filtered_retried(tmp_path):
    """One gateway, three endpoints: `all` (two secrets, as in a rotation),
    `procs` (only process.*, answering 500 to each message's first
    attempt), `t2` (only tenant t2's events)."""
    tmp = tmp_path
    old, new = whsec(), whsec()
    recv = Receiver(lambda path, mid, nth: 500 if path == "/procs" and nth == 0 else 200)
    config = (
        base_config(tmp, "[tenants.t3]\nroot = \"/\"\npool = \"p\"\n")
        + "[executors]\nopen_timeout = \"10s\"\n[executors.pools.p]\n"
        + f"[webhooks]\nspool_dir = \"{tmp}/spool\"\n"
        + endpoint(tmp, "all", recv.url + "/all", [old, new])
        + endpoint(tmp, "procs", recv.url + "/procs", [new], "events = [\"process.*\"]")
        + endpoint(tmp, "t2", recv.url + "/t2", [old], "tenants = [\"t2\"]")
    )
    served = Served(tmp, config)
    executor = None
    try:
        async def drive():
            s, sid = await open_session(served.gw, "t1")
            assert (await s.start("quick", "exit 3"))["result"] == {"processId": "quick"}
            await s.exited("quick")
            assert (await s.start("slow", "sleep 30"))["result"] == {"processId": "slow"}
            r = await s.call("process/terminate", {"processId": "slow"})
            assert "result" in r, r
            await s.exited("slow")
            r = await s.call("session/close", {})
            assert "result" in r, r
            await s.ws.close()
            # Tenant t2 may run one process: the second start is refused.
            s2, sid2 = await open_session(served.gw, "t2")
            await s2.start("hold", "sleep 30")
            r = await s2.start("more", "true")
            assert r["error"]["code"] == -32006, r
            await s2.call("process/terminate", {"processId": "hold"})
            await s2.exited("hold")
            await s2.ws.close()
            return sid, sid2

        sid, sid2 = run(drive())
        executor = start_executor(tmp, served, served.gw.secret, "ex1")
        recv.wait_for("/all", of_type("executor.joined", executor_id="ex1", pool="p", tenant="t3"),
                      "executor.joined")
        executor.send_signal(signal.SIGTERM)
        executor.wait(timeout=30)
        executor = None
        recv.wait_for("/all", of_type("executor.left", executor_id="ex1", tenant="t3"),
                      "executor.left")

        created = recv.wait_for("/all", of_type("session.created", session=sid), "session.created")
        assert created[0]["data"]["tenant"] == "t1" and created[0]["data"]["subject"] == "py"
        recv.wait_for("/all", of_type("session.closed", session=sid), "session.closed")
        quick = recv.wait_for("/all", of_type("process.exited", process_id="quick"), "exit")[0]
        assert quick["data"]["exit_code"] == 3 and quick["data"]["killed_by"] is None, quick
        slow = recv.wait_for("/all", of_type("process.exited", process_id="slow"), "kill")[0]
        assert slow["data"]["killed_by"] == "client" and slow["data"]["signal"] is not None, slow
        assert slow["data"]["session"] == sid
        refused = recv.wait_for("/all", of_type("quota.refused", tenant="t2"), "quota.refused")[0]
        assert refused["data"]["quota"] == "processes" and refused["data"]["limit"] == 1
        assert refused["data"]["method"] == "process/start"
        recv.wait_for("/all", of_type("tenant.activated", tenant="t1"), "tenant.activated")
        # Idle for tenant_idle_timeout (1s) once its sessions are gone.
        retired = recv.wait_for("/all", of_type("tenant.retired", tenant="t1"), "tenant.retired")[0]
        assert retired["data"]["reason"] == "idle"
        usage = retired["data"]["usage"]
        assert usage["processes_started"] == 2 and usage["activations"] == 1, usage
        assert usage["bytes_in"] > 0 and usage["bytes_out"] > 0, usage

        # Every delivery verifies with either secret of the rotation; a
        # changed byte does not.
        all_requests = [r for r in recv.requests if r["path"] == "/all"]
        verify_all(all_requests, [old, new])
        r = all_requests[0]
        with pytest.raises(WebhookVerificationError):
            Webhook(old).verify(r["body"].replace(b'"data"', b'"dat\\u0061"'), r["headers"])
        with pytest.raises(WebhookVerificationError):
            Webhook(whsec()).verify(r["body"], r["headers"])
        with pytest.raises(WebhookVerificationError):
            Webhook(old).verify(r["body"], {**r["headers"], "webhook-id": "msg_forged"})
        env = json.loads(r["body"])
        assert set(env) == {"type", "timestamp", "data"}
        assert env["timestamp"].endswith("Z") and "T" in env["timestamp"]

        # `procs` got process.* only, each after a 500 and its retry, with
        # the same id and body both times.
        procs = [r for r in recv.requests if r["path"] == "/procs"]
        verify_all(procs, [new])
        by_id = collections.defaultdict(list)
        for r in procs:
            by_id[r["id"]].append(r)
        assert {json.loads(r["body"])["type"] for r in procs} == {"process.exited"}
        pids = sorted(json.loads(rs[0]["body"])["data"]["process_id"] for rs in by_id.values())
        assert pids == ["hold", "quick", "slow"], pids
        for mid, rs in by_id.items():
            assert [r["status"] for r in rs] == [500, 200], (mid, rs)
            assert rs[0]["body"] == rs[1]["body"]
        # `t2` got tenant t2's events only.
        t2 = recv.events("/t2")
        assert t2 and all(e["data"]["tenant"] == "t2" for e in t2), t2
        assert {"session.created", "quota.refused", "process.exited"} <= {e["type"] for e in t2}
        text = served.metrics()
        assert 'exec_gateway_webhook_failed_attempts_total{endpoint="procs"} 3' in text, text
        assert 'exec_gateway_webhook_delivered_total{endpoint="procs"} 3' in text
    finally:
        if executor is not None:
            executor.kill()
            executor.wait()
        served.stop()
        recv.close()


def test_pending_events_survive_a_restart_with_their_ids(tmp_path):
    """The receiver answers 503 while events happen and while the gateway
    stops (its shutdown emits some too); a new gateway on the same spool
    sends them all once the receiver answers 200: every event arrives, under
    the id it first had, and deduped by webhook-id each exactly once."""
    tmp = tmp_path
    key = whsec()
    state = {"up": False}
    recv = Receiver(lambda path, mid, nth: 200 if state["up"] else 503)
    config = (base_config(tmp) + f"[webhooks]\nspool_dir = \"{tmp}/spool\"\n"
              + endpoint(tmp, "all", recv.url + "/all", [key]))
    served = Served(tmp, config)
    try:
        async def drive():
            s, sid = await open_session(served.gw, "t1")
            await s.start("p1", "exit 7")
            await s.exited("p1")
            # Still running at the stop: killed by the shutdown.
            await s.start("p2", "sleep 60")
            return s, sid

        async def main():
            s, sid = await drive()
            # Some attempts were refused before the stop.
            deadline = time.time() + WAIT
            while len({r["id"] for r in recv.requests}) < 3 and time.time() < deadline:
                await asyncio.sleep(0.05)
            assert served.stop() == 0
            await s.ws.close()
            return sid

        sid = run(main())
        before = {r["id"] for r in recv.requests}
        assert before and all(r["status"] == 503 for r in recv.requests)
        spooled = sorted(p.name for p in (tmp / "spool" / "all").iterdir())
        # The shutdown's own events (the session closed, its process
        # killed, the tenant retired) are among them, spooled before the
        # gateway exited.
        assert len(spooled) == 6, spooled

        state["up"] = True
        served = Served(tmp, config)
        deadline = time.time() + WAIT
        while len(recv.delivered("/all")) < 6 and time.time() < deadline:
            time.sleep(0.05)
        delivered = recv.delivered("/all")
        verify_all(delivered, [key])
        types = sorted(json.loads(r["body"])["type"] for r in delivered)
        assert types == ["process.exited", "process.exited", "session.closed",
                         "session.created", "tenant.activated", "tenant.retired"], types
        ids = [r["id"] for r in delivered]
        assert sorted(f"{i}.json" for i in ids) == spooled
        assert before <= set(ids), "an id seen before the restart was never delivered"
        # An id names one event: across attempts and the restart its body
        # never changed (a receiver's dedupe by id loses nothing).
        for i in ids:
            bodies = {r["body"] for r in recv.requests if r["id"] == i}
            assert len(bodies) == 1, (i, bodies)
        by_type = {json.loads(r["body"])["type"]: json.loads(r["body"]) for r in delivered}
        exits = {e["data"]["process_id"]: e["data"] for e in map(lambda r: json.loads(r["body"]), delivered)
                 if e["type"] == "process.exited"}
        assert exits["p1"]["exit_code"] == 7 and exits["p1"]["killed_by"] is None, exits
        assert exits["p2"]["killed_by"] == "shutdown" and exits["p2"]["signal"] == 9, exits
        assert by_type["session.closed"]["data"]["session"] == sid
        assert by_type["session.closed"]["data"]["reason"] == "shutdown"
        assert by_type["tenant.retired"]["data"]["reason"] == "shutdown"
        deadline = time.time() + WAIT
        while any((tmp / "spool" / "all").iterdir()) and time.time() < deadline:
            time.sleep(0.05)
        assert not any((tmp / "spool" / "all").iterdir()), "delivered messages left in the spool"
    finally:
        served.stop()
        recv.close()


def test_a_reload_rotates_the_secret_and_changes_the_filter(tmp_path):
    """SIGHUP with a new secret in the endpoint's file and another event
    filter: events from then on are signed with the new secret only and
    filtered anew."""
    tmp = tmp_path
    old, new = whsec(), whsec()
    recv = Receiver()
    ep = endpoint(tmp, "r", recv.url + "/r", [old], "events = [\"session.*\"]")
    served = Served(tmp, base_config(tmp) + f"[webhooks]\nspool_dir = \"{tmp}/spool\"\n" + ep)
    try:
        async def session():
            s, sid = await open_session(served.gw, "t1")
            await s.start("p", "exit 0")
            await s.exited("p")
            await s.ws.close()
            return sid

        sid1 = run(session())
        first = recv.wait_for("/r", of_type("session.created", session=sid1), "session.created")
        assert not [e for e in recv.events("/r") if e["type"] == "process.exited"]
        verify_all([r for r in recv.requests if r["path"] == "/r"], [old])

        (tmp / "r-0.secret").write_text(new + "\n")
        config = (tmp / "gateway.toml").read_text()
        (tmp / "gateway.toml").write_text(config.replace('events = ["session.*"]',
                                                         'events = ["process.*"]'))
        seen = len(recv.requests)
        served.proc.send_signal(signal.SIGHUP)
        deadline = time.time() + WAIT
        while 'exec_gateway_config_reloads_total{outcome="ok"} 1' not in served.metrics():
            assert time.time() < deadline, "no reload"
            time.sleep(0.05)

        sid2 = run(session())
        recv.wait_for("/r", of_type("process.exited", session=sid2), "process.exited")
        assert not [e for e in recv.events("/r") if e.get("data", {}).get("session") == sid2
                    and e["type"].startswith("session.")]
        after = recv.requests[seen:]
        verify_all(after, [new])
        for r in after:
            with pytest.raises(WebhookVerificationError):
                Webhook(old).verify(r["body"], r["headers"])
        assert first
    finally:
        served.stop()
        recv.close()


def test_unsafe_settings_refuse_the_start(tmp_path):
    tmp = tmp_path
    for url, says in [("http://192.0.2.1/h", "only to loopback"),
                      ("https://user:pw@hooks.example/h", "no user or password")]:
        config = base_config(tmp) + "[webhooks]\n" + endpoint(tmp, "x", url, [whsec()])
        (tmp / "gateway.toml").write_text(config)
        out = subprocess.run(
            [gateway_binary(), "serve", "--listen", "ws://127.0.0.1:0",
             "--config", str(tmp / "gateway.toml")],
            capture_output=True, text=True, timeout=60,
            env={**os.environ, "XDG_STATE_HOME": str(tmp / "state")})
        assert out.returncode == 64, out
        assert says in out.stderr, out.stderr


def egress_missing():
    if os.geteuid() != 0:
        return "needs root (a tenant's network namespace)"
    for tool in ["slirp4netns", "nft"]:
        if shutil.which(tool) is None and not pathlib.Path(f"/usr/sbin/{tool}").exists():
            return f"{tool} is not installed (Debian package {'nftables' if tool == 'nft' else tool})"
    return None


@pytest.mark.skipif(egress_missing() is not None, reason=str(egress_missing()))
def test_egress_refusal(tmp_path, scratch):
    """A tenant whose egress lists one name asks its resolver for another:
    refused (NXDOMAIN, audited as egress.denied), sent as egress.refused."""
    tmp = tmp_path
    key = whsec()
    recv = Receiver()
    root = scratch / "root"
    root.mkdir()
    root.chmod(0o777)
    config = (base_config(tmp, f"[tenants.e]\nroot = \"{root}\"\negress_names = [\"allowed.test\"]\n")
              + f"[webhooks]\nspool_dir = \"{tmp}/spool\"\n"
              + endpoint(tmp, "egress", recv.url + "/egress", [key], "events = [\"egress.*\"]"))
    served = Served(tmp, config)
    try:
        async def drive():
            s, _ = await open_session(served.gw, "e")
            r = await s.start("dns", "getent hosts refused.example.com; exit 0", cwd=str(root))
            assert "result" in r, r
            await s.exited("dns")
            await s.ws.close()

        run(drive())
        e = recv.wait_for("/egress", of_type("egress.refused", tenant="e"), "egress.refused")[0]
        assert e["data"]["name"] == "refused.example.com", e
        assert e["data"]["via"] == "dns", e
        verify_all(recv.delivered("/egress"), [key])
    finally:
        served.stop()
        recv.close()
