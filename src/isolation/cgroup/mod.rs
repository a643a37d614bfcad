//! cgroup confinement: a cgroup per tenant (pids, memory and cpu limits)
//! and one per process beneath it, on the cgroup v1 controllers
//! (docs/isolation.md, "cgroups"). Killing a process's cgroup reaches
//! everything in it, `setsid` escapers included: SIGKILL every member and
//! repeat until empty (a killed process cannot fork, so this converges).
//!
//! Layout: `/sys/fs/cgroup/<controller>/exec-gateway/gw-<pid>/<tenant>`, and
//! per process `.../pids/.../<tenant>/procs/p<n>`: one subtree per gateway
//! process, so gateways sharing a host never touch each other's cgroups,
//! and a dead gateway's subtree is recognisable. The tenant's limits sit
//! at `<tenant>`, which its processes cannot write; a worker's Landlock
//! domain (inherited by the tenant's processes) reaches only `procs`, where
//! raising a limit changes nothing (limits are hierarchical) and a process
//! that moves itself up to `procs` is killed with the next process.
//! A child joins between fork and exec by writing "0" to precomputed
//! `cgroup.procs` paths (no allocation after fork).
//!
//! Cost: every v1 `cgroup.procs` write takes the kernel's global
//! threadgroup lock (~0.15–0.2 ms here), so a spawn joins as few as it can:
//! its own cgroup under the tenant's in the `pids` hierarchy (membership
//! for the kill *and* the tenant's `pids.max`, which is hierarchical), the
//! tenant's `cpu` cgroup, and the tenant's `memory` cgroup only when the
//! tenant has a memory limit. The freezer is not used (one join more).
//! With workers, the worker itself sits in the tenant's cgroups and each
//! spawn joins only its own cgroup (one write).
//!
//! cgroup v2 (the unified hierarchy, chosen by `[isolation] cgroup_version`
//! or found by probing): `<parent>/exec-gateway/gw-<pid>/<tenant>/p<n>` per
//! process and `<tenant>/worker` for the workers, where `<parent>` is the
//! root of the hierarchy, or the gateway's own cgroup when it was delegated
//! one (a pod): the gateway then first moves its own processes into the
//! leaf `exec-gateway-supervisor` (no process may sit in a cgroup that
//! hands controllers down). Limits sit at `<tenant>` (`pids.max`,
//! `memory.max`, `cpu.weight`, `cpu.max`), each process cgroup has
//! `memory.oom.group` (an OOM kill takes the whole process tree) and
//! reports its own `oom_kill`s; kills write `cgroup.kill` (atomic, whole
//! subtree) and wait for `cgroup.events` to say `populated 0`.
//!
//! Members are only ever signalled through a pidfd taken and checked
//! against the member's cgroup first, so a number reused by another
//! process between the read of `cgroup.procs` and the kill is never hit.
//!
//! Files: `layout.rs` (the hierarchy and its names), `probe.rs`,
//! `tenant.rs` (tenant and per-process cgroups, the pool), `kill.rs`,
//! `join.rs` (joining after fork), `oom.rs`, `freeze.rs` (holding a
//! tenant still for a snapshot).

mod freeze;
mod join;
mod kill;
mod layout;
mod oom;
mod probe;
mod tenant;

pub use freeze::Frozen;
pub use join::join_self;
pub use kill::{cleanup_leftovers, remove_instance, remove_v2_tree};
pub use layout::{describe, enforces, v2_instance};
pub use probe::probe;
pub use tenant::{ProcessCgroup, TenantCgroup};
