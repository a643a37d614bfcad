//! The shared state of one gateway process: settings, authenticator,
//! tenants, sessions, the stack, metrics, and its lifecycle (draining, then
//! stopped). How the state is started and stopped is module `server`'s.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::auth::Authenticator;
use crate::config::{ConfigError, Network, Settings};
use crate::error::GatewayError;
use crate::fleet::{Fleet, Owner};
use crate::isolation::Layers;
use crate::isolation::reaper::Reaper;
use crate::metrics::Metrics;
use crate::middleware::{self, RpcService, StackSettings};
use crate::registry::Registry;
use crate::session::SessionRegistry;
use crate::tenant::{TenantSet, TenantSetCell, Tenants};

/// Tenants whose limits `/readyz` lists.
pub const REPORTED_TENANTS: usize = 100;

/// Shared state of one gateway process.
pub struct Gateway {
    /// As at start; tenants and keys are the reloaded ones
    /// ([`Gateway::reload`]).
    pub settings: Arc<Settings>,
    auth: arc_swap::ArcSwap<Authenticator>,
    /// Stops the current authenticator's background key fetches.
    auth_stop: parking_lot::Mutex<CancellationToken>,
    pub tenants: Tenants,
    pub metrics: Arc<Metrics>,
    pub sessions: Arc<SessionRegistry>,
    pub stack: RpcService,
    /// The isolation layers in use.
    pub layers: Layers,
    /// This replica's fleet identity and peers (`None`: a lone gateway).
    pub fleet: Option<Arc<Fleet>>,
    /// The registry remote executors join (`None`: no pools configured).
    pub executors: Option<Arc<Registry>>,
    /// Connections and calls relayed from here to the sessions' owners.
    pub relays: std::sync::atomic::AtomicUsize,
    /// Bytes held of what all clients send (`server.max_inbound_bytes`).
    pub inbound: Arc<crate::outbound::ByteBudget>,
    /// Cancelled when draining starts: `/readyz` turns 503, gRPC health
    /// NOT_SERVING, new sessions get the draining error (live ones are
    /// served until the stop).
    draining: CancellationToken,
    /// Cancelled when listeners must stop and connections close.
    stopped: CancellationToken,
    reaper: Option<Arc<Reaper>>,
    /// The MCP service on the client listener (`None`: `[mcp] enabled =
    /// false`).
    pub mcp: Option<Arc<crate::mcp::http::McpHttp>>,
}

impl Gateway {
    pub fn new(
        mut settings: Settings,
        reaper: Option<Arc<Reaper>>,
    ) -> Result<Arc<Gateway>, ConfigError> {
        let metrics = Arc::new(Metrics::new());
        let global_slots = Arc::new(tokio::sync::Semaphore::new(settings.max_processes));
        // Validate keys before touching the host (cgroups): a bad config
        // must fail with one line and leave nothing behind.
        let tenant_set = TenantSet::cell(&settings);
        let auth = authenticator(&settings, &metrics, &tenant_set)?;
        let layers = crate::probe::layers(&settings, &metrics)?;
        let executors = settings
            .executors
            .clone()
            .map(|e| {
                Registry::new(
                    e,
                    settings.fleet.as_ref().map(|f| f.key.0.as_slice()),
                    metrics.clone(),
                    settings.revocations.clone(),
                )
            })
            .transpose()
            .map_err(ConfigError)?;
        let tenants = Tenants::new(
            &settings,
            tenant_set,
            reaper.clone(),
            metrics.clone(),
            global_slots,
            layers,
            executors.clone(),
        )?;
        // The tenants hold their settings from now on (one copy: with
        // thousands of tenants it is most of what an idle one costs).
        settings.tenants = Default::default();
        let fleet = settings
            .fleet
            .as_ref()
            .map(Fleet::new)
            .transpose()?
            .map(Arc::new);
        let sessions = SessionRegistry::new(
            settings.detach_ttl,
            settings.max_sessions,
            fleet
                .as_ref()
                .map(|f| f.session_prefix())
                .unwrap_or_default(),
            fleet.as_ref().map(|f| f.replica.clone()),
            Arc::new(settings.preview.clone()),
        );
        let stack = middleware::stack(
            &StackSettings {
                max_in_flight: settings.max_in_flight,
                request_timeout: settings.request_timeout,
            },
            metrics.clone(),
        );
        let inbound = crate::outbound::ByteBudget::new(
            settings.max_inbound_bytes,
            Default::default(),
            Default::default(),
            Default::default(),
        );
        let mcp = settings.mcp.enabled.then(|| {
            Arc::new(crate::mcp::http::McpHttp::new(
                &settings.mcp,
                metrics.mcp_sessions.clone(),
            ))
        });
        let gw = Arc::new(Gateway {
            mcp,
            inbound,
            settings: Arc::new(settings),
            auth: arc_swap::ArcSwap::from_pointee(auth),
            auth_stop: parking_lot::Mutex::new(CancellationToken::new()),
            tenants,
            metrics,
            sessions,
            stack,
            layers,
            fleet,
            executors,
            relays: std::sync::atomic::AtomicUsize::new(0),
            draining: CancellationToken::new(),
            stopped: CancellationToken::new(),
            reaper,
        });
        // Remote key sets are fetched in the background from now on.
        gw.auth().start(gw.auth_stop.lock().clone());
        crate::task::start("tenant-sweep", sweep(Arc::downgrade(&gw)));
        Ok(gw)
    }

