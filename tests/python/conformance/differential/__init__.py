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

The package's modules, in the order a run uses them:

    steps              constants, placeholders (P, Sid, Seq, Raw), the steps, Sequence
    generator          generate() and Gen: its core and the fs, symlink, nov kinds
    generator_process  Gen's process, envelope and resume kinds (a mixin)
    side               Side: one server's run of a sequence; normalisation
    compare            INTENDED and explain(); signatures and classes
    runner             Pair, run_sequence, shrink, run_revision
    report             format_result, report_json
    cli                main() (__main__ runs it)
"""

from .compare import INTENDED, Intended, classify, explain, signature
from .generator import Gen, generate
from .report import format_difference, format_result, report_json
from .runner import Pair, RevisionResult, SeqResult, run_revision, run_sequence, shrink
from .side import Side
from .steps import REVISIONS, Sequence
from .cli import main

__all__ = [
    "INTENDED", "Intended", "classify", "explain", "signature",
    "Gen", "generate",
    "format_difference", "format_result", "report_json",
    "Pair", "RevisionResult", "SeqResult", "run_revision", "run_sequence", "shrink",
    "Side",
    "REVISIONS", "Sequence",
    "main",
]
