//! Tenants: each has a backend where its sessions run (its filesystem root,
//! process slots, retained-output budget, cgroup, sandbox and workers), a
//! rate limiter, an in-flight semaphore and a session count. Tenants are
//! fixed by configuration, so the set (and every per-tenant map and metric
//! label) is bounded.

use std::collections::BTreeMap;
use std::num::NonZeroU32;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};
use tokio::sync::Semaphore;

use crate::backend::Backend;
use crate::backend::local::{EnvironmentSpec, LocalBackend, Runner};
use crate::backend::remote::RemoteBackend;
use crate::config::{ConfigError, Network, Settings, TenantSettings};
use crate::fs::FsRoot;
use crate::isolation::Layers;
use crate::isolation::cgroup::TenantCgroup;
use crate::isolation::disk::RootQuota;
use crate::isolation::egress::{NetTools, TenantNet};
use crate::isolation::idmap::IdMap;
use crate::isolation::namespace::{NamespaceSpec, NetSpec};
use crate::isolation::reaper::Reaper;
use crate::isolation::sandbox::{Sandbox, SandboxSpec};
use crate::metrics::{Metrics, TenantMetrics};
use crate::outbound::ByteBudget;
use crate::process::ExecSettings;
use crate::registry::Registry;
use crate::worker::{WorkerLaunch, WorkerPool};

/// One configured tenant.
pub struct Tenant {
    pub name: Arc<str>,
    pub settings: TenantSettings,
    /// Where the tenant's sessions run.
    pub backend: Arc<dyn Backend>,
    /// Its executor pool, when it has one (`pool`; `placement` decides).
    pub remote: Option<Arc<RemoteBackend>>,
    pub limiter: DefaultDirectRateLimiter,
    /// Requests in flight; a permit is held for the duration of a call.
    pub in_flight: Arc<Semaphore>,
    /// Sessions currently registered for this tenant.
    pub sessions: AtomicUsize,
    /// Bytes held for the tenant's clients (`max_outbound_bytes`).
    pub outbound: Arc<ByteBudget>,
    /// Bytes held of what the tenant's clients send (`max_inbound_bytes`).
    pub inbound: Arc<ByteBudget>,
    /// Authenticated connections (`max_connections`).
    pub connections: Arc<Semaphore>,
    /// Open gRPC server streams (`max_streams`).
    pub streams: Arc<Semaphore>,
    /// Authenticated gRPC connections, each holding its receive window in
    /// `inbound`: windows may take half the budget, the rest stays for
    /// messages.
    pub grpc_windows: Arc<Semaphore>,
    pub metrics: TenantMetrics,
    /// Its private `/tmp` (a tmpfs), where it has one.
    pub tmp: Option<PathBuf>,
    /// The project quota on its root (the disk layer).
    pub root_quota: Option<RootQuota>,
}

impl Tenant {
    /// Count a new session, or refuse it with the sessions quota error.
    pub fn claim_session(&self) -> Result<(), crate::error::GatewayError> {
        if self.try_add_session() {
            Ok(())
        } else {
            Err(crate::error::GatewayError::QuotaExceeded {
                quota: "sessions",
                limit: self.settings.max_sessions as u64,
                retry_after_ms: None,
            })
        }
    }

    /// Count a new session, or refuse with the sessions quota.
    pub fn try_add_session(&self) -> bool {
        let max = self.settings.max_sessions;
        self.sessions
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < max).then_some(n + 1)
            })
            .is_ok()
    }

    pub fn remove_session(&self) {
        let _ = self
            .sessions
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1));
    }
}

/// All tenants, by name.
pub struct Tenants {
    by_name: BTreeMap<String, Arc<Tenant>>,
}

