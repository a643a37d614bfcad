//! The gateway's side of a tenant's workers: the pool, one connection per
//! worker, and the [`Spawner`] a session uses.
//!
//! A worker is tenant code as far as the gateway is concerned: it runs as
//! the tenant and the tenant's processes can signal it. So its word is
//! checked (the pidfd it passes for a spawn must name its child, or a
//! process already reaped: see [`verify_child`]; the gateway signals only
//! through that pidfd), unsolicited answers register nothing, and a spawn
//! never holds a runtime thread hostage: a worker that does not answer
//! within [`SPAWN_TIMEOUT`] is killed and replaced.

use std::collections::HashMap;
use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::oneshot;
use tracing::Instrument as _;

use crate::error::GatewayError;

use super::link::{self, ToWorker, WORKER_FD};
use crate::fs::{FsDone, FsError, FsOp};
use crate::isolation::sandbox::Sandbox;
use crate::metrics::TenantMetrics;
use crate::spawn::{Child, ChildFds, ChildIo, Ended, ExitWait, SpawnFuture, SpawnSpec, Spawner};

/// How long a spawn may take in the worker before the gateway gives up on
/// it (and kills the worker).
pub const SPAWN_TIMEOUT: Duration = Duration::from_secs(5);
/// Sessions per worker before the pool starts another.
pub const SESSIONS_PER_WORKER: usize = 32;

type SpawnAnswer = io::Result<(i32, Vec<OwnedFd>, oneshot::Receiver<Ended>)>;
type FsAnswer = (Result<link::FsReply, FsError>, Vec<OwnedFd>);

/// One live worker and its link.
pub struct WorkerConn {
    /// Its pid (with a PID namespace: the pid of the namespace's parent,
    /// whose child the worker is).
    pid: i32,
    /// The worker is the init of its own PID namespace: the pids it names
    /// are the namespace's, and the host's are read from the pidfds.
    pid_ns: bool,
    sock: OwnedFd,
    send_lock: Mutex<()>,
    next_id: AtomicU64,
    spawns: Mutex<HashMap<u64, oneshot::Sender<SpawnAnswer>>>,
    exits: Mutex<HashMap<i32, oneshot::Sender<Ended>>>,
    fs_pending: Mutex<HashMap<u64, oneshot::Sender<FsAnswer>>>,
    dead: AtomicBool,
    /// Killed on purpose (probe, shutdown): its end is not news.
    retiring: AtomicBool,
    metrics: Option<TenantMetrics>,
    sessions: AtomicUsize,
    started: std::time::Instant,
}

impl std::fmt::Debug for WorkerConn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "WorkerConn(pid {})", self.pid)
    }
}

impl WorkerConn {
    /// A connection to the worker `pid` (`pid_ns`: the pid is the
    /// namespace's parent's) over `sock`, with nothing in flight.
    fn new(pid: i32, pid_ns: bool, sock: OwnedFd, metrics: Option<TenantMetrics>) -> WorkerConn {
        WorkerConn {
            pid,
            pid_ns,
            sock,
            send_lock: Mutex::new(()),
            next_id: AtomicU64::new(1),
            spawns: Mutex::new(HashMap::new()),
            exits: Mutex::new(HashMap::new()),
            fs_pending: Mutex::new(HashMap::new()),
            dead: AtomicBool::new(false),
            retiring: AtomicBool::new(false),
            metrics,
            sessions: AtomicUsize::new(0),
            started: std::time::Instant::now(),
        }
    }
}

impl WorkerConn {
    pub fn is_dead(&self) -> bool {
        self.dead.load(Ordering::Acquire)
    }

    fn send(&self, msg: &ToWorker) -> io::Result<()> {
        let _g = self.send_lock.lock();
        link::send(&self.sock, msg, &[])
    }

