//! Spawning with `clone(CLONE_VM | CLONE_VFORK)`, the way glibc's
//! `posix_spawn` does, for a tenant's worker: the child runs in the
//! worker's memory until it execs, so nothing is copied. A `fork` copies
//! the worker's page tables, shoots down the TLBs of its other threads,
//! and then takes a copy-on-write fault on every page either side touches
//! before the exec throws the copy away: in `perf`, 40% of the worker's
//! CPU per spawn of `true`.
//!
//! `posix_spawn` itself cannot be used: the child must join its own cgroup
//! between fork and exec (a process that forks before it is moved would
//! leave a grandchild outside the cgroup that `terminate` kills).
//!
//! The child shares the parent's memory, so between `clone` and `execve`
//! it runs only raw, async-signal-safe system calls on data the parent
//! prepared (C strings, pointer arrays, descriptors), allocates nothing and
//! takes no lock; the parent thread is suspended until the child execs or
//! exits, and every signal is blocked around the `clone` so no handler of
//! the parent's can run on the child's stack. A failure before the exec is
//! reported through an atomic in the parent's memory, then the child exits.

#![allow(unsafe_code)]

use std::ffi::{CString, c_void};
use std::io;
use std::os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd, RawFd};
use std::sync::atomic::{AtomicI32, Ordering};

use super::{ChildFds, SpawnSpec, cstring, open_pty, program_of};

/// The child's stack (it calls a few libc wrappers, nothing deep), above a
/// guard page.
const CHILD_STACK_BYTES: usize = 64 * 1024;
const GUARD_BYTES: usize = 4096;

/// Everything the child reads, prepared before `clone`.
struct ChildArgs {
    path: CString,
    argv: Vec<*const libc::c_char>,
    envp: Vec<*const libc::c_char>,
    cwd: CString,
    cgroups: Vec<CString>,
    /// PTY: the slave (0, 1 and 2, and the controlling terminal). Pipes:
    /// stdin (a pipe or /dev/null), stdout and stderr write ends.
    stdio: [RawFd; 3],
    tty: bool,
    /// errno of the step that failed in the child, 0 when it exec'd.
    errno: AtomicI32,
}

/// Run `spec` as a child of this process in its own session (with the PTY
/// as its controlling terminal in PTY mode), its cgroups joined.
/// Returns its pid (the caller reaps it) and the streams to hand on.
pub fn spawn(spec: &SpawnSpec) -> io::Result<(i32, ChildFds)> {
    let (path, arg0) = program_of(spec)?;
    let nul = |s: String| CString::new(s).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput));
    let argv = std::iter::once(arg0)
        .chain(spec.argv.iter().skip(1).cloned())
        .map(nul)
        .collect::<io::Result<Vec<_>>>()?;
    let env = spec
        .env
        .iter()
        .map(|(k, v)| nul(format!("{k}={v}")))
        .collect::<io::Result<Vec<_>>>()?;
    let cgroups = spec
        .cgroups
        .iter()
        .map(|p| cstring(p))
        .collect::<io::Result<Vec<_>>>()?;

    // The parent's ends (returned) and the child's (closed here once it
    // has exec'd: they are close-on-exec in the child's copy of the table).
    let (fds, child_ends) = if spec.tty {
        let (master, slave) = open_pty()?;
        let slave = above_stdio(slave)?;
        (ChildFds::Pty { master }, vec![slave])
    } else {
        let (out_r, out_w) = pipe()?;
        let (err_r, err_w) = pipe()?;
        let (stdin, stdin_r) = if spec.pipe_stdin {
            let (r, w) = pipe()?;
            (Some(w), r)
        } else {
            (None, dev_null()?)
        };
        let fds = ChildFds::Pipes {
            stdout: out_r,
            stderr: err_r,
            stdin,
        };
        let ends = vec![
            above_stdio(stdin_r)?,
            above_stdio(out_w)?,
            above_stdio(err_w)?,
        ];
        (fds, ends)
    };
    let stdio = match child_ends.as_slice() {
        [slave] => [slave.as_raw_fd(); 3],
        [i, o, e] => [i.as_raw_fd(), o.as_raw_fd(), e.as_raw_fd()],
        _ => return Err(io::Error::other("unexpected child descriptors")),
    };

    let mut args = ChildArgs {
        argv: argv
            .iter()
            .map(|a| a.as_ptr())
            .chain(std::iter::once(std::ptr::null()))
            .collect(),
        envp: env
            .iter()
            .map(|e| e.as_ptr())
            .chain(std::iter::once(std::ptr::null()))
            .collect(),
        path: nul(path)?,
        cwd: nul(spec.cwd.clone())?,
        cgroups,
        stdio,
        tty: spec.tty,
        errno: AtomicI32::new(0),
    };
    let pid = clone_vfork(&mut args)?;
    let errno = args.errno.load(Ordering::SeqCst);
    drop(child_ends);
    // `args`, `env` and the C strings outlive the child's use of them: it
    // has exec'd or exited by now (CLONE_VFORK).
    drop((args, argv, env));
    if errno != 0 {
        // It exited before exec: reap it here (the worker's reap thread
        // waits for the link lock our caller holds).
        let mut status = 0;
        // SAFETY: waits for our own child, which has exited.
        unsafe { libc::waitpid(pid, &mut status, 0) };
        return Err(io::Error::from_raw_os_error(errno));
    }
    Ok((pid, fds))
}

