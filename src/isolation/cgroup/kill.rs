//! Killing what a cgroup holds (v1: pidfd-checked SIGKILL rounds; v2:
//! `cgroup.kill`) and removing the subtrees of this or a dead gateway.

use std::path::Path;
use std::time::Duration;

use super::layout::{
    CGROUP_ROOT, CONTROLLERS, Hierarchy, MEMBERSHIP, PROCS, hierarchy, instance_name, read_control,
    subtree,
};

/// Kill rounds before giving up on a cgroup that will not empty.
const KILL_ROUNDS: usize = 50;

/// Kill and remove the subtrees of gateways that are gone (the backstop
/// after a crash). Returns the kills sent.
pub fn cleanup_leftovers() -> usize {
    let dir = match hierarchy() {
        Hierarchy::V1 => subtree(MEMBERSHIP),
        Hierarchy::V2 { base, .. } => base.clone(),
    };
    let Ok(instances) = std::fs::read_dir(dir) else {
        return 0;
    };
    let mut killed = 0;
    for inst in instances.flatten() {
        let name = inst.file_name().to_string_lossy().into_owned();
        let Some(pid) = name.strip_prefix("gw-").and_then(|p| p.parse::<u32>().ok()) else {
            continue;
        };
        if pid == std::process::id() || Path::new(&format!("/proc/{pid}")).exists() {
            continue;
        }
        killed += remove_instance(pid);
    }
    killed
}

/// Kill everything of gateway `pid` and remove its subtree (also used by
/// the reaper when its gateway dies).
pub fn remove_instance(pid: u32) -> usize {
    if let Hierarchy::V2 { base, .. } = hierarchy() {
        return remove_v2_tree(&base.join(instance_name(pid)));
    }
    let inst = instance_name(pid);
    let mut killed = 0;
    let membership = subtree(MEMBERSHIP).join(&inst);
    if let Ok(tenants) = std::fs::read_dir(&membership) {
        for t in tenants.flatten() {
            let procs_dir = t.path().join(PROCS);
            if let Ok(procs) = std::fs::read_dir(&procs_dir) {
                for p in procs.flatten() {
                    if p.file_type().is_ok_and(|f| f.is_dir()) {
                        killed += kill_dir(&p.path());
                        let _ = std::fs::remove_dir(p.path());
                    }
                }
            }
            // Strays that left their own cgroup, and the workers.
            killed += kill_dir(&procs_dir);
            let _ = std::fs::remove_dir(&procs_dir);
            killed += kill_dir(&t.path());
            for c in CONTROLLERS {
                let _ = std::fs::remove_dir(subtree(c).join(&inst).join(t.file_name()));
            }
        }
    }
    for c in CONTROLLERS {
        let _ = std::fs::remove_dir(subtree(c).join(&inst));
    }
    killed
}

/// Kill everything in the v2 cgroup `dir` (its whole subtree, at once)
/// and remove it, deepest first. Returns 1 if anything was running.
pub fn remove_v2_tree(dir: &Path) -> usize {
    let killed = usize::from(cgroup_kill(dir));
    remove_dirs_below(dir);
    let _ = std::fs::remove_dir(dir);
    killed
}

fn remove_dirs_below(dir: &Path) {
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                remove_dirs_below(&e.path());
                let _ = std::fs::remove_dir(e.path());
            }
        }
    }
}

/// `cgroup.kill` a v2 cgroup and wait (bounded) for `cgroup.events` to
/// report it empty. Returns whether it held anything.
pub(super) fn cgroup_kill(dir: &Path) -> bool {
    let populated = || {
        read_control(&dir.join("cgroup.events"))
            .map(|s| s.lines().any(|l| l == "populated 1"))
            .unwrap_or(false)
    };
    if !populated() {
        return false;
    }
    let _ = std::fs::write(dir.join("cgroup.kill"), "1");
    for _ in 0..KILL_ROUNDS * 20 {
        if !populated() {
            break;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    true
}

/// `dir` as `/proc/PID/cgroup` names it (relative to its hierarchy).
pub(super) fn cgroup_path(dir: &Path) -> Option<String> {
    let rel = match hierarchy() {
        Hierarchy::V2 { mount, .. } if dir.starts_with(mount) => dir.strip_prefix(mount).ok()?,
        _ => {
            let mut c = dir.strip_prefix(CGROUP_ROOT).ok()?.components();
            c.next()?;
            c.as_path()
        }
    };
    Some(format!("/{}", rel.display()))
}

pub(super) fn members(dir: &Path) -> Vec<i32> {
    read_control(&dir.join("cgroup.procs"))
        .map(|s| s.lines().filter_map(|l| l.trim().parse().ok()).collect())
        .unwrap_or_default()
}

/// SIGKILL every member; repeat until empty. A process forked while a
/// round runs is caught by the next one, and a killed process cannot fork,
/// so the rounds converge (`pids.max` bounds each). Returns kills sent.
pub(super) fn kill_dir(dir: &Path) -> usize {
    let mut sent = 0;
    for _ in 0..KILL_ROUNDS {
        let pids = members(dir);
        if pids.is_empty() {
            break;
        }
        let Some(path) = cgroup_path(dir) else {
            return sent;
        };
        for pid in pids {
            if kill_member(pid, &path) {
                sent += 1;
            }
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    sent
}

/// SIGKILL `pid` if it is (still) in the cgroup `path`: through a pidfd
/// taken first, so if the number was reused before the pidfd, the check
/// sees the newcomer's cgroup and spares it; if after, the signal goes to
/// the (gone) member and reaches no one.
fn kill_member(pid: i32, path: &str) -> bool {
    crate::isolation::signal::kill_checked(pid, || {
        std::fs::read_to_string(format!("/proc/{pid}/cgroup")).is_ok_and(|s| {
            s.lines().any(|l| {
                l.split_once(':')
                    .and_then(|(_, r)| r.split_once(':'))
                    .is_some_and(|(_, p)| p == path)
            })
        })
    })
}
