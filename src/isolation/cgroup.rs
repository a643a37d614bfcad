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

#![allow(unsafe_code)]

use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::config::{CPU_PERIOD_US, CgroupLimits};

/// Root of the v1 hierarchies.
const CGROUP_ROOT: &str = "/sys/fs/cgroup";
/// Our subtree under each controller.
const SUBTREE: &str = "exec-gateway";
/// Controllers used. Per-process cgroups live in `pids` (membership).
const CONTROLLERS: &[&str] = &["pids", "memory", "cpu"];
/// The controller that holds per-process cgroups.
const MEMBERSHIP: &str = "pids";
/// The directory under a tenant's membership cgroup holding per-process
/// cgroups (the only part of the tree a tenant's worker may write).
const PROCS: &str = "procs";
/// Emptied per-process cgroups kept for reuse, per tenant: enough that a
/// burst of evictions does not turn into `rmdir`s, each of which holds the
/// cgroup mutex (and so every spawn's join) for up to ~10 ms here.
const FREE_POOL_MAX: usize = 4096;
/// Kill rounds before giving up on a cgroup that will not empty.
const KILL_ROUNDS: usize = 50;

/// The hierarchy in use, fixed by [`probe`] (v1 until then).
#[derive(Debug, Clone)]
enum Hierarchy {
    V1,
    V2 {
        /// Where the cgroup2 filesystem is mounted.
        mount: PathBuf,
        /// `<parent>/exec-gateway`.
        base: PathBuf,
        /// Controllers handed down to tenants (of pids, memory, cpu).
        controllers: Vec<&'static str>,
    },
}

static HIERARCHY: std::sync::OnceLock<Hierarchy> = std::sync::OnceLock::new();

fn hierarchy() -> &'static Hierarchy {
    HIERARCHY.get().unwrap_or(&Hierarchy::V1)
}

/// The v2 leaf the gateway moves its own processes into when its cgroup
/// was delegated to it.
const SUPERVISOR: &str = "exec-gateway-supervisor";
/// The v2 leaf of a tenant's workers (root-owned: a tenant process cannot
/// move itself there).
const WORKERS: &str = "worker";

/// This gateway's v2 instance directory, when v2 is in use (the reaper
/// kills it if the gateway dies).
pub fn v2_instance() -> Option<PathBuf> {
    match hierarchy() {
        Hierarchy::V2 { base, .. } => Some(base.join(instance_name(std::process::id()))),
        Hierarchy::V1 => None,
    }
}

/// Which hierarchy is in use, for `/readyz` and logs.
pub fn describe() -> String {
    match hierarchy() {
        Hierarchy::V1 => "v1: pids, memory, cpu".to_owned(),
        Hierarchy::V2 {
            base, controllers, ..
        } => format!(
            "v2 at {} (controllers: {})",
            base.display(),
            if controllers.is_empty() {
                "none: limits are not enforced".to_owned()
            } else {
                controllers.join(" ")
            }
        ),
    }
}

/// The first cgroup2 mount point, preferring `/sys/fs/cgroup`.
fn cgroup2_mount() -> Option<PathBuf> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let mut found: Vec<PathBuf> = info
        .lines()
        .filter_map(|l| {
            let (pre, post) = l.split_once(" - ")?;
            let point = pre.split_whitespace().nth(4)?;
            (post.split_whitespace().next()? == "cgroup2").then(|| PathBuf::from(point))
        })
        .collect();
    found.sort_by_key(|p| p != Path::new(CGROUP_ROOT));
    found.into_iter().next()
}

fn is_cgroup2(p: &Path) -> bool {
    nix::sys::statfs::statfs(p)
        .is_ok_and(|s| s.filesystem_type() == nix::sys::statfs::CGROUP2_SUPER_MAGIC)
}

/// `exec-gateway` under a controller (all gateways).
fn subtree(controller: &str) -> PathBuf {
    Path::new(CGROUP_ROOT).join(controller).join(SUBTREE)
}

fn instance_name(pid: u32) -> String {
    format!("gw-{pid}")
}

/// This gateway's subtree under a controller.
fn controller_dir(controller: &str) -> PathBuf {
    subtree(controller).join(instance_name(std::process::id()))
}