/// `clone` the child onto its own guarded stack with every signal blocked
/// in this thread meanwhile; returns once the child has exec'd or exited.
fn clone_vfork(args: &mut ChildArgs) -> io::Result<i32> {
    // SAFETY: a fresh anonymous mapping, unmapped below on every path.
    let stack = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            CHILD_STACK_BYTES + GUARD_BYTES,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_STACK,
            -1,
            0,
        )
    };
    if stack == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    let unmap = |stack: *mut c_void| {
        // SAFETY: the mapping made above, no longer used by anyone.
        unsafe { libc::munmap(stack, CHILD_STACK_BYTES + GUARD_BYTES) };
    };
    // SAFETY: the lowest page of our own mapping.
    if unsafe { libc::mprotect(stack, GUARD_BYTES, libc::PROT_NONE) } != 0 {
        let e = io::Error::last_os_error();
        unmap(stack);
        return Err(e);
    }
    // SAFETY: sigset_t is plain data; the sigset calls only fill them.
    let (mut all, mut old) = unsafe {
        let mut all: libc::sigset_t = std::mem::zeroed();
        let old: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        (all, old)
    };
    // SAFETY: blocks signals in this thread only; restored below. The
    // child runs `child_main` on the top of `stack` (16-byte aligned, it
    // grows down) with `args`, which lives until it has exec'd or exited:
    // CLONE_VFORK suspends this thread until then.
    let pid = unsafe {
        libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut old);
        let top = stack.cast::<u8>().add(CHILD_STACK_BYTES + GUARD_BYTES);
        let pid = libc::clone(
            child_main,
            top.cast(),
            libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD,
            std::ptr::from_mut(args).cast(),
        );
        let e = io::Error::last_os_error();
        libc::pthread_sigmask(libc::SIG_SETMASK, &old, &mut all);
        if pid < 0 { Err(e) } else { Ok(pid) }
    };
    unmap(stack);
    pid
}

