//! The per-session process table and each process's lifecycle task.
//!
//! Owns: the `processId → Process` map of one session, the output pumps
//! (one task per process that reads stdout, stderr and the exit in `select!`,
//! so seqs are assigned *and* emitted in order), stdin, signals and
//! retention. Must not: know about transports; hold a lock across `.await`.
//!
//! A process's lifetime is not tied to a connection: it notifies through the
//! session's [`Attachment`], and its log serves `process/read` from any
//! connection that holds the session.

pub mod cgroup;
pub mod env;
pub mod output;
pub mod reaper;
pub mod sandbox;
pub mod signal;
pub mod spawn;
pub mod worker;

use std::collections::{HashMap, HashSet, VecDeque};
use std::fmt::Write as _;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use parking_lot::Mutex;

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore, mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use crate::error::GatewayError;
use crate::metrics::TenantMetrics;
use crate::outbound::Attachment;
use crate::protocol::process::{
    ExecParams, ExecResponse, ListResponse, ProcessInfo, ProcessOutputChunk, ProcessState,
    ReadParams, ReadResponse, ResizeParams, SignalParams, StreamName, TerminateResponse,
    WriteParams, WriteResponse, WriteStatus,
};
use crate::protocol::{ByteChunk, base64_into, methods};
use output::{OutputLog, RETAINED_OUTPUT_BYTES_PER_PROCESS};
use spawn::SpawnSpec;

/// Bytes asked of each pipe/PTY read; also the largest output chunk.
pub const OUTPUT_READ_CHUNK_BYTES: usize = 256 * 1024;
/// How long a closed process stays readable (`EXITED_PROCESS_RETENTION`).
pub const EXITED_PROCESS_RETENTION: Duration = Duration::from_secs(30);
/// Events buffered per live subscriber before the pump waits.
const SUBSCRIBER_EVENTS: usize = 16;
/// PTY output chunks buffered between the blocking reader and the pump.
const PTY_CHANNEL_CHUNKS: usize = 4;
/// `writeId`s remembered per process for de-duplication (as June upstream).
const WRITE_IDS_PER_PROCESS: usize = 4096;
/// Longest `waitMs` honoured; longer waits are clamped.
pub const MAX_READ_WAIT: Duration = Duration::from_secs(3600);

/// Settings shared by every process table of a tenant.
#[derive(Debug, Clone)]
pub struct ExecSettings {
    pub retained_output_bytes: usize,
    pub exited_retention: Duration,
    /// Base environment for `envPolicy` (the tenant's, never the gateway's).
    pub base_env: HashMap<String, String>,
    /// Running-process slots; a permit lives as long as its process.
    pub process_slots: Arc<Semaphore>,
    pub max_processes: usize,
    /// Kills live groups if the gateway dies (None in library use without one).
    pub reaper: Option<Arc<reaper::Reaper>>,
    /// Gateway-wide running-process slots and their number (past it: -32001).
    pub global_slots: Option<(Arc<Semaphore>, usize)>,
    /// Output bytes retained over all the tenant's processes.
    pub retained: Arc<AtomicUsize>,
    /// Past this, new processes are refused with -32006.
    pub max_retained_bytes: usize,
    pub metrics: TenantMetrics,
    /// A live subscriber that takes longer than this to accept an event is dropped.
    pub subscriber_timeout: Duration,
    /// The tenant's cgroup, when the cgroup layer is active.
    pub cgroup: Option<Arc<cgroup::TenantCgroup>>,
    /// The tenant's process sandbox (uid, Landlock, seccomp), when any
    /// layer is active and processes are spawned by the gateway itself.
    pub sandbox: Option<Arc<sandbox::Sandbox>>,
    /// The tenant's worker pool: processes are spawned there (confined
    /// as a whole) instead of by the gateway.
    pub workers: Option<Arc<worker::WorkerPool>>,
}

impl ExecSettings {
    pub fn new(max_processes: usize, base_env: HashMap<String, String>) -> Self {
        Self {
            retained_output_bytes: RETAINED_OUTPUT_BYTES_PER_PROCESS,
            exited_retention: EXITED_PROCESS_RETENTION,
            base_env,
            process_slots: Arc::new(Semaphore::new(max_processes)),
            max_processes,
            reaper: None,
            global_slots: None,
            retained: Arc::default(),
            max_retained_bytes: usize::MAX,
            metrics: TenantMetrics::detached("default"),
            subscriber_timeout: Duration::from_secs(30),
            cgroup: None,
            sandbox: None,
            workers: None,
        }
    }
}

/// Which API started a process; it reports in the same family (§G.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    Process,
    V0,
}

