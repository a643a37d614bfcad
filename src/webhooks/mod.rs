//! Lifecycle webhooks (`[webhooks]`, docs/webhooks.md): sessions created
//! and closed, processes exited, tenants activated and retired, quota and
//! egress refusals, executors joined and left, POSTed to the configured
//! endpoints, signed per the Standard Webhooks specification.
//!
//! One seam: `audit::emit` offers every event to [`offer`], whether or not
//! the audit trail is configured; [`event::type_of`] says which audit
//! events are webhook events. [`offer`] never blocks nor waits: it checks
//! the filters, renders the body once and hands it to the spool writer
//! (a thread) through a bounded queue; what does not fit is dropped and
//! counted. The writer puts one file per endpoint in the spool
//! ([`spool`]), then each endpoint's task delivers it ([`deliver`]) and
//! removes the file. A start sends what the last run left, with the same
//! ids: delivery is at least once, and a receiver that dedupes by
//! `webhook-id` sees each event once.
//!
//! Like the audit trail it is one hub per process, installed at start
//! ([`init`]); until then, and without `[webhooks]`, [`enabled`] is false.

mod counters;
mod deliver;
pub mod event;
pub mod sign;
pub mod spool;

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU16, AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use arc_swap::ArcSwap;
use bytes::Bytes;
use serde_json::Value;

pub use counters::WebhookMetrics;
pub use event::{EVENT_TYPES, EventFilter};
pub use sign::Secret;
use spool::Message;

/// Default `queue_events`: messages waiting at once (each endpoint's copy
/// counts), in memory and in the spool.
pub const DEFAULT_QUEUE_EVENTS: usize = 100_000;
/// Default `queue_bytes`: their bodies' bytes.
pub const DEFAULT_QUEUE_BYTES: usize = 256 * 1024 * 1024;
/// Default `max_event_bytes`: a larger body is dropped (counted).
pub const DEFAULT_MAX_EVENT_BYTES: usize = 64 * 1024;
/// Largest `max_event_bytes` accepted.
pub const MAX_EVENT_BYTES_LIMIT: usize = 1024 * 1024;
/// Default attempt timeout (connect to the end of the response head).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);
/// Default attempts per message.
pub const DEFAULT_MAX_ATTEMPTS: u32 = 15;
/// Default age past which a message is given up.
pub const DEFAULT_MAX_AGE: Duration = Duration::from_secs(24 * 3600);
/// Default first retry's wait (then doubled each time).
pub const DEFAULT_RETRY_INITIAL: Duration = Duration::from_secs(1);
/// Default longest wait between attempts (also caps `Retry-After`).
pub const DEFAULT_RETRY_MAX: Duration = Duration::from_secs(600);
/// Default attempts to one endpoint at once.
pub const DEFAULT_CONCURRENCY: usize = 8;
/// Most endpoints.
pub const MAX_ENDPOINTS: usize = 32;
/// Most secrets per endpoint (one signature each in every message).
pub const MAX_SECRETS: usize = 4;

/// Validated `[webhooks]` (module `config::webhooks`).
#[derive(Debug, Clone, PartialEq)]
pub struct WebhookSettings {
    pub spool_dir: PathBuf,
    pub queue_events: usize,
    pub queue_bytes: usize,
    pub max_event_bytes: usize,
    pub endpoints: Vec<EndpointSettings>,
}

/// One `[[webhooks.endpoints]]`.
#[derive(Debug, Clone, PartialEq)]
pub struct EndpointSettings {
    /// Letters, digits, `_`, `-`: its spool directory and metric label.
    pub name: String,
    pub url: url::Url,
    /// Each signs every message (rotation: the new one beside the old).
    pub secrets: Vec<Secret>,
    pub secret_files: Vec<PathBuf>,
    pub events: EventFilter,
    /// `None`: every tenant's events (and those of no tenant).
    pub tenants: Option<BTreeSet<String>>,
    pub timeout: Duration,
    pub max_attempts: u32,
    pub max_age: Duration,
    pub retry_initial: Duration,
    pub retry_max: Duration,
    pub concurrency: usize,
    /// PEM roots trusted beside the public web roots (webpki).
    pub ca_file: Option<PathBuf>,
}

impl EndpointSettings {
    fn wants(&self, index: usize, tenant: Option<&str>) -> bool {
        self.events.has(index)
            && self
                .tenants
                .as_ref()
                .is_none_or(|t| tenant.is_some_and(|n| t.contains(n)))
    }
}

/// One endpoint, as delivery sees it (settings swapped by a reload).
pub(crate) struct Endpoint {
    name: String,
    dir: PathBuf,
    settings: ArcSwap<EndpointSettings>,
    client: ArcSwap<reqwest::Client>,
    slots: tokio::sync::Semaphore,
    tx: tokio::sync::mpsc::Sender<Pending>,
}

