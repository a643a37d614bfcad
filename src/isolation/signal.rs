//! Signals to process groups: the only place that sends signals to children.
//!
//! Every child is its own session and process-group leader (setsid at spawn),
//! so signalling its group reaches its whole tree except `setsid` escapers
//! (those need a cgroup: `isolation::cgroup`). A group is addressed through
//! its leader's pidfd ([`Group`]), never by number: once the leader is
//! reaped and its group empty, the number may belong to another tenant's
//! process, and a pidfd still names the old one (the kernel answers ESRCH).

#![allow(unsafe_code)]

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;

use crate::protocol::process::SignalName;

pub fn to_signal(name: SignalName) -> Signal {
    match name {
        SignalName::Interrupt => Signal::SIGINT,
        SignalName::Terminate => Signal::SIGTERM,
        SignalName::Kill => Signal::SIGKILL,
        SignalName::Hangup => Signal::SIGHUP,
        SignalName::Quit => Signal::SIGQUIT,
        SignalName::User1 => Signal::SIGUSR1,
        SignalName::User2 => Signal::SIGUSR2,
    }
}

/// `pidfd_send_signal` flag: the pidfd's process group (Linux 6.9).
const PIDFD_SIGNAL_PROCESS_GROUP: libc::c_uint = 1 << 2;

/// A child's process group, held by its leader's pidfd until the process
/// has closed ([`Group::release`]): a closed process is retained for a
/// while to be read, and must not hold a descriptor all that time (20,000
/// short processes a retention period would take 20,000 descriptors).
pub struct Group {
    pidfd: parking_lot::Mutex<Option<std::os::fd::OwnedFd>>,
}

impl Group {
    pub fn new(pidfd: std::os::fd::OwnedFd) -> Group {
        Group {
            pidfd: parking_lot::Mutex::new(Some(pidfd)),
        }
    }

    /// The process has closed (exited, reaped, output ended): nothing is
    /// signalled through it any more; its descriptor is closed now.
    pub fn release(&self) {
        self.pidfd.lock().take();
    }

    /// Signal every member of the group the leader led. ESRCH (the group is
    /// gone) is not an error. Kernels before 6.9 lack group signalling by
    /// pidfd: the leader alone is signalled then (its cgroup still reaches
    /// the rest on kill).
    pub fn signal(&self, signal: Signal) -> std::io::Result<()> {
        use std::os::fd::AsRawFd as _;
        let held = self.pidfd.lock();
        let Some(pidfd) = held.as_ref() else {
            // Released once the process closed: as gone as ESRCH says.
            return Ok(());
        };
        let send = |flags: libc::c_uint| {
            // SAFETY: a syscall on a pidfd we own, with no siginfo.
            let r = unsafe {
                libc::syscall(
                    libc::SYS_pidfd_send_signal,
                    pidfd.as_raw_fd(),
                    signal as libc::c_int,
                    std::ptr::null::<libc::siginfo_t>(),
                    flags,
                )
            };
            if r == 0 {
                Ok(())
            } else {
                Err(std::io::Error::last_os_error())
            }
        };
        let result = match send(PIDFD_SIGNAL_PROCESS_GROUP) {
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => send(0),
            other => other,
        };
        match result {
            Err(e) if e.raw_os_error() == Some(libc::ESRCH) => Ok(()),
            other => other,
        }
    }

    /// SIGKILL the whole group.
    pub fn kill(&self) {
        if let Err(e) = self.signal(Signal::SIGKILL) {
            tracing::warn!(error = %e, "killing a process group failed");
        }
    }
}

/// Signal a process group by number: only for groups the caller knows are
/// alive (the reaper, whose groups are registered while they run). ESRCH
/// (group already gone) is not an error.
pub fn signal_group(pgid: i32, signal: Signal) -> std::io::Result<()> {
    if pgid <= 1 {
        // Never signal "every process" or init by accident.
        return Err(std::io::Error::from_raw_os_error(libc::EINVAL));
    }
    match killpg(Pid::from_raw(pgid), signal) {
        Ok(()) | Err(nix::errno::Errno::ESRCH) => Ok(()),
        Err(e) => Err(std::io::Error::from(e)),
    }
}

/// SIGKILL a whole process group.
pub fn kill_group(pgid: i32) {
    if let Err(e) = signal_group(pgid, Signal::SIGKILL) {
        tracing::warn!(pgid, error = %e, "killpg failed");
    }
}

/// SIGKILL process `pid` if, once a pidfd holds it, `still_ours` says it is
/// the one meant: a number reused before the pidfd fails the check, one
/// reused after cannot be reached (the pidfd names the old process).
pub fn kill_checked(pid: i32, still_ours: impl FnOnce() -> bool) -> bool {
    use std::os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd};
    // SAFETY: plain syscalls; the descriptor is owned at once.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        return false;
    }
    // SAFETY: the kernel just returned this descriptor.
    let pidfd = unsafe { OwnedFd::from_raw_fd(fd as libc::c_int) };
    if !still_ours() {
        return false;
    }
    // SAFETY: a syscall on a pidfd we own, with no siginfo.
    unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            pidfd.as_raw_fd(),
            libc::SIGKILL,
            std::ptr::null::<libc::siginfo_t>(),
            0,
        ) == 0
    }
}
