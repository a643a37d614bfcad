//! Remote executors: the registry that executors on other machines join
//! (the seed-001 flow, docs/executors.md).
//!
//! An executor registers (`POST /cloud/executor/{id}/register`, an
//! executor credential as bearer), gets a single-use rendezvous URL on the
//! gateway ([`ticket`]) and dials it; the websocket it opens is a [`link`]
//! on which it serves the exec-server protocol. Each link carries one
//! session at a time (the official executor serves one connection per
//! registration); an executor holds as many links as it registers.
//!
//! Pools are named in configuration and serve one tenant each. A session
//! leases an idle link of the least-loaded executor whose labels match the
//! tenant's `pool_labels`; when the session ends the link is closed and the
//! executor registers again.

mod direct;
mod events;
pub mod link;
pub mod sigv4;
pub mod ticket;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use prometheus_client::metrics::gauge::Gauge;
use serde::{Deserialize, Serialize};

use crate::auth::ExecutorPrincipal;
use crate::config::{
    AccessKey, ExecutorsSettings, MAX_EXECUTOR_LABELS, PoolSettings, Revocations, is_executor_id,
};
use crate::metrics::{ExecutorLabels, Metrics, PoolLabel, ReasonLabel};
pub use direct::{DirectRegisterBody, DirectRegistered};
pub use link::{Link, LinkError, Tap};
use ticket::{Credential, Ticket, Tickets};

/// Largest registration body accepted.
pub const MAX_REGISTRATION_BYTES: usize = 64 * 1024;
/// Longest executor name.
pub const MAX_EXECUTOR_NAME_BYTES: usize = 256;
/// Longest label key or value.
pub const MAX_LABEL_BYTES: usize = 63;

/// A registration request (seed 001; snake_case).
#[derive(Debug, Default, Deserialize)]
pub struct RegisterBody {
    #[serde(default)]
    pub idempotency_id: Option<String>,
    #[serde(default)]
    pub executor_id: Option<String>,
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    #[serde(default)]
    pub metadata: Option<serde_json::Value>,
}

/// The answer to a registration.
#[derive(Debug, Serialize, Deserialize)]
pub struct RegisterResponse {
    /// This registration's id.
    pub id: String,
    pub executor_id: String,
    /// Where to dial: the rendezvous websocket (single use, short-lived).
    pub url: String,
}

/// A refused registration: HTTP status, error code and message (the
/// `{"error":{"code","message"}}` body Codex parses).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub status: u16,
    pub code: &'static str,
    pub message: String,
}

impl Refusal {
    fn new(status: u16, code: &'static str, message: impl Into<String>) -> Refusal {
        Refusal {
            status,
            code,
            message: message.into(),
        }
    }
}

/// Every pool of this gateway, and the tickets they hand out.
pub struct Registry {
    pub settings: ExecutorsSettings,
    tickets: Tickets,
    pools: BTreeMap<String, Arc<Pool>>,
    metrics: Arc<Metrics>,
    /// The revocations and access keys in force (both replaced on
    /// reload); every link watches it.
    standing: tokio::sync::watch::Sender<Arc<Standing>>,
    /// SigV4 signatures seen (until they leave the clock-skew window).
    replays: direct::Replays,
}

impl Registry {
    /// `fleet_key`: tickets are then redeemable on every replica.
    pub fn new(
        settings: ExecutorsSettings,
        fleet_key: Option<&[u8]>,
        metrics: Arc<Metrics>,
        revocations: Arc<Revocations>,
    ) -> Result<Arc<Registry>, String> {
        let tickets = Tickets::new(fleet_key, settings.ticket_ttl)?;
        let pools: BTreeMap<String, Arc<Pool>> = settings
            .pools
            .values()
            .map(|p| (p.name.clone(), Pool::new(p.clone(), metrics.clone())))
            .collect();
        let standing = Standing::new(&pools, &settings, revocations);
        Ok(Arc::new(Registry {
            settings,
            tickets,
            pools,
            metrics,
            standing: tokio::sync::watch::Sender::new(Arc::new(standing)),
            replays: direct::Replays::default(),
        }))
    }