    /// The token verifier in force.
    pub fn auth(&self) -> Arc<Authenticator> {
        self.auth.load_full()
    }

    /// Take the tenants and keys of `new` (a re-read configuration, fully
    /// validated): see [`Tenants::reload`]. What else changed needs a
    /// restart and is named in the returned line; nothing is applied if
    /// the new tenants or keys are refused.
    pub fn reload(self: &Arc<Self>, new: &Settings) -> Result<String, ConfigError> {
        self.settings.check_reload_fit(new)?;
        let mut auth = authenticator(new, &self.metrics, &self.tenants.set_cell())?;
        if let (Some(r), Some(e)) = (&self.executors, &new.executors) {
            refuse_pool_moves(r, e)?;
        }
        let tenants = self.tenants.reload(new)?;
        if let Some(r) = &self.executors {
            r.reload(new.executors.as_ref(), new.revocations.clone());
        }
        let stop = CancellationToken::new();
        auth.start(stop.clone());
        // Applied from here on: keys gone end their live connections.
        auth.take_over(&self.auth());
        self.auth.store(Arc::new(auth));
        let old = std::mem::replace(&mut *self.auth_stop.lock(), stop);
        old.cancel();
        let webhooks = crate::webhooks::reload(new.webhooks.as_ref()).map_err(ConfigError)?;
        let mut restart: Vec<&str> = restart_needed(&self.settings, new);
        restart.extend(webhooks.as_deref());
        Ok(if restart.is_empty() {
            format!("{tenants}; keys reloaded")
        } else {
            format!(
                "{tenants}; keys reloaded; changes to {} need a restart and were not applied",
                restart.join(", ")
            )
        })
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
        let set = self.tenants.set();
        let uids = set.configured.values().filter(|t| t.uid.is_some()).count();
        format!(
            "workers: {}\ncgroups: {}\nlandlock: {}\nseccomp: {}\nuid: {}\nnamespaces: {}\nnetwork: {}\ndisk: {}\ncapabilities: none for tenant processes\nprocess-groups: active\nreaper: {}\nfs-confinement: cap-std (per tenant root)\n",
            on(
                l.workers,
                "per tenant; processes spawned by a confined worker"
            ),
            on(l.cgroups, &crate::isolation::cgroup::describe()),
            on(l.landlock, &{
                use crate::isolation::sandbox::{landlock_abi_number, landlock_gaps};
                let gaps = landlock_gaps();
                format!(
                    "ABI {}; tenant root and tmp read-write, system dirs read-only, nothing else{}; not enforced on this kernel: {}",
                    landlock_abi_number(),
                    if gaps.is_empty() {
                        "; signals and abstract unix sockets scoped to the tenant"
                    } else {
                        ""
                    },
                    if gaps.is_empty() {
                        "nothing".to_owned()
                    } else {
                        gaps.join("; ")
                    }
                )
            }),
            on(l.seccomp, "deny-list, no_new_privs"),
            on(
                l.uid,
                &format!(
                    "{uids} of {} configured tenants ({} allocated){}",
                    set.configured.len(),
                    set.configured.values().filter(|t| t.uid_allocated).count(),
                    if set.template.is_some() {
                        "; templated tenants: allocated from uid_range"
                    } else {
                        ""
                    }
                )
            ),
            on(
                l.namespaces,
                "mount (private /tmp), PID (with workers), IPC, UTS per confined tenant"
            ),
            {
                let mut by: std::collections::BTreeMap<String, usize> = Default::default();
                for t in set
                    .configured
                    .values()
                    .chain(set.template.as_ref().map(|t| &t.example))
                {
                    let n = match crate::tenant::effective_network(t, l) {
                        Network::Isolated => format!("isolated, egress {}", t.egress.describe()),
                        Network::None => "loopback only".to_owned(),
                        Network::Host => "host".to_owned(),
                    };
                    *by.entry(n).or_default() += 1;
                }
                let tenants = by
                    .iter()
                    .map(|(n, c)| format!("{c} {n}"))
                    .collect::<Vec<_>>()
                    .join("; ");
                if l.network {
                    format!(
                        "active (own namespace per tenant, egress through slirp4netns; tenants: {tenants})"
                    )
                } else {
                    format!("inactive (tenants: {tenants})")
                }
            },
            {
                let tmp = if l.namespaces {
                    "/tmp a tmpfs of max_tmp_bytes per confined tenant"
                } else {
                    "/tmp unlimited (namespaces layer inactive)"
                };
                if l.disk {
                    format!("active (roots under project quotas of max_disk_bytes; {tmp})")
                } else {
                    format!(
                        "inactive (roots unlimited: no project quota on their filesystems; {tmp})"
                    )
                }
            },
            if self.reaper.is_some() {
                "active"
            } else {
                "inactive"
            },
        )
    }

