//! Activating a tenant: its root (made on first use for a templated one),
//! uid, private `/tmp`, network, project quota, cgroup, sandbox, workers
//! and backend. Blocking work (forks, mounts, cgroupfs): run off the async
//! threads.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Semaphore;

use super::confine::{
    Hide, images_possible, root_idmap, sandbox_spec, unshared_tmp, with_image, with_workspace,
};
use super::{Tenant, effective_network};
use crate::backend::local::{EnvironmentSpec, LocalBackend, Runner};
use crate::backend::remote::RemoteBackend;
use crate::config::{ConfigError, Network, TenantSettings, UidLedger};
use crate::fs::FsRoot;
use crate::isolation::Layers;
use crate::isolation::cgroup::TenantCgroup;
use crate::isolation::disk::RootQuota;
use crate::isolation::egress::{NetTools, TenantNet};
use crate::isolation::reaper::Reaper;
use crate::isolation::sandbox::{Sandbox, SandboxSpec};
use crate::metrics::{Metrics, TenantMetrics};
use crate::process::ExecSettings;
use crate::registry::Registry;
use crate::worker::{WorkerLaunch, WorkerPool};

/// What every activation needs from the gateway.
pub(super) struct BuildContext {
    pub reaper: Option<Arc<Reaper>>,
    pub metrics: Arc<Metrics>,
    pub global_slots: Arc<Semaphore>,
    pub layers: Layers,
    pub executors: Option<Arc<Registry>>,
    pub secret_files: Vec<PathBuf>,
    pub exited_retention: Option<Duration>,
    pub slow_client_timeout: Duration,
    /// `[images]` as at start (a change needs a restart).
    pub images: crate::config::ImagesSettings,
    /// The image store, opened when a tenant first needs it.
    pub store: parking_lot::Mutex<Option<Arc<crate::image::ImageStore>>>,
    /// `[snapshots]` as at start.
    pub snapshots: crate::config::SnapshotsSettings,
    /// The snapshot store, opened when a tenant that can fork is first
    /// activated.
    pub snapshot_store: parking_lot::Mutex<Option<Arc<crate::snapshot::SnapshotStore>>>,
}

impl BuildContext {
    /// Tenant `name`'s snapshots (the store opened at first need); none,
    /// logged, when the store cannot be opened.
    fn snapshots_of(&self, name: &str) -> Option<Arc<crate::snapshot::TenantSnapshots>> {
        let store = self.snapshot_store()?;
        store
            .tenant(name)
            .map_err(|e| tracing::error!(tenant = name, error = %e, "the tenant's snapshots"))
            .ok()
    }

    /// The snapshot store, opened at first need (or at start: what a
    /// killed gateway left mounted goes then); none, logged, when it cannot
    /// be opened.
    pub fn snapshot_store(&self) -> Option<Arc<crate::snapshot::SnapshotStore>> {
        {
            let mut store = self.snapshot_store.lock();
            match store.as_ref() {
                Some(s) => s.clone(),
                None => match crate::snapshot::SnapshotStore::open(&self.snapshots, &self.images) {
                    Ok(s) => {
                        *store = Some(s.clone());
                        s
                    }
                    Err(e) => {
                        tracing::error!(error = %e, "the snapshot store cannot be opened: no snapshots");
                        return None;
                    }
                },
            }
        }
        .into()
    }
}

/// Where a tenant's settings came from.
pub(super) enum Origin<'a> {
    Configured,
    /// The template, whose uids the ledger holds.
    Template(Option<&'a UidLedger>),
}