/// The child, between `clone` and `execve`: raw system calls only.
extern "C" fn child_main(arg: *mut c_void) -> libc::c_int {
    // SAFETY: `arg` is the parent's `ChildArgs`, alive and unchanged while
    // this runs (the parent is suspended); only async-signal-safe calls on
    // its prepared data follow, and the child execs or `_exit`s.
    unsafe {
        let a = &*arg.cast::<ChildArgs>();
        let fail = |a: &ChildArgs| -> ! {
            let e = *libc::__errno_location();
            a.errno
                .store(if e == 0 { libc::EIO } else { e }, Ordering::SeqCst);
            libc::_exit(127)
        };
        // Default dispositions for every signal (a handler of the parent's
        // must never run here, and ignored signals survive exec), then an
        // empty mask, as std's Command leaves a child.
        for sig in 1..=64 {
            if sig != libc::SIGKILL && sig != libc::SIGSTOP && !(32..34).contains(&sig) {
                libc::signal(sig, libc::SIG_DFL);
            }
        }
        let mut empty: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut empty);
        if libc::pthread_sigmask(libc::SIG_SETMASK, &empty, std::ptr::null_mut()) != 0 {
            fail(a);
        }
        // Its own session (and so its own process group) either way: a
        // child left in the worker's session would share whatever
        // controlling terminal the gateway was started from (`/dev/tty`,
        // TIOCSTI into the operator's shell).
        if libc::setsid() < 0 {
            fail(a);
        }
        for (target, fd) in a.stdio.iter().enumerate() {
            // Every prepared fd is above 2 (`above_stdio`), so no dup2 here
            // overwrites one still to be duplicated.
            if libc::dup2(*fd, target as libc::c_int) < 0 {
                fail(a);
            }
        }
        if a.tty && libc::ioctl(0, libc::TIOCSCTTY as _, 0) < 0 {
            fail(a);
        }
        if libc::chdir(a.cwd.as_ptr()) < 0 {
            fail(a);
        }
        for procs in &a.cgroups {
            let fd = libc::open(procs.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
            if fd < 0 {
                fail(a);
            }
            if libc::write(fd, b"0".as_ptr().cast(), 1) != 1 {
                fail(a);
            }
            libc::close(fd);
        }
        libc::execve(a.path.as_ptr(), a.argv.as_ptr(), a.envp.as_ptr());
        fail(a)
    }
}

fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: pipe2 fills two descriptors we then own.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: both were just opened for us.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

fn dev_null() -> io::Result<OwnedFd> {
    Ok(std::fs::File::open("/dev/null")?.into())
}

