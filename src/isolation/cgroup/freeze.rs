//! Holding a tenant's processes still while its workspace is captured
//! (a snapshot): cgroup v2 freezes the tenant's cgroup (`cgroup.freeze`,
//! whole subtree, waited for in `cgroup.events`); on v1, where the gateway
//! uses no freezer hierarchy, every member gets SIGSTOP through a pidfd
//! checked against the tenant's cgroup (rounds until no new member
//! appears), and SIGCONT through the same pidfd when the hold ends.

#![allow(unsafe_code)]

use std::io;
use std::os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::kill::{cgroup_path, members};
use super::layout::{MEMBERSHIP, controller_dir};
use super::tenant::TenantCgroup;

/// Rounds (1 ms apart) waited for the kernel to report a v2 freeze, and
/// rounds of SIGSTOP on v1.
const FREEZE_ROUNDS: usize = 2000;

/// While this lives, the tenant's processes do not run.
#[derive(Debug)]
pub enum Frozen {
    V2(PathBuf),
    V1(Vec<OwnedFd>),
}

impl TenantCgroup {
    /// Freeze everything in the tenant's cgroup until the guard drops.
    pub fn freeze(&self) -> io::Result<Frozen> {
        match self.v2_dir() {
            Some(dir) => freeze_v2(dir),
            None => stop_v1(&controller_dir(MEMBERSHIP).join(self.name())),
        }
    }
}

fn freeze_v2(dir: &Path) -> io::Result<Frozen> {
    std::fs::write(dir.join("cgroup.freeze"), "1")?;
    let guard = Frozen::V2(dir.to_path_buf());
    for _ in 0..FREEZE_ROUNDS {
        let events = std::fs::read_to_string(dir.join("cgroup.events"))?;
        if events.lines().any(|l| l == "frozen 1") {
            return Ok(guard);
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    Err(io::Error::new(
        io::ErrorKind::TimedOut,
        "the tenant's cgroup did not freeze",
    ))
}

/// Every cgroup directory at and below `dir`.
fn subtree(dir: &Path, out: &mut Vec<PathBuf>) {
    out.push(dir.to_path_buf());
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                subtree(&e.path(), out);
            }
        }
    }
}

fn stop_v1(tenant: &Path) -> io::Result<Frozen> {
    let Some(prefix) = cgroup_path(tenant) else {
        return Ok(Frozen::V1(Vec::new()));
    };
    let mut stopped: Vec<(i32, OwnedFd)> = Vec::new();
    // Stopped by the tenant itself before: left stopped after, too.
    let mut theirs: Vec<i32> = Vec::new();
    for _ in 0..FREEZE_ROUNDS {
        let mut dirs = Vec::new();
        subtree(tenant, &mut dirs);
        // Done once a listing holds nobody who is not stopped: a member
        // that could not be stopped (it exited, after forking maybe) means
        // another round.
        let mut settled = true;
        for pid in dirs.iter().flat_map(|d| members(d)) {
            if stopped.iter().any(|(p, _)| *p == pid) || theirs.contains(&pid) {
                continue;
            }
            settled = false;
            if already_stopped(pid) {
                theirs.push(pid);
                continue;
            }
            if let Some(fd) = stop_member(pid, &prefix) {
                stopped.push((pid, fd));
            }
        }
        if settled {
            return Ok(Frozen::V1(stopped.into_iter().map(|(_, fd)| fd).collect()));
        }
    }
    // Still forking after every round: let them go.
    drop(Frozen::V1(stopped.into_iter().map(|(_, fd)| fd).collect()));
    Err(io::Error::new(
        io::ErrorKind::TimedOut,
        "the tenant's processes could not be stopped",
    ))
}

/// Whether `pid` is stopped already (state `T` in `/proc/PID/stat`).
fn already_stopped(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
        s.rsplit_once(") ")
            .is_some_and(|(_, rest)| rest.starts_with('T'))
    })
}

/// SIGSTOP `pid` if it is (still) in a cgroup at or below `prefix`; the
/// pidfd it went through is kept for the SIGCONT.
fn stop_member(pid: i32, prefix: &str) -> Option<OwnedFd> {
    // SAFETY: plain syscall; the descriptor is owned at once.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        return None;
    }
    // SAFETY: the kernel just returned this descriptor.
    let pidfd = unsafe { OwnedFd::from_raw_fd(fd as libc::c_int) };
    let ours = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).is_ok_and(|s| {
        s.lines().any(|l| {
            l.split_once(':')
                .and_then(|(_, r)| r.split_once(':'))
                .is_some_and(|(_, p)| p == prefix || p.starts_with(&format!("{prefix}/")))
        })
    });
    (ours && send(&pidfd, libc::SIGSTOP)).then_some(pidfd)
}

fn send(pidfd: &OwnedFd, sig: libc::c_int) -> bool {
    // SAFETY: a syscall on a pidfd we own, with no siginfo.
    unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            pidfd.as_raw_fd(),
            sig,
            std::ptr::null::<libc::siginfo_t>(),
            0,
        ) == 0
    }
}

impl Drop for Frozen {
    fn drop(&mut self) {
        match self {
            Frozen::V2(dir) => {
                if let Err(e) = std::fs::write(dir.join("cgroup.freeze"), "0") {
                    tracing::error!(cgroup = %dir.display(), error = %e, "could not thaw a tenant's cgroup");
                }
            }
            Frozen::V1(fds) => {
                for fd in fds.iter() {
                    send(fd, libc::SIGCONT);
                }
            }
        }
    }
}
