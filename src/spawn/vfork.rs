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
//!
//! On cgroup v2 the child is created in its cgroup instead (module
//! `into_cgroup`), and a worker whose own seccomp programs let `clone3`
//! through seals each child with the one it lacks before the exec
//! (module `isolation::seccomp`).

#![allow(unsafe_code)]

use std::ffi::{CString, c_void};
use std::io;
use std::os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};

use super::{ChildFds, SpawnSpec, cstring, into_cgroup, open_pty, program_of};

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
    /// Installed last before the exec (a worker that seals its children).
    seal: Option<libc::sock_fprog>,
    /// errno of the step that failed in the child, 0 when it exec'd.
    errno: AtomicI32,
}

/// How a worker spawns, for its whole life.
#[derive(Debug)]
pub struct Spawner {
    /// The seccomp program each child installs before its exec: the
    /// worker's own programs let `clone3` through, its children's must not.
    seal: Option<Vec<libc::sock_filter>>,
    /// Cleared once `clone3(CLONE_INTO_CGROUP)` turned out missing here.
    into_cgroup: AtomicBool,
}

impl Spawner {
    pub fn new(seal: Option<Vec<libc::sock_filter>>) -> Spawner {
        Spawner {
            seal,
            into_cgroup: AtomicBool::new(true),
        }
    }
}

/// A child that has exec'd.
#[derive(Debug)]
pub struct Spawned {
    pub pid: i32,
    /// From `clone3` (`CLONE_PIDFD`); otherwise the caller opens one.
    pub pidfd: Option<OwnedFd>,
    pub fds: ChildFds,
}

/// Run `spec` as a child of this process in its own session (with the PTY
/// as its controlling terminal in PTY mode), in its cgroup. Returns its pid
/// (the caller reaps it) and the streams to hand on.
pub fn spawn(spec: &SpawnSpec, how: &Spawner) -> io::Result<Spawned> {
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
    let cgroups = joined(spec)?;

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

    // Created in its cgroup where the kernel can; else it joins in the child.
    let into = match &spec.cgroup_dir {
        Some(dir) if how.into_cgroup.load(Ordering::Relaxed) => Some(into_cgroup::open_dir(dir)?),
        _ => None,
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
        cgroups: if into.is_some() { Vec::new() } else { cgroups },
        stdio,
        tty: spec.tty,
        seal: how.seal.as_ref().map(|f| libc::sock_fprog {
            len: f.len() as libc::c_ushort,
            filter: f.as_ptr().cast_mut(),
        }),
        errno: AtomicI32::new(0),
    };
    let stack = ChildStack::new()?;
    let (pid, pidfd) = match &into {
        Some(dir) => match stack.clone3_into(&mut args, dir) {
            Err(e) if into_cgroup::unsupported(&e) => {
                how.into_cgroup.store(false, Ordering::Relaxed);
                eprintln!(
                    "exec-gateway worker: clone3(CLONE_INTO_CGROUP) is not available ({e}): each child joins its cgroup through cgroup.procs"
                );
                args.cgroups = joined(spec)?;
                (stack.clone(&mut args)?, None)
            }
            r => {
                let (pid, pidfd) = r?;
                (pid, Some(pidfd))
            }
        },
        None => (stack.clone(&mut args)?, None),
    };
    drop(stack);
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
    Ok(Spawned { pid, pidfd, fds })
}

/// The `cgroup.procs` files the child writes itself into.
fn joined(spec: &SpawnSpec) -> io::Result<Vec<CString>> {
    spec.cgroups.iter().map(|p| cstring(p)).collect()
}

/// The child's stack: an anonymous mapping above a guard page.
struct ChildStack(*mut c_void);