/// A message waiting for one endpoint, and its spool file (`None` when it
/// could not be written).
pub(crate) struct Pending {
    msg: Message,
    path: Option<PathBuf>,
}

/// An event for the spool writer.
struct Job {
    msg: Message,
    endpoints: Vec<usize>,
}

pub(crate) struct Hub {
    spool_dir: PathBuf,
    endpoints: Vec<Arc<Endpoint>>,
    /// Union of the endpoints' filters: an event no endpoint wants costs
    /// one load.
    wanted: AtomicU16,
    tx: SyncSender<Job>,
    /// Jobs handed to the writer and not yet spooled (for [`drain`]).
    unspooled: AtomicUsize,
    queued_events: AtomicUsize,
    queued_bytes: AtomicUsize,
    max_events: usize,
    max_bytes: usize,
    max_event_bytes: usize,
    metrics: WebhookMetrics,
}

static HUB: OnceLock<Hub> = OnceLock::new();

/// Whether webhooks are configured and started.
pub fn enabled() -> bool {
    HUB.get().is_some()
}

/// Whether some endpoint wants the webhook type of `audit_event`.
pub fn wants(audit_event: &str) -> bool {
    match (HUB.get(), event::type_of(audit_event)) {
        (Some(h), Some(i)) => h.wanted.load(Ordering::Relaxed) & (1 << i) != 0,
        _ => false,
    }
}

/// Offer an audit event (`who`: tenant, subject, session). Never blocks.
pub fn offer(
    audit_event: &str,
    tenant: Option<&str>,
    subject: Option<&str>,
    session: Option<&str>,
    fields: &Value,
) {
    if let Some(hub) = HUB.get() {
        hub.offer(audit_event, [tenant, subject, session], fields);
    }
}

impl Hub {
    fn offer(&self, audit_event: &str, who: [Option<&str>; 3], fields: &Value) {
        let Some(index) = event::type_of(audit_event) else {
            return;
        };
        if self.wanted.load(Ordering::Relaxed) & (1 << index) == 0 {
            return;
        }
        let [tenant, subject, session] = who;
        let endpoints: Vec<usize> = self
            .endpoints
            .iter()
            .enumerate()
            .filter(|(_, e)| e.settings.load().wants(index, tenant))
            .map(|(i, _)| i)
            .collect();
        if endpoints.is_empty() {
            return;
        }
        let n = endpoints.len();
        let now = std::time::SystemTime::now();
        let ty = EVENT_TYPES[index];
        let body = event::body(
            ty,
            now,
            [
                ("tenant", tenant),
                ("subject", subject),
                ("session", session),
            ],
            fields,
        );
        if body.len() > self.max_event_bytes {
            self.metrics.drop("too_large", n as u64);
            tracing::warn!(
                r#type = ty,
                bytes = body.len(),
                "webhook event larger than max_event_bytes; dropped"
            );
            return;
        }
        if !self.admit(n, body.len()) {
            self.metrics.drop("queue_full", n as u64);
            return;
        }
        let created_ms = now
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
            .unwrap_or(0);
        let msg = Message {
            id: spool::new_id(created_ms),
            ty: ty.to_owned(),
            created_ms,
            body: Bytes::from(body),
        };
        let len = msg.body.len();
        self.unspooled.fetch_add(1, Ordering::AcqRel);
        match self.tx.try_send(Job { msg, endpoints }) {
            Ok(()) => {}
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => {
                self.unspooled.fetch_sub(1, Ordering::AcqRel);
                self.release(n, len);
                self.metrics.drop("queue_full", n as u64);
            }
        }
    }

    /// Take room for `n` copies of a `len`-byte body, or none.
    fn admit(&self, n: usize, len: usize) -> bool {
        let bytes = n * len;
        if self.queued_events.fetch_add(n, Ordering::AcqRel) + n > self.max_events {
            self.queued_events.fetch_sub(n, Ordering::AcqRel);
            return false;
        }
        if self.queued_bytes.fetch_add(bytes, Ordering::AcqRel) + bytes > self.max_bytes {
            self.queued_bytes.fetch_sub(bytes, Ordering::AcqRel);
            self.queued_events.fetch_sub(n, Ordering::AcqRel);
            return false;
        }
        self.gauges();
        true
    }

    fn release(&self, n: usize, len: usize) {
        self.queued_events.fetch_sub(n, Ordering::AcqRel);
        self.queued_bytes.fetch_sub(n * len, Ordering::AcqRel);
        self.gauges();
    }