    /// Put a reloaded configuration's revocations and access keys in
    /// force: a live link of a credential revoked, or of a key no longer
    /// configured, is closed. (Keys of a pool this gateway did not start
    /// with wait for a restart, as the pool does.)
    pub fn reload(&self, executors: Option<&ExecutorsSettings>, revocations: Arc<Revocations>) {
        let standing = match executors {
            Some(e) => Standing::new(&self.pools, e, revocations),
            None => Standing::new(&self.pools, &self.settings, revocations),
        };
        self.standing.send_replace(Arc::new(standing));
    }

    /// The revocations and keys in force now.
    fn standing(&self) -> Arc<Standing> {
        self.standing.borrow().clone()
    }

    /// The base of URLs handed to executors: `public_url`, or `ws://` (or
    /// `wss://` on a TLS listener) and the registration's `Host`.
    fn base_url(&self, host: Option<&str>) -> Result<String, Refusal> {
        let scheme = if self.settings.listener_tls {
            "wss"
        } else {
            "ws"
        };
        match (&self.settings.public_url, host) {
            (Some(u), _) => Ok(u.clone()),
            (None, Some(h)) if is_authority(h) => Ok(format!("{scheme}://{h}")),
            (None, _) => Err(Refusal::new(
                400,
                "no_host",
                "no usable Host header and no executors.public_url configured",
            )),
        }
    }

    /// Which revocation names `cred` of `executor`, if one does.
    fn revoked(&self, executor: &str, cred: &Credential) -> Option<String> {
        self.standing().revokes(executor, cred)
    }

    pub fn pool(&self, name: &str) -> Option<&Arc<Pool>> {
        self.pools.get(name)
    }

    /// Count a refusal by reason.
    pub fn refused(&self, reason: &str) {
        self.metrics
            .registrations_refused
            .get_or_create(&ReasonLabel {
                reason: reason.to_owned(),
            })
            .inc();
    }

    /// Register `executor_id` for `principal`'s pool; `host` is the
    /// request's `Host` (the URL base when no `public_url` is set).
    pub fn register(
        &self,
        principal: &ExecutorPrincipal,
        executor_id: &str,
        body: RegisterBody,
        host: Option<&str>,
    ) -> Result<RegisterResponse, Refusal> {
        let result = self.try_register(principal, executor_id, body, host);
        match &result {
            Ok(_) => {
                self.metrics.registrations.inc();
            }
            Err(r) => self.refused(r.code),
        }
        result
    }

    fn try_register(
        &self,
        principal: &ExecutorPrincipal,
        executor_id: &str,
        body: RegisterBody,
        host: Option<&str>,
    ) -> Result<RegisterResponse, Refusal> {
        let Some(pool) = self.pools.get(&principal.pool) else {
            return Err(Refusal::new(
                403,
                "unknown_pool",
                "the credential names a pool this gateway does not have",
            ));
        };
        if !is_executor_id(executor_id) {
            return Err(Refusal::new(
                400,
                "bad_executor_id",
                format!(
                    "an executor id is 1 to {} letters, digits, `_` or `-`",
                    crate::config::MAX_EXECUTOR_ID_BYTES
                ),
            ));
        }
        if body
            .executor_id
            .as_deref()
            .is_some_and(|b| b != executor_id)
        {
            return Err(Refusal::new(
                400,
                "executor_id_mismatch",
                "executor_id in the body differs from the one in the path",
            ));
        }
        let name = body.name.unwrap_or_else(|| executor_id.to_owned());
        if name.len() > MAX_EXECUTOR_NAME_BYTES || name.chars().any(char::is_control) {
            return Err(Refusal::new(
                400,
                "bad_name",
                format!("a name is at most {MAX_EXECUTOR_NAME_BYTES} bytes, no control characters"),
            ));
        }
        if let Some(bound) = principal.executor.as_deref()
            && bound != executor_id
        {
            return Err(Refusal::new(
                403,
                "wrong_executor",
                format!("the credential registers only executor {bound}"),
            ));
        }
        if principal.executor.is_none() {
            self.standing().check_reserved(&pool.name, executor_id)?;
        }
        let cred = Credential {
            jti: principal.jti.clone(),
            sub: principal.subject.clone(),
            key: None,
            exp: principal.expires,
        };
        if let Some(why) = self.revoked(executor_id, &cred) {
            return Err(Refusal::new(
                403,
                "revoked",
                format!("the credential is revoked ({why})"),
            ));
        }
        check_labels(&body.labels)?;
        pool.check_room(executor_id)?;
        let base = self.base_url(host)?;
        let registration = uuid::Uuid::new_v4().to_string();
        let ticket = self
            .tickets
            .issue(Ticket {
                exe: executor_id.to_owned(),
                pool: pool.name.clone(),
                name,
                labels: body.labels,
                reg: registration.clone(),
                jti: String::new(),
                exp: 0,
                aud: String::new(),
                cred,
            })
            .map_err(|e| Refusal::new(500, "internal", e))?;
        tracing::info!(
            pool = %pool.name,
            executor = executor_id,
            subject = principal.subject.as_deref().unwrap_or(""),
            "executor registered"
        );
        Ok(RegisterResponse {
            id: registration,
            executor_id: executor_id.to_owned(),
            url: format!("{base}/cloud/executor/{executor_id}/rendezvous?ticket={ticket}"),
        })
    }

