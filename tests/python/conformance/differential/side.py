"""One server's side of a sequence (Side): its directories (DIR, OUT, ROOT,
BASE), connections, sessions and what it has seen of each process; running
each step against that server; and normalising its answers (paths and URIs,
sessionIds, websocket addresses, file times, racy seqs, base64) so that the
two sides' answers can be compared.
"""

import asyncio
import base64
import json
import os
import pathlib
import re
import stat
import urllib.parse

from ..harness import ServerClosed, connect
from .steps import (STEP_TIMEOUT, EXIT_TIMEOUT, NOTIFY_TIMEOUT, UNKNOWN_SID, PROBE_PID, NO_ID, P,
                    resolve, dumps, Disk, Connect, Session, Request, Frame, Close, WaitExit,
                    Resume, AwaitNotification, Snapshot)


# -- one server's side of a sequence -----------------------------------------------

ADDR = re.compile(r"websocket 127\.0\.0\.1:\d+")
UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
PROCESS_NOTIFICATIONS = ("process/output", "process/exited", "process/closed")
QUIET_NOTIFICATIONS = PROCESS_NOTIFICATIONS + ("fs/missingChanged",)
TIME_KEYS = ("createdAtMs", "modifiedAtMs")
BASE64_KEYS = ("chunk", "dataBase64", "deltaBase64")


def same_id(a, b):
    return type(a) is type(b) and a == b


