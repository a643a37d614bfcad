//! `exec-gateway worker`: the worker's own main. It runs already confined
//! (the tenant's cgroups, uid, Landlock and seccomp were applied before its
//! exec), serves spawn and file requests on fd 3 until EOF, reaps its
//! children and reports each exit.

use std::io;
use std::os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd, RawFd};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use parking_lot::Mutex;

use super::link::{self, FromWorker, FsReply, MAX_MESSAGE_BYTES, Received, ToWorker, WORKER_FD};
use crate::fs::{FsError, FsRoot};
use crate::spawn::{Ended, vfork};

/// Threads a worker runs blocking file operations on.
const FS_THREADS: usize = 16;

/// Arguments of `exec-gateway worker`.
#[derive(Debug, clap::Args)]
pub struct WorkerArgs {
    /// The tenant served (for logs and process titles).
    #[arg(long)]
    tenant: String,
    /// The tenant root file operations are confined to (none: the host).
    #[arg(long)]
    root: Option<PathBuf>,
    /// Its `/` is the tenant's image: file paths outside the root resolve
    /// there (read-only).
    #[arg(long)]
    image: bool,
    /// Descriptors inherited only to start it (the host's loader's
    /// libraries, the binary): closed first thing.
    #[arg(long = "close-fd")]
    close_fd: Vec<i32>,
    /// Its own seccomp programs let `clone3` through (it creates children
    /// in their cgroups): it installs the one they lack in each child.
    #[arg(long)]
    seal_children: bool,
}

/// The link, shared by the request loop, the reap thread and file threads.
struct Link {
    sock: OwnedFd,
    /// Held from fork to the `Spawned` packet, so the reap thread cannot
    /// report an exit before the gateway knows the pid.
    lock: Mutex<()>,
}

impl Link {
    fn send(&self, msg: &FromWorker, fds: &[RawFd]) -> io::Result<()> {
        let _g = self.lock.lock();
        link::send(&self.sock, msg, fds)
    }
}

