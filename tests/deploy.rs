//! The deployment stays true to the gateway. `deploy/kubernetes/base/
//! gateway.toml` parses with the gateway's own config types (unknown keys
//! are refused) and asks for every isolation layer; and the manifests, read
//! as Kubernetes objects rather than as text, agree with it: the container
//! ports are the ports it listens on, the probes ask the client port's
//! `/readyz` and `/healthz`, the termination grace covers the drain, the
//! fleet's peer address is the StatefulSet's DNS under its headless Service,
//! the fleet and admin ports are reachable only by whom they are for, the
//! files it names are mounted, and the init container prepares every
//! tenant's root.
//!
//! The checks run on the base's files as written (always) and on what
//! `kubectl kustomize` renders for the base and every overlay (when kubectl
//! is on PATH or in `KUBECTL`; CI installs a pinned one). Whether the
//! rendered objects are valid Kubernetes at all is tests/python/test_deploy.py.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use exec_gateway::config::{Config, DEFAULT_FLEET_LISTEN, LayerPolicy, parse_listen};
use serde_yaml_ng::Value;

const BASE: &str = "deploy/kubernetes/base";
const OVERLAYS: &str = "deploy/kubernetes/overlays";
const CONFIG: &str = "deploy/kubernetes/base/gateway.toml";
/// The container that runs the gateway, and the one that prepares roots.
const GATEWAY: &str = "gateway";
const INIT: &str = "tenant-roots";

