//! One spawn model for every path a process can take.
//!
//! - [`SpawnSpec`] is what to run, already validated and with its final
//!   environment; it is also the message that crosses the worker link.
//! - [`vfork::spawn`] runs it from a tenant's worker (the default) without
//!   copying the worker: pipes or a PTY, the child's own session (the PTY
//!   its controlling terminal), its own cgroup joined before exec.
//! - [`spawn_here`] forks and execs it with std's `Command` where a
//!   sandbox must be applied between fork and exec (a worker itself) or,
//!   with workers off, from the gateway.
//! - [`Spawner`] is the seam the process table uses: [`LocalSpawner`] here,
//!   the worker client (module `worker`) in the tenant's worker. Both return
//!   the same [`Child`]: its pid, its streams as async I/O, and where its
//!   [`Ended`] comes from.
//!
//! Dying with the gateway is the reaper sidecar's job
//! (module `isolation::reaper`), which also covers grandchildren, unlike
//! `PR_SET_PDEATHSIG`.

#![allow(unsafe_code)]

pub(crate) mod into_cgroup;
pub mod vfork;

use std::collections::HashMap;
use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd as _, OwnedFd, RawFd};
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;

use bytes::BytesMut;
use serde::{Deserialize, Serialize};
use tokio::io::unix::AsyncFd;
use tokio::net::unix::pipe;
use tokio::sync::oneshot;

use crate::isolation::cgroup::join_self;
use crate::isolation::sandbox::Sandbox;

/// Initial PTY size, as the reference.
pub const PTY_ROWS: u16 = 24;
pub const PTY_COLS: u16 = 80;

/// What to run: validated (non-empty argv), with its final environment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SpawnSpec {
    pub argv: Vec<String>,
    pub cwd: String,
    pub env: HashMap<String, String>,
    /// Pipe mode: the child's argv[0]. PTY mode: replaces the executable
    /// and argv[0] is dropped (a reference quirk kept for compatibility).
    pub arg0: Option<String>,
    pub tty: bool,
    /// Keep a writable stdin pipe (pipe mode only; otherwise /dev/null).
    pub pipe_stdin: bool,
    /// Search path for a bare program name when `env` has no PATH (the
    /// tenant's base PATH, never the gateway's own).
    pub fallback_path: Option<String>,
    /// `cgroup.procs` files the child joins between fork and exec, before
    /// the sandbox drops its privileges.
    pub cgroups: Vec<PathBuf>,
    /// cgroup v2, in a worker: the child's own cgroup, which it is created
    /// in where the kernel can (module `into_cgroup`); `cgroups` is then
    /// not written.
    #[serde(default)]
    pub cgroup_dir: Option<PathBuf>,
}

/// A child's streams as file descriptors (what the worker passes back).
#[derive(Debug)]
pub enum ChildFds {
    Pipes {
        stdout: OwnedFd,
        stderr: OwnedFd,
        stdin: Option<OwnedFd>,
    },
    Pty {
        master: OwnedFd,
    },
}

impl ChildFds {
    /// In the order they travel over the link.
    pub fn into_vec(self) -> Vec<OwnedFd> {
        match self {
            ChildFds::Pipes {
                stdout,
                stderr,
                stdin,
            } => [Some(stdout), Some(stderr), stdin]
                .into_iter()
                .flatten()
                .collect(),
            ChildFds::Pty { master } => vec![master],
        }
    }

    /// Rebuild from the link's order; `tty` says which shape to expect.
    pub fn from_vec(tty: bool, fds: Vec<OwnedFd>) -> io::Result<ChildFds> {
        let mut fds = fds.into_iter();
        let mut next = || fds.next().ok_or_else(missing_stream);
        if tty {
            return Ok(ChildFds::Pty { master: next()? });
        }
        let (stdout, stderr) = (next()?, next()?);
        Ok(ChildFds::Pipes {
            stdout,
            stderr,
            stdin: next().ok(),
        })
    }
}

fn missing_stream() -> io::Error {
    io::Error::other("child stream was not captured")
}