impl Tenants {
    pub fn new(
        settings: &Settings,
        reaper: Option<Arc<Reaper>>,
        metrics: &Metrics,
        global_slots: Arc<Semaphore>,
        layers: Layers,
        executors: Option<&Arc<Registry>>,
    ) -> Result<Tenants, ConfigError> {
        let hidden = settings.secret_files.clone();
        let hide = Hide {
            dirs: settings
                .tenants
                .values()
                .filter_map(|t| t.root.clone())
                .chain(crate::config::state_dir().ok())
                .collect(),
            // `hidden` names each key as written and as resolved: bind over
            // the resolved file once (a mount follows the written symlink
            // to the same file).
            files: {
                let mut files: Vec<PathBuf> = hidden
                    .iter()
                    .filter_map(|p| p.canonicalize().ok())
                    .filter(|p| p.is_file())
                    .collect();
                files.sort();
                files.dedup();
                files
            },
        };
        if nix::unistd::geteuid().is_root() && !layers.uid {
            return Err(ConfigError(
                "the gateway runs as root but cannot give tenants their own uids (setuid failed: see the uid probe above); tenant processes would run as uid 0".to_owned(),
            ));
        }
        if layers.cgroups
            && let (Some(r), Some(dir)) = (&reaper, crate::isolation::cgroup::v2_instance())
        {
            r.watch_cgroup(&dir);
        }
        let mut by_name = BTreeMap::new();
        for (name, t) in &settings.tenants {
            let unshared;
            let (t, unshared_dir) = match unshared_tmp(name, t, layers)? {
                Some((adjusted, dir)) => {
                    unshared = adjusted;
                    (&unshared, Some(dir))
                }
                None => (t, None),
            };
            let (idmap, tree) = root_idmap(name, t, layers)?.unzip();
            let fs = match (&t.root, tree) {
                (None, _) => FsRoot::host(),
                (Some(root), Some(tree)) => FsRoot::confined_at(root, tree),
                (Some(root), None) => FsRoot::confined(root).map_err(|e| {
                    ConfigError(format!("tenants.{name}.root {}: {e}", root.display()))
                })?,
            }
            .with_creds(if layers.uid { t.uid } else { None });
            let tm = metrics.tenant(name);
            let mut exec = ExecSettings::new(t.max_processes, t.base_env.clone());
            exec.reaper = reaper.clone();
            exec.exited_retention = settings.exited_retention;
            exec.global_slots = Some(global_slots.clone());
            exec.max_retained_bytes = t.max_retained_output_bytes;
            exec.metrics = tm.clone();
            exec.subscriber_timeout = settings.slow_client_timeout;
            let net = if layers.network && effective_network(t, layers) == Network::Isolated {
                let tools = NetTools::find().map_err(ConfigError)?;
                let dir = crate::config::state_dir()?.join("net");
                let net = TenantNet::create(name, &t.egress, &tools, &dir, reaper.clone())
                    .map_err(|e| ConfigError(format!("tenants.{name}: network: {e}")))?;
                tracing::info!(tenant = name.as_str(), egress = %t.egress.describe(), "tenant network");
                Some(net)
            } else {
                None
            };
            let spec = sandbox_spec(name, t, layers, &hidden, &hide, idmap, net)?;
            let tmp = spec
                .namespace
                .as_ref()
                .and_then(|n| n.tmp.clone())
                .or(unshared_dir);
            if let (Some(r), Some(dir)) = (&reaper, &tmp) {
                r.watch_mount(dir);
            }
            let root_quota = match (&t.root, layers.disk) {
                (Some(root), true) => Some(
                    RootQuota::apply(root, project_id(name, t), t.max_disk_bytes).map_err(|e| {
                        ConfigError(format!(
                            "tenants.{name}: project quota on {}: {e}",
                            root.display()
                        ))
                    })?,
                ),
                _ => None,
            };
            let cgroup = if layers.cgroups {
                let mut cg = TenantCgroup::create(name, &t.cgroup_limits)
                    .map_err(|e| ConfigError(format!("tenants.{name}: cgroup: {e}")))?;
                if layers.workers {
                    cg.set_owner(spec.uid)
                        .map_err(|e| ConfigError(format!("tenants.{name}: cgroup: {e}")))?;
                }
                Some(Arc::new(cg))
            } else {
                None
            };
            let runner = if layers.workers {
                Runner::Workers(start_workers(name, t, spec, cgroup.as_deref(), tm.clone())?)
            } else {
                // Always a sandbox: even with every layer off, capabilities go.
                let sb = Sandbox::new(spec)
                    .map_err(|e| ConfigError(format!("tenants.{name}: sandbox: {e}")))?;
                Runner::Here(Some(Arc::new(sb)))
            };
            exec.spawned_in_worker = layers.workers;
            exec.cgroup = cgroup;
            let root = fs.path().to_path_buf();
            let env_var = |k: &str, default: &str| {
                t.base_env
                    .get(k)
                    .cloned()
                    .unwrap_or_else(|| default.to_owned())
            };
            let environment = EnvironmentSpec {
                tenant: name.clone(),
                home: env_var("HOME", &root.display().to_string()),
                tmp: env_var("TMPDIR", "/tmp"),
                shell: env_var("SHELL", "/bin/sh"),
                root,
            };
            let backend = LocalBackend::new(
                Arc::new(fs),
                Arc::new(exec),
                runner,
                environment,
                t.max_read_file_bytes,
                t.max_open_files,
            );
            let rate = NonZeroU32::new(t.requests_per_second).unwrap_or(NonZeroU32::MIN);
            let burst = NonZeroU32::new(t.burst).unwrap_or(rate);
            by_name.insert(
                name.clone(),
                Arc::new(Tenant {
                    name: Arc::from(name.as_str()),
                    settings: t.clone(),
                    backend: Arc::new(backend),
                    remote: match (&t.pool, executors) {
                        (Some(pool), Some(registry)) => {
                            let pool = registry.pool(pool).ok_or_else(|| {
                                ConfigError(format!("tenants.{name}.pool: no such pool"))
                            })?;
                            Some(Arc::new(RemoteBackend::new(
                                pool.clone(),
                                t.pool_labels.clone(),
                                registry.settings.open_timeout,
                            )))
                        }
                        _ => None,
                    },
                    limiter: RateLimiter::direct(Quota::per_second(rate).allow_burst(burst)),
                    in_flight: Arc::new(Semaphore::new(t.max_in_flight)),
                    sessions: AtomicUsize::new(0),
                    outbound: ByteBudget::new(
                        t.max_outbound_bytes,
                        tm.outbound_bytes.clone(),
                        tm.outbound_bytes_peak.clone(),
                        tm.outbound_waiting.clone(),
                    ),
                    inbound: ByteBudget::new(
                        t.max_inbound_bytes,
                        tm.inbound_bytes.clone(),
                        tm.inbound_bytes_peak.clone(),
                        tm.inbound_waiting.clone(),
                    ),
                    connections: Arc::new(Semaphore::new(t.max_connections)),
                    streams: Arc::new(Semaphore::new(t.max_streams)),
                    grpc_windows: Arc::new(Semaphore::new(grpc_window_slots(t))),
                    metrics: tm,
                    tmp,
                    root_quota,
                }),
            );
        }
        Ok(Tenants { by_name })
    }

