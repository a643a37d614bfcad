"""Differential conformance: the same seeded request sequences against the
official exec-server of a revision and against exec-gateway, answers compared
pairwise.

    python3 -m tests.python.conformance.differential --seed 1 --budget 120 \
        --revision may|nov|both [--sequences N] [--report FILE] [--shrink SECONDS]
        [--trace] [--only 3,17] [--list] [-q]

(EXEC_GATEWAY_BIN and CODEX_TOOLS_DIR as for the conformance suite.)

For a revision ("may" = Codex 0.130.0, "nov" = 0.169.0) the tool starts the
official `codex exec-server` and exec-gateway exactly as the conformance suite
does (conftest.start_reference / start_gateway), then runs sequences 0, 1, 2,
... until the budget (seconds, per revision) or --sequences is reached.
Sequence i is generated from `random.Random(f"{seed}:{revision}:{i}")` alone,
so a seed always yields the same sequences whatever the budget or the speed
of the machine (the budget only decides how many of them run).

Each sequence runs on both servers at once, each in its own fresh directory
with the same relative layout: DIR = <workspace>/sNNNN (the gateway's tenant
root is its workspace; the reference runs in its workspace with HOME there),
OUT = <base>/outside/sNNNN beside the workspace (outside the tenant root).
The tool makes files, directories, FIFOs and symlinks on disk before the
calls that use them. A step's answers are normalised (see `Side.norm`:
DIR/OUT/ROOT/BASE in paths and URIs, sessionIds, websocket addresses, file
times, racy seq numbers, base64 decoded) and compared: result or error, code,
message, result contents.

A difference is *intended* when the named predicates in INTENDED explain it
entirely (each carries a one-line reason; most mirror a check the conformance
suite marks `reference_quirk`); every other difference is *unintended*. Once
a difference hits a step that changes state (a write, a process, a session, a
dropped connection), the two servers no longer hold the same state, so the
rest of that sequence is not run (counted as "stopped early"): what follows
would only repeat the first difference. (An intended predicate may declare
itself stateless, e.g. environmentInfo's values.)

Sequences avoid timing: process output is read after the process has closed
(process/read long polls until `closed`), or is made of one write; reads of a
running process use short waits on commands that print nothing (sleep). Seq
numbers are racy on both servers (stdout, stderr and the exit are numbered in
arrival order), so chunk seqs are compared as <seq>, a nextSeq that follows
the last chunk as `last+1`, and an `afterSeq` names a seq this side has seen
(Seq placeholders).

Every difference is reported with its sequence number, step, request and both
answers (normalised; the JSON report also has them verbatim). Differences are
grouped into classes; --shrink then looks for a minimal sequence per class
(steps dropped one by one while the class still shows; a WaitExit a later step
depends on is kept). The pytest entry is test_differential.py.
"""

import argparse
import asyncio
import base64
import hashlib
import json
import os
import pathlib
import random
import re
import shutil
import stat
import sys
import tempfile
import time
import urllib.parse
from dataclasses import dataclass, field
from typing import Any

from .conftest import CODEX_VERSIONS, start_gateway, start_reference
from .harness import ServerClosed, connect

REVISIONS = ("may", "nov")
STEP_TIMEOUT = 8.0        # a hang guard per step (a wait's waitMs comes on top)
EXIT_TIMEOUT = 20.0       # how long a process may take to close in WaitExit
NOTIFY_TIMEOUT = 4.0      # how long to wait for fs/missingChanged
UNKNOWN_SID = "00000000-0000-4000-8000-000000000000"
PROBE_PID = "__probe"

# 0.169.0's methods, which 0.130.0 lacks (-32601 there).
NEWER_METHODS = (
    "fs/canonicalize", "fs/walk", "fs/open", "fs/readBlock", "fs/writeBlock", "fs/close",
    "fs/watchMissing", "environment/info", "environment/status", "environmentConfig/read",
    "capabilities/discoverV2", "capabilityRoots/discoverV1", "process/signal")
# The gateway's documented extension methods (docs/protocol.md, Extensions).
GATEWAY_EXTENSIONS = ("process/closeStdin", "process/list", "process/resize",
                      "session/close", "command/exec", "command/exec/write",
                      "command/exec/terminate")
READ_ONLY_METHODS = (
    "fs/readFile", "fs/getMetadata", "fs/readDirectory", "fs/canonicalize", "fs/walk",
    "fs/readBlock", "environment/info", "environment/status", "environmentConfig/read",
    "capabilities/discoverV2", "capabilityRoots/discoverV1", "process/read", "http/request")


# -- placeholders: values resolved per side -------------------------------------

@dataclass(frozen=True)
class P:
    """A path, resolved in each side's own directories.

    base: dir (the sequence's directory), out (outside the tenant root), root
    (the workspace = tenant root), abs (`rel` is an absolute host path), none
    (`rel` is sent verbatim). form: own (the revision's), plain, uri,
    localhost (file://localhost/...), upper (FILE://), opaque (file:/abs),
    pct (every byte percent-encoded), host (file://host/...), http.
    """
    rel: str = ""
    base: str = "dir"
    form: str = "own"
    slash: bool = False

    def host_path(self, side):
        if self.base == "abs":
            path = self.rel
        else:
            root = {"dir": side.dir, "out": side.out, "root": side.root}[self.base]
            path = str(root) + ("/" + self.rel.format(name=side.name) if self.rel else "")
        return path + ("/" if self.slash and not path.endswith("/") else "")

    def resolve(self, side):
        if self.base == "none":
            return self.rel
        return wire_form(self.host_path(side), self.form, side.revision)

    def show(self):
        if self.base == "none":
            return self.rel
        if self.base == "abs":
            path = self.rel
        else:
            path = "{" + self.base.upper() + "}" + ("/" + self.rel if self.rel else "")
        path += "/" if self.slash and not path.endswith("/") else ""
        form = self.form
        return {"own": "<own>", "plain": "", "uri": "file://", "localhost": "file://localhost",
                "upper": "FILE://", "opaque": "file:", "pct": "file://<pct>",
                "host": "file://host", "http": "http://x"}[form] + path


def wire_form(path, form, revision):
    if form == "own":
        form = "uri" if revision == "nov" else "plain"
    q = urllib.parse.quote(path)
    if form == "plain":
        return path
    if form == "uri":
        return "file://" + q
    if form == "localhost":
        return "file://localhost" + q
    if form == "upper":
        return "FILE://" + q
    if form == "opaque":
        return "file:" + q
    if form == "pct":
        return "file://" + "".join(c if c == "/" else "".join(f"%{b:02X}" for b in c.encode())
                                   for c in path)
    if form == "host":
        return "file://host" + q
    if form == "http":
        return "http://x" + q
    raise ValueError(form)


@dataclass(frozen=True)
class Sid:
    """The sessionId the named connection got from its initialize."""
    conn: str

    def resolve(self, side):
        return side.sids.get(self.conn, UNKNOWN_SID)

    def show(self):
        return "{SID:" + self.conn + "}"


@dataclass(frozen=True)
class Seq:
    """A seq this side has seen for a process: `first`/`last` output chunk,
    or `closed` (process/closed's seq)."""
    pid: str
    which: str

    def resolve(self, side):
        proc = side.procs.get(self.pid, {})
        chunks = sorted(proc.get("chunks", ()))
        if self.which == "first":
            return chunks[0] if chunks else 0
        if self.which == "last":
            return chunks[-1] if chunks else 0
        return proc.get("closed", 0)

    def show(self):
        return "{SEQ:" + self.pid + ":" + self.which + "}"


@dataclass(frozen=True)
class Raw:
    """A JSON text sent verbatim inside a frame (numbers JSON cannot round-trip)."""
    text: str

    def resolve(self, side):
        return self

    def show(self):
        return self.text


PLACEHOLDERS = (P, Sid, Seq, Raw)


