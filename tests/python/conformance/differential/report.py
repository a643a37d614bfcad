"""Reports: the text summary of a revision's run (format_result, its classes
and, unless quiet, every unintended difference) and the JSON report
(report_json: the intended list, counts and examples, every unintended
difference, the classes).
"""

import json

from .compare import INTENDED

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