    pub fn get(&self, name: &str) -> Option<&Arc<Tenant>> {
        self.by_name.get(name)
    }

    /// Stop every tenant's backend (shutdown; their sessions are gone) and
    /// detach their `/tmp`.
    pub fn retire(&self) {
        for t in self.by_name.values() {
            t.backend.retire();
            if let Some(tmp) = &t.tmp {
                crate::isolation::disk::unmount(tmp);
            }
        }
    }

    /// Read each tenant's disk use into its gauges (at a scrape: statfs on
    /// a tmpfs and one quota query per tenant).
    pub fn refresh_disk_metrics(&self) {
        for t in self.by_name.values() {
            if let Some(Ok(n)) = t.tmp.as_deref().map(crate::isolation::disk::used_bytes) {
                t.metrics
                    .tmp_bytes
                    .set(i64::try_from(n).unwrap_or(i64::MAX));
            }
            if let Some(Ok(n)) = t.root_quota.as_ref().map(RootQuota::used_bytes) {
                t.metrics
                    .disk_bytes
                    .set(i64::try_from(n).unwrap_or(i64::MAX));
            }
        }
    }
}

/// What confines a tenant's processes, given the active layers: Landlock
/// read-write in the root (or everything for an unconfined tenant), its
/// `TMPDIR` and the configured extras.
/// What a confined tenant's mount namespace covers up.
struct Hide {
    /// Every tenant's root (each tenant's own is left out for it) and the
    /// state directory (every private /tmp, the embedded key).
    dirs: Vec<PathBuf>,
    /// The key files.
    files: Vec<PathBuf>,
}