def resolve(value, side):
    if isinstance(value, PLACEHOLDERS):
        return value.resolve(side)
    if isinstance(value, dict):
        return {k: resolve(v, side) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [resolve(v, side) for v in value]
    return value


def show(value):
    """A placeholder-bearing value as JSON-like text for reports."""
    if isinstance(value, PLACEHOLDERS):
        return value.show()
    if isinstance(value, dict):
        return {k: show(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [show(v) for v in value]
    return value


def dumps(obj):
    """JSON text of a resolved frame; Raw parts go in verbatim."""
    marks = {}

    def sub(v):
        if isinstance(v, Raw):
            key = f"\u0000raw{len(marks)}\u0000"
            marks[json.dumps(key)] = v.text
            return key
        if isinstance(v, dict):
            return {k: sub(x) for k, x in v.items()}
        if isinstance(v, list):
            return [sub(x) for x in v]
        return v

    text = json.dumps(sub(obj), separators=(",", ":"), ensure_ascii=False)
    for key, raw in marks.items():
        text = text.replace(key, raw)
    return text


# -- steps -----------------------------------------------------------------------

@dataclass
class Disk:
    """Made on disk by the tool before the calls (not compared). op: mkdir,
    write (arg: bytes), fifo, symlink (arg: the target: a str used verbatim,
    or a P whose host path is used)."""
    op: str
    rel: str
    arg: Any = None
    base: str = "dir"

    def describe(self):
        where = "{" + self.base.upper() + "}/" + self.rel
        if self.op == "symlink":
            target = (P(self.arg.rel, self.arg.base, "plain").show()
                      if isinstance(self.arg, P) else self.arg)
            return f"disk: symlink {where} -> {target}"
        if self.op == "write":
            return f"disk: write {where} {self.arg!r}"
        return f"disk: {self.op} {where}"


@dataclass
class Connect:
    conn: str

    def describe(self):
        return f"{self.conn}: connect"


@dataclass
class Session:
    """connect, initialize (compared), then the `initialized` notification."""
    conn: str
    params: Any = None

    def describe(self):
        params = self.params if self.params is not None else {"clientName": "differential"}
        return f"{self.conn}: connect + initialize {json.dumps(show(params))} + initialized"


@dataclass
class Request:
    conn: str
    method: str
    params: Any = ...
    id: Any = None          # None: the connection's next integer id
    extra: Any = None       # more top-level members
    wait_ms: int = 0        # the request's own long-poll, added to the timeout

    def describe(self):
        msg = {"id": self.id if self.id is not None else "<n>", "method": self.method}
        if self.params is not ...:
            msg["params"] = show(self.params)
        if self.extra:
            msg.update(show(self.extra))
        return f"{self.conn}: {json.dumps(msg, ensure_ascii=False)}"


@dataclass
class Frame:
    """A frame sent as is (str) or built from a value (placeholders
    resolved), then a probe request: whatever came back before the probe's
    answer is the step's answer."""
    conn: str
    frame: Any
    binary: bool = False
    expect: Any = field(default_factory=lambda: NO_ID)  # an id to await first

    def describe(self):
        text = self.frame if isinstance(self.frame, str) else dumps(_shown(self.frame))
        return f"{self.conn}: {'binary' if self.binary else 'text'} frame {text}"


class _NoId:
    def __repr__(self):
        return "NO_ID"


NO_ID = _NoId()


@dataclass
class Close:
    conn: str

    def describe(self):
        return f"{self.conn}: close"


@dataclass
class WaitExit:
    """process/read long polls until the process has closed; compares the
    output, exit code and final flags (and, with events, the process/*
    notifications this connection got, seq left out)."""
    conn: str
    pid: str
    events: bool = False

    def describe(self):
        return (f"{self.conn}: process/read {self.pid} until closed"
                + (" (+ its notifications)" if self.events else ""))


@dataclass
class Resume:
    """initialize {resumeSessionId: SID(of)} on a fresh connection `conn`,
    retried until the server has noticed the old connection is gone (then
    `initialized`)."""
    conn: str
    of: str

    def describe(self):
        return (f"{self.conn}: connect + initialize {{resumeSessionId: {{SID:{self.of}}}}} "
                "(retried while 'already attached') + initialized")


@dataclass
class AwaitNotification:
    conn: str
    method: str

    def describe(self):
        return f"{self.conn}: wait up to {NOTIFY_TIMEOUT:g}s for {self.method}"


@dataclass
class Snapshot:
    """The tree under DIR as seen on disk (names, kinds, modes, contents,
    link texts)."""

    def describe(self):
        return "disk: snapshot of {DIR}"


def mutating(step):
    """Whether a step can change state a later step depends on."""
    if isinstance(step, Request):
        if step.method in READ_ONLY_METHODS:
            return False
        return True
    return isinstance(step, (Session, Frame, Resume, Close))


@dataclass
class Sequence:
    index: int
    kind: str
    steps: list

    def digest(self):
        text = "\n".join(s.describe() for s in self.steps)
        return hashlib.sha256(text.encode()).hexdigest()[:16]


# -- the generator -----------------------------------------------------------------

def b64(data):
    if isinstance(data, str):
        data = data.encode()
    return base64.b64encode(data).decode()


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


class Gen:
    """Builds one sequence from its own random.Random."""

    KINDS = (("fs", 30), ("symlink", 16), ("process", 26), ("envelope", 14),
             ("resume", 9), ("nov", 5))

    def __init__(self, seed, revision, index):
        self.rng = random.Random(f"{seed}:{revision}:{index}")
        self.index = index
        self.rev = revision
        self.nov = revision == "nov"
        self.steps = []
        self.entries = []      # (rel, tags) known under DIR
        self.out_entries = []  # (rel, tags) known under OUT
        self.pids = {}         # pid -> "short" | "long" | "stdin" | "done"
        self.pid_counter = 0
        self.write_ids = 0
        self.conn_counter = 0

    # helpers
    def chance(self, p):
        return self.rng.random() < p

    def pick(self, items):
        return items[self.rng.randrange(len(items))]

    def weighted(self, pairs):
        total = sum(w for _, w in pairs)
        x = self.rng.uniform(0, total)
        for item, w in pairs:
            x -= w
            if x <= 0:
                return item
        return pairs[-1][0]

    def add(self, step):
        self.steps.append(step)
        return step

    def new_pid(self, prefix="p"):
        self.pid_counter += 1
        return f"{prefix}{self.pid_counter}"

    def write_id(self):
        self.write_ids += 1
        return f"w{self.write_ids}"

    def generate(self):
        kinds = list(self.KINDS)
        if not self.nov:
            kinds = [(k, w if k != "nov" else 3) for k, w in kinds]
        kind = self.weighted(kinds)
        getattr(self, "gen_" + kind)()
        return Sequence(self.index, kind, self.steps)

    # -- sessions
    def session(self, conn="c1", tell=None):
        self.add(Session(conn))
        if tell is None:
            tell = self.chance(0.75)
        if tell:
            self.add(Request(conn, "fs/getMetadata", {"path": P("")}))

    # -- disk layout
    def setup_tree(self, symlinks):
        r = self.chance
        self.add(Disk("write", "f.txt", b"payload"))
        self.entries.append(("f.txt", {"file"}))
        if r(0.5):
            self.add(Disk("write", "empty", b""))
            self.entries.append(("empty", {"file"}))
        if r(0.7):
            self.add(Disk("mkdir", "d"))
            self.add(Disk("write", "d/x", b"x"))
            self.entries += [("d", {"dir"}), ("d/x", {"file"})]
            if r(0.5):
                self.add(Disk("mkdir", "d/sub"))
                self.add(Disk("write", "d/sub/y", b"why"))
                self.entries += [("d/sub", {"dir"}), ("d/sub/y", {"file"})]
        if r(0.25):
            self.add(Disk("mkdir", ".hidden"))
            self.add(Disk("write", ".hidden/h", b"h"))
            self.entries += [(".hidden", {"dir"}), (".hidden/h", {"file"})]
        if r(0.25):
            self.add(Disk("mkdir", "with space"))
            self.add(Disk("write", "with space/g", b"spaced"))
            self.entries += [("with space", {"dir"}), ("with space/g", {"file"})]
        if r(0.15):
            self.add(Disk("write", "unicod\u00e9.txt", "\u00e9t\u00e9".encode()))
            self.entries.append(("unicod\u00e9.txt", {"file"}))
        if r(0.15):
            self.add(Disk("fifo", "fifo"))
            self.entries.append(("fifo", {"fifo"}))
        if r(0.6):
            self.add(Disk("write", "o.txt", b"outside", base="out"))
            self.out_entries.append(("o.txt", {"file"}))
        if r(0.3):
            self.add(Disk("mkdir", "od", base="out"))
            self.add(Disk("write", "od/z", b"z", base="out"))
            self.out_entries += [("od", {"dir"}), ("od/z", {"file"})]
        if not symlinks:
            return
        links = [
            ("l_rel", "f.txt", {"link", "file"}),
            ("l_dir", "d", {"link", "dir"}),
            ("l_abs", P("f.txt"), {"link", "file", "abs"}),
            ("l_absdir", P("d"), {"link", "dir", "abs"}),
            ("l_out_abs", P("o.txt", base="out"), {"link", "file", "outside"}),
            ("l_out_rel", "../../outside/{name}/o.txt", {"link", "file", "outside"}),
            ("l_root", "..", {"link", "dir", "nolist", "nomut"}),
            ("l_up2", "../..", {"link", "dir", "nolist", "nomut", "outside"}),
            ("l_dangling", "missing", {"link", "missing"}),
            ("l_dangling_abs", P("missing"), {"link", "missing", "abs"}),
            ("l_loop1", "l_loop2", {"link", "loop"}),
            ("l_loop2", "l_loop1", {"link", "loop"}),
            ("l_self", "l_self", {"link", "loop"}),
            ("l_chain1", "l_chain2", {"link", "file"}),
            ("l_chain2", "l_rel", {"link", "file"}),
            ("l_chain_abs", "l_abs", {"link", "file", "abs"}),
            ("l_etc", P("/etc/hostname", base="abs"), {"link", "file", "outside", "nomut"}),
            ("l_dotdot_in", "d/../f.txt", {"link", "file"}),
            ("l_back_in", "../{name}/f.txt", {"link", "file"}),
            ("l_fifo", "fifo", {"link", "fifo"}),
        ]
        for name, target, tags in links:
            if r(0.45):
                self.add(Disk("symlink", name, target))
                self.entries.append((name, tags))
        if r(0.3) and any(e[0] == "d" for e in self.entries):
            self.add(Disk("symlink", "d/l_up", "../f.txt"))
            self.entries.append(("d/l_up", {"link", "file"}))
        if r(0.2) and any(e[0] == "d" for e in self.entries):
            self.add(Disk("symlink", "d/l_up_abs", P("f.txt")))
            self.entries.append(("d/l_up_abs", {"link", "file", "abs"}))

    # -- paths
    def path_candidates(self, purpose):
        """(P args, tags) for a purpose: read, list, mutate, create, copy_src."""
        c = [(("",), {"dir", "self"})]
        for rel, tags in self.entries:
            c.append(((rel,), set(tags)))
        for rel, tags in self.out_entries:
            c.append(((rel, "out"), tags | {"outside"}))
        c += [
            (("missing",), {"missing"}),
            (("missing/deeper",), {"missing"}),
            (("d/missing",), {"missing"}),
            (("new.txt",), {"missing", "new"}),
            (("newdir",), {"missing", "new"}),
            (("d/../f.txt",), {"file"}),
            (("./f.txt",), {"file"}),
            (("d//x",), {"file"}),
            (("../{name}/f.txt",), {"file"}),
            (("../../outside/{name}/o.txt",), {"file", "outside"}),
            (("../../outside/{name}/new.txt",), {"missing", "outside"}),
            (("../../../../../../../../etc/hostname",), {"file", "outside", "nomut"}),
            (("missing", "out"), {"missing", "outside"}),
            (("", "out"), {"dir", "outside"}),
            (("/etc/hostname", "abs"), {"file", "outside", "nomut"}),
            (("/", "abs"), {"dir", "outside", "nomut", "nolist"}),
            (("/tmp", "abs"), {"dir", "outside", "nomut", "nolist"}),
            (("", "root"), {"dir", "nomut", "nolist"}),
            (("..",), {"dir", "nomut", "nolist"}),
        ]
        out = []
        for args, tags in c:
            if purpose in ("mutate", "create", "copy_src") and "nomut" in tags:
                continue
            if purpose in ("list",) and ("nolist" in tags):
                continue
            if purpose in ("read", "mutate", "create", "copy_src") and "fifo" in tags:
                # Opening a FIFO blocks the reference (docs: a FIFO hangs 0.130.0)
                continue
            out.append((args, tags))
        return out

    def path(self, purpose="read", prefer=None):
        """A path value for a request: mostly a P in the revision's form."""
        x = self.rng.random()
        if x < 0.03:
            return self.pick([5, None, ["a"], {}, True])
        if x < 0.10:
            # Not absolute: relative, empty, home-relative. Only where nothing
            # is written: 0.169.0 reads `file:f.txt` as /f.txt on the host.
            if purpose in ("mutate", "create", "copy_src"):
                return P(self.pick(["f.txt", "", "./f.txt", "d/x"]), base="none")
            return P(self.pick(["f.txt", "", "./f.txt", "~/f.txt", "file:f.txt", "d/x"]),
                     base="none")
        cands = self.path_candidates(purpose)
        if prefer:
            preferred = [cd for cd in cands if prefer & cd[1]]
            if preferred and self.chance(0.7):
                cands = preferred
        args, tags = self.pick(cands)
        rel = args[0]
        base = args[1] if len(args) > 1 else "dir"
        slash = self.chance(0.06)
        form = "own"
        y = self.rng.random()
        if y < 0.12:
            form = self.pick(["plain", "uri", "localhost", "upper", "opaque", "pct", "host", "http"]
                             if self.nov else ["uri", "uri", "localhost", "opaque"])
        return P(rel, base=base, form=form, slash=slash)

    def sandbox(self):
        if self.nov and self.chance(0.15):
            return {"sandbox": None}
        return {}

    # -- fs requests
    def fs_request(self, conn):
        r = self.rng
        methods = [("fs/readFile", 14), ("fs/writeFile", 12), ("fs/createDirectory", 9),
                   ("fs/getMetadata", 16), ("fs/readDirectory", 10), ("fs/remove", 9),
                   ("fs/copy", 10)]
        if self.nov:
            methods += [("fs/canonicalize", 8), ("fs/walk", 5), ("fs/open", 4)]
        method = self.weighted(methods)
        params = None
        if method == "fs/readFile":
            params = {"path": self.path("read", {"file", "link"})}
        elif method == "fs/getMetadata":
            params = {"path": self.path("read", {"link", "file", "dir"})}
            if self.chance(0.15):
                params["followSymlinks"] = self.pick([False, True])
        elif method == "fs/readDirectory":
            params = {"path": self.path("list", {"dir"})}
        elif method == "fs/canonicalize":
            params = {"path": self.path("read", {"link", "file", "dir"})}
        elif method == "fs/writeFile":
            path = self.path("mutate", {"new", "file", "link"})
            data = self.pick(["", "hello", "line\n", "\u00e9"])
            params = {"path": path, "dataBase64": b64(data)}
            if self.chance(0.1):
                params["dataBase64"] = self.pick(["!!notb64", "aGk", 5, None])
            if isinstance(path, P) and path.base == "dir" and path.rel:
                self.entries.append((path.rel, {"file"}))
        elif method == "fs/createDirectory":
            path = self.path("create", {"new", "missing", "dir"})
            params = {"path": path}
            if self.chance(0.5):
                params["recursive"] = self.pick([True, False, False, "yes"])
            if isinstance(path, P) and path.base == "dir" and path.rel:
                self.entries.append((path.rel, {"dir"}))
        elif method == "fs/remove":
            params = {"path": self.path("mutate", {"file", "dir", "link", "missing"})}
            for k in ("recursive", "force"):
                if self.chance(0.4):
                    params[k] = self.pick([True, False])
        elif method == "fs/copy":
            src = self.path("copy_src", {"file", "dir", "link"})
            dst = self.path("create", {"new", "missing"})
            params = {"sourcePath": src, "destinationPath": dst,
                      "recursive": self.pick([True, False])}
            if self.chance(0.08):
                del params["recursive"]
            if isinstance(dst, P) and dst.base == "dir" and dst.rel:
                self.entries.append((dst.rel, {"file"}))
        elif method == "fs/walk":
            options = {"maxDepth": self.pick([0, 1, 10]), "maxDirectories": self.pick([1, 100]),
                       "maxEntries": self.pick([1, 3, 100]),
                       "followDirectorySymlinks": self.pick([False, True]),
                       "pruneHiddenDirectories": self.pick([True, False])}
            params = {"path": self.path("list", {"dir"}), "options": options}
            if self.chance(0.1):
                del options[self.pick(sorted(options))]
        elif method == "fs/open":
            self.file_handles(conn)
            return
        params.update(self.sandbox())
        self.mutate_params(params)
        self.add(Request(conn, method, params))

    def file_handles(self, conn):
        hid = self.pick(["h1", "h2"])
        mode = self.pick([None, "read", "replace", "append"])
        purpose = "create" if mode == "replace" else "read"
        params = {"handleId": hid, "path": self.path(purpose, {"file", "new"})}
        if mode:
            params["mode"] = mode
        self.add(Request(conn, "fs/open", params))
        for _ in range(self.rng.randint(1, 3)):
            op = self.pick(["read", "read", "write", "close", "reopen"])
            if op == "read":
                self.add(Request(conn, "fs/readBlock", {
                    "handleId": hid, "offset": self.pick([0, 3, 100]),
                    "len": self.pick([1, 3, 100, 0])}))
            elif op == "write":
                self.add(Request(conn, "fs/writeBlock", {
                    "handleId": hid, "offset": self.pick([0, 4]), "chunk": b64("zz")}))
            elif op == "close":
                self.add(Request(conn, "fs/close", {"handleId": hid}))
            else:
                self.add(Request(conn, "fs/open", dict(params)))

    def mutate_params(self, params):
        """Now and then: a field missing, a wrong type, an unknown field."""
        x = self.rng.random()
        if x < 0.05 and params:
            del params[self.pick(sorted(params))]
        elif x < 0.08:
            params["unknownField"] = 1
        elif x < 0.10 and params:
            params[self.pick(sorted(params))] = self.pick([5, "text", [], {}, None])

    # -- sequence kinds
    def gen_fs(self):
        self.setup_tree(symlinks=self.chance(0.3))
        self.session()
        for _ in range(self.rng.randint(3, 9)):
            self.fs_request("c1")
        if self.chance(0.6):
            self.add(Snapshot())

    def gen_symlink(self):
        self.setup_tree(symlinks=True)
        self.session()
        for _ in range(self.rng.randint(3, 9)):
            if self.chance(0.6):
                method = self.weighted([("fs/getMetadata", 5), ("fs/readFile", 4),
                                        ("fs/readDirectory", 2), ("fs/canonicalize", 3 if self.nov else 0),
                                        ("fs/remove", 1), ("fs/writeFile", 1), ("fs/copy", 1)])
                params = {}
                if method == "fs/readDirectory":
                    params["path"] = self.pick([P(""), P("d"), P("l_dir"), P("l_absdir"),
                                                P("od", base="out")])
                elif method == "fs/copy":
                    params = {"sourcePath": self.path("copy_src", {"link"}),
                              "destinationPath": P(self.pick(["cp1", "cp2"])),
                              "recursive": self.pick([True, False])}
                elif method == "fs/writeFile":
                    params = {"path": self.path("mutate", {"link"}), "dataBase64": b64("new")}
                elif method == "fs/remove":
                    params = {"path": self.path("mutate", {"link"})}
                else:
                    params["path"] = self.path("read", {"link"})
                    if self.chance(0.2) and method != "fs/canonicalize":
                        params["followSymlinks"] = False
                self.add(Request("c1", method, params))
            else:
                self.fs_request("c1")
        if self.chance(0.3):
            self.process_with_cwd("c1", cwd=self.path("read", {"link", "dir"}))
        if self.chance(0.5):
            self.add(Snapshot())

    def start_params(self, pid, argv, cwd=None, **extra):
        params = {"processId": pid, "argv": argv, "cwd": cwd if cwd is not None else P(""),
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
                '"params":{"processId":"nope"}}', "\ufeff{}"])))
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

    def gen_nov(self):
        """0.169.0's newer methods: watches, walks, handles, environment."""
        self.setup_tree(symlinks=self.chance(0.3))
        self.session(tell=self.chance(0.6))
        for _ in range(self.rng.randint(1, 4)):
            op = self.pick(["watch", "walk", "handles", "env", "env", "caps"])
            if op == "watch":
                self.watch("c1")
            elif op == "walk":
                options = {"maxDepth": self.pick([0, 1, 10]), "maxDirectories": self.pick([1, 100]),
                           "maxEntries": self.pick([1, 3, 100]),
                           "followDirectorySymlinks": self.pick([False, True]),
                           "pruneHiddenDirectories": self.pick([True, False])}
                self.add(Request("c1", "fs/walk", {"path": self.path("list", {"dir"}),
                                                   "options": options}))
            elif op == "handles":
                self.file_handles("c1")
            elif op == "env":
                method = self.pick(["environment/info", "environment/status"])
                self.add(Request("c1", method, self.pick([None, {}, ...])))
            else:
                method, params = self.pick([
                    ("environmentConfig/read", {"cwd": P(""), "configPaths": [["mcp_servers"]],
                                                "requirementsPaths": [["mcp_servers"]]}),
                    ("environmentConfig/read", {"cwd": P(""), "configPaths": [],
                                                "requirementsPaths": []}),
                    ("capabilities/discoverV2", {"cwd": P("")}),
                    ("capabilities/discoverV2", {"cwd": P("missing")}),
                    ("capabilityRoots/discoverV1", {"roots": []}),
                    ("capabilityRoots/discoverV1", {"roots": [{"id": "r1", "path": P("")}]})])
                self.add(Request("c1", method, params))

    def watch(self, conn):
        missing = [self.pick([P("m1"), P("m2"), P("f.txt"), P("missing", base="out"),
                              P("o.txt", base="out"), P("d/m3")])
                   for _ in range(self.rng.randint(0, 2))]
        present = self.pick([None, None, P("f.txt"), P("absent")])
        wid = self.pick([1, 5, 0])
        params = {"watchId": wid, "missing": missing, "present": present}
        self.mutate_params(params)
        self.add(Request(conn, "fs/watchMissing", params))
        if self.chance(0.6):
            # Make a missing path appear (or the present one go), then wait.
            what = self.pick(["m1", "f.txt"])
            if what == "m1":
                self.add(Request(conn, "fs/writeFile", {"path": P("m1"), "dataBase64": ""}))
            else:
                self.add(Request(conn, "fs/remove", {"path": P("f.txt")}))
            self.add(AwaitNotification(conn, "fs/missingChanged"))


