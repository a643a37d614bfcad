//! Wires settings, sessions, the stack and the listeners; orders shutdown.
//!
//! Shutdown (STYLE.md §B9), each step bounded in time:
//! 1. the shutdown future fires: `/readyz` turns 503, new sessions and new
//!    requests get the draining error;
//! 2. running processes get up to `shutdown_grace` to finish;
//! 3. listeners stop accepting, connections are closed with 1001;
//! 4. every remaining process group is killed;
//! 5. `run` returns and the binary exits 0.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::auth::Authenticator;
use crate::config::{ConfigError, Settings};
use crate::exec::reaper::Reaper;
use crate::metrics::Metrics;
use crate::middleware::{self, RpcService, StackSettings};
use crate::session::SessionRegistry;
use crate::tenant::Tenants;

/// Shared state of one gateway process.
pub struct Gateway {
    pub settings: Arc<Settings>,
    pub auth: Authenticator,
    pub tenants: Tenants,
    pub metrics: Arc<Metrics>,
    pub sessions: Arc<SessionRegistry>,
    pub stack: RpcService,
    /// Cancelled when listeners must stop and connections close.
    pub stopped: CancellationToken,
    /// Cancelled when draining starts (gRPC health flips to NOT_SERVING).
    drain: CancellationToken,
    draining: AtomicBool,
    reaper: Option<Arc<Reaper>>,
    /// The isolation layers in use.
    pub layers: Layers,
}

/// Which isolation layers are active (probed at start).
#[derive(Debug, Clone, Copy, Default)]
pub struct Layers {
    pub workers: bool,
    pub cgroups: bool,
    pub landlock: bool,
    pub seccomp: bool,
    pub uid: bool,
}

/// Probe one isolation layer by doing it: `Ok(true)` when active; a
/// required layer that fails stops the gateway (fail closed).
fn probe_layer(
    name: &str,
    policy: crate::config::LayerPolicy,
    metrics: &Metrics,
    probe: impl FnOnce() -> Result<(), String>,
) -> Result<bool, ConfigError> {
    use crate::config::LayerPolicy;
    let gauge = metrics
        .isolation_layer
        .get_or_create(&crate::metrics::LayerLabel {
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
            "isolation layer `{name}` is required but unavailable: {reason}"
        ))),
        Err(reason) => {
            tracing::warn!(layer = name, %reason, "isolation layer unavailable; continuing without it");
            gauge.set(0);
            Ok(false)
        }
    }
}

/// Probe every layer of `[isolation]`.
fn probe_layers(settings: &Settings, metrics: &Metrics) -> Result<Layers, ConfigError> {
    use crate::exec::sandbox::{SandboxSpec, probe};
    let iso = settings.isolation;
    let cgroups = probe_layer("cgroup", iso.cgroups, metrics, || {
        crate::exec::cgroup::probe()?;
        let killed = crate::exec::cgroup::cleanup_leftovers();
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
        let pool = crate::exec::worker::WorkerPool::start(crate::exec::worker::WorkerLaunch {
            tenant: "probe".to_owned(),
            root: None,
            exe,
            sandbox: None,
            cgroups: Vec::new(),
            min: 1,
            max: 1,
            metrics: None,
        })
        .map_err(|e| format!("a probe worker could not start: {e}"))?;
        pool.kill_all();
        Ok(())
    })?;
    // Only worth probing (and reporting) when some tenant has a uid.
    let wanted = settings.tenants.values().any(|t| t.uid.is_some());
    let uid = wanted
        && probe_layer("uid", iso.uid, metrics, || {
            probe(SandboxSpec {
                uid: Some((65534, 65534)),
                ..SandboxSpec::default()
            })
        })?;
    Ok(Layers {
        workers,
        cgroups,
        landlock,
        seccomp,
        uid,
    })
}

impl Gateway {
    pub fn new(
        settings: Settings,
        reaper: Option<Arc<Reaper>>,
    ) -> Result<Arc<Gateway>, ConfigError> {
        let metrics = Arc::new(Metrics::new());
        let global_slots = Arc::new(tokio::sync::Semaphore::new(settings.max_processes));
        // Validate keys before touching the host (cgroups): a bad config
        // must fail with one line and leave nothing behind.
        let auth = Authenticator::new(&settings.auth, settings.tenants.keys().cloned().collect())
            .map_err(ConfigError)?;
        let layers = probe_layers(&settings, &metrics)?;
        let tenants = Tenants::new(&settings, reaper.clone(), &metrics, global_slots, layers)?;
        let sessions = SessionRegistry::new(settings.detach_ttl, settings.max_sessions);
        let stack = middleware::stack(
            &StackSettings {
                max_in_flight: settings.max_in_flight,
                request_timeout: settings.request_timeout,
            },
            metrics.clone(),
        );
        Ok(Arc::new(Gateway {
            settings: Arc::new(settings),
            auth,
            tenants,
            metrics,
            sessions,
            stack,
            stopped: CancellationToken::new(),
            drain: CancellationToken::new(),
            draining: AtomicBool::new(false),
            reaper,
            layers,
        }))
    }