fn path(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(rel)
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(path(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

fn config() -> Config {
    Config::load(&path(CONFIG)).unwrap_or_else(|e| panic!("{CONFIG} must parse: {e}"))
}

fn yaml_docs(text: &str, what: &str) -> Vec<Value> {
    use serde::Deserialize as _;
    serde_yaml_ng::Deserializer::from_str(text)
        .map(|d| Value::deserialize(d).unwrap_or_else(|e| panic!("{what}: {e}")))
        .filter(|v| !v.is_null())
        .collect()
}

fn str_of<'a>(v: &'a Value, what: &str) -> &'a str {
    v.as_str()
        .unwrap_or_else(|| panic!("{what}: expected a string, got {v:?}"))
}

fn seq(v: &Value) -> &[Value] {
    v.as_sequence().map_or(&[], |s| s.as_slice())
}

// ---------------------------------------------------------------------------
// The ports and durations gateway.toml asks for.

struct Wanted {
    ws: u16,
    grpc: u16,
    admin: u16,
    fleet: u16,
    shutdown_grace: Duration,
    config_path: String,
}

fn addr(what: &str, text: &str) -> SocketAddr {
    text.parse()
        .unwrap_or_else(|_| panic!("{what} `{text}` is not HOST:PORT"))
}

fn wanted(config: &Config) -> Wanted {
    let s = &config.server;
    let ws = parse_listen(s.listen.as_deref().expect("server.listen is set")).unwrap();
    let grpc = addr(
        "server.grpc_listen",
        s.grpc_listen.as_deref().expect("grpc_listen is set"),
    );
    let admin = addr(
        "server.admin_listen",
        s.admin_listen.as_deref().expect("admin_listen is set"),
    );
    let fleet = addr(
        "fleet.listen",
        config
            .fleet
            .listen
            .as_deref()
            .unwrap_or(DEFAULT_FLEET_LISTEN),
    );
    for (name, a) in [
        ("listen", ws),
        ("grpc_listen", grpc),
        ("admin_listen", admin),
        ("fleet.listen", fleet),
    ] {
        assert!(
            a.ip().is_unspecified(),
            "{name} {a}: a pod must listen on all its addresses to be reached"
        );
    }
    let grace = s
        .shutdown_grace
        .as_deref()
        .expect("server.shutdown_grace is set");
    Wanted {
        ws: ws.port(),
        grpc: grpc.port(),
        admin: admin.port(),
        fleet: fleet.port(),
        shutdown_grace: humantime::parse_duration(grace).unwrap(),
        config_path: dockerfile_config_path(),
    }
}

/// The `--config` path of the image's CMD: what the pods must mount.
fn dockerfile_config_path() -> String {
    let dockerfile = read("deploy/Dockerfile");
    let cmd = dockerfile
        .lines()
        .filter_map(|l| l.strip_prefix("CMD "))
        .next_back()
        .expect("deploy/Dockerfile has a CMD");
    let cmd: Vec<String> = serde_json::from_str(cmd).expect("CMD in exec (JSON) form");
    flag_value(&cmd, "--config").expect("CMD passes --config")
}

fn flag_value(args: &[String], flag: &str) -> Option<String> {
    args.iter()
        .position(|a| a == flag)
        .and_then(|i| args.get(i + 1).cloned())
}

// ---------------------------------------------------------------------------
// gateway.toml on its own.

#[test]
fn gateway_toml_parses_and_requires_every_isolation_layer() {
    let config = config();
    let i = &config.isolation;
    for (name, policy) in [
        ("workers", i.workers),
        ("landlock", i.landlock),
        ("seccomp", i.seccomp),
        ("cgroups", i.cgroups),
        ("namespaces", i.namespaces),
        ("uid", i.uid),
        ("network", i.network),
    ] {
        assert_eq!(policy, Some(LayerPolicy::Required), "isolation.{name}");
    }
    assert!(!config.tenants.is_empty());
}

#[test]
fn gateway_toml_is_one_file_for_every_replica_of_a_fleet() {
    let f = config().fleet;
    // The id comes from EXEC_GATEWAY_REPLICA (the pod's name): a replica
    // named in the shared file would make every pod claim it.
    assert_eq!(
        f.replica, None,
        "fleet.replica must not be set in the shared file"
    );
    assert!(
        f.key_file.is_some(),
        "fleet.key_file is required in fleet mode"
    );
    assert!(
        f.peers.is_empty(),
        "a StatefulSet's peers are found by DNS, not listed"
    );
    let template = f.peer_address.expect("fleet.peer_address is set");
    assert!(template.contains("{replica}"), "{template}");
}

// ---------------------------------------------------------------------------
// The manifests, as objects.

struct Objects {
    what: String,
    all: Vec<Value>,
}

impl Objects {
    fn of_kind(&self, kind: &str) -> Vec<&Value> {
        self.all
            .iter()
            .filter(|o| o["kind"].as_str() == Some(kind))
            .collect()
    }

    fn one(&self, kind: &str, name: &str) -> &Value {
        let found: Vec<_> = self
            .of_kind(kind)
            .into_iter()
            .filter(|o| o["metadata"]["name"].as_str() == Some(name))
            .collect();
        match found.as_slice() {
            [o] => o,
            _ => panic!(
                "{}: expected one {kind} {name}, found {}",
                self.what,
                found.len()
            ),
        }
    }

    fn statefulset(&self) -> &Value {
        match self.of_kind("StatefulSet").as_slice() {
            [s] => s,
            other => panic!(
                "{}: expected one StatefulSet, found {}",
                self.what,
                other.len()
            ),
        }
    }
}

/// The base's files as written, with what kustomize would add that the
/// checks look at: the namespace, and the ConfigMap the generator makes
/// (under its plain name, which the StatefulSet also uses before rendering).
fn base_files() -> Objects {
    let kustomization = &yaml_docs(
        &read(&format!("{BASE}/kustomization.yaml")),
        "kustomization",
    )[0];
    let namespace = str_of(&kustomization["namespace"], "kustomization namespace");
    let mut all = Vec::new();
    for r in seq(&kustomization["resources"]) {
        let file = str_of(r, "resource");
        all.extend(yaml_docs(&read(&format!("{BASE}/{file}")), file));
    }
    for o in &mut all {
        if o["kind"].as_str() != Some("Namespace") {
            o["metadata"]
                .as_mapping_mut()
                .unwrap()
                .insert("namespace".into(), namespace.into());
        }
    }
    for generator in seq(&kustomization["configMapGenerator"]) {
        let mut data = serde_yaml_ng::Mapping::new();
        for f in seq(&generator["files"]) {
            let f = str_of(f, "configMapGenerator file");
            let (key, file) = f.split_once('=').unwrap_or((f, f));
            let file_name = Path::new(key).file_name().unwrap().to_str().unwrap();
            data.insert(file_name.into(), read(&format!("{BASE}/{file}")).into());
        }
        let mut cm = serde_yaml_ng::Mapping::new();
        cm.insert("kind".into(), "ConfigMap".into());
        let mut meta = serde_yaml_ng::Mapping::new();
        meta.insert("name".into(), generator["name"].clone());
        meta.insert("namespace".into(), namespace.into());
        cm.insert("metadata".into(), meta.into());
        cm.insert("data".into(), data.into());
        all.push(cm.into());
    }
    Objects {
        what: format!("{BASE} (files)"),
        all,
    }
}

fn kubectl() -> Option<PathBuf> {
    if let Some(k) = std::env::var_os("KUBECTL") {
        return Some(PathBuf::from(k));
    }
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|d| d.join("kubectl"))
        .find(|p| p.is_file())
}