/// Activate tenant `name`: everything its sessions run on.
pub(super) fn build(
    ctx: &BuildContext,
    name: &str,
    generation: u64,
    mut settings: TenantSettings,
    origin: Origin<'_>,
    hide_dirs: Vec<PathBuf>,
    image: Option<Arc<crate::image::View>>,
) -> Result<Tenant, ConfigError> {
    // Names its cgroup, private /tmp and network files; never a tenant
    // name (no tenant name holds `@`).
    let instance = if generation == 0 {
        name.to_owned()
    } else {
        format!("{name}@{generation}")
    };
    let instance = instance.as_str();
    let layers = ctx.layers;
    let mut phases = Phases::start();
    if let Origin::Template(ledger) = origin {
        if let (Some(ledger), true) = (ledger, layers.uid) {
            // What is already at the root is judged before a uid is taken:
            // a root that cannot be the tenant's never costs the range one.
            if let Some(root) = &settings.root {
                refuse_foreign_root(name, root, ledger)?;
            }
            let uid = ledger.uid_for(name, &crate::config::HostIds)?;
            settings.uid = Some((uid, uid));
            settings.uid_allocated = true;
        }
        if let Some(root) = &settings.root {
            make_root(name, root, if layers.uid { settings.uid } else { None })?;
        }
    }
    let hide = Hide {
        dirs: hide_dirs,
        files: {
            let mut files: Vec<PathBuf> = ctx
                .secret_files
                .iter()
                .filter_map(|p| p.canonicalize().ok())
                .filter(|p| p.is_file())
                .collect();
            files.sort();
            files.dedup();
            files
        },
    };
    let unshared;
    let (t, unshared_dir) = match unshared_tmp(instance, &settings, layers)? {
        Some((adjusted, dir)) => {
            unshared = adjusted;
            (&unshared, Some(dir))
        }
        None => (&settings, None),
    };
    phases.mark("root");
    let (idmap, tree) = root_idmap(name, t, layers)?.unzip();
    let fs = match (&t.root, tree) {
        (None, _) => FsRoot::host(),
        (Some(root), Some(tree)) => FsRoot::confined_at(root, tree),
        (Some(root), None) => FsRoot::confined(root)
            .map_err(|e| ConfigError(format!("tenants.{name}.root {}: {e}", root.display())))?,
    }
    .with_creds(if layers.uid { t.uid } else { None });
    let net = if layers.network && effective_network(t, layers) == Network::Isolated {
        let tools = NetTools::find().map_err(ConfigError)?;
        let dir = crate::config::state_dir()?.join("net");
        let net = TenantNet::unconfigured(instance, &t.egress, &tools, &dir, ctx.reaper.clone())
            .map_err(|e| ConfigError(format!("tenants.{name}: network: {e}")))?;
        Some((net, tools))
    } else {
        None
    };
    // Secrets substituted in its processes' requests: their CA is in the
    // bundle bound into its namespace, so made before its sandbox is.
    let substitution = match (&net, &t.egress.names) {
        (Some((n, _)), Some(_)) => {
            let sub = crate::egress::Substitution::new(name, &t.secrets, t.http_ca_file.as_deref())
                .map_err(|e| ConfigError(format!("tenants.{name}.secrets: {e}")))?;
            if let Some(sub) = &sub {
                n.trust(sub.ca_pem())
                    .map_err(|e| ConfigError(format!("tenants.{name}: CA bundle: {e}")))?;
            }
            sub
        }
        _ => None,
    };
    // Its ruleset and slirp4netns are set up while the rest is (the
    // slowest two steps, together 14 ms here); joined before the tenant
    // can run anything.
    std::thread::scope(|scope| {
        let configuring = net
            .as_ref()
            .map(|(n, tools)| scope.spawn(move || n.configure(tools)));
        let built = build_rest(
            ctx,
            (name, instance),
            t,
            unshared_dir,
            idmap,
            fs,
            net.as_ref().map(|(n, _)| n.clone()),
            hide,
            phases,
            image,
            substitution.clone(),
        );
        let configured = match configuring {
            None => Ok(()),
            Some(h) => h
                .join()
                .unwrap_or_else(|_| Err(std::io::Error::other("network setup panicked"))),
        };
        // slirp4netns costs the tenant, not the gateway: into a cgroup of
        // the tenant's own.
        let configured = match (configured, &built, &net) {
            (Ok(()), Ok(tenant), Some((n, _))) => match &tenant.cgroup {
                Some(cg) => cg.process().and_then(|pc| n.charge_to(pc)),
                None => Ok(()),
            },
            (c, _, _) => c,
        };
        match (built, configured) {
            (Ok(mut tenant), Ok(())) => {
                tenant.net = net.as_ref().map(|(n, _)| n.clone());
                if let (Some(sockets), Some(names)) = (&tenant.sockets, &t.egress.names) {
                    match start_egress(name, sockets.clone(), names, t, &tenant, substitution) {
                        Ok(eg) => {
                            if let Some(slot) = &tenant.egress_slot {
                                let _ = slot.set(eg.clone());
                            }
                            tenant.egress = Some(eg);
                        }
                        Err(e) => {
                            tenant.backend.retire();
                            if let Some(cg) = &tenant.cgroup {
                                cg.remove();
                            }
                            return Err(ConfigError(format!("tenants.{name}: egress: {e}")));
                        }
                    }
                }
                tracing::debug!(tenant = name, egress = %t.egress.describe(), "tenant network");
                Ok(tenant)
            }
            (Ok(tenant), Err(e)) => {
                // Built for nothing: undone as a retirement would.
                tenant.backend.retire();
                if let Some(cg) = &tenant.cgroup {
                    cg.remove();
                }
                if let Some(tmp) = &tenant.tmp {
                    crate::isolation::disk::unmount(tmp);
                }
                Err(ConfigError(format!("tenants.{name}: network: {e}")))
            }
            (Err(e), _) => Err(e),
        }
    })
}

