//! The gateway's side of a tenant's workers: the pool, one connection per
//! worker, and the [`Spawner`] a session uses.
//!
//! A worker is tenant code as far as the gateway is concerned: it runs as
//! the tenant and the tenant's processes can signal it. So its word is
//! checked (a spawned pid must be its child), unsolicited answers register
//! nothing, and a spawn never holds a runtime thread hostage: a worker that
//! does not answer within [`SPAWN_TIMEOUT`] is killed and replaced.

use std::collections::HashMap;
use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd as _, OwnedFd, RawFd};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::oneshot;

use super::link::{self, FromWorker, MAX_MESSAGE_BYTES, Received, ToWorker, WORKER_FD};
use crate::fs::{FsDone, FsError, FsOp};
use crate::isolation::sandbox::Sandbox;
use crate::metrics::TenantMetrics;
use crate::spawn::{Child, ChildFds, ChildIo, Ended, ExitWait, SpawnSpec, Spawner};

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
    spawns: Mutex<HashMap<u64, std::sync::mpsc::SyncSender<SpawnAnswer>>>,
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

    /// Spawn through the worker: a blocking round trip, like a local spawn.
    fn spawn(&self, spec: SpawnSpec) -> io::Result<Child> {
        if self.is_dead() {
            return Err(io::Error::other("the tenant's worker process died"));
        }
        let tty = spec.tty;
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        self.spawns.lock().insert(id, tx);
        if let Err(e) = self.send(&ToWorker::Spawn { id, spec }) {
            self.spawns.lock().remove(&id);
            return Err(e);
        }
        // The worker can be stopped by the tenant's own processes: never let
        // that hold a runtime thread hostage (other tenants' calls run on the
        // same threads).
        let wait = || rx.recv_timeout(SPAWN_TIMEOUT);
        let answer = match tokio::runtime::Handle::try_current() {
            Ok(h) if h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
                tokio::task::block_in_place(wait)
            }
            _ => wait(),
        };
        let (pid, fds, exit) = match answer {
            Ok(r) => r?,
            Err(_) => {
                self.spawns.lock().remove(&id);
                // Stuck or stopped: retire it; its processes are reported
                // failed and a new worker serves the next call.
                tracing::warn!(
                    worker = self.pid,
                    "worker did not answer a spawn; killing it"
                );
                self.kill();
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

    /// Read the worker's messages until EOF; then fail everything pending.
    fn read_loop(self: Arc<Self>) {
        let mut buf = vec![0u8; MAX_MESSAGE_BYTES];
        loop {
            let (msg, fds) = match link::recv::<FromWorker>(&self.sock, &mut buf) {
                Ok(Received::Message(m, fds)) => (m, fds),
                Ok(Received::Malformed) => {
                    tracing::warn!(worker = self.pid, "malformed message from worker");
                    continue;
                }
                Ok(Received::Eof) | Err(_) => break,
            };
            match msg {
                FromWorker::Spawned { id, pid } => self.spawned(id, pid, fds),
                FromWorker::SpawnFailed { id, errno, message } => {
                    if let Some(w) = self.spawns.lock().remove(&id) {
                        let _ = w.send(Err(match errno {
                            Some(n) => io::Error::from_raw_os_error(n),
                            None => io::Error::other(message),
                        }));
                    }
                }
                FromWorker::FsDone { id, result } => {
                    if let Some(tx) = self.fs_pending.lock().remove(&id) {
                        let _ = tx.send((result, fds));
                    }
                }
                FromWorker::Exited { pid, ended } => {
                    if let Some(tx) = self.exits.lock().remove(&pid) {
                        let _ = tx.send(ended);
                    }
                }
            }
        }
        self.dead.store(true, Ordering::Release);
        let retiring = self.retiring.load(Ordering::Acquire);
        if let Some(m) = &self.metrics {
            m.workers.dec();
            if !retiring {
                m.worker_deaths.inc();
            }
        }
        if !retiring {
            tracing::warn!(
                worker = self.pid,
                "worker process ended; its processes are reported failed"
            );
        }
        self.spawns.lock().clear();
        self.fs_pending.lock().clear();
        for (_, tx) in self.exits.lock().drain() {
            let _ = tx.send(Ended::WorkerDied);
        }
        // Reap it (the gateway is its parent).
        let _ = nix::sys::wait::waitpid(nix::unistd::Pid::from_raw(self.pid), None);
    }

    /// A `Spawned` answer: registered only if it answers a request and names
    /// a child of this worker.
    fn spawned(&self, id: u64, pid: i32, fds: Vec<OwnedFd>) {
        // Never take a worker's word for a pid: one that is alive must be
        // its child, or the gateway (root) would signal someone else's
        // process group. A pid that fails the check is refused (the spawn
        // fails; whatever runs is killed with its process cgroup). In a
        // PID namespace the number is the namespace's: the host's comes
        // from the pidfd (0 once gone), and the process must be the child
        // of the worker, itself the child of the namespace's parent.
        let host_pid = if self.pid_ns {
            match fds.first().map(crate::spawn::pidfd_pid) {
                Some(Some(p)) => p,
                _ => 0,
            }
        } else {
            pid
        };
        let checked = match (self.pid_ns, host_pid) {
            (true, 0) => Ok(()),
            (true, p) => match parent_of(p) {
                Some(worker) => check_child(worker, self.pid),
                None => Ok(()),
            },
            (false, p) => check_child(p, self.pid),
        };
        if let Err(ppid) = checked {
            tracing::warn!(
                worker = self.pid,
                pid,
                ppid,
                "worker named a process that is not its child; refused"
            );
            if let Some(w) = self.spawns.lock().remove(&id) {
                let _ = w.send(Err(io::Error::other(
                    "the spawned process could not be verified as the worker's child",
                )));
            }
            return;
        }
        // Only an answer to a request registers anything (the map stays
        // bounded by the requests made), and before the reply is handed on:
        // the exit can only be read after this packet.
        let Some(w) = self.spawns.lock().remove(&id) else {
            return;
        };
        let (tx, rx) = oneshot::channel();
        self.exits.lock().insert(pid, tx);
        let _ = w.send(Ok((host_pid, fds, rx)));
    }
}

/// The parent of `pid`, from `/proc/PID/stat`.
fn parent_of(pid: i32) -> Option<i32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(')')
        .and_then(|(_, rest)| rest.split_whitespace().nth(1))
        .and_then(|ppid| ppid.parse::<i32>().ok())
}