/// Serve spawn and file requests on fd 3 until EOF.
pub fn serve(args: WorkerArgs) -> ExitCode {
    // SAFETY: fd 3 was set up by the gateway (dup2 in pre_exec); marking it
    // close-on-exec at once keeps it out of every process spawned here
    // (a tenant process must never reach the link, and the gateway must see
    // EOF when the worker dies, not when its last child does).
    #[allow(unsafe_code)]
    let sock = unsafe {
        if libc::fcntl(WORKER_FD, libc::F_SETFD, libc::FD_CLOEXEC) < 0 {
            return ExitCode::FAILURE;
        }
        OwnedFd::from_raw_fd(WORKER_FD)
    };
    for fd in args.close_fd.iter().filter(|fd| **fd > WORKER_FD) {
        // SAFETY: descriptors passed only to start this worker (the host's
        // loader read them); nothing here owns them.
        #[allow(unsafe_code)]
        unsafe {
            libc::close(*fd);
        }
    }
    // The tenant's processes share the worker's uid and Landlock domain:
    // not dumpable, they cannot read its memory or /proc files. (Its
    // children are dumpable again after exec.)
    // SAFETY: a prctl on ourselves.
    #[allow(unsafe_code)]
    unsafe {
        libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0);
        // As the init of the tenant's PID namespace, die with the parent
        // the gateway holds (which the gateway kills to retire us): set
        // here, after exec, as a credential change would clear it.
        // (Only there: it fires when the forking thread exits, and the
        // gateway's threads come and go.)
        if libc::getpid() == 1 {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0);
        }
    }
    let link = Arc::new(Link {
        sock,
        lock: Mutex::new(()),
    });
    let (wake_tx, wake_rx) = std::sync::mpsc::channel::<()>();
    {
        let link = link.clone();
        let spawned = std::thread::Builder::new()
            .name("reap".to_owned())
            .spawn(move || reap_loop(&link, &wake_rx));
        if spawned.is_err() {
            return ExitCode::FAILURE;
        }
    }
    // File operations run on a bounded blocking pool, so a slow disk never
    // delays a spawn.
    let Ok(rt) = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .max_blocking_threads(FS_THREADS)
        .enable_all()
        .build()
    else {
        return ExitCode::FAILURE;
    };
    let root = match &args.root {
        Some(r) => match FsRoot::confined(r).and_then(|root| {
            if args.image {
                root.with_image_root()
            } else {
                Ok(root)
            }
        }) {
            Ok(root) => root,
            Err(e) => {
                eprintln!(
                    "exec-gateway worker {}: root {}: {e}",
                    args.tenant,
                    r.display()
                );
                return ExitCode::FAILURE;
            }
        },
        None => FsRoot::host(),
    };
    let root = Arc::new(root);
    let seal = match args
        .seal_children
        .then(crate::isolation::seccomp::seal)
        .transpose()
    {
        Ok(seal) => seal,
        // Never spawn a child without it.
        Err(e) => {
            eprintln!("exec-gateway worker {}: {e}", args.tenant);
            return ExitCode::FAILURE;
        }
    };
    let spawner = vfork::Spawner::new(seal);
    let mut buf = vec![0u8; MAX_MESSAGE_BYTES];
    loop {
        let msg = match link::recv::<ToWorker>(&link.sock, &mut buf) {
            Ok(Received::Message(m, _)) => m,
            Ok(Received::Malformed) => {
                eprintln!("exec-gateway worker {}: malformed request", args.tenant);
                continue;
            }
            // The gateway is gone: so are we (its processes are killed by
            // the reaper sidecar and the cgroup cleanup).
            Ok(Received::Eof) | Err(_) => return ExitCode::SUCCESS,
        };
        match msg {
            ToWorker::Fs { id, op } => {
                let (link, root) = (link.clone(), root.clone());
                rt.spawn_blocking(move || {
                    let (result, fd) = match crate::fs::run(&root, op) {
                        Ok(done) => {
                            let (reply, fd) = FsReply::split(done);
                            (Ok(reply), fd)
                        }
                        Err(e) => (Err(e), None),
                    };
                    let raw: Vec<RawFd> = fd.iter().map(|f| f.as_raw_fd()).collect();
                    if let Err(e) = link.send(&FromWorker::FsDone { id, result }, &raw) {
                        // Too large for one packet (a huge directory): say
                        // so rather than leave the caller to its deadline.
                        let result = Err(FsError::Io(format!(
                            "the result is too large to return ({e}); list or walk a smaller directory"
                        )));
                        let _ = link.send(&FromWorker::FsDone { id, result }, &[]);
                    }
                });
            }
            ToWorker::Spawn { id, spec } => {
                let _g = link.lock.lock();
                let spawned = vfork::spawn(&spec, &spawner).and_then(|s| {
                    // Not reaped yet: the reap thread takes the lock we hold
                    // before it reaps, so this pidfd names our child.
                    let pidfd = match s.pidfd {
                        Some(fd) => fd,
                        None => crate::spawn::pidfd_open(s.pid, 0)?,
                    };
                    let mut all = vec![pidfd];
                    all.extend(s.fds.into_vec());
                    Ok((s.pid, all))
                });
                let (reply, fds) = match spawned {
                    // The reap thread waits for it.
                    Ok((pid, fds)) => (FromWorker::Spawned { id, pid }, fds),
                    Err(e) => (failed(id, &e), Vec::new()),
                };
                let raw: Vec<RawFd> = fds.iter().map(|f| f.as_raw_fd()).collect();
                if link::send(&link.sock, &reply, &raw).is_err() {
                    return ExitCode::SUCCESS;
                }
                drop(fds);
                let _ = wake_tx.send(());
            }
        }
    }
}

fn failed(id: u64, e: &io::Error) -> FromWorker {
    FromWorker::SpawnFailed {
        id,
        errno: e.raw_os_error(),
        message: e.to_string(),
    }
}

/// Reap every child and report its exit. A child is seen exited first
/// (`WNOWAIT`), then reaped under the link lock: a spawn in progress has
/// taken its child's pidfd by then, so no pidfd ever names a reused pid.
fn reap_loop(link: &Link, wake: &std::sync::mpsc::Receiver<()>) {
    use nix::sys::wait::{Id, WaitPidFlag, WaitStatus, waitid, waitpid};
    loop {
        let pid = match waitid(Id::All, WaitPidFlag::WEXITED | WaitPidFlag::WNOWAIT) {
            Ok(status) => match status.pid() {
                Some(pid) => pid,
                None => continue,
            },
            Err(nix::errno::Errno::EINTR) => continue,
            // No children: wait for the next spawn.
            Err(_) => {
                if wake.recv().is_err() {
                    return;
                }
                continue;
            }
        };
        let _g = link.lock.lock();
        let ended = match waitpid(pid, None) {
            Ok(WaitStatus::Exited(_, code)) => Ended::Code(code),
            Ok(WaitStatus::Signaled(_, sig, _)) => Ended::Signal(sig as i32),
            Ok(_) | Err(_) => continue,
        };
        let _ = link::send(
            &link.sock,
            &FromWorker::Exited {
                pid: pid.as_raw(),
                ended,
            },
            &[],
        );
    }
}
