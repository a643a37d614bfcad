//! File operations (docs/protocol.md, "Filesystem") over a root that is
//! either the whole host (`/`, reference-compatible) or a tenant directory
//! confined with cap-std (`openat2(RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS)`).
//!
//! One entry point, [`run`], executes an [`FsOp`] against an [`FsRoot`]; it
//! runs in the tenant's worker (the default) or on the gateway's blocking
//! pool, and both sides use the same code. Reads and writes of file contents
//! only *open* the file there: the opened file comes back ([`FsDone::File`])
//! and the bytes move in the gateway.
//!
//! Invariants: every path is absolute and lexically normalised first; in a
//! confined root, nothing outside it is ever opened (`..`, absolute paths
//! outside, symlinks pointing out and symlinks swapped mid-call all fail),
//! files are opened `O_NONBLOCK` and checked to be regular (a planted FIFO
//! cannot hang a thread). Everything here blocks: callers pick the thread.
//!
//! Files: `root.rs` (the root and path confinement: review it alone),
//! `run.rs` (the op runner), `ops.rs`, `walk.rs`, `copy.rs` (the
//! operations), `contents.rs` (whole-file reads and writes), `error.rs`,
//! `meta.rs`, `creds.rs`.

mod contents;
mod copy;
mod creds;
mod error;
mod meta;
mod ops;
mod root;
mod run;
mod walk;

pub use contents::{read_encoded, read_whole, write_whole};
pub use creds::{FsCreds, drop_thread_groups};
pub use error::{DISK_QUOTA_USED_UP, FsError};
pub use root::{FsRoot, normalize};
pub use run::{FsDone, FsOp, run};
pub use walk::MAX_WALK_ENTRIES;

/// Open a file of the gateway's own (a certificate, a key, a trail) for
/// reading without waiting, and only if it is a regular file: a FIFO put
/// in its place would block the open for ever, a device never end. The
/// file and its metadata.
pub fn open_regular(path: &std::path::Path) -> std::io::Result<(std::fs::File, std::fs::Metadata)> {
    use std::os::unix::fs::OpenOptionsExt as _;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)?;
    let meta = f.metadata()?;
    if !meta.is_file() {
        return Err(std::io::Error::other("not a regular file"));
    }
    Ok((f, meta))
}
