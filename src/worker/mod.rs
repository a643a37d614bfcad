//! Per-tenant worker processes.
//!
//! A worker is this binary re-executed as `exec-gateway worker`, started
//! once per pool slot with the tenant's confinement applied to *itself*: it
//! joins the tenant's cgroups and takes the tenant's uid, `no_new_privs`,
//! Landlock domain and seccomp filter before exec. Every process it spawns
//! inherits all of that, so a spawn only joins its own per-process cgroup,
//! and a small worker forks far cheaper than the gateway.
//!
//! - [`link`]: the typed messages and the `SCM_RIGHTS` framing;
//! - [`client`]: the gateway's side (pool, connections, a session's spawner);
//! - [`serve`]: the worker's own main.
//!
//! Output never crosses the link: a child's pipes (or PTY master) are
//! passed back and the gateway reads them directly. File operations resolve
//! and open inside the worker and only the opened file comes back. When a
//! worker dies, the processes it spawned are reported ended with a clear
//! failure and killed through their cgroups; its pool starts a replacement
//! on demand.

pub mod client;
pub mod link;
pub mod serve;

pub use client::{
    Gate, Restarting, Retired, SessionWorker, WorkerLaunch, WorkerPool, executable, unavailable,
};