/// `kubectl kustomize DIR`, parsed.
fn render(kubectl: &Path, dir: &str) -> Objects {
    let out = std::process::Command::new(kubectl)
        .arg("kustomize")
        .arg(path(dir))
        .output()
        .unwrap_or_else(|e| panic!("{}: {e}", kubectl.display()));
    assert!(
        out.status.success(),
        "kubectl kustomize {dir}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Objects {
        what: format!("{dir} (rendered)"),
        all: yaml_docs(&String::from_utf8(out.stdout).unwrap(), dir),
    }
}

fn kustomizations() -> Vec<String> {
    let mut dirs = vec![BASE.to_owned()];
    let mut overlays: Vec<String> = std::fs::read_dir(path(OVERLAYS))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.join("kustomization.yaml").is_file())
        .map(|p| format!("{OVERLAYS}/{}", p.file_name().unwrap().to_str().unwrap()))
        .collect();
    assert!(!overlays.is_empty(), "no overlay under {OVERLAYS}");
    overlays.sort();
    dirs.extend(overlays);
    dirs
}

#[test]
fn base_files_agree_with_gateway_toml() {
    check(&base_files(), &config());
}

#[test]
fn every_rendered_kustomization_agrees_with_gateway_toml() {
    let Some(kubectl) = kubectl() else {
        eprintln!(
            "skipped: kubectl not found on PATH or in KUBECTL (CI installs a pinned one: .ci/run)"
        );
        return;
    };
    let config = config();
    for dir in kustomizations() {
        let objects = render(&kubectl, &dir);
        check(&objects, &config);
        // The generated ConfigMap carries gateway.toml as it is, under a
        // hashed name the StatefulSet follows.
        let maps = objects.of_kind("ConfigMap");
        let [cm] = maps.as_slice() else {
            panic!("{dir}: expected one ConfigMap, found {}", maps.len());
        };
        assert_eq!(
            cm["data"]["gateway.toml"].as_str(),
            Some(read(CONFIG).as_str()),
            "{dir}"
        );
        assert!(
            objects.of_kind("Secret").is_empty(),
            "{dir}: a Secret is shipped"
        );
    }
}

// ---------------------------------------------------------------------------
// The checks.

fn check(objects: &Objects, config: &Config) {
    let want = wanted(config);
    let sts = objects.statefulset();
    let pod = Pod::of(objects, sts);
    check_ports(&pod, &want);
    check_probes(&pod, &want);
    check_grace(&pod, &want);
    check_fleet(objects, &pod, config, &want);
    check_client_services(objects, &pod, &want);
    check_network_policy(objects, &pod, &want);
    check_disruption_budget(objects, &pod);
    check_files(objects, &pod, config, &want);
    check_tenant_roots(&pod, config, &want);
    check_image_store(&pod, config);
}

struct Pod<'a> {
    what: &'a str,
    namespace: &'a str,
    sts: &'a Value,
    labels: &'a Value,
    spec: &'a Value,
    gateway: &'a Value,
    /// Container port number by name.
    ports: BTreeMap<String, u16>,
}

impl<'a> Pod<'a> {
    fn of(objects: &'a Objects, sts: &'a Value) -> Pod<'a> {
        let what = objects.what.as_str();
        let template = &sts["spec"]["template"];
        let labels = &template["metadata"]["labels"];
        assert!(
            selects(&sts["spec"]["selector"], labels),
            "{what}: the StatefulSet's selector does not match its pods"
        );
        let spec = &template["spec"];
        let gateway = container(&spec["containers"], GATEWAY)
            .unwrap_or_else(|| panic!("{what}: no container {GATEWAY}"));
        let ports = seq(&gateway["ports"])
            .iter()
            .map(|p| {
                let name = str_of(&p["name"], "container port name").to_owned();
                (name, p["containerPort"].as_u64().unwrap() as u16)
            })
            .collect();
        Pod {
            what,
            namespace: str_of(&sts["metadata"]["namespace"], "StatefulSet namespace"),
            sts,
            labels,
            spec,
            gateway,
            ports,
        }
    }

    /// A `port` field (a number or a container port's name) as a number.
    fn port(&self, p: &Value) -> Option<u16> {
        match p {
            Value::Number(n) => n.as_u64().map(|n| n as u16),
            Value::String(name) => self.ports.get(name).copied(),
            _ => None,
        }
    }

    fn volume(&self, name: &str) -> &'a Value {
        seq(&self.spec["volumes"])
            .iter()
            .find(|v| v["name"].as_str() == Some(name))
            .unwrap_or_else(|| panic!("{}: no volume {name}", self.what))
    }
}

