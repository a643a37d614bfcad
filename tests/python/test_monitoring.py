"""The monitoring in deploy/monitoring/ works against the real thing.

- `promtool check rules` passes on alerts.yml, every alert has a severity, a
  summary, a description and a runbook section that exists in
  docs/operations.md, and the Grafana dashboard is well-formed Grafana JSON
  (a datasource variable every query uses, unique ids, panels on the grid).
- A real Prometheus (Debian's package) scrapes a real gateway (the binary, in
  fleet mode, with executor pools, a JWKS URL and an audit trail) every
  second, with alerts.yml as its rule file, while real clients put it under
  load: websocket sessions of three tenants, a gRPC session, processes,
  errors of several kinds, calls shed by a tenant's rate limit, a quota
  refusal, a refused handshake, a connection over a tenant's cap, a
  handshake timeout, a session on a real remote executor (`exec-gateway
  executor`), a session that finds no executor, a refused executor
  registration, a peer request without a fleet credential, configuration
  reloads accepted and refused, an MCP session on /mcp, and lifecycle
  webhooks to a real receiver on loopback (one endpoint answering 500 to
  its first delivery and 200 after, one refusing with 400, so messages are
  delivered, retried and given up; an event over max_event_bytes dropped).
  Then every query of the dashboard (its
  template variables filled with the values the load made), every label
  query of its variables, every recording rule and every alert's expression
  is asked of Prometheus's HTTP API, and each must return data.
- Then the gateway is drained (SIGTERM, with processes still running so the
  drain lasts) and ExecGatewayDraining must fire in Prometheus's
  /api/v1/alerts (while ExecGatewayDrainStuck, on the same condition with
  `for: 5m`, is only pending).

Skipped with a named reason without /usr/bin/prometheus or promtool (Debian's
`prometheus` package; scripts/setup installs it) or the gateway binary.
"""

import asyncio
import base64
import http.server
import json
import os
import pathlib
import re
import secrets
import shutil
import signal
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

import grpc
import jwt
import pytest
import websockets

from conftest import Gateway, gateway_binary
from test_ws_client import Client

ROOT = pathlib.Path(__file__).resolve().parents[2]
MONITORING = ROOT / "deploy" / "monitoring"
ALERTS = MONITORING / "alerts.yml"
DASHBOARD = MONITORING / "grafana-dashboard.json"
OPERATIONS = ROOT / "docs" / "operations.md"
PROMETHEUS = "/usr/bin/prometheus"
PROMTOOL = "/usr/bin/promtool"

WAIT = 90  # seconds any one condition may take on a loaded CI machine
SEVERITIES = {"critical", "warning", "info"}
JOB = "exec-gateway"
# Server errors as alerts.yml counts them (its header says why).
SERVER_ERRORS = {"internal", "deadline_exceeded", "owner_unavailable", "owner_lost",
                 "executor_unavailable", "executor_error"}


def _yaml():
    return pytest.importorskip("yaml", reason="PyYAML missing (comes with kubernetes-validate)")


def _rules():
    return _yaml().safe_load(ALERTS.read_text())["groups"]


def _alerts():
    return [r for g in _rules() for r in g["rules"] if "alert" in r]


def _records():
    return [r for g in _rules() for r in g["rules"] if "record" in r]


def _dashboard():
    return json.loads(DASHBOARD.read_text())


def _panels(d):
    """Every panel, those nested in collapsed rows included."""
    for p in d["panels"]:
        yield p
        yield from p.get("panels", [])


def _dashboard_exprs(d):
    return [(p["title"], t["expr"]) for p in _panels(d) for t in p.get("targets", [])]


def _need(path, why):
    if not (os.path.isfile(path) and os.access(path, os.X_OK)):
        pytest.skip(f"{path} is missing ({why})")


# --- static checks ----------------------------------------------------------


