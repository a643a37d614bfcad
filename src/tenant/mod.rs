//! Tenants: each has a backend where its sessions run (its filesystem root,
//! process slots, retained-output budget, cgroup, sandbox and workers), a
//! rate limiter, an in-flight semaphore and a session count.
//!
//! A tenant is *active* from its first authenticated caller until nothing
//! holds it (no connection, session or call) for `tenant_idle_timeout`;
//! then it is retired: its workers end and its cgroups, mounts, namespaces,
//! metric series and descriptors are released, its usage is kept in the
//! account ([`accounting`]). Tenants come from `[tenants.NAME]` or, for any
//! other name a token carries, from `[tenant_template]`. At most
//! `max_active_tenants` are active at once, so every per-tenant map and
//! metric label stays bounded however many tenants there are.

mod accounting;
mod build;
mod confine;
mod registry;

pub use accounting::{Account, Usage};
pub use confine::effective_network;
pub use registry::{TenantSet, TenantSetCell, Tenants};

use std::num::NonZeroU32;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use arc_swap::ArcSwap;
use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};
use tokio::sync::Semaphore;

use crate::backend::Backend;
use crate::backend::remote::RemoteBackend;
use crate::config::TenantSettings;
use crate::isolation::cgroup::TenantCgroup;
use crate::isolation::disk::RootQuota;
use crate::metrics::TenantMetrics;
use crate::outbound::ByteBudget;

/// One active tenant.
pub struct Tenant {
    pub name: Arc<str>,
    /// What names this activation's cgroup, private `/tmp` and network
    /// files: the name, with `@N` from the second activation of one name
    /// alive at once (a reload changed what only a new activation applies,
    /// while the old one still serves its live sessions).
    pub instance: Arc<str>,
    /// As when it was activated (limits a reload changes in place are
    /// read from their own fields: `max_sessions`, the limiter, the cgroup).
    pub settings: TenantSettings,
    /// Where the tenant's sessions run.
    pub backend: Arc<dyn Backend>,
    /// Its executor pool, when it has one (`pool`; `placement` decides).
    pub remote: Option<Arc<RemoteBackend>>,
    limiter: ArcSwap<DefaultDirectRateLimiter>,
    /// Requests in flight; a permit is held for the duration of a call.
    pub in_flight: Arc<Semaphore>,
    /// Sessions currently registered for this tenant.
    pub sessions: AtomicUsize,
    max_sessions: AtomicUsize,
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
    /// Its cgroup (limits, usage for the account), where it has one.
    pub cgroup: Option<Arc<TenantCgroup>>,
    /// Its own network namespace, where it has one.
    pub net: Option<Arc<crate::isolation::egress::TenantNet>>,
    /// Its egress by name (resolver and proxy in its namespace), where its
    /// settings name hosts.
    pub egress: Option<Arc<crate::egress::TenantEgress>>,
    /// The maker of the gateway's sockets in its namespace.
    pub sockets: Option<Arc<crate::egress::Sockets>>,
    /// Where its local backend finds its egress by name once it runs.
    pub egress_slot: Option<crate::backend::local::EgressSlot>,
    /// The image its processes see as `/` (the view stays mounted while
    /// the activation lives).
    pub image: Option<Arc<crate::image::View>>,
    /// Its snapshots and forks (a tenant that can have them: a root of its
    /// own, the namespaces and workers layers).
    pub snapshots: Option<Arc<crate::backend::local::Snapshots>>,
    /// Its sessions' image pulls, one at a time: a tenant asking for one
    /// new image after another holds one of the store's pull slots, never
    /// all of them.
    pub image_pulls: Arc<Semaphore>,
    /// A reload removed it: new sessions are refused, live ones go on.
    removed: AtomicBool,
    /// A reload changed what only a new activation applies: it is retired
    /// as soon as nothing holds it, without waiting to be idle.
    stale: AtomicBool,
}

impl Tenant {
    /// Whether its sessions may run on its executor pool (its placement is
    /// not `local` and it has a pool).
    pub fn places_on_executors(&self) -> bool {
        self.remote.is_some() && self.settings.placement != crate::config::Placement::Local
    }

    /// A tenant with `settings`, running on `backend`, with its limits.
    pub fn assemble(
        name: &str,
        settings: TenantSettings,
        backend: Arc<dyn Backend>,
        tm: TenantMetrics,
    ) -> Tenant {
        let t = &settings;
        Tenant {
            name: Arc::from(name),
            instance: Arc::from(name),
            backend,
            remote: None,
            limiter: ArcSwap::from_pointee(limiter(t)),
            in_flight: Arc::new(Semaphore::new(t.max_in_flight)),
            sessions: AtomicUsize::new(0),
            max_sessions: AtomicUsize::new(t.max_sessions),
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
            tmp: None,
            root_quota: None,
            cgroup: None,
            net: None,
            egress: None,
            sockets: None,
            egress_slot: None,
            image: None,
            snapshots: None,
            image_pulls: Arc::new(Semaphore::new(1)),
            removed: AtomicBool::new(false),
            stale: AtomicBool::new(false),
            settings,
        }
    }

