//! A snapshot's tree on disk, shared by the snapshot's record and its
//! forks' overlays.

use std::io;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};

use crate::image::unpack::Room as _;

/// A snapshot's tree: removed, and its bytes given back, when the
/// snapshot is deleted and the last fork using it has ended.
pub(super) struct Tree {
    /// `<id>/` in the tenant's directory; moved aside (`.deleted-…`) when
    /// its snapshot is deleted, so that the id can be restored again while
    /// forks still work on this one.
    pub(super) dir: parking_lot::Mutex<PathBuf>,
    pub(super) bytes: u64,
    pub(super) deleted: AtomicBool,
    pub(super) room: Arc<AtomicI64>,
}

impl Tree {
    pub(super) fn path(&self) -> PathBuf {
        self.dir.lock().join("tree")
    }

    /// Its directory now.
    pub(super) fn dir(&self) -> PathBuf {
        self.dir.lock().clone()
    }
}

impl Drop for Tree {
    fn drop(&mut self) {
        if self.deleted.load(Ordering::SeqCst) {
            // Emptied first: a descriptor a tenant's process still holds
            // (passed out of a fork) keeps an unlinked file's inode, not
            // its bytes, so the store's disk comes back whatever it holds.
            truncate_files(&self.path());
            let dir = self.dir();
            if let Err(e) = std::fs::remove_dir_all(&dir)
                && e.kind() != io::ErrorKind::NotFound
            {
                tracing::warn!(dir = %dir.display(), error = %e, "snapshot tree left on disk");
            }
            self.room.give(self.bytes);
        }
    }
}

/// Truncate every regular file under `dir` to nothing (never following a
/// link).
fn truncate_files(dir: &std::path::Path) {
    use rustix::fs::{AtFlags, FileType, Mode, OFlags};
    let open_dir = |at: &std::os::fd::OwnedFd, name: &std::ffi::CStr| {
        rustix::fs::openat(
            at,
            name,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )
    };
    let Ok(root) = rustix::fs::open(
        dir,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    ) else {
        return;
    };
    let mut stack = vec![root];
    while let Some(d) = stack.pop() {
        let Ok(listing) = rustix::fs::Dir::read_from(&d) else {
            continue;
        };
        let names: Vec<std::ffi::CString> = listing
            .flatten()
            .map(|e| e.file_name().to_owned())
            .filter(|n| n.as_bytes() != b"." && n.as_bytes() != b"..")
            .collect();
        for name in names {
            let Ok(st) = rustix::fs::statat(&d, name.as_c_str(), AtFlags::SYMLINK_NOFOLLOW) else {
                continue;
            };
            match FileType::from_raw_mode(st.st_mode) {
                FileType::Directory => {
                    if let Ok(sub) = open_dir(&d, name.as_c_str()) {
                        stack.push(sub);
                    }
                }
                FileType::RegularFile => {
                    if let Ok(f) = rustix::fs::openat(
                        &d,
                        name.as_c_str(),
                        OFlags::WRONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC,
                        Mode::empty(),
                    ) {
                        let _ = rustix::fs::ftruncate(&f, 0);
                    }
                }
                _ => {}
            }
        }
    }
}
