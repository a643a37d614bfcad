//! Spawning children: pipes through tokio, PTYs through portable-pty
//! (PROTOCOL.md §5.1).
//!
//! Both make the child a process-group leader (its pid is its group id) so
//! that terminate reaches the whole tree.
//!
//! Without isolation layers, pipe children are spawned so that std can use
//! `posix_spawn` (vfork) rather than `fork`: no `pre_exec` hook, and the
//! program resolved to a path here. With a cgroup or a sandbox the child
//! needs a `pre_exec` step, so std forks: part of the measured isolation
//! cost (`exec-gateway bench`). Dying with the
//! gateway is the reaper sidecar's job (`exec::reaper`), which also covers
//! grandchildren, unlike `PR_SET_PDEATHSIG`.

use std::collections::HashMap;
use std::io;
use std::path::Path;
use std::process::Stdio;

use std::os::fd::{AsRawFd as _, OwnedFd};

use portable_pty::{CommandBuilder, MasterPty, PtySize, native_pty_system};
use tokio::net::unix::pipe;
use tokio::sync::oneshot;

use super::worker::WorkerExit;

/// Initial PTY size, as the reference.
pub const PTY_ROWS: u16 = 24;
pub const PTY_COLS: u16 = 80;

/// What to run; already validated (non-empty argv) and with the final env.
#[derive(Debug, Clone)]
pub struct SpawnSpec {
    pub argv: Vec<String>,
    pub cwd: String,
    pub env: HashMap<String, String>,
    pub arg0: Option<String>,
    pub pipe_stdin: bool,
    /// Search path for a bare program name when `env` has no PATH (the
    /// tenant's base PATH; the reference falls back to a default path too).
    pub fallback_path: Option<String>,
}

/// Resolve a bare program name the way `execvp` would, through the child's
/// PATH, or, when the child has none, through `fallback` (the tenant's base
/// PATH, never the gateway's own). Names with a `/` are used as given.
pub(crate) fn resolve_program(
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

/// A pipe-mode child with its streams taken out (spawned here or by the
/// tenant's worker, which passed the pipes back).
pub struct PipeChild {
    pub exit: ExitWait,
    pub pid: i32,
    pub stdin: Option<pipe::Sender>,
    pub stdout: pipe::Receiver,
    pub stderr: pipe::Receiver,
}

/// How a process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    Code(i32),
    Signal,
    /// Its worker died (and took it along).
    WorkerDied,
}

/// Where a child's exit comes from.
pub enum ExitWait {
    Local(tokio::process::Child),
    Worker(oneshot::Receiver<WorkerExit>),
}

impl ExitWait {
    /// Cancel-safe: both arms keep their state in `self`.
    pub async fn wait(&mut self) -> Ended {
        match self {
            ExitWait::Local(c) => match c.wait().await.ok().and_then(|s| s.code()) {
                Some(code) => Ended::Code(code),
                None => Ended::Signal,
            },
            ExitWait::Worker(rx) => match rx.await {
                Ok(WorkerExit::Code(c)) => Ended::Code(c),
                Ok(WorkerExit::Signal(_)) => Ended::Signal,
                Ok(WorkerExit::WorkerDied) | Err(_) => Ended::WorkerDied,
            },
        }
    }
}

/// A PTY child and its master side.
pub struct PtyChild {
    pub exit: PtyExit,
    pub pid: i32,
    pub master: PtyMaster,
    pub reader: Box<dyn io::Read + Send>,
    pub writer: Box<dyn io::Write + Send>,
}

pub enum PtyExit {
    Local(Box<dyn portable_pty::Child + Send + Sync>),
    Worker(ExitWait),
}

/// The master side: portable-pty's, or a raw fd from the worker.
pub enum PtyMaster {
    Local(Box<dyn MasterPty + Send>),
    Fd(OwnedFd),
}