    fn gauges(&self) {
        let g = |v: usize| i64::try_from(v).unwrap_or(i64::MAX);
        self.metrics
            .queue_depth
            .set(g(self.queued_events.load(Ordering::Relaxed)));
        self.metrics
            .queue_bytes
            .set(g(self.queued_bytes.load(Ordering::Relaxed)));
    }

    /// A message is done with (delivered or given up): its file goes, its
    /// room is freed.
    fn finish(&self, p: Pending) {
        if let Some(path) = &p.path
            && let Err(e) = std::fs::remove_file(path)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            // Sent again after a restart: the receiver dedupes it.
            self.metrics.spool_errors.inc();
            tracing::warn!(file = %path.display(), error = %e, "webhooks: cannot remove a delivered message from the spool");
        }
        self.release(1, p.msg.body.len());
    }

    /// Hand `p` to endpoint `i`'s delivery.
    fn enqueue(&self, i: usize, p: Pending) {
        let Some(ep) = self.endpoints.get(i) else {
            return;
        };
        // Room was taken at admission; the channel holds as many.
        if let Err(e) = ep.tx.try_send(p) {
            let p = match e {
                tokio::sync::mpsc::error::TrySendError::Full(p)
                | tokio::sync::mpsc::error::TrySendError::Closed(p) => p,
            };
            self.metrics.drop("queue_full", 1);
            self.release(1, p.msg.body.len());
        }
    }
}

/// The HTTP client of `s`: no redirects, no proxy from the environment,
/// webpki roots and `ca_file`'s.
fn client(s: &EndpointSettings) -> Result<reqwest::Client, String> {
    let mut b = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .no_proxy()
        .connect_timeout(s.timeout)
        .user_agent(concat!(
            "exec-gateway/",
            env!("CARGO_PKG_VERSION"),
            " webhooks"
        ));
    if let Some(ca) = &s.ca_file {
        let pem = std::fs::read(ca).map_err(|e| {
            format!(
                "webhooks.endpoints `{}`: ca_file {}: {e}",
                s.name,
                ca.display()
            )
        })?;
        for c in reqwest::Certificate::from_pem_bundle(&pem)
            .map_err(|e| format!("webhooks.endpoints `{}`: ca_file: {e}", s.name))?
        {
            b = b.add_root_certificate(c);
        }
    }
    b.build()
        .map_err(|e| format!("webhooks.endpoints `{}`: http client: {e}", s.name))
}

fn union(endpoints: &[EndpointSettings]) -> u16 {
    endpoints.iter().fold(0, |a, e| a | e.events.0)
}

/// Open the spool, start the writer and the endpoints' deliveries, and
/// queue what the last run left. Inside the runtime; once per process.
pub fn init(s: &WebhookSettings, metrics: WebhookMetrics) -> Result<(), String> {
    if HUB.get().is_some() {
        return Ok(());
    }
    let mut endpoints = Vec::new();
    let mut receivers = Vec::new();
    for e in &s.endpoints {
        let dir = s.spool_dir.join(&e.name);
        spool::make_dir(&dir)
            .map_err(|err| format!("webhooks.spool_dir: {}: {err}", dir.display()))?;
        let (tx, rx) = tokio::sync::mpsc::channel(s.queue_events.max(1));
        endpoints.push(Arc::new(Endpoint {
            name: e.name.clone(),
            dir,
            client: ArcSwap::from_pointee(client(e)?),
            settings: ArcSwap::from_pointee(e.clone()),
            slots: tokio::sync::Semaphore::new(e.concurrency),
            tx,
        }));
        receivers.push(rx);
    }
    warn_unknown_dirs(s);
    let (tx, rx) = std::sync::mpsc::sync_channel(s.queue_events.max(1));
    let hub = Hub {
        spool_dir: s.spool_dir.clone(),
        endpoints,
        wanted: AtomicU16::new(union(&s.endpoints)),
        tx,
        unspooled: AtomicUsize::new(0),
        queued_events: AtomicUsize::new(0),
        queued_bytes: AtomicUsize::new(0),
        max_events: s.queue_events,
        max_bytes: s.queue_bytes,
        max_event_bytes: s.max_event_bytes,
        metrics,
    };
    if HUB.set(hub).is_err() {
        return Ok(());
    }
    let Some(hub) = HUB.get() else {
        return Ok(());
    };
    // Last run's messages first, before anything new is offered.
    for (i, ep) in hub.endpoints.iter().enumerate() {
        let left = spool::load(&ep.dir)
            .map_err(|e| format!("webhooks.spool_dir: {}: {e}", ep.dir.display()))?;
        if !left.is_empty() {
            tracing::info!(endpoint = %ep.name, messages = left.len(), "webhooks: resending what the last run left");
        }
        for (path, msg) in left {
            if !hub.admit(1, msg.body.len()) {
                // A smaller queue than the last run's: the newest go.
                hub.metrics.drop("queue_full", 1);
                let _ = std::fs::remove_file(&path);
                continue;
            }
            hub.enqueue(
                i,
                Pending {
                    msg,
                    path: Some(path),
                },
            );
        }
    }
    for (ep, mut rx) in hub.endpoints.iter().cloned().zip(receivers) {
        crate::task::start("webhook-endpoint", async move {
            while let Some(p) = rx.recv().await {
                crate::task::start("webhook-delivery", deliver::deliver(hub, ep.clone(), p));
            }
        });
    }
    std::thread::Builder::new()
        .name("webhook-spool".to_owned())
        .spawn(move || spool_loop(hub, rx))
        .map_err(|e| format!("webhooks: cannot start the spool writer: {e}"))?;
    Ok(())
}