def expect_of(rid):
    """The id a response must carry, when `rid` is a valid request id."""
    if isinstance(rid, bool) or rid is None:
        return NO_ID
    if isinstance(rid, int) and -2**63 <= rid < 2**63:
        return rid
    if isinstance(rid, str):
        return rid
    return NO_ID


def generate(seed, revision, index):
    return Gen(seed, revision, index).generate()


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


# -- intended differences ------------------------------------------------------------

def inside(path, root):
    path, root = str(path), str(root).rstrip("/")
    return path == root or path.startswith(root + "/")


def escape_reason(path, root, follow_final=True):
    """Why resolving `path` beneath `root` (as openat2 RESOLVE_BENEATH does,
    after lexical normalisation) leaves it: `lexical`, `absolute-symlink`,
    `symlink-out`, or None."""
    path = os.path.normpath(path)
    root = os.path.normpath(str(root))
    if not inside(path, root):
        return "lexical"
    rel = os.path.relpath(path, root)
    parts = [] if rel == "." else rel.split("/")
    cur, hops = root, 0
    while parts:
        part = parts.pop(0)
        nxt = os.path.join(cur, part)
        if (parts or follow_final) and os.path.islink(nxt):
            hops += 1
            if hops > 40:
                return None
            target = os.readlink(nxt)
            if target.startswith("/"):
                return "absolute-symlink"
            new = os.path.normpath(os.path.join(cur, target))
            if not inside(new, root):
                return "symlink-out"
            rel = os.path.relpath(new, root)
            parts = ([] if rel == "." else rel.split("/")) + parts
            cur = root
        else:
            cur = nxt
    return None


