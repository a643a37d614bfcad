//! `fs/*` params and results. Paths are [`WirePath`]s: a plain absolute
//! path (0.130.0) or a `file://` URI (0.169.0). The optional `sandbox`
//! object is accepted and ignored (the gateway confines by tenant root).

use serde::{Deserialize, Serialize};

use super::ByteChunk;
use super::path::WirePath;

fn default_true() -> bool {
    true
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PathParams {
    pub path: WirePath,
    /// `false`: refuse a path through a symbolic link (0.169.0). Default: follow.
    #[serde(default)]
    pub follow_symlinks: Option<bool>,
}

impl PathParams {
    pub fn plain(path: impl Into<String>) -> PathParams {
        PathParams {
            path: WirePath::plain(path),
            follow_symlinks: None,
        }
    }
}

/// Result of `fs/readFile`: raw bytes, base64 on the wire.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReadFileResponse {
    pub data_base64: ByteChunk,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WriteFileParams {
    pub path: WirePath,
    /// Decoded by the handler so that bad base64 gets the reference's -32600.
    pub data_base64: String,
    #[serde(default)]
    pub follow_symlinks: Option<bool>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CreateDirectoryParams {
    pub path: WirePath,
    #[serde(default = "default_true")]
    pub recursive: bool,
    #[serde(default)]
    pub follow_symlinks: Option<bool>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MetadataResponse {
    pub is_directory: bool,
    pub is_file: bool,
    pub is_symlink: bool,
    /// 0.169.0 only (the file's size in bytes, `st_size`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<u64>,
    pub created_at_ms: i64,
    pub modified_at_ms: i64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DirectoryEntry {
    pub file_name: String,
    pub is_directory: bool,
    pub is_file: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReadDirectoryResponse {
    pub entries: Vec<DirectoryEntry>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RemoveParams {
    pub path: WirePath,
    #[serde(default = "default_true")]
    pub recursive: bool,
    #[serde(default = "default_true")]
    pub force: bool,
    #[serde(default)]
    pub follow_symlinks: Option<bool>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CopyParams {
    pub source_path: WirePath,
    pub destination_path: WirePath,
    pub recursive: bool,
}

/// Result of `fs/canonicalize` (0.169.0): symlinks resolved, `..` removed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CanonicalizeResponse {
    pub path: String,
}

/// Params of `fs/walk` (0.169.0). Every limit is required and positive.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WalkParams {
    pub path: WirePath,
    pub options: WalkOptions,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WalkOptions {
    /// Deepest level listed; the root's entries are level 0.
    pub max_depth: u64,
    /// Directories read, the root included.
    pub max_directories: u64,
    /// Entries returned.
    pub max_entries: u64,
    #[serde(default)]
    pub follow_directory_symlinks: bool,
    /// List a `.hidden` directory but do not descend into it.
    #[serde(default)]
    pub prune_hidden_directories: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum WalkKind {
    File,
    Directory,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WalkEntry {
    pub path: String,
    pub kind: WalkKind,
}

/// A directory that could not be read during a walk.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WalkError {
    pub path: String,
    pub message: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WalkResponse {
    pub entries: Vec<WalkEntry>,
    pub errors: Vec<WalkError>,
    pub truncated: bool,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum OpenMode {
    #[default]
    Read,
    /// Create or truncate at once, then write blocks.
    Replace,
}

/// Params of `fs/open` (0.169.0): a client-chosen handle on a file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OpenParams {
    pub handle_id: String,
    pub path: WirePath,
    #[serde(default)]
    pub mode: OpenMode,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HandleParams {
    pub handle_id: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReadBlockParams {
    pub handle_id: String,
    pub offset: u64,
    pub len: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReadBlockResponse {
    pub chunk: ByteChunk,
    pub eof: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WriteBlockParams {
    pub handle_id: String,
    pub offset: u64,
    pub chunk: ByteChunk,
}

/// Params of `fs/watchMissing` (0.169.0): one watch per session; a
/// higher `watchId` replaces the current one.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WatchMissingParams {
    pub watch_id: u64,
    pub missing: Vec<WirePath>,
    #[serde(default)]
    pub present: Option<WirePath>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WatchMissingResponse {
    pub watching: bool,
}

/// `fs/missingChanged`: a watched missing path appeared, or the present
/// one disappeared (sent once per watch).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MissingChangedNotification {
    pub watch_id: u64,
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn defaults_are_true_and_copy_needs_recursive() {
        let p: RemoveParams = serde_json::from_str(r#"{"path":"/x"}"#).unwrap();
        assert!(p.recursive && p.force);
        let p: CreateDirectoryParams = serde_json::from_str(r#"{"path":"/x"}"#).unwrap();
        assert!(p.recursive);
        let e = serde_json::from_str::<CopyParams>(r#"{"sourcePath":"/a","destinationPath":"/b"}"#)
            .unwrap_err();
        assert!(e.to_string().starts_with("missing field `recursive`"));
    }

    #[test]
    fn walk_limits_are_required_and_open_reads_by_default() {
        let e =
            serde_json::from_str::<WalkParams>(r#"{"path":"file:///x","options":{}}"#).unwrap_err();
        assert!(e.to_string().contains("missing field"));
        let o: OpenParams = serde_json::from_str(r#"{"handleId":"h","path":"/x"}"#).unwrap();
        assert_eq!(o.mode, OpenMode::Read);
    }
}
