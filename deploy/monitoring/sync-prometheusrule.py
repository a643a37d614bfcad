#!/usr/bin/env python3
"""Write deploy/kubernetes/monitoring/prometheusrule.yaml from alerts.yml.

The PrometheusRule carries alerts.yml's groups as they are: the `groups:`
block of alerts.yml, indented under `spec:`, so one file is edited and the
other follows (tests/python/test_deploy.py fails when they differ).

    python3 deploy/monitoring/sync-prometheusrule.py          # write it
    python3 deploy/monitoring/sync-prometheusrule.py --check  # exit 1 if stale

Standard library only: the text is moved, not re-serialised, so comments
and block scalars stay as written.
"""

import pathlib
import sys

HERE = pathlib.Path(__file__).resolve().parent
ALERTS = HERE / "alerts.yml"
TARGET = HERE.parent / "kubernetes" / "monitoring" / "prometheusrule.yaml"

HEADER = """\
# GENERATED from deploy/monitoring/alerts.yml by
# deploy/monitoring/sync-prometheusrule.py: edit alerts.yml and run it again
# (tests/python/test_deploy.py fails while the two differ).
#
# The Prometheus Operator loads this into the Prometheus whose ruleSelector
# and ruleNamespaceSelector match it: add the labels yours selects on (for
# kube-prometheus-stack, `release: <its release>`) in the kustomization
# beside this file. What each alert means: docs/operations.md, "Monitoring".
apiVersion: monitoring.coreos.com/v1
kind: PrometheusRule
metadata:
  name: exec-gateway
  labels:
    app.kubernetes.io/name: exec-gateway
    app.kubernetes.io/component: monitoring
spec:
"""


def render() -> str:
    lines = ALERTS.read_text().splitlines()
    try:
        start = lines.index("groups:")
    except ValueError:
        sys.exit(f"{ALERTS}: no top-level `groups:` line")
    body = [("  " + line) if line.strip() else "" for line in lines[start:]]
    return HEADER + "\n".join(body) + "\n"


def main() -> int:
    text = render()
    if sys.argv[1:] == ["--check"]:
        if not TARGET.is_file() or TARGET.read_text() != text:
            print(f"{TARGET} is stale: run {pathlib.Path(__file__).name}", file=sys.stderr)
            return 1
        return 0
    if sys.argv[1:]:
        print(__doc__, file=sys.stderr)
        return 2
    TARGET.parent.mkdir(parents=True, exist_ok=True)
    TARGET.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
