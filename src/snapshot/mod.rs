//! Workspace snapshots and forks (docs/snapshots.md): a session's
//! workspace captured at one instant as an immutable, content-addressed
//! tree, and new sessions whose workspace starts as that tree, each a
//! copy-on-write overlay of its own.
//!
//! - `capture`: the walk of a workspace into a tar stream, unpacked at
//!   once by the image store's unpacker (`image::unpack`), as hostile input.
//! - `store`: the snapshots on disk, one tenant's apart from another's;
//!   their records, bounds (count, bytes, entries) and retention; recovery
//!   at start.
//! - `tree`: a snapshot's tree, removed once its snapshot is deleted and
//!   no fork stands on it.
//! - `remote`: snapshots in a registry: pushed as an OCI image (one
//!   uncompressed layer whose digest is the snapshot's), pulled back by
//!   any replica, every answer checked as hostile input.
//! - `transfer`: a tenant's snapshot pushed, or pulled and kept, within
//!   its share and one transfer at a time.
//! - `workspace`: a fork's workspace: an overlay of the snapshot's tree
//!   under a tmpfs upper of the tenant's disk bound, mounted on the host
//!   for the session's workers to attach at the tenant root's path.
//!
//! Its seam into the rest: the backend asks [`TenantSnapshots::take`]
//! with the session's workspace and a freeze of the tenant's processes,
//! and [`TenantSnapshots::fork`] for a [`Workspace`], whose path goes
//! into the worker's namespace spec (`isolation::namespace`) in place of
//! the tenant root.

mod capture;
mod remote;
mod store;
mod transfer;
mod tree;
mod workspace;

use std::collections::BTreeMap;

pub use capture::Source;
pub use remote::{LAYER_TYPE, RECORD, Remote};
pub use store::{SnapshotStore, TenantSnapshots};
pub use workspace::Workspace;

pub use crate::protocol::snapshot::Snapshot;

use crate::error::GatewayError;

/// Most bytes of a snapshot's name.
pub const MAX_NAME_BYTES: usize = 128;
/// Most labels of one snapshot.
pub const MAX_LABELS: usize = 32;
/// Most bytes of a label's key, and of its value.
pub const MAX_LABEL_KEY_BYTES: usize = 63;
pub const MAX_LABEL_VALUE_BYTES: usize = 256;

/// Why a snapshot operation failed.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    #[error("unknown snapshot id {}", .0.escape_debug())]
    Unknown(String),
    #[error("{0}")]
    Invalid(String),
    #[error("snapshot too large: {0}")]
    TooLarge(String),
    #[error("quota exceeded: {quota} (limit {limit})")]
    Quota { quota: &'static str, limit: u64 },
    #[error("snapshot store: {0}")]
    Io(String),
    /// The snapshot registry could not be reached or refused a request.
    #[error("snapshot registry: {0}")]
    Remote(String),
    /// What the registry holds for a snapshot is not what was pushed.
    #[error("snapshot refused: {0}")]
    Corrupt(String),
}

impl From<SnapshotError> for GatewayError {
    fn from(e: SnapshotError) -> GatewayError {
        match e {
            SnapshotError::Unknown(_) => GatewayError::UnknownId(e.to_string()),
            SnapshotError::Invalid(_) | SnapshotError::TooLarge(_) | SnapshotError::Corrupt(_) => {
                GatewayError::InvalidParams(e.to_string())
            }
            SnapshotError::Quota { quota, limit } => GatewayError::QuotaExceeded {
                quota,
                limit,
                retry_after_ms: None,
            },
            SnapshotError::Io(_) | SnapshotError::Remote(_) => {
                GatewayError::Internal(e.to_string())
            }
        }
    }
}

/// Check a name and labels as a client gave them.
pub fn check_meta(
    name: Option<&str>,
    labels: &BTreeMap<String, String>,
) -> Result<(), SnapshotError> {
    let printable = |s: &str| s.chars().all(|c| !c.is_control());
    if let Some(n) = name
        && (n.is_empty() || n.len() > MAX_NAME_BYTES || !printable(n))
    {
        return Err(SnapshotError::Invalid(format!(
            "name: 1 to {MAX_NAME_BYTES} bytes, no control characters"
        )));
    }
    if labels.len() > MAX_LABELS {
        return Err(SnapshotError::Invalid(format!(
            "labels: at most {MAX_LABELS}"
        )));
    }
    for (k, v) in labels {
        let key_ok = !k.is_empty()
            && k.len() <= MAX_LABEL_KEY_BYTES
            && k.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/'));
        if !key_ok {
            return Err(SnapshotError::Invalid(format!(
                "label key `{}`: 1 to {MAX_LABEL_KEY_BYTES} bytes of letters, digits, `-_./`",
                k.escape_debug()
            )));
        }
        if v.len() > MAX_LABEL_VALUE_BYTES || !printable(v) {
            return Err(SnapshotError::Invalid(format!(
                "label `{k}`: a value of at most {MAX_LABEL_VALUE_BYTES} bytes, no control characters"
            )));
        }
    }
    Ok(())
}

/// Whether `id` has the form of a snapshot id (anything else is unknown
/// without touching the disk).
pub fn is_id(id: &str) -> bool {
    id.len() == 37
        && id.starts_with("snap-")
        && id[5..]
            .bytes()
            .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
}
