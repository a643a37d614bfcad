//! The older v0 `command/exec*` API, served on the same connection
//! and mapped onto the same process table (docs/protocol.md, "v0").

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use super::ByteChunk;
use super::path::WirePath;

/// Params of `command/exec`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CommandExecParams {
    pub process_id: String,
    pub argv: Vec<String>,
    pub cwd: WirePath,
    #[serde(default)]
    pub env: HashMap<String, String>,
    pub tty: bool,
    /// Retained output cap for this process, at most the gateway's own cap.
    #[serde(default)]
    pub output_bytes_cap: Option<usize>,
    #[serde(default)]
    pub arg0: Option<String>,
}

/// Result of `command/exec`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CommandExecResponse {
    pub process_id: String,
    pub running: bool,
    pub exit_code: Option<i32>,
    pub stdout: Option<String>,
    pub stderr: Option<String>,
}

/// Params of `command/exec/write`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CommandExecWriteParams {
    pub process_id: String,
    pub chunk: ByteChunk,
}

/// Result of `command/exec/write`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CommandExecWriteResponse {
    pub accepted: bool,
}

/// `command/exec/outputDelta` notification (no seq in v0).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OutputDeltaNotification {
    pub process_id: String,
    /// `stdout` or `stderr`; PTY output is reported as `stdout` in v0.
    pub stream: String,
    pub chunk: ByteChunk,
}

/// `command/exec/exited` notification.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ExitedNotification {
    pub process_id: String,
    pub exit_code: i32,
}
