//! Every metric family, in one place; handles are passed in, never global.
//! Tenant labels carry only configured tenant names (a bounded set);
//! authentication failures are labelled by reason only.

use parking_lot::Mutex;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TenantLabel {
    pub tenant: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    pub tenant: String,
    pub method: String,
    pub outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct MethodLabel {
    pub method: String,
}

/// A series of a tenant's in a family with more labels.
#[derive(Debug)]
enum Remembered {
    Request(RequestLabels),
    Shed(ShedLabels),
    Quota(QuotaLabels),
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    pub reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ShedLabels {
    pub tenant: String,
    pub reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct QuotaLabels {
    pub tenant: String,
    pub quota: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LayerLabel {
    pub layer: String,
}

/// The gateway's metrics.
pub struct Metrics {
    registry: Mutex<Registry>,
    pub sessions: Family<TenantLabel, Gauge>,
    pub processes: Family<TenantLabel, Gauge>,
    pub requests: Family<RequestLabels, Counter>,
    pub spawn_seconds: Family<TenantLabel, Histogram>,
    /// How long calls take, by method (all tenants: a tenant label times
    /// the buckets would be most of a large fleet's series).
    pub request_seconds: Family<MethodLabel, Histogram>,
    pub output_bytes: Family<TenantLabel, Counter>,
    pub processes_started: Family<TenantLabel, Counter>,
    pub tenants_active: Gauge,
    /// Each tenant's series of the families labelled by more than the
    /// tenant (so they go with it).
    tenant_series: Mutex<std::collections::HashMap<String, Vec<Remembered>>>,
    pub config_reloads: Family<OutcomeLabel, Counter>,
    pub auth_failures: Family<ReasonLabel, Counter>,
    pub shed: Family<ShedLabels, Counter>,
    pub quota_refused: Family<QuotaLabels, Counter>,
    pub isolation_layer: Family<LayerLabel, Gauge>,
    pub workers: Family<TenantLabel, Gauge>,
    pub worker_deaths: Family<TenantLabel, Counter>,
    pub draining: Gauge,
    /// Calls being handled (all tenants): a draining gateway answers them
    /// before it closes their connections.
    pub calls_in_flight: Gauge,
    /// Relays to sessions' owner replicas, live (fleet).
    pub relays: Gauge,
    /// MCP sessions open on the client listener (module `mcp::http`).
    pub mcp_sessions: Gauge,
    /// Relays started from this replica, in all.
    pub relays_started: Counter,
    /// Audit events written, and dropped (queue full or cut off).
    pub audit_events: Counter,
    pub audit_dropped: Counter,
    /// `exec_gateway_webhook_…` (module `webhooks`).
    pub webhooks: crate::webhooks::WebhookMetrics,
    /// Peer requests refused for a bad fleet credential, by reason.
    pub fleet_auth_failures: Family<ReasonLabel, Counter>,
    pub outbound_bytes: Family<TenantLabel, Gauge>,
    pub outbound_bytes_peak: Family<TenantLabel, Gauge>,
    pub retained_output_bytes: Family<TenantLabel, Gauge>,
    pub inbound_bytes: Family<TenantLabel, Gauge>,
    pub inbound_bytes_peak: Family<TenantLabel, Gauge>,
    pub inbound_waiting: Family<TenantLabel, Gauge>,
    pub tmp_bytes: Family<TenantLabel, Gauge>,
    pub disk_bytes: Family<TenantLabel, Gauge>,
    pub snapshots: Family<TenantLabel, Gauge>,
    pub snapshot_bytes: Family<TenantLabel, Gauge>,
    pub forks: Family<TenantLabel, Gauge>,
    pub preview_requests: Family<TenantLabel, Counter>,
    pub egress_allowed: Family<TenantLabel, Counter>,
    pub egress_denied: Family<TenantLabel, Counter>,
    pub outbound_waiting: Family<TenantLabel, Gauge>,
    pub connections: Family<ConnectionLabels, Gauge>,
    pub connections_refused: Family<ConnectionRefusedLabels, Counter>,
    pub jwks_fetches: Family<OutcomeLabel, Counter>,
    /// Executors registered per pool (remote executors).
    pub executors: Family<PoolLabel, Gauge>,
    /// Idle links (ready to open a session) per pool.
    pub executor_idle_links: Family<PoolLabel, Gauge>,
    /// Sessions open on each executor.
    pub executor_sessions: Family<ExecutorLabels, Gauge>,
    /// Registrations refused, by reason.
    pub registrations_refused: Family<ReasonLabel, Counter>,
    /// Registrations accepted (tickets issued), in all.
    pub registrations: Counter,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PoolLabel {
    pub pool: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ExecutorLabels {
    pub pool: String,
    pub executor: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ConnectionLabels {
    /// `websocket` or `grpc`.
    pub door: String,
    /// `unauthenticated` or `authenticated`.
    pub state: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ConnectionRefusedLabels {
    pub door: String,
    /// `unauthenticated_total`, `unauthenticated_per_source`, `evicted_oldest`,
    /// `connections`, `tenant_connections`, `handshake_timeout`.
    pub reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabel {
    pub outcome: String,
}

fn request_histogram() -> Histogram {
    // 100 µs … ~100 s.
    Histogram::new(prometheus_client::metrics::histogram::exponential_buckets(
        0.000_1, 4.0, 11,
    ))
}

fn spawn_histogram() -> Histogram {
    // 50 µs … ~400 ms.
    Histogram::new(prometheus_client::metrics::histogram::exponential_buckets(
        0.000_05, 2.0, 14,
    ))
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Count one request of `tenant` by method and outcome (`ok` or the
    /// error's kind).
    pub fn count_request(&self, tenant: &str, method: &str, outcome: &str) {
        let l = RequestLabels {
            tenant: tenant.to_owned(),
            method: method.to_owned(),
            outcome: outcome.to_owned(),
        };
        self.count(&self.requests, tenant, l, Remembered::Request);
    }

    /// Count a call of `tenant` shed for `reason`.
    pub fn count_shed(&self, tenant: &str, reason: &str) {
        let l = ShedLabels {
            tenant: tenant.to_owned(),
            reason: reason.to_owned(),
        };
        self.count(&self.shed, tenant, l, Remembered::Shed);
    }

    /// Count a call of `tenant` refused by its `quota`.
    pub fn count_quota(&self, tenant: &str, quota: &str) {
        let l = QuotaLabels {
            tenant: tenant.to_owned(),
            quota: quota.to_owned(),
        };
        self.count(&self.quota_refused, tenant, l, Remembered::Quota);
    }

    /// Count one in `family`'s series `l` of `tenant`'s, remembering a new
    /// series so it goes with the tenant.
    fn count<L>(
        &self,
        family: &Family<L, Counter>,
        tenant: &str,
        l: L,
        remembered: fn(L) -> Remembered,
    ) where
        L: Clone + std::hash::Hash + Eq + EncodeLabelSet + std::fmt::Debug + Send + Sync + 'static,
    {
        if let Some(c) = family.get(&l) {
            c.inc();
            return;
        }
        family.get_or_create(&l).inc();
        self.remember(tenant, remembered(l));
    }

    /// Note a series of `tenant`'s with more labels than the tenant, to
    /// drop with it ([`Self::forget_tenant`]).
    fn remember(&self, tenant: &str, r: Remembered) {
        self.tenant_series
            .lock()
            .entry(tenant.to_owned())
            .or_default()
            .push(r);
    }

    pub fn new() -> Self {
        let mut r = Registry::with_prefix("exec_gateway");
        let sessions = Family::<TenantLabel, Gauge>::default();
        let processes = Family::<TenantLabel, Gauge>::default();
        let requests = Family::<RequestLabels, Counter>::default();
        let spawn_seconds = Family::<TenantLabel, Histogram>::new_with_constructor(
            spawn_histogram as fn() -> Histogram,
        );
        let request_seconds = Family::<MethodLabel, Histogram>::new_with_constructor(
            request_histogram as fn() -> Histogram,
        );
        r.register(
            "request_seconds",
            "Time from a call entering the stack to its answer, by method",
            request_seconds.clone(),
        );
        let output_bytes = Family::<TenantLabel, Counter>::default();
        let processes_started = Family::<TenantLabel, Counter>::default();
        let tenants_active = Gauge::default();
        let config_reloads = Family::<OutcomeLabel, Counter>::default();
        r.register(
            "config_reloads",
            "Configuration reloads (SIGHUP) by outcome: ok, refused",
            config_reloads.clone(),
        );
        r.register(
            "processes_started",
            "Processes started (per active tenant; /accounting keeps every tenant's)",
            processes_started.clone(),
        );
        r.register(
            "tenants_active",
            "Tenants with workers, cgroups and namespaces now",
            tenants_active.clone(),
        );
        let auth_failures = Family::<ReasonLabel, Counter>::default();
        let shed = Family::<ShedLabels, Counter>::default();
        let quota_refused = Family::<QuotaLabels, Counter>::default();
        let isolation_layer = Family::<LayerLabel, Gauge>::default();
        let draining = Gauge::default();
        let calls_in_flight = Gauge::default();
        let workers = Family::<TenantLabel, Gauge>::default();
        let worker_deaths = Family::<TenantLabel, Counter>::default();
        r.register("workers", "Live worker processes", workers.clone());
        r.register(
            "worker_deaths",
            "Worker processes that ended unexpectedly (their processes were reported failed)",
            worker_deaths.clone(),
        );
        r.register("sessions", "Sessions in the registry", sessions.clone());
        r.register(
            "processes_running",
            "Processes not yet closed",
            processes.clone(),
        );
        r.register(
            "requests",
            "Requests by method and outcome",
            requests.clone(),
        );
        r.register(
            "spawn_seconds",
            "Time to spawn a process (fork/exec until the child runs)",
            spawn_seconds.clone(),
        );
        r.register(
            "output_bytes",
            "Process output bytes produced",
            output_bytes.clone(),
        );
        r.register(
            "auth_failures",
            "Refused authentications by reason",
            auth_failures.clone(),
        );
        r.register(
            "shed",
            "Requests shed for load (rate, tenant concurrency, gateway concurrency)",
            shed.clone(),
        );
        r.register(
            "quota_refused",
            "Requests refused by a tenant quota",
            quota_refused.clone(),
        );
        r.register(
            "isolation_layer",
            "1 if an isolation layer is active, 0 if not",
            isolation_layer.clone(),
        );
        r.register("draining", "1 while shutting down", draining.clone());
        let mcp_sessions = Gauge::default();
        r.register(
            "mcp_sessions",
            "MCP sessions open on the client listener",
            mcp_sessions.clone(),
        );
        r.register(
            "calls_in_flight",
            "Calls being handled, all tenants",
            calls_in_flight.clone(),
        );
        let relays = Gauge::default();
        r.register(
            "relays",
            "Connections and calls relayed from this replica to their sessions' owners",
            relays.clone(),
        );
        let relays_started = Counter::default();
        r.register(
            "relays_started",
            "Connections and calls relayed from this replica to their sessions' owners, in all",
            relays_started.clone(),
        );
        let audit_events = Counter::default();
        r.register(
            "audit_events",
            "Audit events written to the audit trail",
            audit_events.clone(),
        );
        let audit_dropped = Counter::default();
        r.register(
            "audit_events_dropped",
            "Audit events not written: the writer's queue was full, or their source's byte budget for the minute was spent",
            audit_dropped.clone(),
        );
        let webhooks = crate::webhooks::WebhookMetrics::default();
        webhooks.register(&mut r);
        let fleet_auth_failures = Family::<ReasonLabel, Counter>::default();
        r.register(
            "fleet_auth_failures",
            "Requests on the peer listener refused for a missing or bad fleet credential",
            fleet_auth_failures.clone(),
        );
        let outbound_bytes = Family::<TenantLabel, Gauge>::default();
        let outbound_bytes_peak = Family::<TenantLabel, Gauge>::default();
        let outbound_waiting = Family::<TenantLabel, Gauge>::default();
        let retained_output_bytes = Family::<TenantLabel, Gauge>::default();
        let inbound_bytes = Family::<TenantLabel, Gauge>::default();
        let inbound_bytes_peak = Family::<TenantLabel, Gauge>::default();
        let inbound_waiting = Family::<TenantLabel, Gauge>::default();
        let tmp_bytes = Family::<TenantLabel, Gauge>::default();
        let disk_bytes = Family::<TenantLabel, Gauge>::default();
        let snapshots = Family::<TenantLabel, Gauge>::default();
        let snapshot_bytes = Family::<TenantLabel, Gauge>::default();
        let forks = Family::<TenantLabel, Gauge>::default();
        let preview_requests = Family::<TenantLabel, Counter>::default();
        let egress_allowed = Family::<TenantLabel, Counter>::default();
        let egress_denied = Family::<TenantLabel, Counter>::default();
        r.register(
            "egress_allowed",
            "Connections and DNS queries the tenant's egress_names allowed (docs/isolation.md, Egress by name)",
            egress_allowed.clone(),
        );
        r.register(
            "egress_denied",
            "Connections and DNS queries the tenant's egress_names refused",
            egress_denied.clone(),
        );
        r.register(
            "preview_requests",
            "HTTP requests passed into the tenant's sessions through previews (docs/preview.md)",
            preview_requests.clone(),
        );
        r.register(
            "snapshots",
            "Snapshots the tenant keeps (max_per_tenant), as of the last scrape",
            snapshots.clone(),
        );
        r.register(
            "snapshot_bytes",
            "Bytes the tenant's snapshots take, deleted ones a fork still uses included (max_tenant_bytes), as of the last scrape",
            snapshot_bytes.clone(),
        );
        r.register(
            "forks",
            "Sessions of the tenant working in a fork of a snapshot (max_forks_per_tenant), as of the last scrape",
            forks.clone(),
        );
        r.register(
            "tmp_bytes",
            "Bytes in use in the tenant's private /tmp (a tmpfs of max_tmp_bytes), as of the last scrape",
            tmp_bytes.clone(),
        );
        r.register(
            "disk_bytes",
            "Bytes the tenant's root uses under its project quota (max_disk_bytes; only where the disk layer is active), as of the last scrape",
            disk_bytes.clone(),
        );
        r.register(
            "inbound_bytes",
            "Bytes received from the tenant's clients and not yet done with (messages being assembled, requests waiting or running)",
            inbound_bytes.clone(),
        );
        r.register(
            "inbound_bytes_peak",
            "Highest inbound_bytes since start",
            inbound_bytes_peak.clone(),
        );
        r.register(
            "inbound_waiting",
            "Connections whose reads wait for room in the tenant's or the gateway's inbound budget",
            inbound_waiting.clone(),
        );
        r.register(
            "retained_output_bytes",
            "Process output bytes retained for the tenant's clients to read (closed processes until their retention ends; counted by max_retained_output_bytes)",
            retained_output_bytes.clone(),
        );
        let connections = Family::<ConnectionLabels, Gauge>::default();
        let connections_refused = Family::<ConnectionRefusedLabels, Counter>::default();
        let jwks_fetches = Family::<OutcomeLabel, Counter>::default();
        r.register(
            "outbound_bytes",
            "Bytes of replies and notifications held for the tenant's clients (reserved before they are built, released once written)",
            outbound_bytes.clone(),
        );
        r.register(
            "outbound_bytes_peak",
            "Highest outbound_bytes since start",
            outbound_bytes_peak.clone(),
        );
        r.register(
            "outbound_waiting",
            "Replies and notifications waiting for room in the tenant's or their connection's budget",
            outbound_waiting.clone(),
        );
        r.register(
            "connections",
            "Open connections by door and whether they have authenticated",
            connections.clone(),
        );
        r.register(
            "connections_refused",
            "Connections closed by a connection limit or the handshake timeout",
            connections_refused.clone(),
        );
        r.register(
            "jwks_fetches",
            "JWKS fetches by outcome",
            jwks_fetches.clone(),
        );
        let executors = Family::<PoolLabel, Gauge>::default();
        let executor_idle_links = Family::<PoolLabel, Gauge>::default();
        let executor_sessions = Family::<ExecutorLabels, Gauge>::default();
        let registrations_refused = Family::<ReasonLabel, Counter>::default();
        let registrations = Counter::default();
        r.register(
            "executors",
            "Remote executors connected, per pool",
            executors.clone(),
        );
        r.register(
            "executor_idle_links",
            "Executor links ready to open a session, per pool",
            executor_idle_links.clone(),
        );
        r.register(
            "executor_sessions",
            "Sessions open on each remote executor",
            executor_sessions.clone(),
        );
        r.register(
            "executor_registrations_refused",
            "Executor registrations and rendezvous refused, by reason",
            registrations_refused.clone(),
        );
        r.register(
            "executor_registrations",
            "Executor registrations accepted",
            registrations.clone(),
        );
        Self {
            registry: Mutex::new(r),
            executors,
            executor_idle_links,
            executor_sessions,
            registrations_refused,
            registrations,
            sessions,
            processes,
            requests,
            spawn_seconds,
            request_seconds,
            output_bytes,
            processes_started,
            tenants_active,
            tenant_series: Mutex::default(),
            config_reloads,
            auth_failures,
            shed,
            quota_refused,
            isolation_layer,
            workers,
            worker_deaths,
            draining,
            calls_in_flight,
            relays,
            mcp_sessions,
            relays_started,
            audit_events,
            audit_dropped,
            webhooks,
            fleet_auth_failures,
            outbound_bytes,
            outbound_bytes_peak,
            outbound_waiting,
            retained_output_bytes,
            inbound_bytes,
            inbound_bytes_peak,
            inbound_waiting,
            tmp_bytes,
            disk_bytes,
            snapshots,
            snapshot_bytes,
            forks,
            preview_requests,
            egress_allowed,
            egress_denied,
            connections,
            connections_refused,
            jwks_fetches,
        }
    }

    /// Per-tenant handles, created once (no label allocation on hot paths).
    pub fn tenant(&self, tenant: &str) -> TenantMetrics {
        let l = TenantLabel {
            tenant: tenant.to_owned(),
        };
        TenantMetrics {
            name: tenant.to_owned(),
            sessions: self.sessions.get_or_create(&l).clone(),
            processes: self.processes.get_or_create(&l).clone(),
            spawn_seconds: self.spawn_seconds.get_or_create(&l).clone(),
            output_bytes: self.output_bytes.get_or_create(&l).clone(),
            started: self.processes_started.get_or_create(&l).clone(),
            own_started: Counter::default(),
            workers: self.workers.get_or_create(&l).clone(),
            worker_deaths: self.worker_deaths.get_or_create(&l).clone(),
            outbound_bytes: self.outbound_bytes.get_or_create(&l).clone(),
            outbound_bytes_peak: self.outbound_bytes_peak.get_or_create(&l).clone(),
            outbound_waiting: self.outbound_waiting.get_or_create(&l).clone(),
            retained_output_bytes: self.retained_output_bytes.get_or_create(&l).clone(),
            inbound_bytes: self.inbound_bytes.get_or_create(&l).clone(),
            inbound_bytes_peak: self.inbound_bytes_peak.get_or_create(&l).clone(),
            inbound_waiting: self.inbound_waiting.get_or_create(&l).clone(),
            tmp_bytes: self.tmp_bytes.get_or_create(&l).clone(),
            disk_bytes: self.disk_bytes.get_or_create(&l).clone(),
            snapshots: self.snapshots.get_or_create(&l).clone(),
            snapshot_bytes: self.snapshot_bytes.get_or_create(&l).clone(),
            forks: self.forks.get_or_create(&l).clone(),
            preview_requests: self.preview_requests.get_or_create(&l).clone(),
            egress_allowed: self.egress_allowed.get_or_create(&l).clone(),
            egress_denied: self.egress_denied.get_or_create(&l).clone(),
        }
    }

    /// Drop a retired tenant's series: only active tenants have any, so
    /// thousands of tenants that come and go never pile up labels.
    pub fn forget_tenant(&self, tenant: &str) {
        let l = TenantLabel {
            tenant: tenant.to_owned(),
        };
        self.sessions.remove(&l);
        self.processes.remove(&l);
        self.spawn_seconds.remove(&l);
        self.output_bytes.remove(&l);
        self.processes_started.remove(&l);
        self.workers.remove(&l);
        self.worker_deaths.remove(&l);
        self.outbound_bytes.remove(&l);
        self.outbound_bytes_peak.remove(&l);
        self.outbound_waiting.remove(&l);
        self.retained_output_bytes.remove(&l);
        self.inbound_bytes.remove(&l);
        self.inbound_bytes_peak.remove(&l);
        self.inbound_waiting.remove(&l);
        self.tmp_bytes.remove(&l);
        self.disk_bytes.remove(&l);
        self.snapshots.remove(&l);
        self.snapshot_bytes.remove(&l);
        self.forks.remove(&l);
        self.preview_requests.remove(&l);
        self.egress_allowed.remove(&l);
        self.egress_denied.remove(&l);
        let more = self.tenant_series.lock().remove(tenant).unwrap_or_default();
        for r in more {
            match r {
                Remembered::Request(l) => {
                    self.requests.remove(&l);
                }
                Remembered::Shed(l) => {
                    self.shed.remove(&l);
                }
                Remembered::Quota(l) => {
                    self.quota_refused.remove(&l);
                }
            }
        }
    }

    /// The gauge of open connections of `door` in `state`.
    pub fn connection_gauge(&self, door: &str, state: &str) -> Gauge {
        self.connections
            .get_or_create(&ConnectionLabels {
                door: door.to_owned(),
                state: state.to_owned(),
            })
            .clone()
    }

    pub fn connection_refused(&self, door: &str, reason: &str) {
        self.connections_refused
            .get_or_create(&ConnectionRefusedLabels {
                door: door.to_owned(),
                reason: reason.to_owned(),
            })
            .inc();
    }

    pub fn auth_failure(&self, reason: &str) {
        self.auth_failures
            .get_or_create(&ReasonLabel {
                reason: reason.to_owned(),
            })
            .inc();
    }

    /// Prometheus text exposition.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        if let Err(e) = prometheus_client::encoding::text::encode(&mut out, &self.registry.lock()) {
            tracing::error!(error = %e, "metrics encoding failed");
        }
        out
    }
}

/// Metric handles of one tenant.
#[derive(Clone, Debug)]
pub struct TenantMetrics {
    pub name: String,
    pub sessions: Gauge,
    pub processes: Gauge,
    pub spawn_seconds: Histogram,
    pub output_bytes: Counter,
    /// Processes started.
    pub started: Counter,
    /// The same for this activation alone (unexported; the account's).
    pub own_started: Counter,
    pub workers: Gauge,
    pub worker_deaths: Counter,
    pub outbound_bytes: Gauge,
    pub outbound_bytes_peak: Gauge,
    pub outbound_waiting: Gauge,
    /// Output bytes retained over all the tenant's processes (what its
    /// `max_retained_output_bytes` quota counts).
    pub retained_output_bytes: Gauge,
    pub inbound_bytes: Gauge,
    pub inbound_bytes_peak: Gauge,
    pub inbound_waiting: Gauge,
    pub tmp_bytes: Gauge,
    pub disk_bytes: Gauge,
    pub snapshots: Gauge,
    pub snapshot_bytes: Gauge,
    pub forks: Gauge,
    pub preview_requests: Counter,
    pub egress_allowed: Counter,
    pub egress_denied: Counter,
}

impl TenantMetrics {
    /// Detached handles for library use without a registry.
    pub fn detached(name: &str) -> Self {
        Self {
            name: name.to_owned(),
            sessions: Gauge::default(),
            processes: Gauge::default(),
            spawn_seconds: spawn_histogram(),
            output_bytes: Counter::default(),
            started: Counter::default(),
            own_started: Counter::default(),
            workers: Gauge::default(),
            worker_deaths: Counter::default(),
            outbound_bytes: Gauge::default(),
            outbound_bytes_peak: Gauge::default(),
            outbound_waiting: Gauge::default(),
            retained_output_bytes: Gauge::default(),
            inbound_bytes: Gauge::default(),
            inbound_bytes_peak: Gauge::default(),
            inbound_waiting: Gauge::default(),
            tmp_bytes: Gauge::default(),
            disk_bytes: Gauge::default(),
            snapshots: Gauge::default(),
            snapshot_bytes: Gauge::default(),
            forks: Gauge::default(),
            preview_requests: Counter::default(),
            egress_allowed: Counter::default(),
            egress_denied: Counter::default(),
        }
    }
}
