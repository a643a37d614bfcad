//! Spawning children: pipes through tokio, PTYs through portable-pty
//! (PROTOCOL.md §5.1).
//!
//! Both make the child a session leader (its pid is its process-group id) so
//! that terminate reaches the whole tree. Pipe children also get
//! `PR_SET_PDEATHSIG(SIGKILL)` so they die with the gateway.

#![allow(unsafe_code)]

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

/// portable-pty resolves bare names only through the child's PATH; when the
/// child has none, resolve against `fallback` so `{"env":{}}` still finds `sh`.
fn resolve_program(program: &str, env: &HashMap<String, String>, fallback: Option<&str>) -> String {
    if program.contains('/') || env.contains_key("PATH") {
        return program.to_owned();
    }
    let Some(path) = fallback else {
        return program.to_owned();
    };
    std::env::split_paths(path)
        .map(|dir| dir.join(program))
        .find(|p| p.is_file())
        .map_or_else(|| program.to_owned(), |p| p.display().to_string())
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

pub fn spawn_pipe(spec: &SpawnSpec) -> io::Result<PipeChild> {
    let (program, args) = spec
        .argv
        .split_first()
        .ok_or_else(|| io::Error::from(io::ErrorKind::InvalidInput))?;
    let mut cmd = tokio::process::Command::new(program);
    cmd.args(args)
        .current_dir(&spec.cwd)
        .env_clear()
        .envs(&spec.env)
        .stdin(if spec.pipe_stdin {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Some(arg0) = &spec.arg0 {
        cmd.arg0(arg0);
    }
    let parent = std::process::id() as libc::pid_t;
    // SAFETY: the closure runs between fork and exec and calls only
    // async-signal-safe libc functions (setsid, prctl, getppid); it allocates
    // nothing and touches no locks.
    unsafe {
        cmd.pre_exec(move || {
            if libc::setsid() == -1 {
                return Err(io::Error::last_os_error());
            }
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong) == -1 {
                return Err(io::Error::last_os_error());
            }
            // The gateway may have died between fork and prctl.
            if libc::getppid() != parent {
                return Err(io::Error::from_raw_os_error(libc::ESRCH));
            }
            Ok(())
        });
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
pub fn spawn_pty(spec: &SpawnSpec) -> Result<PtyChild, String> {
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
    let program = resolve_program(&program, &spec.env, spec.fallback_path.as_deref());
    let mut builder = CommandBuilder::new(program);
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