/// Resolve a bare program name the way `execvp` would, through the child's
/// PATH, or, when the child has none, through `fallback` (the tenant's base
/// PATH, never the gateway's own). Names with a `/` are used as given.
pub fn resolve_program(
    program: &str,
    env: &HashMap<String, String>,
    fallback: Option<&str>,
) -> io::Result<String> {
    use std::os::unix::fs::PermissionsExt as _;
    if program.contains('/') {
        return Ok(program.to_owned());
    }
    let path = env
        .get("PATH")
        .map(String::as_str)
        .or(fallback)
        .unwrap_or("/usr/bin:/bin");
    std::env::split_paths(path)
        .map(|dir| {
            if dir.as_os_str().is_empty() {
                Path::new(".").join(program)
            } else {
                dir.join(program)
            }
        })
        .find(|p| {
            std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
        .map(|p| p.display().to_string())
        .ok_or_else(|| io::Error::from_raw_os_error(libc::ENOENT))
}

fn cstring(p: &Path) -> io::Result<CString> {
    CString::new(p.as_os_str().as_encoded_bytes())
        .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))
}

/// The executable `spec` runs (searched on its PATH) and the argv[0] it
/// gets. PTY mode: `arg0` replaces the program and argv[0] is dropped (the
/// reference's quirk). Pipe mode: `arg0` only renames argv[0].
fn program_of(spec: &SpawnSpec) -> io::Result<(String, String)> {
    let program = if spec.tty {
        spec.arg0.clone().or_else(|| spec.argv.first().cloned())
    } else {
        spec.argv.first().cloned()
    }
    .ok_or_else(|| io::Error::from(io::ErrorKind::InvalidInput))?;
    let path = resolve_program(&program, &spec.env, spec.fallback_path.as_deref())?;
    let arg0 = if spec.tty {
        program
    } else {
        spec.arg0.clone().unwrap_or(program)
    };
    Ok((path, arg0))
}