/// Start the tenant's egress by name in its namespace (on the gateway's
/// runtime: `build` runs on one of its blocking threads).
fn start_egress(
    name: &str,
    sockets: Arc<crate::egress::Sockets>,
    names: &crate::config::EgressNames,
    t: &TenantSettings,
    tenant: &Tenant,
    substitution: Option<Arc<crate::egress::Substitution>>,
) -> std::io::Result<Arc<crate::egress::TenantEgress>> {
    let rt = tokio::runtime::Handle::try_current().map_err(std::io::Error::other)?;
    rt.block_on(crate::egress::TenantEgress::start(
        name,
        sockets,
        names.clone(),
        t.egress.ask,
        t.egress.max_connections,
        tenant.metrics.clone(),
        substitution,
    ))
}

/// The rest of [`build`], from the sandbox on.
#[allow(clippy::too_many_arguments)]
fn build_rest(
    ctx: &BuildContext,
    (name, instance): (&str, &str),
    t: &TenantSettings,
    unshared_dir: Option<PathBuf>,
    idmap: Option<crate::isolation::idmap::IdMap>,
    fs: FsRoot,
    net: Option<Arc<TenantNet>>,
    hide: Hide,
    mut phases: Phases,
    image: Option<Arc<crate::image::View>>,
    substitution: Option<Arc<crate::egress::Substitution>>,
) -> Result<Tenant, ConfigError> {
    let layers = ctx.layers;
    let tm = ctx.metrics.tenant(name);
    let base_env = match &image {
        Some(v) => v.env_over(&t.base_env),
        None => t.base_env.clone(),
    };
    let mut exec = ExecSettings::new(t.max_processes, base_env.clone());
    exec.reaper = ctx.reaper.clone();
    exec.exited_retention = ctx.exited_retention;
    exec.global_slots = Some(ctx.global_slots.clone());
    exec.max_retained_bytes = t.max_retained_output_bytes;
    exec.metrics = tm.clone();
    exec.subscriber_timeout = ctx.slow_client_timeout;
    exec.added_env = substitution.as_ref().map(|s| s.env()).unwrap_or_default();
    phases.mark("network");
    if image.is_some() && !images_possible(t, layers) {
        return Err(ConfigError(format!(
            "tenants.{name}.image needs the namespaces and workers layers (on and available on this host) and a root other than /"
        )));
    }
    let spec = sandbox_spec(
        instance,
        t,
        layers,
        &ctx.secret_files,
        &hide,
        idmap,
        net.clone(),
    )?;
    phases.mark("tmp");
    let tmp = spec
        .namespace
        .as_ref()
        .and_then(|n| n.tmp.clone())
        .or(unshared_dir);
    if let (Some(r), Some(dir)) = (&ctx.reaper, &tmp) {
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
    phases.mark("quota");
    let cgroup = if layers.cgroups {
        let mut cg = TenantCgroup::create(instance, &t.cgroup_limits)
            .map_err(|e| ConfigError(format!("tenants.{name}: cgroup: {e}")))?;
        if layers.workers {
            cg.set_owner(spec.uid)
                .map_err(|e| ConfigError(format!("tenants.{name}: cgroup: {e}")))?;
        }
        Some(Arc::new(cg))
    } else {
        None
    };
    phases.mark("cgroup");
    // One for all the tenant's pools: a snapshot freezes them all.
    let gate = crate::worker::Gate::default();
    // Sessions that choose another image than the tenant's get workers
    // of their own for it, confined the same way.
    let image_pools: Option<crate::backend::local::PoolFactory> =
        images_possible(t, layers).then(|| {
            let (name, mut t, spec, cgroup, tm, gate) = (
                name.to_owned(),
                t.clone(),
                spec.clone(),
                cgroup.clone(),
                tm.clone(),
                gate.clone(),
            );
            t.workers_min = 1;
            let start: crate::backend::local::PoolFactory = Box::new(move |place| {
                let mut spec = spec.clone();
                if let Some(view) = &place.view {
                    spec = with_image(&spec, view)?;
                }
                if let Some(w) = &place.workspace {
                    spec = with_workspace(&spec, w.path())?;
                }
                let sandbox = worker_sandbox(&name, spec, cgroup.as_deref()).map_err(|e| e.0)?;
                start_workers(&name, &t, sandbox, (cgroup.as_deref(), &gate), tm.clone())
                    .map_err(|e| e.0)
            });
            start
        });
    let runner = if layers.workers {
        let spec = match &image {
            Some(v) => with_image(&spec, v)
                .map_err(|e| ConfigError(format!("tenants.{name}.image: {e}")))?,
            None => spec,
        };
        let sandbox = worker_sandbox(name, spec, cgroup.as_deref())?;
        phases.mark("sandbox");
        Runner::Workers(start_workers(
            name,
            t,
            sandbox,
            (cgroup.as_deref(), &gate),
            tm.clone(),
        )?)
    } else {
        // Always a sandbox: even with every layer off, capabilities go.
        let sb =
            Sandbox::new(spec).map_err(|e| ConfigError(format!("tenants.{name}: sandbox: {e}")))?;
        Runner::Here(Some(Arc::new(sb)))
    };
    phases.mark("workers");
    tracing::debug!(tenant = name, phases = %phases, "activation");
    exec.spawned_in_worker = layers.workers;
    exec.cgroup = cgroup.clone();
    let root = fs.path().to_path_buf();
    let env_var = |k: &str, default: &str| {
        base_env
            .get(k)
            .cloned()
            .unwrap_or_else(|| default.to_owned())
    };
    let environment = EnvironmentSpec {
        tenant: name.to_owned(),
        home: env_var("HOME", &root.display().to_string()),
        tmp: env_var("TMPDIR", "/tmp"),
        shell: env_var("SHELL", "/bin/sh"),
        root,
        image: image.as_ref().map(|v| v.image.clone()),
    };
    let mut backend = LocalBackend::new(
        Arc::new(fs),
        Arc::new(exec),
        runner,
        environment,
        t.max_read_file_bytes,
        t.max_open_files,
    );
    let snapshots = image_pools
        .is_some()
        .then(|| ctx.snapshots_of(name))
        .flatten()
        .map(|store| {
            Arc::new(crate::backend::local::Snapshots {
                store,
                owner: if layers.uid { t.uid } else { None },
                fork_bytes: t.max_disk_bytes,
                gate: gate.clone(),
            })
        });
    if let Some(start) = image_pools {
        backend = backend.with_images(
            image.clone(),
            t.image.as_ref().map(|i| i.to_string()),
            start,
            t.base_env.clone(),
        );
    }
    if let Some(s) = &snapshots {
        backend = backend.with_snapshots(s.clone());
    }
    // Sockets of the gateway's own in the tenant's namespace: its
    // `http/request` client's, and its egress by name's.
    let sockets = match &net {
        Some(n) => {
            Some(Arc::new(crate::egress::Sockets::start(n).map_err(|e| {
                ConfigError(format!("tenants.{name}: network: {e}"))
            })?))
        }
        None => None,
    };
    if let Some(sockets) = &sockets {
        let http = crate::egress::HttpEgress::new(
            sockets.clone(),
            t.secrets.clone(),
            t.http_ca_file.as_deref(),
            // Its requests to a host a substituting secret is bound to
            // meet the proxy's interception, as the processes' do.
            substitution.as_ref().map(|s| s.ca_pem()),
        )
        .map_err(|e| ConfigError(format!("tenants.{name}.http_ca_file: {e}")))?;
        backend = backend.with_http(Arc::new(http));
    }
    let remote = match (&t.pool, &ctx.executors) {
        (Some(pool), Some(registry)) => {
            let pool = registry
                .pool(pool)
                .ok_or_else(|| ConfigError(format!("tenants.{name}.pool: no such pool")))?;
            // A pool serves one tenant: never another's executors.
            if pool.tenant() != name {
                return Err(ConfigError(format!(
                    "tenants.{name}.pool: pool `{}` serves tenant `{}`",
                    pool.name,
                    pool.tenant()
                )));
            }
            Some(Arc::new(RemoteBackend::new(
                pool.clone(),
                t.pool_labels.clone(),
                registry.settings.open_timeout,
            )))
        }
        _ => None,
    };
    let egress_slot = backend.egress_slot();
    let mut tenant = Tenant::assemble(name, t.clone(), Arc::new(backend), tm);
    tenant.egress_slot = Some(egress_slot);
    tenant.instance = Arc::from(instance);
    tenant.remote = remote;
    tenant.tmp = tmp;
    tenant.root_quota = root_quota;
    tenant.cgroup = cgroup;
    tenant.image = image;
    tenant.snapshots = snapshots;
    tenant.sockets = sockets;
    Ok(tenant)
}

/// How long each step of an activation took (a debug log line).
struct Phases {
    last: std::time::Instant,
    done: Vec<(&'static str, Duration)>,
}

impl Phases {
    fn start() -> Phases {
        Phases {
            last: std::time::Instant::now(),
            done: Vec::new(),
        }
    }

    fn mark(&mut self, what: &'static str) {
        let now = std::time::Instant::now();
        self.done.push((what, now - self.last));
        self.last = now;
    }
}

impl std::fmt::Display for Phases {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (what, d) in &self.done {
            write!(f, "{what} {:.1} ms ", d.as_secs_f64() * 1e3)?;
        }
        Ok(())
    }
}

/// What can be known about a configured tenant without activating it:
/// checked at start (and at reload) so a tenant that could never start
/// refuses the configuration, not its first session.
pub(super) fn preflight(
    name: &str,
    t: &TenantSettings,
    layers: Layers,
    tools: &mut Option<Result<NetTools, String>>,
    idmappable: &mut std::collections::HashSet<u64>,
) -> Result<(), ConfigError> {
    let network = effective_network(t, layers);
    if network == Network::None && !layers.namespaces {
        return Err(ConfigError(format!(
            "tenants.{name}.network = \"none\" needs the namespaces layer, which is off or unavailable on this host"
        )));
    }
    if network == Network::Isolated {
        if !layers.network {
            return Err(ConfigError(format!(
                "tenants.{name}.network = \"isolated\" (a tenant's default where the layer is not off) needs the network layer, which is off or unavailable on this host (see the network probe above), or was not probed at start because every tenant then said \"none\" (restart the gateway to add such a tenant)"
            )));
        }
        tools
            .get_or_insert_with(NetTools::find)
            .as_ref()
            .map_err(|e| ConfigError(e.clone()))?;
    }
    super::confine::check_tmpdir(name, t, layers)?;
    // Fails where the root's filesystem cannot be idmapped (one root per
    // filesystem is enough to know: thousands of roots start fast).
    let dev = t.root.as_ref().and_then(|r| {
        use std::os::unix::fs::MetadataExt as _;
        std::fs::metadata(r).ok().map(|m| m.dev())
    });
    if dev.is_some_and(|d| idmappable.contains(&d)) {
        return Ok(());
    }
    if root_idmap(name, t, layers)?.is_some()
        && let Some(d) = dev
    {
        idmappable.insert(d);
    }
    Ok(())
}

/// A templated tenant's root, made on first use: `ROOTS/NAME`, mode
/// 0700, owned by the tenant's uid (where it has one). What is there
/// already must be a directory, never a link.
/// Refuse what is at templated tenant `name`'s root, if anything, unless
/// an earlier activation left it: a directory (never a link) owned by the
/// uid the ledger gives `name`. Only the gateway writes the roots'
/// directory, and a concurrent activation of `name` (another replica's)
/// can only make that same root, so what passes here stays adoptable.
fn refuse_foreign_root(
    name: &str,
    root: &Path,
    ledger: &crate::config::UidLedger,
) -> Result<(), ConfigError> {
    use std::os::unix::fs::MetadataExt as _;
    let err =
        |e: std::io::Error| ConfigError(format!("tenant `{name}`: root {}: {e}", root.display()));
    let m = match std::fs::symlink_metadata(root) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(err(e)),
    };
    if !m.is_dir() {
        return Err(err(std::io::Error::other(
            "exists and is not a directory (a link or a file)",
        )));
    }
    if ledger.holder(m.uid()).as_deref() != Some(name) {
        return Err(err(std::io::Error::other(format!(
            "exists and belongs to uid {}, not the tenant's (the ledger gives it no such uid): the gateway adopts only a root it made; move it away or chown it",
            m.uid()
        ))));
    }
    Ok(())
}

