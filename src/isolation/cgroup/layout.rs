//! The cgroup layout: the hierarchy in use (v1 or v2, fixed by the probe),
//! the names in it and where this gateway's subtree lies.

use std::path::{Path, PathBuf};

/// Root of the v1 hierarchies.
pub(super) const CGROUP_ROOT: &str = "/sys/fs/cgroup";
/// Our subtree under each controller.
pub(super) const SUBTREE: &str = "exec-gateway";
/// Controllers used. Per-process cgroups live in `pids` (membership).
pub(super) const CONTROLLERS: &[&str] = &["pids", "memory", "cpu"];
/// The controller that holds per-process cgroups.
pub(super) const MEMBERSHIP: &str = "pids";
/// The directory under a tenant's membership cgroup holding per-process
/// cgroups (the only part of the tree a tenant's worker may write).
pub(super) const PROCS: &str = "procs";

/// The hierarchy in use, fixed by [`probe`] (v1 until then).
#[derive(Debug, Clone)]
pub(super) enum Hierarchy {
    V1,
    V2 {
        /// Where the cgroup2 filesystem is mounted.
        mount: PathBuf,
        /// `<parent>/exec-gateway`.
        base: PathBuf,
        /// Controllers handed down to tenants (of pids, memory, cpu).
        controllers: Vec<&'static str>,
        /// The gateway's cgroup was delegated to it (not the hierarchy's
        /// root): its processes were moved into [`SUPERVISOR`].
        delegated: bool,
    },
}

pub(super) static HIERARCHY: std::sync::OnceLock<Hierarchy> = std::sync::OnceLock::new();

pub(super) fn hierarchy() -> &'static Hierarchy {
    HIERARCHY.get().unwrap_or(&Hierarchy::V1)
}

/// The v2 leaf the gateway moves its own processes into when its cgroup
/// was delegated to it.
pub(super) const SUPERVISOR: &str = "exec-gateway-supervisor";
/// The v2 leaf of a tenant's workers (root-owned: a tenant process cannot
/// move itself there).
pub(super) const WORKERS: &str = "worker";

/// This gateway's v2 instance directory, when v2 is in use (the reaper
/// kills it if the gateway dies).
pub fn v2_instance() -> Option<PathBuf> {
    match hierarchy() {
        Hierarchy::V2 { base, .. } => Some(base.join(own_instance())),
        Hierarchy::V1 => None,
    }
}

/// Which hierarchy is in use and what it enforces, for `/readyz` and logs.
pub fn describe() -> String {
    match hierarchy() {
        Hierarchy::V1 => {
            "v1; controllers pids memory cpu; a cgroup per process, killed by its members' pids"
                .to_owned()
        }
        Hierarchy::V2 {
            base,
            controllers,
            delegated,
            ..
        } => {
            let missing: Vec<&str> = CONTROLLERS
                .iter()
                .copied()
                .filter(|c| !controllers.contains(c))
                .collect();
            format!(
                "v2 at {}{}; controllers {}; a cgroup per process, killed by cgroup.kill; memory.oom.group per process{}",
                base.display(),
                if *delegated {
                    format!(" (delegated: its cgroup's processes moved into {SUPERVISOR})")
                } else {
                    String::new()
                },
                if controllers.is_empty() {
                    "none".to_owned()
                } else {
                    controllers.join(" ")
                },
                if missing.is_empty() {
                    String::new()
                } else {
                    format!(
                        "; not enforced: {} limits (controllers not available to this cgroup)",
                        missing.join(" ")
                    )
                }
            )
        }
    }
}

/// Whether the hierarchy in use enforces `controller`'s limits (`pids`,
/// `memory`, `cpu`).
pub fn enforces(controller: &str) -> bool {
    match hierarchy() {
        Hierarchy::V1 => CONTROLLERS.contains(&controller),
        Hierarchy::V2 { controllers, .. } => controllers.contains(&controller),
    }
}

/// `exec-gateway` under a controller (all gateways).
pub(super) fn subtree(controller: &str) -> PathBuf {
    Path::new(CGROUP_ROOT).join(controller).join(SUBTREE)
}

pub(super) fn instance_name(pid: u32) -> String {
    format!("gw-{pid}")
}

/// This gateway's subtree under a controller.
pub(super) fn controller_dir(controller: &str) -> PathBuf {
    subtree(controller).join(own_instance())
}

/// This process's instance name, made once: cgroup paths are built
/// several times a spawn, and each `getpid` is a system call. (Only the
/// gateway's own process builds them: the reaper sidecar is re-executed
/// and names the gateway it watches.)
pub(super) fn own_instance() -> &'static str {
    static NAME: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    NAME.get_or_init(|| instance_name(std::process::id()))
}

/// A cgroup control file read whole, without `std::fs::read_to_string`'s
/// size probe (`statx` and `lseek`, which cgroupfs answers with 0 anyway):
/// a spawn reads several of these. Not capped: the kernel writes them, a
/// `cgroup.procs` bounded by the cgroup's `pids.max`, and a cut list would
/// make a kill or a freeze miss members.
pub(super) fn read_control(path: &Path) -> std::io::Result<String> {
    use std::io::Read as _;
    let mut s = String::new();
    // `take` makes it std's plain read loop, which probes nothing.
    std::fs::File::open(path)?
        .take(u64::MAX)
        .read_to_string(&mut s)?;
    Ok(s)
}

/// Enable `controllers` for `dir`'s children; returns those that took.
pub(super) fn hand_down(dir: &Path, controllers: &[&'static str]) -> Vec<&'static str> {
    controllers
        .iter()
        .copied()
        .filter(|c| std::fs::write(dir.join("cgroup.subtree_control"), format!("+{c}")).is_ok())
        .collect()
}