fn container<'a>(list: &'a Value, name: &str) -> Option<&'a Value> {
    seq(list).iter().find(|c| c["name"].as_str() == Some(name))
}

/// A label selector (`matchLabels` only; anything else is not understood
/// here and fails) matches `labels`.
fn selects(selector: &Value, labels: &Value) -> bool {
    let map = selector.as_mapping().expect("a selector");
    assert!(
        map.keys().all(|k| k.as_str() == Some("matchLabels")),
        "only matchLabels selectors are checked: {selector:?}"
    );
    matches_labels(&selector["matchLabels"], labels)
}

/// Every `key: value` of `wanted` is among `labels` (and there is one).
fn matches_labels(wanted: &Value, labels: &Value) -> bool {
    let Some(wanted) = wanted.as_mapping() else {
        return false;
    };
    !wanted.is_empty() && wanted.iter().all(|(k, v)| labels.get(k) == Some(v))
}

fn check_ports(pod: &Pod<'_>, want: &Wanted) {
    let expected = BTreeMap::from([
        ("admin".to_owned(), want.admin),
        ("fleet".to_owned(), want.fleet),
        ("grpc".to_owned(), want.grpc),
        ("ws".to_owned(), want.ws),
    ]);
    assert_eq!(
        pod.ports, expected,
        "{}: container ports by name vs gateway.toml",
        pod.what
    );
}

fn check_probes(pod: &Pod<'_>, want: &Wanted) {
    for (probe, path) in [
        ("readinessProbe", "/readyz"),
        ("livenessProbe", "/healthz"),
        ("startupProbe", "/healthz"),
    ] {
        let get = &pod.gateway[probe]["httpGet"];
        assert_eq!(
            get["path"].as_str(),
            Some(path),
            "{}: {probe} path",
            pod.what
        );
        // The client port's bare health endpoints: they need no token (the
        // admin port's detailed /readyz does).
        let port = &get["port"];
        assert!(port.is_string(), "{}: {probe} names its port", pod.what);
        assert_eq!(
            pod.port(port),
            Some(want.ws),
            "{}: {probe} on the ws port",
            pod.what
        );
    }
}

fn check_grace(pod: &Pod<'_>, want: &Wanted) {
    let grace = pod.spec["terminationGracePeriodSeconds"]
        .as_u64()
        .unwrap_or_else(|| panic!("{}: terminationGracePeriodSeconds is set", pod.what));
    // A preStop pause runs first and counts against the same period.
    let pre_stop = &pod.gateway["lifecycle"]["preStop"];
    let pause = if let Some(s) = pre_stop["sleep"]["seconds"].as_u64() {
        s
    } else if pre_stop["exec"].is_mapping() {
        let cmd: Vec<&str> = seq(&pre_stop["exec"]["command"])
            .iter()
            .map(|c| str_of(c, "preStop command"))
            .collect();
        match cmd.as_slice() {
            [sleep, secs] if sleep.ends_with("/sleep") => secs.parse().unwrap(),
            _ => panic!("{}: preStop {cmd:?} is not understood here", pod.what),
        }
    } else {
        0
    };
    let needed = Duration::from_secs(pause) + want.shutdown_grace;
    let margin = Duration::from_secs(grace)
        .checked_sub(needed)
        .unwrap_or_default();
    assert!(
        margin >= Duration::from_secs(5),
        "{}: terminationGracePeriodSeconds {grace} leaves {margin:?} after the preStop \
         pause ({pause} s) and shutdown_grace ({:?}) for the close frames and the kill; \
         at least 5 s are needed",
        pod.what,
        want.shutdown_grace
    );
}