fn make_root(name: &str, root: &Path, uid: Option<(u32, u32)>) -> Result<(), ConfigError> {
    use std::os::unix::fs::DirBuilderExt as _;
    let err =
        |e: std::io::Error| ConfigError(format!("tenant `{name}`: root {}: {e}", root.display()));
    match std::fs::DirBuilder::new().mode(0o700).create(root) {
        Ok(()) => {
            if let Some((u, g)) = uid {
                std::os::unix::fs::lchown(root, Some(u), Some(g)).map_err(err)?;
            }
            tracing::info!(tenant = name, root = %root.display(), "tenant root created");
            Ok(())
        }
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            use std::os::unix::fs::MetadataExt as _;
            let m = std::fs::symlink_metadata(root).map_err(err)?;
            if !m.is_dir() {
                return Err(err(std::io::Error::other("exists and is not a directory")));
            }
            // Made by an earlier activation, it is the tenant's; anything
            // else found there (another user's directory) is not adopted.
            let owner = uid.map_or_else(|| nix::unistd::geteuid().as_raw(), |(u, _)| u);
            if m.uid() != owner {
                return Err(err(std::io::Error::other(format!(
                    "exists and belongs to uid {}, not the tenant's ({owner}): the gateway adopts only a root it made; move it away or chown it",
                    m.uid()
                ))));
            }
            Ok(())
        }
        Err(e) => Err(err(e)),
    }
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