    /// `/readyz` detail: the limits in force for each tenant (at most
    /// [`REPORTED_TENANTS`]), and any that the host cannot enforce.
    pub fn limits_report(&self) -> String {
        use crate::isolation::cgroup::enforces;
        let l = self.layers;
        let mut out = String::new();
        let set = self.tenants.set();
        let tenants = &set.configured;
        let template = set
            .template
            .as_ref()
            .map(|t| (format!("tenant_template ({})", t.name_pattern), &t.example));
        let listed = template
            .into_iter()
            .chain(tenants.iter().map(|(n, t)| (n.clone(), t)));
        for (name, t) in listed.take(REPORTED_TENANTS) {
            let c = &t.cgroup_limits;
            let mut parts = Vec::new();
            let mut cg = |key: &str, controller: &str, value: Option<String>| {
                let Some(v) = value else { return };
                if l.cgroups && enforces(controller) {
                    parts.push(format!("{key} {v}"));
                } else {
                    parts.push(format!(
                        "{key} {v} (not enforced: no {controller} controller)"
                    ));
                }
            };
            cg("pids_max", "pids", c.pids_max.map(|v| v.to_string()));
            cg(
                "memory_max_bytes",
                "memory",
                c.memory_max_bytes.map(|v| v.to_string()),
            );
            cg(
                "cpu_max_cores",
                "cpu",
                c.cpu_quota_us
                    .map(|q| format!("{}", q as f64 / crate::config::CPU_PERIOD_US as f64)),
            );
            cg("cpu_shares", "cpu", c.cpu_shares.map(|v| v.to_string()));
            let confined = t.root.is_some();
            parts.push(match (confined, l.namespaces) {
                (true, true) => format!("max_tmp_bytes {} (tmpfs)", t.max_tmp_bytes),
                _ => "max_tmp_bytes (not enforced: no private /tmp)".to_owned(),
            });
            parts.push(match (confined, l.disk) {
                (true, true) => format!("max_disk_bytes {} (project quota)", t.max_disk_bytes),
                (true, false) => format!(
                    "max_disk_bytes {} (not enforced: no project quota on the root's filesystem)",
                    t.max_disk_bytes
                ),
                (false, _) => "max_disk_bytes (not enforced: unconfined root)".to_owned(),
            });
            parts.push(format!("max_processes {}", t.max_processes));
            parts.push(format!("max_open_files {}", t.max_open_files));
            out.push_str(&format!("limits {name}: {}\n", parts.join(", ")));
        }
        out.push_str(&format!(
            "tenants: {} configured, template {}, {} active (server.max_active_tenants {}), retired after {} idle\n",
            tenants.len(),
            set.template
                .as_ref()
                .map_or("none".to_owned(), |t| format!("for names matching {}", t.name_pattern)),
            self.tenants.active().len(),
            self.settings.max_active_tenants,
            humantime::format_duration(self.settings.tenant_idle_timeout)
        ));
        if tenants.len() > REPORTED_TENANTS {
            out.push_str(&format!(
                "limits: {} more tenants not listed\n",
                tenants.len() - REPORTED_TENANTS
            ));
        }
        out
    }