    fn kill(&self) {
        if self.pid_ns {
            // `pid` is the namespace's parent; its one child is the worker,
            // the namespace's init. Its parent-death signal does not reach
            // it on every kernel (seen here: the worker outlived its killed
            // parent and held the tenant's link), so it is killed itself,
            // which takes the whole namespace along.
            let children =
                std::fs::read_to_string(format!("/proc/{0}/task/{0}/children", self.pid))
                    .unwrap_or_default();
            for child in children
                .split_whitespace()
                .filter_map(|c| c.parse::<i32>().ok())
            {
                crate::isolation::signal::kill_checked(child, || {
                    parent_of(child) == Some(self.pid)
                });
            }
        }
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.pid),
            nix::sys::signal::Signal::SIGKILL,
        );
    }

    /// Spawn through the worker: the request goes out on the link and the
    /// answer comes back through the link's reader task, awaited (no
    /// runtime thread is held while the worker forks). Not cancel-safe (a
    /// late answer would register a child nobody holds): its one caller,
    /// `ProcessTable::start`, runs it in a task of its own.
    async fn spawn(&self, spec: SpawnSpec) -> io::Result<Child> {
        if self.is_dead() {
            return Err(io::Error::other("the tenant's worker process died"));
        }
        let tty = spec.tty;
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        self.spawns.lock().insert(id, tx);
        if let Err(e) = self.send(&ToWorker::Spawn { id, spec }) {
            self.spawns.lock().remove(&id);
            return Err(e);
        }
        // The worker can be stopped by the tenant's own processes: a spawn
        // it does not answer in time retires it.
        let (pid, fds, exit) = match tokio::time::timeout(SPAWN_TIMEOUT, rx).await {
            Ok(Ok(r)) => r?,
            // The reader ended: the worker died with the request pending.
            Ok(Err(_)) => return Err(io::Error::other("the tenant's worker process died")),
            Err(_) => {
                self.spawns.lock().remove(&id);
                // Stuck or stopped: retire it; its processes are reported
                // failed and a new worker serves the next call.
                tracing::warn!(
                    worker = self.pid,
                    "worker did not answer a spawn; killing it"
                );
                // Once its link has ended it is killed and being reaped
                // there (its pid may soon be another process's).
                if !self.is_dead() {
                    self.kill();
                }
                return Err(io::Error::other("the tenant's worker did not answer"));
            }
        };
        // The worker sends the child's pidfd first, then its streams.
        let mut fds = fds.into_iter();
        let pidfd = fds
            .next()
            .ok_or_else(|| io::Error::other("the worker sent no pidfd"))?;
        Ok(Child {
            pid,
            pidfd,
            io: ChildIo::from_fds(ChildFds::from_vec(tty, fds.collect())?)?,
            exit: ExitWait::Worker(exit),
        })
    }

    /// Run a file operation in the worker.
    async fn fs(&self, op: FsOp) -> Result<FsDone, FsError> {
        let died = || FsError::Io("the tenant's worker process died".to_owned());
        if self.is_dead() {
            return Err(died());
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        self.fs_pending.lock().insert(id, tx);
        if let Err(e) = self.send(&ToWorker::Fs { id, op }) {
            self.fs_pending.lock().remove(&id);
            return Err(FsError::Io(format!("worker: {e}")));
        }
        // The request deadline of the stack bounds this wait.
        let (result, fds) = rx.await.map_err(|_| died())?;
        result?.join(fds)
    }
}

/// A spawned child as [`verify_child`] found it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verified {
    /// Alive, or exited but not yet reaped, and the worker's child: its
    /// pid in the gateway's namespace.
    Running(i32),
    /// Already reaped by the time of the check: nothing says whose child
    /// it was, and nothing needs to (see [`verify_child`]).
    Reaped,
}

/// Why a worker's `Spawned` answer was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Refusal {
    /// The first fd is missing or is not a pidfd.
    NotAPidfd,
    /// The pidfd names a process the gateway's namespace cannot see, or
    /// one outside it and its descendants.
    NotVisible,
    /// The pidfd names another process than the pid the worker named.
    OtherProcess { named: i32, pidfd: i32 },
    /// The pidfd's process is alive and not the worker's child (its
    /// parent, if it could be read; in a PID namespace, its parent, which
    /// is not the worker).
    NotItsChild { pid: i32, ppid: Option<i32> },
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refusal::NotAPidfd => write!(f, "no pidfd came with the answer"),
            Refusal::NotVisible => write!(f, "the pidfd names a process out of reach"),
            Refusal::OtherProcess { named, pidfd } => {
                write!(f, "the pidfd names pid {pidfd}, not {named}")
            }
            Refusal::NotItsChild { pid, ppid } => match ppid {
                Some(ppid) => write!(f, "pid {pid} is the child of {ppid}"),
                None => write!(f, "pid {pid} has no readable parent"),
            },
        }
    }
}

