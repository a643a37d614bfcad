//! Sessions: created by `initialize`, running on their tenant's backend,
//! surviving a disconnect for the detach TTL, resumable by `resumeSessionId`.
//!
//! Invariants: a session is attached to at most one connection; a detached
//! session whose TTL passes without a resume is removed and its process
//! groups are killed; the registry never holds more than `max_sessions`.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use parking_lot::Mutex;

use crate::backend::SessionBackend;
use crate::backend::remote::RemoteBackend;
use crate::config::{ImageSource, Placement};
use crate::error::GatewayError;
use crate::outbound::{AttachToken, Attachment, Outbound};
use crate::protocol::path::PathErrorKind;
use crate::protocol::revision::{Revision, RevisionCell};
use crate::rpc::Call;
use crate::tenant::Tenant;

/// One session, owned by one tenant.
pub struct Session {
    pub id: String,
    pub tenant: Arc<Tenant>,
    /// Where the session's processes and file operations run.
    pub backend: Arc<dyn SessionBackend>,
    /// The protocol revision its client speaks, once a request told it.
    pub revision: Arc<RevisionCell>,
    attachment: Arc<Attachment>,
    /// Bumped on every attach; a TTL timer only fires for the detach it saw.
    epoch: AtomicU64,
    /// Last use by a call that holds no connection (gRPC) or the detach time.
    last_active: Mutex<tokio::time::Instant>,
    /// Open gRPC streams on this session (Attach, Exec): they keep it alive.
    streams: AtomicUsize,
    /// Cancelled when the session is removed: what lives only as long as
    /// it (its port forwards) ends.
    pub ended: tokio_util::sync::CancellationToken,
    /// The image its processes run, as it was chosen (or the tenant's
    /// own); none without one. A token's `image` claim must name it.
    pub image: Option<ImageSource>,
    /// Its previewed ports (docs/preview.md).
    pub ports: crate::preview::Ports,
}

/// What a new session chose: an image (its view, and the reference it
/// was chosen by), and the workspace of a fork.
#[derive(Clone, Default)]
pub struct ChosenImage {
    pub view: Option<Arc<crate::image::View>>,
    pub source: Option<ImageSource>,
    pub fork: Option<Arc<crate::snapshot::Workspace>>,
}

impl Session {
    /// The client's answer to a request the gateway sent it.
    pub fn answer_client(&self, id: u64, result: Option<String>) {
        if !self.attachment.answer(id, result) {
            tracing::debug!(session = %self.id, id, "an answer to no pending request");
        }
    }

    /// The connection the session's notifications go to.
    pub fn attachment(&self) -> &Arc<Attachment> {
        &self.attachment
    }

    /// Whether a token whose `image` claim is `claimed` may use this
    /// session: the claim names the only image the token may run, so it
    /// must name the one the session runs (as it was chosen).
    pub fn check_image_claim(&self, claimed: Option<&str>) -> Result<(), GatewayError> {
        let Some(claimed) = claimed else {
            return Ok(());
        };
        let named = ImageSource::parse(claimed).ok();
        if named.is_some() && named == self.image {
            return Ok(());
        }
        Err(GatewayError::Forbidden(
            "the token's image claim names another image than the session runs".to_owned(),
        ))
    }

    /// Check a call against the session's revision, learning the revision
    /// from it if it tells: every path must be in the revision's form, and
    /// 0.169.0 requires a non-empty `writeId`. Errors are worded as that
    /// revision's reference server words them.
    pub fn validate_call(&self, call: &Call) -> Result<Revision, GatewayError> {
        let revision = match call.tells() {
            Some(r) => self.revision.observe(r),
            None => self.revision.or_default(),
        };
        for (path, field) in call.paths() {
            path.check(revision, field).map_err(|e| match e.kind {
                PathErrorKind::InvalidParams => GatewayError::InvalidParams(e.message),
                PathErrorKind::InvalidRequest => GatewayError::InvalidRequest(e.message),
                PathErrorKind::Spawn => GatewayError::Internal(e.message),
            })?;
        }
        if revision.policy().write_id_required
            && let Call::ProcessWrite(w) = call
        {
            match w.write_id.as_deref() {
                None => {
                    return Err(GatewayError::InvalidParams(
                        "missing field `writeId`".to_owned(),
                    ));
                }
                Some("") => {
                    return Err(GatewayError::InvalidParams(
                        "writeId must not be empty".to_owned(),
                    ));
                }
                Some(_) => {}
            }
        }
        Ok(revision)
    }

