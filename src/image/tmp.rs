//! Work in progress under the store's `tmp/`: a directory of one pull's,
//! removed when the pull ends, whatever its outcome; the blocking work
//! the pull started (its unpacks), stopped and waited for before the pull
//! gives back its slot and its directory; and a layer unpacked but not
//! yet committed, whose bytes go back to the store unless it is kept.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use super::ImageError;
use super::fetch::hex;
use super::unpack::Room;

/// A directory under the store's `tmp/`, removed when dropped.
pub(super) struct TempDir {
    pub(super) path: PathBuf,
}

pub(super) fn tempdir_in(base: &Path) -> Result<TempDir, ImageError> {
    let mut b = [0u8; 8];
    getrandom::fill(&mut b).map_err(|e| ImageError::Unavailable(e.to_string()))?;
    let path = base.join(hex(&b));
    std::fs::create_dir(&path).map_err(|e| {
        ImageError::Unavailable(format!("image store create {}: {e}", path.display()))
    })?;
    Ok(TempDir { path })
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// One pull's work: its directory under `tmp/` and the blocking tasks it
/// runs there. A blocking task cannot be dropped like a future: a pull
/// that ends early (its timeout) sets `stop`, which the unpack checks
/// before each entry and read, and [`Work::stop`] waits for the tasks to
/// end before the directory goes. Dropped without `stop` (its pull's task
/// dropped), it still tells them to stop.
pub(super) struct Work {
    dir: TempDir,
    stop: Arc<AtomicBool>,
    /// A clone goes with each blocking task and ends with its output:
    /// the receiver sees the channel close once every task is done.
    busy: Option<tokio::sync::mpsc::Sender<()>>,
    done: tokio::sync::mpsc::Receiver<()>,
}

impl Work {
    pub(super) fn start(tmp: &Path) -> Result<Work, ImageError> {
        // Nothing is ever sent: the channel only counts its senders.
        let (busy, done) = tokio::sync::mpsc::channel(1);
        Ok(Work {
            dir: tempdir_in(tmp)?,
            stop: Arc::new(AtomicBool::new(false)),
            busy: Some(busy),
            done,
        })
    }

    pub(super) fn path(&self) -> &Path {
        &self.dir.path
    }

    /// Run `f` on a blocking thread as part of this work; `f` is given
    /// the stop flag. Its output is dropped (by whoever holds it last)
    /// before the task counts as done.
    pub(super) async fn blocking<T: Send + 'static>(
        &self,
        f: impl FnOnce(&AtomicBool) -> T + Send + 'static,
    ) -> Result<T, ImageError> {
        let (busy, stop) = (self.busy.clone(), self.stop.clone());
        tokio::task::spawn_blocking(move || (f(&stop), busy))
            .await
            .map(|(out, _busy)| out)
            .map_err(|e| ImageError::Unavailable(format!("image pull: {e}")))
    }

    /// Tell the blocking tasks to stop, wait until each has ended (and its
    /// output is gone), then remove the directory.
    pub(super) async fn stop(mut self) {
        self.stop.store(true, Ordering::SeqCst);
        self.busy = None;
        while self.done.recv().await.is_some() {}
    }
}

impl Drop for Work {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

/// A layer unpacked into `dir` that took `bytes` of `room` (the store):
/// unless [`kept`](Uncommitted::keep) (its bytes then the store's record
/// of the layer), dropping it removes `dir` and gives the bytes back, once,
/// on every way a layer can fail: a check after the unpack, its commit,
/// or its pull gone before it saw the result.
pub(super) struct Uncommitted {
    room: Arc<dyn Room + Send>,
    dir: PathBuf,
    bytes: u64,
    kept: bool,
}

impl Uncommitted {
    pub(super) fn new(room: Arc<dyn Room + Send>, dir: PathBuf, bytes: u64) -> Uncommitted {
        Uncommitted {
            room,
            dir,
            bytes,
            kept: false,
        }
    }

    /// Its directory was renamed to `dir`.
    pub(super) fn moved_to(&mut self, dir: PathBuf) {
        self.dir = dir;
    }

    /// Committed: its directory and bytes are the store's now.
    pub(super) fn keep(mut self) {
        self.kept = true;
    }
}

impl Drop for Uncommitted {
    fn drop(&mut self) {
        if !self.kept {
            let _ = std::fs::remove_dir_all(&self.dir);
            self.room.give(self.bytes);
        }
    }
}
