//! Sessions: created by `initialize`, owning a process table, surviving a
//! disconnect for the detach TTL, resumable by `resumeSessionId` (§3).
//!
//! Invariants: a session is attached to at most one connection; a detached
//! session whose TTL passes without a resume is removed and its process
//! groups are killed; the registry never holds more than `max_sessions`.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::Mutex;

use crate::error::GatewayError;
use crate::exec::{ExecSettings, ProcessTable};
use crate::fs::FsRoot;
use crate::outbound::{AttachToken, Attachment, Outbound};

/// One session.
pub struct Session {
    pub id: String,
    pub processes: Arc<ProcessTable>,
    pub attachment: Arc<Attachment>,
    pub fs: Arc<FsRoot>,
    /// Bumped on every attach; a TTL timer only fires for the detach it saw.
    epoch: AtomicU64,
}

/// All sessions of one gateway process.
pub struct SessionRegistry {
    sessions: Mutex<HashMap<String, Arc<Session>>>,
    detach_ttl: Duration,
    max_sessions: usize,
    exec: Arc<ExecSettings>,
    fs: Arc<FsRoot>,
    next_generation: AtomicU64,
}

impl SessionRegistry {
    pub fn new(
        detach_ttl: Duration,
        max_sessions: usize,
        exec: Arc<ExecSettings>,
        fs: Arc<FsRoot>,
    ) -> Arc<Self> {
        Arc::new(Self {
            sessions: Mutex::new(HashMap::new()),
            detach_ttl,
            max_sessions,
            exec,
            fs,
            next_generation: AtomicU64::new(1),
        })
    }

    pub fn len(&self) -> usize {
        self.sessions.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// `initialize`: create a session, or resume a detached one.
    pub fn initialize(
        &self,
        resume: Option<&str>,
        outbound: Outbound,
    ) -> Result<(Arc<Session>, AttachToken), GatewayError> {
        let generation = self.next_generation.fetch_add(1, Ordering::Relaxed);
        if let Some(id) = resume {
            let session =
                self.sessions.lock().get(id).cloned().ok_or_else(|| {
                    GatewayError::InvalidRequest(format!("unknown session id {id}"))
                })?;
            if session.attachment.is_attached() {
                return Err(GatewayError::InvalidRequest(format!(
                    "session {id} is already attached to another connection"
                )));
            }
            session.epoch.fetch_add(1, Ordering::Relaxed);
            let token = session.attachment.attach(generation, outbound);
            return Ok((session, token));
        }
        let mut sessions = self.sessions.lock();
        if sessions.len() >= self.max_sessions {
            return Err(GatewayError::QuotaExceeded {
                quota: "sessions",
                limit: self.max_sessions as u64,
                retry_after_ms: None,
            });
        }
        let attachment = Arc::new(Attachment::default());
        let session = Arc::new(Session {
            id: uuid::Uuid::new_v4().to_string(),
            processes: ProcessTable::new(attachment.clone(), self.exec.clone()),
            attachment,
            fs: self.fs.clone(),
            epoch: AtomicU64::new(0),
        });
        let token = session.attachment.attach(generation, outbound);
        sessions.insert(session.id.clone(), session.clone());
        Ok((session, token))
    }

    /// The connection holding `token` went away: detach, and kill the
    /// session's processes if nobody resumes it within the TTL.
    pub fn detach(self: &Arc<Self>, session: &Arc<Session>, token: &AttachToken) {
        if !session.attachment.detach(token.generation) {
            return;
        }
        let epoch = session.epoch.load(Ordering::Relaxed);
        let registry = Arc::downgrade(self);
        let session = session.clone();
        let ttl = self.detach_ttl;
        crate::task::spawn("session-ttl", async move {
            tokio::time::sleep(ttl).await;
            if session.epoch.load(Ordering::Relaxed) != epoch || session.attachment.is_attached() {
                return;
            }
            if let Some(registry) = registry.upgrade() {
                tracing::debug!(session.id = %session.id, "detached session expired");
                registry.remove(&session);
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
        if removed.is_some() {
            session.attachment.evict_all();
        }
        session.processes.kill_all();
    }

    /// Kill every session's processes (shutdown).
    pub fn kill_all(&self) {
        let all: Vec<Arc<Session>> = self.sessions.lock().drain().map(|(_, s)| s).collect();
        for s in all {
            s.attachment.evict_all();
            s.processes.kill_all();
        }
    }

    /// Live (not yet closed) processes over all sessions.
    pub fn live_processes(&self) -> usize {
        let all: Vec<Arc<Session>> = self.sessions.lock().values().cloned().collect();
        all.iter().map(|s| s.processes.live_count()).sum()
    }
}
