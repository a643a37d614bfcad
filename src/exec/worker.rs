//! Per-tenant worker processes (DESIGN.md §1, ISOLATION.md §7.1).
//!
//! A worker is this binary re-executed as `exec-gateway worker`, started
//! once per pool slot with the tenant's confinement applied to *itself*:
//! it joins the tenant's cgroups (pids, cpu, memory) and takes the tenant's
//! uid, `no_new_privs`, Landlock domain and seccomp filter before exec. Every
//! process it spawns inherits all of that, so a spawn only joins its own
//! per-process cgroup; and a small single-threaded-at-fork worker forks far
//! cheaper than the gateway.
//!
//! The link is a `SOCK_SEQPACKET` socketpair: one JSON message per packet,
//! with the child's pipe (or PTY master) fds passed back by `SCM_RIGHTS`, so
//! output never crosses the worker: the gateway reads the pipes directly.
//! The worker reaps its children and reports each exit. When a worker dies,
//! the processes it spawned are reported ended with a clear failure and
//! killed through their cgroups; its pool starts a replacement on demand.
//!
//! This is a privilege-separated spawner rather than the exec-server
//! protocol on the socket: sessions, output logs and notifications stay in
//! the gateway, where they already are bounded and tested, and the bytes of
//! output are not copied through a second process.

#![allow(unsafe_code)]

use std::collections::HashMap;
use std::ffi::CString;
use std::io::{self, IoSlice, IoSliceMut};
use std::os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd, RawFd};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use nix::sys::socket::{
    AddressFamily, ControlMessage, ControlMessageOwned, MsgFlags, SockFlag, SockType, recvmsg,
    sendmsg, socketpair,
};
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use tokio::sync::oneshot;

use crate::error::GatewayError;
use crate::protocol::fs::{CopyParams, CreateDirectoryParams, PathParams, RemoveParams};
use crate::rpc::{Call, Reply};

/// Largest message on the link (argv + env of one spawn).
pub const MAX_MESSAGE_BYTES: usize = 1024 * 1024;
/// How long a spawn may take in the worker before the gateway gives up on
/// it (and kills it).
const SPAWN_TIMEOUT: Duration = Duration::from_secs(5);
/// The fd the worker finds its end of the link on.
const WORKER_FD: RawFd = 3;
/// Threads a worker runs blocking file operations on.
const FS_THREADS: usize = 16;
/// Default sessions per worker before the pool starts another.
pub const SESSIONS_PER_WORKER: usize = 32;

/// A spawn request.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SpawnRequest {
    pub argv: Vec<String>,
    pub cwd: String,
    pub env: HashMap<String, String>,
    pub arg0: Option<String>,
    pub pipe_stdin: bool,
    pub tty: bool,
    pub fallback_path: Option<String>,
    /// `cgroup.procs` of the process's own cgroup, joined before exec.
    pub cgroup: Option<PathBuf>,
}

#[derive(Debug, Serialize, Deserialize)]
enum ToWorker {
    Spawn { id: u64, req: SpawnRequest },
    Fs { id: u64, op: FsOp },
}

/// A file operation, run in the worker under the tenant's confinement.
/// Reads and writes of file contents only open the file there: the fd
/// comes back and the bytes move in the gateway.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum FsOp {
    OpenRead(PathParams),
    OpenWrite(PathParams),
    CreateDirectory(CreateDirectoryParams),
    GetMetadata(PathParams),
    ReadDirectory(PathParams),
    Remove(RemoveParams),
    Copy(CopyParams),
}

/// A `GatewayError` across the link (the kinds fs handlers produce).
#[derive(Debug, Serialize, Deserialize)]
struct WireError {
    kind: String,
    message: String,
}

impl From<&GatewayError> for WireError {
    fn from(e: &GatewayError) -> WireError {
        let kind = match e {
            GatewayError::InvalidRequest(_) => "invalid_request",
            GatewayError::InvalidParams(_) => "invalid_params",
            GatewayError::NotFound(_) => "not_found",
            _ => "internal",
        };
        WireError {
            kind: kind.to_owned(),
            message: e.to_string(),
        }
    }
}

impl From<WireError> for GatewayError {
    fn from(e: WireError) -> GatewayError {
        match e.kind.as_str() {
            "invalid_request" => GatewayError::InvalidRequest(e.message),
            "invalid_params" => GatewayError::InvalidParams(e.message),
            "not_found" => GatewayError::NotFound(e.message),
            _ => GatewayError::Internal(e.message),
        }
    }
}

