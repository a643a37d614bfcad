//! File metadata from either side of a root (std for the host, cap-std when
//! confined), and timestamps as the protocol's milliseconds.

use std::time::SystemTime;

pub(super) enum Meta {
    Std(std::fs::Metadata),
    Cap(cap_std::fs::Metadata),
}

impl Meta {
    pub(super) fn is_dir(&self) -> bool {
        match self {
            Meta::Std(m) => m.is_dir(),
            Meta::Cap(m) => m.is_dir(),
        }
    }
    pub(super) fn is_file(&self) -> bool {
        match self {
            Meta::Std(m) => m.is_file(),
            Meta::Cap(m) => m.is_file(),
        }
    }
    pub(super) fn is_symlink(&self) -> bool {
        match self {
            Meta::Std(m) => m.file_type().is_symlink(),
            Meta::Cap(m) => m.file_type().is_symlink(),
        }
    }
    pub(super) fn len(&self) -> u64 {
        match self {
            Meta::Std(m) => m.len(),
            Meta::Cap(m) => m.len(),
        }
    }
    /// Device and inode: a directory's identity (walks visit each once).
    pub(super) fn id(&self) -> (u64, u64) {
        use cap_std::fs::MetadataExt as _;
        use std::os::unix::fs::MetadataExt as _;
        match self {
            Meta::Std(m) => (m.dev(), m.ino()),
            Meta::Cap(m) => (m.dev(), m.ino()),
        }
    }
    pub(super) fn created(&self) -> Option<SystemTime> {
        match self {
            Meta::Std(m) => m.created().ok(),
            Meta::Cap(m) => m.created().ok().map(cap_std::time::SystemTime::into_std),
        }
    }
    pub(super) fn modified(&self) -> Option<SystemTime> {
        match self {
            Meta::Std(m) => m.modified().ok(),
            Meta::Cap(m) => m.modified().ok().map(cap_std::time::SystemTime::into_std),
        }
    }
}

pub(super) fn millis(t: Option<SystemTime>) -> i64 {
    t.and_then(|t| t.duration_since(SystemTime::UNIX_EPOCH).ok())
        .and_then(|d| i64::try_from(d.as_millis()).ok())
        .unwrap_or(0)
}