/// The network a tenant gets: as configured, else its own where the
/// network layer is active.
pub fn effective_network(t: &TenantSettings, layers: Layers) -> Network {
    match t.network {
        Some(n) => n,
        None if layers.network => Network::Isolated,
        None => Network::Host,
    }
}

#[allow(clippy::too_many_arguments)]
fn sandbox_spec(
    name: &str,
    t: &TenantSettings,
    layers: Layers,
    hidden: &[PathBuf],
    hide: &Hide,
    idmap: Option<IdMap>,
    net: Option<Arc<TenantNet>>,
) -> Result<SandboxSpec, ConfigError> {
    let uid = if layers.uid { t.uid } else { None };
    let network = effective_network(t, layers);
    if network == Network::None && !layers.namespaces {
        return Err(ConfigError(format!(
            "tenants.{name}.network = \"none\" needs the namespaces layer, which is off or unavailable on this host"
        )));
    }
    let net = match (network, net) {
        (Network::Host, _) => NetSpec::Host,
        (Network::None, _) => NetSpec::Loopback,
        (Network::Isolated, Some(net)) => NetSpec::Joined(net),
        (Network::Isolated, None) => {
            return Err(ConfigError(format!(
                "tenants.{name}.network = \"isolated\" needs the network layer, which is off or unavailable on this host (see the network probe above)"
            )));
        }
    };
    // A confined tenant gets its own /tmp (a root of / means unconfined).
    let private_tmp = match (&t.root, layers.namespaces) {
        (Some(root), true) => Some(private_tmp(name, uid, Some(root), t.max_tmp_bytes)?),
        _ => None,
    };
    let cover = match (&t.root, uid) {
        (Some(root), Some(ids)) => unsearchable_ancestor(root, ids),
        _ => None,
    }
    .or_else(|| shared_parent(t, &hide.dirs));
    let namespace = (layers.namespaces && (t.root.is_some() || net != NetSpec::Host)).then(|| {
        NamespaceSpec {
            tmp: private_tmp.clone(),
            root: t.root.clone().unwrap_or_else(|| PathBuf::from("/")),
            net,
            // Only a confined tenant is kept from the others' roots
            // and the gateway's state (a root of / sees the host).
            // What its private /tmp or its cover already hides needs
            // no mount of its own (each would name another tenant's
            // root in its mountinfo).
            hide_dirs: if t.root.is_some() {
                hide.dirs
                    .iter()
                    .filter(|d| Some(d.as_path()) != t.root.as_deref())
                    .filter(|d| !(private_tmp.is_some() && d.starts_with("/tmp")))
                    .filter(|d| !cover.as_ref().is_some_and(|c| d.starts_with(c)))
                    .cloned()
                    .collect()
            } else {
                Vec::new()
            },
            hide_files: hide.files.clone(),
            // Workers enter once; per child (workers off) every spawn
            // would add Landlock rules to the tenant's ruleset.
            private_devpts: t.root.is_some() && layers.workers,
            // The worker is the namespace's init; with workers off,
            // every child would need a parent process of its own.
            pid: t.root.is_some() && layers.workers,
            idmap,
            cover,
        }
    });
    let landlock_rw = layers.landlock.then(|| {
        let root = t.root.clone().unwrap_or_else(|| PathBuf::from("/"));
        // Where TMPDIR lies under /tmp, Landlock grants the private
        // directory mounted there (rules follow inodes, not paths).
        let tmp = t.base_env.get("TMPDIR").map(PathBuf::from).map(|p| {
            match (&private_tmp, p.strip_prefix("/tmp")) {
                (Some(private), Ok(rest)) => private.join(rest),
                _ => p,
            }
        });
        std::iter::once(root)
            .chain(tmp)
            .chain(private_tmp.clone())
            .chain(t.landlock_write.iter().cloned())
            .collect()
    });
    // The tenant's resolv.conf, bound over the host's: Landlock grants
    // /etc entry by entry (inodes), and this one is not the host's.
    let mut landlock_ro = t.landlock_read.clone();
    if let Some(NamespaceSpec {
        net: NetSpec::Joined(n),
        ..
    }) = &namespace
    {
        landlock_ro.push(n.resolv_conf().to_path_buf());
    }
    Ok(SandboxSpec {
        uid,
        landlock_rw,
        landlock_ro,
        seccomp: layers.seccomp,
        hidden: hidden.to_vec(),
        namespace,
    })
}