impl PtyMaster {
    pub fn resize(&self, rows: u16, cols: u16) -> io::Result<()> {
        match self {
            PtyMaster::Local(m) => m
                .resize(PtySize {
                    rows,
                    cols,
                    pixel_width: 0,
                    pixel_height: 0,
                })
                .map_err(|e| io::Error::other(e.to_string())),
            PtyMaster::Fd(fd) => {
                let size = libc::winsize {
                    ws_row: rows,
                    ws_col: cols,
                    ws_xpixel: 0,
                    ws_ypixel: 0,
                };
                // SAFETY: TIOCSWINSZ with a valid winsize on an open pty master.
                #[allow(unsafe_code)]
                let r = unsafe { libc::ioctl(fd.as_raw_fd(), libc::TIOCSWINSZ, &size) };
                if r < 0 {
                    Err(io::Error::last_os_error())
                } else {
                    Ok(())
                }
            }
        }
    }
}

/// Ask the tenant's worker (already confined: only the process's own
/// cgroup is joined per spawn) to spawn; the fds it passes back are the
/// child's streams. A missing cwd fails in the worker's chdir.
fn request_worker(
    spec: &SpawnSpec,
    tty: bool,
    cgroup: Option<&super::cgroup::ProcessCgroup>,
    worker: &super::worker::WorkerConn,
) -> io::Result<super::worker::Spawned> {
    worker.spawn(super::worker::SpawnRequest {
        argv: spec.argv.clone(),
        cwd: spec.cwd.clone(),
        env: spec.env.clone(),
        arg0: spec.arg0.clone(),
        pipe_stdin: spec.pipe_stdin,
        tty,
        fallback_path: spec.fallback_path.clone(),
        cgroup: cgroup.and_then(|c| c.procs_paths().into_iter().next()),
    })
}

/// Spawn with pipes through the tenant's worker.
pub fn spawn_pipe_in_worker(
    spec: &SpawnSpec,
    cgroup: Option<&super::cgroup::ProcessCgroup>,
    worker: &super::worker::WorkerConn,
) -> io::Result<PipeChild> {
    let s = request_worker(spec, false, cgroup, worker)?;
    let mut fds = s.fds.into_iter();
    let stdout = pipe::Receiver::from_owned_fd(fds.next().ok_or_else(missing_stream)?)?;
    let stderr = pipe::Receiver::from_owned_fd(fds.next().ok_or_else(missing_stream)?)?;
    let stdin = fds.next().map(pipe::Sender::from_owned_fd).transpose()?;
    Ok(PipeChild {
        exit: ExitWait::Worker(s.exit),
        pid: s.pid,
        stdin,
        stdout,
        stderr,
    })
}

/// Spawn under a PTY through the tenant's worker (it passes the master).
pub fn spawn_pty_in_worker(
    spec: &SpawnSpec,
    cgroup: Option<&super::cgroup::ProcessCgroup>,
    worker: &super::worker::WorkerConn,
) -> io::Result<PtyChild> {
    let s = request_worker(spec, true, cgroup, worker)?;
    let master = s.fds.into_iter().next().ok_or_else(missing_stream)?;
    let reader = std::fs::File::from(master.try_clone()?);
    let writer = std::fs::File::from(master.try_clone()?);
    Ok(PtyChild {
        exit: PtyExit::Worker(ExitWait::Worker(s.exit)),
        pid: s.pid,
        master: PtyMaster::Fd(master),
        reader: Box::new(reader),
        writer: Box::new(writer),
    })
}

fn missing_stream() -> io::Error {
    io::Error::other("child stream was not captured")
}

