//! One process: its log, stdin, PTY and cgroup, and how it reports events
//! to the session's connection and to stream subscribers.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use bytes::Bytes;
use parking_lot::Mutex;
use tokio::sync::{Notify, OwnedSemaphorePermit, mpsc};

use super::Api;
use super::output::OutputLog;
use super::stdin::Stdin;
use super::write_ids::WriteIds;
use crate::isolation::cgroup::ProcessCgroup;
use crate::isolation::reaper::Reaper;
use crate::isolation::signal;
use crate::outbound::Attachment;
use crate::protocol::notify;
use crate::protocol::process::{ProcessEvent, ProcessState, StreamName};
use crate::protocol::revision::RevisionCell;
use crate::rpc::EventSource;
use crate::spawn::Pty;

/// Events buffered per live subscriber before the pump waits.
const SUBSCRIBER_EVENTS: usize = 16;
/// Longest a held process waits for its first subscriber.
pub const HOLD_OUTPUT_MAX: Duration = Duration::from_secs(10);

/// One running (or recently closed) process.
pub struct Process {
    pub id: String,
    /// `id` as a JSON string literal, precomputed for the notification hot path.
    pub id_json: String,
    pub api: Api,
    pub tty: bool,
    /// The leader's pid (also its group's id): for the reaper and logs
    /// only; signals go through `group`.
    pub pgid: i32,
    /// The process group, addressed through the leader's pidfd.
    pub group: signal::Group,
    pub log: Mutex<OutputLog>,
    /// Woken on every log change (long-poll readers).
    pub changed: Notify,
    pub stdin: Stdin,
    /// The PTY master (resize), for a PTY process until it closes.
    pub pty: Mutex<Option<Arc<Pty>>>,
    /// Set when the worker that spawned it died (reported in `failure`).
    worker_died: AtomicBool,
    /// Its close reached a client for certain (a stream subscriber got
    /// it, or a `process/read` returned it): a draining gateway waits for
    /// this, within `shutdown_grace`, while a client is attached, not only
    /// for the exit, so the last output is not cut off by the stop. A
    /// notification does not count: a client that reads with
    /// `process/read` ignores them, and may not have read yet.
    close_delivered: AtomicBool,
    /// Its close notification is in the attached connection's queue,
    /// behind every output notification: a websocket close handshake
    /// after it proves a client that follows notifications has it all.
    close_queued: AtomicBool,
    /// A `process/read` asked for it: its client reads that way, so only a
    /// read that returns the close counts as delivered.
    polled: AtomicBool,
    pub write_ids: Arc<Mutex<WriteIds>>,
    pub output_bytes: prometheus_client::metrics::counter::Counter,
    /// Live stream subscribers (gRPC Attach/Exec). Publishing awaits room in
    /// each (back-pressure, like a connection's queue); one that stalls past
    /// `subscriber_timeout` is dropped and its stream told to re-attach.
    subscribers: Mutex<Vec<mpsc::Sender<ProcessEvent>>>,
    subscriber_timeout: Duration,
    /// Output waits for the first subscriber (at most [`HOLD_OUTPUT_MAX`]).
    hold_output: bool,
    first_subscriber: Notify,
    /// The process's own cgroup (killed with it). Given back for the next
    /// process once this one closes with nothing left in it, else when the
    /// process is evicted.
    cgroup: Mutex<Option<ProcessCgroup>>,
    /// What the cgroup said of OOM kills when it was given back.
    oom_killed_at_release: AtomicBool,
    /// Whose it is and who ended it, for the audit trail.
    audit: Option<Arc<crate::audit::Tag>>,
    killed_by: std::sync::atomic::AtomicU8,
    /// The session's protocol revision (exit codes, notification shapes).
    pub revision: Arc<RevisionCell>,
}

/// Everything of a process but what its spawn yields.
pub struct NewProcess {
    pub id: String,
    pub api: Api,
    pub tty: bool,
    pub hold_output: bool,
    pub log: OutputLog,
    pub output_bytes: prometheus_client::metrics::counter::Counter,
    pub subscriber_timeout: Duration,
    pub cgroup: Option<ProcessCgroup>,
    pub revision: Arc<RevisionCell>,
    pub audit: Option<Arc<crate::audit::Tag>>,
}