enum Entry {
    Starting,
    Running(Arc<Process>),
}

/// The processes of one session.
pub struct ProcessTable {
    entries: Mutex<HashMap<String, Entry>>,
    /// Closed processes in close order with their eviction time. Retention is
    /// one constant, so the front is always the next to expire; expired
    /// entries are swept on every table access (exact for the reference's
    /// "unknown process id after 30 s" rule) without a timer per process.
    closed: Mutex<VecDeque<(tokio::time::Instant, Arc<Process>)>>,
    attachment: Arc<Attachment>,
    settings: Arc<ExecSettings>,
    /// The session's worker (with a worker pool).
    worker: Mutex<Option<Arc<worker::WorkerConn>>>,
}

enum Stdin {
    None,
    Pipe(tokio::sync::Mutex<Option<tokio::net::unix::pipe::Sender>>),
    Pty(Arc<Mutex<Option<Box<dyn std::io::Write + Send>>>>),
}

struct WriteIds {
    order: VecDeque<String>,
    seen: HashSet<String>,
}

impl WriteIds {
    /// True if `id` is new (and remembers it).
    fn insert(&mut self, id: &str) -> bool {
        if self.seen.contains(id) {
            return false;
        }
        if self.order.len() >= WRITE_IDS_PER_PROCESS
            && let Some(old) = self.order.pop_front()
        {
            self.seen.remove(&old);
        }
        self.order.push_back(id.to_owned());
        self.seen.insert(id.to_owned());
        true
    }
}

/// One running (or recently closed) process.
pub struct Process {
    id: String,
    /// `id` as a JSON string literal, precomputed for the notification hot path.
    id_json: String,
    family: Family,
    tty: bool,
    pgid: i32,
    log: Mutex<OutputLog>,
    /// Woken on every log change (long-poll readers).
    changed: Notify,
    stdin: Stdin,
    master: Option<Mutex<spawn::PtyMaster>>,
    /// Set when the worker that spawned it died (reported in `failure`).
    worker_died: std::sync::atomic::AtomicBool,
    write_ids: Mutex<WriteIds>,
    output_bytes: prometheus_client::metrics::counter::Counter,
    /// Live stream subscribers (gRPC Attach/Exec). Publishing awaits room in
    /// each (back-pressure, like a connection's queue); one that stalls past
    /// `subscriber_timeout` is dropped and its stream told to re-attach.
    subscribers: Mutex<Vec<mpsc::Sender<output::LogEvent>>>,
    subscriber_timeout: Duration,
    /// Output waits for the first subscriber (at most `HOLD_OUTPUT_MAX`).
    hold_output: bool,
    first_subscriber: tokio::sync::Notify,
    /// The process's own cgroup (killed with it; removed when evicted).
    cgroup: Option<cgroup::ProcessCgroup>,
}

/// Slots a running process holds; released (and the gauge lowered) at close.
struct ProcessPermits {
    _tenant: OwnedSemaphorePermit,
    _global: Option<OwnedSemaphorePermit>,
    running: prometheus_client::metrics::gauge::Gauge,
}

impl Drop for ProcessPermits {
    fn drop(&mut self) {
        self.running.dec();
    }
}

impl Process {
    /// Its worker died: record it (for `failure`) and make sure nothing of
    /// the process survives (the worker's children are orphans now).
    fn worker_gone(self: &Arc<Self>) {
        self.worker_died
            .store(true, std::sync::atomic::Ordering::Relaxed);
        signal::kill_group(self.pgid);
        kill_cgroup(self);
    }

    /// With `hold_output`, wait (bounded) for the first subscriber before
    /// reading: the child blocks on its full pipe meanwhile, so nothing is
    /// dropped from the retained window before the stream attaches.
    async fn hold_for_subscriber(&self) {
        if self.hold_output {
            let _ = tokio::time::timeout(HOLD_OUTPUT_MAX, self.first_subscriber.notified()).await;
        }
    }

    /// Why the process died, when the gateway knows better than its exit code.
    fn failure(&self) -> Option<String> {
        if self.worker_died.load(std::sync::atomic::Ordering::Relaxed) {
            return Some("its worker process died; the process was killed".to_owned());
        }
        let cg = self.cgroup.as_ref()?;
        (self.log.lock().exited() && cg.oom_killed())
            .then(|| "killed by the out-of-memory killer (tenant memory limit)".to_owned())
    }

    fn state(&self) -> ProcessState {
        let log = self.log.lock();
        if log.closed() {
            ProcessState::Closed
        } else if log.exited() {
            ProcessState::Exited
        } else {
            ProcessState::Running
        }
    }