PATH_KEYS = ("path", "cwd", "sourcePath", "destinationPath", "present", "missing")


def path_params(step):
    """(key, P) for every path placeholder of a request's params."""
    params = step.params if isinstance(step, Request) else None
    found = []
    if isinstance(params, dict):
        for key in PATH_KEYS:
            v = params.get(key)
            for item in (v if isinstance(v, list) else [v]):
                if isinstance(item, P):
                    found.append((key, item))
    elif isinstance(params, list):
        found += [("positional", v) for v in params if isinstance(v, P)]
    return found


def error_of(answer):
    if isinstance(answer, dict) and isinstance(answer.get("error"), dict):
        return answer["error"]
    return None


def result_of(answer):
    if isinstance(answer, dict) and "result" in answer and "error" not in answer:
        return answer["result"]
    return None


OUTSIDE = re.compile(r"path `(.*)` is outside the tenant root")


def _escapes(ctx, host_path, key):
    """Whether the gateway may call `host_path` (param `key`) outside its root."""
    params = ctx.params if isinstance(ctx.params, dict) else {}
    follow = params.get("followSymlinks") is not False and not (
        ctx.method == "fs/remove" or (ctx.method == "fs/copy" and key == "sourcePath"))
    return escape_reason(host_path, ctx.gw_side.root, follow)