    /// Note activity: a detached session lives `detach_ttl` past its last use.
    pub fn touch(&self) {
        *self.last_active.lock() = tokio::time::Instant::now();
    }

    /// Keep the session alive while the returned guard lives.
    pub fn stream_guard(self: &Arc<Self>) -> StreamGuard {
        self.streams.fetch_add(1, Ordering::AcqRel);
        StreamGuard(self.clone())
    }
}

/// An open stream on a session; see [`Session::stream_guard`].
pub struct StreamGuard(Arc<Session>);

impl Drop for StreamGuard {
    fn drop(&mut self) {
        self.0.touch();
        self.0.streams.fetch_sub(1, Ordering::AcqRel);
    }
}

/// All sessions of one gateway process.
pub struct SessionRegistry {
    sessions: Mutex<HashMap<String, Arc<Session>>>,
    /// `None`: the session revision's.
    detach_ttl: Option<Duration>,
    max_sessions: usize,
    next_generation: AtomicU64,
    /// Prefix of minted ids: the replica and its run (empty outside a fleet).
    id_prefix: String,
    /// This replica's id in a fleet (remote sessions' ids carry it).
    replica: Option<String>,
    /// Remote sessions being opened (counted against `max_sessions`).
    opening: AtomicUsize,
    /// `[preview]`, which each session's ports follow.
    preview: Arc<crate::config::PreviewSettings>,
}

impl SessionRegistry {
    pub fn new(
        detach_ttl: Option<Duration>,
        max_sessions: usize,
        id_prefix: String,
        replica: Option<String>,
        preview: Arc<crate::config::PreviewSettings>,
    ) -> Arc<Self> {
        Arc::new(Self {
            sessions: Mutex::new(HashMap::new()),
            detach_ttl,
            max_sessions,
            next_generation: AtomicU64::new(1),
            id_prefix,
            replica,
            opening: AtomicUsize::new(0),
            preview,
        })
    }

    /// `initialize` on a JSON-RPC connection: like [`Self::initialize`],
    /// and the session goes where the tenant's placement says (its local
    /// backend or its executor pool); an unknown id of one of the pool's
    /// sessions is resumed on its executor (this gateway may have
    /// restarted since).
    pub async fn open(
        self: &Arc<Self>,
        tenant: &Arc<Tenant>,
        subject: Option<&str>,
        resume: Option<&str>,
        outbound: Outbound,
        image: Option<ChosenImage>,
    ) -> Result<(Arc<Session>, AttachToken), GatewayError> {
        let opened = self.open_inner(tenant, resume, outbound, image).await;
        match &opened {
            Ok((session, _)) => {
                let event = if resume.is_some() {
                    "session.resumed"
                } else {
                    "session.opened"
                };
                audit_session(event, session, subject, "");
            }
            Err(GatewayError::QuotaExceeded { quota, limit, .. }) => {
                let who = crate::audit::Who {
                    tenant: Some(&tenant.name),
                    subject,
                    session: None,
                };
                crate::audit::quota_refused(&who, "initialize", quota, *limit);
            }
            Err(_) => {}
        }
        opened
    }

    async fn open_inner(
        self: &Arc<Self>,
        tenant: &Arc<Tenant>,
        resume: Option<&str>,
        outbound: Outbound,
        image: Option<ChosenImage>,
    ) -> Result<(Arc<Session>, AttachToken), GatewayError> {
        let Some(remote) = tenant.remote.as_ref() else {
            return self.initialize(tenant, resume, outbound, image);
        };
        if image.is_some() && resume.is_none() && tenant.settings.placement != Placement::Local {
            return Err(images_run_locally());
        }
        match resume {
            Some(id) => {
                let known = self.sessions.lock().contains_key(id);
                // Another pool's id is not one of this tenant's, nor is
                // one of a pool that serves another tenant: either fails
                // as an unknown id.
                let parsed = crate::fleet::parse_remote(id, self.replica.is_some())
                    .filter(|r| r.replica == self.replica.as_deref())
                    .filter(|r| r.pool.is_none_or(|p| p == remote.pool_name()))
                    .filter(|_| remote.serves(&tenant.name));
                match parsed {
                    Some(r) if !known => {
                        self.open_remote(tenant, remote, outbound, Some((r.executor, r.session)))
                            .await
                    }
                    _ => self.initialize(tenant, Some(id), outbound, None),
                }
            }
            None => match tenant.settings.placement {
                Placement::Local => self.initialize(tenant, None, outbound, image),
                Placement::Remote => self.open_remote(tenant, remote, outbound, None).await,
                Placement::PreferRemote => {
                    if remote.has_free_link() {
                        match self
                            .open_remote(tenant, remote, outbound.clone(), None)
                            .await
                        {
                            Err(GatewayError::ExecutorUnavailable { .. }) => {}
                            other => return other,
                        }
                    }
                    self.initialize(tenant, None, outbound, None)
                }
            },
        }
    }