/// The idmapping of a tenant's root: a tenant whose uid was allocated
/// (none configured) works in its root as that root's owner. Needs the
/// namespaces layer, where its processes see the idmapped root; without
/// it, and where the root's filesystem cannot be idmapped, the root keeps
/// its ownership and the tenant writes only what its uid may.
///
/// Returns the mapping and the gateway's own idmapped view of the root. A
/// root whose filesystem cannot be idmapped (tmpfs before Linux 6.3, 9p,
/// some FUSE) is refused: its tenant could not write it.
fn root_idmap(
    name: &str,
    t: &TenantSettings,
    layers: Layers,
) -> Result<Option<(IdMap, std::os::fd::OwnedFd)>, ConfigError> {
    use std::os::unix::fs::MetadataExt as _;
    let (Some(root), Some((uid, gid))) = (t.root.as_ref(), t.uid) else {
        return Ok(None);
    };
    if !t.uid_allocated || !layers.uid {
        return Ok(None);
    }
    let Ok(meta) = std::fs::metadata(root) else {
        return Ok(None);
    };
    if meta.uid() == uid && meta.gid() == gid {
        return Ok(None);
    }
    let map = IdMap {
        owner_uid: meta.uid(),
        owner_gid: meta.gid(),
        uid,
        gid,
    };
    if !layers.namespaces {
        tracing::warn!(tenant = name, root = %root.display(), owner = meta.uid(), uid,
            "the namespaces layer is off: the tenant's processes run as its allocated uid and cannot write its root unless its permissions allow; set tenants.NAME.uid");
        return Ok(None);
    }
    match crate::isolation::idmap::idmapped_tree(root, map) {
        Ok(tree) => Ok(Some((map, tree))),
        Err(e) => Err(ConfigError(format!(
            "tenants.{name}.root {}: cannot be idmapped ({e}{}), so the tenant's processes (uid {uid}) could not write it (owner {}): set tenants.{name}.uid, give the root to an unused uid, or put it on a filesystem that supports idmapped mounts (ext4, xfs, btrfs; tmpfs from Linux 6.3)",
            root.display(),
            crate::isolation::idmap::why_not(root),
            meta.uid()
        ))),
    }
}

/// The topmost ancestor of `root` (below `/`, not `/tmp`'s subtree) that
/// `uid` cannot search, such as `/root` (mode 0700): the tenant's namespace
/// covers it with an empty tmpfs holding only the way down to the root.
fn unsearchable_ancestor(root: &std::path::Path, (uid, gid): (u32, u32)) -> Option<PathBuf> {
    use std::os::unix::fs::MetadataExt as _;
    if root.starts_with("/tmp") {
        return None;
    }
    let searchable = |m: &std::fs::Metadata| {
        let mode = m.mode();
        if m.uid() == uid {
            mode & 0o100 != 0
        } else if m.gid() == gid {
            mode & 0o010 != 0
        } else {
            mode & 0o001 != 0
        }
    };
    root.ancestors()
        .skip(1)
        .filter(|a| a.parent().is_some())
        .filter(|a| std::fs::metadata(a).is_ok_and(|m| !searchable(&m)))
        .last()
        .map(|a| a.to_path_buf())
}

/// The parent of `t`'s root when it also holds another hidden directory
/// (other tenants' roots side by side, as under `/srv/tenants`): covered
/// by one empty tmpfs holding only the way down to the root, the others
/// are gone without a mount each. Not `/`, not under `/tmp` (the private
/// `/tmp` hides those), and not where the tenant was granted other paths.
fn shared_parent(t: &TenantSettings, hidden: &[PathBuf]) -> Option<PathBuf> {
    let root = t.root.as_deref()?;
    let parent = root.parent()?;
    if parent == std::path::Path::new("/") || root.starts_with("/tmp") {
        return None;
    }
    let shares = hidden
        .iter()
        .any(|d| d.as_path() != root && d.starts_with(parent));
    let granted = t
        .landlock_read
        .iter()
        .chain(&t.landlock_write)
        .any(|p| p.starts_with(parent) && !p.starts_with(root));
    (shares && !granted).then(|| parent.to_path_buf())
}

