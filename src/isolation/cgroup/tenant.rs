//! A tenant's cgroup with its limits, and the per-process cgroups beneath
//! it: created or taken from the tenant's pool, killed, pooled again.

use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use super::kill::{cgroup_kill, kill_dir, members};
use super::layout::{
    CONTROLLERS, Hierarchy, MEMBERSHIP, PROCS, WORKERS, controller_dir, hand_down, hierarchy,
    own_instance, read_control,
};
use super::oom::{oom_kills, own_oom_kills};
use crate::config::{CPU_PERIOD_US, CgroupLimits};

/// Emptied per-process cgroups kept for reuse, per tenant: enough that a
/// burst of evictions does not turn into `rmdir`s, each of which holds the
/// cgroup mutex (and so every spawn's join) for up to ~10 ms here.
const FREE_POOL_MAX: usize = 4096;

/// On cgroup v1, what the tenant's sockets may buffer: its memory limit
/// divided by this (`memory.kmem.tcp.limit_in_bytes`; v1 counts it apart
/// from `memory.usage_in_bytes`, v2 within `memory.current`).
pub const V1_TCP_SHARE_OF_MEMORY: u64 = 4;

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
            let dir = base.join(own_instance()).join(tenant);
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
                // The limit is the tenant's memory, not memory plus swap
                // (absent without swap accounting: then nothing to cap).
                let _ = set("memory.swap.max", "0".to_owned());
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
            // v1 charges socket buffers to no one unless this is set (v2
            // charges them to the memory cgroup): the tenant's own sockets
            // and slirp4netns's for it. Absent from a kernel without it.
            match set(
                "memory",
                "memory.kmem.tcp.limit_in_bytes",
                v / V1_TCP_SHARE_OF_MEMORY,
            ) {
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                r => r?,
            }
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

    /// CPU time (µs) and peak memory (bytes) the tenant's cgroup has
    /// counted, where the kernel reports them (v2 `cpu.stat` and
    /// `memory.peak`, from Linux 5.19; v1 `cpuacct.usage` and
    /// `memory.max_usage_in_bytes`).
    pub fn usage(&self) -> (Option<u64>, Option<u64>) {
        let read = |p: PathBuf| std::fs::read_to_string(p).ok();
        let num = |s: Option<String>| s.and_then(|s| s.trim().parse::<u64>().ok());
        match &self.v2 {
            Some(dir) => {
                let cpu = read(dir.join("cpu.stat")).and_then(|s| {
                    s.lines()
                        .find_map(|l| l.strip_prefix("usage_usec "))
                        .and_then(|v| v.trim().parse().ok())
                });
                (cpu, num(read(dir.join("memory.peak"))))
            }
            None => (
                num(read(
                    controller_dir("cpu").join(&self.name).join("cpuacct.usage"),
                ))
                .map(|ns| ns / 1000),
                num(read(
                    controller_dir("memory")
                        .join(&self.name)
                        .join("memory.max_usage_in_bytes"),
                )),
            ),
        }
    }

    /// Kill whatever is left in the tenant's cgroups and remove them (a
    /// retired tenant; the next activation creates them afresh).
    pub fn remove(&self) {
        self.free.lock().clear();
        if let Some(dir) = &self.v2 {
            super::kill::remove_v2_tree(dir);
            return;
        }
        let membership = controller_dir(MEMBERSHIP).join(&self.name);
        let procs = membership.join(PROCS);
        if let Ok(entries) = std::fs::read_dir(&procs) {
            for e in entries.flatten() {
                if e.file_type().is_ok_and(|f| f.is_dir()) {
                    kill_dir(&e.path());
                    let _ = std::fs::remove_dir(e.path());
                }
            }
        }
        kill_dir(&procs);
        let _ = std::fs::remove_dir(&procs);
        kill_dir(&membership);
        for c in CONTROLLERS {
            let _ = std::fs::remove_dir(controller_dir(c).join(&self.name));
        }
    }

    /// The tenant's directory in the membership hierarchy (a worker's
    /// Landlock domain must reach its per-process cgroups).
    /// v2: the tenant's directory.
    pub(super) fn v2_dir(&self) -> Option<&Path> {
        self.v2.as_deref()
    }

    /// The tenant's directory name in each hierarchy.
    pub(super) fn name(&self) -> &str {
        &self.name
    }

    /// Whether its hierarchy is cgroup v2.
    pub fn is_v2(&self) -> bool {
        self.v2.is_some()
    }

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
                killed: AtomicBool::new(false),
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
            killed: AtomicBool::new(false),
        })
    }
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
    /// v2: `cgroup.kill` was written to it. Never pooled then: the kernel
    /// (6.18 here) kills at birth a child that `clone3(CLONE_INTO_CGROUP)`
    /// creates in a cgroup killed before, even an empty one (it compares
    /// the cgroup's kill count with the one of the parent's cgroup).
    killed: AtomicBool,
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

    /// cgroup v2: the process's own cgroup directory (a child can be
    /// created in it).
    pub fn v2_dir(&self) -> Option<PathBuf> {
        self.tenant
            .v2
            .as_ref()
            .map(|_| self.tenant.process_dir(&self.rel))
    }

    /// It is being killed (v2): it goes when it is empty, not back to the
    /// pool. Marked before the kill, which may find it empty already.
    pub fn mark_killed(&self) {
        if self.tenant.v2.is_some() {
            self.killed.store(true, Ordering::Relaxed);
        }
    }

    /// Kill everything in the cgroup (escapers included), and whatever
    /// moved itself out of its own cgroup into the tenant's `procs`.
    pub fn kill(&self) {
        if self.tenant.v2.is_some() {
            self.mark_killed();
            cgroup_kill(&self.tenant.process_dir(&self.rel));
        } else {
            kill_dir(&controller_dir(MEMBERSHIP).join(&self.rel));
        }
        kill_dir(&self.tenant.membership_dir());
    }

    /// Nothing is left in it: its leader reaped and no escaper behind. A
    /// cgroup that cannot be read is not empty.
    pub fn is_empty(&self) -> bool {
        read_control(&self.tenant.process_dir(&self.rel).join("cgroup.procs"))
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
        let mut killed = self.killed.load(Ordering::Relaxed);
        let retire = move || {
            let dir = tenant.process_dir(&rel);
            // Back to root before it is emptied and pooled: a tenant's
            // process could otherwise move itself into an idle pooled
            // cgroup, where no process's terminate or session close would
            // reach it.
            let locked = tenant.owner.is_none()
                || std::os::unix::fs::chown(dir.join("cgroup.procs"), Some(0), Some(0)).is_ok();
            if tenant.v2.is_some() {
                killed |= cgroup_kill(&dir);
            } else {
                kill_dir(&dir);
            }
            if locked && !killed && members(&dir).is_empty() {
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