/// `fd` moved above 0, 1 and 2 (a process started with one of them closed
/// would otherwise get it back from `pipe2`), close-on-exec.
fn above_stdio(fd: OwnedFd) -> io::Result<OwnedFd> {
    if fd.as_raw_fd() > 2 {
        return Ok(fd);
    }
    // SAFETY: F_DUPFD_CLOEXEC returns a new descriptor we own.
    let new = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 3) };
    if new < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: just opened for us.
    Ok(unsafe { OwnedFd::from_raw_fd(new) })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::panic)]
    use std::collections::HashMap;
    use std::io::Read as _;

    use super::*;

    fn spec(argv: &[&str], tty: bool) -> SpawnSpec {
        SpawnSpec {
            argv: argv.iter().map(|s| (*s).to_owned()).collect(),
            cwd: "/tmp".to_owned(),
            env: HashMap::from([("PATH".to_owned(), "/usr/bin:/bin".to_owned())]),
            arg0: None,
            tty,
            pipe_stdin: false,
            fallback_path: None,
            cgroups: Vec::new(),
        }
    }

    /// Everything a child's stream carries until it closes.
    fn read_all(fd: OwnedFd) -> String {
        let mut s = String::new();
        std::fs::File::from(fd).read_to_string(&mut s).unwrap();
        s
    }

    fn wait(pid: i32) -> i32 {
        let mut status = 0;
        // SAFETY: our own child.
        assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
        status
    }

    #[test]
    fn a_child_runs_in_its_own_group_with_its_cwd_env_and_streams() {
        let mut s = spec(
            &[
                "sh",
                "-c",
                "echo $PWD $X $0; ps -o pgid=,sid= -p $$ | tr -s ' ' | sed 's/^ //'; echo $$ $$; echo err >&2; exit 3",
            ],
            false,
        );
        s.env.insert("X".into(), "y z".into());
        s.arg0 = Some("named".into());
        let (pid, fds) = spawn(&s).unwrap();
        let ChildFds::Pipes {
            stdout,
            stderr,
            stdin,
        } = fds
        else {
            panic!("pipes expected")
        };
        assert!(stdin.is_none());
        let out = read_all(stdout);
        let err = read_all(stderr);
        let status = wait(pid);
        assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 3);
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines[0], "/tmp y z named");
        // Its own process group and session: both ids are its pid.
        assert_eq!(lines[1], lines[2]);
        assert_eq!(err, "err\n");
    }

    #[test]
    fn stdin_is_a_pipe_or_dev_null() {
        let mut s = spec(&["cat"], false);
        s.pipe_stdin = true;
        let (pid, fds) = spawn(&s).unwrap();
        let ChildFds::Pipes { stdout, stdin, .. } = fds else {
            panic!("pipes expected")
        };
        let mut w = std::fs::File::from(stdin.unwrap());
        std::io::Write::write_all(&mut w, b"hello").unwrap();
        drop(w);
        let out = read_all(stdout);
        assert_eq!(out, "hello");
        assert_eq!(wait(pid), 0);
        // Without a stdin pipe, stdin reads as empty.
        let (pid, fds) = spawn(&spec(&["cat"], false)).unwrap();
        let ChildFds::Pipes { stdout, .. } = fds else {
            panic!("pipes expected")
        };
        let out = read_all(stdout);
        assert_eq!(out, "");
        assert_eq!(wait(pid), 0);
    }

    #[test]
    fn a_pty_child_has_its_terminal_as_controlling_terminal() {
        let (pid, fds) = spawn(&spec(&["sh", "-c", "tty; test -t 0 && echo tty0"], true)).unwrap();
        let ChildFds::Pty { master } = fds else {
            panic!("pty expected")
        };
        let status = wait(pid);
        assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0);
        // One read may return a single line (each write of the child's is
        // its own chunk): read until the closed terminal answers EIO.
        let mut master = std::fs::File::from(master);
        let mut all = Vec::new();
        let mut buf = vec![0u8; 4096];
        loop {
            match master.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => all.extend_from_slice(&buf[..n]),
            }
        }
        let out = String::from_utf8_lossy(&all);
        assert!(out.starts_with("/dev/pts/"), "{out}");
        assert!(out.contains("tty0"), "{out}");
    }

    #[test]
    fn failures_before_exec_are_errors_and_leave_no_child() {
        // A missing program is found out before the clone.
        let e = spawn(&spec(&["/nonexistent/prog"], false)).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ENOENT));
        // A missing cwd fails in the child: reported with its errno, reaped.
        let mut s = spec(&["true"], false);
        s.cwd = "/nonexistent-dir".into();
        let e = spawn(&s).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ENOENT));
        // A file that is not executable fails at execve.
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("noexec");
        std::fs::write(&f, "#!/bin/sh\n").unwrap();
        let e = spawn(&spec(&[f.to_str().unwrap()], false)).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EACCES));
    }

    #[test]
    fn ignored_signals_are_reset_for_the_child() {
        // SAFETY: the test process ignores SIGINT for the length of a spawn.
        let prev = unsafe { libc::signal(libc::SIGINT, libc::SIG_IGN) };
        let (pid, _fds) = spawn(&spec(&["sh", "-c", "kill -INT $$; exit 0"], false)).unwrap();
        // SAFETY: restores what was there.
        unsafe { libc::signal(libc::SIGINT, prev) };
        let status = wait(pid);
        assert!(
            libc::WIFSIGNALED(status) && libc::WTERMSIG(status) == libc::SIGINT,
            "status {status:#x}"
        );
    }
}