    /// Who owns `session_id` (always this replica outside a fleet).
    pub fn owner<'a>(&self, session_id: &'a str) -> Owner<'a> {
        match &self.fleet {
            Some(f) => f.owner(session_id),
            None => Owner::Local,
        }
    }

    /// Refuse a session id this replica cannot hold: too long, one of an
    /// earlier run of it, or (where no relay is possible) another
    /// replica's.
    pub fn check_local_owner(&self, id: &str) -> Result<(), GatewayError> {
        crate::rpc::check_id_length("session id", id)?;
        match self.owner(id) {
            Owner::Local => Ok(()),
            Owner::Restarted(r) => Err(GatewayError::OwnerLost {
                session: id.to_owned(),
                replica: r.to_owned(),
            }),
            Owner::Peer(r) => Err(GatewayError::OwnerUnavailable {
                session: id.to_owned(),
                replica: r.to_owned(),
                detail: "not reachable from this connection".to_owned(),
            }),
        }
    }

    /// Relays live through this replica.
    pub fn live_relays(&self) -> usize {
        self.relays.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Count a relay while the guard lives.
    pub fn relay_guard(self: &Arc<Self>) -> RelayGuard {
        self.relays
            .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        self.metrics.relays.inc();
        self.metrics.relays_started.inc();
        RelayGuard(self.clone())
    }

    pub fn is_draining(&self) -> bool {
        self.draining.is_cancelled()
    }

    /// Completes once draining has started.
    pub async fn draining_started(&self) {
        self.draining.cancelled().await;
    }

    /// Completes once the gateway has stopped (listeners and connections
    /// end).
    pub async fn stopped(&self) {
        self.stopped.cancelled().await;
    }

    pub fn is_stopped(&self) -> bool {
        self.stopped.is_cancelled()
    }

    /// Step 1 of the shutdown order: refuse new work.
    pub(crate) fn start_draining(&self) {
        self.draining.cancel();
        self.metrics.draining.set(1);
        // Idle executor links would open no session here any more: let
        // their executors register again, through the balancer, elsewhere.
        if let Some(r) = &self.executors {
            r.close_idle();
        }
    }

    /// Steps 3–4: stop listeners and connections, kill every remaining
    /// process, retire the backends and the reaper.
    pub(crate) fn stop(&self) {
        self.stopped.cancel();
        self.auth_stop.lock().cancel();
        self.sessions.kill_all();
        self.tenants.retire();
        if let Some(r) = &self.reaper {
            // Closing its pipe makes it kill whatever is still registered.
            r.stop();
        }
    }

    /// `/accounting`: one JSON line per tenant seen since the start (or
    /// `only` that one), active or retired, with its usage.
    pub fn accounting_text(&self, only: Option<&str>) -> String {
        let (accounts, dropped) = self.tenants.accounts(only);
        let mut out = String::new();
        for a in accounts {
            if let Ok(line) = serde_json::to_string(&a) {
                out.push_str(&line);
                out.push('\n');
            }
        }
        if dropped > 0 {
            tracing::warn!(dropped, "tenant accounts not kept: too many tenants");
        }
        out
    }

    /// Prometheus text exposition.
    pub fn metrics_text(&self) -> String {
        self.tenants.refresh_disk_metrics();
        self.metrics.encode()
    }
}

