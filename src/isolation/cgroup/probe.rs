//! Choosing the hierarchy at start and checking it is usable by doing it
//! (v1 controllers, or the v2 unified hierarchy, delegated or not).

#![allow(unsafe_code)]

use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt as _;
use std::path::{Path, PathBuf};

use super::kill::members;
use super::layout::{
    CGROUP_ROOT, CONTROLLERS, HIERARCHY, Hierarchy, SUBTREE, SUPERVISOR, controller_dir, hand_down,
    instance_name,
};

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
        Some(mount) => {
            hint_favordynmods(&mount);
            probe_v2(mount)?
        }
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

/// Passes over a delegated cgroup's processes when moving them into the
/// supervisor leaf (processes keep starting there in a pod).
const VACATE_PASSES: usize = 100;

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
    let parent = own;
    let available = std::fs::read_to_string(parent.join("cgroup.controllers")).unwrap_or_default();
    let mut controllers: Vec<&'static str> = CONTROLLERS
        .iter()
        .copied()
        .filter(|c| available.split_whitespace().any(|a| a == *c))
        .collect();
    // The hierarchy's real root has no `cgroup.type` and may hold
    // processes; any other cgroup must be emptied into a leaf first.
    let delegated = parent.join("cgroup.type").exists();
    if delegated {
        controllers = vacate_and_hand_down(&parent, &controllers)?;
    } else {
        controllers = hand_down(&parent, &controllers);
    }
    let base = parent.join(SUBTREE);
    let instance = base.join(instance_name(std::process::id()));
    for dir in [&base, &instance] {
        std::fs::create_dir_all(dir).map_err(|err| e("cannot create", dir, err))?;
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
        delegated,
    })
}

/// Move every process of the delegated cgroup `own` into the supervisor
/// leaf, then enable `controllers` for its children; returns those that
/// took. Every process, not only the gateway's: v2 lets a cgroup with
/// controllers enabled for its children hold no process of its own, and in
/// a pod the container's init (tini) shares the gateway's cgroup. Runtimes
/// that add a process later (`kubectl exec`, exec probes) meet EBUSY there
/// and join the init's cgroup instead, which is then the leaf (runc since
/// 1.0, crun since 0.14): docs/isolation.md, "Kernels".
///
/// A process that exits between the listing and its move is gone (ESRCH);
/// one started meanwhile is moved on the next pass, and one that arrives
/// after the last move makes enabling fail (EBUSY): then again.
fn vacate_and_hand_down(
    own: &Path,
    controllers: &[&'static str],
) -> Result<Vec<&'static str>, String> {
    let e = |what: &str, p: &Path, err: io::Error| format!("{what} {}: {err}", p.display());
    let leaf = own.join(SUPERVISOR);
    match std::fs::create_dir(&leaf) {
        Ok(()) => {}
        Err(err) if err.kind() == io::ErrorKind::AlreadyExists => {}
        Err(err) => return Err(e("cannot create", &leaf, err)),
    }
    for _ in 0..VACATE_PASSES {
        for pid in members(own) {
            match std::fs::write(leaf.join("cgroup.procs"), pid.to_string()) {
                Ok(()) => {}
                Err(err) if err.raw_os_error() == Some(libc::ESRCH) => {}
                Err(err) => return Err(e("cannot move our processes into", &leaf, err)),
            }
        }
        if !members(own).is_empty() {
            continue;
        }
        let on = hand_down(own, controllers);
        // Short of some: a process arrived (again), or a controller cannot
        // be enabled here at all (then the caller reports it).
        if on.len() == controllers.len() || members(own).is_empty() {
            return Ok(on);
        }
    }
    Err(format!(
        "{} keeps gaining processes: it could not be emptied into {SUPERVISOR} in {VACATE_PASSES} passes",
        own.display()
    ))
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

/// The first cgroup2 mount point, preferring `/sys/fs/cgroup`.
fn cgroup2_mount() -> Option<PathBuf> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let mut found: Vec<PathBuf> = cgroup2_mounts(&info)
        .map(|(point, _)| PathBuf::from(point))
        .collect();
    found.sort_by_key(|p| p != Path::new(CGROUP_ROOT));
    found.into_iter().next()
}

/// The cgroup2 filesystems in `mountinfo`: (mount point, superblock options).
fn cgroup2_mounts(mountinfo: &str) -> impl Iterator<Item = (&str, &str)> {
    mountinfo.lines().filter_map(|l| {
        let (pre, post) = l.split_once(" - ")?;
        let point = pre.split_whitespace().nth(4)?;
        // The filesystem type, the source, then the superblock's options.
        let mut fields = post.split_whitespace();
        (fields.next()? == "cgroup2").then_some((point, fields.nth(1).unwrap_or("")))
    })
}

/// Say so when the cgroup2 filesystem lacks `favordynmods`: without it
/// every move into a cgroup (a cold tenant's worker, its first process)
/// may wait for an RCU grace period. The gateway does not remount it
/// itself: the option is the whole host's, and the kernel keeps it on.
fn hint_favordynmods(mount: &Path) {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    if favors_dynmods(&info, mount) == Some(false) {
        tracing::info!(
            mount = %mount.display(),
            "cgroup2 is mounted without favordynmods: a cold tenant's cgroup moves may each wait \
             for an RCU grace period (milliseconds); `mount -o remount,favordynmods {}` on the host \
             (or a kernel built with CONFIG_CGROUP_FAVOR_DYNMODS) removes the wait",
            mount.display()
        );
    }
}

/// Whether the cgroup2 filesystem mounted at `mount` has `favordynmods`
/// among its superblock options (`None`: not found in `mountinfo`).
fn favors_dynmods(mountinfo: &str, mount: &Path) -> Option<bool> {
    cgroup2_mounts(mountinfo)
        .find(|(point, _)| Path::new(point) == mount)
        .map(|(_, opts)| opts.split(',').any(|o| o == "favordynmods"))
}

fn is_cgroup2(p: &Path) -> bool {
    nix::sys::statfs::statfs(p)
        .is_ok_and(|s| s.filesystem_type() == nix::sys::statfs::CGROUP2_SUPER_MAGIC)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn favordynmods_is_read_from_the_superblock_options() {
        let info = "\
35 24 0:30 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:9 - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot
36 24 0:31 / /mnt/cg rw,relatime shared:10 - cgroup2 none rw,nsdelegate,favordynmods
37 24 0:32 / /sys/fs/cgroup/memory rw,relatime shared:11 - cgroup cgroup rw,memory
";
        assert_eq!(
            favors_dynmods(info, Path::new("/sys/fs/cgroup")),
            Some(false)
        );
        assert_eq!(favors_dynmods(info, Path::new("/mnt/cg")), Some(true));
        // A v1 hierarchy or an unknown path says nothing.
        assert_eq!(
            favors_dynmods(info, Path::new("/sys/fs/cgroup/memory")),
            None
        );
        assert_eq!(favors_dynmods(info, Path::new("/nowhere")), None);
    }
}
