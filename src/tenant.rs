//! Tenants: each has a filesystem root, an exec environment with its own
//! process slots and retained-output budget, a rate limiter, an in-flight
//! semaphore and a session count. Tenants are fixed by configuration, so the
//! set (and every per-tenant map and metric label) is bounded.

use std::collections::BTreeMap;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};
use tokio::sync::Semaphore;

use crate::config::{ConfigError, Settings, TenantSettings};
use crate::exec::ExecSettings;
use crate::exec::reaper::Reaper;
use crate::fs::FsRoot;
use crate::metrics::{Metrics, TenantMetrics};

/// One configured tenant.
pub struct Tenant {
    pub name: Arc<str>,
    pub settings: TenantSettings,
    pub fs: Arc<FsRoot>,
    pub exec: Arc<ExecSettings>,
    pub limiter: DefaultDirectRateLimiter,
    /// Requests in flight; a permit is held for the duration of a call.
    pub in_flight: Arc<Semaphore>,
    /// Sessions currently registered for this tenant.
    pub sessions: AtomicUsize,
    pub metrics: TenantMetrics,
}

impl Tenant {
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
        layers: crate::gateway::Layers,
    ) -> Result<Tenants, ConfigError> {
        let hidden = gateway_files(settings);
        let mut by_name = BTreeMap::new();
        for (name, t) in &settings.tenants {
            let fs = match &t.root {
                None => FsRoot::host(),
                Some(root) => FsRoot::confined(root).map_err(|e| {
                    ConfigError(format!("tenants.{name}.root {}: {e}", root.display()))
                })?,
            }
            .with_creds(if layers.uid { t.uid } else { None });
            let tm = metrics.tenant(name);
            let mut exec = ExecSettings::new(t.max_processes, t.base_env.clone());
            exec.reaper = reaper.clone();
            exec.exited_retention = settings.exited_retention;
            exec.global_slots = Some((global_slots.clone(), settings.max_processes));
            exec.max_retained_bytes = t.max_retained_output_bytes;
            exec.metrics = tm.clone();
            exec.subscriber_timeout = settings.slow_client_timeout;
            let spec = sandbox_spec(t, layers, &hidden);
            let cgroup = if layers.cgroups {
                let mut cg = crate::exec::cgroup::TenantCgroup::create(name, &t.cgroup_limits)
                    .map_err(|e| ConfigError(format!("tenants.{name}: cgroup: {e}")))?;
                if layers.workers {
                    cg.set_owner(spec.uid);
                }
                Some(Arc::new(cg))
            } else {
                None
            };
            if let Some(rw) = &spec.landlock_rw {
                for secret in hidden
                    .iter()
                    .filter(|h| rw.iter().any(|p| h.starts_with(p)))
                {
                    tracing::warn!(
                        tenant = %name,
                        path = %secret.display(),
                        "a gateway key file lies where this tenant's processes may read and write; move it (for example to /run/exec-gateway)"
                    );
                }
            }
            if layers.workers {
                exec.workers = Some(start_workers(name, t, spec, cgroup.as_deref(), tm.clone())?);
            } else if !spec.is_empty() {
                let sb = crate::exec::sandbox::Sandbox::new(spec)
                    .map_err(|e| ConfigError(format!("tenants.{name}: sandbox: {e}")))?;
                exec.sandbox = Some(Arc::new(sb));
            }
            exec.cgroup = cgroup;
            let rate = NonZeroU32::new(t.requests_per_second).unwrap_or(NonZeroU32::MIN);
            let burst = NonZeroU32::new(t.burst).unwrap_or(rate);
            by_name.insert(
                name.clone(),
                Arc::new(Tenant {
                    name: Arc::from(name.as_str()),
                    settings: t.clone(),
                    fs: Arc::new(fs),
                    exec: Arc::new(exec),
                    limiter: RateLimiter::direct(Quota::per_second(rate).allow_burst(burst)),
                    in_flight: Arc::new(Semaphore::new(t.max_in_flight)),
                    sessions: AtomicUsize::new(0),
                    metrics: tm,
                }),
            );
        }
        Ok(Tenants { by_name })
    }

    pub fn get(&self, name: &str) -> Option<&Arc<Tenant>> {
        self.by_name.get(name)
    }

    /// Stop every tenant's workers (shutdown; their processes are already
    /// killed).
    pub fn retire_workers(&self) {
        for t in self.by_name.values() {
            if let Some(pool) = &t.exec.workers {
                pool.kill_all();
            }
        }
    }

    pub fn all(&self) -> impl Iterator<Item = &Arc<Tenant>> {
        self.by_name.values()
    }
}