/// Fork and exec `spec` from this process: its own session (the PTY its
/// controlling terminal in PTY mode), its cgroups joined,
/// then `sandbox` applied. Returns the std child (its pid; the caller
/// decides who reaps it) and the streams to hand on.
pub fn spawn_here(
    spec: &SpawnSpec,
    sandbox: Option<&Sandbox>,
) -> io::Result<(std::process::Child, ChildFds)> {
    let (path, arg0) = program_of(spec)?;
    let mut cmd = std::process::Command::new(&path);
    cmd.args(spec.argv.iter().skip(1))
        .current_dir(&spec.cwd)
        .env_clear()
        .envs(&spec.env);
    // A gateway started from a shell's background job inherits SIGINT and
    // SIGQUIT ignored, and ignored dispositions survive exec: without this,
    // `process/signal interrupt` would do nothing. Every child starts with
    // the default dispositions.
    // SAFETY: signal() is async-signal-safe.
    unsafe {
        cmd.pre_exec(|| {
            for sig in 1..32 {
                if sig != libc::SIGKILL && sig != libc::SIGSTOP {
                    libc::signal(sig, libc::SIG_DFL);
                }
            }
            Ok(())
        });
    }
    let joins = spec
        .cgroups
        .iter()
        .map(|p| cstring(p))
        .collect::<io::Result<Vec<_>>>()?;
    let pty = if spec.tty { Some(open_pty()?) } else { None };
    if let Some((_, slave)) = &pty {
        cmd.arg0(&arg0)
            .stdin(Stdio::from(slave.try_clone()?))
            .stdout(Stdio::from(slave.try_clone()?))
            .stderr(Stdio::from(slave.try_clone()?));
        // SAFETY: setsid/ioctl only, after fork.
        unsafe {
            cmd.pre_exec(|| {
                if libc::setsid() < 0 || libc::ioctl(0, libc::TIOCSCTTY as _, 0) < 0 {
                    return Err(io::Error::last_os_error());
                }
                Ok(())
            });
        }
    } else {
        // Its own session, as from a worker (module `vfork`): no child may
        // share the gateway's controlling terminal.
        // SAFETY: setsid only, after fork.
        unsafe {
            cmd.pre_exec(|| {
                if libc::setsid() < 0 {
                    return Err(io::Error::last_os_error());
                }
                Ok(())
            });
        }
        cmd.arg0(&arg0)
            .stdin(if spec.pipe_stdin {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
    }
    if !joins.is_empty() {
        // SAFETY: open/write/close on paths prepared before fork.
        unsafe {
            cmd.pre_exec(move || joins.iter().try_for_each(|p| join_self(p)));
        }
    }
    if let Some(sb) = sandbox {
        let confine = sb.hook();
        // SAFETY: raw syscalls on data prepared before fork (see
        // `Sandbox::hook`); registered after the cgroup join, which needs root.
        unsafe {
            cmd.pre_exec(confine);
        }
    }
    let mut child = cmd.spawn()?;
    drop(cmd);
    let fds = match pty {
        Some((master, _slave)) => ChildFds::Pty { master },
        None => ChildFds::Pipes {
            stdout: child.stdout.take().ok_or_else(missing_stream)?.into(),
            stderr: child.stderr.take().ok_or_else(missing_stream)?.into(),
            stdin: child.stdin.take().map(OwnedFd::from),
        },
    };
    Ok((child, fds))
}

/// A PTY pair at the reference's initial size, both ends opened
/// close-on-exec. openpty(3) opens them inheritable and a later fcntl closes
/// the gap too late: a child forked meanwhile by another thread would keep
/// the terminal open (its reader would never see the hang-up).
fn open_pty() -> io::Result<(OwnedFd, OwnedFd)> {
    let flags = libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC;
    // SAFETY: opens a new descriptor, owned below.
    let m = unsafe { libc::open(c"/dev/ptmx".as_ptr(), flags) };
    if m < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: just opened for us.
    let master = unsafe { OwnedFd::from_raw_fd(m) };
    let mut unlock: libc::c_int = 0;
    // SAFETY: TIOCSPTLCK with a valid int on a pty master.
    if unsafe { libc::ioctl(m, libc::TIOCSPTLCK, &mut unlock) } < 0 {
        return Err(io::Error::last_os_error());
    }
    // TIOCGPTPEER (Linux 4.13) opens the peer without a path lookup.
    // SAFETY: TIOCGPTPEER returns a new descriptor, owned below.
    let s = unsafe { libc::ioctl(m, libc::TIOCGPTPEER, flags) };
    let slave = if s >= 0 {
        // SAFETY: just opened for us.
        unsafe { OwnedFd::from_raw_fd(s) }
    } else {
        let mut name = [0 as libc::c_char; 64];
        // SAFETY: a buffer of the given length on a pty master.
        if unsafe { libc::ptsname_r(m, name.as_mut_ptr(), name.len()) } != 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: ptsname_r wrote a NUL-terminated path.
        let s = unsafe { libc::open(name.as_ptr(), flags) };
        if s < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: just opened for us.
        unsafe { OwnedFd::from_raw_fd(s) }
    };
    let size = libc::winsize {
        ws_row: PTY_ROWS,
        ws_col: PTY_COLS,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCSWINSZ with a valid winsize on a pty master.
    if unsafe { libc::ioctl(m, libc::TIOCSWINSZ, &size) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok((master, slave))
}

/// How a process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Ended {
    Code(i32),
    Signal(i32),
    /// Its worker died first and took it along.
    WorkerDied,
}

impl Ended {
    /// The signal that ended the process, when one did.
    pub fn signal(self) -> Option<i32> {
        match self {
            Ended::Code(_) => None,
            Ended::Signal(s) => Some(s),
            Ended::WorkerDied => Some(libc::SIGKILL),
        }
    }
}

impl From<std::process::ExitStatus> for Ended {
    fn from(s: std::process::ExitStatus) -> Ended {
        use std::os::unix::process::ExitStatusExt as _;
        match (s.code(), s.signal()) {
            (Some(c), _) => Ended::Code(c),
            (None, Some(sig)) => Ended::Signal(sig),
            (None, None) => Ended::Signal(libc::SIGKILL),
        }
    }
}

/// A spawned process as the process table sees it.
pub struct Child {
    pub pid: i32,
    /// A pidfd of the child, taken before it could be reaped: signals go
    /// through it (module `isolation::signal`), never through `pid`.
    pub pidfd: OwnedFd,
    pub io: ChildIo,
    pub exit: ExitWait,
}

/// `pidfd_open` for a child that cannot have been reaped yet.
pub fn pidfd_open(pid: i32, flags: libc::c_int) -> io::Result<OwnedFd> {
    // SAFETY: a plain syscall; the fd is owned below.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, flags) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel just returned this fd.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// What a pidfd's fdinfo says of the process it names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PidfdInfo {
    /// Its pid in our PID namespace: -1 once it has been reaped (Linux
    /// 5.11 on; before, the old number stays), 0 if it is not visible
    /// from our namespace.
    pub pid: i32,
    /// Its pid in its own PID namespace (the last `NSpid:` field), where
    /// the kernel says (Linux 5.5 on) and it is alive.
    pub ns_pid: Option<i32>,
}

/// Read a pidfd's fdinfo. `None`: `fd` is not a pidfd (only a pidfd's
/// fdinfo has a `Pid:` line; a `/proc/PID` directory, which
/// `pidfd_send_signal` also takes, has none).
pub fn pidfd_info(fd: &impl AsRawFd) -> Option<PidfdInfo> {
    let info = std::fs::read_to_string(format!("/proc/self/fdinfo/{}", fd.as_raw_fd())).ok()?;
    let field = |name: &str| info.lines().find_map(|l| l.strip_prefix(name));
    let pid = field("Pid:")?.trim().parse::<i32>().ok()?;
    let ns_pid = field("NSpid:")
        .and_then(|l| l.split_whitespace().last())
        .and_then(|p| p.parse::<i32>().ok())
        .filter(|p| *p > 0);
    Some(PidfdInfo { pid, ns_pid })
}

/// The pid (in our PID namespace) of the process a pidfd names, from its
/// fdinfo; `None` once it has been reaped (or where the kernel does not
/// say).
pub fn pidfd_pid(fd: &OwnedFd) -> Option<i32> {
    pidfd_info(fd).map(|i| i.pid).filter(|p| *p > 0)
}

/// Whether the process a pidfd names still exists (alive or a zombie not
/// yet reaped): `pidfd_send_signal` with signal 0, which delivers nothing.
/// `Ok(false)` once it has been reaped; its number may then be anyone's,
/// but the pidfd can never reach another process. An error: not a pidfd,
/// or a process outside our PID namespace and its descendants.
pub fn pidfd_exists(fd: &impl AsRawFd) -> io::Result<bool> {
    // SAFETY: a syscall on a descriptor the caller holds, with no siginfo.
    let r = unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            fd.as_raw_fd(),
            0,
            std::ptr::null::<libc::siginfo_t>(),
            0,
        )
    };
    if r == 0 {
        return Ok(true);
    }
    let e = io::Error::last_os_error();
    match e.raw_os_error() {
        Some(libc::ESRCH) => Ok(false),
        // It exists; we may not signal it (a gateway without CAP_KILL).
        Some(libc::EPERM) => Ok(true),
        _ => Err(e),
    }
}

/// A child's streams, ready for async I/O.
pub enum ChildIo {
    Pipes {
        stdin: Option<pipe::Sender>,
        stdout: pipe::Receiver,
        stderr: pipe::Receiver,
    },
    Pty(Arc<Pty>),
}

impl ChildIo {
    pub fn from_fds(fds: ChildFds) -> io::Result<ChildIo> {
        Ok(match fds {
            ChildFds::Pipes {
                stdout,
                stderr,
                stdin,
            } => ChildIo::Pipes {
                stdin: stdin.map(pipe::Sender::from_owned_fd).transpose()?,
                stdout: pipe::Receiver::from_owned_fd(stdout)?,
                stderr: pipe::Receiver::from_owned_fd(stderr)?,
            },
            ChildFds::Pty { master } => ChildIo::Pty(Arc::new(Pty::new(master)?)),
        })
    }
}

/// Where a child's end is learned.
pub enum ExitWait {
    /// Our own child: its pidfd turns readable at exit, then it is reaped.
    Local(LocalExit),
    /// Spawned by a worker, which reaps it and reports.
    Worker(oneshot::Receiver<Ended>),
}

impl ExitWait {
    /// Cancel-safe: the state lives in `self`.
    pub async fn wait(&mut self) -> Ended {
        match self {
            ExitWait::Local(l) => l.wait().await,
            ExitWait::Worker(rx) => rx.await.unwrap_or(Ended::WorkerDied),
        }
    }
}

/// A child of this process, waited for through its pidfd (so nothing here
/// reaps other children, such as workers or the reaper sidecar).
pub struct LocalExit {
    child: std::process::Child,
    pidfd: AsyncFd<OwnedFd>,
    ended: Option<Ended>,
}

impl LocalExit {
    /// Also returns a second pidfd, for signals.
    fn new(child: std::process::Child) -> io::Result<(LocalExit, OwnedFd)> {
        let pid = i32::try_from(child.id()).map_err(io::Error::other)?;
        // Our own child, not reaped until `wait` (nothing else here reaps).
        let fd = pidfd_open(pid, libc::O_NONBLOCK)?;
        let for_signals = fd.try_clone()?;
        Ok((
            LocalExit {
                child,
                pidfd: register(fd, tokio::io::Interest::READABLE)?,
                ended: None,
            },
            for_signals,
        ))
    }

    async fn wait(&mut self) -> Ended {
        loop {
            if let Some(e) = self.ended {
                return e;
            }
            match self.child.try_wait() {
                Ok(Some(status)) => self.ended = Some(status.into()),
                Ok(None) => match self.pidfd.readable().await {
                    Ok(mut guard) => guard.clear_ready(),
                    Err(_) => self.ended = Some(Ended::Signal(libc::SIGKILL)),
                },
                Err(_) => self.ended = Some(Ended::Signal(libc::SIGKILL)),
            }
        }
    }
}

/// Register an owned fd with the runtime's reactor (in a runtime only).
fn register(fd: OwnedFd, interest: tokio::io::Interest) -> io::Result<AsyncFd<OwnedFd>> {
    // SAFETY: the `OwnedFd` keeps the descriptor open, and always names the
    // same one, for as long as the `AsyncFd` owns it.
    unsafe { AsyncFd::register_with_interest(fd, interest) }.map_err(|e| e.into_parts().1)
}

/// A spawn under way.
pub type SpawnFuture<'a> =
    std::pin::Pin<Box<dyn std::future::Future<Output = io::Result<Child>> + Send + 'a>>;

/// Spawns a tenant's processes; see the module docs.
pub trait Spawner: Send + Sync {
    fn spawn(&self, spec: SpawnSpec) -> SpawnFuture<'_>;
}

/// Spawns in the gateway itself (workers off): each child applies the
/// tenant's sandbox between fork and exec.
pub struct LocalSpawner {
    pub sandbox: Option<Arc<Sandbox>>,
}

impl Spawner for LocalSpawner {
    fn spawn(&self, spec: SpawnSpec) -> SpawnFuture<'_> {
        Box::pin(std::future::ready(self.spawn_now(&spec)))
    }
}

