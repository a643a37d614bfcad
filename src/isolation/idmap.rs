//! Idmapped mounts of a tenant root (docs/isolation.md, "Users"): a tenant
//! whose uid the gateway allocated sees the files of its root's owner as
//! its own, and what it creates there is stored under that owner. The
//! directory a user started the gateway in stays theirs on disk, whatever
//! uid the tenant runs as, and nothing is chowned.
//!
//! A mapping is carried by a user namespace whose `uid_map` and `gid_map`
//! each hold one line ("owner tenant 1"); one is made per mapping, by a
//! short-lived child, and its descriptor kept for the life of the process.

#![allow(unsafe_code)]

use std::collections::HashMap;
use std::io;
use std::os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd};
use std::path::Path;
use std::sync::{Arc, Mutex, OnceLock};

/// On-disk owner of a root and the tenant ids it appears as.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct IdMap {
    pub owner_uid: u32,
    pub owner_gid: u32,
    pub uid: u32,
    pub gid: u32,
}

/// `struct mount_attr`.
#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}
const MOUNT_ATTR_IDMAP: u64 = 0x0010_0000;
const OPEN_TREE_CLONE: libc::c_uint = 1;
const AT_RECURSIVE: libc::c_uint = 0x8000;

fn check(r: libc::c_long) -> io::Result<libc::c_long> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

/// The user namespace carrying `map` (made once per mapping).
pub fn userns(map: IdMap) -> io::Result<Arc<OwnedFd>> {
    static MADE: OnceLock<Mutex<HashMap<IdMap, Arc<OwnedFd>>>> = OnceLock::new();
    let made = MADE.get_or_init(Default::default);
    let mut made = made.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(fd) = made.get(&map) {
        return Ok(fd.clone());
    }
    let fd = Arc::new(make_userns(map)?);
    made.insert(map, fd.clone());
    Ok(fd)
}

fn make_userns(map: IdMap) -> io::Result<OwnedFd> {
    // SAFETY: the child of this raw clone (no new stack: it runs on a
    // copy of ours, like fork) only blocks in pause() until killed; the
    // parent writes its maps, opens its namespace and reaps it.
    unsafe {
        let pid = check(libc::syscall(
            libc::SYS_clone,
            libc::CLONE_NEWUSER | libc::SIGCHLD,
            0usize,
            0usize,
            0usize,
            0usize,
        ))? as libc::pid_t;
        if pid == 0 {
            loop {
                libc::pause();
            }
        }
        let result = (|| {
            std::fs::write(
                format!("/proc/{pid}/uid_map"),
                format!("{} {} 1\n", map.owner_uid, map.uid),
            )?;
            std::fs::write(
                format!("/proc/{pid}/gid_map"),
                format!("{} {} 1\n", map.owner_gid, map.gid),
            )?;
            let path = std::ffi::CString::new(format!("/proc/{pid}/ns/user"))
                .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
            let fd = check(libc::open(path.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC).into())?;
            Ok(OwnedFd::from_raw_fd(fd as libc::c_int))
        })();
        libc::kill(pid, libc::SIGKILL);
        libc::waitpid(pid, std::ptr::null_mut(), 0);
        result
    }
}

/// Apply `userns` as the idmapping of the detached tree `tree` (and every
/// mount below it).
///
/// # Safety
/// Raw syscalls only: callable between fork and exec.
pub unsafe fn set_idmap(tree: libc::c_int, userns: libc::c_int) -> io::Result<()> {
    let attr = MountAttr {
        attr_set: MOUNT_ATTR_IDMAP,
        attr_clr: 0,
        propagation: 0,
        userns_fd: userns as u64,
    };
    // SAFETY: a valid pointer to a correctly sized `mount_attr`.
    check(unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            tree,
            c"".as_ptr(),
            (libc::AT_EMPTY_PATH as libc::c_uint) | AT_RECURSIVE,
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    })
    .map(|_| ())
}

/// A detached, idmapped copy of the tree at `path`: a directory descriptor
/// through which the gateway's own file operations see what the tenant's
/// processes see.
pub fn idmapped_tree(path: &Path, map: IdMap) -> io::Result<OwnedFd> {
    let ns = userns(map)?;
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes())
        .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: open_tree on a NUL-terminated path; the descriptor is ours.
    let tree = unsafe {
        let fd = check(libc::syscall(
            libc::SYS_open_tree,
            libc::AT_FDCWD,
            c.as_ptr(),
            OPEN_TREE_CLONE | AT_RECURSIVE | libc::O_CLOEXEC as libc::c_uint,
        ))?;
        OwnedFd::from_raw_fd(fd as libc::c_int)
    };
    // SAFETY: both descriptors are open.
    unsafe { set_idmap(tree.as_raw_fd(), ns.as_raw_fd())? };
    Ok(tree)
}

/// Why `path`'s filesystem may refuse an idmapping, for the error: tmpfs
/// supports it from Linux 6.3; empty when nothing is known.
pub fn why_not(path: &Path) -> String {
    let tmpfs = nix::sys::statfs::statfs(path)
        .is_ok_and(|s| s.filesystem_type() == nix::sys::statfs::TMPFS_MAGIC);
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let release = release.trim();
    if tmpfs && kernel_before(release, (6, 3)) {
        format!(": tmpfs on Linux {release}, which idmaps tmpfs from 6.3")
    } else {
        String::new()
    }
}

/// Whether a kernel `release` ("6.1.0-31-amd64") is older than `v`.
pub fn kernel_before(release: &str, v: (u32, u32)) -> bool {
    let mut parts = release
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|p| p.parse::<u32>().ok());
    match (parts.next(), parts.next()) {
        (Some(major), Some(minor)) => (major, minor) < v,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::kernel_before;

    #[test]
    fn kernel_releases_compare_by_major_and_minor() {
        assert!(kernel_before("6.1.0-31-amd64", (6, 3)));
        assert!(!kernel_before("6.12.95+deb12-amd64", (6, 3)));
        assert!(!kernel_before("6.3.0", (6, 3)));
        assert!(kernel_before("5.19.2", (6, 3)));
        assert!(!kernel_before("garbage", (6, 3)));
    }
}
