//! Work in progress under the store's `tmp/`: a directory of one pull's,
//! removed when the pull ends, whatever its outcome.

use std::path::{Path, PathBuf};

use super::ImageError;
use super::fetch::hex;

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
