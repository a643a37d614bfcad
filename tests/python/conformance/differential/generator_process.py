"""The generator's process, envelope and resume sequence kinds:
ProcessSequences, a mixin of generator.Gen (it uses Gen's random helpers,
`add`, `path` and `session`). Process lifecycles (short and long commands,
stdin, malformed starts, unknown and reused ids, reads, writes and signals
after exit), JSON-RPC envelopes (ids of every JSON type, odd methods, params
and members, junk frames) and session resumption.
"""

from .steps import (UNKNOWN_SID, NO_ID, P, Sid, Seq, Raw, b64, expect_of, Disk, Connect,
                    Request, Frame, Close, WaitExit, Resume)

# Short commands: each prints at most once per stream, then exits.
SHORT_COMMANDS = [
    (["echo", "hi"], {}),
    (["true"], {}),
    (["false"], {}),
    (["sh", "-c", "exit 3"], {}),
    (["printf", "abc"], {}),
    (["sh", "-c", "printf err >&2; exit 2"], {}),
    (["sh", "-c", "printf out; printf err >&2"], {"two_streams": True}),
    (["pwd"], {}),
    (["cat", "f.txt"], {}),
    (["sh", "-c", "kill -TERM $$"], {}),
    (["/usr/bin/env"], {"env": {"ONLY": "1"}}),
    (["sh", "-c", "echo $0"], {"arg0": "myname"}),
    (["echo", "tty"], {"tty": True}),
    (["sh", "-c", "exit 5"], {"tty": True}),
]


# Malformed frames of several kinds: truncated, bad tokens, bad escapes and
# lone surrogates (in the envelope and inside params), numbers out of range,
# duplicate keys, several values, envelope members of the wrong type, and
# objects that are no JSON-RPC message at all.
MALFORMED = [
    "{", "}", "[", "[1,2", "{\"id\":1", "{\"id\":1,}", "{\"id\":1 \"method\":\"x\"}", "nul",
    "1.", "\"unterminated", "\"\\u00\"", "{'id':1}", "\u0000", "   ",
    '{"a":"\\x"}', '{"a":"\\ud800"}', '{"id":"\\ud800","method":"x"}',
    '{"id":1,"method":"process/read","params":{"processId":"\\ud800"}}',
    '{"id":1,"method":"process/read","params":{"processId":"x"},"extra":"\\ud800"}',
    '{"id":1,"method":"process/read","params":{"processId":"x"},"jsonrpc":1.}',
    '{"id":01}', '{"id":-}', '{"id":true1}', '{"id":1e999}', '{"id":null}', '{"id":1.5}',
    '{"id":[],"method":"x"}', '{"id":99999999999999999999,"method":"x"}',
    '{"id":1,"method":5}', '{"method":5}', '{"id":1,"method":"x","method":"y"}',
    '{"a":1}', '{"a":1}{"b":2}', '\t{}x', ' {"a":1} ', '{"id":1,"error":5}',
    '{"id":1,"error":{"code":1}}', '{"id":1,"result":5}x', '{"method":"initialized"}x',
    '{"id":1,"method":"process/read","params":{"processId":"x"},}',
]


