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
    pub(super) dir: PathBuf,
    pub(super) bytes: u64,
    pub(super) deleted: AtomicBool,
    pub(super) room: Arc<AtomicI64>,
}

impl Tree {
    pub(super) fn path(&self) -> PathBuf {
        self.dir.join("tree")
    }
}

impl Drop for Tree {
    fn drop(&mut self) {
        if self.deleted.load(Ordering::SeqCst) {
            if let Err(e) = std::fs::remove_dir_all(&self.dir)
                && e.kind() != io::ErrorKind::NotFound
            {
                tracing::warn!(dir = %self.dir.display(), error = %e, "snapshot tree left on disk");
            }
            self.room.give(self.bytes);
        }
    }
}