class Side:
    """One server's run of one sequence: its directories, connections,
    sessions and what it has seen of each process."""

    def __init__(self, server, name):
        self.server = server
        self.kind = server.kind
        self.revision = server.revision
        self.root = pathlib.Path(server.root)
        self.base = self.root.parent
        self.name = name
        self.dir = self.root / name
        self.out = self.base / "outside" / name
        self.conns = {}
        self.gone = set()          # connections closed (by us or the server) or stuck
        self.sids = {}             # conn -> sessionId it initialized (or resumed)
        self.sid_names = {}        # sessionId -> the first conn that had it
        self.procs = {}            # pid -> {"chunks": set of seqs, "closed": seq}
        self.probes = 0
        self.raw = []              # what this step sent and received, verbatim
        subs = [(self.dir, "{DIR}"), (self.out, "{OUT}"), (self.root, "{ROOT}"),
                (self.base, "{BASE}")]
        if getattr(server, "codex_home", None):
            subs.append((pathlib.Path(server.codex_home), "{CODEX_HOME}"))
        pairs = []
        for path, mark in subs:
            text = str(path)
            pairs.append((text, mark))
            quoted = urllib.parse.quote(text)
            if quoted != text:
                pairs.append((quoted, mark))
        self.subs = sorted(pairs, key=lambda p: -len(p[0]))

    def denorm(self, text):
        """Undoes the path marks of `norm_text` (plain forms)."""
        for mark, path in (("{DIR}", self.dir), ("{OUT}", self.out), ("{ROOT}", self.root),
                           ("{BASE}", self.base)):
            text = text.replace(mark, str(path))
        return text

    def prepare(self):
        self.dir.mkdir(parents=True)
        self.out.mkdir(parents=True)

    async def aclose(self, pids=()):
        """Ends what the sequence left: its processes are terminated and, on
        the gateway, its attached sessions closed (`session/close`, a gateway
        extension) so that they do not count against the tenant's session
        quota for a detach TTL. Not compared."""
        for name, conn in self.conns.items():
            if name not in self.gone and name in self.sids:
                try:
                    for pid in pids:
                        await self.cleanup_call(conn, "process/terminate", {"processId": pid})
                    if self.kind == "gateway":
                        await self.cleanup_call(conn, "session/close", {})
                except (ServerClosed, asyncio.TimeoutError, OSError):
                    pass
            await conn.close()

    async def cleanup_call(self, conn, method, params):
        rid = f"cleanup-{conn.next_id}"
        conn.next_id += 1
        await conn.send_raw(dumps({"id": rid, "method": method, "params": params}))
        await conn.wait_for(lambda m: isinstance(m, dict) and m.get("id") == rid
                            and "method" not in m, 5)

    # -- normalisation
    def norm_text(self, text):
        for old, new in self.subs:
            text = text.replace(old, new)
        text = ADDR.sub("websocket {ADDR}", text)

        def sid(m):
            name = self.sid_names.get(m.group(0))
            return "{SID:" + name + "}" if name else m.group(0)
        return UUID.sub(sid, text)

    def norm_b64(self, value):
        try:
            data = base64.b64decode(value, validate=True)
        except Exception:
            return value
        if base64.b64encode(data).decode() != value:
            return value
        return "b64:" + self.norm_text(data.decode("utf-8", "backslashreplace"))

    def norm(self, value, key=None):
        if isinstance(value, str):
            if key in BASE64_KEYS:
                return self.norm_b64(value)
            return self.norm_text(value)
        if isinstance(value, dict):
            out = {}
            for k, v in value.items():
                if k in TIME_KEYS and isinstance(v, int) and not isinstance(v, bool):
                    # File times depend on when each side made the file; a
                    # birth time is 0 where unavailable (both accepted by the
                    # conformance suite, test_metadata).
                    out[k] = "<ms>"
                else:
                    out[k] = self.norm(v, k)
            if "entries" in out and isinstance(out["entries"], list) and all(
                    isinstance(e, dict) and "fileName" in e for e in out["entries"]):
                # fs/readDirectory: readdir order, unspecified.
                out["entries"] = sorted(out["entries"], key=lambda e: json.dumps(e, sort_keys=True))
            return out
        if isinstance(value, list):
            return [self.norm(v, key) for v in value]
        return value

    def norm_read(self, pid, result):
        """A process/read result: seqs are racy (stdout, stderr and the exit
        are numbered in arrival order), so chunk seqs become <seq> and
        nextSeq becomes `last+1` when it follows the last chunk."""
        if not isinstance(result, dict) or not isinstance(result.get("chunks"), list):
            return self.norm(result)
        chunks = result["chunks"]
        seqs = [ch.get("seq") for ch in chunks if isinstance(ch, dict)]
        proc = self.procs.setdefault(pid, {"chunks": set()})
        proc["chunks"].update(s for s in seqs if isinstance(s, int))
        if result.get("closed") is True and not chunks and isinstance(result.get("nextSeq"), int):
            proc["closed"] = result["nextSeq"] - 1
        out = self.norm(result)
        items = []
        for ch in out["chunks"]:
            if isinstance(ch, dict) and "seq" in ch:
                ch = dict(ch, seq="<seq>")
            items.append(ch)
        if len({ch.get("stream") for ch in items if isinstance(ch, dict)}) > 1:
            items.sort(key=lambda ch: str(ch.get("stream")) if isinstance(ch, dict) else "")
        out["chunks"] = items
        ints = [s for s in seqs if isinstance(s, int)]
        if ints and result.get("nextSeq") == max(ints) + 1:
            out["nextSeq"] = "last+1"
        return out

    def norm_message(self, m, step=None):
        """A response or an unsolicited message."""
        if not isinstance(m, dict):
            return self.norm(m)
        out = {}
        if "id" in m:
            out["id"] = m["id"]
        if "error" in m:
            out["error"] = self.norm(m["error"])
        if "result" in m:
            if isinstance(step, Request) and step.method == "process/read":
                pid = step.params.get("processId") if isinstance(step.params, dict) else None
                out["result"] = self.norm_read(pid, m["result"])
            else:
                out["result"] = self.norm(m["result"])
        for k in m:
            if k not in ("id", "error", "result"):
                out[k] = self.norm(m[k], k)
        return out

    # -- connections
    async def open(self, name):
        conn = await connect(self.server.url, self.server.headers)
        self.conns[name] = conn
        self.gone.discard(name)
        return conn

    def usable(self, name):
        if name not in self.conns:
            return None, {"noConnection": True}
        if name in self.gone:
            return None, {"connectionGone": True}
        return self.conns[name], None

    def extras(self, conn):
        """Unsolicited non-process messages that have arrived (kept in order)."""
        keep, extra = [], []
        for m in conn.inbox:
            if isinstance(m, dict) and m.get("method") in QUIET_NOTIFICATIONS and "id" not in m:
                if m.get("method") == "fs/missingChanged":
                    keep.append(m)
                continue  # process notifications stay in conn.process_log
            extra.append(m)
        conn.inbox = keep
        if extra:
            self.raw.append({"received": extra})
        return [self.norm_message(m) for m in extra]

    async def send(self, conn, text, binary=False):
        self.raw.append({"sent": text})
        await conn.send_raw(text.encode() if binary else text)

    async def await_id(self, conn, rid, timeout):
        m = await conn.wait_for(lambda m: isinstance(m, dict) and "method" not in m
                                and "id" in m and same_id(m["id"], rid)
                                and ("result" in m or "error" in m), timeout)
        self.raw.append({"received": m})
        return m

    async def call(self, conn, name, method, params, rid=None, extra=None, timeout=STEP_TIMEOUT,
                   step=None):
        """Send a request; its normalised answer (plus any unsolicited messages)."""
        if rid is None:
            rid = conn.next_id
            conn.next_id += 1
        msg = {"id": rid, "method": method}
        if params is not ...:
            msg["params"] = resolve(params, self)
        if extra:
            msg.update(resolve(extra, self))
        try:
            await self.send(conn, dumps(msg))
            m = await self.await_id(conn, rid, timeout)
        except ServerClosed:
            self.gone.add(name)
            return {"closed": True, "before": self.extras(conn)}, None
        except asyncio.TimeoutError:
            self.gone.add(name)
            return {"timeout": True, "before": self.extras(conn)}, None
        answer = self.norm_message(m, step)
        answer.pop("id", None)
        extras = self.extras(conn)
        if extras:
            answer["unsolicited"] = extras
        return answer, m

    # -- steps
    async def run(self, step):
        self.raw = []
        try:
            return await asyncio.wait_for(self._run(step), STEP_TIMEOUT * 4 + EXIT_TIMEOUT)
        except asyncio.TimeoutError:
            return {"stepTimeout": True}

    async def _run(self, step):
        if isinstance(step, Disk):
            return self.disk(step)
        if isinstance(step, Snapshot):
            return self.snapshot()
        if isinstance(step, Connect):
            await self.open(step.conn)
            return None
        if isinstance(step, Session):
            conn = await self.open(step.conn)
            params = step.params if step.params is not None else {"clientName": "differential"}
            answer, m = await self.call(conn, step.conn, "initialize", params)
            self.learn_session(step.conn, m)
            if step.conn not in self.gone:
                await self.send(conn, dumps({"method": "initialized"}))
            return self.norm_again(answer)
        if isinstance(step, Request):
            conn, err = self.usable(step.conn)
            if err:
                return err
            answer, m = await self.call(conn, step.conn, step.method, step.params, step.id,
                                        step.extra, STEP_TIMEOUT + step.wait_ms / 1000, step)
            if step.method == "initialize":
                self.learn_session(step.conn, m)
                answer = self.norm_again(answer)
            return answer
        if isinstance(step, Frame):
            return await self.frame(step)
        if isinstance(step, Close):
            conn, err = self.usable(step.conn)
            if conn:
                await conn.close()
                self.gone.add(step.conn)
            return None
        if isinstance(step, WaitExit):
            return await self.wait_exit(step)
        if isinstance(step, Resume):
            return await self.resume(step)
        if isinstance(step, AwaitNotification):
            conn, err = self.usable(step.conn)
            if err:
                return err
            try:
                m = await conn.wait_for(lambda m: isinstance(m, dict) and m.get("method") == step.method
                                        and "id" not in m, NOTIFY_TIMEOUT)
            except asyncio.TimeoutError:
                return {"notification": None}
            except ServerClosed:
                self.gone.add(step.conn)
                return {"closed": True}
            self.raw.append({"received": m})
            return {"notification": self.norm(m.get("params"))}
        raise TypeError(step)

    def learn_session(self, name, m):
        if isinstance(m, dict) and isinstance(m.get("result"), dict):
            sid = m["result"].get("sessionId")
            if isinstance(sid, str):
                self.sids[name] = sid
                self.sid_names.setdefault(sid, name)

    def norm_again(self, answer):
        """Re-normalise an answer once a new sessionId is known."""
        return json.loads(self.norm_text(json.dumps(answer))) if answer is not None else None

    def disk(self, step):
        top = self.dir if step.base == "dir" else self.out
        path = top / step.rel
        try:
            if step.op == "mkdir":
                path.mkdir(parents=True, exist_ok=True)
            elif step.op == "write":
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(step.arg)
            elif step.op == "fifo":
                os.mkfifo(path)
            elif step.op == "symlink":
                target = (step.arg.host_path(self) if isinstance(step.arg, P)
                          else step.arg.format(name=self.name))
                os.symlink(target, path)
        except OSError as e:
            return {"diskError": self.norm_text(str(e))}
        return None

    def snapshot(self):
        if not os.path.lexists(self.dir):
            return {"tree": None}
        tree = []
        for dirpath, dirnames, filenames in os.walk(self.dir):
            for n in sorted(dirnames + filenames):
                p = os.path.join(dirpath, n)
                rel = os.path.relpath(p, self.dir)
                st = os.lstat(p)
                mode = oct(st.st_mode & 0o7777)
                if stat.S_ISLNK(st.st_mode):
                    tree.append([rel, "link", self.norm_text(os.readlink(p))])
                elif stat.S_ISDIR(st.st_mode):
                    tree.append([rel, "dir", mode])
                elif stat.S_ISREG(st.st_mode):
                    with open(p, "rb") as f:
                        data = f.read(256)
                    tree.append([rel, "file", mode, self.norm_text(data.decode("utf-8", "backslashreplace"))])
                else:
                    tree.append([rel, "special", mode])
        return {"tree": sorted(tree)}

    async def frame(self, step):
        conn, err = self.usable(step.conn)
        if err:
            return err
        frame = step.frame if isinstance(step.frame, str) else dumps(resolve(step.frame, self))
        answer = {}
        try:
            await self.send(conn, frame, step.binary)
            if step.expect is not NO_ID:
                try:
                    m = await conn.wait_for(
                        lambda m: isinstance(m, dict) and "method" not in m and "id" in m
                        and (same_id(m["id"], step.expect) or m["id"] == -1), 1.5)
                    self.raw.append({"received": m})
                    self.learn_session(step.conn, m)
                    answer["answer"] = self.norm_message(m)
                except asyncio.TimeoutError:
                    answer["answer"] = None
            self.probes += 1
            pid = f"probe-{self.probes}"
            await self.send(conn, dumps({"id": pid, "method": "process/terminate",
                                         "params": {"processId": PROBE_PID}}))
            m = await self.await_id(conn, pid, STEP_TIMEOUT)
            others = self.extras(conn)
            if others:
                answer["unsolicited"] = sorted(others, key=lambda x: json.dumps(x, sort_keys=True))
            probe = self.norm_message(m)
            probe.pop("id", None)
            answer["probe"] = probe
        except ServerClosed as e:
            self.gone.add(step.conn)
            answer["unsolicited"] = self.extras(conn)
            answer["closed"] = "no close frame" if e.rcvd is None else f"close {e.rcvd.code}"
        except asyncio.TimeoutError:
            self.gone.add(step.conn)
            answer["timeout"] = True
        return self.norm_again(answer)

    async def wait_exit(self, step):
        conn, err = self.usable(step.conn)
        if err:
            return err
        out, after, last = {}, 0, None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + EXIT_TIMEOUT
        while True:
            if loop.time() > deadline:
                return {"notClosed": True, "output": out}
            rid = conn.next_id
            conn.next_id += 1
            try:
                await self.send(conn, dumps({"id": rid, "method": "process/read", "params": {
                    "processId": step.pid, "afterSeq": after, "waitMs": 3000}}))
                m = await self.await_id(conn, rid, STEP_TIMEOUT + 3)
            except ServerClosed:
                self.gone.add(step.conn)
                return {"closed": True}
            except asyncio.TimeoutError:
                self.gone.add(step.conn)
                return {"timeout": True}
            if "error" in m:
                return {"error": self.norm(m["error"])}
            r = m.get("result")
            if not isinstance(r, dict) or not isinstance(r.get("chunks"), list):
                return {"badResult": self.norm(r)}
            self.norm_read(step.pid, r)
            chunks = r["chunks"]
            for ch in sorted(chunks, key=lambda c: c.get("seq", 0)):
                data = base64.b64decode(ch.get("chunk", ""))
                out[ch.get("stream")] = out.get(ch.get("stream"), b"") + data
            last = r
            if chunks:
                after = max(ch.get("seq", 0) for ch in chunks)
                continue
            if r.get("closed"):
                break
            after = max(after, r.get("nextSeq", 1) - 1)
        answer = {k: self.norm(last.get(k)) for k in
                  ("exited", "exitCode", "closed", "failure", "sandboxDenied") if k in last}
        answer["output"] = {k: self.norm_text(v.decode("utf-8", "backslashreplace"))
                            for k, v in sorted(out.items())}
        if step.events:
            try:
                events = await conn.process_events(step.pid, timeout=5)
            except asyncio.TimeoutError:
                events = None
            except ServerClosed:
                events = None
            if events is None:
                answer["events"] = "incomplete"
            else:
                seqs = sorted(e["params"].get("seq", 0) for e in events)
                answer["eventSeqsContiguous"] = seqs == list(range(1, len(seqs) + 1))
                answer["events"] = sorted(
                    json.dumps({k: v for k, v in self.norm(e["params"]).items() if k != "seq"}
                               | {"method": e["method"]}, sort_keys=True)
                    for e in events)
        return answer

    async def resume(self, step):
        sid = self.sids.get(step.of, UNKNOWN_SID)
        answer = None
        for _ in range(100):
            conn = await self.open(step.conn)
            answer, m = await self.call(conn, step.conn, "initialize",
                                        {"clientName": "differential", "resumeSessionId": sid})
            if "already attached" not in json.dumps(answer):
                break
            await conn.close()
            await asyncio.sleep(0.1)
        self.learn_session(step.conn, m)
        if step.conn not in self.gone and "result" in answer:
            await self.send(conn, dumps({"method": "initialized"}))
        return self.norm_again(answer)