/// Verify a worker's `Spawned` answer: `pidfd` is the pidfd it passed
/// and `named` the pid it named (in a PID namespace, the namespace's);
/// `conn_pid` is the worker (with `pid_ns`: the namespace's parent, whose
/// one child, the namespace's init, is the worker).
///
/// A worker is tenant code: the gateway, root, must never signal a
/// process that is not the worker's child on its word. So the check is
/// made on the *pidfd*, which is also the only thing the gateway ever
/// signals (module `isolation::signal`): a pidfd names one process for
/// its whole life and never a later holder of its number.
///
/// The worker took the pidfd before it could reap the child (under its
/// link lock), but the child may exit, be reaped and its number be reused
/// at any point before and during this check: the worker answers first
/// and the gateway's read thread gets to it later. Every window resolves
/// safely:
///
/// 1. The fdinfo's `Pid:` is read. -1: already reaped → [`Verified::Reaped`].
/// 2. Its parent is read from `/proc/PID/stat` (for a zombie: still the
///    worker). This read may straddle the release of an exiting child, and
///    then names parent 0; or, if the child was reaped and the number
///    taken since step 1 (or since a reap the fdinfo of an older kernel
///    does not show), it describes another process.
/// 3. The pidfd is probed (signal 0). Gone: the child was reaped meanwhile,
///    whatever step 2 read → [`Verified::Reaped`]. Still there: the
///    process held its number from step 1 to step 3 (a number is not
///    reused while its process exists), so step 2 read *this* process,
///    and a parent other than the worker is a refusal.
///
/// Accepting a reaped process unverified keeps the guarantee: its pidfd
/// can only ever answer ESRCH, and no number is registered for it (the
/// caller hands on pid 0). What it cannot do is prove which process it
/// was; a worker that passes some other dead process's pidfd only fools
/// itself (its own spawn never reports an exit). A pidfd of a live
/// process that is not the worker's child (init, the gateway, another
/// tenant's process, the worker's grandchild), one of a different process
/// than the pid named, or an fd that is not a pidfd, is refused.
fn verify_child(
    pidfd: &OwnedFd,
    named: i32,
    conn_pid: i32,
    pid_ns: bool,
) -> Result<Verified, Refusal> {
    let info = crate::spawn::pidfd_info(pidfd).ok_or(Refusal::NotAPidfd)?;
    if info.pid < 0 {
        return Ok(Verified::Reaped);
    }
    if info.pid == 0 {
        return Err(Refusal::NotVisible);
    }
    let pid = info.pid;
    // The number the worker sees it by (in its own namespace, if any).
    if let Some(inner) = info.ns_pid
        && inner != named
    {
        return Err(Refusal::OtherProcess {
            named,
            pidfd: inner,
        });
    }
    let ppid = parent_of(pid);
    let is_child = match ppid {
        Some(worker) if pid_ns => worker > 1 && parent_of(worker) == Some(conn_pid),
        Some(worker) => worker == conn_pid,
        None => false,
    };
    match crate::spawn::pidfd_exists(pidfd) {
        Ok(false) => Ok(Verified::Reaped),
        Ok(true) if is_child && pid > 1 => Ok(Verified::Running(pid)),
        Ok(true) => Err(Refusal::NotItsChild { pid, ppid }),
        Err(_) => Err(Refusal::NotVisible),
    }
}

/// The parent of `pid`, from `/proc/PID/stat` (0 for a process being
/// released, or init). `None`: gone, or unreadable.
fn parent_of(pid: i32) -> Option<i32> {
    #[cfg(test)]
    if let Some(ppid) = tests::stat_hook(pid) {
        return ppid;
    }
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Field 4, after the parenthesised command (which may hold spaces).
    stat.rsplit_once(')')
        .and_then(|(_, rest)| rest.split_whitespace().nth(1))
        .and_then(|ppid| ppid.parse::<i32>().ok())
}