impl LocalSpawner {
    fn spawn_now(&self, spec: &SpawnSpec) -> io::Result<Child> {
        let (child, fds) = spawn_here(spec, self.sandbox.as_deref())?;
        let pid = i32::try_from(child.id()).map_err(io::Error::other)?;
        let (exit, pidfd) = LocalExit::new(child)?;
        Ok(Child {
            pid,
            pidfd,
            io: ChildIo::from_fds(fds)?,
            exit: ExitWait::Local(exit),
        })
    }
}

/// A PTY master for async reads and writes (non-blocking fd).
pub struct Pty {
    fd: AsyncFd<OwnedFd>,
}

impl Pty {
    fn new(master: OwnedFd) -> io::Result<Pty> {
        nix::fcntl::fcntl(
            &master,
            nix::fcntl::FcntlArg::F_SETFL(nix::fcntl::OFlag::O_NONBLOCK),
        )
        .map_err(io::Error::from)?;
        Ok(Pty {
            fd: register(
                master,
                tokio::io::Interest::READABLE | tokio::io::Interest::WRITABLE,
            )?,
        })
    }

    /// Read into `buf`'s spare capacity. `Ok(0)` at the end: the last slave
    /// fd closed (the kernel says EIO).
    pub async fn read(&self, buf: &mut BytesMut) -> io::Result<usize> {
        loop {
            let mut guard = self.fd.readable().await?;
            let spare = buf.spare_capacity_mut();
            // SAFETY: read(2) into the spare capacity; the length read is
            // committed below only on success.
            let r = guard.try_io(|fd| {
                let n =
                    unsafe { libc::read(fd.as_raw_fd(), spare.as_mut_ptr().cast(), spare.len()) };
                if n < 0 {
                    Err(io::Error::last_os_error())
                } else {
                    Ok(n as usize)
                }
            });
            match r {
                Ok(Ok(n)) => {
                    // SAFETY: the kernel initialised `n` bytes.
                    unsafe { buf.set_len(buf.len() + n) };
                    return Ok(n);
                }
                Ok(Err(e)) if e.raw_os_error() == Some(libc::EIO) => return Ok(0),
                Ok(Err(e)) => return Err(e),
                Err(_would_block) => continue,
            }
        }
    }

