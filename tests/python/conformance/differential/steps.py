"""The sequence model: the constants the tool shares (revisions, timeouts,
method lists), placeholders (values resolved per side: P paths, Sid, Seq,
Raw) and how they are resolved, shown and sent, the steps a sequence is made
of (Disk, Connect, Session, Request, Frame, Close, WaitExit, Resume,
AwaitNotification, Snapshot), and Sequence.
"""

import base64
import hashlib
import json
import urllib.parse
from dataclasses import dataclass, field
from typing import Any

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


def b64(data):
    if isinstance(data, str):
        data = data.encode()
    return base64.b64encode(data).decode()


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


def expect_of(rid):
    """The id a response must carry, when `rid` is a valid request id."""
    if isinstance(rid, bool) or rid is None:
        return NO_ID
    if isinstance(rid, int) and -2**63 <= rid < 2**63:
        return rid
    if isinstance(rid, str):
        return rid
    return NO_ID