/// A root under /tmp is bound back at its path inside the private /tmp,
/// whose mount point the namespace setup walks without following links
/// (and fails on anything but directories). Anything else a tenant left
/// on that path is moved aside at start, so a planted symlink cannot lock
/// the tenant out of new workers for good.
fn clear_mount_point(private: &std::path::Path, root: &std::path::Path) {
    let Ok(rel) = root.strip_prefix("/tmp") else {
        return;
    };
    let mut at = private.to_path_buf();
    for c in rel.components() {
        at.push(c);
        match std::fs::symlink_metadata(&at) {
            Ok(m) if m.is_dir() => continue,
            Ok(_) => {
                let aside = at.with_file_name(format!(
                    ".exec-gateway-moved-{}-{}",
                    std::process::id(),
                    at.file_name()
                        .map(|n| n.to_string_lossy().into_owned())
                        .unwrap_or_default()
                ));
                if let Err(e) = std::fs::rename(&at, &aside) {
                    tracing::warn!(path = %at.display(), error = %e, "cannot clear a tenant's mount point");
                }
                return;
            }
            Err(_) => return,
        }
    }
}

/// Without the namespaces layer a confined tenant has no `/tmp` of its
/// own, and the host's holds other tenants' roots and the gateway's files,
/// so it is not granted: the tenant's `TMPDIR`, where it lies under `/tmp`
/// (the default), becomes its directory in the state dir (a tmpfs of
/// `max_tmp_bytes` where the gateway may mount one), which Landlock grants
/// instead. `None`: nothing to change.
fn unshared_tmp(
    name: &str,
    t: &TenantSettings,
    layers: Layers,
) -> Result<Option<(TenantSettings, PathBuf)>, ConfigError> {
    let tmpdir = PathBuf::from(t.base_env.get("TMPDIR").map_or("/tmp", String::as_str));
    let Ok(rest) = tmpdir.strip_prefix("/tmp") else {
        return Ok(None);
    };
    if layers.namespaces || t.root.is_none() {
        return Ok(None);
    }
    // Rewritten by its text: a `..` would lead out of the tenant's
    // directory, and Landlock would grant wherever it leads.
    if rest
        .components()
        .any(|c| !matches!(c, std::path::Component::Normal(_)))
    {
        return Err(ConfigError(format!(
            "tenants.{name}.base_env.TMPDIR {}: without the namespaces layer it is moved to the tenant's own directory, and may not contain `..`",
            tmpdir.display()
        )));
    }
    let uid = if layers.uid { t.uid } else { None };
    let dir = own_tmp_dir(name, uid)?;
    // The tenant reaches it by its host path: the directories above may
    // be passed through (0711), not listed; what else is in them is the
    // gateway's (0600, and never granted by Landlock).
    let state = crate::config::state_dir()?;
    for d in [
        state.clone(),
        state.join("tenants"),
        state.join("tenants").join(name),
    ] {
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o711))
            .map_err(|e| ConfigError(format!("tenants.{name}: {}: {e}", d.display())))?;
    }
    // Above the state directory (`XDG_STATE_HOME`, `/var/lib`) is the
    // operator's: say so where the tenant cannot pass.
    if let Some(closed) = state.ancestors().skip(1).find(|a| {
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::metadata(a).is_ok_and(|m| m.permissions().mode() & 0o001 == 0)
    }) {
        tracing::warn!(tenant = name, dir = %closed.display(),
            "the namespaces layer is off and the tenant's TMPDIR lies below a directory others cannot pass: it cannot use it; make that directory passable (0711) or set XDG_STATE_HOME elsewhere");
    }
    if let Err(e) = crate::isolation::disk::mount_tmp(&dir, t.max_tmp_bytes, uid) {
        tracing::warn!(tenant = name, dir = %dir.display(), error = %e,
            "the namespaces layer is off and no tmpfs could be mounted: the tenant's TMPDIR is a plain directory, max_tmp_bytes not enforced");
    }
    let mut adjusted = t.clone();
    adjusted
        .base_env
        .insert("TMPDIR".to_owned(), dir.join(rest).display().to_string());
    Ok(Some((adjusted, dir)))
}