    /// gRPC `ResumeSession` of an id this gateway does not hold: one of
    /// the tenant's executor sessions (this gateway may have restarted
    /// since it was opened) is resumed on its executor, detached, as
    /// [`Self::open`] resumes it for a JSON-RPC client.
    pub async fn resume_detached(
        self: &Arc<Self>,
        tenant: &Arc<Tenant>,
        subject: Option<&str>,
        id: &str,
    ) -> Result<Arc<Session>, GatewayError> {
        let (out, _rx) = Outbound::channel(tenant.outbound.clone());
        let (session, token) = self.open(tenant, subject, Some(id), out, None).await?;
        self.detach(&session, &token);
        Ok(session)
    }

    async fn open_remote(
        self: &Arc<Self>,
        tenant: &Arc<Tenant>,
        remote: &RemoteBackend,
        outbound: Outbound,
        resume: Option<(&str, &str)>,
    ) -> Result<(Arc<Session>, AttachToken), GatewayError> {
        let generation = self.next_generation.fetch_add(1, Ordering::Relaxed);
        {
            let sessions = self.sessions.lock();
            if sessions.len() + self.opening.load(Ordering::Acquire) >= self.max_sessions {
                return Err(GatewayError::Overloaded);
            }
            self.opening.fetch_add(1, Ordering::AcqRel);
        }
        let _opening = OpeningGuard(&self.opening);
        tenant.claim_session()?;
        let attachment = Arc::new(Attachment::default());
        let opened = match remote.open(attachment.clone(), resume).await {
            Ok(o) => o,
            Err(e) => {
                tenant.remove_session();
                return Err(e);
            }
        };
        let id = crate::fleet::remote_session_id(
            self.replica.as_deref(),
            remote.pool_name(),
            &opened.executor,
            &opened.session,
        );
        let mut sessions = self.sessions.lock();
        if let Some(existing) = sessions.get(&id) {
            // Resumed twice at once: the first holds it.
            tenant.remove_session();
            return Err(GatewayError::SessionAttached {
                id,
                current: existing.revision.attached_error_is_current(),
            });
        }
        tenant.metrics.sessions.inc();
        let session = Arc::new(Session {
            id: id.clone(),
            tenant: tenant.clone(),
            backend: opened.backend,
            revision: Arc::new(RevisionCell::default()),
            attachment,
            epoch: AtomicU64::new(0),
            last_active: Mutex::new(tokio::time::Instant::now()),
            streams: AtomicUsize::new(0),
            ended: tokio_util::sync::CancellationToken::new(),
            image: None,
            ports: crate::preview::Ports::new(self.preview.clone()),
        });
        let token = session.attachment.attach(generation, outbound);
        sessions.insert(id, session.clone());
        Ok((session, token))
    }

    /// `initialize`: create a session for `tenant`, or resume one of its
    /// detached sessions. Another tenant's session id fails exactly like an
    /// unknown one, so ids cannot be probed across tenants.
    pub fn initialize(
        &self,
        tenant: &Arc<Tenant>,
        resume: Option<&str>,
        outbound: Outbound,
        image: Option<ChosenImage>,
    ) -> Result<(Arc<Session>, AttachToken), GatewayError> {
        let generation = self.next_generation.fetch_add(1, Ordering::Relaxed);
        if let Some(id) = resume {
            let unknown = || GatewayError::UnknownId(format!("unknown session id {id}"));
            let session = self.sessions.lock().get(id).cloned().ok_or_else(unknown)?;
            if !Arc::ptr_eq(&session.tenant, tenant) {
                return Err(unknown());
            }
            if session.attachment.is_attached() {
                return Err(GatewayError::SessionAttached {
                    id: id.to_owned(),
                    current: session.revision.attached_error_is_current(),
                });
            }
            session.epoch.fetch_add(1, Ordering::Relaxed);
            let token = session.attachment.attach(generation, outbound);
            return Ok((session, token));
        }
        let mut sessions = self.sessions.lock();
        if sessions.len() >= self.max_sessions {
            // The gateway as a whole is full: load, not this tenant's quota.
            return Err(GatewayError::Overloaded);
        }
        tenant.claim_session()?;
        let attachment = Arc::new(Attachment::default());
        let revision = Arc::new(RevisionCell::default());
        let chosen = image.unwrap_or_default();
        let named = match &chosen.source {
            Some(c) => Some(c.clone()),
            None => tenant.image.as_ref().and(tenant.settings.image.clone()),
        };
        let backend = match tenant.backend.open_session(
            attachment.clone(),
            revision.clone(),
            crate::backend::Place {
                view: chosen.view,
                image: named.as_ref().map(|n| n.to_string()),
                workspace: chosen.fork,
            },
        ) {
            Ok(b) => b,
            Err(e) => {
                tenant.remove_session();
                return Err(e);
            }
        };
        tenant.metrics.sessions.inc();
        let session = Arc::new(Session {
            id: format!("{}{}", self.id_prefix, uuid::Uuid::new_v4()),
            tenant: tenant.clone(),
            backend,
            revision,
            attachment,
            epoch: AtomicU64::new(0),
            last_active: Mutex::new(tokio::time::Instant::now()),
            streams: AtomicUsize::new(0),
            ended: tokio_util::sync::CancellationToken::new(),
            image: named,
            ports: crate::preview::Ports::new(self.preview.clone()),
        });
        let token = session.attachment.attach(generation, outbound);
        sessions.insert(session.id.clone(), session.clone());
        Ok((session, token))
    }

