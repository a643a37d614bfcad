//! The per-session process table: `processId → Process`, and retention of
//! closed processes.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use std::time::Duration;

use parking_lot::Mutex;
use tokio_util::sync::CancellationToken;

use super::output::OutputLog;
use super::pump::{Output, Pump};
use super::state::{GroupGuard, NewProcess, Process, ProcessPermits};
use super::stdin::Stdin;
use super::write_ids::{MAX_WRITE_ID_BYTES, write_once};
use crate::outbound::{Outbound, Reservation};

/// JSON around one chunk of a `process/read` reply (seq, stream, keys).
const CHUNK_JSON_BYTES: usize = 64;
use super::{Api, ExecSettings, env};
use crate::error::GatewayError;
use crate::isolation::signal;
use crate::outbound::Attachment;
use crate::protocol::ByteChunk;
use crate::protocol::process::{
    ExecParams, ListResponse, MAX_READ_WAIT, ProcessInfo, ProcessOutputChunk, ProcessState,
    ReadParams, ReadResponse, ResizeParams, SignalParams, TerminateResponse, WriteParams,
    WriteResponse, WriteStatus,
};
use crate::protocol::revision::RevisionCell;
use crate::rpc::EventSource;
use crate::spawn::{ChildIo, SpawnSpec, Spawner};

enum Entry {
    /// Reserved while its spawn runs (outside the lock).
    Starting,
    Running(Arc<Process>),
}

/// How a start is asked for.
pub struct StartOptions {
    pub api: Api,
    /// A smaller retained-output cap (v0 `outputBytesCap`).
    pub retained_cap: Option<usize>,
    /// Hold output until the first stream subscriber (gRPC `Exec`).
    pub hold_output: bool,
    /// Whose it is, for the audit trail's record of its exit.
    pub audit: Option<Arc<crate::audit::Tag>>,
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
    spawner: Box<dyn Spawner>,
    /// The session's protocol revision.
    revision: Arc<RevisionCell>,
    /// Cancelled when the session ends ([`ProcessTable::kill_all`]): its
    /// processes' output is read no further, even where a process of
    /// another session still holds their pipes open.
    abandoned: CancellationToken,
    /// Why (a `KilledBy` as u8), for what finishes starting after it.
    abandoned_by: std::sync::atomic::AtomicU8,
}

fn invalid(msg: String) -> GatewayError {
    GatewayError::InvalidRequest(msg)
}