def test_promtool_checks_the_rules():
    _need(PROMTOOL, "Debian's prometheus package; scripts/setup installs it")
    out = subprocess.run([PROMTOOL, "check", "rules", str(ALERTS)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    rules = len(_alerts()) + len(_records())
    assert f"SUCCESS: {rules} rules found" in out.stdout, out.stdout


def _anchors(markdown: str) -> set:
    """GitHub's anchors for a document's headings."""
    anchors = set()
    for line in markdown.splitlines():
        m = re.match(r"#+\s+(.*)", line)
        if m:
            slug = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-")
            anchors.add(slug)
    return anchors


def test_every_alert_says_how_bad_what_and_where_its_runbook_is():
    alerts = _alerts()
    names = [a["alert"] for a in alerts]
    assert len(names) == len(set(names)), "alert names repeat"
    anchors = _anchors(OPERATIONS.read_text())
    assert "monitoring" in anchors, "docs/operations.md has no Monitoring section"
    for a in alerts:
        name = a["alert"]
        assert a.get("labels", {}).get("severity") in SEVERITIES, name
        notes = a.get("annotations", {})
        assert notes.get("summary") and notes.get("description"), name
        doc, _, anchor = notes.get("runbook", "").partition("#")
        assert doc == "docs/operations.md", (name, notes.get("runbook"))
        assert anchor == name.lower() and anchor in anchors, (
            f"{name}: no section #{anchor} in docs/operations.md")
        severity = a["labels"]["severity"]
        assert f"| {name} | {severity} |" in OPERATIONS.read_text(), (
            f"{name}: not in docs/operations.md's table of alerts as {severity}")
    # The drain alert fires at once (the live test below waits for it); the
    # stuck-drain one only past deploy/'s 120 s grace.
    drain = {a["alert"]: a for a in alerts}
    assert "for" not in drain["ExecGatewayDraining"]
    assert drain["ExecGatewayDrainStuck"]["expr"] == drain["ExecGatewayDraining"]["expr"]
    # Every group the task names is watched.
    for needed in ["ExecGatewayDown", "ExecGatewayAbsent", "ExecGatewayHighErrorRatio",
                   "ExecGatewaySlowSpawns", "ExecGatewaySlowCalls", "ExecGatewayTenantShedding",
                   "ExecGatewayTenantAtQuota", "ExecGatewayAuditEventsDropped",
                   "ExecGatewayExecutorsLost", "ExecGatewayWorkerDeaths",
                   "ExecGatewayIsolationLayerInactive", "ExecGatewayWebhookGivenUp",
                   "ExecGatewayWebhookEventsDropped", "ExecGatewayWebhookSpoolErrors",
                   "ExecGatewayWebhookQueueGrowing"]:
        assert needed in drain, needed


def test_the_dashboard_is_grafana_json_over_one_datasource_variable():
    d = _dashboard()
    assert d["uid"] == "exec-gateway" and d["title"]
    assert isinstance(d["schemaVersion"], int) and d["schemaVersion"] >= 36
    variables = {v["name"]: v for v in d["templating"]["list"]}
    ds = variables["datasource"]
    assert (ds["type"], ds["query"]) == ("datasource", "prometheus")
    for name in ["job", "instance", "tenant", "pool"]:
        v = variables[name]
        assert v["type"] == "query" and v["query"].startswith("label_values("), name
        assert v["datasource"]["uid"] == "${datasource}", name
    ids = [p["id"] for p in _panels(d)]
    assert len(ids) == len(set(ids)), "panel ids repeat"
    occupied = set()
    for p in _panels(d):
        g = p["gridPos"]
        assert g["x"] >= 0 and g["w"] > 0 and g["x"] + g["w"] <= 24, p["title"]
        cells = {(x, y) for x in range(g["x"], g["x"] + g["w"])
                 for y in range(g["y"], g["y"] + g["h"])}
        assert not cells & occupied, f"{p['title']} overlaps another panel"
        occupied |= cells
        if p["type"] == "row":
            continue
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, p["title"]
        refs = [t["refId"] for t in p["targets"]]
        assert p["targets"] and len(refs) == len(set(refs)), p["title"]
        for t in p["targets"]:
            assert t["datasource"] == p["datasource"] and t["expr"].strip(), p["title"]
    titles = {p["title"] for p in d["panels"] if p["type"] == "row"}
    for row in ["Traffic", "Errors", "Latency", "Saturation per tenant", "Isolation",
                "Drains and fleet", "Executors", "Audit and control plane", "Webhooks"]:
        assert row in titles, row


# --- the live test ----------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url, timeout=10):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.status, r.read()


class Prometheus:
    def __init__(self, tmp: pathlib.Path, admin: str):
        port = _free_port()
        self.url = f"http://127.0.0.1:{port}"
        rules = tmp / "alerts.yml"
        shutil.copy(ALERTS, rules)
        config = tmp / "prometheus.yml"
        # Every second: the alerts' 5m windows then hold enough samples
        # within seconds of the load.
        config.write_text(json.dumps({
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(rules)],
            "scrape_configs": [{"job_name": JOB,
                                "static_configs": [{"targets": [admin]}]}],
        }))
        self.log = open(tmp / "prometheus.log", "w")
        self.proc = subprocess.Popen(
            [PROMETHEUS, f"--config.file={config}", f"--storage.tsdb.path={tmp / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
            stdout=self.log, stderr=subprocess.STDOUT)
        eventually(self._ready, "Prometheus ready")

    def _ready(self):
        assert self.proc.poll() is None, "prometheus exited"
        try:
            return _get(f"{self.url}/-/ready")[0] == 200
        except (urllib.error.URLError, ConnectionError):
            return False

    def api(self, path, **params):
        q = urllib.parse.urlencode(params, doseq=True)
        status, body = _get(f"{self.url}/api/v1/{path}?{q}")
        answer = json.loads(body)
        assert answer["status"] == "success", answer
        return answer["data"]

    def query(self, expr):
        data = self.api("query", query=expr)
        if data["resultType"] == "vector":
            return [float(s["value"][1]) for s in data["result"]]
        if data["resultType"] == "scalar":
            return [float(data["result"][1])]
        raise AssertionError(f"{expr}: a {data['resultType']} result")

    def alert_states(self):
        return {(a["labels"]["alertname"], a["state"])
                for a in self.api("alerts")["alerts"]}

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


def eventually(cond, what, timeout=WAIT):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.2)
    raise AssertionError(f"{what}: not within {timeout} s")


class Jwks:
    """An issuer's JWKS on loopback (/jwks.json) beside one that fails
    (/broken.json: 500), so fetches of both outcomes are counted."""

    def __init__(self):
        from cryptography.hazmat.primitives.asymmetric import rsa

        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        jwk = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(key.public_key()))
        body = json.dumps({"keys": [dict(jwk, kid="monitoring", alg="RS256", use="sig")]})

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                ok = self.path == "/jwks.json"
                self.send_response(200 if ok else 500)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(body.encode() if ok else b"{}")

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self):
        self.server.shutdown()
        self.server.server_close()