    /// A session with no connection (gRPC `CreateSession`, or an `Exec`
    /// without one): it lives while used, then `detach_ttl` past its last use.
    /// It goes where the tenant's placement says, as a JSON-RPC session
    /// does (its executor pool, then translated for gRPC, or its local
    /// backend).
    pub async fn create_detached(
        self: &Arc<Self>,
        tenant: &Arc<Tenant>,
        subject: Option<&str>,
        image: Option<ChosenImage>,
    ) -> Result<Arc<Session>, GatewayError> {
        let (out, _rx) = Outbound::channel(tenant.outbound.clone());
        if image.is_some()
            && tenant.places_on_executors()
            && tenant.settings.placement != Placement::Local
        {
            return Err(images_run_locally());
        }
        let (session, token) = match (tenant.remote.as_ref(), tenant.settings.placement) {
            (Some(remote), Placement::Remote) => {
                self.open_remote(tenant, remote, out, None).await?
            }
            (Some(remote), Placement::PreferRemote) if remote.has_free_link() => {
                match self.open_remote(tenant, remote, out.clone(), None).await {
                    Err(GatewayError::ExecutorUnavailable { .. }) => {
                        self.initialize(tenant, None, out, None)?
                    }
                    other => other?,
                }
            }
            _ => self.initialize(tenant, None, out, image)?,
        };
        audit_session("session.opened", &session, subject, "");
        self.detach(&session, &token);
        Ok(session)
    }

    /// Look a session up for `tenant` (another tenant's id is unknown) and touch it.
    /// A session by id alone, whoever's it is: for a preview let in by a
    /// signed URL or a public port, whose door checks the tenant itself.
    /// Not touched: a preview's traffic does not keep a session alive
    /// (its open connections do, through [`Session::stream_guard`]).
    pub fn get(&self, id: &str) -> Option<Arc<Session>> {
        self.sessions.lock().get(id).cloned()
    }

    pub fn lookup(&self, tenant: &Arc<Tenant>, id: &str) -> Result<Arc<Session>, GatewayError> {
        let unknown = || GatewayError::UnknownId(format!("unknown session id {id}"));
        let session = self.sessions.lock().get(id).cloned().ok_or_else(unknown)?;
        if !Arc::ptr_eq(&session.tenant, tenant) {
            return Err(unknown());
        }
        session.touch();
        Ok(session)
    }