/// Spool directories of endpoints no longer configured are left as they
/// are (their messages go out if the endpoint comes back), said once.
fn warn_unknown_dirs(s: &WebhookSettings) {
    let Ok(rd) = std::fs::read_dir(&s.spool_dir) else {
        return;
    };
    for e in rd.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if !s.endpoints.iter().any(|x| x.name == name) {
            tracing::warn!(dir = %e.path().display(), "webhooks: a spool directory of an endpoint not configured; its messages wait for it");
        }
    }
}

/// The writer: each job's files, then its deliveries. A file that cannot
/// be written is counted and its message delivered from memory.
fn spool_loop(hub: &'static Hub, rx: Receiver<Job>) {
    while let Ok(job) = rx.recv() {
        let mut written = Vec::with_capacity(job.endpoints.len());
        for i in job.endpoints {
            let Some(ep) = hub.endpoints.get(i) else {
                continue;
            };
            match spool::write(&ep.dir, &job.msg) {
                Ok(p) => written.push((i, Some(p))),
                Err(e) => {
                    hub.metrics.spool_errors.inc();
                    tracing::warn!(endpoint = %ep.name, error = %e, "webhooks: cannot spool a message; delivering it from memory");
                    written.push((i, None));
                }
            }
        }
        // In the spool (or never to be): what `drain` waits for.
        hub.unspooled.fetch_sub(1, Ordering::AcqRel);
        for (i, path) in written {
            hub.enqueue(
                i,
                Pending {
                    msg: job.msg.clone(),
                    path,
                },
            );
        }
    }
}

/// At shutdown: wait until every offered event is in the spool (at most
/// `within`). Deliveries under way are not waited for: their files stay
/// and the next start sends them again, with the same ids.
pub fn drain(within: Duration) {
    let Some(hub) = HUB.get() else { return };
    let deadline = std::time::Instant::now() + within;
    while hub.unspooled.load(Ordering::Acquire) > 0 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A reload: endpoints keep their names and spool; each one's URL,
/// secrets, filters, timeout, retry settings and CA take effect for its
/// next attempt. Returns what needs a restart (endpoints added or
/// removed, the spool and its bounds, concurrency), if anything.
pub fn reload(new: Option<&WebhookSettings>) -> Result<Option<String>, String> {
    let Some(hub) = HUB.get() else {
        return Ok(new.map(|_| "[webhooks] (not started)".to_owned()));
    };
    let Some(new) = new else {
        return Ok(Some("[webhooks] (removed)".to_owned()));
    };
    let names: Vec<&str> = hub.endpoints.iter().map(|e| e.name.as_str()).collect();
    let new_names: Vec<&str> = new.endpoints.iter().map(|e| e.name.as_str()).collect();
    let mut restart = Vec::new();
    if names != new_names {
        restart.push("endpoints added, removed or reordered");
    }
    if (hub.max_events, hub.max_bytes, hub.max_event_bytes)
        != (new.queue_events, new.queue_bytes, new.max_event_bytes)
    {
        restart.push("queue bounds");
    }
    if hub.spool_dir != new.spool_dir {
        restart.push("spool_dir");
    }
    let mut clients = Vec::new();
    for ep in &hub.endpoints {
        if let Some(s) = new.endpoints.iter().find(|s| s.name == ep.name) {
            clients.push((ep, s, client(s)?));
            if s.concurrency != ep.settings.load().concurrency {
                restart.push("concurrency");
            }
        }
    }
    for (ep, s, c) in clients {
        ep.client.store(Arc::new(c));
        ep.settings.store(Arc::new(s.clone()));
    }
    hub.wanted.store(
        hub.endpoints
            .iter()
            .fold(0, |a, e| a | e.settings.load().events.0),
        Ordering::Relaxed,
    );
    restart.dedup();
    Ok((!restart.is_empty()).then(|| format!("[webhooks] {}", restart.join(", "))))
}

#[cfg(test)]
mod tests;