/// A worker's sandbox: the tenant's, which additionally reaches the
/// tenant's per-process cgroups (to move children in) and the gateway
/// binary (to exec it).
fn worker_sandbox(
    name: &str,
    mut spec: SandboxSpec,
    cgroup: Option<&TenantCgroup>,
) -> Result<Arc<Sandbox>, ConfigError> {
    let err = |e: String| ConfigError(format!("tenants.{name}: workers: {e}"));
    // The file workers exec (held open since start): a tenant activated
    // after an upgrade replaced the binary on disk still runs the gateway's.
    let exe = crate::worker::executable().map_err(|e| err(e.to_string()))?;
    if let (Some(rw), Some(cg)) = (spec.landlock_rw.as_mut(), cgroup) {
        rw.push(cg.membership_dir());
    }
    if spec.landlock_rw.is_some() {
        spec.landlock_ro.push(exe);
    }
    Ok(Arc::new(Sandbox::new(spec).map_err(err)?))
}

/// Start a tenant's worker pool: each worker joins the tenant's cgroups and
/// takes its sandbox.
fn start_workers(
    name: &str,
    t: &TenantSettings,
    sandbox: Arc<Sandbox>,
    (cgroup, gate): (Option<&TenantCgroup>, &crate::worker::Gate),
    metrics: TenantMetrics,
) -> Result<Arc<WorkerPool>, ConfigError> {
    let err = |e: String| ConfigError(format!("tenants.{name}: workers: {e}"));
    let exe = std::env::current_exe().map_err(|e| err(e.to_string()))?;
    // Children are created in their cgroups on v2: the worker may call
    // clone3 then, and seals each child (where seccomp is on at all).
    let seal_children = sandbox.spec.seccomp && cgroup.is_some_and(|c| c.is_v2());
    let sandbox = Some(sandbox);
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
        seal_children,
        min: t.workers_min,
        max: t.workers_max,
        metrics: Some(metrics),
        gate: gate.clone(),
    })
    .map_err(|e| err(e.to_string()))
}