/// How to start a tenant's workers.
pub struct WorkerLaunch {
    pub tenant: String,
    /// The tenant root (none: the host).
    pub root: Option<PathBuf>,
    pub exe: PathBuf,
    /// Applied in the worker between fork and exec, after the cgroup join.
    pub sandbox: Option<Arc<Sandbox>>,
    /// The tenant's `cgroup.procs` files the worker joins.
    pub cgroups: Vec<CString>,
    /// The worker creates children in their cgroups (cgroup v2) under a
    /// seccomp sandbox: its own programs let `clone3` through and it seals
    /// each child (`Sandbox::worker_hook`, `exec-gateway worker
    /// --seal-children`).
    pub seal_children: bool,
    pub min: usize,
    pub max: usize,
    /// The tenant's metrics (none for the probe).
    pub metrics: Option<TenantMetrics>,
    /// Held for reading by every call to a worker; a snapshot holds it for
    /// writing while it freezes the tenant (the tenant's pools share one).
    pub gate: Gate,
}

/// A tenant's pool of workers.
pub struct WorkerPool {
    launch: WorkerLaunch,
    workers: Mutex<Vec<Arc<WorkerConn>>>,
    /// Replacements of workers that died young wait longer each time.
    backoff: Mutex<Backoff>,
    /// Set at shutdown: no worker is started any more.
    retired: AtomicBool,
}

/// A worker that dies within this of its start counts as killed on
/// purpose (by its own tenant): its replacement backs off.
pub const WORKER_MIN_LIFETIME: std::time::Duration = std::time::Duration::from_secs(10);
/// First and longest wait before replacing a worker that died young.
pub const WORKER_BACKOFF_FIRST: std::time::Duration = std::time::Duration::from_millis(100);
pub const WORKER_BACKOFF_MAX: std::time::Duration = std::time::Duration::from_secs(5);

/// A spawn refused while the tenant's worker waits out its restart
/// backoff (inside the `io::Error` of the spawn).
#[derive(Debug, thiserror::Error)]
#[error("the tenant's worker is restarting; retry in {retry_after_ms} ms")]
pub struct Restarting {
    pub retry_after_ms: u64,
}

/// A spawn or file operation after the gateway retired its workers (it is
/// shutting down): the draining error, which clients take elsewhere.
#[derive(Debug, thiserror::Error)]
#[error("the gateway is shutting down")]
pub struct Retired;

/// The error a client is given when no worker could take a call: a
/// restart backoff is -32001 with when to retry, a retired pool the
/// draining error; anything else is internal.
pub fn unavailable(e: &io::Error) -> Option<GatewayError> {
    let inner = e.get_ref()?;
    if let Some(r) = inner.downcast_ref::<Restarting>() {
        return Some(GatewayError::RateLimited {
            retry_after_ms: r.retry_after_ms,
        });
    }
    inner
        .downcast_ref::<Retired>()
        .map(|_| GatewayError::Draining)
}

#[derive(Debug, Default)]
struct Backoff {
    delay: std::time::Duration,
    not_before: Option<std::time::Instant>,
}

impl std::fmt::Debug for WorkerPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "WorkerPool({})", self.launch.tenant)
    }
}

