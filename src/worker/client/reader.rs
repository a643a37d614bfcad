//! The gateway's end of a worker's link: its messages read on the
//! runtime's reactor (or on a thread of its own without a runtime), each
//! handed to the call that waits for it; a `Spawned` answer checked before
//! it is believed; the worker killed and reaped when its link ends.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use tokio::io::unix::AsyncFd;
use tokio::sync::oneshot;

use super::link::{self, FromWorker, MAX_MESSAGE_BYTES, Received};
use super::{Refusal, Verified, WorkerConn, verify_child};
use crate::spawn::Ended;

impl WorkerConn {
    /// Read the worker's messages until EOF on the runtime's reactor (the
    /// answers wake their callers on the thread that reads them, with no
    /// thread of the link's own in between); then fail everything pending.
    pub(super) async fn read_task(self: Arc<Self>) {
        let raw = Raw(self.sock.as_raw_fd());
        // SAFETY: `self` (held by this task) owns the descriptor, open and
        // the same one until after the `AsyncFd` is dropped below.
        #[allow(unsafe_code)]
        let registered =
            unsafe { AsyncFd::register_with_interest(raw, tokio::io::Interest::READABLE) }
                .map_err(|e| e.into_parts().1);
        match registered {
            Ok(fd) => {
                let mut buf = vec![0u8; MAX_MESSAGE_BYTES];
                loop {
                    let Ok(mut ready) = fd.readable().await else {
                        break;
                    };
                    match ready.try_io(|fd| link::try_recv::<FromWorker>(fd.get_ref().0, &mut buf))
                    {
                        Ok(packet) => {
                            if !self.take(packet) {
                                break;
                            }
                        }
                        Err(_would_block) => continue,
                    }
                    // A worker is tenant code: one that never stops sending
                    // must not keep this runtime thread from other tenants'
                    // tasks (readiness alone spends no budget).
                    tokio::task::consume_budget().await;
                }
            }
            Err(e) => tracing::warn!(worker = self.pid, error = %e, "worker link not readable"),
        }
        self.link_ended();
        // Reaping waits for its exit, which follows the kill closely but
        // not at once: off the runtime's threads.
        let me = self.clone();
        let _ = tokio::task::spawn_blocking(move || me.reap()).await;
    }

    /// Read the worker's messages until EOF, on a thread of the link's own
    /// (when no runtime is running); then fail everything pending.
    pub(super) fn read_loop(self: Arc<Self>) {
        let mut buf = vec![0u8; MAX_MESSAGE_BYTES];
        while self.take(link::recv::<FromWorker>(&self.sock, &mut buf)) {}
        self.link_ended();
        self.reap();
    }

    /// One packet read from the link, either way; false once the link has
    /// ended (EOF or an error).
    fn take(&self, packet: io::Result<Received<FromWorker>>) -> bool {
        match packet {
            Ok(Received::Message(msg, fds)) => self.received(msg, fds),
            Ok(Received::Malformed) => {
                tracing::warn!(worker = self.pid, "malformed message from worker");
            }
            Ok(Received::Eof) | Err(_) => return false,
        }
        true
    }

    /// One message from the worker.
    fn received(&self, msg: FromWorker, fds: Vec<OwnedFd>) {
        match msg {
            FromWorker::Spawned { id, pid } => self.spawned(id, pid, fds),
            FromWorker::SpawnFailed { id, errno, message } => {
                if let Some(w) = self.spawns.lock().remove(&id) {
                    let _ = w.send(Err(match errno {
                        Some(n) => io::Error::from_raw_os_error(n),
                        None => io::Error::other(message),
                    }));
                }
            }
            FromWorker::FsDone { id, result } => {
                if let Some(tx) = self.fs_pending.lock().remove(&id) {
                    let _ = tx.send((result, fds));
                }
            }
            FromWorker::Exited { pid, ended } => {
                if let Some(tx) = self.exits.lock().remove(&pid) {
                    let _ = tx.send(ended);
                }
            }
        }
    }

    /// The link ended: everything pending fails at once, and the worker,
    /// which may still run (a link can end on a malformed packet as well
    /// as at its exit), is killed.
    fn link_ended(&self) {
        self.dead.store(true, Ordering::Release);
        let retiring = self.retiring.load(Ordering::Acquire);
        if let Some(m) = &self.metrics {
            m.workers.dec();
            if !retiring {
                m.worker_deaths.inc();
            }
        }
        if !retiring {
            tracing::warn!(
                worker = self.pid,
                "worker process ended; its processes are reported failed"
            );
        }
        self.spawns.lock().clear();
        self.fs_pending.lock().clear();
        for (_, tx) in self.exits.lock().drain() {
            let _ = tx.send(Ended::WorkerDied);
        }
        // Not reaped yet, so its pid is still its own.
        self.kill();
    }

    /// Reap the killed worker (the gateway is its parent): it may take a
    /// moment to exit, so this blocks.
    fn reap(&self) {
        let _ = nix::sys::wait::waitpid(nix::unistd::Pid::from_raw(self.pid), None);
    }

    /// A `Spawned` answer: registered only if it answers a request and its
    /// pidfd names a child of this worker (see [`verify_child`]).
    pub(super) fn spawned(&self, id: u64, pid: i32, fds: Vec<OwnedFd>) {
        // Only an answer to a request is looked at (a worker's unsolicited
        // packets cost a map lookup, not a check through /proc) or
        // registers anything (the map stays bounded by the requests made).
        let Some(w) = self.spawns.lock().remove(&id) else {
            return;
        };
        // The worker sends the child's pidfd first, then its streams.
        let verdict = match fds.first() {
            Some(pidfd) => verify_child(pidfd, pid, self.pid, self.pid_ns),
            None => Err(Refusal::NotAPidfd),
        };
        let host_pid = match verdict {
            Ok(Verified::Running(host)) => host,
            // Already reaped: its exit report is on its way, behind this
            // packet. No number is handed on (it may be anyone's by now:
            // the reaper sidecar must not register it).
            Ok(Verified::Reaped) => 0,
            Err(why) => {
                // The spawn fails; whatever runs is killed with its
                // process cgroup.
                tracing::warn!(
                    worker = self.pid,
                    pid,
                    reason = %why,
                    "worker named a process that is not its child; refused"
                );
                let _ = w.send(Err(io::Error::other(
                    "the spawned process could not be verified as the worker's child",
                )));
                return;
            }
        };
        // Registered before the reply is handed on: the exit can only be
        // read after this packet.
        let (tx, rx) = oneshot::channel();
        self.exits.lock().insert(pid, tx);
        let _ = w.send(Ok((host_pid, fds, rx)));
    }
}

/// A descriptor the reader task borrows from its [`WorkerConn`] (which
/// outlives the task).
struct Raw(RawFd);

impl AsRawFd for Raw {
    fn as_raw_fd(&self) -> RawFd {
        self.0
    }
}