impl ChildStack {
    fn new() -> io::Result<ChildStack> {
        // SAFETY: a fresh anonymous mapping, unmapped on drop.
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
        let stack = ChildStack(stack);
        // SAFETY: the lowest page of our own mapping.
        if unsafe { libc::mprotect(stack.0, GUARD_BYTES, libc::PROT_NONE) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(stack)
    }

    /// Above the guard page, 16-byte aligned (page-aligned), and its size.
    fn usable(&self) -> (*mut u8, usize) {
        // SAFETY: within our mapping.
        (
            unsafe { self.0.cast::<u8>().add(GUARD_BYTES) },
            CHILD_STACK_BYTES,
        )
    }

    /// `clone` the child onto this stack; returns once it has exec'd or
    /// exited.
    fn clone(&self, args: &mut ChildArgs) -> io::Result<i32> {
        let (base, size) = self.usable();
        // SAFETY: the child runs `child_main` on the top of the stack (it
        // grows down) with `args`, which lives until it has exec'd or
        // exited: CLONE_VFORK suspends this thread until then.
        with_signals_blocked(|| {
            let pid = unsafe {
                libc::clone(
                    child_main,
                    base.add(size).cast(),
                    libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD,
                    std::ptr::from_mut(args).cast(),
                )
            };
            if pid < 0 {
                Err(io::Error::last_os_error())
            } else {
                Ok(pid)
            }
        })
    }

    /// As [`ChildStack::clone`], the child created in `cgroup`.
    fn clone3_into(&self, args: &mut ChildArgs, cgroup: &OwnedFd) -> io::Result<(i32, OwnedFd)> {
        // SAFETY: as in `clone`: `child_main` never returns, `args` and the
        // stack outlive its use of them, signals are blocked meanwhile.
        with_signals_blocked(|| unsafe {
            into_cgroup::clone_vfork(
                child_main,
                std::ptr::from_mut(args).cast(),
                self.usable(),
                cgroup,
            )
        })
    }
}

impl Drop for ChildStack {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`, no longer used by anyone (the
        // child has exec'd or exited).
        unsafe { libc::munmap(self.0, CHILD_STACK_BYTES + GUARD_BYTES) };
    }
}

/// Run `f` with every signal blocked in this thread, so no handler of the
/// parent's can run on a vfork child's stack; the mask is restored after.
fn with_signals_blocked<T>(f: impl FnOnce() -> T) -> T {
    // SAFETY: sigset_t is plain data; the sigset calls only fill them, and
    // pthread_sigmask changes this thread's mask only.
    unsafe {
        let mut all: libc::sigset_t = std::mem::zeroed();
        let mut old: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut old);
        let r = f();
        libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
        r
    }
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
        // Last: a filter installed earlier would judge these steps too.
        if let Some(prog) = &a.seal {
            let prog: *const libc::sock_fprog = prog;
            if libc::syscall(libc::SYS_seccomp, libc::SECCOMP_SET_MODE_FILTER, 0, prog) != 0 {
                fail(a);
            }
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
            cgroup_dir: None,
        }
    }

    fn run(s: &SpawnSpec) -> io::Result<(i32, ChildFds)> {
        spawn(s, &Spawner::new(None)).map(|s| (s.pid, s.fds))
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
        let (pid, fds) = run(&s).unwrap();
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
        let (pid, fds) = run(&s).unwrap();
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
        let (pid, fds) = run(&spec(&["cat"], false)).unwrap();
        let ChildFds::Pipes { stdout, .. } = fds else {
            panic!("pipes expected")
        };
        let out = read_all(stdout);
        assert_eq!(out, "");
        assert_eq!(wait(pid), 0);
    }

    #[test]
    fn a_pty_child_has_its_terminal_as_controlling_terminal() {
        let (pid, fds) = run(&spec(&["sh", "-c", "tty; test -t 0 && echo tty0"], true)).unwrap();
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
        let e = run(&spec(&["/nonexistent/prog"], false)).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ENOENT));
        // A missing cwd fails in the child: reported with its errno, reaped.
        let mut s = spec(&["true"], false);
        s.cwd = "/nonexistent-dir".into();
        let e = run(&s).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ENOENT));
        // A file that is not executable fails at execve.
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("noexec");
        std::fs::write(&f, "#!/bin/sh\n").unwrap();
        let e = run(&spec(&[f.to_str().unwrap()], false)).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EACCES));
    }

    #[test]
    fn ignored_signals_are_reset_for_the_child() {
        // SAFETY: the test process ignores SIGINT for the length of a spawn.
        let prev = unsafe { libc::signal(libc::SIGINT, libc::SIG_IGN) };
        let (pid, _fds) = run(&spec(&["sh", "-c", "kill -INT $$; exit 0"], false)).unwrap();
        // SAFETY: restores what was there.
        unsafe { libc::signal(libc::SIGINT, prev) };
        let status = wait(pid);
        assert!(
            libc::WIFSIGNALED(status) && libc::WTERMSIG(status) == libc::SIGINT,
            "status {status:#x}"
        );
    }

    /// What `python3 -c <code>` printed, run by `how`.
    fn python(code: &str, how: &Spawner, with: impl FnOnce(&mut SpawnSpec)) -> String {
        let mut s = spec(&["python3", "-c", code], false);
        with(&mut s);
        let child = spawn(&s, how).unwrap();
        let ChildFds::Pipes { stdout, .. } = child.fds else {
            panic!("pipes expected")
        };
        let out = read_all(stdout);
        assert_eq!(wait(child.pid), 0, "{out}");
        out
    }

    const CLONE3: &str = "import ctypes, os; libc = ctypes.CDLL(None, use_errno=True); \
        r = libc.syscall(435, None, 0); print(r, ctypes.get_errno())";

    #[test]
    fn a_sealed_child_cannot_call_clone3() {
        // Unsealed, the kernel itself answers (EINVAL: no arguments).
        let out = python(CLONE3, &Spawner::new(None), |_| {});
        assert_eq!(out.trim(), format!("-1 {}", libc::EINVAL));
        // Sealed: ENOSYS, as the tenant's programs answer; for its own
        // children too (a filter is inherited).
        let seal = crate::isolation::seccomp::seal().unwrap();
        let how = Spawner::new(Some(seal));
        let out = python(CLONE3, &how, |_| {});
        assert_eq!(out.trim(), format!("-1 {}", libc::ENOSYS));
        let nested = format!(
            "import subprocess, sys; print(subprocess.run([sys.executable, '-c', {CLONE3:?}], capture_output=True, text=True).stdout)"
        );
        let out = python(&nested, &how, |_| {});
        assert_eq!(out.trim(), format!("-1 {}", libc::ENOSYS));
    }

    /// A cgroup2 hierarchy mounted for the test (this host may be cgroup
    /// v1: the unified hierarchy mounts beside it), with a fresh leaf.
    struct Cgroup2 {
        mount: tempfile::TempDir,
        leaf: std::path::PathBuf,
    }

    impl Cgroup2 {
        /// `test` names the leaf: tests run at once in one process.
        fn new(test: &str) -> Option<Cgroup2> {
            let mount = tempfile::tempdir().unwrap();
            let target = cstring(mount.path()).unwrap();
            // SAFETY: mounts a cgroup2 filesystem on our temporary dir.
            let r = unsafe {
                libc::mount(
                    c"none".as_ptr(),
                    target.as_ptr(),
                    c"cgroup2".as_ptr(),
                    0,
                    std::ptr::null(),
                )
            };
            if r != 0 {
                eprintln!(
                    "SKIPPED: cannot mount cgroup2 here ({})",
                    io::Error::last_os_error()
                );
                return None;
            }
            let leaf = mount
                .path()
                .join(format!("vfork-{test}-{}", std::process::id()));
            std::fs::create_dir(&leaf).unwrap();
            Some(Cgroup2 { mount, leaf })
        }

        /// The cgroup a child spawned by `how` (with `with` applied to
        /// its spec) finds itself in, against the leaf's own name.
        fn seen_by_child(
            &self,
            how: &Spawner,
            with: impl FnOnce(&mut SpawnSpec),
        ) -> (String, String) {
            let own =
                "print([l for l in open('/proc/self/cgroup') if l.startswith('0::')][0].strip())";
            let out = python(own, how, with);
            let name = self.leaf.file_name().unwrap().to_str().unwrap();
            (out.trim().to_owned(), format!("0::/{name}"))
        }
    }

    impl Drop for Cgroup2 {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir(&self.leaf);
            let target = cstring(self.mount.path()).unwrap();
            // SAFETY: unmounts what `new` mounted.
            unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH) };
        }
    }

    #[test]
    fn a_child_is_created_in_its_cgroup_and_writes_no_cgroup_procs() {
        let Some(cg) = Cgroup2::new("into") else {
            return;
        };
        // `cgroups` names a file that does not exist: a child that tried to
        // write it would fail, so the spawn proves the write was skipped.
        let how = Spawner::new(None);
        let (seen, own) = cg.seen_by_child(&how, |s| {
            s.cgroup_dir = Some(cg.leaf.clone());
            s.cgroups = vec![cg.leaf.join("missing/cgroup.procs")];
        });
        assert_eq!(seen, own);
        assert!(how.into_cgroup.load(Ordering::Relaxed));
        // The pidfd names the child.
        let mut s = spec(&["true"], false);
        s.cgroup_dir = Some(cg.leaf.clone());
        let child = spawn(&s, &how).unwrap();
        let pidfd = child.pidfd.expect("clone3 returns a pidfd");
        let fdinfo =
            std::fs::read_to_string(format!("/proc/self/fdinfo/{}", pidfd.as_raw_fd())).unwrap();
        assert!(fdinfo.contains(&format!("Pid:\t{}", child.pid)), "{fdinfo}");
        wait(child.pid);
        // A cgroup that is gone is an error, not a child elsewhere.
        s.cgroup_dir = Some(cg.leaf.join("gone"));
        let e = spawn(&s, &how).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ENOENT));
    }

    #[test]
    fn without_clone3_the_child_joins_by_cgroup_procs() {
        let Some(cg) = Cgroup2::new("joins") else {
            return;
        };
        let how = Spawner::new(None);
        how.into_cgroup.store(false, Ordering::Relaxed);
        let (seen, own) = cg.seen_by_child(&how, |s| {
            s.cgroup_dir = Some(cg.leaf.clone());
            s.cgroups = vec![cg.leaf.join("cgroup.procs")];
        });
        assert_eq!(seen, own);
    }
}