impl WorkerPool {
    /// Start the pool's minimum of workers (an error here means workers
    /// cannot run on this host).
    pub fn start(launch: WorkerLaunch) -> io::Result<Arc<WorkerPool>> {
        let pool = Arc::new(WorkerPool {
            launch,
            workers: Mutex::new(Vec::new()),
            backoff: Mutex::new(Backoff::default()),
            retired: AtomicBool::new(false),
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
    fn pick(&self) -> io::Result<Arc<WorkerConn>> {
        if self.retired.load(Ordering::Acquire) {
            return Err(io::Error::other(Retired));
        }
        let mut ws = self.workers.lock();
        let lived: Vec<bool> = ws
            .iter()
            .filter(|w| w.is_dead())
            .map(|w| w.started.elapsed() >= WORKER_MIN_LIFETIME)
            .collect();
        ws.retain(|w| !w.is_dead());
        if ws.is_empty() {
            // A tenant that keeps killing its worker must not make the
            // gateway fork workers flat out (other tenants' spawns pay).
            let mut b = self.backoff.lock();
            let now = std::time::Instant::now();
            if let Some(t) = b.not_before
                && now < t
            {
                return Err(io::Error::new(
                    io::ErrorKind::WouldBlock,
                    Restarting {
                        retry_after_ms: u64::try_from((t - now).as_millis()).unwrap_or(u64::MAX),
                    },
                ));
            }
            if lived.contains(&false) {
                b.delay = (b.delay * 2).clamp(WORKER_BACKOFF_FIRST, WORKER_BACKOFF_MAX);
                b.not_before = Some(now + b.delay);
            } else if lived.contains(&true) {
                *b = Backoff::default();
            }
        }
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

    fn release(&self, w: &WorkerConn) {
        w.sessions.fetch_sub(1, Ordering::Relaxed);
    }

    /// Run a file operation in the least loaded live worker.
    pub async fn fs(&self, op: FsOp) -> Result<FsDone, FsError> {
        let _open = self.launch.gate.clone().read_owned().await;
        let w = self.pick().map_err(|e| match unavailable(&e) {
            Some(GatewayError::RateLimited { retry_after_ms }) => {
                FsError::Restarting { retry_after_ms }
            }
            Some(GatewayError::Draining) => FsError::ShuttingDown,
            _ => FsError::Io(format!("worker: {e}")),
        })?;
        self.release(&w);
        w.fs(op).await
    }

    /// A session's spawner: it picks a worker at its first spawn and keeps
    /// it, replacing it if it dies.
    pub fn session(self: &Arc<Self>) -> SessionWorker {
        SessionWorker {
            pool: self.clone(),
            current: Mutex::new(None),
        }
    }

    fn launch_one(&self) -> io::Result<Arc<WorkerConn>> {
        use std::os::unix::process::CommandExt as _;
        let (ours, theirs) = link::pair()?;
        let image = self
            .launch
            .sandbox
            .as_ref()
            .is_some_and(|s| s.spec.namespace.as_ref().is_some_and(|n| n.image.is_some()));
        // Descriptors the worker inherits (and closes once it runs).
        let mut inherit: Vec<RawFd> = Vec::new();
        let mut cmd = crate::isolation::loader::worker_command(
            own_executable(),
            &self.launch.exe,
            image,
            &mut inherit,
        )?;
        cmd.arg("worker").arg("--tenant").arg(&self.launch.tenant);
        if let Some(root) = &self.launch.root {
            cmd.arg("--root").arg(root);
        }
        if self.launch.seal_children {
            cmd.arg("--seal-children");
        }
        if image {
            cmd.arg("--image");
            for fd in &inherit {
                cmd.arg("--close-fd").arg(fd.to_string());
            }
        }
        if inherit.contains(&WORKER_FD) {
            return Err(io::Error::other(
                "a descriptor the worker inherits is its link's",
            ));
        }
        // SAFETY: fcntl on descriptors that exist in the child.
        #[allow(unsafe_code)]
        unsafe {
            cmd.pre_exec(move || {
                for fd in &inherit {
                    if libc::fcntl(*fd, libc::F_SETFD, 0) < 0 {
                        return Err(io::Error::last_os_error());
                    }
                }
                Ok(())
            });
        }
        cmd.env_clear()
            .current_dir("/")
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .process_group(0);
        let theirs_fd: RawFd = theirs.as_raw_fd();
        let cgroups = self.launch.cgroups.clone();
        // Order matters: join the cgroups as root, then confine (the
        // sandbox drops root and uses its ruleset fd, which may be fd 3),
        // then put the link on fd 3.
        // SAFETY: `join_self` only (open/write/close on paths prepared before fork).
        #[allow(unsafe_code)]
        unsafe {
            cmd.pre_exec(move || {
                cgroups
                    .iter()
                    .try_for_each(|p| crate::isolation::cgroup::join_self(p))
            });
        }
        if let Some(sb) = &self.launch.sandbox {
            let hook = sb.worker_hook(self.launch.seal_children);
            // SAFETY: raw syscalls only (see `Sandbox::hook`).
            #[allow(unsafe_code)]
            unsafe {
                cmd.pre_exec(hook);
            }
        }
        // SAFETY: dup2/fcntl on fds that exist in the child.
        #[allow(unsafe_code)]
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
        let pid_ns = self
            .launch
            .sandbox
            .as_ref()
            .is_some_and(|s| s.spec.namespace.as_ref().is_some_and(|n| n.pid));
        let conn = Arc::new(WorkerConn::new(
            pid,
            pid_ns,
            ours,
            self.launch.metrics.clone(),
        ));
        let reader = conn.clone();
        match tokio::runtime::Handle::try_current() {
            Ok(_) => drop(crate::task::start("worker-link", reader.read_task())),
            Err(_) => drop(
                std::thread::Builder::new()
                    .name(format!("worker-{}", self.launch.tenant))
                    .spawn(move || reader.read_loop())?,
            ),
        }
        if let Some(m) = &conn.metrics {
            m.workers.inc();
        }
        tracing::info!(tenant = %self.launch.tenant, pid, "worker started");
        Ok(conn)
    }

    /// Kill every worker (shutdown, probe).
    pub fn kill_all(&self) {
        self.retired.store(true, Ordering::Release);
        for w in self.workers.lock().iter() {
            w.retiring.store(true, Ordering::Release);
            w.kill();
        }
    }
}

/// One session's worker, picked at its first spawn.
pub struct SessionWorker {
    pool: Arc<WorkerPool>,
    current: Mutex<Option<Arc<WorkerConn>>>,
}

impl SessionWorker {
    /// The session's worker; a dead one is replaced for later spawns (its
    /// processes are reported failed).
    fn worker(&self) -> io::Result<Arc<WorkerConn>> {
        let mut current = self.current.lock();
        if let Some(w) = current.as_ref() {
            if !w.is_dead() {
                return Ok(w.clone());
            }
            self.pool.release(w);
        }
        let w = self.pool.pick()?;
        *current = Some(w.clone());
        Ok(w)
    }
}

impl Spawner for SessionWorker {
    fn spawn(&self, spec: SpawnSpec) -> SpawnFuture<'_> {
        // The worker hop of a call's trace (a span only when exported).
        let span = if crate::telemetry::exporting() {
            tracing::info_span!("worker.spawn")
        } else {
            tracing::Span::none()
        };
        Box::pin(
            async move {
                let _open = self.pool.launch.gate.clone().read_owned().await;
                let worker = self.worker()?;
                worker.spawn(spec).await
            }
            .instrument(span),
        )
    }
}

impl Drop for SessionWorker {
    fn drop(&mut self) {
        if let Some(w) = self.current.lock().take() {
            self.pool.release(&w);
        }
    }
}

/// The gateway's own executable, opened at the first worker launch (at
/// start): workers are executed from this descriptor, so a binary replaced
/// on disk under a running gateway (an upgrade) never changes what a new
/// worker runs, and the Landlock rule taken for the file at start still
/// names it. `None` (no /proc): launched by path.
/// The gateway's executable as workers exec it: the file held open since
/// the first call (`/proc/self/fd/N`), which a binary replaced on disk does
/// not change; else its path. A worker's Landlock rule must name this
/// file, not whatever lies at the path now.
pub fn executable() -> io::Result<std::path::PathBuf> {
    match own_executable() {
        Some(fd) => Ok(std::path::PathBuf::from(format!("/proc/self/fd/{fd}"))),
        None => std::env::current_exe(),
    }
}

fn own_executable() -> Option<RawFd> {
    static EXE: std::sync::OnceLock<Option<std::fs::File>> = std::sync::OnceLock::new();
    EXE.get_or_init(|| {
        std::env::current_exe()
            .and_then(std::fs::File::open)
            .ok()
            .filter(|_| std::path::Path::new("/proc/self/fd").is_dir())
    })
    .as_ref()
    .map(|f| f.as_raw_fd())
}

mod gate;
mod reader;
#[cfg(test)]
mod tests;

pub use gate::Gate;