    /// Check a rendezvous ticket before the upgrade (and the credential it
    /// was issued for: not revoked or expired since).
    pub fn redeem(&self, executor_id: &str, ticket: &str) -> Result<Ticket, Refusal> {
        let t = match self.tickets.redeem(ticket, executor_id) {
            Ok(t) => t,
            Err(e) => {
                self.refused(e.reason());
                return Err(Refusal::new(401, "unauthenticated", e.to_string()));
            }
        };
        if let Some(why) = self.revoked(&t.exe, &t.cred) {
            self.refused("revoked");
            return Err(Refusal::new(
                403,
                "revoked",
                format!("the credential is revoked ({why})"),
            ));
        }
        if t.cred.exp.is_some_and(|e| e <= ticket::now_secs()) {
            self.refused("credential_expired");
            return Err(Refusal::new(
                401,
                "unauthenticated",
                "the executor credential has expired",
            ));
        }
        Ok(t)
    }

    /// Add a redeemed ticket's link to its pool.
    pub fn attach(&self, ticket: Ticket, link: Arc<Link>) {
        match self.pools.get(&ticket.pool) {
            Some(pool) => {
                if let Err(r) = pool.attach(ticket, link.clone(), self.standing.subscribe()) {
                    self.refused(r.code);
                    link.close();
                }
            }
            None => link.close(),
        }
    }

    /// Close every idle link (draining: no new sessions here).
    pub fn close_idle(&self) {
        for pool in self.pools.values() {
            let idle: Vec<Arc<Link>> = pool
                .executors
                .lock()
                .values()
                .flat_map(|e| e.idle.lock().clone())
                .collect();
            for link in idle {
                link.close();
            }
        }
    }

    /// `/readyz` detail: executors and idle links per pool.
    pub fn report(&self) -> String {
        let mut s = String::new();
        for pool in self.pools.values() {
            let executors = pool.executors.lock();
            let idle: usize = executors.values().map(|e| e.idle.lock().len()).sum();
            let sessions: usize = executors
                .values()
                .map(|e| e.sessions.load(Ordering::Acquire))
                .sum();
            s.push_str(&format!(
                "pool {}: {} executors, {idle} idle links, {sessions} sessions\n",
                pool.name,
                executors.len()
            ));
        }
        s
    }
}

/// An `Host` header value usable in a URL: host and optional port.
fn is_authority(h: &str) -> bool {
    !h.is_empty()
        && h.len() <= 255
        && h.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b':' | b'[' | b']'))
}