/// The authenticator of `settings`, knowing the tenants of `tenants`
/// (whatever a reload puts there).
fn authenticator(
    settings: &Settings,
    metrics: &Arc<Metrics>,
    tenants: &TenantSetCell,
) -> Result<Authenticator, ConfigError> {
    let tenants = tenants.clone();
    let mut auth = Authenticator::new(
        &settings.auth,
        Arc::new(move |name: &str| tenants.load().knows(name)),
    )
    .map_err(ConfigError)?;
    let fetches = metrics.jwks_fetches.clone();
    auth.on_fetch(move |outcome| {
        fetches
            .get_or_create(&crate::metrics::OutcomeLabel {
                outcome: outcome.to_owned(),
            })
            .inc();
    });
    Ok(auth)
}

/// Settings a reload cannot apply (listeners, fleet, executors and the
/// gateway-wide caps), by section.
/// A pool serves the tenant it started with until a restart: a reload
/// that names another tenant for it is refused (that tenant would reach
/// the first one's executors and resume its sessions).
fn refuse_pool_moves(
    running: &crate::registry::Registry,
    new: &crate::config::ExecutorsSettings,
) -> Result<(), ConfigError> {
    for p in new.pools.values() {
        if let Some(pool) = running.pool(&p.name)
            && pool.tenant() != p.tenant
        {
            return Err(ConfigError(format!(
                "executors.pools.{} serves tenant `{}` until a restart; it cannot be given to tenant `{}` by a reload (its executors and sessions are the first tenant's)",
                p.name,
                pool.tenant(),
                p.tenant
            )));
        }
    }
    Ok(())
}

fn restart_needed(old: &Settings, new: &Settings) -> Vec<&'static str> {
    let mut out = Vec::new();
    if (old.listen, old.grpc_listen, old.admin_listen)
        != (new.listen, new.grpc_listen, new.admin_listen)
    {
        out.push("listeners");
    }
    if format!("{:?}", old.fleet) != format!("{:?}", new.fleet) {
        out.push("[fleet]");
    }
    // Access keys (and revocations) are reloaded; the rest is not.
    let keyless = |e: &Option<crate::config::ExecutorsSettings>| {
        let mut e = e.clone();
        for p in e.iter_mut().flat_map(|e| e.pools.values_mut()) {
            p.access_keys.clear();
        }
        format!("{e:?}")
    };
    if keyless(&old.executors) != keyless(&new.executors) {
        out.push("[executors]");
    }
    if format!("{:?}", old.isolation) != format!("{:?}", new.isolation) {
        out.push("[isolation]");
    }
    // The store is opened with the settings of the start.
    if old.images != new.images {
        out.push("[images]");
    }
    // As the files said: the fit may lower caps left at their defaults
    // differently for another set of tenants, which is no change of the
    // file's.
    if (
        old.caps_as_written(),
        old.max_sessions,
        old.tenant_idle_timeout,
    ) != (
        new.caps_as_written(),
        new.max_sessions,
        new.tenant_idle_timeout,
    ) {
        out.push("[server] caps");
    }
    out
}

/// Retire idle tenants until the gateway is gone.
async fn sweep(gw: std::sync::Weak<Gateway>) {
    loop {
        let Some(g) = gw.upgrade() else { return };
        let every = (g.settings.tenant_idle_timeout / 4)
            .clamp(Duration::from_millis(100), Duration::from_secs(5));
        if g.is_stopped() {
            return;
        }
        let taken = g.tenants.take_retiring();
        if !taken.is_empty() {
            let g2 = g.clone();
            let _ = tokio::task::spawn_blocking(move || g2.tenants.retire_taken(taken)).await;
        }
        g.metrics
            .tenants_active
            .set(i64::try_from(g.tenants.active().len()).unwrap_or(i64::MAX));
        drop(g);
        tokio::time::sleep(every).await;
    }
}

/// A live relay; see [`Gateway::relay_guard`].
pub struct RelayGuard(Arc<Gateway>);

impl Drop for RelayGuard {
    fn drop(&mut self) {
        self.0
            .relays
            .fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
        self.0.metrics.relays.dec();
    }
}