fn check_fleet(objects: &Objects, pod: &Pod<'_>, config: &Config, want: &Wanted) {
    let what = pod.what;
    // The replica id is the pod's name.
    let env = seq(&pod.gateway["env"])
        .iter()
        .find(|e| e["name"].as_str() == Some("EXEC_GATEWAY_REPLICA"))
        .unwrap_or_else(|| panic!("{what}: EXEC_GATEWAY_REPLICA is not set"));
    assert_eq!(
        env["valueFrom"]["fieldRef"]["fieldPath"].as_str(),
        Some("metadata.name"),
        "{what}: EXEC_GATEWAY_REPLICA must come from the pod's name"
    );
    assert_eq!(
        pod.sts["spec"]["podManagementPolicy"].as_str(),
        Some("Parallel"),
        "{what}: podManagementPolicy"
    );

    // {replica}.<headless service>.<namespace>.svc.<cluster domain>:<fleet port>
    let template = config
        .fleet
        .peer_address
        .as_deref()
        .expect("fleet.peer_address");
    let (host, port) = template
        .rsplit_once(':')
        .expect("peer_address is HOST:PORT");
    assert_eq!(
        port.parse::<u16>().ok(),
        Some(want.fleet),
        "{what}: peer_address port"
    );
    let labels: Vec<&str> = host.split('.').collect();
    let [replica, service, namespace, "svc", domain @ ..] = labels.as_slice() else {
        panic!(
            "{what}: peer_address host `{host}` is not {{replica}}.<service>.<namespace>.svc.<domain>"
        );
    };
    assert_eq!(
        *replica, "{replica}",
        "{what}: peer_address host starts with the replica id"
    );
    assert!(
        !domain.is_empty(),
        "{what}: peer_address has no cluster domain"
    );
    let service_name = str_of(&pod.sts["spec"]["serviceName"], "StatefulSet serviceName");
    assert_eq!(
        *service, service_name,
        "{what}: peer_address names the StatefulSet's serviceName"
    );
    assert_eq!(
        *namespace, pod.namespace,
        "{what}: peer_address names the StatefulSet's namespace"
    );

    let headless = objects.one("Service", service_name);
    let spec = &headless["spec"];
    assert_eq!(
        spec["clusterIP"].as_str(),
        Some("None"),
        "{what}: {service_name} is headless"
    );
    assert_eq!(
        spec["publishNotReadyAddresses"].as_bool(),
        Some(true),
        "{what}: {service_name} must resolve draining (unready) replicas for relays"
    );
    assert_eq!(
        headless["metadata"]["namespace"].as_str(),
        Some(pod.namespace)
    );
    assert!(
        selects_pods(&spec["selector"], pod),
        "{what}: {service_name} does not select the pods"
    );
    assert!(
        seq(&spec["ports"])
            .iter()
            .any(|p| p["port"].as_u64() == Some(u64::from(want.fleet))
                && pod.port(&p["targetPort"]) == Some(want.fleet)),
        "{what}: {service_name} has no port {} to the fleet port",
        want.fleet
    );
}

/// A Service's plain `selector` map matches the pods.
fn selects_pods(selector: &Value, pod: &Pod<'_>) -> bool {
    matches_labels(selector, pod.labels)
}

fn check_client_services(objects: &Objects, pod: &Pod<'_>, want: &Wanted) {
    let what = pod.what;
    let client = objects.one("Service", "exec-gateway");
    assert!(
        selects_pods(&client["spec"]["selector"], pod),
        "{what}: exec-gateway selects the pods"
    );
    assert_ne!(
        client["spec"]["sessionAffinity"].as_str(),
        Some("ClientIP"),
        "{what}: any replica serves any session; no affinity"
    );
    let mut targets: Vec<u16> = seq(&client["spec"]["ports"])
        .iter()
        .map(|p| {
            pod.port(&p["targetPort"])
                .unwrap_or_else(|| panic!("{what}: {p:?}"))
        })
        .collect();
    targets.sort_unstable();
    let mut expected = vec![want.ws, want.grpc];
    expected.sort_unstable();
    assert_eq!(
        targets, expected,
        "{what}: the client Service exposes ws and gRPC only"
    );
    // No Service with a cluster address (one a client or the load balancer
    // could be pointed at) leads to the admin or fleet port.
    for svc in objects.of_kind("Service") {
        let name = svc["metadata"]["name"].as_str().unwrap_or_default();
        let spec = &svc["spec"];
        if spec["clusterIP"].as_str() == Some("None") || !selects_pods(&spec["selector"], pod) {
            continue;
        }
        for p in seq(&spec["ports"]) {
            let target = pod.port(&p["targetPort"]);
            assert!(
                target != Some(want.admin) && target != Some(want.fleet),
                "{what}: Service {name} exposes port {target:?}"
            );
        }
    }
}