impl NewProcess {
    pub fn spawned(
        self,
        pgid: i32,
        group: signal::Group,
        stdin: Stdin,
        pty: Option<Arc<Pty>>,
    ) -> Arc<Process> {
        Arc::new(Process {
            id_json: notify::json_string(&self.id),
            id: self.id,
            api: self.api,
            tty: self.tty,
            pgid,
            group,
            log: Mutex::new(self.log),
            changed: Notify::new(),
            stdin,
            pty: Mutex::new(pty),
            worker_died: AtomicBool::new(false),
            close_delivered: AtomicBool::new(false),
            close_queued: AtomicBool::new(false),
            polled: AtomicBool::new(false),
            write_ids: Arc::new(Mutex::new(WriteIds::default())),
            output_bytes: self.output_bytes,
            subscribers: Mutex::new(Vec::new()),
            subscriber_timeout: self.subscriber_timeout,
            hold_output: self.hold_output,
            first_subscriber: Notify::new(),
            cgroup: Mutex::new(self.cgroup),
            oom_killed_at_release: AtomicBool::new(false),
            revision: self.revision,
            audit: self.audit,
            killed_by: std::sync::atomic::AtomicU8::new(0),
        })
    }
}

impl Process {
    /// Its worker died: record it (for `failure`) and make sure nothing of
    /// the process survives (the worker's children are orphans now).
    pub fn worker_gone(self: &Arc<Self>) {
        self.worker_died.store(true, Ordering::Relaxed);
        self.killed_by(crate::audit::KilledBy::Worker);
        self.group.kill();
        self.kill_cgroup();
    }

    /// Kill the process's cgroup off the async threads (the kill rounds
    /// sleep). Reaches `setsid` escapers, which outlive their group.
    pub fn kill_cgroup(self: &Arc<Self>) {
        if let Some(cg) = &*self.cgroup.lock() {
            // At once: a release that comes first must not pool it.
            cg.mark_killed();
            let p = self.clone();
            tokio::task::spawn_blocking(move || {
                if let Some(cg) = &*p.cgroup.lock() {
                    cg.kill();
                }
            });
        }
    }

    /// Once closed: give the cgroup back now when nothing is left in it, so
    /// the next process reuses it instead of making one (a `mkdir` and a
    /// `chown` on cgroupfs: the largest cost of a spawn in the gateway). A
    /// cgroup with escapers in it stays with the process until eviction, as
    /// before, so `terminate` and session close still reach them.
    pub fn release_cgroup_if_empty(self: &Arc<Self>) {
        if self.cgroup.lock().is_some() {
            let p = self.clone();
            tokio::task::spawn_blocking(move || {
                let mut cg = p.cgroup.lock();
                if let Some(released) = cg.take_if(|c| c.is_empty()) {
                    p.oom_killed_at_release
                        .store(released.oom_killed(), Ordering::Relaxed);
                    drop(released);
                }
            });
        }
    }

    /// With `hold_output`, wait (bounded) for the first subscriber before
    /// reading: the child blocks on its full pipe meanwhile, so nothing is
    /// dropped from the retained window before the stream attaches.
    pub async fn hold_for_subscriber(&self) {
        if self.hold_output {
            let _ = tokio::time::timeout(HOLD_OUTPUT_MAX, self.first_subscriber.notified()).await;
        }
    }

    /// Why the process died, when the gateway knows better than its exit code.
    pub fn failure(&self) -> Option<String> {
        if self.worker_died.load(Ordering::Relaxed) {
            return Some("its worker process died; the process was killed".to_owned());
        }
        if !self.log.lock().exited() {
            return None;
        }
        let oom_killed = match &*self.cgroup.lock() {
            Some(cg) => cg.oom_killed(),
            None => self.oom_killed_at_release.load(Ordering::Relaxed),
        };
        oom_killed.then(|| "killed by the out-of-memory killer (tenant memory limit)".to_owned())
    }