fn check_labels(labels: &BTreeMap<String, String>) -> Result<(), Refusal> {
    if labels.len() > MAX_EXECUTOR_LABELS {
        return Err(Refusal::new(
            400,
            "bad_labels",
            format!("at most {MAX_EXECUTOR_LABELS} labels"),
        ));
    }
    let ok = |s: &str, empty_ok: bool| {
        (empty_ok || !s.is_empty())
            && s.len() <= MAX_LABEL_BYTES
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'/'))
    };
    if labels.iter().all(|(k, v)| ok(k, false) && ok(v, true)) {
        Ok(())
    } else {
        Err(Refusal::new(
            400,
            "bad_labels",
            format!(
                "label keys and values are at most {MAX_LABEL_BYTES} of letters, digits, `-_./`"
            ),
        ))
    }
}

/// One pool of executors.
pub struct Pool {
    pub name: String,
    settings: PoolSettings,
    executors: Mutex<BTreeMap<String, Arc<Executor>>>,
    /// Woken whenever a link arrives.
    arrived: tokio::sync::Notify,
    metrics: Arc<Metrics>,
    executors_gauge: Gauge,
    idle_gauge: Gauge,
}

/// One executor (all links registered under one id).
pub struct Executor {
    pub id: String,
    labels: Mutex<BTreeMap<String, String>>,
    idle: Mutex<Vec<Arc<Link>>>,
    /// Idle and leased links.
    links: AtomicUsize,
    /// Leased links (sessions).
    sessions: AtomicUsize,
    sessions_gauge: Gauge,
}

/// A session's hold on one link of an executor; dropping it closes the
/// link (the executor then registers again for its next session).
pub struct Lease {
    pool: Arc<Pool>,
    pub executor: Arc<Executor>,
    pub link: Arc<Link>,
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.link.close();
        self.executor.sessions.fetch_sub(1, Ordering::AcqRel);
        self.executor.sessions_gauge.dec();
        self.pool.forget_if_gone(&self.executor);
    }
}

impl Pool {
    /// The one tenant whose sessions the pool serves.
    pub fn tenant(&self) -> &str {
        &self.settings.tenant
    }

    fn new(settings: PoolSettings, metrics: Arc<Metrics>) -> Arc<Pool> {
        let label = PoolLabel {
            pool: settings.name.clone(),
        };
        let executors_gauge = metrics.executors.get_or_create(&label).clone();
        let idle_gauge = metrics.executor_idle_links.get_or_create(&label).clone();
        Arc::new(Pool {
            name: settings.name.clone(),
            executors_gauge,
            idle_gauge,
            settings,
            executors: Mutex::new(BTreeMap::new()),
            arrived: tokio::sync::Notify::new(),
            metrics,
        })
    }

    /// Refuse a registration the pool has no room for.
    fn check_room(&self, executor_id: &str) -> Result<(), Refusal> {
        let executors = self.executors.lock();
        if Self::links(&executors) >= self.settings.max_links {
            return Err(self.pool_links_full());
        }
        match executors.get(executor_id) {
            Some(e) if e.links.load(Ordering::Acquire) >= self.settings.max_links_per_executor => {
                Err(Refusal::new(
                    429,
                    "too_many_links",
                    format!(
                        "executor {executor_id} already holds {} links (max_links_per_executor)",
                        self.settings.max_links_per_executor
                    ),
                ))
            }
            None if executors.len() >= self.settings.max_executors => Err(Refusal::new(
                429,
                "pool_full",
                format!(
                    "pool {} already has {} executors (max_executors)",
                    self.name, self.settings.max_executors
                ),
            )),
            _ => Ok(()),
        }
    }

    /// Links over all the pool's executors.
    fn links(executors: &BTreeMap<String, Arc<Executor>>) -> usize {
        executors
            .values()
            .map(|e| e.links.load(Ordering::Acquire))
            .sum()
    }

    fn pool_links_full(&self) -> Refusal {
        Refusal::new(
            429,
            "pool_links_full",
            format!(
                "pool {} already holds {} links (max_links)",
                self.name, self.settings.max_links
            ),
        )
    }