/// Spawn with pipes. With a cgroup, the child joins it before exec (which
/// makes std fork rather than posix_spawn: the measured cost of the layer).
#[allow(unsafe_code)]
pub fn spawn_pipe(
    spec: &SpawnSpec,
    cgroup: Option<&super::cgroup::ProcessCgroup>,
    sandbox: Option<&super::sandbox::Sandbox>,
) -> io::Result<PipeChild> {
    let (program, args) = spec
        .argv
        .split_first()
        .ok_or_else(|| io::Error::from(io::ErrorKind::InvalidInput))?;
    let path = resolve_program(program, &spec.env, spec.fallback_path.as_deref())?;
    let mut cmd = tokio::process::Command::new(&path);
    cmd.args(args)
        // argv[0] stays what the client asked for (or its `arg0`), as with execvp.
        .arg0(spec.arg0.as_deref().unwrap_or(program))
        .current_dir(&spec.cwd)
        .env_clear()
        .envs(&spec.env)
        .stdin(if spec.pipe_stdin {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        // Own process group: terminate and signals go to `-pgid`.
        .process_group(0);
    if let Some(cg) = cgroup {
        let join = cg.joiner();
        // SAFETY: the closure only performs open/write/close syscalls on
        // paths computed before fork (see `ProcessCgroup::joiner`).
        unsafe {
            cmd.pre_exec(join);
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
    let pid = child
        .id()
        .and_then(|p| i32::try_from(p).ok())
        .ok_or_else(missing_stream)?;
    let stdin = match child.stdin.take() {
        Some(s) => Some(pipe::Sender::from_owned_fd(s.into_owned_fd()?)?),
        None => None,
    };
    let stdout = child.stdout.take().ok_or_else(missing_stream)?;
    let stdout = pipe::Receiver::from_owned_fd(stdout.into_owned_fd()?)?;
    let stderr = child.stderr.take().ok_or_else(missing_stream)?;
    let stderr = pipe::Receiver::from_owned_fd(stderr.into_owned_fd()?)?;
    Ok(PipeChild {
        exit: ExitWait::Local(child),
        pid,
        stdin,
        stdout,
        stderr,
    })
}

/// Spawn under a PTY. Errors are the library's text (the reference shows it
/// as a -32603 message).
/// With a cgroup or a sandbox, the PTY child is `exec-gateway
/// sandbox-exec`, which joins and confines itself before exec'ing the
/// program (portable-pty offers no pre-exec hook).
pub fn spawn_pty(
    spec: &SpawnSpec,
    cgroup: Option<&super::cgroup::ProcessCgroup>,
    sandbox: Option<&super::sandbox::Sandbox>,
) -> Result<PtyChild, String> {
    // portable-pty silently falls back to $HOME for a missing cwd: refuse it
    // the way a pipe spawn would.
    if !Path::new(&spec.cwd).is_dir() {
        return Err(io::Error::from_raw_os_error(libc::ENOENT).to_string());
    }
    let pair = native_pty_system()
        .openpty(PtySize {
            rows: PTY_ROWS,
            cols: PTY_COLS,
            pixel_width: 0,
            pixel_height: 0,
        })
        .map_err(|e| e.to_string())?;
    // Reference quirk kept for compatibility: in TTY mode `arg0` replaces
    // the executable and argv[0] is dropped.
    let program = spec
        .arg0
        .clone()
        .or_else(|| spec.argv.first().cloned())
        .ok_or_else(|| "argv must not be empty".to_owned())?;
    // portable-pty resolves bare names only through the child's PATH; with
    // none it fails where the reference finds `sh`: resolve it here.
    let program = if spec.env.contains_key("PATH") {
        program
    } else {
        resolve_program(&program, &spec.env, spec.fallback_path.as_deref()).unwrap_or(program)
    };
    let mut builder = if cgroup.is_none() && sandbox.is_none() {
        CommandBuilder::new(program)
    } else {
        let exe = std::env::current_exe().map_err(|e| format!("sandbox-exec: {e}"))?;
        // A missing program must fail the start, not the shim's exec.
        let program = resolve_program(&program, &spec.env, spec.fallback_path.as_deref())
            .map_err(|e| e.to_string())?;
        let mut b = CommandBuilder::new(exe);
        b.arg("sandbox-exec");
        for p in cgroup.map(|c| c.procs_paths()).unwrap_or_default() {
            b.arg("--cgroup");
            b.arg(p);
        }
        for a in sandbox.map(|s| s.spec.to_args()).unwrap_or_default() {
            b.arg(a);
        }
        b.arg("--");
        b.arg(program);
        b
    };
    builder.args(spec.argv.iter().skip(1));
    builder.cwd(&spec.cwd);
    builder.env_clear();
    for (k, v) in &spec.env {
        builder.env(k, v);
    }
    let child = pair
        .slave
        .spawn_command(builder)
        .map_err(|e| e.to_string())?;
    drop(pair.slave);
    let pid = child
        .process_id()
        .and_then(|p| i32::try_from(p).ok())
        .ok_or_else(|| "spawned pty child has no pid".to_owned())?;
    let reader = pair.master.try_clone_reader().map_err(|e| e.to_string())?;
    let writer = pair.master.take_writer().map_err(|e| e.to_string())?;
    Ok(PtyChild {
        exit: PtyExit::Local(child),
        pid,
        master: PtyMaster::Local(pair.master),
        reader,
        writer,
    })
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