/// Whether a NetworkPolicy rule's `ports` cover `port` (no `ports`: all).
fn rule_covers(rule: &Value, pod: &Pod<'_>, port: u16) -> bool {
    let ports = seq(&rule["ports"]);
    ports.is_empty()
        || ports.iter().any(|p| {
            let Some(from) = pod.port(&p["port"]) else {
                return p["port"].is_null();
            };
            let to = p["endPort"].as_u64().map_or(from, |e| e as u16);
            (from..=to).contains(&port)
        })
}

fn check_network_policy(objects: &Objects, pod: &Pod<'_>, want: &Wanted) {
    let what = pod.what;
    let policies: Vec<&Value> = objects
        .of_kind("NetworkPolicy")
        .into_iter()
        .filter(|p| selects(&p["spec"]["podSelector"], pod.labels))
        .collect();
    let [policy] = policies.as_slice() else {
        panic!(
            "{what}: expected one NetworkPolicy for the pods, found {}",
            policies.len()
        );
    };
    let spec = &policy["spec"];
    let types: Vec<&str> = seq(&spec["policyTypes"])
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert!(
        types.contains(&"Ingress") && types.contains(&"Egress"),
        "{what}: {types:?}"
    );
    let ingress = seq(&spec["ingress"]);

    // Client ports: open (the Ingress controller, other clients).
    for port in [want.ws, want.grpc] {
        assert!(
            ingress
                .iter()
                .any(|r| seq(&r["from"]).is_empty() && rule_covers(r, pod, port)),
            "{what}: client port {port} is not open"
        );
    }
    // The fleet port: only the gateway's own pods, in its own namespace.
    let own_pods = |peer: &Value| {
        peer["podSelector"].is_mapping()
            && peer["namespaceSelector"].is_null()
            && peer["ipBlock"].is_null()
            && selects(&peer["podSelector"], pod.labels)
    };
    for r in ingress.iter().filter(|r| rule_covers(r, pod, want.fleet)) {
        let from = seq(&r["from"]);
        assert!(
            !from.is_empty() && from.iter().all(own_pods),
            "{what}: the fleet port {} is open to more than the gateway's pods: {r:?}",
            want.fleet
        );
    }
    assert!(
        ingress.iter().any(|r| rule_covers(r, pod, want.fleet)),
        "{what}: replicas cannot reach each other's fleet port"
    );
    // ...and the replicas may dial it (egress is restricted too).
    assert!(
        seq(&spec["egress"])
            .iter()
            .any(|r| { rule_covers(r, pod, want.fleet) && seq(&r["to"]).iter().any(own_pods) }),
        "{what}: egress to the other replicas' fleet port is not allowed"
    );
    // The admin port: only from a namespace chosen by name (monitoring).
    for r in ingress.iter().filter(|r| rule_covers(r, pod, want.admin)) {
        let from = seq(&r["from"]);
        assert!(
            !from.is_empty()
                && from.iter().all(|peer| {
                    peer["ipBlock"].is_null()
                        && peer["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"]
                            .is_string()
                }),
            "{what}: the admin port {} is open beyond the monitoring namespace: {r:?}",
            want.admin
        );
    }
}

fn check_disruption_budget(objects: &Objects, pod: &Pod<'_>) {
    let what = pod.what;
    let pdbs = objects.of_kind("PodDisruptionBudget");
    let [pdb] = pdbs.as_slice() else {
        panic!(
            "{what}: expected one PodDisruptionBudget, found {}",
            pdbs.len()
        );
    };
    assert_eq!(pdb["apiVersion"].as_str(), Some("policy/v1"));
    assert!(
        selects(&pdb["spec"]["selector"], pod.labels),
        "{what}: the PDB does not select the pods"
    );
    assert!(
        !pdb["spec"]["maxUnavailable"].is_null() || !pdb["spec"]["minAvailable"].is_null(),
        "{what}: the PDB sets no budget"
    );
}