/// Choose the hierarchy (`version`) and check it is usable by doing it:
/// create (and remove) a probe cgroup. `Err` says what is missing.
pub fn probe(version: crate::config::CgroupVersion) -> Result<(), String> {
    use crate::config::CgroupVersion;
    let v2 = match version {
        CgroupVersion::V1 => None,
        CgroupVersion::V2 => {
            Some(cgroup2_mount().ok_or_else(|| "no cgroup2 filesystem is mounted".to_owned())?)
        }
        CgroupVersion::Auto if is_cgroup2(Path::new(CGROUP_ROOT)) => {
            Some(PathBuf::from(CGROUP_ROOT))
        }
        CgroupVersion::Auto => None,
    };
    let chosen = match v2 {
        Some(mount) => probe_v2(mount)?,
        None => {
            probe_v1()?;
            Hierarchy::V1
        }
    };
    // The first probe decides for the process (one gateway per process).
    let _ = HIERARCHY.set(chosen);
    Ok(())
}

fn probe_v1() -> Result<(), String> {
    for c in CONTROLLERS {
        let base = Path::new(CGROUP_ROOT).join(c);
        if !base.join("cgroup.procs").exists() {
            return Err(format!(
                "cgroup v1 controller `{c}` is not mounted at {}",
                base.display()
            ));
        }
        let dir = controller_dir(c);
        std::fs::create_dir_all(&dir)
            .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        if *c == "memory" {
            // Children must be charged to their tenant's limit.
            let _ = std::fs::write(dir.join("memory.use_hierarchy"), "1");
        }
        let probe = dir.join(format!("probe-{}", std::process::id()));
        std::fs::create_dir(&probe)
            .map_err(|e| format!("cannot create {}: {e}", probe.display()))?;
        let _ = std::fs::remove_dir(&probe);
    }
    Ok(())
}

/// Set up the unified hierarchy mounted at `mount`: find (and, when it was
/// delegated, vacate) the gateway's cgroup, hand the controllers down to
/// our instance directory, and try a cgroup there.
fn probe_v2(mount: PathBuf) -> Result<Hierarchy, String> {
    let e = |what: &str, p: &Path, err: io::Error| format!("{what} {}: {err}", p.display());
    let own = std::fs::read_to_string("/proc/self/cgroup")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("0::").map(|p| p.trim().to_owned()))
        })
        .ok_or_else(|| "no cgroup v2 membership in /proc/self/cgroup".to_owned())?;
    let own = mount.join(own.trim_start_matches('/'));
    // A container runtime mounts the cgroup filesystem read-only; in the
    // container's own mount and cgroup namespaces, with CAP_SYS_ADMIN,
    // the mount may be made writable (deploy/README.md).
    if nix::unistd::access(&own, nix::unistd::AccessFlags::W_OK)
        .is_err_and(|e| e == nix::errno::Errno::EROFS)
    {
        remount_writable(&mount).map_err(|err| {
            e(
                "the cgroup filesystem is read-only and could not be remounted",
                &mount,
                err,
            )
        })?;
    }
    // The hierarchy's real root has no `cgroup.type` and may hold
    // processes; any other cgroup must be emptied into a leaf first.
    if own.join("cgroup.type").exists() {
        let leaf = own.join(SUPERVISOR);
        match std::fs::create_dir(&leaf) {
            Ok(()) => {}
            Err(err) if err.kind() == io::ErrorKind::AlreadyExists => {}
            Err(err) => return Err(e("cannot create", &leaf, err)),
        }
        for pid in members(&own) {
            std::fs::write(leaf.join("cgroup.procs"), pid.to_string())
                .map_err(|err| e("cannot move our processes into", &leaf, err))?;
        }
    }
    let parent = own;
    let available = std::fs::read_to_string(parent.join("cgroup.controllers")).unwrap_or_default();
    let mut controllers: Vec<&'static str> = CONTROLLERS
        .iter()
        .copied()
        .filter(|c| available.split_whitespace().any(|a| a == *c))
        .collect();
    let base = parent.join(SUBTREE);
    let instance = base.join(instance_name(std::process::id()));
    for dir in [&parent, &base, &instance] {
        if *dir != parent {
            std::fs::create_dir_all(dir).map_err(|err| e("cannot create", dir, err))?;
        }
        controllers = hand_down(dir, &controllers);
    }
    if !instance.join("cgroup.kill").exists() {
        return Err(format!(
            "{} has no cgroup.kill (needs Linux 5.14)",
            instance.display()
        ));
    }
    let probe = instance.join(format!("probe-{}", std::process::id()));
    std::fs::create_dir(&probe).map_err(|err| e("cannot create", &probe, err))?;
    let _ = std::fs::remove_dir(&probe);
    if controllers.len() < CONTROLLERS.len() {
        tracing::warn!(
            hierarchy = %mount.display(),
            available = %controllers.join(" "),
            "cgroup v2: not every controller (pids memory cpu) can be handed down: the missing limits are not enforced; membership and kills work"
        );
    }
    Ok(Hierarchy::V2 {
        mount,
        base,
        controllers,
    })
}

