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
pub use error::FsError;
pub use root::{FsRoot, normalize};
pub use run::{FsDone, FsOp, run};
pub use walk::MAX_WALK_ENTRIES;
