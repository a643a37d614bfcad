//! Why a file operation failed: [`FsError`] (it crosses the worker link) and
//! its mapping to call errors, plus the unclassified failure of an operation.

use std::io;

use serde::{Deserialize, Serialize};

use crate::error::GatewayError;
use crate::protocol::revision::{MAY_2026, Policy};

/// Why a file operation failed, classified as the reference's
/// `map_fs_error` does (it crosses the worker link as is).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
pub enum FsError {
    /// The path does not exist: -32004.
    #[error("{0}")]
    NotFound(String),
    /// Refused (permission, not a regular file, outside the root): -32600.
    #[error("{0}")]
    InvalidRequest(String),
    /// The request itself is malformed (a relative path): -32602.
    #[error("{0}")]
    InvalidParams(String),
    /// Any other OS error: -32603 with its text.
    #[error("{0}")]
    Io(String),
    /// A path outside the tenant root: "not found" to a client (-32004),
    /// while the message says why.
    #[error("path `{0}` is outside the tenant root")]
    OutsideRoot(String),
    /// A file operation on a directory or a special file. The revisions
    /// word it differently (see [`FsError::into_gateway_error`]).
    #[error("path `{path}` is not a file")]
    NotAFile { path: String, is_dir: bool },
    /// `followSymlinks: false` and the path goes through a symbolic link.
    #[error("path contains a symbolic link")]
    SymlinkInPath,
    /// Not done, worth asking again: the tenant's worker is backing off
    /// its restart (-32001 with when to retry).
    #[error("the tenant's worker is restarting; retry in {retry_after_ms} ms")]
    Restarting { retry_after_ms: u64 },
    /// Not done: this gateway is shutting down (its draining error; another
    /// replica serves the retry).
    #[error("the gateway is shutting down")]
    ShuttingDown,
}

/// What a file call's error says when the tenant's disk quota refused a
/// write (the audit trail and webhooks count it as `quota.refused`).
pub const DISK_QUOTA_USED_UP: &str = "the tenant's disk quota is used up";

impl FsError {
    /// The reference's `map_fs_error`: NotFound → -32004, InvalidInput and
    /// PermissionDenied → -32600, anything else → -32603; the message is the
    /// io::Error's Display text.
    pub fn from_io(e: &io::Error) -> FsError {
        let text = os_text(e);
        match e.kind() {
            io::ErrorKind::NotFound => FsError::NotFound(text),
            io::ErrorKind::InvalidInput | io::ErrorKind::PermissionDenied => {
                FsError::InvalidRequest(text)
            }
            _ if matches!(e.raw_os_error(), Some(libc::ENOSPC | libc::EDQUOT)) => {
                FsError::Io(format!(
                    "{text}: {DISK_QUOTA_USED_UP} (max_tmp_bytes for /tmp, max_disk_bytes for its root)"
                ))
            }
            _ => FsError::Io(text),
        }
    }
}

/// An OS error's text as the official binaries (musl builds) write it
/// where glibc's differs.
pub fn os_text(e: &io::Error) -> String {
    match e.raw_os_error() {
        Some(libc::ELOOP) => format!("Symbolic link loop (os error {})", libc::ELOOP),
        _ => e.to_string(),
    }
}

impl FsError {
    /// As a call error in a session answering by `policy`: a directory or
    /// special file "is not a file" (-32600, 0.169.0), or the OS error
    /// (-32603 for a directory, -32600 for a special file, 0.130.0).
    pub fn into_gateway_error(self, policy: &Policy) -> GatewayError {
        match self {
            FsError::NotAFile { path, is_dir } => match (policy.not_a_file_uniform, is_dir) {
                (true, _) => GatewayError::InvalidRequest(format!("path `{path}` is not a file")),
                (false, true) => {
                    GatewayError::Internal(io::Error::from_raw_os_error(libc::EISDIR).to_string())
                }
                (false, false) => GatewayError::InvalidRequest("not a regular file".to_owned()),
            },
            other => other.into(),
        }
    }
}

impl From<FsError> for GatewayError {
    fn from(e: FsError) -> GatewayError {
        match e {
            FsError::NotFound(m) => GatewayError::NotFound(m),
            FsError::InvalidRequest(m) => GatewayError::InvalidRequest(m),
            FsError::InvalidParams(m) => GatewayError::InvalidParams(m),
            FsError::Io(m) => GatewayError::Internal(m),
            outside @ FsError::OutsideRoot(_) => GatewayError::OutsideRoot(outside.to_string()),
            not_a_file @ FsError::NotAFile { .. } => not_a_file.into_gateway_error(&MAY_2026),
            symlink @ FsError::SymlinkInPath => GatewayError::InvalidRequest(symlink.to_string()),
            FsError::Restarting { retry_after_ms } => GatewayError::RateLimited { retry_after_ms },
            FsError::ShuttingDown => GatewayError::Draining,
        }
    }
}

/// An operation's failure before classification.
pub(super) enum Failed {
    Fs(FsError),
    Io(io::Error),
}

impl From<io::Error> for Failed {
    fn from(e: io::Error) -> Failed {
        Failed::Io(e)
    }
}

impl From<FsError> for Failed {
    fn from(e: FsError) -> Failed {
        Failed::Fs(e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn io_errors_map_like_the_reference() {
        let e = FsError::from_io(&io::Error::from_raw_os_error(libc::ENOENT));
        assert_eq!(
            e,
            FsError::NotFound("No such file or directory (os error 2)".into())
        );
        assert_eq!(GatewayError::from(e).to_jsonrpc().code, -32004);
        let e = FsError::from_io(&io::Error::from_raw_os_error(libc::EACCES));
        assert_eq!(GatewayError::from(e).to_jsonrpc().code, -32600);
        for errno in [libc::ENOSPC, libc::EDQUOT] {
            let e = FsError::from_io(&io::Error::from_raw_os_error(errno));
            assert!(
                matches!(&e, FsError::Io(m) if m.contains("disk quota is used up")),
                "{e:?}"
            );
        }
        let e = FsError::from_io(&io::Error::from_raw_os_error(libc::ENOTEMPTY));
        assert_eq!(e.to_string(), "Directory not empty (os error 39)");
        assert_eq!(GatewayError::from(e).to_jsonrpc().code, -32603);
    }
}