class ProcessSequences:
    """Gen's process, envelope and resume sequence kinds (a mixin)."""

    def start_params(self, pid, argv, cwd=None, **extra):
        if cwd is None:
            cwd = self.any_form("", relative=False)
        params = {"processId": pid, "argv": argv, "cwd": cwd,
                  "env": {"PATH": "/usr/bin:/bin"}, "tty": False}
        params.update(extra)
        return params

    def process_with_cwd(self, conn, cwd):
        pid = self.new_pid("cwd")
        self.add(Request(conn, "process/start", self.start_params(pid, ["pwd"], cwd=cwd)))
        self.add(WaitExit(conn, pid))

    def gen_process(self):
        # (`cat f.txt` needs it: GNU cat's error text takes several writes,
        # which each server may read as one chunk or several.)
        self.add(Disk("write", "f.txt", b"payload"))
        self.session(tell=self.chance(0.5))
        for _ in range(self.rng.randint(1, 4)):
            self.process_action("c1")

    def process_action(self, conn):
        kind = self.weighted([("short", 30), ("long", 16), ("stdin", 14), ("bad", 14),
                              ("unknown", 8), ("dup", 6), ("positional", 3)])
        getattr(self, "proc_" + kind)(conn)

    def read_params(self, pid, done):
        params = {"processId": pid}
        if self.chance(0.6):
            params["afterSeq"] = (self.pick([0, 0, Seq(pid, "first"), Seq(pid, "last"),
                                             Seq(pid, "closed"), 99, None, -1, "1"])
                                  if done else self.pick([0, None]))
        if self.chance(0.4):
            params["maxBytes"] = self.pick([1, 2, 100, 0, None])
        if self.chance(0.3):
            params["waitMs"] = self.pick([0, 50] if not done else [0, 100, 1000])
        return params

    def proc_short(self, conn):
        argv, opts = self.pick(SHORT_COMMANDS)
        pid = self.new_pid()
        extra = {}
        if "arg0" in opts:
            extra["arg0"] = opts["arg0"]
        if opts.get("tty"):
            extra["tty"] = True
        if self.chance(0.2):
            extra["pipeStdin"] = self.pick([True, False])
        params = self.start_params(pid, argv, **extra)
        if "env" in opts:
            params["env"] = dict(opts["env"])
        if self.nov and self.chance(0.2):
            params.update({"metadata": None, "sandbox": None, "enforceManagedNetwork": False,
                           "managedNetwork": None})
        self.add(Request(conn, "process/start", params))
        self.add(WaitExit(conn, pid, events=self.chance(0.5)))
        self.pids[pid] = "done"
        for _ in range(self.rng.randint(0, 3)):
            self.after_close(conn, pid, two_streams=opts.get("two_streams", False))

    def after_close(self, conn, pid, two_streams=False):
        op = self.weighted([("read", 6), ("write", 2), ("terminate", 2), ("signal", 2 if self.nov else 0),
                            ("restart", 1)])
        if op == "read":
            params = self.read_params(pid, done=True)
            if two_streams:
                params.pop("afterSeq", None)
                params.pop("maxBytes", None)
            self.add(Request(conn, "process/read", params, wait_ms=params.get("waitMs") or 0))
        elif op == "write":
            self.add(Request(conn, "process/write", self.write_params(pid, "x\n")))
        elif op == "terminate":
            self.add(Request(conn, "process/terminate", {"processId": pid}))
        elif op == "signal":
            self.add(Request(conn, "process/signal", {"processId": pid, "signal": "interrupt"}))
        else:
            self.add(Request(conn, "process/start", self.start_params(pid, ["true"])))

    def write_params(self, pid, data, mutate=True):
        params = {"processId": pid, "chunk": b64(data)}
        if self.nov or self.chance(0.3):
            params["writeId"] = self.write_id()
        if mutate:
            x = self.rng.random()
            if x < 0.05:
                params["chunk"] = "!!notb64"
            elif x < 0.08:
                params.pop("writeId", None)
            elif x < 0.10:
                params["writeId"] = ""
            elif x < 0.12:
                del params["chunk"]
        return params

    def proc_long(self, conn):
        pid = self.new_pid()
        self.add(Request(conn, "process/start", self.start_params(pid, ["sleep", "60"])))
        for _ in range(self.rng.randint(0, 2)):
            op = self.pick(["read", "write", "signal_bad"])
            if op == "read":
                params = {"processId": pid}
                if self.chance(0.5):
                    params["waitMs"] = self.pick([0, 50, 150])
                if self.chance(0.3):
                    params["afterSeq"] = 0
                self.add(Request(conn, "process/read", params, wait_ms=params.get("waitMs", 0)))
            elif op == "write":
                self.add(Request(conn, "process/write", self.write_params(pid, "x", mutate=False)))
            elif op == "signal_bad" and self.nov:
                self.add(Request(conn, "process/signal", {"processId": pid}))
        end = self.pick(["terminate", "terminate", "signal"] if self.nov else ["terminate"])
        if end == "terminate":
            self.add(Request(conn, "process/terminate", {"processId": pid}))
        else:
            self.add(Request(conn, "process/signal", {"processId": pid, "signal": "interrupt"}))
        self.add(WaitExit(conn, pid, events=self.chance(0.5)))
        self.pids[pid] = "done"
        for _ in range(self.rng.randint(0, 2)):
            self.after_close(conn, pid)

    def proc_stdin(self, conn):
        pid = self.new_pid()
        if self.chance(0.5):
            self.add(Request(conn, "process/start",
                             self.start_params(pid, ["cat"], pipeStdin=True)))
            for data in self.pick([["abc"], ["abc", "def"]]):
                self.add(Request(conn, "process/write", self.write_params(pid, data, mutate=False)))
                self.add(Request(conn, "process/read", {"processId": pid, "afterSeq": Seq(pid, "last"),
                                                        "waitMs": 5000}, wait_ms=5000))
            if self.chance(0.3):
                # A write that may be malformed; if it is not, its echo is
                # read before the kill (else the kill races cat's echo).
                params = self.write_params(pid, "zz")
                self.add(Request(conn, "process/write", params))
                if params.get("chunk") == b64("zz") and (params.get("writeId") or not self.nov):
                    self.add(Request(conn, "process/read", {"processId": pid, "afterSeq": Seq(pid, "last"),
                                                            "waitMs": 5000}, wait_ms=5000))
            self.add(Request(conn, "process/terminate", {"processId": pid}))
            self.add(WaitExit(conn, pid, events=self.chance(0.5)))
            if self.chance(0.5):
                self.add(Request(conn, "process/write", self.write_params(pid, "late", mutate=False)))
        else:
            self.add(Request(conn, "process/start", self.start_params(
                pid, ["sh", "-c", "read a; echo got:$a"], pipeStdin=True)))
            if self.chance(0.3):
                self.add(Request(conn, "process/write", self.write_params(pid, "", mutate=True)))
            self.add(Request(conn, "process/write", self.write_params(pid, "x\n", mutate=False)))
            self.add(WaitExit(conn, pid, events=self.chance(0.5)))
            if self.chance(0.5):
                self.add(Request(conn, "process/write", self.write_params(pid, "y\n", mutate=False)))
        self.pids[pid] = "done"

    def proc_bad(self, conn):
        pid = self.new_pid("bad")
        params = self.start_params(pid, ["true"])
        m = self.pick(["missing", "type", "argv", "cwd", "cwd", "env", "envPolicy", "program",
                       "extra", "tty-arg0"])
        if m == "missing":
            del params[self.pick(["processId", "argv", "cwd", "env", "tty"])]
        elif m == "type":
            k = self.pick(["processId", "argv", "cwd", "env", "tty", "pipeStdin", "arg0"])
            params[k] = self.pick([5, "text", [], {"a": 1}, None, True])
        elif m == "argv":
            params["argv"] = self.pick([[], [""], [1], "true", ["true", 5]])
        elif m == "cwd":
            params["cwd"] = self.path("read", {"dir", "missing", "file", "outside"})
        elif m == "env":
            params["env"] = self.pick([{}, {"A": 1}, [], {"PATH": 5}, None])
        elif m == "envPolicy":
            params["envPolicy"] = self.pick([
                {"inherit": "none"},
                {"inherit": "none", "ignoreDefaultExcludes": False, "exclude": [], "set": {},
                 "includeOnly": []},
                {"inherit": "bogus", "ignoreDefaultExcludes": False, "exclude": [], "set": {},
                 "includeOnly": []},
                None])
        elif m == "program":
            params["argv"] = self.pick([["/nonexistent/bin"], ["no-such-program-on-path"],
                                        ["/etc/hostname"], ["."]])
            if self.chance(0.3):
                params["env"] = {}
        elif m == "extra":
            params["unknownField"] = {"x": 1}
        else:
            params["tty"] = True
            params["arg0"] = self.pick(["no-such-arg0", None])
        self.add(Request(conn, "process/start", params))
        if self.chance(0.7):
            # Whether a failed start left a process behind (or wait a good one out).
            self.add(WaitExit(conn, pid))

    def proc_unknown(self, conn):
        pid = self.pick(["nope", "", "\u03c0", "x" * 300])
        op = self.pick(["read", "write", "terminate", "signal"] if self.nov
                       else ["read", "write", "terminate"])
        if op == "read":
            self.add(Request(conn, "process/read", self.read_params(pid, done=False)))
        elif op == "write":
            self.add(Request(conn, "process/write", self.write_params(pid, "x")))
        elif op == "terminate":
            self.add(Request(conn, "process/terminate", {"processId": pid}))
        else:
            self.add(Request(conn, "process/signal", {"processId": pid, "signal": "interrupt"}))

    def proc_dup(self, conn):
        pid = self.new_pid()
        self.add(Request(conn, "process/start", self.start_params(pid, ["true"])))
        self.add(WaitExit(conn, pid))
        self.add(Request(conn, "process/start", self.start_params(pid, ["echo", "again"])))
        self.add(WaitExit(conn, pid))

    def proc_positional(self, conn):
        pid = self.new_pid()
        self.add(Request(conn, "process/start",
                         [pid, ["echo", "pos"], P(""), {"PATH": "/usr/bin:/bin"}, False]))
        self.add(WaitExit(conn, pid))
        self.add(Request(conn, "process/terminate", [pid]))

    def gen_envelope(self):
        initialised = self.weighted([("none", 3), ("initialize", 2), ("session", 4)])
        if initialised == "session":
            self.session(tell=self.chance(0.5))
        else:
            self.add(Connect("c1"))
            if initialised == "initialize":
                self.add(Request("c1", "initialize", {"clientName": "differential"}))
        for _ in range(self.rng.randint(2, 6)):
            self.envelope_action("c1")

    def frame_id(self):
        return self.pick([
            1, 7, -5, 0, 9223372036854775807, -9223372036854775808, "abc", "", "\U0001F600",
            Raw("9223372036854775808"), Raw("-9223372036854775809"), Raw("1.5"), Raw("1.0"),
            Raw("1e3"), Raw("-0"), None, True, False, [], [1], {}, {"a": 1}])

    def envelope_action(self, conn):
        kind = self.weighted([("id", 20), ("method", 8), ("params", 12), ("extra", 6),
                              ("notification", 8), ("response", 3), ("junk", 8),
                              ("initialize", 10), ("initialized", 5), ("binary", 2),
                              ("gated", 10), ("unknown", 6)])
        harmless = {"processId": "nope"}
        if kind == "id":
            rid = self.frame_id()
            method = self.pick(["process/terminate", "process/read", "initialize", "foo/bar"])
            params = harmless if method != "initialize" else {"clientName": "x"}
            self.add(Frame(conn, {"id": rid, "method": method, "params": params}, expect=expect_of(rid)))
        elif kind == "method":
            rid = self.pick([11, "m"])
            method = self.pick([5, None, "", "PROCESS/TERMINATE", "process/terminate ",
                                "process", "/", "initialized", "process/output", "fs/watch",
                                "fs/unwatch", "process/resizePty", "http/request/bodyDelta"])
            self.add(Frame(conn, {"id": rid, "method": method, "params": harmless},
                           expect=rid if isinstance(method, str) else NO_ID))
        elif kind == "params":
            method = self.pick(["process/terminate", "process/read", "fs/getMetadata",
                                "process/start", "initialize", "environment/status"
                                if self.nov else "process/write"])
            params = self.pick([..., None, {}, [], ["nope"], "str", 5, True, [5], ["nope", 1, 2],
                                {"processId": 5}, {"path": 5}, {"processId": None}])
            msg = {"id": 21, "method": method}
            if params is not ...:
                msg["params"] = params
            self.add(Frame(conn, msg, expect=21))
        elif kind == "extra":
            extra = self.pick([{"jsonrpc": "2.0"}, {"jsonrpc": "1.0"}, {"jsonrpc": 5},
                               {"trace": {"traceparent": "00-x"}}, {"trace": 5},
                               {"result": {}}, {"error": {"code": 1, "message": "x"}},
                               {"extraField": [1]}])
            msg = {"id": 31, "method": "process/terminate", "params": harmless}
            msg.update(extra)
            self.add(Frame(conn, msg, expect=31))
        elif kind == "notification":
            msg = self.pick([
                {"method": "bogus/notification", "params": {}},
                {"method": "process/terminate", "params": harmless},
                {"method": "initialized", "params": 5},
                {"method": "network/policyDecision"},
                {"method": "exit"}])
            self.add(Frame(conn, msg))
        elif kind == "response":
            self.add(Frame(conn, self.pick([{"id": 5, "result": {}},
                                            {"id": 5, "error": {"code": 1, "message": "x"}},
                                            {"id": -1, "result": None}])))
        elif kind == "junk":
            self.add(Frame(conn, self.pick([
                "{this is not json", "", " ", "null", "1", "\"str\"", "[]",
                '[{"id":1,"method":"process/read","params":{"processId":"x"}}]',
                "{}", '{"id":1}', '{"params":{}}', '{"id":1,"method":"process/terminate",'
                '"params":{"processId":"nope"}} trailing', '{"id":1,"id":2,"method":"process/terminate",'
                '"params":{"processId":"nope"}}', "\ufeff{}"] + MALFORMED)))
        elif kind == "initialize":
            params = self.pick([{"clientName": "x"}, {}, {"clientName": 5}, None,
                                {"clientName": "x", "resumeSessionId": None},
                                {"clientName": "x", "resumeSessionId": ""},
                                {"clientName": "x", "resumeSessionId": "not-a-uuid"},
                                {"clientName": "x", "resumeSessionId": UNKNOWN_SID},
                                {"clientName": "x", "resumeSessionId": 5},
                                {"clientName": "x", "protocolVersion": "2"},
                                ["x"]])
            self.add(Request(conn, "initialize", params))
        elif kind == "initialized":
            self.add(Frame(conn, {"method": "initialized"}))
        elif kind == "binary":
            self.add(Frame(conn, '{"id":"bin","method":"process/terminate","params":{"processId":"nope"}}',
                           binary=True, expect="bin"))
        elif kind == "gated":
            method, params = self.pick([
                ("process/read", harmless), ("process/start", self.start_params("g", ["true"])),
                ("fs/getMetadata", {"path": P("")}), ("fs/readFile", {"path": P("missing")}),
                ("process/write", {"processId": "nope", "chunk": ""}),
                ("http/request", {"method": "GET", "url": "ftp://127.0.0.1/x", "requestId": "r1"}),
                ("environment/info", None), ("fs/walk", {"path": P("")}),
                ("fs/getMetadata", {}), ("process/read", {})])
            self.add(Request(conn, method, params))
        else:
            method = self.pick(["foo/bar", "fs/watch", "fs/unwatch", "process/resizePty",
                                "capabilities/loadDiscoveries", "fs/readStream", "Process/Read",
                                "process/closeStdin", "process/list", "initialized"])
            self.add(Request(conn, method, self.pick([{}, harmless, None])))

    def gen_resume(self):
        self.session("c1", tell=self.chance(0.5))
        started = self.chance(0.7)
        if started:
            self.add(Request("c1", "process/start",
                             self.start_params("r1", ["sh", "-c", "read line; echo after:$line"],
                                               pipeStdin=True)))
        for _ in range(self.rng.randint(1, 3)):
            x = self.pick(["attached", "unknown", "own", "null", "badtype"])
            self.conn_counter += 1
            c = f"x{self.conn_counter}"
            self.add(Connect(c))
            resume = {"attached": Sid("c1"), "unknown": UNKNOWN_SID, "own": Sid("c1"),
                      "null": None, "badtype": 5}[x]
            if x == "own":
                self.add(Request("c1", "initialize", {"clientName": "x", "resumeSessionId": resume}))
            else:
                self.add(Request(c, "initialize", {"clientName": "x", "resumeSessionId": resume}))
        if self.chance(0.75):
            self.add(Close("c1"))
            self.add(Resume("c2", "c1"))
            if self.chance(0.4):
                self.add(Connect("c3"))
                self.add(Request("c3", "initialize", {"clientName": "x", "resumeSessionId": Sid("c1")}))
            if started:
                self.add(Request("c2", "process/read", {"processId": "r1"}))
                self.add(Request("c2", "process/write", self.write_params("r1", "x\n", mutate=False)))
                self.add(WaitExit("c2", "r1"))
            else:
                self.add(Request("c2", "process/read", {"processId": "r1"}))
            if self.chance(0.3):
                self.add(Request("c2", "fs/getMetadata", {"path": P("")}))
        elif started:
            self.add(Request("c1", "process/terminate", {"processId": "r1"}))
            self.add(WaitExit("c1", "r1"))