class WebhookReceiver:
    """Webhook endpoints on loopback: /accepts answers 500 to the first
    delivery (a failed attempt, retried) and 200 to every later one;
    /refuses answers 400 (the message is given up as `rejected`). The
    signatures are test_webhooks.py's business: here only the counters."""

    def __init__(self):
        self.lock = threading.Lock()
        self.statuses = []  # (path, status) of every POST, in order
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                self.rfile.read(int(self.headers.get("content-length", "0")))
                with receiver.lock:
                    first = not any(p == "/accepts" for p, _ in receiver.statuses)
                    status = 400 if self.path == "/refuses" else 500 if first else 200
                    receiver.statuses.append((self.path, status))
                self.send_response(status)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self):
        self.server.shutdown()
        self.server.server_close()


class Fleet:
    """The gateway under test: tenants alpha (local, with small limits),
    lonely (a pool without executors) and remote (a pool our executor
    joins), in a fleet of one so the peer listener exists; its lifecycle
    webhooks go to `hooks`."""

    def __init__(self, tmp: pathlib.Path, scratch: pathlib.Path, jwks: Jwks,
                 hooks: WebhookReceiver):
        self.tmp = tmp
        self.secret = secrets.token_hex(32).encode()
        (tmp / "hs256.key").write_bytes(self.secret)
        (tmp / "fleet.key").write_bytes(secrets.token_hex(32).encode())
        (tmp / "webhook.secret").write_text(
            "whsec_" + base64.b64encode(secrets.token_bytes(32)).decode() + "\n")
        self.roots = {}
        for tenant in ["alpha", "lonely", "remote"]:
            self.roots[tenant] = scratch / tenant
            self.roots[tenant].mkdir(mode=0o777)
            self.roots[tenant].chmod(0o1777)
        peer = _free_port()
        self.config = tmp / "gateway.toml"
        self.good_config = (
            "[server]\n"
            "handshake_timeout = \"2s\"\n"
            # Long enough for the drain to be scraped and alerted on.
            "shutdown_grace = \"60s\"\n"
            "[auth]\njwks_refresh_interval = \"2s\"\n"
            f"[[auth.keys]]\nalgorithm = \"HS256\"\nsecret_file = \"{tmp}/hs256.key\"\n"
            f"[[auth.keys]]\nalgorithm = \"RS256\"\njwks_url = \"{jwks.base}/jwks.json\"\n"
            f"[[auth.keys]]\nalgorithm = \"RS256\"\njwks_url = \"{jwks.base}/broken.json\"\n"
            f"[audit]\nfile = \"{tmp}/audit.jsonl\"\n"
            f"[fleet]\nreplica = \"r1\"\nlisten = \"127.0.0.1:{peer}\"\n"
            f"key_file = \"{tmp}/fleet.key\"\n"
            f"[fleet.peers]\nr1 = \"127.0.0.1:{peer}\"\n"
            f"[tenants.alpha]\nroot = \"{self.roots['alpha']}\"\n"
            "max_processes = 3\nrequests_per_second = 50\nburst = 50\nmax_connections = 4\n"
            f"[tenants.lonely]\nroot = \"{self.roots['lonely']}\"\npool = \"empty\"\n"
            f"[tenants.remote]\nroot = \"{self.roots['remote']}\"\npool = \"p\"\n"
            "[executors]\nopen_timeout = \"1s\"\n"
            "[executors.pools.p]\n[executors.pools.empty]\n"
            # The smallest max_event_bytes: a session of a subject over 1 KiB
            # is dropped as too_large (load). Fast retries: the first
            # delivery's 500 is followed within a second by a 200.
            f"[webhooks]\nspool_dir = \"{tmp}/webhooks\"\nmax_event_bytes = 1024\n"
            f"[[webhooks.endpoints]]\nname = \"accepts\"\nurl = \"{hooks.base}/accepts\"\n"
            f"secret_files = [\"{tmp}/webhook.secret\"]\n"
            "retry_initial = \"100ms\"\nretry_max = \"1s\"\n"
            f"[[webhooks.endpoints]]\nname = \"refuses\"\nurl = \"{hooks.base}/refuses\"\n"
            f"secret_files = [\"{tmp}/webhook.secret\"]\nevents = [\"session.*\"]\n")
        self.config.write_text(self.good_config)
        self.stderr = open(tmp / "gateway.log", "w")
        self.proc = subprocess.Popen(
            [gateway_binary(), "serve", "--listen", "ws://127.0.0.1:0",
             "--grpc-listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0",
             "--config", str(self.config)],
            stdout=subprocess.PIPE, stderr=self.stderr, text=True,
            env={**os.environ, "XDG_STATE_HOME": str(tmp / "state")})
        lines = [self.proc.stdout.readline().strip() for _ in range(4)]
        assert lines[0].startswith("ws://127.0.0.1:"), lines
        assert lines[1].startswith("grpc://127.0.0.1:"), lines
        assert lines[2] == f"fleet http://127.0.0.1:{peer}", lines
        assert lines[3].startswith("admin http://127.0.0.1:"), lines
        self.gw = Gateway(lines[0], self.secret)
        self.ws_addr = lines[0].removeprefix("ws://")
        self.grpc_target = lines[1].removeprefix("grpc://")
        self.peer = f"127.0.0.1:{peer}"
        self.admin = lines[3].removeprefix("admin http://")

    def metrics(self) -> str:
        return _get(f"http://{self.admin}/metrics")[1].decode()

    def stop(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.stderr.close()


class Executor:
    """Our own `exec-gateway executor`, joining pool p with two links."""

    def __init__(self, tmp: pathlib.Path, fleet: Fleet):
        d = tmp / "executor"
        d.mkdir()
        self.root = d / "root"
        self.root.mkdir()
        (d / "k").write_bytes(secrets.token_hex(32).encode())
        (d / "executor.toml").write_text(
            f"[[auth.keys]]\nalgorithm = \"HS256\"\nsecret_file = \"{d}/k\"\n"
            f"[tenants.here]\nroot = \"{self.root}\"\n")
        credential = jwt.encode({"sub": "ci", "pool": "p", "scope": "executor",
                                 "exp": int(time.time()) + 3600},
                                fleet.secret, algorithm="HS256")
        self.log = open(d / "executor.log", "w")
        self.proc = subprocess.Popen(
            [gateway_binary(), "executor", "--config", str(d / "executor.toml"),
             "--remote", f"http://{fleet.ws_addr}/", "--executor-id", "ex-1", "--slots", "2"],
            stdout=subprocess.DEVNULL, stderr=self.log,
            env={**os.environ, "CODEX_EXEC_SERVER_REMOTE_BEARER_TOKEN": credential,
                 "XDG_STATE_HOME": str(d / "state")})

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


# The load, in steps that each leave series behind.


async def connect(fleet, tenant, scope="exec fs:read fs:write"):
    ws = await websockets.connect(
        fleet.gw.url, additional_headers={
            "Authorization": f"Bearer {fleet.gw.token(tenant=tenant, scope=scope)}"})
    return ws, Client(ws)


async def initialize(c):
    r = await c.call("initialize", {"clientName": "monitoring"})
    if "result" in r:
        await c.ws.send(json.dumps({"method": "initialized"}))
    return r


async def run_to_close(c, pid, argv, cwd):
    r = await c.call("process/start", {"processId": pid, "argv": argv, "cwd": cwd,
                                       "env": {"PATH": "/usr/bin:/bin"}, "tty": False})
    assert r.get("result") == {"processId": pid}, r
    await c.wait_for(lambda m: m.get("method") == "process/closed"
                     and m["params"]["processId"] == pid)


async def polite(c, method, params):
    """A call retried as a client of a rate-limited tenant retries it:
    after the retryAfterMs of its -32001."""
    while True:
        r = await c.call(method, params)
        retry = r.get("error", {}).get("data", {}).get("retryAfterMs")
        if retry is None:
            return r
        await asyncio.sleep(retry / 1000)


async def burst(c, method, params, n):
    """`n` calls sent back to back, then their answers."""
    ids = list(range(c.next_id, c.next_id + n))
    c.next_id += n
    for i in ids:
        await c.ws.send(json.dumps({"id": i, "method": method, "params": params}))
    return [await c.wait_for(lambda m, i=i: m.get("id") == i) for i in ids]


def grpc_traffic(fleet, stubs):
    """A gRPC session of alpha's running one process: the grpc door's
    connections and calls."""
    s, p = stubs["session"], stubs["process"]
    md = [("authorization", f"Bearer {fleet.gw.token(tenant='alpha')}")]
    with grpc.insecure_channel(fleet.grpc_target) as ch:
        sid = stubs["session_grpc"].SessionServiceStub(ch).CreateSession(
            s.CreateSessionRequest(client_name="monitoring"), metadata=md, timeout=30).session_id
        procs = stubs["process_grpc"].ProcessServiceStub(ch)
        spec = p.ProcessSpec(process_id="g1", argv=["echo", "grpc"],
                             cwd=str(fleet.roots["alpha"]), env={"PATH": "/usr/bin:/bin"})
        procs.Start(p.StartRequest(session_id=sid, spec=spec), metadata=md, timeout=30)
        for msg in procs.Attach(p.AttachRequest(session_id=sid, process_id="g1", after_seq=0),
                                metadata=md, timeout=30):
            if msg.event.WhichOneof("event") == "closed":
                break
        stubs["session_grpc"].SessionServiceStub(ch).CloseSession(
            s.CloseSessionRequest(session_id=sid), metadata=md, timeout=30)


def refused_peer_request(fleet):
    """A request on the peer listener without the fleet credential."""
    with grpc.insecure_channel(fleet.peer) as ch:
        call = ch.unary_unary("/exec_gateway.fleet.v1.RelayService/Open")
        with pytest.raises(grpc.RpcError) as e:
            call(b"", timeout=30)
        assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED, e.value


def refused_registration(fleet):
    """A tenant's token is no executor credential: 403, counted."""
    req = urllib.request.Request(
        f"http://{fleet.ws_addr}/cloud/executor/intruder/register", data=b"{}",
        method="POST", headers={"Authorization": f"Bearer {fleet.gw.token(tenant='alpha')}",
                                "Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=30)
    assert e.value.code == 403


def handshake_timeout(fleet):
    """A socket that never speaks is closed at handshake_timeout."""
    host, port = fleet.ws_addr.split(":")
    with socket.create_connection((host, int(port)), timeout=WAIT) as s:
        assert s.recv(1) == b""


def reloads(fleet):
    """One reload refused (an unknown key), one accepted."""
    before = fleet.metrics()
    fleet.config.write_text(fleet.good_config + "[server.nonsense]\n")
    fleet.proc.send_signal(signal.SIGHUP)
    eventually(lambda: 'exec_gateway_config_reloads_total{outcome="refused"}' in fleet.metrics(),
               "a refused reload counted")
    fleet.config.write_text(fleet.good_config)
    fleet.proc.send_signal(signal.SIGHUP)
    eventually(lambda: 'exec_gateway_config_reloads_total{outcome="ok"}' in fleet.metrics(),
               "an accepted reload counted")
    assert before != fleet.metrics()


def mcp_session(fleet):
    """An MCP session on the client listener's /mcp (docs/mcp.md), left
    open (it lives until [mcp] idle_timeout, 10 min): the
    exec_gateway_mcp_sessions gauge is 1 while it is scraped."""
    body = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
            "params": {"protocolVersion": "2025-11-25", "capabilities": {},
                       "clientInfo": {"name": "monitoring", "version": "1"}}}
    req = urllib.request.Request(
        f"http://{fleet.ws_addr}/mcp", data=json.dumps(body).encode(), method="POST",
        headers={"Authorization": f"Bearer {fleet.gw.token(tenant='alpha')}",
                 "Content-Type": "application/json",
                 "Accept": "application/json, text/event-stream"})
    with urllib.request.urlopen(req, timeout=30) as r:
        assert r.status == 200 and r.headers["Mcp-Session-Id"], dict(r.headers)
        answer = r.read().decode()
    assert '"protocolVersion":"2025-11-25"' in answer, answer


async def load(fleet, prom, executor_root, stubs):
    """Every kind of traffic the dashboard and the alerts look at. Returns
    the connections that stay open (alpha's, with three processes running,
    and remote's session on the executor)."""
    alpha_root = str(fleet.roots["alpha"])
    ws, alpha = await connect(fleet, "alpha")
    r = await initialize(alpha)
    assert "result" in r, r
    # A session on the executor: its sessions gauge lives while it is open.
    remote_ws, remote = await connect(fleet, "remote")
    r = await initialize(remote)
    assert "result" in r, r
    await run_to_close(remote, "r1", ["echo", "remote"], str(executor_root))
    # No executor in pool `empty`: executor_unavailable after open_timeout,
    # once more after Prometheus has seen the first (a rate needs an
    # increase it saw).
    lonely_ws, lonely = await connect(fleet, "lonely")
    for _ in range(2):
        r = await initialize(lonely)
        assert r.get("error", {}).get("data", {}).get("reason") == "executorUnavailable", r
        await asyncio.to_thread(eventually, lambda: prom.query(
            'exec_gateway_requests_total{tenant="lonely", outcome="executor_unavailable"}'),
            "lonely's failed initialize scraped")
    await lonely_ws.close()

    # Spawns after Prometheus has seen the tenant's histogram at zero, so
    # the rates over them are real numbers.
    await asyncio.to_thread(eventually, lambda: prom.query(
        'exec_gateway_spawn_seconds_count{tenant="alpha"}'), "alpha's spawn histogram scraped")
    for i in range(8):
        await run_to_close(alpha, f"e{i}", ["sh", "-c", f"echo out-{i}; echo err-{i} >&2"],
                           alpha_root)
    await asyncio.to_thread(grpc_traffic, fleet, stubs)

    # Client errors of several kinds, and calls beyond the token's scope.
    r = await alpha.call("fs/readFile", {"path": "/etc/passwd"})
    assert r["error"]["code"] == -32004, r
    r = await alpha.call("fs/readFile", {"path": f"{alpha_root}/missing"})
    assert "error" in r, r
    ro_ws, ro = await connect(fleet, "alpha", scope="fs:read")
    await initialize(ro)
    r = await ro.call("process/start", {"processId": "x", "argv": ["true"], "cwd": alpha_root,
                                        "env": {}, "tty": False})
    assert r["error"]["code"] == -32003, r

    # The rate limit (50/s, burst 50) sheds part of a burst of 150.
    answers = await burst(alpha, "process/list", {}, 150)
    shed = [a for a in answers if a.get("error", {}).get("code") == -32001]
    assert shed, "no call of the burst was shed"

    # Three processes run on (max_processes = 3): a fourth is refused by
    # the quota, and they keep the drain going later.
    async def started(pid):
        return await polite(alpha, "process/start", {
            "processId": pid, "argv": ["sleep", "600"], "cwd": alpha_root,
            "env": {"PATH": "/usr/bin:/bin"}, "tty": False})

    for i in range(3):
        r = await started(f"long{i}")
        assert r.get("result") == {"processId": f"long{i}"}, r
    r = await started("one-too-many")
    assert r["error"]["code"] == -32006 and r["error"]["data"]["quota"] == "processes", r

    # A forged token is refused at the handshake.
    with pytest.raises(websockets.InvalidStatus) as e:
        await websockets.connect(fleet.gw.url, additional_headers={
            "Authorization": f"Bearer {jwt.encode({'tenant': 'alpha'}, 'x' * 32)}"})
    assert e.value.response.status_code == 401
    # alpha may hold 4 connections: it holds 2 (ro, ws), 2 more fit, the next is refused.
    extra = [await connect(fleet, "alpha") for _ in range(2)]
    with pytest.raises(websockets.InvalidStatus):
        await connect(fleet, "alpha")
    for w, _ in extra:
        await w.close()
    await ro_ws.close()

    # A session of a subject over 1 KiB: its session.created webhook event
    # passes max_event_bytes (1024) and is dropped as too_large, one copy
    # per endpoint that wants it.
    big_ws = await websockets.connect(fleet.gw.url, additional_headers={
        "Authorization": f"Bearer {fleet.gw.token(tenant='alpha', sub='s' * 1100)}"})
    r = await initialize(Client(big_ws))
    assert "result" in r, r
    await big_ws.close()
    await asyncio.to_thread(mcp_session, fleet)

    await asyncio.to_thread(handshake_timeout, fleet)
    await asyncio.to_thread(refused_registration, fleet)
    await asyncio.to_thread(refused_peer_request, fleet)
    await asyncio.to_thread(reloads, fleet)
    return (ws, alpha), (remote_ws, remote)


# Substituting the dashboard's template variables: what Grafana sends with
# these selected (a multi-value selection becomes a regex alternation).
def substitute(expr, values):
    out = expr
    for name, value in values.items():
        out = out.replace(f"${{{name}}}", value).replace(f"${name}", value)
    assert "$" not in out, f"unsubstituted variable in {out}"
    return out


def underlying(expr):
    """What an alert's expression is made of, for alerts that return data
    only while they fire: the expression with its comparisons to numbers
    taken out (`x > 0.05` becomes `x`), the left side of an `unless` (the
    part that must exist for the alert to fire at all) and the argument of
    `absent(...)`. That these return data shows the metrics the alert needs
    exist, with the labels its `by` and `on` clauses name."""
    e = " ".join(expr.split())
    m = re.fullmatch(r"absent\((.*)\)", e)
    if m:
        return m.group(1)
    e = re.split(r"\bunless\b", e)[0]
    number = r"-?\d+(\.\d+)?(e-?\d+)?(?=\s|\)|$)"
    return re.sub(r"\s*(==|!=|>=|<=|>|<)\s*(bool\s+)?" + number, "", e).strip()


def test_underlying_strips_comparisons_only():
    assert underlying('sum by (a) (rate(x{o!="ok"}[5m])) > 0.05') == \
        'sum by (a) (rate(x{o!="ok"}[5m]))'
    assert underlying('a > 0 unless on (j) b > 0') == "a"
    assert underlying('absent(up{job=~"e.*"})') == 'up{job=~"e.*"}'
    assert underlying("x - y > 0 and on (t) z > 0.1") == "x - y and on (t) z"
    assert underlying('exec_gateway_draining{job=~"g.*"} == 1') == \
        'exec_gateway_draining{job=~"g.*"}'


def missing_data(prom, exprs):
    """The (what, expr) pairs whose query returns no sample, or only NaN."""
    missing = []
    for what, expr in exprs:
        values = prom.query(expr)
        if not values or all(v != v for v in values):
            missing.append((what, expr, values))
    return missing


def test_prometheus_evaluates_every_dashboard_query_and_alert_and_the_drain_alert_fires(
        tmp_path, scratch, stubs):
    _need(PROMETHEUS, "Debian's prometheus package; scripts/setup installs it")
    if not os.path.isfile(gateway_binary()):
        pytest.skip(f"no gateway binary at {gateway_binary()} (cargo build)")
    jwks = Jwks()
    hooks = WebhookReceiver()
    fleet = Fleet(tmp_path, scratch, jwks, hooks)
    executor = prom = None
    try:
        executor = Executor(tmp_path, fleet)
        prom = Prometheus(tmp_path, fleet.admin)
        eventually(lambda: prom.query(f'up{{job="{JOB}"}} == 1'), "the gateway scraped")
        eventually(lambda: 'exec_gateway_executors{pool="p"} 1' in fleet.metrics(),
                   "the executor joined pool p")

        async def drive():
            alpha, remote = await load(fleet, prom, executor.root, stubs)
            tenants = "(alpha|lonely|remote)"
            values = {"datasource": "unused", "job": JOB, "instance": fleet.admin,
                      "tenant": tenants, "pool": "p",
                      # Longer than the test: no rate's window slides past the load.
                      "__rate_interval": "5m"}
            d = _dashboard()
            panels = [(title, substitute(e, values)) for title, e in _dashboard_exprs(d)]
            records = [(r["record"], r["record"]) for r in _records()]
            # Alerts on rare events are asked without their comparison
            # (`underlying`): the series must exist. The load makes them
            # exist for real where it can (a webhook given up by a 400, an
            # event dropped as too large); exec_gateway_webhook_spool_errors_total
            # and the queue gauges exist from the start (at 0), so
            # ExecGatewayWebhookSpoolErrors and ...QueueGrowing are evaluated
            # on their zeros: a full spool disk or a down endpoint for 30
            # minutes is not made here.
            alerts = [(a["alert"], underlying(a["expr"])) for a in _alerts()]
            for name, stripped in alerts:
                assert re.search(r"(==|!=|>=|<=|>|<)\s*-?\d", stripped) is None, (name, stripped)
            everything = panels + records + alerts
            # Series born during the load need a second scrape for a rate;
            # the recording rules an evaluation: wait until all are there.
            deadline = time.monotonic() + WAIT
            while (missing := missing_data(prom, everything)) and time.monotonic() < deadline:
                await asyncio.sleep(0.5)
            assert not missing, "no data:\n" + "\n".join(f"{w}: {e} -> {v}" for w, e, v in missing)

            # The variables' label queries list what the load made.
            expected = {"job": {JOB}, "instance": {fleet.admin},
                        "tenant": {"alpha", "lonely", "remote"}, "pool": {"p", "empty"}}
            for v in d["templating"]["list"]:
                if v["type"] != "query":
                    continue
                m = re.fullmatch(r"label_values\((.*),\s*(\w+)\)", v["query"])
                assert m, v["query"]
                selector = substitute(m.group(1), values)
                got = set(prom.api(f"label/{m.group(2)}/values", **{"match[]": selector}))
                assert expected[v["name"]] <= got, (v["name"], got)

            # The per-tenant view is per tenant: alpha's calls and spawns.
            assert max(prom.query(
                f'sum(rate(exec_gateway_requests_total{{tenant="alpha", outcome="ok"}}[5m]))')) > 0
            assert prom.query(f'exec_gateway_executor_sessions{{pool="p", executor="ex-1"}}') == [1]
            # The MCP session is open; webhook messages were delivered after
            # a failed attempt (the receiver's first 500), given up (its 400)
            # and dropped (too large).
            assert prom.query(f'exec_gateway_mcp_sessions{{job="{JOB}"}}') == [1]
            for expr in ['exec_gateway_webhook_delivered_total{endpoint="accepts"} > 0',
                         'exec_gateway_webhook_failed_attempts_total{endpoint="accepts"} > 0',
                         'exec_gateway_webhook_given_up_total{endpoint="refuses", '
                         'reason="rejected"} > 0',
                         'exec_gateway_webhook_dropped_total{reason="too_large"} > 0']:
                await asyncio.to_thread(eventually, lambda e=expr: prom.query(e), expr)
            with hooks.lock:
                assert ("/accepts", 500) in hooks.statuses and ("/accepts", 200) in hooks.statuses
                assert ("/refuses", 400) in hooks.statuses, hooks.statuses

            # The drain: SIGTERM with alpha's three processes running.
            assert prom.query(f'exec_gateway_draining{{job="{JOB}"}}') == [0]
            fleet.proc.send_signal(signal.SIGTERM)
            states = set()

            def drain_alerted():
                nonlocal states
                states = prom.alert_states()
                return ("ExecGatewayDraining", "firing") in states

            await asyncio.to_thread(eventually, drain_alerted, "ExecGatewayDraining firing")
            assert ("ExecGatewayDrainStuck", "pending") in states, states
            assert fleet.proc.poll() is None, "the drain ended before it was seen"
            # The drain ends once the processes do (not at the grace).
            _, c = alpha
            for i in range(3):
                r = await polite(c, "process/terminate", {"processId": f"long{i}"})
                assert "result" in r, r
            for ws, _ in (alpha, remote):
                await ws.close()

        asyncio.run(asyncio.wait_for(drive(), 4 * WAIT))
        assert fleet.proc.wait(timeout=WAIT) == 0
    finally:
        for part in (prom, executor, fleet, jwks, hooks):
            if part is not None:
                part.stop()