#[derive(Debug, Serialize, Deserialize)]
enum FromWorker {
    /// fds: stdout, stderr[, stdin] for pipes; the master for a PTY.
    Spawned { id: u64, pid: i32 },
    Failed {
        id: u64,
        errno: Option<i32>,
        message: String,
    },
    Exited {
        pid: i32,
        code: Option<i32>,
        signal: Option<i32>,
    },
    /// fds: the opened file for `OpenRead`/`OpenWrite`.
    FsDone {
        id: u64,
        result: Result<serde_json::Value, WireError>,
    },
}

type FsResult = (Result<serde_json::Value, WireError>, Vec<OwnedFd>);

/// How a worker-spawned process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WorkerExit {
    Code(i32),
    Signal(i32),
    /// The worker died first: the process was killed with it.
    WorkerDied,
}

/// A spawned process as the gateway sees it.
pub struct Spawned {
    pub pid: i32,
    pub fds: Vec<OwnedFd>,
    pub exit: oneshot::Receiver<WorkerExit>,
}

fn send_packet(fd: RawFd, data: &[u8], fds: &[RawFd]) -> io::Result<()> {
    let iov = [IoSlice::new(data)];
    let cmsg = [ControlMessage::ScmRights(fds)];
    let cmsgs: &[ControlMessage<'_>] = if fds.is_empty() { &[] } else { &cmsg };
    sendmsg::<()>(fd, &iov, cmsgs, MsgFlags::MSG_NOSIGNAL, None)
        .map(|_| ())
        .map_err(io::Error::from)
}

/// One packet; `Ok(None)` at EOF.
fn recv_packet(fd: RawFd, buf: &mut [u8]) -> io::Result<Option<(usize, Vec<OwnedFd>)>> {
    let mut space = nix::cmsg_space!([RawFd; 4]);
    let (bytes, fds) = {
        let mut iov = [IoSliceMut::new(buf)];
        let msg = loop {
            match recvmsg::<()>(fd, &mut iov, Some(&mut space), MsgFlags::MSG_CMSG_CLOEXEC) {
                Err(nix::errno::Errno::EINTR) => continue,
                r => break r.map_err(io::Error::from)?,
            }
        };
        let mut fds = Vec::new();
        for c in msg.cmsgs().map_err(io::Error::from)? {
            if let ControlMessageOwned::ScmRights(raw) = c {
                // SAFETY: the kernel just installed these fds in this process.
                fds.extend(raw.into_iter().map(|f| unsafe { OwnedFd::from_raw_fd(f) }));
            }
        }
        (msg.bytes, fds)
    };
    if bytes == 0 {
        return Ok(None);
    }
    Ok(Some((bytes, fds)))
}

// === Gateway side ===

/// One live worker and its link.
pub struct WorkerConn {
    pid: i32,
    sock: OwnedFd,
    send_lock: Mutex<()>,
    next_id: AtomicU64,
    pending: Mutex<HashMap<u64, std::sync::mpsc::SyncSender<Result<Spawned, io::Error>>>>,
    exits: Mutex<HashMap<i32, oneshot::Sender<WorkerExit>>>,
    fs_pending: Mutex<HashMap<u64, oneshot::Sender<FsResult>>>,
    dead: AtomicBool,
    /// Killed on purpose (probe, shutdown): its end is not news.
    retiring: AtomicBool,
    metrics: Option<crate::metrics::TenantMetrics>,
    sessions: AtomicUsize,
}

impl std::fmt::Debug for WorkerConn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "WorkerConn(pid {})", self.pid)
    }
}

impl WorkerConn {
    pub fn pid(&self) -> i32 {
        self.pid
    }

    pub fn is_dead(&self) -> bool {
        self.dead.load(Ordering::Acquire)
    }