    /// Write all of `data` (waits while the terminal's buffer is full).
    pub async fn write_all(&self, mut data: &[u8]) -> io::Result<()> {
        while !data.is_empty() {
            let mut guard = self.fd.writable().await?;
            match guard.try_io(|fd| {
                // SAFETY: write(2) from a valid slice.
                let n = unsafe { libc::write(fd.as_raw_fd(), data.as_ptr().cast(), data.len()) };
                if n < 0 {
                    Err(io::Error::last_os_error())
                } else {
                    Ok(n as usize)
                }
            }) {
                Ok(Ok(n)) => data = &data[n..],
                Ok(Err(e)) => return Err(e),
                Err(_would_block) => {}
            }
        }
        Ok(())
    }

    pub fn resize(&self, rows: u16, cols: u16) -> io::Result<()> {
        let size = libc::winsize {
            ws_row: rows,
            ws_col: cols,
            ws_xpixel: 0,
            ws_ypixel: 0,
        };
        // SAFETY: TIOCSWINSZ with a valid winsize on an open pty master.
        let r = unsafe { libc::ioctl(self.fd.as_raw_fd(), libc::TIOCSWINSZ, &size) };
        if r < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(())
        }
    }
}

/// Pipe capacity asked for the child's stdout: fewer, larger reads for bulk
/// output. Best effort (the kernel caps it at `fs.pipe-max-size`).
pub const STDOUT_PIPE_BYTES: i32 = 1024 * 1024;