    /// `/readyz` detail: one line per isolation layer.
    pub fn isolation_report(&self) -> String {
        let on = |b: bool, what: &str| {
            if b {
                format!("active ({what})")
            } else {
                "inactive".to_owned()
            }
        };
        let l = self.layers;
        let uids = self
            .settings
            .tenants
            .values()
            .filter(|t| t.uid.is_some())
            .count();
        format!(
            "workers: {}\ncgroups: {}\nlandlock: {}\nseccomp: {}\nuid: {}\nprocess-groups: active\nreaper: {}\nfs-confinement: cap-std (per tenant root)\n",
            on(
                l.workers,
                "per tenant; processes spawned by a confined worker"
            ),
            on(l.cgroups, "v1: pids, memory, cpu"),
            on(
                l.landlock,
                "tenant root and tmp read-write; signal and abstract-socket scoping"
            ),
            on(l.seccomp, "deny-list, no_new_privs"),
            on(
                l.uid,
                &format!("{uids} of {} tenants", self.settings.tenants.len())
            ),
            if self.reaper.is_some() {
                "active"
            } else {
                "inactive"
            },
        )
    }

    pub fn draining(&self) -> bool {
        self.draining.load(Ordering::Relaxed)
    }

    /// Completes once draining has started.
    pub async fn draining_started(&self) {
        self.drain.cancelled().await;
    }

    /// Prometheus text exposition.
    pub fn metrics_text(&self) -> String {
        self.metrics.encode()
    }

    /// Steps 1–4 of the shutdown order.
    pub async fn shut_down(&self) {
        self.draining.store(true, Ordering::Relaxed);
        self.drain.cancel();
        self.metrics.draining.set(1);
        let grace = self.settings.shutdown_grace;
        let deadline = tokio::time::Instant::now() + grace;
        while self.sessions.live_processes() > 0 && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        self.stopped.cancel();
        self.sessions.kill_all();
        self.tenants.retire_workers();
        self.stop_reaper();
    }

    /// Close the reaper's pipe: it kills whatever is still registered.
    fn stop_reaper(&self) {
        if let Some(r) = &self.reaper {
            r.stop();
        }
    }
}

/// Serve websocket/HTTP on `listener` (and gRPC on `grpc`) until `shutdown`
/// completes, then shut down.
pub async fn run_ws(
    gw: Arc<Gateway>,
    listener: TcpListener,
    grpc: Option<TcpListener>,
    shutdown: impl Future<Output = ()>,
) {
    let server = crate::task::spawn(
        "ws-accept",
        crate::transport::ws::serve(listener, gw.clone()),
    );
    let grpc =
        grpc.map(|l| crate::task::spawn("grpc", crate::transport::grpc::serve(l, gw.clone())));
    shutdown.await;
    tracing::info!("shutting down");
    gw.shut_down().await;
    let _ = tokio::time::timeout(Duration::from_secs(2), server).await;
    if let Some(g) = grpc {
        let _ = tokio::time::timeout(Duration::from_secs(2), g).await;
    }
    // Let connection tasks send their close frames.
    tokio::time::sleep(Duration::from_millis(50)).await;
}

/// Serve one stdio session, then kill what it left. The token comes from
/// `EXEC_GATEWAY_TOKEN`; a missing or bad one fails `initialize` with -32002.
pub async fn run_stdio(
    gw: Arc<Gateway>,
    token: Option<String>,
    shutdown: impl Future<Output = ()>,
) {
    let principal = match token {
        None => Err(crate::auth::AuthError::Missing),
        Some(t) => gw.auth.verify(&t).await,
    };
    if let Err(e) = &principal {
        gw.metrics.auth_failure(e.reason());
        tracing::warn!(reason = e.reason(), "stdio token refused");
    }
    let session = crate::transport::stdio::serve(
        tokio::io::stdin(),
        tokio::io::stdout(),
        gw.clone(),
        principal.map(Arc::new),
    );
    tokio::select! {
        () = session => {}
        () = shutdown => {}
    }
    gw.draining.store(true, Ordering::Relaxed);
    gw.stopped.cancel();
    gw.sessions.kill_all();
    gw.tenants.retire_workers();
    gw.stop_reaper();
}

/// Completes on SIGTERM or SIGINT.
pub async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        tracing::error!("cannot install signal handlers; only EOF/kill will stop the gateway");
        return std::future::pending().await;
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
}
