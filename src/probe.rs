//! What this host allows: each isolation layer is probed at start by doing
//! it (a throwaway worker, a cgroup, a child under Landlock, under the
//! seccomp filter, under a spare uid), logged, and exported as
//! `exec_gateway_isolation_layer{layer}`. A layer that is `required` and
//! fails stops the gateway (fail closed).

use crate::config::{ConfigError, LayerPolicy, Network, Settings};
use crate::isolation::namespace::NamespaceSpec;
use crate::isolation::sandbox::{SandboxSpec, probe};
use crate::isolation::{Layers, cgroup};
use crate::metrics::{LayerLabel, Metrics};
use crate::worker::{WorkerLaunch, WorkerPool};

/// What a refused start says when the network layer cannot be had.
const NETWORK_HINT: &str = " (without it every tenant would share the host's network: its \
    loopback, the gateway's listeners, the admin endpoint; install slirp4netns and nftables, \
    or write [isolation] network = \"off\" to accept that)";

/// Probe one layer: `Ok(true)` when active.
fn probe_layer(
    name: &str,
    policy: LayerPolicy,
    metrics: &Metrics,
    probe: impl FnOnce() -> Result<(), String>,
) -> Result<bool, ConfigError> {
    let gauge = metrics
        .isolation_layer
        .get_or_create(&LayerLabel {
            layer: name.to_owned(),
        })
        .clone();
    if policy == LayerPolicy::Off {
        gauge.set(0);
        return Ok(false);
    }
    match probe() {
        Ok(()) => {
            tracing::info!(layer = name, "isolation layer active");
            gauge.set(1);
            Ok(true)
        }
        Err(reason) if policy == LayerPolicy::Required => Err(ConfigError(format!(
            "isolation layer `{name}` is required but unavailable: {reason}{}",
            if name == "network" { NETWORK_HINT } else { "" }
        ))),
        Err(reason) => {
            tracing::warn!(layer = name, %reason, "isolation layer unavailable; continuing without it");
            gauge.set(0);
            Ok(false)
        }
    }
}

/// Probe every layer of `[isolation]`. Also clears what dead gateways left
/// in the cgroup tree.
pub fn layers(settings: &Settings, metrics: &Metrics) -> Result<Layers, ConfigError> {
    let iso = settings.isolation;
    let cgroups = probe_layer("cgroups", iso.cgroups, metrics, || {
        cgroup::probe(iso.cgroup_version)?;
        tracing::info!(hierarchy = %cgroup::describe(), "cgroups");
        let killed = cgroup::cleanup_leftovers();
        if killed > 0 {
            tracing::warn!(killed, "killed processes left by an earlier gateway");
        }
        Ok(())
    })?;
    let landlock = probe_layer("landlock", iso.landlock, metrics, || {
        probe(SandboxSpec {
            landlock_rw: Some(Vec::new()),
            ..SandboxSpec::default()
        })
    })?;
    let seccomp = probe_layer("seccomp", iso.seccomp, metrics, || {
        probe(SandboxSpec {
            seccomp: true,
            ..SandboxSpec::default()
        })
    })?;
    let workers = probe_layer("workers", iso.workers, metrics, || {
        let exe = std::env::current_exe().map_err(|e| e.to_string())?;
        let pool = WorkerPool::start(WorkerLaunch {
            tenant: "probe".to_owned(),
            root: None,
            exe,
            sandbox: None,
            cgroups: Vec::new(),
            seal_children: false,
            min: 1,
            max: 1,
            metrics: None,
            gate: Default::default(),
        })
        .map_err(|e| format!("a probe worker could not start: {e}"))?;
        pool.kill_all();
        Ok(())
    })?;
    // Only worth probing (and reporting) when some tenant has a uid
    // (templated tenants get one where the gateway runs as root).
    let wanted = settings.tenants.values().any(|t| t.uid.is_some())
        || (settings.template.is_some() && nix::unistd::geteuid().is_root());
    let uid = wanted
        && probe_layer("uid", iso.uid, metrics, || {
            probe(SandboxSpec {
                uid: Some((65534, 65534)),
                ..SandboxSpec::default()
            })
        })?;
    let namespaces = probe_layer("namespaces", iso.namespaces, metrics, || {
        let dir = std::env::temp_dir().join(format!("exec-gateway-probe-{}", std::process::id()));
        std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
        let result = probe(SandboxSpec {
            namespace: Some(NamespaceSpec {
                tmp: Some(dir.clone()),
                root: std::path::PathBuf::from("/"),
                net: crate::isolation::namespace::NetSpec::Loopback,
                hide_dirs: Vec::new(),
                hide_files: Vec::new(),
                private_devpts: true,
                pid: true,
                idmap: None,
                cover: None,
                image: None,
                workspace: None,
            }),
            ..SandboxSpec::default()
        });
        let _ = std::fs::remove_dir(&dir);
        result
    })?;
    // Only worth probing when some tenant could use it.
    let wanted = settings
        .tenants
        .values()
        .chain(settings.template.as_ref().map(|t| &t.example))
        .any(|t| matches!(t.network, None | Some(Network::Isolated)));
    let network = wanted
        && probe_layer("network", iso.network, metrics, || {
            if !namespaces {
                return Err("needs the namespaces layer".to_owned());
            }
            let dir = crate::config::state_dir()
                .map_err(|e| e.to_string())?
                .join("net");
            crate::isolation::egress::probe(&dir).map(|_| ())
        })?;
    // The host's network only where the operator let the layer go: `off`,
    // or `optional` whose probe failed (said above). Unprobed (no tenant
    // wanted it), a tenant added later that names no network is refused.
    let host_network = iso.network == LayerPolicy::Off || (wanted && !network);
    if let Some(t) = &settings.template {
        t.make_roots()?;
    }
    let roots: Vec<&std::path::Path> = settings
        .tenants
        .values()
        .filter_map(|t| t.root.as_deref())
        .chain(settings.template.as_ref().map(|t| t.roots.as_path()))
        .collect();
    let disk = !roots.is_empty()
        && probe_layer("disk", iso.disk, metrics, || {
            roots
                .iter()
                .try_for_each(|r| crate::isolation::disk::probe_project_quota(r))
        })?;
    Ok(Layers {
        disk,
        network,
        host_network,
        workers,
        cgroups,
        landlock,
        seccomp,
        uid,
        namespaces,
    })
}