def _confined(ctx):
    ref, gw = ctx.ref, ctx.gw
    gw_err = error_of(gw)
    m = OUTSIDE.fullmatch(str(gw_err.get("message"))) if gw_err and gw_err.get("code") == -32004 else None
    if m:
        ref_err = error_of(ref)
        if ref_err and ref_err.get("code") == -32602:
            return None  # the reference refused the params first: a precedence difference
        named = ctx.gw_side.denorm(m.group(1))
        keys = [k for k, p in path_params(ctx.step)
                if isinstance(p, P) and p.base != "none" and p.host_path(ctx.gw_side).rstrip("/")
                == named.rstrip("/")] or ["path"]
        if any(_escapes(ctx, named, k) for k in keys):
            return "<confined>", "<confined>"
        return None
    # Listings: the gateway skips entries whose resolution leaves the root.
    ref_res, gw_res = result_of(ref), result_of(gw)
    if ctx.method not in ("fs/readDirectory", "fs/walk") or not (
            isinstance(ref_res, dict) and isinstance(gw_res, dict)
            and isinstance(ref_res.get("entries"), list) and isinstance(gw_res.get("entries"), list)):
        return None
    (_, p), = path_params(ctx.step)[:1] or [(None, None)]
    if not isinstance(p, P) or p.base == "none":
        return None
    listed = os.path.realpath(p.host_path(ctx.gw_side))
    kept = []
    for e in ref_res["entries"]:
        if e in gw_res["entries"] or not isinstance(e, dict):
            kept.append(e)
            continue
        if ctx.method == "fs/readDirectory":
            host = os.path.join(listed, str(e.get("fileName")))
        else:
            host = ctx.gw_side.denorm(urllib.parse.unquote(str(e.get("path", ""))[len("file://"):])
                                      if str(e.get("path", "")).startswith("file://")
                                      else str(e.get("path", "")))
        if not (os.path.islink(host) and escape_reason(host, ctx.gw_side.root)):
            kept.append(e)
    return dict(ref, result=dict(ref_res, entries=kept)), gw


def frame_kind(step, revision):
    """What a Frame carries, as the reference decodes it."""
    obj = parse_frame(step)
    if obj is _JUNK:
        return "junk"
    if not isinstance(obj, dict):
        return "not-an-object"
    if "method" not in obj:
        return "response" if ("result" in obj or "error" in obj) else "other"
    if "id" not in obj:
        return "initialized" if obj.get("method") == "initialized" else "notification"
    rid = obj["id"]
    if expect_of(rid) is NO_ID:
        return "bad-id"
    return "request"


_JUNK = object()


def parse_frame(step):
    """A Frame's JSON value (`-0` read as a float, as serde_json does), or _JUNK."""
    text = step.frame if isinstance(step.frame, str) else dumps(_shown(step.frame))
    try:
        return json.loads(text, parse_int=lambda t: -0.0 if t == "-0" else int(t))
    except ValueError:
        return _JUNK