    /// Spawn through the worker (a blocking round trip, like a local spawn).
    pub fn spawn(&self, req: SpawnRequest) -> io::Result<Spawned> {
        if self.is_dead() {
            return Err(io::Error::other("the tenant's worker process died"));
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        self.pending.lock().insert(id, tx);
        let msg = serde_json::to_vec(&ToWorker::Spawn { id, req }).map_err(io::Error::other)?;
        if msg.len() > MAX_MESSAGE_BYTES {
            self.pending.lock().remove(&id);
            return Err(io::Error::from_raw_os_error(libc::E2BIG));
        }
        {
            let _g = self.send_lock.lock();
            if let Err(e) = send_packet(self.sock.as_raw_fd(), &msg, &[]) {
                self.pending.lock().remove(&id);
                return Err(e);
            }
        }
        // The worker runs as the tenant and can be stopped by the tenant's
        // own processes: never let that hold a runtime thread hostage
        // (other tenants' calls run on the same threads).
        let wait = || rx.recv_timeout(SPAWN_TIMEOUT);
        let answer = match tokio::runtime::Handle::try_current() {
            Ok(h) if h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
                tokio::task::block_in_place(wait)
            }
            _ => wait(),
        };
        match answer {
            Ok(r) => r,
            Err(_) => {
                self.pending.lock().remove(&id);
                // A worker that does not answer is stuck or stopped: retire
                // it; its processes are reported failed and a new one serves
                // the next call.
                tracing::warn!(
                    worker = self.pid,
                    "worker did not answer a spawn; killing it"
                );
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(self.pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
                Err(io::Error::other("the tenant's worker did not answer"))
            }
        }
    }

    /// Run a file operation in the worker.
    async fn fs(&self, op: FsOp) -> Result<(serde_json::Value, Vec<OwnedFd>), GatewayError> {
        let died = || GatewayError::Internal("the tenant's worker process died".to_owned());
        if self.is_dead() {
            return Err(died());
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        self.fs_pending.lock().insert(id, tx);
        let msg = serde_json::to_vec(&ToWorker::Fs { id, op })
            .map_err(|e| GatewayError::Internal(e.to_string()))?;
        let sent = {
            let _g = self.send_lock.lock();
            send_packet(self.sock.as_raw_fd(), &msg, &[])
        };
        if let Err(e) = sent {
            self.fs_pending.lock().remove(&id);
            return Err(GatewayError::Internal(format!("worker: {e}")));
        }
        // The request deadline of the stack bounds this wait.
        let (result, fds) = rx.await.map_err(|_| died())?;
        Ok((result.map_err(GatewayError::from)?, fds))
    }

    /// Read the worker's messages until EOF; then fail everything pending.
    fn read_loop(self: Arc<Self>) {
        let mut buf = vec![0u8; MAX_MESSAGE_BYTES];
        loop {
            let (n, fds) = match recv_packet(self.sock.as_raw_fd(), &mut buf) {
                Ok(Some(p)) => p,
                Ok(None) | Err(_) => break,
            };
            let Ok(msg) = serde_json::from_slice::<FromWorker>(&buf[..n]) else {
                tracing::warn!(worker = self.pid, "malformed message from worker");
                continue;
            };
            match msg {
                FromWorker::Spawned { id, pid } => {
                    // The worker runs as its tenant: never take its word
                    // for a pid. One that is alive must be its child, or
                    // the gateway (root) would signal someone else's
                    // process group. A pid that fails the check is refused
                    // (the spawn fails; whatever runs is killed with its
                    // process cgroup).
                    if let Err(ppid) = check_child(pid, self.pid) {
                        tracing::warn!(
                            worker = self.pid,
                            pid,
                            ppid,
                            "worker named a process that is not its child; refused"
                        );
                        if let Some(w) = self.pending.lock().remove(&id) {
                            let _ = w.send(Err(io::Error::other(
                                "the spawned process could not be verified as the worker's child",
                            )));
                        }
                        continue;
                    }
                    // Only an answer to a request registers anything (the
                    // map stays bounded by the requests made), and before
                    // the reply is handed on: the exit can only be read
                    // after this packet.
                    let Some(w) = self.pending.lock().remove(&id) else {
                        continue;
                    };
                    let (tx, rx) = oneshot::channel();
                    self.exits.lock().insert(pid, tx);
                    let _ = w.send(Ok(Spawned { pid, fds, exit: rx }));
                }
                FromWorker::Failed { id, errno, message } => {
                    if let Some(w) = self.pending.lock().remove(&id) {
                        let e = match errno {
                            Some(n) => io::Error::from_raw_os_error(n),
                            None => io::Error::other(message),
                        };
                        let _ = w.send(Err(e));
                    }
                }
                FromWorker::FsDone { id, result } => {
                    if let Some(tx) = self.fs_pending.lock().remove(&id) {
                        let _ = tx.send((result, fds));
                    }
                }
                FromWorker::Exited { pid, code, signal } => {
                    if let Some(tx) = self.exits.lock().remove(&pid) {
                        let exit = match (code, signal) {
                            (Some(c), _) => WorkerExit::Code(c),
                            (None, Some(s)) => WorkerExit::Signal(s),
                            (None, None) => WorkerExit::Signal(libc::SIGKILL),
                        };
                        let _ = tx.send(exit);
                    }
                }
            }
        }
        self.dead.store(true, Ordering::Release);
        if let Some(m) = &self.metrics {
            m.workers.dec();
            if !self.retiring.load(Ordering::Acquire) {
                m.worker_deaths.inc();
            }
        }
        if !self.retiring.load(Ordering::Acquire) {
            tracing::warn!(
                worker = self.pid,
                "worker process ended; its processes are reported failed"
            );
        }
        self.pending.lock().clear();
        self.fs_pending.lock().clear();
        for (_, tx) in self.exits.lock().drain() {
            let _ = tx.send(WorkerExit::WorkerDied);
        }
        // Reap it (the gateway is its parent).
        let _ = nix::sys::wait::waitpid(nix::unistd::Pid::from_raw(self.pid), None);
    }
}

/// `Ok` if `pid` is a child of `parent`, or already gone (reaped: the
/// worker reports its exit next); else `Err(its parent)`.
fn check_child(pid: i32, parent: i32) -> Result<(), i32> {
    if pid <= 1 {
        return Err(0);
    }
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // Field 4, after the parenthesised command (which may hold spaces).
        Ok(stat) => {
            let ppid = stat
                .rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().nth(1))
                .and_then(|ppid| ppid.parse::<i32>().ok())
                .unwrap_or(0);
            // 0: the process has exited and is being released (the
            // kernel no longer names a parent): gone, as below.
            if ppid == parent || ppid == 0 {
                Ok(())
            } else {
                Err(ppid)
            }
        }
        Err(_) => Ok(()),
    }
}