/// Reads this large mean the default 64 KiB pipe was full: time to grow it.
pub const GROW_PIPE_AFTER_READ_BYTES: usize = 64 * 1024;

pub fn grow_pipe(fd: &impl std::os::fd::AsFd) {
    use nix::fcntl::{FcntlArg, fcntl};
    if let Err(e) = fcntl(fd, FcntlArg::F_SETPIPE_SZ(STDOUT_PIPE_BYTES)) {
        tracing::debug!(error = %e, "F_SETPIPE_SZ failed");
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn spec(argv: &[&str], tty: bool) -> SpawnSpec {
        SpawnSpec {
            argv: argv.iter().map(|s| (*s).to_owned()).collect(),
            cwd: "/".to_owned(),
            env: HashMap::new(),
            arg0: None,
            tty,
            pipe_stdin: false,
            fallback_path: Some("/usr/bin:/bin".to_owned()),
            cgroups: Vec::new(),
            cgroup_dir: None,
        }
    }

    #[tokio::test]
    async fn a_local_child_reports_its_code_and_signal() {
        let spawner = LocalSpawner { sandbox: None };
        let mut c = spawner
            .spawn(spec(&["sh", "-c", "exit 7"], false))
            .await
            .unwrap();
        assert_eq!(c.exit.wait().await, Ended::Code(7));
        let mut c = spawner
            .spawn(spec(&["sh", "-c", "kill -9 $$"], false))
            .await
            .unwrap();
        assert_eq!(c.exit.wait().await, Ended::Signal(libc::SIGKILL));
    }

    #[tokio::test]
    async fn a_pty_child_sees_a_terminal_and_its_output_ends() {
        let spawner = LocalSpawner { sandbox: None };
        let mut c = spawner
            .spawn(spec(&["sh", "-c", "test -t 0 && stty size"], true))
            .await
            .unwrap();
        let ChildIo::Pty(pty) = &c.io else {
            panic!("not a pty")
        };
        let mut out = BytesMut::with_capacity(4096);
        while pty.read(&mut out).await.unwrap() > 0 {
            out.reserve(4096);
        }
        assert_eq!(String::from_utf8_lossy(&out).trim(), "24 80");
        assert_eq!(c.exit.wait().await, Ended::Code(0));
    }

    #[test]
    fn fds_round_trip_the_link_order() {
        let (a, b) = nix::unistd::pipe().unwrap();
        let fds = ChildFds::from_vec(false, vec![a, b]).unwrap();
        assert!(matches!(fds, ChildFds::Pipes { stdin: None, .. }));
        assert_eq!(fds.into_vec().len(), 2);
        assert!(ChildFds::from_vec(false, Vec::new()).is_err());
    }
}
