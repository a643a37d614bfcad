"""The command line (main): `python3 -m tests.python.conformance.differential
--seed 1 --budget 120 --revision may|nov|both ...`; see the package docstring.
"""

import argparse
import asyncio
import json
import sys

from .generator import generate
from .report import format_result, report_json
from .runner import run_revision
from .steps import REVISIONS


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