    /// Take one request from the tenant's rate; `Err` says when to retry.
    pub fn check_rate(&self) -> Result<(), governor::NotUntil<governor::clock::QuantaInstant>> {
        self.limiter.load().check()
    }

    /// Count a new session, or refuse it with the sessions quota error (or,
    /// once a reload removed the tenant, as an unknown tenant).
    pub fn claim_session(&self) -> Result<(), crate::error::GatewayError> {
        if self.is_removed() {
            return Err(unknown_tenant());
        }
        if self.try_add_session() {
            Ok(())
        } else {
            Err(crate::error::GatewayError::QuotaExceeded {
                quota: "sessions",
                limit: self.max_sessions.load(Ordering::Acquire) as u64,
                retry_after_ms: None,
            })
        }
    }

    /// Count a new session, or refuse with the sessions quota.
    pub fn try_add_session(&self) -> bool {
        let max = self.max_sessions.load(Ordering::Acquire);
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

    pub fn is_removed(&self) -> bool {
        self.removed.load(Ordering::Acquire)
    }

    /// A reload changed what only a new activation applies: new callers
    /// get a new one.
    pub fn is_stale(&self) -> bool {
        self.stale.load(Ordering::Acquire)
    }

    /// Apply what a reload changed. Rate, sessions and cgroup limits
    /// change in place; anything else marks the tenant stale (it takes the
    /// new settings at its next activation). Returns whether it did.
    fn update(&self, new: &TenantSettings) -> bool {
        self.removed.store(false, Ordering::Release);
        let now = &self.settings;
        let mut in_place = now.clone();
        in_place.requests_per_second = new.requests_per_second;
        in_place.burst = new.burst;
        in_place.max_sessions = new.max_sessions;
        in_place.cgroup_limits = new.cgroup_limits.clone();
        // Its namespace's rules: tightened egress reaches its live
        // sessions at once, not only a new activation's.
        // (Into or out of names: a new activation starts or ends the proxy.)
        if now.egress != new.egress
            && now.egress.names.is_some() == new.egress.names.is_some()
            && let Some(net) = &self.net
        {
            match net.set_egress(&new.egress) {
                Ok(true) => {
                    if let Some(eg) = &self.egress {
                        eg.set_ask(new.egress.ask);
                    }
                    if let (Some(eg), Some(names)) = (&self.egress, &new.egress.names)
                        && now.egress.names.as_ref() != Some(names)
                    {
                        let closed = eg.set_names(names.clone());
                        crate::audit::emit(
                            "egress.changed",
                            &crate::audit::Who {
                                tenant: Some(&self.name),
                                ..Default::default()
                            },
                            serde_json::json!({
                                "names": crate::audit::clip_list(names.entries().iter().map(String::as_str)),
                                "closed": closed,
                                "by": "reload",
                            }),
                        );
                    }
                    in_place.egress = new.egress.clone();
                }
                Ok(false) => {}
                Err(e) => {
                    tracing::warn!(tenant = %self.name, error = %e, "reload: cannot change the live tenant's egress rules; new sessions get them through a new activation");
                }
            }
        }
        if (now.requests_per_second, now.burst) != (new.requests_per_second, new.burst) {
            self.limiter.store(Arc::new(limiter(new)));
        }
        self.max_sessions.store(new.max_sessions, Ordering::Release);
        if now.cgroup_limits != new.cgroup_limits
            && self.cgroup.is_some()
            && let Err(e) = TenantCgroup::create(&self.instance, &new.cgroup_limits)
        {
            tracing::warn!(tenant = %self.name, error = %e, "reload: cannot change the tenant's cgroup limits");
        }
        let stale = in_place != *new;
        if stale {
            self.stale.store(true, Ordering::Release);
        }
        stale
    }
}

/// What a caller of a tenant that does not exist (or no longer) gets.
pub fn unknown_tenant() -> crate::error::GatewayError {
    crate::error::GatewayError::Unauthenticated(crate::auth::AuthError::UnknownTenant.to_string())
}

fn limiter(t: &TenantSettings) -> DefaultDirectRateLimiter {
    let rate = NonZeroU32::new(t.requests_per_second).unwrap_or(NonZeroU32::MIN);
    let burst = NonZeroU32::new(t.burst).unwrap_or(rate);
    RateLimiter::direct(Quota::per_second(rate).allow_burst(burst))
}

/// How many gRPC connections' receive windows half the tenant's inbound
/// budget holds (at least one).
pub fn grpc_window_slots(t: &TenantSettings) -> usize {
    let window = crate::config::GRPC_RECEIVE_WINDOW_BYTES as usize;
    (t.max_inbound_bytes / 2 / window).max(1)
}
