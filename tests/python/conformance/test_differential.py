"""The differential conformance run (differential/) in CI: a fixed seed and
a fixed number of sequences per revision, bounded in time, against the official
exec-server of the revision and exec-gateway.

It fails on any crash and on any unintended difference that
known_differences.json does not list (a new difference, or a fixed one come
back); a listed one that no longer appears is reported, so the list only
shrinks. The intended differences (INTENDED in differential/compare.py) and the known
ones are in docs/protocol.md, "Differential conformance". The JSON report is
written beside the test's temporary directory.

Environment overrides: DIFFERENTIAL_SEED (1), DIFFERENTIAL_SEQUENCES (per
revision), DIFFERENTIAL_BUDGET (seconds per revision, server start-up included;
a cap: normally the sequence count ends the run first).
"""

import asyncio
import json
import os
import pathlib
import warnings

import pytest

from .differential import format_result, report_json, run_revision

SEED = int(os.environ.get("DIFFERENTIAL_SEED", "1"))
SEQUENCES = int(os.environ.get("DIFFERENTIAL_SEQUENCES", "300"))
BUDGET = float(os.environ.get("DIFFERENTIAL_BUDGET", "60"))
KNOWN = pathlib.Path(__file__).with_name("known_differences.json")


def known_signatures():
    return {json.dumps(k["signature"]): k for k in json.loads(KNOWN.read_text())["known"]}


@pytest.mark.parametrize("revision", ["may", "nov"])
def test_differential(revision, tmp_path):
    res = asyncio.run(run_revision(SEED, revision, BUDGET, SEQUENCES, workdir=tmp_path / "run"))
    report = tmp_path / "report.json"
    report.write_text(json.dumps(report_json([res], SEED), indent=1, ensure_ascii=False,
                                 default=str))
    if res.budget_exhausted:
        warnings.warn(f"differential [{revision}]: the {BUDGET:g}s budget ran out after "
                      f"{res.sequences} of {SEQUENCES} sequences")
    known = known_signatures()
    new = [d for d in res.unintended if json.dumps(d["signature"]) not in known]
    seen = {json.dumps(d["signature"]) for d in res.unintended}
    gone = [k for s, k in known.items() if k["signature"][0] == revision and s not in seen]
    if gone and not res.budget_exhausted and SEED == 1:
        warnings.warn(f"differential [{revision}]: {len(gone)} known difference(s) no longer "
                      "appear; remove them from known_differences.json: "
                      + "; ".join(g["example"] for g in gone))
    assert not (new or res.crashes), (
        f"{len(new)} new unintended difference(s) between Codex "
        f"{res.versions.get('reference')} and exec-gateway (JSON report: {report})\n"
        + "\n".join(json.dumps(d, default=str)[:2000] for d in new)
        + "\n" + format_result(res))
