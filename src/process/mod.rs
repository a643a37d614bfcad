//! Process tables: the processes of each session, their output logs,
//! stdin, signals and retention.
//!
//! - [`table`]: `processId → Process` for one session; start, read, write,
//!   signal, terminate, list; retention of closed processes.
//! - [`process`]: one process's state and how it reports events (to the
//!   session's connection and to stream subscribers).
//! - [`pump`]: the one task per process that reads its output and exit in
//!   `select!`, so seqs are assigned *and* emitted in order.
//! - [`output`]: the bounded, seq-numbered log and the `process/read`
//!   selection algorithm; [`env`]: the child environment.
//!
//! Must not: know about transports; hold a lock across `.await`; spawn
//! anything itself (a `Spawner` (module `spawn`) does, locally or in the
//! tenant's worker).
//!
//! A process's lifetime is not tied to a connection: it notifies through
//! the session's attachment (module `outbound`), and its log serves
//! `process/read` from any connection that holds the session.

pub mod env;
pub mod output;
mod pump;
mod state;
mod stdin;
mod table;
mod write_ids;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Semaphore;

use crate::isolation::cgroup::TenantCgroup;
use crate::isolation::reaper::Reaper;
use crate::metrics::TenantMetrics;
use crate::protocol::revision::Policy;

pub use state::Process;
pub use table::{ProcessTable, StartOptions};

/// Bytes asked of each pipe/PTY read; also the largest output chunk.
pub const OUTPUT_READ_CHUNK_BYTES: usize = 256 * 1024;

/// Which API started a process; it reports in the same API's notifications.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Api {
    /// `process/start`: `process/output|exited|closed` with seqs.
    Process,
    /// v0 `command/exec`: `command/exec/outputDelta|exited`, no seqs.
    CommandExec,
}

/// Settings shared by every process table of a tenant.
#[derive(Debug, Clone)]
pub struct ExecSettings {
    pub retained_output_bytes: usize,
    /// How long a closed process stays readable; `None`: the session
    /// revision's (30 s for 0.130.0, 80 s for 0.169.0, as each reference).
    pub exited_retention: Option<Duration>,
    /// Base environment for `envPolicy` (the tenant's, never the gateway's).
    pub base_env: HashMap<String, String>,
    /// Running-process slots; a permit lives as long as its process.
    pub process_slots: Arc<Semaphore>,
    pub max_processes: usize,
    /// Kills live groups if the gateway dies (None in library use without one).
    pub reaper: Option<Arc<Reaper>>,
    /// Gateway-wide running-process slots (past them: -32001).
    pub global_slots: Option<Arc<Semaphore>>,
    /// Past this, new processes are refused with -32006.
    pub max_retained_bytes: usize,
    pub metrics: TenantMetrics,
    /// A live subscriber that takes longer than this to accept an event is dropped.
    pub subscriber_timeout: Duration,
    /// The tenant's cgroup, when the cgroup layer is active.
    pub cgroup: Option<Arc<TenantCgroup>>,
    /// Whether processes are spawned by a worker already inside the
    /// tenant's cgroups (each joins only its own) or by the gateway.
    pub spawned_in_worker: bool,
    /// Set in every process's environment where its client set no value:
    /// the placeholders of secrets substituted by the egress proxy and the
    /// tenant's CA bundle (module `egress::substitute`).
    pub added_env: Vec<(String, String)>,
}

impl ExecSettings {
    /// The retention of a closed process in a session answering by `policy`.
    pub fn retention(&self, policy: &Policy) -> Duration {
        self.exited_retention.unwrap_or(policy.retention)
    }

    pub fn new(max_processes: usize, base_env: HashMap<String, String>) -> Self {
        Self {
            retained_output_bytes: output::RETAINED_OUTPUT_BYTES_PER_PROCESS,
            exited_retention: None,
            base_env,
            process_slots: Arc::new(Semaphore::new(max_processes)),
            max_processes,
            reaper: None,
            global_slots: None,
            max_retained_bytes: usize::MAX,
            metrics: TenantMetrics::detached("default"),
            subscriber_timeout: Duration::from_secs(30),
            cgroup: None,
            spawned_in_worker: false,
            added_env: Vec::new(),
        }
    }
}