/// Clear the read-only flag of the mount at `mount`.
fn remount_writable(mount: &Path) -> io::Result<()> {
    let c = CString::new(mount.as_os_str().as_bytes())
        .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: mount(2) with a NUL-terminated path and no data.
    let r = unsafe {
        libc::mount(
            std::ptr::null(),
            c.as_ptr(),
            std::ptr::null(),
            libc::MS_REMOUNT | libc::MS_BIND | libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
            std::ptr::null(),
        )
    };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        tracing::info!(mount = %mount.display(), "cgroup filesystem remounted read-write");
        Ok(())
    }
}

/// Enable `controllers` for `dir`'s children; returns those that took.
fn hand_down(dir: &Path, controllers: &[&'static str]) -> Vec<&'static str> {
    controllers
        .iter()
        .copied()
        .filter(|c| std::fs::write(dir.join("cgroup.subtree_control"), format!("+{c}")).is_ok())
        .collect()
}

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
fn cgroup_kill(dir: &Path) -> bool {
    let populated = || {
        std::fs::read_to_string(dir.join("cgroup.events"))
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
fn cgroup_path(dir: &Path) -> Option<String> {
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

fn members(dir: &Path) -> Vec<i32> {
    std::fs::read_to_string(dir.join("cgroup.procs"))
        .map(|s| s.lines().filter_map(|l| l.trim().parse().ok()).collect())
        .unwrap_or_default()
}

/// SIGKILL every member; repeat until empty. A process forked while a
/// round runs is caught by the next one, and a killed process cannot fork,
/// so the rounds converge (`pids.max` bounds each). Returns kills sent.
fn kill_dir(dir: &Path) -> usize {
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
    super::signal::kill_checked(pid, || {
        std::fs::read_to_string(format!("/proc/{pid}/cgroup")).is_ok_and(|s| {
            s.lines().any(|l| {
                l.split_once(':')
                    .and_then(|(_, r)| r.split_once(':'))
                    .is_some_and(|(_, p)| p == path)
            })
        })
    })
}

/// Move the calling process into the cgroup whose `cgroup.procs` is
/// `procs` (writing "0" means "myself"). Safe between fork and exec:
/// open/write/close on a path computed before fork, nothing allocated.
pub fn join_self(procs: &std::ffi::CStr) -> io::Result<()> {
    // SAFETY: async-signal-safe syscalls on a valid NUL-terminated path; the
    // fd is closed on every path.
    unsafe {
        let fd = libc::open(procs.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        let ok = libc::write(fd, b"0".as_ptr().cast(), 1) == 1;
        let err = io::Error::last_os_error();
        libc::close(fd);
        if ok { Ok(()) } else { Err(err) }
    }
}

/// A tenant's cgroup (created with its limits).
#[derive(Debug)]
pub struct TenantCgroup {
    name: String,
    next: AtomicU64,
    /// Emptied per-process cgroups kept for reuse: `rmdir` waits out an RCU
    /// grace period under the cgroup mutex, which stalls the next `mkdir`
    /// (gRPC `Exec` at ~5 ms a spawn before this pool).
    free: parking_lot::Mutex<Vec<PathBuf>>,
    /// Whether processes join the memory cgroup (only with a limit).
    memory: bool,
    /// Owner given to per-process `cgroup.procs` (a worker running as the
    /// tenant's uid moves its children in).
    owner: Option<(u32, u32)>,
    /// v2: the tenant's directory (v1: none).
    v2: Option<PathBuf>,
}

/// `cpu.weight` (1–10000, default 100) for a v1 `cpu.shares` (2–262144,
/// default 1024), as systemd and the kernel documentation convert.
fn shares_to_weight(shares: u64) -> u64 {
    (1 + (shares.clamp(2, 262_144) - 2) * 9999 / 262_142).clamp(1, 10_000)
}

impl TenantCgroup {
    /// Create (or reuse) the tenant's cgroups and apply `limits`.
    pub fn create(tenant: &str, limits: &CgroupLimits) -> io::Result<TenantCgroup> {
        if let Hierarchy::V2 {
            base, controllers, ..
        } = hierarchy()
        {
            let dir = base.join(instance_name(std::process::id())).join(tenant);
            std::fs::create_dir_all(&dir)?;
            let on = hand_down(&dir, controllers);
            let set = |file: &str, v: String| std::fs::write(dir.join(file), v);
            if on.contains(&"pids")
                && let Some(v) = limits.pids_max
            {
                set("pids.max", v.to_string())?;
            }
            if on.contains(&"memory")
                && let Some(v) = limits.memory_max_bytes
            {
                set("memory.max", v.to_string())?;
            }
            if on.contains(&"cpu") {
                if let Some(v) = limits.cpu_shares {
                    set("cpu.weight", shares_to_weight(v).to_string())?;
                }
                if let Some(q) = limits.cpu_quota_us {
                    set("cpu.max", format!("{q} {CPU_PERIOD_US}"))?;
                }
            }
            match std::fs::create_dir(dir.join(WORKERS)) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(e),
            }
            return Ok(TenantCgroup {
                name: tenant.to_owned(),
                next: AtomicU64::new(1),
                free: parking_lot::Mutex::new(Vec::new()),
                memory: on.contains(&"memory"),
                owner: None,
                v2: Some(dir),
            });
        }
        for c in CONTROLLERS {
            std::fs::create_dir_all(controller_dir(c).join(tenant))?;
        }
        std::fs::create_dir_all(controller_dir(MEMBERSHIP).join(tenant).join(PROCS))?;
        let set = |c: &str, file: &str, v: u64| {
            std::fs::write(controller_dir(c).join(tenant).join(file), v.to_string())
        };
        if let Some(v) = limits.pids_max {
            set("pids", "pids.max", v)?;
        }
        if let Some(v) = limits.memory_max_bytes {
            set("memory", "memory.limit_in_bytes", v)?;
        }
        if let Some(v) = limits.cpu_shares {
            set("cpu", "cpu.shares", v)?;
        }
        if let Some(q) = limits.cpu_quota_us {
            set("cpu", "cpu.cfs_period_us", CPU_PERIOD_US)?;
            set("cpu", "cpu.cfs_quota_us", q)?;
        }
        Ok(TenantCgroup {
            name: tenant.to_owned(),
            next: AtomicU64::new(1),
            free: parking_lot::Mutex::new(Vec::new()),
            memory: limits.memory_max_bytes.is_some(),
            owner: None,
            v2: None,
        })
    }

    /// Let `uid`/`gid` move processes into the per-process cgroups. On v2
    /// that takes write access to the common ancestor's `cgroup.procs`
    /// (the tenant's), where a process cannot stay: with controllers
    /// handed down the kernel refuses it (no internal processes), and a
    /// process that got there anyway is killed with the next kill.
    pub fn set_owner(&mut self, owner: Option<(u32, u32)>) -> io::Result<()> {
        self.owner = owner;
        if let (Some(dir), Some((u, g))) = (&self.v2, owner) {
            std::os::unix::fs::chown(dir.join("cgroup.procs"), Some(u), Some(g))?;
        }
        Ok(())
    }

    /// The tenant's `cgroup.procs` files a worker joins (its children
    /// inherit them): pids, cpu, and memory with a limit.
    pub fn tenant_procs(&self) -> io::Result<Vec<CString>> {
        if let Some(dir) = &self.v2 {
            let p = dir.join(WORKERS).join("cgroup.procs");
            return Ok(vec![
                CString::new(p.into_os_string().into_encoded_bytes())
                    .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?,
            ]);
        }
        let mut controllers = vec![MEMBERSHIP, "cpu"];
        if self.memory {
            controllers.push("memory");
        }
        controllers
            .into_iter()
            .map(|c| {
                let p = controller_dir(c).join(&self.name).join("cgroup.procs");
                CString::new(p.into_os_string().into_encoded_bytes())
                    .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))
            })
            .collect()
    }

    /// The tenant's directory in the membership hierarchy (a worker's
    /// Landlock domain must reach its per-process cgroups).
    pub fn membership_dir(&self) -> PathBuf {
        match &self.v2 {
            Some(dir) => dir.clone(),
            None => controller_dir(MEMBERSHIP).join(&self.name).join(PROCS),
        }
    }

    /// Where this tenant's per-process cgroups live (v1: in the
    /// membership hierarchy), for a path relative to it.
    fn process_dir(&self, rel: &Path) -> PathBuf {
        match &self.v2 {
            Some(dir) => dir.join(rel),
            None => controller_dir(MEMBERSHIP).join(rel),
        }
    }

    /// A fresh cgroup for one process: its own under the tenant's in the
    /// membership hierarchy, plus the tenant's cpu (and memory) cgroups.
    pub fn process(self: &Arc<Self>) -> io::Result<ProcessCgroup> {
        let reused = self.free.lock().pop();
        let rel = match reused {
            Some(rel) => {
                // Pooled, it was root's (nothing of the tenant's could move
                // into it); the process's own spawn joins it as the tenant.
                if let Some((u, g)) = self.owner {
                    std::os::unix::fs::chown(
                        self.process_dir(&rel).join("cgroup.procs"),
                        Some(u),
                        Some(g),
                    )?;
                }
                rel
            }
            None => {
                let n = self.next.fetch_add(1, Ordering::Relaxed);
                let rel = match self.v2 {
                    Some(_) => PathBuf::from(format!("p{n}")),
                    None => Path::new(&self.name).join(PROCS).join(format!("p{n}")),
                };
                let dir = self.process_dir(&rel);
                std::fs::create_dir(&dir)?;
                if self.v2.is_some() && self.memory {
                    // An OOM kill takes the whole process tree.
                    std::fs::write(dir.join("memory.oom.group"), "1")?;
                }
                if let Some((u, g)) = self.owner {
                    std::os::unix::fs::chown(dir.join("cgroup.procs"), Some(u), Some(g))?;
                }
                rel
            }
        };
        if self.v2.is_some() {
            let own = self.process_dir(&rel).join("cgroup.procs");
            return Ok(ProcessCgroup {
                procs: vec![
                    CString::new(own.into_os_string().into_encoded_bytes())
                        .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?,
                ],
                oom_base: if self.memory {
                    own_oom_kills(&self.process_dir(&rel))
                } else {
                    0
                },
                rel,
                memory: self.memory,
                tenant: self.clone(),
            });
        }
        let cstr = |p: PathBuf| {
            CString::new(p.as_os_str().as_encoded_bytes())
                .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))
        };
        let own = controller_dir(MEMBERSHIP).join(&rel);
        let mut procs = vec![cstr(own.join("cgroup.procs"))?];
        procs.push(cstr(
            controller_dir("cpu").join(&self.name).join("cgroup.procs"),
        )?);
        if self.memory {
            procs.push(cstr(
                controller_dir("memory")
                    .join(&self.name)
                    .join("cgroup.procs"),
            )?);
        }
        let oom_base = if self.memory {
            oom_kills(&self.name)
        } else {
            0
        };
        Ok(ProcessCgroup {
            rel,
            procs,
            memory: self.memory,
            oom_base,
            tenant: self.clone(),
        })
    }
}

/// The tenant memory cgroup's `oom_kill` counter (v1).
fn oom_kills(tenant: &str) -> u64 {
    oom_kill_line(
        &controller_dir("memory")
            .join(tenant)
            .join("memory.oom_control"),
    )
}

/// A v2 process cgroup's own `oom_kill` counter.
fn own_oom_kills(dir: &Path) -> u64 {
    oom_kill_line(&dir.join("memory.events"))
}

/// The `oom_kill N` line of a memory controller file; 0 when unreadable.
fn oom_kill_line(file: &Path) -> u64 {
    std::fs::read_to_string(file)
        .ok()
        .and_then(|s| {
            s.lines().find_map(|l| {
                l.strip_prefix("oom_kill ")
                    .and_then(|n| n.trim().parse().ok())
            })
        })
        .unwrap_or(0)
}

/// One process's cgroup.
#[derive(Debug)]
pub struct ProcessCgroup {
    rel: PathBuf,
    procs: Vec<CString>,
    memory: bool,
    /// The tenant's OOM kills before this process started.
    oom_base: u64,
    /// Where the emptied cgroup goes back to.
    tenant: Arc<TenantCgroup>,
}

impl ProcessCgroup {
    /// The `cgroup.procs` files a process spawned by the gateway itself
    /// joins: its own cgroup, then the tenant's cpu (and memory) cgroups.
    pub fn procs_paths(&self) -> Vec<PathBuf> {
        self.procs
            .iter()
            .map(|p| PathBuf::from(std::ffi::OsStr::from_bytes(p.as_bytes())))
            .collect()
    }

    /// The process's own `cgroup.procs` only (a worker already sits in the
    /// tenant's cgroups, and its children inherit them).
    pub fn own_procs_path(&self) -> PathBuf {
        self.procs_paths().into_iter().next().unwrap_or_default()
    }

    /// Kill everything in the cgroup (escapers included), and whatever
    /// moved itself out of its own cgroup into the tenant's `procs`.
    pub fn kill(&self) {
        if self.tenant.v2.is_some() {
            cgroup_kill(&self.tenant.process_dir(&self.rel));
        } else {
            kill_dir(&controller_dir(MEMBERSHIP).join(&self.rel));
        }
        kill_dir(&self.tenant.membership_dir());
    }

    /// Nothing is left in it: its leader reaped and no escaper behind. A
    /// cgroup that cannot be read is not empty.
    pub fn is_empty(&self) -> bool {
        std::fs::read_to_string(self.tenant.process_dir(&self.rel).join("cgroup.procs"))
            .is_ok_and(|s| s.trim().is_empty())
    }

    /// True if the kernel OOM-killed something while the process ran: v2
    /// counts the process's own cgroup, v1 the tenant's (the memory limit
    /// is the tenant's, so with concurrent processes this names the limit,
    /// not necessarily this process). Counted from when this process got
    /// the cgroup, which may have served others before.
    pub fn oom_killed(&self) -> bool {
        if !self.memory {
            return false;
        }
        let now = match self.tenant.v2 {
            Some(_) => own_oom_kills(&self.tenant.process_dir(&self.rel)),
            None => oom_kills(&self.tenant.name),
        };
        now > self.oom_base
    }
}

impl Drop for ProcessCgroup {
    fn drop(&mut self) {
        // Whatever is left (background escapers) goes with the cgroup. The
        // cgroupfs calls sleep in the kernel, so keep them off async threads.
        let rel = std::mem::take(&mut self.rel);
        let tenant = self.tenant.clone();
        let retire = move || {
            let dir = tenant.process_dir(&rel);
            // Back to root before it is emptied and pooled: a tenant's
            // process could otherwise move itself into an idle pooled
            // cgroup, where no process's terminate or session close would
            // reach it.
            let locked = tenant.owner.is_none()
                || std::os::unix::fs::chown(dir.join("cgroup.procs"), Some(0), Some(0)).is_ok();
            if tenant.v2.is_some() {
                cgroup_kill(&dir);
            } else {
                kill_dir(&dir);
            }
            if locked && members(&dir).is_empty() {
                let mut free = tenant.free.lock();
                if free.len() < FREE_POOL_MAX {
                    free.push(rel);
                    return;
                }
            }
            let _ = std::fs::remove_dir(&dir);
        };
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => drop(rt.spawn_blocking(retire)),
            Err(_) => retire(),
        }
    }
}