/// What confines a tenant's processes, given the active layers: Landlock
/// read-write in the root (or everything for an unconfined tenant), its
/// `TMPDIR` and the configured extras.
fn sandbox_spec(
    t: &crate::config::TenantSettings,
    layers: crate::gateway::Layers,
    hidden: &[std::path::PathBuf],
) -> crate::exec::sandbox::SandboxSpec {
    let landlock_rw = layers.landlock.then(|| {
        let root = t
            .root
            .clone()
            .unwrap_or_else(|| std::path::PathBuf::from("/"));
        let tmp = t.base_env.get("TMPDIR").map(std::path::PathBuf::from);
        std::iter::once(root)
            .chain(tmp)
            .chain(t.landlock_write.iter().cloned())
            .collect()
    });
    crate::exec::sandbox::SandboxSpec {
        uid: if layers.uid { t.uid } else { None },
        landlock_rw,
        landlock_ro: t.landlock_read.clone(),
        seccomp: layers.seccomp,
        hidden: hidden.to_vec(),
    }
}

/// Start a tenant's worker pool: each worker joins the tenant's cgroups and
/// takes its sandbox, which additionally reaches the tenant's per-process
/// cgroups (to move children in) and the gateway binary (to exec it).
fn start_workers(
    name: &str,
    t: &crate::config::TenantSettings,
    mut spec: crate::exec::sandbox::SandboxSpec,
    cgroup: Option<&crate::exec::cgroup::TenantCgroup>,
    metrics: crate::metrics::TenantMetrics,
) -> Result<Arc<crate::exec::worker::WorkerPool>, ConfigError> {
    let err = |e: String| ConfigError(format!("tenants.{name}: workers: {e}"));
    let exe = std::env::current_exe().map_err(|e| err(e.to_string()))?;
    if let (Some(rw), Some(cg)) = (spec.landlock_rw.as_mut(), cgroup) {
        rw.push(cg.membership_dir());
    }
    if spec.landlock_rw.is_some() {
        spec.landlock_ro.push(exe.clone());
    }
    let sandbox = if spec.is_empty() {
        None
    } else {
        Some(Arc::new(
            crate::exec::sandbox::Sandbox::new(spec).map_err(err)?,
        ))
    };
    let cgroups = match cgroup {
        Some(cg) => cg.tenant_procs().map_err(|e| err(e.to_string()))?,
        None => Vec::new(),
    };
    crate::exec::worker::WorkerPool::start(crate::exec::worker::WorkerLaunch {
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

/// The gateway's own files that no tenant process may read: its key files
/// (as configured and as resolved through symlinks).
fn gateway_files(settings: &crate::config::Settings) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for k in &settings.auth.keys {
        for p in [&k.secret_file, &k.public_key_file, &k.jwks_file]
            .into_iter()
            .flatten()
        {
            let abs = if p.is_absolute() {
                p.clone()
            } else {
                std::env::current_dir()
                    .map(|d| d.join(p))
                    .unwrap_or_else(|_| p.clone())
            };
            if let Ok(real) = abs.canonicalize() {
                out.push(real);
            }
            out.push(crate::fs::normalize(&abs));
        }
    }
    out.sort();
    out.dedup();
    out
}
