//! Signals to process groups: the only place that sends signals to children.
//!
//! Every child is its own session and process-group leader (setsid at spawn),
//! so signalling `-pgid` reaches its whole tree except `setsid` escapers
//! (those need a cgroup: `isolation::cgroup`).

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

/// Signal a process group. ESRCH (group already gone) is not an error.
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
