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
//! cgroup v2 (`cgroup.kill`) is not implemented yet: v1 only.

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

/// Check that every controller is mounted and writable by doing it: create
/// (and remove) a probe cgroup in each. `Err` names what is missing.
pub fn probe() -> Result<(), String> {
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

/// Kill and remove the subtrees of gateways that are gone (the backstop
/// after a crash). Returns the kills sent.
pub fn cleanup_leftovers() -> usize {
    let Ok(instances) = std::fs::read_dir(subtree(MEMBERSHIP)) else {
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
        for pid in pids {
            // SAFETY: plain kill(2) on a pid read from the cgroup.
            if unsafe { libc::kill(pid, libc::SIGKILL) } == 0 {
                sent += 1;
            }
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    sent
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
}

impl TenantCgroup {
    /// Create (or reuse) the tenant's cgroups and apply `limits`.
    pub fn create(tenant: &str, limits: &CgroupLimits) -> io::Result<TenantCgroup> {
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
        })
    }

    /// Let `uid`/`gid` move processes into the per-process cgroups.
    pub fn set_owner(&mut self, owner: Option<(u32, u32)>) {
        self.owner = owner;
    }

    /// The tenant's `cgroup.procs` files a worker joins (its children
    /// inherit them): pids, cpu, and memory with a limit.
    pub fn tenant_procs(&self) -> io::Result<Vec<CString>> {
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
        controller_dir(MEMBERSHIP).join(&self.name).join(PROCS)
    }

    /// A fresh cgroup for one process: its own under the tenant's in the
    /// membership hierarchy, plus the tenant's cpu (and memory) cgroups.
    pub fn process(self: &Arc<Self>) -> io::Result<ProcessCgroup> {
        let reused = self.free.lock().pop();
        let rel = match reused {
            Some(rel) => rel,
            None => {
                let n = self.next.fetch_add(1, Ordering::Relaxed);
                let rel = Path::new(&self.name).join(PROCS).join(format!("p{n}"));
                let dir = controller_dir(MEMBERSHIP).join(&rel);
                std::fs::create_dir(&dir)?;
                if let Some((u, g)) = self.owner {
                    std::os::unix::fs::chown(dir.join("cgroup.procs"), Some(u), Some(g))?;
                }
                rel
            }
        };
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

/// The tenant memory cgroup's `oom_kill` counter.
fn oom_kills(tenant: &str) -> u64 {
    std::fs::read_to_string(
        controller_dir("memory")
            .join(tenant)
            .join("memory.oom_control"),
    )
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
        kill_dir(&controller_dir(MEMBERSHIP).join(&self.rel));
        kill_dir(&self.tenant.membership_dir());
    }

    /// True if the kernel OOM-killed something in the process's tenant
    /// while it ran (the memory limit is the tenant's, so with concurrent
    /// processes this names the limit, not necessarily this process).
    pub fn oom_killed(&self) -> bool {
        self.memory && oom_kills(&self.tenant.name) > self.oom_base
    }
}

impl Drop for ProcessCgroup {
    fn drop(&mut self) {
        // Whatever is left (background escapers) goes with the cgroup. The
        // cgroupfs calls sleep in the kernel, so keep them off async threads.
        let rel = std::mem::take(&mut self.rel);
        let tenant = self.tenant.clone();
        let retire = move || {
            let dir = controller_dir(MEMBERSHIP).join(&rel);
            kill_dir(&dir);
            if members(&dir).is_empty() {
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
