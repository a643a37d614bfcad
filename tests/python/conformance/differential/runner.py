"""Running sequences against a pair of servers: Pair (the official
exec-server and exec-gateway of one revision, restarted if one dies),
run_sequence (one sequence on both at once, its differences), shrink (a
minimal sequence per class) and run_revision (sequences 0, 1, ... of a seed
within a budget).
"""

import asyncio
import pathlib
import shutil
import tempfile
import time
from dataclasses import dataclass, field

from ..conftest import CODEX_VERSIONS, start_gateway, start_reference
from .compare import classify, explain, signature
from .generator import generate
from .report import compact
from .side import Side
from .steps import Request, WaitExit, Sequence, mutating


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