    fn attach(
        self: &Arc<Self>,
        ticket: Ticket,
        link: Arc<Link>,
        standing: tokio::sync::watch::Receiver<Arc<Standing>>,
    ) -> Result<(), Refusal> {
        let mut joined = false;
        let executor = {
            let mut executors = self.executors.lock();
            if Self::links(&executors) >= self.settings.max_links {
                return Err(self.pool_links_full());
            }
            let count = executors.len();
            let executor = match executors.get(&ticket.exe) {
                Some(e) => e.clone(),
                None if count >= self.settings.max_executors => {
                    return Err(Refusal::new(429, "pool_full", "pool full"));
                }
                None => {
                    let e = Arc::new(Executor {
                        id: ticket.exe.clone(),
                        labels: Mutex::new(BTreeMap::new()),
                        idle: Mutex::new(Vec::new()),
                        links: AtomicUsize::new(0),
                        sessions: AtomicUsize::new(0),
                        sessions_gauge: self
                            .metrics
                            .executor_sessions
                            .get_or_create(&ExecutorLabels {
                                pool: self.name.clone(),
                                executor: ticket.exe.clone(),
                            })
                            .clone(),
                    });
                    executors.insert(ticket.exe.clone(), e.clone());
                    self.executors_gauge.set(executors.len() as i64);
                    joined = true;
                    e
                }
            };
            if executor.links.load(Ordering::Acquire) >= self.settings.max_links_per_executor {
                return Err(Refusal::new(429, "too_many_links", "too many links"));
            }
            executor.links.fetch_add(1, Ordering::AcqRel);
            *executor.labels.lock() = ticket.labels.clone();
            executor.idle.lock().push(link.clone());
            self.idle_gauge.inc();
            executor
        };
        if joined {
            let t = self.tenant();
            events::joined(&self.name, t, &executor.id, &ticket.name, &ticket.labels);
        }
        tracing::info!(pool = %self.name, executor = %executor.id, name = %ticket.name, link = link.serial, "executor link up");
        self.arrived.notify_waiters();
        let pool = self.clone();
        crate::task::start("executor-link-watch", async move {
            watch_link(&link, &ticket, standing).await;
            let was_idle = {
                let mut idle = executor.idle.lock();
                let before = idle.len();
                idle.retain(|l| !Arc::ptr_eq(l, &link));
                before != idle.len()
            };
            if was_idle {
                pool.idle_gauge.dec();
            }
            executor.links.fetch_sub(1, Ordering::AcqRel);
            tracing::info!(pool = %pool.name, executor = %executor.id, link = link.serial, "executor link closed");
            pool.forget_if_gone(&executor);
        });
        Ok(())
    }

    /// Drop an executor with no links and no sessions left.
    fn forget_if_gone(&self, executor: &Arc<Executor>) {
        let mut executors = self.executors.lock();
        if executor.links.load(Ordering::Acquire) == 0
            && executor.sessions.load(Ordering::Acquire) == 0
            && executors
                .get(&executor.id)
                .is_some_and(|e| Arc::ptr_eq(e, executor))
        {
            executors.remove(&executor.id);
            self.executors_gauge.set(executors.len() as i64);
            self.metrics.executor_sessions.remove(&ExecutorLabels {
                pool: self.name.clone(),
                executor: executor.id.clone(),
            });
            drop(executors);
            events::left(&self.name, self.tenant(), &executor.id);
        }
    }

    /// Whether an executor carrying `labels` has an idle link.
    pub fn has_free_link(&self, labels: &BTreeMap<String, String>) -> bool {
        self.executors.lock().values().any(|e| {
            let have = e.labels.lock();
            labels.iter().all(|(k, v)| have.get(k) == Some(v))
                && e.idle.lock().iter().any(|l| !l.is_closed())
        })
    }

    /// Lease an idle link now: of executor `want` if given, else of the
    /// least-loaded executor carrying every label in `labels`.
    pub fn try_lease(
        self: &Arc<Self>,
        labels: &BTreeMap<String, String>,
        want: Option<&str>,
    ) -> Option<Lease> {
        let executors = self.executors.lock();
        let mut candidates: Vec<&Arc<Executor>> = executors
            .values()
            .filter(|e| want.is_none_or(|w| w == e.id))
            .filter(|e| {
                let have = e.labels.lock();
                labels.iter().all(|(k, v)| have.get(k) == Some(v))
            })
            .collect();
        candidates.sort_by_key(|e| e.sessions.load(Ordering::Acquire));
        for e in candidates {
            let mut idle = e.idle.lock();
            while let Some(link) = idle.pop() {
                self.idle_gauge.dec();
                if link.is_closed() {
                    continue;
                }
                e.sessions.fetch_add(1, Ordering::AcqRel);
                e.sessions_gauge.inc();
                return Some(Lease {
                    pool: self.clone(),
                    executor: e.clone(),
                    link,
                });
            }
        }
        None
    }