    pub fn state(&self) -> ProcessState {
        let log = self.log.lock();
        if log.closed() {
            ProcessState::Closed
        } else if log.exited() {
            ProcessState::Exited
        } else {
            ProcessState::Running
        }
    }

    /// Hand an event to every live subscriber, waiting for room.
    async fn publish(&self, event: ProcessEvent) {
        let subs: Vec<_> = self.subscribers.lock().clone();
        if subs.is_empty() {
            return;
        }
        let mut dead = Vec::new();
        for (i, tx) in subs.iter().enumerate() {
            match tokio::time::timeout(self.subscriber_timeout, tx.send(event.clone())).await {
                Ok(Ok(())) => {}
                _ => dead.push(i),
            }
        }
        if !dead.is_empty() {
            let mut current = self.subscribers.lock();
            current.retain(|tx| !dead.iter().any(|&i| subs[i].same_channel(tx)));
        }
    }

    pub async fn emit_output(&self, attachment: &Attachment, stream: StreamName, data: Bytes) {
        self.output_bytes.inc_by(data.len() as u64);
        let seq = self.log.lock().push(stream, data.clone());
        self.changed.notify_waiters();
        attachment
            .notify_with(|| match self.api {
                Api::Process => notify::process_output(&self.id_json, seq, stream, &data),
                Api::CommandExec => notify::command_exec_output_delta(&self.id_json, stream, &data),
            })
            .await;
        self.publish(ProcessEvent::Output { seq, stream, data })
            .await;
    }

    /// An event of this process in the audit trail (before what it
    /// records takes effect, so before the exit it may cause).
    pub fn audit_event(&self, event: &str, mut fields: serde_json::Value) {
        if let (Some(tag), serde_json::Value::Object(f)) = (&self.audit, &mut fields) {
            f.insert("process_id".to_owned(), crate::audit::clip(&self.id));
            crate::audit::emit(event, &tag.who(), fields);
        }
    }

    /// SIGKILL its group and its cgroup (escapers included), `who` recorded.
    pub fn kill(self: &Arc<Self>, who: crate::audit::KilledBy) {
        self.killed_by(who);
        self.group.kill();
        self.kill_cgroup();
    }

    /// Record who is ending it (the first to say so), for the audit trail.
    pub fn killed_by(&self, who: crate::audit::KilledBy) {
        let _ = self
            .killed_by
            .compare_exchange(0, who as u8, Ordering::Relaxed, Ordering::Relaxed);
    }

    pub async fn emit_exit(&self, attachment: &Attachment, code: i32, signal: Option<i32>) {
        if let Some(tag) = &self.audit {
            let by = crate::audit::KilledBy::from_u8(self.killed_by.load(Ordering::Relaxed));
            crate::audit::emit(
                "process.exited",
                &tag.who(),
                serde_json::json!({
                    "process_id": crate::audit::clip(&self.id),
                    "exit_code": code,
                    "signal": signal,
                    "killed_by": if signal.is_some() { by.name() } else { None },
                }),
            );
        }
        let seq = self.log.lock().exit(code, signal);
        self.changed.notify_waiters();
        self.publish(ProcessEvent::Exited { seq, code, signal })
            .await;
        if self.api == Api::Process {
            let sandbox_denied = self
                .revision
                .policy()
                .reports_sandbox_denied
                .then_some(false);
            attachment
                .notify(notify::process_exited(
                    &self.id_json,
                    seq,
                    code,
                    sandbox_denied,
                ))
                .await;
        }
    }

    /// The exit code a process that ended so reports: its own code, or,
    /// when killed, -1 (0.130.0) or 128 + the signal (0.169.0) for a pipe
    /// process and 1 under a PTY (both references).
    pub fn exit_code(&self, ended: crate::spawn::Ended) -> i32 {
        use crate::spawn::Ended;
        let signal = match ended {
            Ended::Code(c) => return c,
            Ended::Signal(s) => s,
            // It was SIGKILLed with its worker.
            Ended::WorkerDied => libc::SIGKILL,
        };
        self.revision.policy().killed_exit_code(self.tty, signal)
    }

