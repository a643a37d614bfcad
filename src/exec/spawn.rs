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

use portable_pty::{CommandBuilder, MasterPty, PtySize, native_pty_system};

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
fn resolve_program(
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

/// A pipe-mode child with its streams taken out.
pub struct PipeChild {
    pub child: tokio::process::Child,
    pub pid: i32,
    pub stdin: Option<tokio::process::ChildStdin>,
    pub stdout: tokio::process::ChildStdout,
    pub stderr: tokio::process::ChildStderr,
}

/// A PTY child and its master side.
pub struct PtyChild {
    pub child: Box<dyn portable_pty::Child + Send + Sync>,
    pub pid: i32,
    pub master: Box<dyn MasterPty + Send>,
    pub reader: Box<dyn io::Read + Send>,
    pub writer: Box<dyn io::Write + Send>,
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
    let stdin = child.stdin.take();
    let stdout = child.stdout.take().ok_or_else(missing_stream)?;
    let stderr = child.stderr.take().ok_or_else(missing_stream)?;
    Ok(PipeChild {
        child,
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
        child,
        pid,
        master: pair.master,
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
