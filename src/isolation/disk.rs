//! What a tenant may put on disk (docs/isolation.md, "Disk").
//!
//! - **`/tmp`**: the tenant's private `/tmp` is a tmpfs of
//!   `max_tmp_bytes`, mounted on its directory under the gateway's state
//!   directory (every worker of the tenant binds that same mount, and file
//!   operations see it too). Its pages are charged to the memory cgroup of
//!   the process that writes them, the tenant's, so `/tmp` also counts
//!   against `memory_max_bytes`. A full `/tmp` gives the writer ENOSPC.
//! - **The root**: an XFS/ext4 project quota of `max_disk_bytes` (the
//!   `[isolation] disk` layer), where the root's filesystem is mounted with
//!   `prjquota`: the root and everything below it carry the tenant's project
//!   id (inherited by what is created later), and the kernel refuses
//!   writes past the limit with EDQUOT. Where the filesystem keeps no
//!   project quota the layer is inactive, reported in `/readyz`, and
//!   refused at start under `required`.

#![allow(unsafe_code)]

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd as _, OwnedFd};
use std::path::Path;

/// Mount a tmpfs of `bytes` on `dir`, owned by `ids` (a mount a dead
/// gateway left there is detached first: `/tmp` does not outlive its
/// gateway).
pub fn mount_tmp(dir: &Path, bytes: u64, ids: Option<(u32, u32)>) -> io::Result<()> {
    let path = CString::new(dir.as_os_str().as_encoded_bytes())
        .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    if is_mount_point(dir) {
        unmount(dir);
    }
    let (uid, gid) = ids.unwrap_or((0, 0));
    let opts = CString::new(format!(
        "size={bytes},mode=0700,uid={uid},gid={gid},nr_inodes={}",
        tmp_inodes(bytes)
    ))
    .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: mount with NUL-terminated strings.
    let r = unsafe {
        libc::mount(
            c"exec-gateway-tmp".as_ptr(),
            path.as_ptr(),
            c"tmpfs".as_ptr(),
            libc::MS_NOSUID | libc::MS_NODEV,
            opts.as_ptr().cast(),
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Detach the mount on `dir` (lazily: processes still in it keep it
/// until they are gone).
pub fn unmount(dir: &Path) {
    if let Ok(path) = CString::new(dir.as_os_str().as_encoded_bytes()) {
        // SAFETY: umount2 of a NUL-terminated path.
        unsafe { libc::umount2(path.as_ptr(), libc::MNT_DETACH) };
    }
}

/// Inodes of a `/tmp` of `bytes`: one per 4 KiB, at least 1,024 (a tiny
/// file still costs an inode; without a cap, inodes are memory too).
fn tmp_inodes(bytes: u64) -> u64 {
    (bytes / 4096).max(1024)
}

/// Bytes in use on the filesystem at `dir`.
pub fn used_bytes(dir: &Path) -> io::Result<u64> {
    let s = nix::sys::statvfs::statvfs(dir).map_err(io::Error::from)?;
    let block = s.fragment_size();
    Ok((s.blocks() - s.blocks_free()) * block)
}

pub fn is_mount_point(dir: &Path) -> bool {
    use std::os::unix::fs::MetadataExt as _;
    match (std::fs::metadata(dir), dir.parent().map(std::fs::metadata)) {
        (Ok(d), Some(Ok(p))) => d.dev() != p.dev(),
        _ => false,
    }
}

// quotactl(2) for project quotas, through quotactl_fd (Linux 5.14): no
// block device path needed, only a descriptor on the filesystem.
const PRJQUOTA: u32 = 2;
const Q_GETINFO: u32 = 0x80_0005;
const Q_GETQUOTA: u32 = 0x80_0007;
const Q_SETQUOTA: u32 = 0x80_0008;
/// `Q_XGETQSTATV`: accounting and enforcement state of each quota type.
const Q_XGETQSTATV: u32 = 0x5808;
const FS_QSTATV_VERSION1: u8 = 1;
/// In `fs_quota_statv.qs_flags`: project quota limits are enforced.
const FS_QUOTA_PDQ_ENFD: u16 = 1 << 5;
const QIF_BLIMITS: u32 = 1;
/// `dqb_bhardlimit` is in these units.
const QIF_DQBLKSIZE: u64 = 1024;
/// `FS_IOC_FSGETXATTR` / `FS_IOC_FSSETXATTR` and the inherit flag.
const FS_IOC_FSGETXATTR: libc::c_ulong = 0x801c_581f;
const FS_IOC_FSSETXATTR: libc::c_ulong = 0x401c_5820;
const FS_XFLAG_PROJINHERIT: u32 = 0x200;
/// Entries below a root given the tenant's project id at start, at most
/// (later ones inherit it).
const TAG_LIMIT: usize = 1_000_000;

#[repr(C)]
#[derive(Default)]
struct IfDqblk {
    bhardlimit: u64,
    bsoftlimit: u64,
    curspace: u64,
    ihardlimit: u64,
    isoftlimit: u64,
    curinodes: u64,
    btime: u64,
    itime: u64,
    valid: u32,
}

#[repr(C)]
#[derive(Default)]
struct IfDqinfo {
    bgrace: u64,
    igrace: u64,
    flags: u32,
    valid: u32,
}

#[repr(C)]
#[derive(Default)]
struct FsXattr {
    xflags: u32,
    extsize: u32,
    nextents: u32,
    projid: u32,
    cowextsize: u32,
    pad: [u8; 8],
}

fn qcmd(cmd: u32) -> libc::c_int {
    ((cmd << 8) | (PRJQUOTA & 0xff)) as libc::c_int
}

fn quotactl(fd: &OwnedFd, cmd: u32, id: u32, addr: *mut libc::c_void) -> io::Result<()> {
    // SAFETY: quotactl_fd with a descriptor we hold and a buffer of the
    // type `cmd` expects.
    let r = unsafe {
        libc::syscall(
            libc::SYS_quotactl_fd,
            fd.as_raw_fd(),
            qcmd(cmd) as libc::c_uint,
            id as libc::c_int,
            addr,
        )
    };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

fn open_dir(p: &Path) -> io::Result<OwnedFd> {
    use std::os::unix::fs::OpenOptionsExt as _;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW)
        .open(p)?;
    Ok(OwnedFd::from(f))
}

/// Whether `root`'s filesystem keeps project quotas.
pub fn probe_project_quota(root: &Path) -> Result<(), String> {
    let fd = open_dir(root).map_err(|e| format!("{}: {e}", root.display()))?;
    let mut info = IfDqinfo::default();
    quotactl(&fd, Q_GETINFO, 0, (&raw mut info).cast()).map_err(|e| {
        let why = match e.raw_os_error() {
            Some(libc::ENOSYS) => "the kernel has no quota support (CONFIG_QUOTA)".to_owned(),
            Some(libc::ESRCH) => {
                "project quotas are not enabled on its filesystem (mount it with prjquota)"
                    .to_owned()
            }
            _ => e.to_string(),
        };
        format!("{}: {why}", root.display())
    })?;
    // Tracked is not enforced: ext4 with the quota feature counts project
    // usage at every mount, but enforces limits only when mounted with
    // `prjquota` (xfs: `pquota` or `prjquota`).
    // `struct fs_quota_statv` (160 bytes): version, pad, flags, then
    // counters this check does not read.
    #[repr(C, align(8))]
    struct StatV([u8; 160]);
    let mut statv = StatV([0; 160]);
    statv.0[0] = FS_QSTATV_VERSION1;
    quotactl(&fd, Q_XGETQSTATV, 0, (&raw mut statv).cast())
        .map_err(|e| format!("{}: quota state: {e}", root.display()))?;
    let flags = u16::from_ne_bytes([statv.0[2], statv.0[3]]);
    if flags & FS_QUOTA_PDQ_ENFD == 0 {
        return Err(format!(
            "{}: project quotas are tracked but not enforced on its filesystem (mount it with prjquota)",
            root.display()
        ));
    }
    Ok(())
}

/// A tenant root under a project quota.
#[derive(Debug)]
pub struct RootQuota {
    fd: OwnedFd,
    projid: u32,
}

impl RootQuota {
    /// Give `root` and what lies below it project `projid` (inherited by
    /// new entries) and limit the project to `bytes`.
    pub fn apply(root: &Path, projid: u32, bytes: u64) -> io::Result<RootQuota> {
        let fd = open_dir(root)?;
        let mut seen = 0usize;
        tag(&fd, projid, true)?;
        tag_below(root, projid, &mut seen);
        let mut q = IfDqblk {
            bhardlimit: bytes.div_ceil(QIF_DQBLKSIZE),
            bsoftlimit: bytes.div_ceil(QIF_DQBLKSIZE),
            valid: QIF_BLIMITS,
            ..IfDqblk::default()
        };
        quotactl(&fd, Q_SETQUOTA, projid, (&raw mut q).cast())?;
        Ok(RootQuota { fd, projid })
    }

    /// Bytes the project uses.
    pub fn used_bytes(&self) -> io::Result<u64> {
        let mut q = IfDqblk::default();
        quotactl(&self.fd, Q_GETQUOTA, self.projid, (&raw mut q).cast())?;
        Ok(q.curspace)
    }
}

/// Set `projid` (and, on directories, the inherit flag) on `fd`.
fn tag(fd: &OwnedFd, projid: u32, dir: bool) -> io::Result<()> {
    let mut x = FsXattr::default();
    // SAFETY: the fsxattr ioctls with a buffer of their type.
    unsafe {
        if libc::ioctl(fd.as_raw_fd(), FS_IOC_FSGETXATTR, &raw mut x) < 0 {
            return Err(io::Error::last_os_error());
        }
        x.projid = projid;
        if dir {
            x.xflags |= FS_XFLAG_PROJINHERIT;
        }
        if libc::ioctl(fd.as_raw_fd(), FS_IOC_FSSETXATTR, &raw const x) < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Tag what already lies below `dir` (symlinks and special files are
/// skipped: their blocks are few, and opening them could follow a link).
fn tag_below(dir: &Path, projid: u32, seen: &mut usize) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        *seen += 1;
        if *seen > TAG_LIMIT {
            return;
        }
        let Ok(ft) = e.file_type() else { continue };
        let path = e.path();
        if ft.is_dir() {
            if let Ok(fd) = open_dir(&path) {
                let _ = tag(&fd, projid, true);
            }
            tag_below(&path, projid, seen);
        } else if ft.is_file() {
            use std::os::unix::fs::OpenOptionsExt as _;
            if let Ok(f) = std::fs::OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
                .open(&path)
            {
                let _ = tag(&OwnedFd::from(f), projid, false);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_small_tmp_still_has_inodes_and_a_large_one_has_one_per_page() {
        assert_eq!(tmp_inodes(1 << 20), 1024);
        assert_eq!(tmp_inodes(1 << 30), (1 << 30) / 4096);
    }

    #[test]
    fn quota_commands_name_project_quotas() {
        assert_eq!(qcmd(Q_SETQUOTA), 0x8000_0802u32 as libc::c_int);
    }
}