    /// The connection holding `token` went away: detach, and kill the
    /// session's processes if nobody resumes or uses it within the TTL.
    pub fn detach(self: &Arc<Self>, session: &Arc<Session>, token: &AttachToken) {
        if !session.attachment.detach(token.generation) {
            return;
        }
        session.touch();
        let epoch = session.epoch.load(Ordering::Relaxed);
        let registry = Arc::downgrade(self);
        let ttl = self
            .detach_ttl
            .unwrap_or(session.revision.policy().detach_ttl);
        // The timer holds the session weakly: a session closed meanwhile
        // (removed from the registry, its connection gone) is freed at
        // once with its processes' retained output, not a TTL later.
        let mut deadline = *session.last_active.lock() + ttl;
        let weak = Arc::downgrade(session);
        crate::task::start("session-ttl", async move {
            loop {
                tokio::time::sleep_until(deadline).await;
                let Some(session) = weak.upgrade() else {
                    return;
                };
                if session.epoch.load(Ordering::Relaxed) != epoch
                    || session.attachment.is_attached()
                {
                    // Resumed: a new detach arms a new timer.
                    return;
                }
                if session.streams.load(Ordering::Acquire) > 0 {
                    session.touch();
                }
                let last = *session.last_active.lock();
                if last + ttl > tokio::time::Instant::now() {
                    // Used meanwhile: wait out the new deadline.
                    deadline = last + ttl;
                    continue;
                }
                if let Some(registry) = registry.upgrade() {
                    tracing::debug!(session.id = %session.id, "detached session expired");
                    registry.remove(&session);
                }
                return;
            }
        });
    }

    /// Remove a session now and kill its process groups (stdio EOF, TTL).
    pub fn remove(&self, session: &Arc<Session>) {
        let removed = {
            let mut sessions = self.sessions.lock();
            match sessions.get(&session.id) {
                Some(s) if Arc::ptr_eq(s, session) => sessions.remove(&session.id),
                _ => None,
            }
        };
        session.ended.cancel();
        if removed.is_some() {
            session.attachment.evict_all();
            session.tenant.remove_session();
            session.tenant.metrics.sessions.dec();
            audit_session("session.closed", session, None, "ended");
        }
        session.backend.kill_all(crate::audit::KilledBy::SessionEnd);
    }

    /// Kill every session's processes (shutdown).
    pub fn kill_all(&self) {
        let all: Vec<Arc<Session>> = self.sessions.lock().drain().map(|(_, s)| s).collect();
        for s in all {
            s.ended.cancel();
            s.attachment.evict_all();
            s.tenant.remove_session();
            s.tenant.metrics.sessions.dec();
            audit_session("session.closed", &s, None, "shutdown");
            s.backend.kill_all(crate::audit::KilledBy::Shutdown);
        }
    }

    /// Live (not yet closed) processes over all sessions, and closed ones
    /// whose close an attached client has not had yet (what a drain waits for).
    pub fn live_processes(&self) -> usize {
        let all: Vec<Arc<Session>> = self.sessions.lock().values().cloned().collect();
        all.iter()
            .map(|s| {
                let undelivered = if s.attachment.is_attached() {
                    s.backend.undelivered_closes()
                } else {
                    0
                };
                s.backend.live_processes() + undelivered
            })
            .sum()
    }

    /// Drain: close (websocket 1012, behind everything already queued) the
    /// attached connection of each session whose processes have all ended
    /// and whose clients follow notifications, once per attachment. The
    /// client's close reply proves it read every frame before it; the
    /// connection then ends and the session detaches, so the drain no
    /// longer waits for it. A client that never answers keeps it attached
    /// until the write stalls (`slow_client_timeout`) or the grace ends.
    pub fn close_delivered_clients(&self, code: u16, reason: &'static str) {
        let all: Vec<Arc<Session>> = self.sessions.lock().values().cloned().collect();
        for s in all {
            let done = s.backend.live_processes() == 0
                && s.backend.undelivered_closes() > 0
                && s.backend.closes_awaiting_read() == 0;
            if !done {
                continue;
            }
            if let Some(out) = s.attachment.take_for_close() {
                tracing::debug!(session.id = %s.id, "drain: closing a client that has its processes' ends");
                crate::task::start("drain-close", async move { out.close(code, reason).await });
            }
        }
    }
}

/// Counts a remote session being opened while it lives.
struct OpeningGuard<'a>(&'a AtomicUsize);

impl Drop for OpeningGuard<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}
/// A session's event in the audit trail: its tenant and id, and the
/// subject of the caller that opened or resumed it (a close has none:
/// expiry and shutdown are nobody's call).
fn audit_session(event: &str, session: &Session, subject: Option<&str>, reason: &str) {
    let fields = if reason.is_empty() {
        serde_json::json!({})
    } else {
        serde_json::json!({ "reason": reason })
    };
    crate::audit::emit(
        event,
        &crate::audit::Who {
            tenant: Some(&session.tenant.name),
            subject,
            session: Some(&session.id),
        },
        fields,
    );
}

/// A session asked for an image on a tenant whose sessions run on
/// executors: images are this gateway's own.
fn images_run_locally() -> GatewayError {
    GatewayError::InvalidParams(
        "images run on the gateway's own workers; this tenant's sessions run on executors (placement)".to_owned(),
    )
}