/// `<state dir>/tenants/NAME/tmp`, mode 0700, owned by the tenant's uid
/// when it has one.
fn own_tmp_dir(name: &str, uid: Option<(u32, u32)>) -> Result<PathBuf, ConfigError> {
    use std::os::unix::fs::DirBuilderExt as _;
    let err = |e: std::io::Error, p: &std::path::Path| {
        ConfigError(format!("tenants.{name}: private /tmp {}: {e}", p.display()))
    };
    let parent = crate::config::state_dir()?.join("tenants").join(name);
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&parent)
        .map_err(|e| err(e, &parent))?;
    let dir = parent.join("tmp");
    match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(err(e, &dir)),
    }
    if let Some((u, g)) = uid {
        std::os::unix::fs::chown(&dir, Some(u), Some(g)).map_err(|e| err(e, &dir))?;
    }
    Ok(dir)
}

/// The host directory a confined tenant sees as `/tmp`:
/// `<state dir>/tenants/NAME/tmp`, owned by the tenant's uid when it has
/// one, mode 0700; it persists across restarts like a host's /tmp.
fn private_tmp(
    name: &str,
    uid: Option<(u32, u32)>,
    root: Option<&std::path::Path>,
    bytes: u64,
) -> Result<PathBuf, ConfigError> {
    let err = |e: std::io::Error, p: &std::path::Path| {
        ConfigError(format!("tenants.{name}: private /tmp {}: {e}", p.display()))
    };
    let dir = own_tmp_dir(name, uid)?;
    // A tmpfs of its size: a full /tmp is the tenant's ENOSPC, not the
    // state directory's filesystem filling for everyone.
    crate::isolation::disk::mount_tmp(&dir, bytes, uid).map_err(|e| err(e, &dir))?;
    if let Some(root) = root {
        clear_mount_point(&dir, root);
    }
    Ok(dir)
}

/// How many gRPC connections' receive windows half the tenant's inbound
/// budget holds (at least one).
pub fn grpc_window_slots(t: &TenantSettings) -> usize {
    let window = crate::config::GRPC_RECEIVE_WINDOW_BYTES as usize;
    (t.max_inbound_bytes / 2 / window).max(1)
}

/// The project id of a tenant's root quota: its uid where it has one
/// (unique among tenants, stable across restarts and replicas), else a
/// stable hash of its name above the uid range.
fn project_id(name: &str, t: &TenantSettings) -> u32 {
    use sha2::Digest as _;
    if let Some((uid, _)) = t.uid {
        return uid;
    }
    let h = sha2::Sha256::digest(name.as_bytes());
    let n = u32::from_be_bytes([h[0], h[1], h[2], h[3]]);
    (1 << 20) + n % ((1 << 31) - (1 << 20))
}

/// Start a tenant's worker pool: each worker joins the tenant's cgroups and
/// takes its sandbox, which additionally reaches the tenant's per-process
/// cgroups (to move children in) and the gateway binary (to exec it).
fn start_workers(
    name: &str,
    t: &TenantSettings,
    mut spec: SandboxSpec,
    cgroup: Option<&TenantCgroup>,
    metrics: TenantMetrics,
) -> Result<Arc<WorkerPool>, ConfigError> {
    let err = |e: String| ConfigError(format!("tenants.{name}: workers: {e}"));
    let exe = std::env::current_exe().map_err(|e| err(e.to_string()))?;
    if let (Some(rw), Some(cg)) = (spec.landlock_rw.as_mut(), cgroup) {
        rw.push(cg.membership_dir());
    }
    if spec.landlock_rw.is_some() {
        spec.landlock_ro.push(exe.clone());
    }
    let sandbox = Some(Arc::new(Sandbox::new(spec).map_err(err)?));
    let cgroups = match cgroup {
        Some(cg) => cg.tenant_procs().map_err(|e| err(e.to_string()))?,
        None => Vec::new(),
    };
    WorkerPool::start(WorkerLaunch {
        tenant: name.to_owned(),
        root: t.root.clone(),
        exe,
        sandbox,
        cgroups,
        min: t.workers_min,
        max: t.workers_max,
        metrics: Some(metrics),
    })
    .map_err(|e| err(e.to_string()))
}