/// `Ok` if `pid` is a child of `parent`, or already gone (reaped: the
/// worker reports its exit next); else `Err(its parent)`. A stat that
/// cannot be parsed is a refusal, never a pass.
fn check_child(pid: i32, parent: i32) -> Result<(), i32> {
    if pid <= 1 {
        return Err(0);
    }
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return Ok(());
    };
    // Field 4, after the parenthesised command (which may hold spaces).
    let ppid = stat
        .rsplit_once(')')
        .and_then(|(_, rest)| rest.split_whitespace().nth(1))
        .and_then(|ppid| ppid.parse::<i32>().ok())
        .ok_or(-1)?;
    // 0: the process has exited and is being released (the kernel no
    // longer names a parent): gone, as above.
    if ppid == parent || ppid == 0 {
        Ok(())
    } else {
        Err(ppid)
    }
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
    pub min: usize,
    pub max: usize,
    /// The tenant's metrics (none for the probe).
    pub metrics: Option<TenantMetrics>,
}

/// A tenant's pool of workers.
pub struct WorkerPool {
    launch: WorkerLaunch,
    workers: Mutex<Vec<Arc<WorkerConn>>>,
    /// Replacements of workers that died young wait longer each time.
    backoff: Mutex<Backoff>,
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
        let w = self
            .pick()
            .map_err(|e| FsError::Io(format!("worker: {e}")))?;
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
        let mut cmd = match own_executable() {
            Some(fd) => {
                let mut c = std::process::Command::new(format!("/proc/self/fd/{fd}"));
                c.arg0(&self.launch.exe);
                c
            }
            None => std::process::Command::new(&self.launch.exe),
        };
        cmd.arg("worker").arg("--tenant").arg(&self.launch.tenant);
        if let Some(root) = &self.launch.root {
            cmd.arg("--root").arg(root);
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
            let hook = sb.hook();
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
        let conn = Arc::new(WorkerConn {
            pid,
            pid_ns: self
                .launch
                .sandbox
                .as_ref()
                .is_some_and(|s| s.spec.namespace.as_ref().is_some_and(|n| n.pid)),
            sock: ours,
            send_lock: Mutex::new(()),
            next_id: AtomicU64::new(1),
            spawns: Mutex::new(HashMap::new()),
            exits: Mutex::new(HashMap::new()),
            fs_pending: Mutex::new(HashMap::new()),
            dead: AtomicBool::new(false),
            retiring: AtomicBool::new(false),
            metrics: self.launch.metrics.clone(),
            sessions: AtomicUsize::new(0),
            started: std::time::Instant::now(),
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

    /// Kill every worker (shutdown, probe).
    pub fn kill_all(&self) {
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
    fn spawn(&self, spec: SpawnSpec) -> io::Result<Child> {
        self.worker()?.spawn(spec)
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