/// The volume mounted at `dir` in `c`, by name.
fn mounted_at<'a>(c: &'a Value, dir: &Path) -> Option<&'a Value> {
    seq(&c["volumeMounts"])
        .iter()
        .find(|m| m["mountPath"].as_str().map(Path::new) == Some(dir))
}

fn check_files(objects: &Objects, pod: &Pod<'_>, config: &Config, want: &Wanted) {
    let what = pod.what;
    // The gateway is started with the path the image's CMD names...
    let args: Vec<String> = seq(&pod.gateway["args"])
        .iter()
        .map(|a| str_of(a, "args").to_owned())
        .collect();
    assert!(
        pod.gateway["command"].is_null(),
        "{what}: the image's ENTRYPOINT (tini) is kept"
    );
    assert_eq!(
        flag_value(&args, "--config").as_deref(),
        Some(want.config_path.as_str()),
        "{what}: --config differs from the Dockerfile's CMD"
    );
    // ...and that path is gateway.toml from the ConfigMap.
    let config_path = Path::new(&want.config_path);
    let mount = mounted_at(pod.gateway, config_path.parent().unwrap())
        .unwrap_or_else(|| panic!("{what}: nothing is mounted at {}", config_path.display()));
    let volume = pod.volume(str_of(&mount["name"], "mount name"));
    let cm_name = str_of(&volume["configMap"]["name"], "config volume's ConfigMap");
    let cm = objects.one("ConfigMap", cm_name);
    let key = config_path.file_name().unwrap().to_str().unwrap();
    assert_eq!(
        cm["data"][key].as_str(),
        Some(read(CONFIG).as_str()),
        "{what}: ConfigMap {cm_name} does not carry {CONFIG} as {key}"
    );

    // The files gateway.toml names come from Secrets mounted read-only.
    let fleet_key = config.fleet.key_file.as_deref().expect("fleet.key_file");
    let admin_token = config
        .server
        .admin_token_file
        .as_deref()
        .expect("admin_token_file");
    // ...and the TLS files, from cert-manager's Secrets (certificates.yaml).
    let fleet_tls = config.fleet.tls.as_ref().expect("[fleet.tls]");
    let admin_tls = config
        .server
        .admin_tls
        .as_ref()
        .expect("[server.admin_tls]");
    for file in [
        fleet_key,
        admin_token,
        &fleet_tls.cert_file,
        &fleet_tls.key_file,
        &fleet_tls.ca_file,
        &admin_tls.cert_file,
        &admin_tls.key_file,
    ] {
        let mount = mounted_at(pod.gateway, file.parent().unwrap())
            .unwrap_or_else(|| panic!("{what}: nothing is mounted at {}", file.display()));
        assert_eq!(
            mount["readOnly"].as_bool(),
            Some(true),
            "{what}: {}",
            file.display()
        );
        let volume = pod.volume(str_of(&mount["name"], "mount name"));
        let secret = &volume["secret"];
        assert!(
            secret["secretName"].is_string(),
            "{what}: {} is not from a Secret",
            file.display()
        );
        assert!(
            secret["items"].is_null(),
            "{what}: items would rename the Secret's keys"
        );
        assert_eq!(
            secret["defaultMode"].as_u64(),
            Some(0o400),
            "{what}: {} readable by its owner only",
            file.display()
        );
    }
}

fn check_tenant_roots(pod: &Pod<'_>, config: &Config, want: &Wanted) {
    let what = pod.what;
    let init = container(&pod.spec["initContainers"], INIT)
        .unwrap_or_else(|| panic!("{what}: no init container {INIT}"));
    assert_eq!(
        init["image"], pod.gateway["image"],
        "{what}: {INIT} runs the gateway's image"
    );
    // It reads the same gateway.toml (its last argument) from the same
    // volume; which tenants it prepares, and how, is run and checked by
    // tests/python/test_deploy.py.
    let args = seq(&init["args"]);
    assert_eq!(
        args.last().and_then(Value::as_str),
        Some(want.config_path.as_str()),
        "{what}: {INIT} reads another configuration"
    );
    let config_dir = Path::new(&want.config_path).parent().unwrap();
    let config_volume = mounted_at(pod.gateway, config_dir).map(|m| &m["name"]);
    assert!(config_volume.is_some(), "{what}: no configuration mounted");
    assert_eq!(
        mounted_at(init, config_dir).map(|m| &m["name"]),
        config_volume,
        "{what}: {INIT} mounts another configuration"
    );
    for (name, t) in &config.tenants {
        // The script needs both; gid defaults to the uid.
        assert!(
            t.uid.is_some(),
            "tenants.{name} has no uid: {INIT} cannot prepare its root"
        );
        let root = t
            .root
            .as_deref()
            .unwrap_or_else(|| panic!("tenants.{name} has no root"));
        // Its root lies on a volume both containers mount at the same place.
        let shared = seq(&init["volumeMounts"]).iter().any(|m| {
            let dir = Path::new(str_of(&m["mountPath"], "mountPath"));
            root.starts_with(dir)
                && root != dir
                && mounted_at(pod.gateway, dir).map(|g| &g["name"]) == Some(&m["name"])
        });
        assert!(
            shared,
            "{what}: tenants.{name}.root {} is not on a volume {INIT} and {GATEWAY} share",
            root.display()
        );
    }
}