    /// Lease a link, waiting up to `wait` for one to arrive.
    pub async fn lease(
        self: &Arc<Self>,
        labels: &BTreeMap<String, String>,
        want: Option<&str>,
        wait: Duration,
    ) -> Option<Lease> {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let arrived = self.arrived.notified();
            tokio::pin!(arrived);
            arrived.as_mut().enable();
            if let Some(l) = self.try_lease(labels, want) {
                return Some(l);
            }
            if tokio::time::timeout_at(deadline, arrived).await.is_err() {
                return None;
            }
        }
    }
}

/// Until `link` closes; close it when its credential expires or a
/// revocation names it (a stolen credential's links end at once).
async fn watch_link(
    link: &Link,
    ticket: &Ticket,
    mut standing: tokio::sync::watch::Receiver<Arc<Standing>>,
) {
    let expires = ticket.cred.exp.map(|e| {
        tokio::time::Instant::now() + Duration::from_secs(e.saturating_sub(ticket::now_secs()))
    });
    loop {
        tokio::select! {
            () = link.closed() => return,
            () = async {
                match expires {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            } => {
                tracing::info!(executor = %ticket.exe, link = link.serial, "executor credential expired: link closed");
                link.close();
                return;
            }
            changed = standing.changed() => {
                if changed.is_err() {
                    // The registry is gone: only the close is left to wait for.
                    link.closed().await;
                    return;
                }
                let why = standing.borrow_and_update().revokes(&ticket.exe, &ticket.cred);
                if let Some(why) = why {
                    tracing::warn!(executor = %ticket.exe, link = link.serial, revoked = %why, "executor credential revoked: link closed");
                    link.close();
                    return;
                }
            }
        }
    }
}

/// What decides whether a credential still holds: the revocations file
/// and the access keys configured now.
pub(crate) struct Standing {
    revocations: Arc<Revocations>,
    /// SigV4 access keys by id, with their pool.
    keys: BTreeMap<String, (Arc<Pool>, AccessKey)>,
}

impl Standing {
    fn new(
        pools: &BTreeMap<String, Arc<Pool>>,
        settings: &ExecutorsSettings,
        revocations: Arc<Revocations>,
    ) -> Standing {
        let mut keys = BTreeMap::new();
        for p in settings.pools.values() {
            match pools.get(&p.name) {
                Some(pool) => {
                    for k in &p.access_keys {
                        keys.insert(k.id.clone(), (pool.clone(), k.clone()));
                    }
                }
                None => {
                    tracing::warn!(pool = %p.name, "a new pool's access keys wait for a restart")
                }
            }
        }
        Standing { revocations, keys }
    }

    /// Why `cred` of `executor` no longer holds, if it does not: revoked,
    /// or its access key is no longer configured.
    fn revokes(&self, executor: &str, cred: &Credential) -> Option<String> {
        if let Some(k) = cred.key.as_deref()
            && !self.keys.contains_key(k)
        {
            return Some(format!("access key {k} is no longer configured"));
        }
        self.revocations.revokes(
            cred.jti.as_deref(),
            executor,
            cred.key.as_deref(),
            cred.sub.as_deref(),
        )
    }

    /// An id an access key of `pool` is bound to is reserved for it: a
    /// credential bound to no executor may not register as it.
    fn check_reserved(&self, pool: &str, executor_id: &str) -> Result<(), Refusal> {
        match self
            .keys
            .values()
            .find(|(p, k)| p.name == pool && k.executor_id.as_deref() == Some(executor_id))
        {
            Some((_, k)) => Err(Refusal::new(
                403,
                "wrong_executor",
                format!("executor {executor_id} is reserved for access key {}", k.id),
            )),
            None => Ok(()),
        }
    }
}
