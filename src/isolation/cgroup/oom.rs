//! OOM-kill counters of the memory controller (a tenant's on v1, a process
//! cgroup's own on v2).

use std::path::Path;

use super::layout::{controller_dir, read_control};

/// The tenant memory cgroup's `oom_kill` counter (v1).
pub(super) fn oom_kills(tenant: &str) -> u64 {
    oom_kill_line(
        &controller_dir("memory")
            .join(tenant)
            .join("memory.oom_control"),
    )
}

/// A v2 process cgroup's own `oom_kill` counter.
pub(super) fn own_oom_kills(dir: &Path) -> u64 {
    oom_kill_line(&dir.join("memory.events"))
}

/// The `oom_kill N` line of a memory controller file; 0 when unreadable.
fn oom_kill_line(file: &Path) -> u64 {
    read_control(file)
        .ok()
        .and_then(|s| {
            s.lines().find_map(|l| {
                l.strip_prefix("oom_kill ")
                    .and_then(|n| n.trim().parse().ok())
            })
        })
        .unwrap_or(0)
}