/// How to start a tenant's workers.
pub struct WorkerLaunch {
    pub tenant: String,
    /// The tenant root (none: the host).
    pub root: Option<PathBuf>,
    pub exe: PathBuf,
    /// Applied in the worker between fork and exec, after the cgroup join.
    pub sandbox: Option<Arc<super::sandbox::Sandbox>>,
    /// The tenant's `cgroup.procs` files the worker joins.
    pub cgroups: Vec<CString>,
    pub min: usize,
    pub max: usize,
    /// The tenant's metrics (none for the probe).
    pub metrics: Option<crate::metrics::TenantMetrics>,
}

/// A tenant's pool of workers.
pub struct WorkerPool {
    launch: WorkerLaunch,
    workers: Mutex<Vec<Arc<WorkerConn>>>,
}

impl std::fmt::Debug for WorkerPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "WorkerPool({})", self.launch.tenant)
    }
}

impl WorkerPool {
    /// Start the pool's minimum of workers (the layer's probe: an error
    /// here means workers cannot run on this host).
    pub fn start(launch: WorkerLaunch) -> io::Result<Arc<WorkerPool>> {
        let pool = Arc::new(WorkerPool {
            launch,
            workers: Mutex::new(Vec::new()),
        });
        for _ in 0..pool.launch.min.max(1) {
            let w = pool.launch_one()?;
            pool.workers.lock().push(w);
        }
        Ok(pool)
    }

    /// The worker for a new session: the least loaded live one, or a new
    /// one when all carry `SESSIONS_PER_WORKER` and the pool may grow, or
    /// a replacement when the pool has none alive.
    pub fn pick(&self) -> io::Result<Arc<WorkerConn>> {
        let mut ws = self.workers.lock();
        ws.retain(|w| !w.is_dead());
        let least = ws
            .iter()
            .min_by_key(|w| w.sessions.load(Ordering::Relaxed))
            .cloned();
        let chosen = match least {
            Some(w)
                if w.sessions.load(Ordering::Relaxed) < SESSIONS_PER_WORKER
                    || ws.len() >= self.launch.max =>
            {
                w
            }
            _ => {
                let w = self.launch_one()?;
                ws.push(w.clone());
                w
            }
        };
        chosen.sessions.fetch_add(1, Ordering::Relaxed);
        Ok(chosen)
    }

    /// A worker for a file operation (the least loaded live one).
    fn any(&self) -> io::Result<Arc<WorkerConn>> {
        let w = self.pick()?;
        self.release(&w);
        Ok(w)
    }