    fn encode_output(&self, seq: u64, stream: StreamName, data: &[u8]) -> String {
        let mut s = String::with_capacity(96 + self.id_json.len() + data.len() / 3 * 4 + 4);
        match self.family {
            Family::Process => {
                s.push_str(r#"{"method":"process/output","params":{"processId":"#);
                s.push_str(&self.id_json);
                let _ = write!(
                    s,
                    r#","seq":{seq},"stream":"{}","chunk":""#,
                    stream.as_str()
                );
            }
            Family::V0 => {
                // v0 knows only stdout/stderr; PTY output is stdout (seeds/000).
                let stream = match stream {
                    StreamName::Stderr => "stderr",
                    StreamName::Stdout | StreamName::Pty => "stdout",
                };
                s.push_str(r#"{"method":"command/exec/outputDelta","params":{"processId":"#);
                s.push_str(&self.id_json);
                let _ = write!(s, r#","stream":"{stream}","chunk":""#);
            }
        }
        base64_into(data, &mut s);
        s.push_str("\"}}");
        s
    }

    /// Hand an event to every live subscriber, waiting for room.
    async fn publish(&self, event: output::LogEvent) {
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

    async fn emit_output(&self, attachment: &Attachment, stream: StreamName, data: Bytes) {
        self.output_bytes.inc_by(data.len() as u64);
        let seq = self.log.lock().push(stream, data.clone());
        self.changed.notify_waiters();
        attachment
            .notify(self.encode_output(seq, stream, &data))
            .await;
        self.publish(output::LogEvent::Output(output::RetainedChunk {
            seq,
            stream,
            data,
        }))
        .await;
    }

    async fn emit_exit(&self, attachment: &Attachment, code: i32) {
        let seq = self.log.lock().exit(code);
        self.changed.notify_waiters();
        self.publish(output::LogEvent::Exited { seq, code }).await;
        if self.family == Family::Process {
            let msg = format!(
                r#"{{"method":"{}","params":{{"processId":{},"seq":{seq},"exitCode":{code}}}}}"#,
                methods::PROCESS_EXITED,
                self.id_json
            );
            attachment.notify(msg).await;
        }
    }

    async fn emit_closed(&self, attachment: &Attachment) {
        let (seq, code) = {
            let mut log = self.log.lock();
            (log.close(), log.exit_code().unwrap_or(-1))
        };
        self.changed.notify_waiters();
        self.publish(output::LogEvent::Closed { seq }).await;
        // Closed is the last event: end every subscriber's channel.
        self.subscribers.lock().clear();
        let msg = match self.family {
            Family::Process => format!(
                r#"{{"method":"{}","params":{{"processId":{},"seq":{seq}}}}}"#,
                methods::PROCESS_CLOSED,
                self.id_json
            ),
            // v0 has no close: `exited` comes once all output has been sent.
            Family::V0 => format!(
                r#"{{"method":"{}","params":{{"processId":{},"exitCode":{code}}}}}"#,
                methods::COMMAND_EXEC_EXITED,
                self.id_json
            ),
        };
        attachment.notify(msg).await;
    }
}

/// A handle on one process for stream subscribers (gRPC Attach/Exec).
#[derive(Clone)]
pub struct ProcessHandle(Arc<Process>);

impl std::fmt::Debug for ProcessHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ProcessHandle({})", self.0.id)
    }
}

impl ProcessHandle {
    /// Events with `seq > after_seq`, in order (the retained window only).
    pub fn events_since(&self, after_seq: u64) -> Vec<output::LogEvent> {
        self.0.log.lock().events_since(after_seq)
    }

    /// Subscribe to live events: returns the retained events with
    /// `seq > after_seq` (the replay) and a channel of every later event.
    /// Registration happens under the log lock, so nothing falls between the
    /// replay and the channel; an event may appear in both (skip by seq).
    /// The channel ends after `closed` (or at once if already closed).
    pub fn subscribe(
        &self,
        after_seq: u64,
    ) -> (Vec<output::LogEvent>, mpsc::Receiver<output::LogEvent>) {
        let (tx, rx) = mpsc::channel(SUBSCRIBER_EVENTS);
        let log = self.0.log.lock();
        let replay = log.events_since(after_seq);
        if !log.closed() {
            self.0.subscribers.lock().push(tx);
        }
        // Stores a permit if the pump is not waiting yet: no lost wake-up.
        self.0.first_subscriber.notify_one();
        (replay, rx)
    }
}

fn invalid(msg: String) -> GatewayError {
    GatewayError::InvalidRequest(msg)
}

/// Longest a held process waits for its first subscriber.
const HOLD_OUTPUT_MAX: Duration = Duration::from_secs(10);

impl Drop for ProcessTable {
    fn drop(&mut self) {
        if let (Some(pool), Some(w)) = (&self.settings.workers, self.worker.lock().take()) {
            pool.release(&w);
        }
    }
}

impl ProcessTable {
    pub fn new(attachment: Arc<Attachment>, settings: Arc<ExecSettings>) -> Arc<Self> {
        Arc::new(Self {
            entries: Mutex::new(HashMap::new()),
            closed: Mutex::new(VecDeque::new()),
            attachment,
            settings,
            worker: Mutex::new(None),
        })
    }

    /// The session's worker, picked at its first spawn; a dead one is
    /// replaced for later spawns (its processes are reported failed).
    fn worker(&self) -> Result<Option<Arc<worker::WorkerConn>>, GatewayError> {
        let Some(pool) = &self.settings.workers else {
            return Ok(None);
        };
        let mut current = self.worker.lock();
        if let Some(w) = current.as_ref() {
            if !w.is_dead() {
                return Ok(Some(w.clone()));
            }
            pool.release(w);
        }
        let w = pool
            .pick()
            .map_err(|e| GatewayError::Internal(format!("worker: {e}")))?;
        *current = Some(w.clone());
        Ok(Some(w))
    }

    /// Evict closed processes whose retention has passed.
    fn sweep(&self) {
        let now = tokio::time::Instant::now();
        let mut expired = Vec::new();
        {
            let mut closed = self.closed.lock();
            while closed.front().is_some_and(|(at, _)| *at <= now) {
                if let Some((_, p)) = closed.pop_front() {
                    expired.push(p);
                }
            }
        }
        for p in expired {
            self.evict(&p);
        }
    }

    fn mark_closed(&self, process: &Arc<Process>) {
        let at = tokio::time::Instant::now() + self.settings.exited_retention;
        self.closed.lock().push_back((at, process.clone()));
    }

    fn get(&self, id: &str) -> Result<Arc<Process>, GatewayError> {
        self.sweep();
        match self.entries.lock().get(id) {
            Some(Entry::Running(p)) => Ok(p.clone()),
            Some(Entry::Starting) => Err(invalid(format!("process id {id} is starting"))),
            None => Err(GatewayError::UnknownId(format!("unknown process id {id}"))),
        }
    }

    /// `process/start` (and `command/exec` with `Family::V0`).
    pub fn start(
        self: &Arc<Self>,
        params: ExecParams,
        family: Family,
        retained_cap: Option<usize>,
    ) -> Result<ExecResponse, GatewayError> {
        if params.argv.is_empty() {
            return Err(GatewayError::InvalidParams(
                "argv must not be empty".to_owned(),
            ));
        }
        let id = params.process_id.clone();
        self.sweep();
        {
            let mut entries = self.entries.lock();
            if entries.contains_key(&id) {
                return Err(GatewayError::AlreadyExists(format!(
                    "process {id} already exists"
                )));
            }
            entries.insert(id.clone(), Entry::Starting);
        }
        let result = self.spawn_entry(params, family, retained_cap);
        let mut entries = self.entries.lock();
        match result {
            Ok(process) => {
                entries.insert(id.clone(), Entry::Running(process));
                Ok(ExecResponse { process_id: id })
            }
            Err(e) => {
                entries.remove(&id);
                Err(e)
            }
        }
    }

    fn spawn_entry(
        self: &Arc<Self>,
        params: ExecParams,
        family: Family,
        retained_cap: Option<usize>,
    ) -> Result<Arc<Process>, GatewayError> {
        let settings = &self.settings;
        if settings.retained.load(Ordering::Relaxed) >= settings.max_retained_bytes {
            // Retained output drains as closed processes are evicted.
            return Err(GatewayError::QuotaExceeded {
                quota: "retained_output_bytes",
                limit: settings.max_retained_bytes as u64,
                retry_after_ms: u64::try_from(settings.exited_retention.as_millis()).ok(),
            });
        }
        let permit = settings
            .process_slots
            .clone()
            .try_acquire_owned()
            .map_err(|_| GatewayError::QuotaExceeded {
                quota: "processes",
                limit: settings.max_processes as u64,
                retry_after_ms: None,
            })?;
        let global = match &settings.global_slots {
            None => None,
            // The gateway as a whole is full: load, not this tenant's quota.
            Some((slots, _)) => Some(
                slots
                    .clone()
                    .try_acquire_owned()
                    .map_err(|_| GatewayError::Overloaded)?,
            ),
        };
        let permit = ProcessPermits {
            _tenant: permit,
            _global: global,
            running: settings.metrics.processes.clone(),
        };
        permit.running.inc();
        let spec = SpawnSpec {
            env: env::child_env(
                &params.env,
                params.env_policy.as_ref(),
                &self.settings.base_env,
            ),
            argv: params.argv,
            cwd: params.cwd,
            arg0: params.arg0,
            pipe_stdin: params.pipe_stdin && !params.tty,
            fallback_path: self.settings.base_env.get("PATH").cloned(),
        };
        let cap = retained_cap
            .unwrap_or(usize::MAX)
            .min(self.settings.retained_output_bytes);
        let id_json = serde_json::to_string(&params.process_id)
            .map_err(|e| GatewayError::Internal(e.to_string()))?;
        let table = Arc::downgrade(self);
        let worker = self.worker()?;
        let process_cgroup = match &self.settings.cgroup {
            None => None,
            Some(t) => Some(
                t.process()
                    .map_err(|e| GatewayError::Internal(format!("cgroup: {e}")))?,
            ),
        };
        // Everything of the entry but what the spawn itself yields.
        let (process_id, hold_output, tty) = (params.process_id, params.hold_output, params.tty);
        let settings = &self.settings;
        let new_process = move |pgid: i32,
                                stdin: Stdin,
                                master: Option<spawn::PtyMaster>,
                                cgroup: Option<cgroup::ProcessCgroup>| {
            Arc::new(Process {
                id: process_id,
                id_json,
                family,
                tty,
                pgid,
                log: Mutex::new(OutputLog::new(cap, settings.retained.clone())),
                changed: Notify::new(),
                stdin,
                master: master.map(Mutex::new),
                write_ids: Mutex::new(WriteIds {
                    order: VecDeque::new(),
                    seen: HashSet::new(),
                }),
                output_bytes: settings.metrics.output_bytes.clone(),
                subscribers: Mutex::new(Vec::new()),
                subscriber_timeout: settings.subscriber_timeout,
                hold_output,
                first_subscriber: tokio::sync::Notify::new(),
                cgroup,
                worker_died: std::sync::atomic::AtomicBool::new(false),
            })
        };
        if tty {
            let started = std::time::Instant::now();
            let child = match &worker {
                Some(w) => spawn::spawn_pty_in_worker(&spec, process_cgroup.as_ref(), w)
                    .map_err(|e| GatewayError::Internal(e.to_string()))?,
                None => spawn::spawn_pty(
                    &spec,
                    process_cgroup.as_ref(),
                    self.settings.sandbox.as_deref(),
                )
                .map_err(GatewayError::Internal)?,
            };
            self.settings
                .metrics
                .spawn_seconds
                .observe(started.elapsed().as_secs_f64());
            let guard = GroupGuard::new(self.settings.reaper.clone(), child.pid);
            let writer = Arc::new(Mutex::new(Some(child.writer)));
            let process = new_process(
                child.pid,
                Stdin::Pty(writer),
                Some(child.master),
                process_cgroup,
            );
            let pump = PtyPump {
                guard,
                process: process.clone(),
                attachment: self.attachment.clone(),
                exit: child.exit,
                reader: child.reader,
            };
            crate::task::spawn("process-pty", pump.run(permit, table));
            Ok(process)
        } else {
            let started = std::time::Instant::now();
            let child = match &worker {
                Some(w) => spawn::spawn_pipe_in_worker(&spec, process_cgroup.as_ref(), w)
                    .map_err(|e| GatewayError::Internal(e.to_string()))?,
                None => spawn::spawn_pipe(
                    &spec,
                    process_cgroup.as_ref(),
                    self.settings.sandbox.as_deref(),
                )
                .map_err(|e| GatewayError::Internal(e.to_string()))?,
            };
            self.settings
                .metrics
                .spawn_seconds
                .observe(started.elapsed().as_secs_f64());
            let stdin = match child.stdin {
                Some(s) => Stdin::Pipe(tokio::sync::Mutex::new(Some(s))),
                None => Stdin::None,
            };
            let process = new_process(child.pid, stdin, None, process_cgroup);
            let guard = GroupGuard::new(self.settings.reaper.clone(), child.pid);
            let pump = PipePump {
                guard,
                process: process.clone(),
                attachment: self.attachment.clone(),
                exit: child.exit,
                stdout: child.stdout,
                stderr: child.stderr,
            };
            crate::task::spawn("process-pipe", pump.run(permit, table));
            Ok(process)
        }
    }

    /// `process/read`: select, and long-poll until ready, the deadline, or
    /// eviction of the calling connection.
    pub async fn read(
        &self,
        params: ReadParams,
        evicted: &CancellationToken,
    ) -> Result<ReadResponse, GatewayError> {
        let process = self.get(&params.process_id)?;
        let after_seq = params.after_seq.unwrap_or(0);
        let wait = Duration::from_millis(params.wait_ms.unwrap_or(0)).min(MAX_READ_WAIT);
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let notified = process.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let sel = process.log.lock().select(after_seq, params.max_bytes);
            if sel.is_ready(after_seq) || tokio::time::Instant::now() >= deadline {
                return Ok(ReadResponse {
                    chunks: sel
                        .chunks
                        .into_iter()
                        .map(|c| ProcessOutputChunk {
                            seq: c.seq,
                            stream: c.stream,
                            chunk: ByteChunk(c.data.to_vec()),
                        })
                        .collect(),
                    next_seq: sel.next_seq,
                    exited: sel.exited,
                    exit_code: sel.exit_code,
                    closed: sel.closed,
                    failure: process.failure(),
                });
            }
            tokio::select! {
                () = &mut notified => {}
                () = tokio::time::sleep_until(deadline) => {}
                () = evicted.cancelled() => {
                    return Err(invalid(
                        "session has been resumed by another connection".to_owned(),
                    ));
                }
            }
        }
    }

    /// A handle for streaming a process's events.
    pub fn handle(&self, id: &str) -> Result<ProcessHandle, GatewayError> {
        self.get(id).map(ProcessHandle)
    }

    /// `process/write`; unknown ids are a status, not an error (§4.3).
    pub async fn write(&self, params: WriteParams) -> Result<WriteResponse, GatewayError> {
        let status = |status| Ok(WriteResponse { status });
        self.sweep();
        let process = match self.entries.lock().get(&params.process_id) {
            Some(Entry::Running(p)) => p.clone(),
            Some(Entry::Starting) => return status(WriteStatus::Starting),
            None => return status(WriteStatus::UnknownProcess),
        };
        if matches!(process.stdin, Stdin::None) {
            return status(WriteStatus::StdinClosed);
        }
        if let Some(write_id) = &params.write_id
            && !process.write_ids.lock().insert(write_id)
        {
            return status(WriteStatus::Accepted);
        }
        write_stdin(&process, params.chunk.0).await?;
        status(WriteStatus::Accepted)
    }

    /// `process/terminate`: SIGKILL to the process group.
    pub fn terminate(&self, id: &str) -> TerminateResponse {
        self.sweep();
        let process = match self.entries.lock().get(id) {
            Some(Entry::Running(p)) => p.clone(),
            _ => return TerminateResponse { running: false },
        };
        if process.log.lock().exited() {
            return TerminateResponse { running: false };
        }
        signal::kill_group(process.pgid);
        kill_cgroup(&process);
        TerminateResponse { running: true }
    }

    /// `process/signal` (extension): to the process group.
    pub fn signal(&self, params: &SignalParams) -> Result<(), GatewayError> {
        let process = self.get(&params.process_id)?;
        if process.log.lock().closed() {
            return Err(invalid(format!(
                "process {} has already closed",
                params.process_id
            )));
        }
        signal::signal_group(process.pgid, signal::to_signal(params.signal))
            .map_err(|e| GatewayError::Internal(e.to_string()))
    }

    /// `process/resize` (extension), PTY processes only.
    pub fn resize(&self, params: &ResizeParams) -> Result<(), GatewayError> {
        let process = self.get(&params.process_id)?;
        let master = process
            .master
            .as_ref()
            .ok_or_else(|| invalid(format!("process {} is not a pty", params.process_id)))?;
        if params.rows == 0 || params.cols == 0 {
            return Err(GatewayError::InvalidParams(
                "rows and cols must be positive".to_owned(),
            ));
        }
        master
            .lock()
            .resize(params.rows, params.cols)
            .map_err(|e| GatewayError::Internal(e.to_string()))
    }

    /// `process/closeStdin` (extension): EOF on a pipe; ^D on a PTY.
    pub async fn close_stdin(&self, id: &str) -> Result<(), GatewayError> {
        let process = self.get(id)?;
        match &process.stdin {
            Stdin::None => Ok(()),
            Stdin::Pipe(pipe) => {
                if let Some(mut s) = pipe.lock().await.take() {
                    let _ = s.shutdown().await;
                }
                Ok(())
            }
            Stdin::Pty(_) => write_stdin(&process, vec![0x04]).await,
        }
    }

    /// `process/list` (extension).
    pub fn list(&self) -> ListResponse {
        self.sweep();
        let entries = self.entries.lock();
        let mut processes: Vec<ProcessInfo> = entries
            .iter()
            .map(|(id, e)| match e {
                Entry::Starting => ProcessInfo {
                    process_id: id.clone(),
                    state: ProcessState::Starting,
                    tty: false,
                    exit_code: None,
                    next_seq: 1,
                    first_retained_seq: None,
                },
                Entry::Running(p) => {
                    let state = p.state();
                    let log = p.log.lock();
                    ProcessInfo {
                        process_id: id.clone(),
                        state,
                        tty: p.tty,
                        exit_code: log.exit_code(),
                        next_seq: log.next_seq(),
                        first_retained_seq: log.first_retained_seq(),
                    }
                }
            })
            .collect();
        processes.sort_by(|a, b| a.process_id.cmp(&b.process_id));
        ListResponse { processes }
    }

    /// v0 `command/exec/write`: PTY processes only; errors instead of statuses.
    pub async fn write_v0(&self, id: &str, data: Vec<u8>) -> Result<(), GatewayError> {
        let process = self.get(id)?;
        if matches!(process.stdin, Stdin::None) {
            return Err(invalid(format!("stdin of process {id} is closed")));
        }
        write_stdin(&process, data).await
    }

    /// SIGKILL every live process group (session end, shutdown).
    pub fn kill_all(&self) {
        let all: Vec<Arc<Process>> = self
            .entries
            .lock()
            .values()
            .filter_map(|e| match e {
                Entry::Running(p) => Some(p.clone()),
                Entry::Starting => None,
            })
            .collect();
        for p in all {
            if !p.log.lock().closed() {
                signal::kill_group(p.pgid);
            }
            // Escapers outlive their group: the cgroup reaches them.
            kill_cgroup(&p);
        }
    }

    /// Processes that have not closed yet.
    pub fn live_count(&self) -> usize {
        self.entries
            .lock()
            .values()
            .filter(|e| match e {
                Entry::Running(p) => !p.log.lock().closed(),
                Entry::Starting => true,
            })
            .count()
    }

    fn evict(&self, process: &Arc<Process>) {
        let mut entries = self.entries.lock();
        if let Some(Entry::Running(p)) = entries.get(&process.id)
            && Arc::ptr_eq(p, process)
        {
            entries.remove(&process.id);
        }
    }
}

/// Kill a process's cgroup off the async threads (the kill rounds sleep).
fn kill_cgroup(process: &Arc<Process>) {
    if process.cgroup.is_some() {
        let p = process.clone();
        tokio::task::spawn_blocking(move || {
            if let Some(cg) = &p.cgroup {
                cg.kill();
            }
        });
    }
}

async fn write_stdin(process: &Process, data: Vec<u8>) -> Result<(), GatewayError> {
    let failed = || GatewayError::Internal("failed to write to process stdin".to_owned());
    match &process.stdin {
        Stdin::None => Err(failed()),
        Stdin::Pipe(pipe) => {
            let mut guard = pipe.lock().await;
            let stdin = guard.as_mut().ok_or_else(failed)?;
            stdin.write_all(&data).await.map_err(|_| failed())?;
            stdin.flush().await.map_err(|_| failed())
        }
        Stdin::Pty(writer) => {
            let writer = writer.clone();
            tokio::task::spawn_blocking(move || {
                let mut guard = writer.lock();
                let w = guard.as_mut().ok_or(())?;
                w.write_all(&data).map_err(|_| ())?;
                w.flush().map_err(|_| ())
            })
            .await
            .map_err(|_| failed())?
            .map_err(|()| failed())
        }
    }
}

/// Registers a process group with the reaper for as long as it lives.
struct GroupGuard {
    reaper: Option<Arc<reaper::Reaper>>,
    pgid: i32,
}

impl GroupGuard {
    fn new(reaper: Option<Arc<reaper::Reaper>>, pgid: i32) -> Self {
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

struct PipePump {
    guard: GroupGuard,
    process: Arc<Process>,
    attachment: Arc<Attachment>,
    exit: spawn::ExitWait,
    stdout: tokio::net::unix::pipe::Receiver,
    stderr: tokio::net::unix::pipe::Receiver,
}

impl PipePump {
    async fn run(mut self, permit: ProcessPermits, table: Weak<ProcessTable>) {
        self.process.hold_for_subscriber().await;
        let (mut out_open, mut err_open, mut exited) = (true, true, false);
        let mut grown = false;
        let mut out_buf = BytesMut::new();
        let mut err_buf = BytesMut::new();
        while out_open || err_open || !exited {
            if out_buf.capacity() < OUTPUT_READ_CHUNK_BYTES {
                out_buf.reserve(OUTPUT_READ_CHUNK_BYTES);
            }
            if err_buf.capacity() < OUTPUT_READ_CHUNK_BYTES {
                err_buf.reserve(OUTPUT_READ_CHUNK_BYTES);
            }
            // Each arm is cancel-safe: read_buf and wait lose nothing if
            // another arm wins.
            tokio::select! {
                r = self.stdout.read_buf(&mut out_buf), if out_open => match r {
                    Ok(n) if n > 0 => {
                        // Bulk output: grow the pipe once so later reads are
                        // large (short-lived processes never pay for this).
                        if !grown && n >= spawn::GROW_PIPE_AFTER_READ_BYTES {
                            grown = true;
                            spawn::grow_pipe(&self.stdout);
                        }
                        let data = out_buf.split().freeze();
                        self.process.emit_output(&self.attachment, StreamName::Stdout, data).await;
                    }
                    _ => out_open = false,
                },
                r = self.stderr.read_buf(&mut err_buf), if err_open => match r {
                    Ok(n) if n > 0 => {
                        let data = err_buf.split().freeze();
                        self.process.emit_output(&self.attachment, StreamName::Stderr, data).await;
                    }
                    _ => err_open = false,
                },
                ended = self.exit.wait(), if !exited => {
                    exited = true;
                    // Killed by a signal (terminate included) reports -1, as the reference.
                    let code = match ended {
                        spawn::Ended::Code(c) => c,
                        spawn::Ended::Signal => -1,
                        spawn::Ended::WorkerDied => {
                            self.process.worker_gone();
                            -1
                        }
                    };
                    self.process.emit_exit(&self.attachment, code).await;
                }
            }
        }
        // Stdin lives as long as the process entry; drop it now so a writer
        // sees the pipe closed.
        if let Stdin::Pipe(pipe) = &self.process.stdin {
            pipe.lock().await.take();
        }
        self.process.emit_closed(&self.attachment).await;
        drop(self.guard);
        drop(permit);
        if let Some(table) = table.upgrade() {
            table.mark_closed(&self.process);
        }
    }
}

struct PtyPump {
    guard: GroupGuard,
    process: Arc<Process>,
    attachment: Arc<Attachment>,
    exit: spawn::PtyExit,
    reader: Box<dyn std::io::Read + Send>,
}

impl PtyPump {
    async fn run(self, permit: ProcessPermits, table: Weak<ProcessTable>) {
        let PtyPump {
            guard,
            process,
            attachment,
            exit,
            mut reader,
        } = self;
        process.hold_for_subscriber().await;
        // portable-pty's reader and wait are blocking: each gets a blocking
        // thread, the reader feeding a small bounded channel (back-pressure
        // reaches the child through the PTY buffer).
        let (tx, mut rx) = mpsc::channel::<Bytes>(PTY_CHANNEL_CHUNKS);
        tokio::task::spawn_blocking(move || {
            let mut buf = vec![0u8; OUTPUT_READ_CHUNK_BYTES];
            loop {
                match reader.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        if tx.blocking_send(Bytes::copy_from_slice(&buf[..n])).is_err() {
                            break;
                        }
                    }
                }
            }
        });
        let (exit_tx, mut exit_rx) = oneshot::channel::<i32>();
        match exit {
            spawn::PtyExit::Local(mut child) => {
                tokio::task::spawn_blocking(move || {
                    // portable-pty reports death by signal as 1 (the reference's value).
                    let code = child
                        .wait()
                        .map(|s| i32::try_from(s.exit_code()).unwrap_or(i32::MAX))
                        .unwrap_or(-1);
                    let _ = exit_tx.send(code);
                });
            }
            spawn::PtyExit::Worker(mut exit) => {
                let process = process.clone();
                crate::task::spawn("pty-exit", async move {
                    let code = match exit.wait().await {
                        spawn::Ended::Code(c) => c,
                        // As portable-pty: death by signal is 1.
                        spawn::Ended::Signal => 1,
                        spawn::Ended::WorkerDied => {
                            process.worker_gone();
                            -1
                        }
                    };
                    let _ = exit_tx.send(code);
                });
            }
        }
        let (mut open, mut exited) = (true, false);
        while open || !exited {
            tokio::select! {
                chunk = rx.recv(), if open => match chunk {
                    Some(data) => process.emit_output(&attachment, StreamName::Pty, data).await,
                    None => open = false,
                },
                code = &mut exit_rx, if !exited => {
                    exited = true;
                    process.emit_exit(&attachment, code.unwrap_or(-1)).await;
                }
            }
        }
        if let Stdin::Pty(writer) = &process.stdin {
            writer.lock().take();
        }
        process.emit_closed(&attachment).await;
        drop(guard);
        drop(permit);
        if let Some(table) = table.upgrade() {
            table.mark_closed(&process);
        }
    }
}