def _shown(value):
    """Placeholders as their display text, Raw parts kept (for classifying frames)."""
    if isinstance(value, Raw):
        return value
    if isinstance(value, PLACEHOLDERS):
        return value.show()
    if isinstance(value, dict):
        return {k: _shown(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_shown(v) for v in value]
    return value


def _unexpected(ctx):
    if not isinstance(ctx.step, Frame):
        return None
    ref, gw = ctx.ref, ctx.gw
    if ref.get("closed") != "no close frame" or ref.get("unsolicited"):
        return None
    if gw.get("closed") or gw.get("timeout"):
        return None
    for u in gw.get("unsolicited", []):
        if not (u.get("id") == -1 and (u.get("error") or {}).get("code") == -32600):
            return None
    kind = frame_kind(ctx.step, ctx.revision)
    if kind in ("notification", "initialized", "response") or (
            kind == "bad-id" and ctx.revision == "may"):
        return "<unexpected>", "<unexpected>"
    return None


def _responses(ctx):
    """The responses to compare: a Frame's are under "answer"."""
    if isinstance(ctx.step, Frame):
        return (ctx.ref.get("answer") if isinstance(ctx.ref, dict) else None,
                ctx.gw.get("answer") if isinstance(ctx.gw, dict) else None)
    return ctx.ref, ctx.gw


def _rewrap(ctx, ref_resp, gw_resp):
    if isinstance(ctx.step, Frame):
        return dict(ctx.ref, answer=ref_resp), dict(ctx.gw, answer=gw_resp)
    return ref_resp, gw_resp


def _request(step):
    """(method, params) a step sends, or (None, None)."""
    if isinstance(step, Request):
        return step.method, step.params
    if isinstance(step, (Session, Resume)):
        return "initialize", getattr(step, "params", None)
    if isinstance(step, Frame):
        obj = parse_frame(step)
        if isinstance(obj, dict) and isinstance(obj.get("method"), str) and "id" in obj:
            return obj["method"], obj.get("params", ...)
    return None, None


def _whole(ctx, mark):
    """Explains the whole response (a Frame's probe and the rest must still match)."""
    return _rewrap(ctx, mark, mark)


def _http(ctx):
    ref, gw = _responses(ctx)
    if ctx.method == "http/request" and error_of(gw) == {
            "code": -32003, "message": "http/request is disabled on this gateway"}:
        return _whole(ctx, "<http>")
    return None


def _extensions(ctx):
    ref, gw = _responses(ctx)
    if ctx.method in GATEWAY_EXTENSIONS and (error_of(ref) or {}).get("code") == -32601:
        return _whole(ctx, "<extension>")
    return None


def _may_environment_info(ctx):
    ref, gw = _responses(ctx)
    ref_res, gw_res = result_of(ref), result_of(gw)
    if (ctx.method == "initialize" and isinstance(ref_res, dict) and isinstance(gw_res, dict)
            and "environmentInfo" not in ref_res and "environmentInfo" in gw_res):
        gw_res = {k: v for k, v in gw_res.items() if k != "environmentInfo"}
        return _rewrap(ctx, ref, dict(gw, result=gw_res))
    return None


def _may_newer_methods(ctx):
    ref, gw = _responses(ctx)
    if ctx.method in NEWER_METHODS and error_of(ref) == {
            "code": -32601, "message": f"exec-server stub does not implement `{ctx.method}` yet"}:
        return _whole(ctx, "<newer method>")
    return None


IDENTITY_KEYS = ("executorVersion", "providerId", "prependPathDirs", "capabilities")


def _mask_identity(answer):
    res = result_of(answer)
    if not isinstance(res, dict):
        return answer
    info = res.get("environmentInfo") if "environmentInfo" in res else (
        res if "executorVersion" in res else None)
    if not isinstance(info, dict):
        return answer
    info = {k: ("<masked>" if k in IDENTITY_KEYS else v) for k, v in info.items()}
    res = dict(res, environmentInfo=info) if "environmentInfo" in res else info
    return dict(answer, result=res)


def _environment_identity(ctx):
    if ctx.method in ("initialize", "environment/info"):
        ref, gw = _responses(ctx)
        return _rewrap(ctx, _mask_identity(ref), _mask_identity(gw))
    return None


def _codex_home(ctx):
    if ctx.method != "environmentConfig/read":
        return None
    ref, gw = _responses(ctx)
    ref_res, gw_res = result_of(ref), result_of(gw)
    if isinstance(ref_res, dict) and isinstance(gw_res, dict):
        return _rewrap(ctx, dict(ref, result=dict(ref_res, codexHomeDir="<masked>")),
                       dict(gw, result=dict(gw_res, codexHomeDir="<masked>")))
    return None


def _signal_variants(ctx):
    ref, gw = _responses(ctx)
    if (ctx.method == "process/signal" and isinstance(ctx.params, dict)
            and isinstance(ctx.params.get("signal"), str) and ctx.params["signal"] != "interrupt"
            and str((error_of(ref) or {}).get("message", "")).startswith("unknown variant")):
        return _whole(ctx, "<signal>")
    return None


def _sandbox(ctx):
    if not (isinstance(ctx.params, dict) and ctx.params.get("sandbox") is not None):
        return None
    ref, gw = _responses(ctx)
    if (error_of(ref) or {}).get("code") == -32602 and error_of(gw) is None:
        return _whole(ctx, "<sandbox>")
    ref_res, gw_res = result_of(ref), result_of(gw)
    if isinstance(ref_res, dict) and isinstance(gw_res, dict):
        return _rewrap(ctx, dict(ref, result=dict(ref_res, sandboxType="<masked>")),
                       dict(gw, result=dict(gw_res, sandboxType="<masked>")))
    return None


@dataclass
class Intended:
    name: str
    reason: str
    revisions: tuple
    explain: Any        # ctx -> None | (reference', gateway') with the explained part masked
    diverges: Any       # True / False, or None: whether the step changes state (`mutating`)


# The intended differences: short on purpose. Anything they do not explain
# is reported as unintended.
INTENDED = [
    Intended("confined_resolution",
             "the gateway resolves paths beneath the tenant root (RESOLVE_BENEATH): a path outside "
             "it, or through a symlink leading out or with an absolute target (even back inside), "
             "is -32004 `path P is outside the tenant root`, and fs/readDirectory skips such "
             "entries; the reference has no root (reference_quirk: test_path_outside_workspace, "
             "test_cwd_outside_workspace, test_absolute_symlink_inside_workspace)",
             REVISIONS, _confined, None),
    Intended("unexpected_message_kept",
             "the reference drops the connection (no close frame) on an unknown notification, "
             "`initialized` before `initialize`, a client response, or (0.130.0) a request id that "
             "is not an i64 or a string; the gateway answers -32600 on id -1 (ignores a response) "
             "and keeps it (reference_quirk: test_unexpected_messages, test_null_id)",
             REVISIONS, _unexpected, True),
    Intended("http_request_disabled",
             "executor-side HTTP is disabled on the gateway: -32003 whatever the params "
             "(reference_quirk: test_http_request)",
             REVISIONS, _http, False),
    Intended("gateway_extensions",
             "methods the gateway adds (process/closeStdin, process/list, process/resize, "
             "session/close, command/exec*) are -32601 on the reference "
             "(reference_quirk: test_gateway_process_extensions; docs/protocol.md, Extensions)",
             REVISIONS, _extensions, True),
    Intended("may_initialize_superset",
             "the gateway cannot tell the revision at initialize, so it answers 0.169's superset "
             "(environmentInfo too) (reference_quirk: test_initialize_result)",
             ("may",), _may_environment_info, False),
    Intended("may_newer_methods",
             "0.169.0's methods (process/signal, fs/canonicalize, ...) are -32601 on 0.130.0; the "
             "gateway serves them in a May session too (reference_quirk: test_newer_methods, "
             "test_process_signal)",
             ("may",), _may_newer_methods, True),
    Intended("environment_identity",
             "environmentInfo's executorVersion, providerId, prependPathDirs and capabilities "
             "describe each server (reference_quirk: test_initialize_environment_info)",
             ("nov",), _environment_identity, False),
    Intended("codex_home",
             "codexHomeDir is the reference's CODEX_HOME; the gateway names HOME/.codex "
             "(reference_quirk: test_environment_config_read)",
             ("nov",), _codex_home, False),
    Intended("signal_variants",
             "0.169.0 knows only `interrupt`; the gateway's process/signal also takes terminate, "
             "kill, hangup, quit, user1, user2 (reference_quirk: test_signal_variants)",
             ("nov",), _signal_variants, True),
    Intended("sandbox_ignored",
             "the gateway accepts and ignores `sandbox` (sandboxType none; no decoding); the "
             "reference applies it (reference_quirk: test_start_with_sandbox, "
             "test_start_sandbox_without_permissions)",
             REVISIONS, _sandbox, True),
]
# Not generated, so not listed: output chunk sizes (outputs here are a few
# bytes), notification arrival order (normalised: compared sorted), 0.130.0's
# repeated writeId (each writeId is used once in May sequences).


@dataclass
class Ctx:
    step: Any
    revision: str
    ref: Any
    gw: Any
    gw_side: Side
    method: Any = None
    params: Any = None

    def __post_init__(self):
        self.method, self.params = _request(self.step)


def explain(step, revision, ref, gw, gw_side):
    """The intended differences that together explain ref != gw, or None."""
    names = []
    for item in INTENDED:
        if revision not in item.revisions:
            continue
        try:
            masked = item.explain(Ctx(step, revision, ref, gw, gw_side))
        except (AttributeError, TypeError, ValueError, KeyError):
            masked = None
        if masked is None:
            continue
        if list(masked) != [ref, gw]:
            names.append(item)
            ref, gw = masked
        if ref == gw:
            return names
    return None


# -- comparing and classifying -------------------------------------------------------

def step_label(step, revision):
    if isinstance(step, Request):
        return step.method
    if isinstance(step, Session):
        return "initialize (new session)"
    if isinstance(step, Resume):
        return "initialize (resume a detached session)"
    if isinstance(step, Frame):
        return "frame: " + frame_kind(step, revision)
    if isinstance(step, WaitExit):
        return "process/read until closed"
    return type(step).__name__.lower()


def template(text):
    """A message with its particulars blanked, for grouping."""
    text = re.sub(r"invalid (type|value): [^,]*,", r"invalid \1: _,", str(text))
    text = re.sub(r"`[^`]*`", "`_`", text)
    text = re.sub(r"'[^']*'", "'_'", text)
    text = re.sub(r"\{SID:\w+\}", "{SID}", text)
    return re.sub(r"\d+", "N", text)


def outcome(answer):
    if not isinstance(answer, dict):
        return repr(answer)
    if "error" in answer and isinstance(answer["error"], dict):
        return f"error {answer['error'].get('code')}: {template(answer['error'].get('message'))}"
    if "result" in answer:
        return "result"
    if any(k in answer for k in ("answer", "probe", "unsolicited")) or isinstance(
            answer.get("closed"), str):  # a Frame
        parts = []
        if "answer" in answer:
            parts.append("answer " + outcome(answer["answer"]))
        for u in answer.get("unsolicited") or []:
            parts.append(("on id -1 " if isinstance(u, dict) and u.get("id") == -1 else "unsolicited ")
                         + outcome(u))
        if "closed" in answer:
            parts.append("connection dropped (" + str(answer["closed"]) + ")")
        if "probe" in answer:
            parts.append("then probe " + outcome(answer["probe"]))
        return "; ".join(parts)
    return "+".join(sorted(answer))


def diff_keys(a, b, prefix="", depth=0):
    if a == b:
        return []
    if isinstance(a, dict) and isinstance(b, dict) and depth < 3:
        keys = []
        for k in list(a) + [k for k in b if k not in a]:
            keys += diff_keys(a.get(k, "<absent>"), b.get(k, "<absent>"), f"{prefix}.{k}", depth + 1)
        return keys
    return [prefix or "."]


def signature(revision, step, ref, gw):
    """What groups differences into classes: two error answers group by their
    (templated) texts whatever the method; anything else by step kind and
    outcome (and, when those match, by where the answers differ)."""
    a, b = outcome(ref), outcome(gw)
    if a.startswith("error") and b.startswith("error"):
        return (revision, "error vs error", a, b, ())
    keys = tuple(diff_keys(ref, gw)) if a == b else ()
    return (revision, step_label(step, revision), a, b, keys)


@dataclass
class SeqResult:
    sequence: Sequence
    unintended: list = field(default_factory=list)
    intended: list = field(default_factory=list)
    stopped: str = None     # why the comparison stopped early, if it did
    steps_run: int = 0


async def run_sequence(pair, seq, name, trace=None):
    """Runs one sequence on both servers; its differences. `trace`, if
    given, is called with a line per step."""
    ref = Side(pair.reference, name)
    gw = Side(pair.gateway, name)
    result = SeqResult(seq)
    ref.prepare()
    gw.prepare()
    try:
        for k, step in enumerate(seq.steps):
            a, b = await asyncio.gather(ref.run(step), gw.run(step))
            result.steps_run += 1
            if trace:
                trace(f"  [{seq.index}:{k}] {step.describe()}")
                if a == b:
                    if a is not None:
                        trace(f"      both:      {compact(a)}")
                else:
                    trace(f"      reference: {compact(a)}\n      gateway:   {compact(b)}")
            if a == b:
                continue
            diff = {
                "revision": pair.revision, "sequence": seq.index, "kind": seq.kind,
                "step": k, "request": step.describe(), "reference": a, "gateway": b,
                "referenceRaw": ref.raw, "gatewayRaw": gw.raw,
                "signature": signature(pair.revision, step, a, b),
            }
            names = explain(step, pair.revision, a, b, gw)
            if names:
                diff["intended"] = [n.name for n in names]
                result.intended.append(diff)
                diverges = any(n.diverges is True or (n.diverges is None and mutating(step))
                               for n in names)
                if diverges:
                    result.stopped = f"step {k}: intended difference ({', '.join(diff['intended'])})"
                    break
            else:
                result.unintended.append(diff)
                if mutating(step):
                    result.stopped = f"step {k}: unintended difference on a state-changing step"
                    break
    finally:
        pids = sorted({p for st in seq.steps if isinstance(st, Request) and st.method == "process/start"
                       for p in [st.params.get("processId") if isinstance(st.params, dict)
                                 else (st.params[0] if st.params else None)]
                       if isinstance(p, str)})
        await asyncio.gather(ref.aclose(pids), gw.aclose(pids))
    return result


class Pair:
    """The reference and the gateway of one revision, and their workspaces."""

    def __init__(self, revision, workdir):
        self.revision = revision
        self.workdir = pathlib.Path(workdir)
        self.reference = None
        self.gateway = None
        self.crashes = []
        self._starts = 0

    def _start(self, kind):
        self._starts += 1
        base = self.workdir / f"{kind}-{self._starts}"
        base.mkdir(parents=True)
        server = (start_reference if kind == "reference" else start_gateway)(self.revision, base)
        (base / "outside").mkdir()
        return server

    def start(self):
        self.reference = self._start("reference")
        self.gateway = self._start("gateway")

    def check_alive(self, seq_index):
        """Restarts a server that died (and remembers that it did)."""
        for kind in ("reference", "gateway"):
            server = getattr(self, kind)
            rc = server.proc.poll()
            if rc is not None:
                log = pathlib.Path(server.root).parent / "server.log"
                tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
                self.crashes.append({"revision": self.revision, "server": kind,
                                     "afterSequence": seq_index, "exitCode": rc, "logTail": tail})
                self._stop(server)
                setattr(self, kind, self._start(kind))

    @staticmethod
    def _stop(server):
        try:
            server.stop()
        finally:
            for path in server.scratch:
                shutil.rmtree(path, ignore_errors=True)

    def stop(self):
        for server in (self.reference, self.gateway):
            if server is not None:
                self._stop(server)


async def shrink(pair, seq, sig, deadline, counter):
    """A shorter sequence that still shows a difference with signature
    `sig`: steps are dropped one at a time, from the end, while it does."""
    steps = list(seq.steps)

    async def reproduces(candidate):
        name = f"m{next(counter):05d}"
        res = await run_sequence(pair, Sequence(seq.index, seq.kind, candidate), name)
        return next((d for d in res.unintended if d["signature"] == sig), None)

    def pid_of(step):
        if isinstance(step, WaitExit):
            return step.pid
        params = step.params if isinstance(step, Request) else None
        if isinstance(params, dict):
            return params.get("processId")
        if isinstance(params, list) and params:
            return params[0]
        return None

    def needed(i):
        """A WaitExit stays while a later step uses its process: without it
        that step would race the process's exit."""
        return isinstance(steps[i], WaitExit) and any(
            pid_of(later) == steps[i].pid for later in steps[i + 1:])

    for _ in range(2):
        changed = False
        i = len(steps) - 1
        while i >= 0 and time.monotonic() < deadline:
            if needed(i):
                i -= 1
                continue
            candidate = steps[:i] + steps[i + 1:]
            if await reproduces(candidate):
                steps = candidate
                changed = True
            i -= 1
        if not changed:
            break
    diff = await reproduces(steps)
    return steps, diff


# -- running a revision --------------------------------------------------------------

@dataclass
class RevisionResult:
    revision: str
    seed: int
    versions: dict
    sequences: int = 0
    steps: int = 0
    seconds: float = 0.0
    stopped: int = 0
    unintended: list = field(default_factory=list)
    intended: list = field(default_factory=list)
    crashes: list = field(default_factory=list)
    classes: list = field(default_factory=list)
    digests: list = field(default_factory=list)
    budget_exhausted: bool = False


def classify(diffs):
    classes = {}
    for d in diffs:
        key = json.dumps(d["signature"])
        c = classes.setdefault(key, {"signature": d["signature"], "count": 0, "first": d,
                                     "where": []})
        c["count"] += 1
        c["where"].append([d["sequence"], d["step"]])
    return sorted(classes.values(), key=lambda c: (c["first"]["sequence"], c["first"]["step"]))


async def run_revision(seed, revision, budget, max_sequences=None, workdir=None, shrink_budget=0,
                       log=None, trace=None, only=None):
    """Runs sequences 0, 1, ... of `seed` for one revision until the budget
    (seconds, server start-up included) or max_sequences is reached."""
    log = log or (lambda *a: None)
    own = workdir is None
    workdir = pathlib.Path(workdir or tempfile.mkdtemp(prefix=f"differential-{revision}-"))
    started = time.monotonic()
    pair = Pair(revision, workdir)
    res = RevisionResult(revision, seed, {"reference": CODEX_VERSIONS[revision]})
    try:
        pair.start()
        res.versions["gateway"] = pair.gateway.version
        deadline = started + budget
        i = 0
        while (max_sequences is None or i < max_sequences):
            if time.monotonic() >= deadline:
                res.budget_exhausted = max_sequences is not None
                break
            if only is not None and i not in only:
                i += 1
                continue
            seq = generate(seed, revision, i)
            res.digests.append(seq.digest())
            if trace:
                trace(f"[{revision}] sequence {i} ({seq.kind})")
            out = await run_sequence(pair, seq, f"s{i:04d}", trace)
            res.sequences += 1
            res.steps += out.steps_run
            res.unintended += out.unintended
            res.intended += out.intended
            if out.stopped:
                res.stopped += 1
            if out.unintended:
                log(f"[{revision}] sequence {i} ({seq.kind}): "
                    f"{len(out.unintended)} unintended difference(s)")
            pair.check_alive(i)
            i += 1
        res.seconds = time.monotonic() - started
        res.classes = classify(res.unintended)
        if shrink_budget > 0:
            counter = iter(range(10**6))
            shrink_deadline = time.monotonic() + shrink_budget
            for c in res.classes:
                if time.monotonic() >= shrink_deadline:
                    break
                first = c["first"]
                seq = generate(seed, revision, first["sequence"])
                steps = seq.steps[:first["step"] + 1]
                log(f"[{revision}] shrinking {c['signature'][1]} (sequence {first['sequence']}, "
                    f"{len(steps)} steps)")
                small, diff = await shrink(pair, Sequence(seq.index, seq.kind, steps),
                                           first["signature"], shrink_deadline, counter)
                if diff:
                    c["minimal"] = {"steps": [s.describe() for s in small], "difference": diff}
                pair.check_alive(-1)
    finally:
        res.crashes = pair.crashes
        pair.stop()
        if own:
            shutil.rmtree(workdir, ignore_errors=True)
    return res


# -- reports --------------------------------------------------------------------------

def compact(value):
    return json.dumps(value, ensure_ascii=False, sort_keys=False)


def format_difference(d):
    return (f"[{d['revision']}] sequence {d['sequence']} ({d['kind']}) step {d['step']}: "
            f"{d['request']}\n"
            f"    reference: {compact(d['reference'])}\n"
            f"    gateway:   {compact(d['gateway'])}")


def format_result(res, every=True):
    lines = [f"== {res.revision} (reference {res.versions.get('reference')}, gateway "
             f"{res.versions.get('gateway')}), seed {res.seed}: {res.sequences} sequences, "
             f"{res.steps} steps in {res.seconds:.1f}s; {len(res.unintended)} unintended "
             f"difference(s) in {len(res.classes)} class(es), {len(res.intended)} intended; "
             f"{res.stopped} sequence(s) stopped early"]
    counts = {}
    for d in res.intended:
        for n in d["intended"]:
            counts[n] = counts.get(n, 0) + 1
    if counts:
        lines.append("intended: " + ", ".join(f"{k} x{v}" for k, v in sorted(counts.items())))
    for crash in res.crashes:
        lines.append(f"SERVER DIED: {crash['server']} after sequence {crash['afterSequence']} "
                     f"(exit {crash['exitCode']})\n{crash['logTail']}")
    if res.classes:
        lines.append("classes:")
        for n, c in enumerate(res.classes, 1):
            sig = c["signature"]
            first = c["first"]
            lines.append(f"  {n}. {sig[1]}: reference {sig[2]} / gateway {sig[3]}"
                         + (f" (differs at {', '.join(sig[4])})" if sig[4] else "")
                         + f"; {c['count']}x, first at sequence {first['sequence']} step "
                           f"{first['step']}: {first['request']}")
            if "minimal" in c:
                lines.append("     minimal sequence:")
                lines += [f"       {s}" for s in c["minimal"]["steps"]]
                d = c["minimal"]["difference"]
                lines.append(f"       -> reference: {compact(d['reference'])}")
                lines.append(f"       -> gateway:   {compact(d['gateway'])}")
    if every and res.unintended:
        lines.append("every unintended difference:")
        lines += [format_difference(d) for d in res.unintended]
    return "\n".join(lines)


def examples(intended, per_name=5):
    """A few intended differences per predicate (all are counted)."""
    seen, out = {}, []
    for d in intended:
        key = "+".join(d["intended"])
        seen[key] = seen.get(key, 0) + 1
        if seen[key] <= per_name:
            out.append(d)
    return out


def report_json(results, seed):
    def plain(x):
        if isinstance(x, tuple):
            return list(x)
        return x
    out = {"seed": seed, "intendedDifferences": [
        {"name": i.name, "reason": i.reason, "revisions": list(i.revisions)} for i in INTENDED],
        "revisions": {}}
    for r in results:
        counts = {}
        for d in r.intended:
            for n in d["intended"]:
                counts[n] = counts.get(n, 0) + 1
        out["revisions"][r.revision] = {
            "versions": r.versions, "sequences": r.sequences, "steps": r.steps,
            "seconds": round(r.seconds, 1), "stoppedEarly": r.stopped,
            "budgetExhaustedBeforeSequences": r.budget_exhausted,
            "sequenceDigests": r.digests, "crashes": r.crashes,
            "intendedCounts": counts, "intendedExamples": examples(r.intended),
            "unintended": r.unintended,
            "classes": [dict(c, signature=[plain(s) for s in c["signature"]]) for c in r.classes],
        }
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(
        prog="python3 -m tests.python.conformance.differential",
        description="Differential conformance of exec-gateway against the official exec-server.")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--budget", type=float, default=60.0,
                    help="seconds per revision (server start-up included)")
    ap.add_argument("--revision", choices=("may", "nov", "both"), default="both")
    ap.add_argument("--sequences", type=int, default=None,
                    help="run at most this many sequences (0..N-1) per revision")
    ap.add_argument("--report", help="write the JSON report here")
    ap.add_argument("--shrink", type=float, default=0.0, metavar="SECONDS",
                    help="after the run, spend up to SECONDS per revision finding a minimal "
                         "sequence for each class of unintended difference")
    ap.add_argument("--list", action="store_true",
                    help="print the generated sequences (no servers) and exit")
    ap.add_argument("--trace", action="store_true",
                    help="print every step with both answers (to stderr)")
    ap.add_argument("--only", type=lambda t: {int(x) for x in t.split(",")},
                    help="run only these sequence numbers (comma-separated)")
    ap.add_argument("-q", "--quiet", action="store_true", help="classes only, not every difference")
    args = ap.parse_args(argv)
    revisions = REVISIONS if args.revision == "both" else (args.revision,)
    if args.list:
        for rev in revisions:
            for i in range(args.sequences or 10):
                seq = generate(args.seed, rev, i)
                print(f"[{rev}] sequence {i} ({seq.kind}) {seq.digest()}")
                for k, s in enumerate(seq.steps):
                    print(f"  {k:2d} {s.describe()}")
        return 0
    import pytest  # the harness reports an absent binary with pytest.skip
    results = []
    for rev in revisions:
        try:
            res = asyncio.run(run_revision(
                args.seed, rev, args.budget, args.sequences, shrink_budget=args.shrink,
                log=lambda *a: print(*a, file=sys.stderr, flush=True),
                trace=(lambda line: print(line, file=sys.stderr, flush=True)) if args.trace else None,
                only=args.only))
        except pytest.skip.Exception as e:
            print(f"[{rev}] cannot run: {e}", file=sys.stderr)
            return 2
        results.append(res)
        print(format_result(res, every=not args.quiet), flush=True)
    if args.report:
        with open(args.report, "w") as f:
            json.dump(report_json(results, args.seed), f, indent=1, ensure_ascii=False, default=str)
    return 1 if any(r.unintended or r.crashes for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