    pub async fn emit_closed(&self, attachment: &Attachment) {
        let (seq, code) = {
            let mut log = self.log.lock();
            (log.close(), log.exit_code().unwrap_or(-1))
        };
        self.changed.notify_waiters();
        let subscribed = !self.subscribers.lock().is_empty();
        self.publish(ProcessEvent::Closed { seq }).await;
        // Closed is the last event: end every subscriber's channel.
        self.subscribers.lock().clear();
        let text = match self.api {
            Api::Process => notify::process_closed(&self.id_json, seq),
            // v0 has no close: `exited` comes once all output has been sent.
            Api::CommandExec => notify::command_exec_exited(&self.id_json, code),
        };
        attachment.notify(text).await;
        self.close_queued.store(true, Ordering::Release);
        if subscribed {
            self.mark_close_delivered();
        }
    }

    /// A `process/read` was answered; `through_close`: it carried the close.
    pub fn mark_read(&self, through_close: bool) {
        self.polled.store(true, Ordering::Relaxed);
        if through_close {
            self.mark_close_delivered();
        }
    }

    /// A client has its close (see `close_delivered`).
    fn mark_close_delivered(&self) {
        self.close_delivered.store(true, Ordering::Relaxed);
    }

    /// Closed, but no client has been told yet.
    pub fn close_undelivered(&self) -> bool {
        self.log.lock().closed() && !self.close_delivered.load(Ordering::Relaxed)
    }

    /// Closed, not delivered, and a websocket close handshake would not
    /// prove it delivered: its client reads with `process/read`, or its
    /// close notification is not queued yet.
    pub fn close_awaits_read(&self) -> bool {
        self.close_undelivered()
            && (self.polled.load(Ordering::Relaxed) || !self.close_queued.load(Ordering::Acquire))
    }
}

impl EventSource for Process {
    fn subscribe(&self, after_seq: u64) -> (Vec<ProcessEvent>, mpsc::Receiver<ProcessEvent>) {
        let (tx, rx) = mpsc::channel(SUBSCRIBER_EVENTS);
        // Registration under the log lock: nothing falls between the replay
        // and the channel.
        let log = self.log.lock();
        let replay = log.events_since(after_seq);
        if !log.closed() {
            self.subscribers.lock().push(tx);
        }
        // Stores a permit if the pump is not waiting yet: no lost wake-up.
        self.first_subscriber.notify_one();
        (replay, rx)
    }
}

/// Slots a running process holds; released (and the gauge lowered) at close.
pub struct ProcessPermits {
    _tenant: OwnedSemaphorePermit,
    _global: Option<OwnedSemaphorePermit>,
    running: prometheus_client::metrics::gauge::Gauge,
}

impl ProcessPermits {
    pub fn new(
        tenant: OwnedSemaphorePermit,
        global: Option<OwnedSemaphorePermit>,
        running: prometheus_client::metrics::gauge::Gauge,
    ) -> Self {
        running.inc();
        Self {
            _tenant: tenant,
            _global: global,
            running,
        }
    }
}

impl Drop for ProcessPermits {
    fn drop(&mut self) {
        self.running.dec();
    }
}

/// Registers a process group with the reaper for as long as it lives.
pub struct GroupGuard {
    reaper: Option<Arc<Reaper>>,
    pgid: i32,
}

impl GroupGuard {
    /// `pgid` 0 (a process in a PID namespace that has already gone, whose
    /// host pid is unknown) registers nothing: it dies with its namespace.
    pub fn new(reaper: Option<Arc<Reaper>>, pgid: i32) -> Self {
        let reaper = reaper.filter(|_| pgid > 1);
        if let Some(r) = &reaper {
            r.register(pgid);
        }
        Self { reaper, pgid }
    }
}

impl Drop for GroupGuard {
    fn drop(&mut self) {
        if let Some(r) = &self.reaper {
            r.unregister(self.pgid);
        }
    }
}
