//! A fork's workspace: the snapshot's tree as the lower layer of an
//! overlay whose upper layer is a tmpfs of its own.
//!
//! `forks/<random>/` is a tmpfs of the tenant's disk bound (`max_disk_bytes`)
//! holding `upper/` (the tenant's), `work/` and `merged/`, where the
//! overlay is mounted `nosuid,nodev`. What the fork writes lands in the
//! tmpfs: bounded whatever filesystem holds the store, and its pages are
//! charged to the memory cgroup of the process that writes them, the
//! tenant's. Forking costs two mounts, whatever the tree's size; nothing is
//! copied until written (overlayfs copies a file up at its first write).
//!
//! The tree is never written: a snapshot's forks share it read-only, and it
//! outlives its snapshot's deletion while a fork uses it.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use super::tree::Tree;

/// A fork's workspace, mounted while this lives.
pub struct Workspace {
    dir: PathBuf,
    merged: PathBuf,
    /// Held: the tree stays while the overlay stands on it.
    tree: Arc<Tree>,
    /// The tenant's forks working now: this one given back when it ends.
    forks: Arc<AtomicUsize>,
}

impl std::fmt::Debug for Workspace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Workspace")
            .field("merged", &self.merged)
            .finish_non_exhaustive()
    }
}

impl Workspace {
    /// Mount a fork of `tree` (the tenant's fork count already taken:
    /// given back when this ends, or if it fails).
    pub(super) fn mount(
        count: Arc<AtomicUsize>,
        forks: &Path,
        tree: Arc<Tree>,
        (uid, gid): (u32, u32),
        tmp_bytes: u64,
    ) -> io::Result<Workspace> {
        use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
        let dir = forks.join(uuid::Uuid::new_v4().simple().to_string());
        std::fs::create_dir(&dir)?;
        // From here on, a failure unmounts and removes what was made, and
        // gives the fork back (drop).
        let ws = Workspace {
            merged: dir.join("merged"),
            dir,
            tree,
            forks: count,
        };
        crate::isolation::disk::mount_tmp(&ws.dir, tmp_bytes, None)?;
        let lower = ws.tree.path();
        let upper = ws.dir.join("upper");
        let work = ws.dir.join("work");
        for d in [&upper, &work, &ws.merged] {
            std::fs::create_dir(d)?;
        }
        // The merged root is the upper one: the snapshot root's mode, the
        // tenant's.
        let mode = std::fs::metadata(&lower)?.mode() & 0o7777;
        std::fs::set_permissions(&upper, std::fs::Permissions::from_mode(mode))?;
        std::os::unix::fs::chown(&upper, Some(uid), Some(gid))?;
        let data = format!(
            "lowerdir={},upperdir={},workdir={}",
            lower.display(),
            upper.display(),
            work.display()
        );
        if data.len() > 4000
            || [&lower, &upper, &work].iter().any(|p| {
                let s = p.display().to_string();
                s.contains(',') || s.contains(':')
            })
        {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "the snapshot store's path cannot be written in overlay options",
            ));
        }
        use rustix::mount::MountFlags;
        rustix::mount::mount(
            "exec-gateway-fork",
            &ws.merged,
            "overlay",
            MountFlags::NOSUID | MountFlags::NODEV,
            Some(
                std::ffi::CString::new(data)
                    .map_err(io::Error::other)?
                    .as_c_str(),
            ),
        )?;
        Ok(ws)
    }

    /// Where the workspace is mounted on the host.
    pub fn path(&self) -> &Path {
        &self.merged
    }
}

impl Drop for Workspace {
    fn drop(&mut self) {
        crate::isolation::disk::unmount(&self.merged);
        crate::isolation::disk::unmount(&self.dir);
        let _ = std::fs::remove_dir_all(&self.dir);
        self.forks.fetch_sub(1, Ordering::SeqCst);
        let _ = &self.tree;
    }
}

/// At start: the forks a previous run left (their sessions died with it)
/// are unmounted and removed.
pub(super) fn clear_forks(forks: &Path) {
    if let Ok(entries) = std::fs::read_dir(forks) {
        for e in entries.flatten() {
            let dir = e.path();
            crate::isolation::disk::unmount(&dir.join("merged"));
            crate::isolation::disk::unmount(&dir);
            let _ = std::fs::remove_dir_all(&dir);
        }
    }
}