/// A Kubernetes quantity of bytes (`24Gi`, `500M`, `1073741824`).
fn quantity_bytes(q: &str) -> u64 {
    let units: [(&str, u64); 8] = [
        ("Ki", 1 << 10),
        ("Mi", 1 << 20),
        ("Gi", 1 << 30),
        ("Ti", 1 << 40),
        ("k", 1_000),
        ("M", 1_000_000),
        ("G", 1_000_000_000),
        ("T", 1_000_000_000_000),
    ];
    let (digits, unit) = units
        .iter()
        .find_map(|(suffix, n)| q.strip_suffix(suffix).map(|d| (d, *n)))
        .unwrap_or((q, 1));
    digits
        .parse::<u64>()
        .unwrap_or_else(|_| panic!("`{q}` is not a whole quantity of bytes"))
        * unit
}

/// Guards `[images] store`: it must lie on a volume of its own that holds
/// the store's worst case (its bound plus, per pull in progress, a layer
/// downloading and the file that found the store full: docs/environments.md,
/// "Costs"). On the container's read-only root filesystem the first pull
/// fails; on a volume too small the kubelet evicts the pod and every session
/// on it; in memory every layer counts against the pod's memory.
fn check_image_store(pod: &Pod<'_>, config: &Config) {
    let what = pod.what;
    let images = config
        .images
        .validate()
        .unwrap_or_else(|e| panic!("[images]: {e:?}"));
    let need = images.max_store_bytes
        + images.max_concurrent_pulls as u64 * (images.max_layer_bytes + images.max_image_bytes);
    let mount = seq(&pod.gateway["volumeMounts"])
        .iter()
        .filter(|m| {
            images
                .store
                .starts_with(str_of(&m["mountPath"], "mountPath"))
        })
        .max_by_key(|m| str_of(&m["mountPath"], "mountPath").len())
        .unwrap_or_else(|| {
            panic!(
                "{what}: [images] store {} is on no volume",
                images.store.display()
            )
        });
    assert_ne!(
        mount["readOnly"].as_bool(),
        Some(true),
        "{what}: the image store is mounted read-only"
    );
    let name = str_of(&mount["name"], "mount name");
    let claimed = seq(&pod.sts["spec"]["volumeClaimTemplates"])
        .iter()
        .find(|c| c["metadata"]["name"].as_str() == Some(name));
    let size = match claimed {
        Some(claim) => {
            let modes = seq(&claim["spec"]["accessModes"]);
            assert!(
                modes.iter().all(|m| m.as_str() == Some("ReadWriteOnce")),
                "{what}: the image store's claim must be ReadWriteOnce (one gateway per store): {modes:?}"
            );
            str_of(
                &claim["spec"]["resources"]["requests"]["storage"],
                "the image store's claim size",
            )
        }
        None => {
            let dir = &pod.volume(name)["emptyDir"];
            assert!(
                dir.is_mapping(),
                "{what}: the image store's volume {name} is neither an emptyDir nor a claim"
            );
            assert_ne!(
                dir["medium"].as_str(),
                Some("Memory"),
                "{what}: the image store would be in the pod's memory"
            );
            str_of(&dir["sizeLimit"], "the image store's emptyDir sizeLimit")
        }
    };
    assert!(
        quantity_bytes(size) >= need,
        "{what}: the image store's volume ({size}) is smaller than [images]' worst case, {need} bytes"
    );
}