    /// A session leaves its worker.
    pub fn release(&self, w: &WorkerConn) {
        w.sessions.fetch_sub(1, Ordering::Relaxed);
    }

    fn launch_one(&self) -> io::Result<Arc<WorkerConn>> {
        use std::os::unix::process::CommandExt as _;
        let (ours, theirs) = socketpair(
            AddressFamily::Unix,
            SockType::SeqPacket,
            None,
            SockFlag::SOCK_CLOEXEC,
        )
        .map_err(io::Error::from)?;
        let mut cmd = std::process::Command::new(&self.launch.exe);
        cmd.arg("worker").arg("--tenant").arg(&self.launch.tenant);
        if let Some(root) = &self.launch.root {
            cmd.arg("--root").arg(root);
        }
        cmd.env_clear()
            .current_dir("/")
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .process_group(0);
        let theirs_fd = theirs.as_raw_fd();
        let cgroups = self.launch.cgroups.clone();
        // Order matters: join the cgroups as root, then confine (the
        // sandbox drops root and uses its ruleset fd, which may be fd 3),
        // then put the link on fd 3.
        // SAFETY: `join_self` only (open/write/close on paths prepared before fork).
        unsafe {
            cmd.pre_exec(move || cgroups.iter().try_for_each(|p| super::cgroup::join_self(p)));
        }
        if let Some(sb) = &self.launch.sandbox {
            let hook = sb.hook();
            // SAFETY: raw syscalls only (see `Sandbox::hook`).
            unsafe {
                cmd.pre_exec(hook);
            }
        }
        // SAFETY: dup2/fcntl on fds that exist in the child.
        unsafe {
            cmd.pre_exec(move || {
                if theirs_fd == WORKER_FD {
                    // dup2 onto itself keeps FD_CLOEXEC: clear it instead.
                    if libc::fcntl(WORKER_FD, libc::F_SETFD, 0) < 0 {
                        return Err(io::Error::last_os_error());
                    }
                } else if libc::dup2(theirs_fd, WORKER_FD) < 0 {
                    return Err(io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = cmd.spawn()?;
        drop(theirs);
        let pid = i32::try_from(child.id()).map_err(io::Error::other)?;
        // The read loop reaps it; the std handle is not needed.
        drop(child);
        let conn = Arc::new(WorkerConn {
            pid,
            sock: ours,
            send_lock: Mutex::new(()),
            next_id: AtomicU64::new(1),
            pending: Mutex::new(HashMap::new()),
            exits: Mutex::new(HashMap::new()),
            fs_pending: Mutex::new(HashMap::new()),
            dead: AtomicBool::new(false),
            retiring: AtomicBool::new(false),
            metrics: self.launch.metrics.clone(),
            sessions: AtomicUsize::new(0),
        });
        let reader = conn.clone();
        std::thread::Builder::new()
            .name(format!("worker-{}", self.launch.tenant))
            .spawn(move || reader.read_loop())?;
        if let Some(m) = &conn.metrics {
            m.workers.inc();
        }
        tracing::info!(tenant = %self.launch.tenant, pid, "worker started");
        Ok(conn)
    }

    /// Kill every worker (shutdown).
    pub fn kill_all(&self) {
        for w in self.workers.lock().iter() {
            w.retiring.store(true, Ordering::Release);
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(w.pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
}

/// Run a file call in one of the tenant's workers; `None` for other calls.
pub async fn fs_call(pool: &WorkerPool, call: &Call) -> Result<Option<Reply>, GatewayError> {
    let mut data = None;
    let op = match call {
        Call::FsReadFile(p) | Call::FsOpenRead(p) => FsOp::OpenRead(p.clone()),
        Call::FsOpenWrite(p) => FsOp::OpenWrite(p.clone()),
        Call::FsWriteFile(p) => {
            data = Some(crate::fs::write_data(p)?);
            FsOp::OpenWrite(PathParams {
                path: p.path.clone(),
            })
        }
        Call::FsCreateDirectory(p) => FsOp::CreateDirectory(p.clone()),
        Call::FsGetMetadata(p) => FsOp::GetMetadata(p.clone()),
        Call::FsReadDirectory(p) => FsOp::ReadDirectory(p.clone()),
        Call::FsRemove(p) => FsOp::Remove(p.clone()),
        Call::FsCopy(p) => FsOp::Copy(p.clone()),
        _ => return Ok(None),
    };
    let worker = pool
        .any()
        .map_err(|e| GatewayError::Internal(format!("worker: {e}")))?;
    let (value, fds) = worker.fs(op).await?;
    let file = || {
        fds.into_iter()
            .next()
            .map(std::fs::File::from)
            .ok_or_else(|| GatewayError::Internal("worker: no file".to_owned()))
    };
    let empty = || Reply::Empty(crate::protocol::Empty {});
    Ok(Some(match call {
        Call::FsReadFile(_) => {
            let f = file()?;
            Reply::FsReadFile(crate::fs::run_blocking(move || crate::fs::read_whole(f)).await?)
        }
        Call::FsWriteFile(_) => {
            let (f, data) = (file()?, data.unwrap_or_default());
            crate::fs::run_blocking(move || crate::fs::write_whole(&f, &data)).await?;
            empty()
        }
        Call::FsOpenRead(_) | Call::FsOpenWrite(_) => {
            Reply::File(crate::fs::FileHandle(Arc::new(file()?)))
        }
        Call::FsGetMetadata(_) => Reply::FsGetMetadata(parse(value)?),
        Call::FsReadDirectory(_) => Reply::FsReadDirectory(parse(value)?),
        _ => empty(),
    }))
}

fn parse<T: serde::de::DeserializeOwned>(v: serde_json::Value) -> Result<T, GatewayError> {
    serde_json::from_value(v).map_err(|e| GatewayError::Internal(format!("worker: {e}")))
}

fn to_json<T: Serialize>(r: Result<T, GatewayError>) -> FsResult {
    match r.and_then(|v| serde_json::to_value(v).map_err(|e| GatewayError::Internal(e.to_string())))
    {
        Ok(v) => (Ok(v), Vec::new()),
        Err(e) => (Err(WireError::from(&e)), Vec::new()),
    }
}

fn to_fd(file: Result<std::fs::File, GatewayError>) -> FsResult {
    match file {
        Ok(f) => (Ok(serde_json::Value::Null), vec![OwnedFd::from(f)]),
        Err(e) => (Err(WireError::from(&e)), Vec::new()),
    }
}

/// Run one file operation here, in the worker.
async fn run_fs(root: &Arc<crate::fs::FsRoot>, op: FsOp) -> FsResult {
    use crate::fs;
    match op {
        FsOp::OpenRead(p) => to_fd(root.open_read_now(&p.path)),
        FsOp::OpenWrite(p) => to_fd(root.open_write_now(&p.path)),
        FsOp::CreateDirectory(p) => to_json(fs::create_directory(root, p).await),
        FsOp::GetMetadata(p) => to_json(fs::get_metadata(root, p).await),
        FsOp::ReadDirectory(p) => to_json(fs::read_directory(root, p).await),
        FsOp::Remove(p) => to_json(fs::remove(root, p).await),
        FsOp::Copy(p) => to_json(fs::copy(root, p).await),
    }
}

// === Worker side ===

/// Arguments of `exec-gateway worker`.
#[derive(Debug, clap::Args)]
pub struct WorkerArgs {
    /// The tenant served (for logs and process titles).
    #[arg(long)]
    tenant: String,
    /// The tenant root file operations are confined to (none: the host).
    #[arg(long)]
    root: Option<PathBuf>,
}

/// `exec-gateway worker`: serve spawn requests on fd 3 until EOF.
pub fn worker_main(args: WorkerArgs) -> std::process::ExitCode {
    // SAFETY: fd 3 was set up by the gateway (dup2 in pre_exec); marking it
    // close-on-exec at once keeps it out of every process spawned here
    // (a tenant process must never reach the link, and the gateway must see
    // EOF when the worker dies, not when its last child does).
    let sock = unsafe {
        if libc::fcntl(WORKER_FD, libc::F_SETFD, libc::FD_CLOEXEC) < 0 {
            return std::process::ExitCode::FAILURE;
        }
        OwnedFd::from_raw_fd(WORKER_FD)
    };
    let sock = Arc::new(sock);
    let lock = Arc::new(Mutex::new(()));
    let (wake_tx, wake_rx) = std::sync::mpsc::channel::<()>();
    {
        let (sock, lock) = (sock.clone(), lock.clone());
        let spawned = std::thread::Builder::new()
            .name("reap".to_owned())
            .spawn(move || reap_loop(&sock, &lock, &wake_rx));
        if spawned.is_err() {
            return std::process::ExitCode::FAILURE;
        }
    }
    // File operations run on a small runtime (their blocking parts on its
    // bounded blocking pool), so a slow disk never delays a spawn.
    let Ok(rt) = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .max_blocking_threads(FS_THREADS)
        .enable_all()
        .build()
    else {
        return std::process::ExitCode::FAILURE;
    };
    let root = match &args.root {
        Some(r) => match crate::fs::FsRoot::confined(r) {
            Ok(root) => root,
            Err(e) => {
                eprintln!(
                    "exec-gateway worker {}: root {}: {e}",
                    args.tenant,
                    r.display()
                );
                return std::process::ExitCode::FAILURE;
            }
        },
        None => crate::fs::FsRoot::host(),
    };
    let root = Arc::new(root);
    let mut buf = vec![0u8; MAX_MESSAGE_BYTES];
    loop {
        let n = match recv_packet(sock.as_raw_fd(), &mut buf) {
            Ok(Some((n, _))) => n,
            // The gateway is gone: so are we (its processes are killed by
            // the reaper sidecar and the cgroup cleanup).
            Ok(None) | Err(_) => return std::process::ExitCode::SUCCESS,
        };
        let (id, req) = match serde_json::from_slice::<ToWorker>(&buf[..n]) {
            Ok(ToWorker::Spawn { id, req }) => (id, req),
            Ok(ToWorker::Fs { id, op }) => {
                let (sock, lock, root) = (sock.clone(), lock.clone(), root.clone());
                let done = move |(result, fds): FsResult| {
                    let raw: Vec<RawFd> = fds.iter().map(|f| f.as_raw_fd()).collect();
                    if let Ok(msg) = serde_json::to_vec(&FromWorker::FsDone { id, result }) {
                        let _g = lock.lock();
                        let _ = send_packet(sock.as_raw_fd(), &msg, &raw);
                    }
                };
                match op {
                    // The hot path (readFile, writeFile, gRPC streams): one
                    // hop to a blocking thread, no async task in between.
                    FsOp::OpenRead(p) => {
                        rt.spawn_blocking(move || done(to_fd(root.open_read_now(&p.path))));
                    }
                    FsOp::OpenWrite(p) => {
                        rt.spawn_blocking(move || done(to_fd(root.open_write_now(&p.path))));
                    }
                    op => {
                        rt.spawn(async move { done(run_fs(&root, op).await) });
                    }
                }
                continue;
            }
            Err(_) => {
                eprintln!("exec-gateway worker {}: malformed request", args.tenant);
                continue;
            }
        };
        // Hold the lock from fork to the `Spawned` packet, so the reaper
        // cannot report the exit first.
        let _g = lock.lock();
        let (reply, fds) = match spawn_here(&req) {
            Ok((pid, fds)) => (FromWorker::Spawned { id, pid }, fds),
            Err(e) => (
                FromWorker::Failed {
                    id,
                    errno: e.raw_os_error(),
                    message: e.to_string(),
                },
                Vec::new(),
            ),
        };
        let raw: Vec<RawFd> = fds.iter().map(|f| f.as_raw_fd()).collect();
        let Ok(msg) = serde_json::to_vec(&reply) else {
            continue;
        };
        if send_packet(sock.as_raw_fd(), &msg, &raw).is_err() {
            return std::process::ExitCode::SUCCESS;
        }
        drop(fds);
        let _ = wake_tx.send(());
    }
}

/// Reap every child and report its exit.
fn reap_loop(sock: &OwnedFd, lock: &Mutex<()>, wake: &std::sync::mpsc::Receiver<()>) {
    use nix::sys::wait::{WaitStatus, waitpid};
    loop {
        match waitpid(None, None) {
            Ok(WaitStatus::Exited(pid, code)) => report(sock, lock, pid.as_raw(), Some(code), None),
            Ok(WaitStatus::Signaled(pid, sig, _)) => {
                report(sock, lock, pid.as_raw(), None, Some(sig as i32));
            }
            Ok(_) | Err(nix::errno::Errno::EINTR) => {}
            // No children: wait for the next spawn.
            Err(_) => {
                if wake.recv().is_err() {
                    return;
                }
            }
        }
    }
}

fn report(sock: &OwnedFd, lock: &Mutex<()>, pid: i32, code: Option<i32>, signal: Option<i32>) {
    let _g = lock.lock();
    if let Ok(msg) = serde_json::to_vec(&FromWorker::Exited { pid, code, signal }) {
        let _ = send_packet(sock.as_raw_fd(), &msg, &[]);
    }
}

/// Spawn one child: its own process group (or session, for a PTY), its own
/// cgroup joined before exec. Returns the pid and the fds to pass back.
fn spawn_here(req: &SpawnRequest) -> io::Result<(i32, Vec<OwnedFd>)> {
    use std::os::unix::process::CommandExt as _;
    use std::process::Stdio;
    let program = if req.tty {
        req.arg0.clone().or_else(|| req.argv.first().cloned())
    } else {
        req.argv.first().cloned()
    }
    .ok_or_else(|| io::Error::from(io::ErrorKind::InvalidInput))?;
    let path = super::spawn::resolve_program(&program, &req.env, req.fallback_path.as_deref())?;
    let mut cmd = std::process::Command::new(&path);
    cmd.args(req.argv.iter().skip(1))
        .current_dir(&req.cwd)
        .env_clear()
        .envs(&req.env);
    let join = match &req.cgroup {
        Some(p) => Some(
            CString::new(p.as_os_str().as_encoded_bytes())
                .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?,
        ),
        None => None,
    };
    let joiner = move || -> io::Result<()> {
        match &join {
            Some(p) => super::cgroup::join_self(p),
            None => Ok(()),
        }
    };
    if req.tty {
        let size = nix::pty::Winsize {
            ws_row: super::spawn::PTY_ROWS,
            ws_col: super::spawn::PTY_COLS,
            ws_xpixel: 0,
            ws_ypixel: 0,
        };
        let pty = nix::pty::openpty(&size, None).map_err(io::Error::from)?;
        // openpty(3) leaves both ends inheritable: no later child (nor this
        // one, past its stdio) may keep them.
        for fd in [&pty.master, &pty.slave] {
            nix::fcntl::fcntl(
                fd,
                nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC),
            )
            .map_err(io::Error::from)?;
        }
        let slave = pty.slave;
        cmd.arg0(&program)
            .stdin(Stdio::from(slave.try_clone()?))
            .stdout(Stdio::from(slave.try_clone()?))
            .stderr(Stdio::from(slave));
        // SAFETY: setsid/ioctl/open/write only, after fork.
        unsafe {
            cmd.pre_exec(move || {
                if libc::setsid() < 0 {
                    return Err(io::Error::last_os_error());
                }
                if libc::ioctl(0, libc::TIOCSCTTY as _, 0) < 0 {
                    return Err(io::Error::last_os_error());
                }
                joiner()
            });
        }
        let child = cmd.spawn()?;
        let pid = i32::try_from(child.id()).map_err(io::Error::other)?;
        drop(cmd);
        Ok((pid, vec![pty.master]))
    } else {
        cmd.arg0(req.arg0.as_deref().unwrap_or(&program))
            .process_group(0)
            .stdin(if req.pipe_stdin {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        // SAFETY: open/write/close only, after fork.
        unsafe {
            cmd.pre_exec(joiner);
        }
        let mut child = cmd.spawn()?;
        let pid = i32::try_from(child.id()).map_err(io::Error::other)?;
        let missing = || io::Error::other("child stream was not captured");
        let mut fds: Vec<OwnedFd> = vec![
            child.stdout.take().ok_or_else(missing)?.into(),
            child.stderr.take().ok_or_else(missing)?.into(),
        ];
        if let Some(stdin) = child.stdin.take() {
            fds.push(stdin.into());
        }
        Ok((pid, fds))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_pid_is_trusted_only_as_a_child_of_its_worker() {
        let me = i32::try_from(std::process::id()).unwrap();
        let mut child = std::process::Command::new("sleep")
            .arg("5")
            .spawn()
            .unwrap();
        let pid = i32::try_from(child.id()).unwrap();
        assert_eq!(check_child(pid, me), Ok(()));
        // Not the child of another process; never init or the caller itself.
        assert_eq!(check_child(pid, me + 1), Err(me));
        assert!(check_child(1, me).is_err());
        assert!(check_child(me, me).is_err());
        child.kill().unwrap();
        child.wait().unwrap();
        // Gone (reaped): the worker reports its exit next.
        assert_eq!(check_child(pid, me), Ok(()));
    }
}