impl ProcessTable {
    pub fn new(
        attachment: Arc<Attachment>,
        settings: Arc<ExecSettings>,
        spawner: Box<dyn Spawner>,
        revision: Arc<RevisionCell>,
    ) -> Arc<Self> {
        Arc::new(Self {
            entries: Mutex::new(HashMap::new()),
            closed: Mutex::new(VecDeque::new()),
            attachment,
            settings,
            spawner,
            revision,
            abandoned: CancellationToken::new(),
            abandoned_by: std::sync::atomic::AtomicU8::new(0),
        })
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

    pub(super) fn mark_closed(&self, process: &Arc<Process>) {
        let at = tokio::time::Instant::now() + self.settings.retention(self.revision.policy());
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

    /// `process/start` (and v0 `command/exec`, gRPC `Exec`).
    pub async fn start(
        self: &Arc<Self>,
        params: ExecParams,
        options: StartOptions,
    ) -> Result<Arc<Process>, GatewayError> {
        if params.argv.is_empty() {
            return Err(GatewayError::InvalidParams(
                "argv must not be empty".to_owned(),
            ));
        }
        crate::rpc::check_id_length("processId", &params.process_id)?;
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
        // Carried to its end even when the caller goes (a request's
        // deadline, its connection closing) while the worker forks: a child
        // is never left running outside the table, nor an id `Starting`.
        let table = self.clone();
        let start = async move {
            let result = table.spawn_entry(params, options).await;
            let mut entries = table.entries.lock();
            match result {
                Ok(process) => {
                    entries.insert(id, Entry::Running(process.clone()));
                    drop(entries);
                    // Its session ended while it started (`kill_all` passes
                    // over what is starting): it goes the way the others went.
                    if table.abandoned.is_cancelled() {
                        process.kill(crate::audit::KilledBy::from_u8(
                            table
                                .abandoned_by
                                .load(std::sync::atomic::Ordering::Acquire),
                        ));
                    }
                    Ok(process)
                }
                Err(e) => {
                    entries.remove(&id);
                    Err(e)
                }
            }
        };
        crate::task::start("process-start", start)
            .await
            .map_err(|e| {
                tracing::error!(error = %e, "process start task failed");
                GatewayError::Internal("the process could not be started".to_owned())
            })?
    }

    /// Take the slots a running process holds, or refuse with the quota.
    fn permits(&self) -> Result<ProcessPermits, GatewayError> {
        let settings = &self.settings;
        let retained = usize::try_from(settings.metrics.retained_output_bytes.get()).unwrap_or(0);
        if retained >= settings.max_retained_bytes {
            // Retained output drains as closed processes are evicted.
            return Err(GatewayError::QuotaExceeded {
                quota: "retained_output_bytes",
                limit: settings.max_retained_bytes as u64,
                retry_after_ms: u64::try_from(
                    settings.retention(self.revision.policy()).as_millis(),
                )
                .ok(),
            });
        }
        let tenant = settings
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
            Some(slots) => Some(
                slots
                    .clone()
                    .try_acquire_owned()
                    .map_err(|_| GatewayError::Overloaded)?,
            ),
        };
        Ok(ProcessPermits::new(
            tenant,
            global,
            settings.metrics.processes.clone(),
        ))
    }

    async fn spawn_entry(
        self: &Arc<Self>,
        params: ExecParams,
        options: StartOptions,
    ) -> Result<Arc<Process>, GatewayError> {
        let settings = &self.settings;
        let permits = self.permits()?;
        let cgroup = match &settings.cgroup {
            None => None,
            Some(t) => Some(
                t.process()
                    .map_err(|e| GatewayError::Internal(format!("cgroup: {e}")))?,
            ),
        };
        // The names the client set (never their values), for the audit trail.
        let mut params_env_names: Vec<String> = if options.audit.is_some() {
            params.env.keys().cloned().collect()
        } else {
            Vec::new()
        };
        params_env_names.sort_unstable();
        let spec = SpawnSpec {
            env: {
                let mut env =
                    env::child_env(&params.env, params.env_policy.as_ref(), &settings.base_env);
                for (k, v) in &settings.added_env {
                    env.entry(k.clone()).or_insert_with(|| v.clone());
                }
                env
            },
            argv: params.argv,
            // The directory the cwd check resolved (lexically normalised),
            // not the raw string: the kernel follows a symlink before `..`,
            // so `<root>/lnk/..` with `lnk -> /etc` would start in `/`.
            cwd: crate::fs::normalize(std::path::Path::new(params.cwd.as_str()))
                .to_string_lossy()
                .into_owned(),
            arg0: params.arg0,
            tty: params.tty,
            pipe_stdin: params.pipe_stdin && !params.tty,
            fallback_path: settings.base_env.get("PATH").cloned(),
            // A worker already sits in the tenant's cgroups: its children
            // join only their own.
            cgroups: match &cgroup {
                None => Vec::new(),
                Some(cg) if settings.spawned_in_worker => vec![cg.own_procs_path()],
                Some(cg) => cg.procs_paths(),
            },
            cgroup_dir: cgroup
                .as_ref()
                .filter(|_| settings.spawned_in_worker)
                .and_then(|cg| cg.v2_dir()),
        };
        let new = NewProcess {
            id: params.process_id,
            api: options.api,
            tty: params.tty,
            hold_output: options.hold_output,
            log: OutputLog::new(
                options
                    .retained_cap
                    .unwrap_or(usize::MAX)
                    .min(settings.retained_output_bytes),
                settings.metrics.retained_output_bytes.clone(),
            ),
            output_bytes: settings.metrics.output_bytes.clone(),
            subscriber_timeout: settings.subscriber_timeout,
            cgroup,
            revision: self.revision.clone(),
            audit: options.audit,
        };
        // Recorded before the process's pump starts, so before its exit.
        let audit_start = crate::audit::wanting(new.audit.as_ref(), "process.started").map(|tag| {
            (
                tag.clone(),
                crate::audit::process_started(
                    &new.id,
                    &spec.argv,
                    &spec.cwd,
                    params_env_names.iter().map(String::as_str),
                    spec.tty,
                    spec.pipe_stdin,
                ),
            )
        });
        let started = std::time::Instant::now();
        let child = self.spawner.spawn(spec).await.map_err(|e| {
            // A worker backing off its restart, or retired at shutdown.
            crate::worker::unavailable(&e).unwrap_or_else(|| GatewayError::Internal(e.to_string()))
        })?;
        settings
            .metrics
            .spawn_seconds
            .observe(started.elapsed().as_secs_f64());
        settings.metrics.started.inc();
        settings.metrics.own_started.inc();
        if let Some((tag, fields)) = audit_start {
            crate::audit::emit("process.started", &tag.who(), fields);
        }
        let group = signal::Group::new(child.pidfd);
        let (process, output) = match child.io {
            ChildIo::Pipes {
                stdin,
                stdout,
                stderr,
            } => {
                let stdin = match stdin {
                    Some(s) => Stdin::pipe(s),
                    None => Stdin::None,
                };
                (
                    new.spawned(child.pid, group, stdin, None),
                    Output::Pipes { stdout, stderr },
                )
            }
            ChildIo::Pty(pty) => {
                let stdin = Stdin::Pty {
                    pty: parking_lot::Mutex::new(Some(pty.clone())),
                    closed: Default::default(),
                };
                (
                    new.spawned(child.pid, group, stdin, Some(pty.clone())),
                    Output::Pty(pty),
                )
            }
        };
        let pump = Pump {
            abandoned: self.abandoned.clone(),
            guard: GroupGuard::new(settings.reaper.clone(), child.pid),
            process: process.clone(),
            attachment: self.attachment.clone(),
            exit: child.exit,
            output,
            permits,
            on_closed: {
                let table = Arc::downgrade(self);
                Box::new(move |process| {
                    if let Some(table) = table.upgrade() {
                        table.mark_closed(process);
                    }
                })
            },
        };
        crate::task::start("process-pump", pump.run());
        Ok(process)
    }

    /// `process/read`: select, and long-poll until ready, the deadline, or
    /// eviction of the calling connection.
    pub async fn read(
        &self,
        params: ReadParams,
        evicted: &CancellationToken,
        reply: Option<&Outbound>,
    ) -> Result<(ReadResponse, Option<Reservation>), GatewayError> {
        let process = self.get(&params.process_id)?;
        let after_seq = params.after_seq.unwrap_or(0);
        let wait = Duration::from_millis(params.wait_ms.unwrap_or(0)).min(MAX_READ_WAIT);
        let deadline = tokio::time::Instant::now() + wait;
        let policy = self.revision.policy();
        loop {
            let notified = process.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let (sel, last) = {
                let log = process.log.lock();
                let sel = log.select(after_seq, params.max_bytes, policy.read_moves_past_close);
                (sel, log.last_output_seq())
            };
            // The close, with every output chunk before it.
            let through = sel.chunks.last().map_or(after_seq, |c| c.seq) >= last;
            process.mark_read(sel.closed && through);
            if sel.is_ready(after_seq) || tokio::time::Instant::now() >= deadline {
                // The reply's bytes are reserved before its chunks are
                // copied and encoded (the selection only shares them).
                let held = match reply {
                    Some(out) => {
                        let size = sel
                            .chunks
                            .iter()
                            .map(|c| c.data.len().div_ceil(3) * 4 + CHUNK_JSON_BYTES)
                            .sum::<usize>()
                            + 512;
                        Some(out.reserve(size).await.map_err(|_| {
                            GatewayError::Internal("the connection closed".to_owned())
                        })?)
                    }
                    None => None,
                };
                let response = ReadResponse {
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
                    sandbox_denied: policy.reports_sandbox_denied.then_some(false),
                };
                return Ok((response, held));
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

    /// A live view of a process's events (gRPC `Attach`).
    pub fn events(&self, id: &str) -> Result<Arc<dyn EventSource>, GatewayError> {
        let p: Arc<dyn EventSource> = self.get(id)?;
        Ok(p)
    }

    /// `process/write`; unknown ids are a status, not an error.
    pub async fn write(&self, params: WriteParams) -> Result<WriteResponse, GatewayError> {
        let status = |status| Ok(WriteResponse { status });
        if let Some(id) = &params.write_id
            && id.len() > MAX_WRITE_ID_BYTES
        {
            return Err(GatewayError::InvalidParams(format!(
                "writeId is {} bytes; at most {MAX_WRITE_ID_BYTES} are accepted",
                id.len()
            )));
        }
        self.sweep();
        let process = match self.entries.lock().get(&params.process_id) {
            Some(Entry::Running(p)) => p.clone(),
            Some(Entry::Starting) => return status(WriteStatus::Starting),
            None => return status(WriteStatus::UnknownProcess),
        };
        if process.stdin.is_none() {
            return status(WriteStatus::StdinClosed);
        }
        let data = params.chunk.0;
        match &params.write_id {
            // Once per id, even across a dropped call (write_ids.rs).
            Some(id) => {
                let p = process.clone();
                write_once(&process.write_ids, id, move || async move {
                    p.stdin.write(&data).await
                })
                .await?;
            }
            None => process.stdin.write(&data).await?,
        }
        status(WriteStatus::Accepted)
    }

    /// `process/terminate`: SIGKILL to the process group and its cgroup.
    pub fn terminate(&self, id: &str) -> TerminateResponse {
        self.sweep();
        let process = match self.entries.lock().get(id) {
            Some(Entry::Running(p)) => p.clone(),
            _ => return TerminateResponse { running: false },
        };
        if process.log.lock().exited() {
            return TerminateResponse { running: false };
        }
        process.stdin.refuse();
        process.audit_event(
            "process.terminated",
            serde_json::json!({"signal": libc::SIGKILL}),
        );
        process.kill(crate::audit::KilledBy::Client);
        TerminateResponse { running: true }
    }

    /// `process/signal`: to the process group. 0.169.0 answers `{}` for
    /// an unknown or closed process too; the 0.130.0 extension says why.
    pub fn signal(&self, params: &SignalParams) -> Result<(), GatewayError> {
        let lenient = self.revision.policy().lenient_signal;
        let process = match self.get(&params.process_id) {
            Ok(p) => p,
            Err(_) if lenient => return Ok(()),
            Err(e) => return Err(e),
        };
        if process.log.lock().closed() {
            if lenient {
                return Ok(());
            }
            return Err(invalid(format!(
                "process {} has already closed",
                params.process_id
            )));
        }
        process.audit_event(
            "process.signalled",
            serde_json::json!({ "signal": params.signal }),
        );
        // A signal that ends a process by default names the client as
        // its killer (one it traps or ignores leaves that open).
        if matches!(
            params.signal,
            crate::protocol::process::SignalName::Interrupt
                | crate::protocol::process::SignalName::Terminate
                | crate::protocol::process::SignalName::Kill
                | crate::protocol::process::SignalName::Hangup
                | crate::protocol::process::SignalName::Quit
        ) {
            process.killed_by(crate::audit::KilledBy::Client);
        }
        process
            .group
            .signal(signal::to_signal(params.signal))
            .map_err(|e| GatewayError::Internal(e.to_string()))
    }

    /// `process/resize` (extension), PTY processes only.
    pub fn resize(&self, params: &ResizeParams) -> Result<(), GatewayError> {
        let process = self.get(&params.process_id)?;
        if !process.tty {
            return Err(invalid(format!(
                "process {} is not a pty",
                params.process_id
            )));
        }
        if params.rows == 0 || params.cols == 0 {
            return Err(GatewayError::InvalidParams(
                "rows and cols must be positive".to_owned(),
            ));
        }
        // A closed process gave its terminal back: nothing left to resize.
        let Some(pty) = process.pty.lock().clone() else {
            return Ok(());
        };
        pty.resize(params.rows, params.cols)
            .map_err(|e| GatewayError::Internal(e.to_string()))
    }

    /// `process/closeStdin` (extension): EOF on a pipe; ^D on a PTY.
    pub async fn close_stdin(&self, id: &str) -> Result<(), GatewayError> {
        self.get(id)?.stdin.close().await
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

    /// v0 `command/exec/write`: errors instead of statuses.
    pub async fn write_v0(&self, id: &str, data: &[u8]) -> Result<(), GatewayError> {
        let process = self.get(id)?;
        if process.stdin.is_none() {
            return Err(invalid(format!("stdin of process {id} is closed")));
        }
        process.stdin.write(data).await
    }

    /// SIGKILL every live process group (session end, shutdown: `why`).
    pub fn kill_all(&self, why: crate::audit::KilledBy) {
        self.abandoned_by
            .store(why as u8, std::sync::atomic::Ordering::Release);
        self.abandoned.cancel();
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
                p.killed_by(why);
                p.group.kill();
            }
            // Escapers outlive their group: the cgroup reaches them.
            p.kill_cgroup();
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

    /// Processes closed whose close no client has had yet.
    pub fn undelivered_count(&self) -> usize {
        self.entries
            .lock()
            .values()
            .filter(|e| matches!(e, Entry::Running(p) if p.close_undelivered()))
            .count()
    }

    /// Of those, the ones only a `process/read` can deliver (see
    /// `Process::close_awaits_read`).
    pub fn awaiting_read_count(&self) -> usize {
        self.entries
            .lock()
            .values()
            .filter(|e| matches!(e, Entry::Running(p) if p.close_awaits_read()))
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

#[cfg(test)]
mod tests;
