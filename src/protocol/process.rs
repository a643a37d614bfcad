//! `initialize` and `process/*` params, results and notifications, and the
//! event type stream subscribers see.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use super::ByteChunk;
use super::environment::EnvironmentInfo;
use super::path::WirePath;

/// Params of `initialize`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InitializeParams {
    pub client_name: String,
    #[serde(default)]
    pub resume_session_id: Option<String>,
    /// An extension: the image a new session runs (one its tenant may
    /// use; docs/environments.md). Codex clients send none and get the
    /// tenant's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// An extension: a new session whose workspace starts as this
    /// snapshot of the tenant's (docs/snapshots.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot: Option<String>,
}

/// Result of `initialize`. Both revisions get `environmentInfo`: the older
/// client ignores it, the newer one needs it (the two send the same
/// `initialize`, so the revision is not known yet).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InitializeResponse {
    pub session_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub environment_info: Option<Box<EnvironmentInfo>>,
}

/// Params of `process/start`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ExecParams {
    /// Client-chosen handle, unique per session. Not an OS pid.
    pub process_id: String,
    pub argv: Vec<String>,
    /// Working directory: a plain absolute path or a `file://` URI.
    pub cwd: WirePath,
    /// The exact child environment (replaced, not merged) unless `envPolicy` is set.
    pub env: HashMap<String, String>,
    pub tty: bool,
    /// Keep a writable stdin pipe (`tty:false` only).
    #[serde(default)]
    pub pipe_stdin: bool,
    /// Pipe mode: the child's argv[0]. TTY mode: replaces the executable (reference quirk).
    #[serde(default)]
    pub arg0: Option<String>,
    #[serde(default)]
    pub env_policy: Option<EnvPolicy>,
    /// 0.169.0: the sandbox the client asks for (only its presence is
    /// used: the tenant's confinement applies either way).
    #[serde(default)]
    pub sandbox: Option<serde_json::Value>,
    /// 0.169.0: Codex's managed network for this process (a proxy of its
    /// own; docs/isolation.md, "Asking the client").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network_proxy: Option<NetworkProxyLaunch>,
}

/// `networkProxy` of `process/start`: what the gateway reads of it (the
/// rest is the client's own policy, which the tenant's replaces).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NetworkProxyLaunch {
    #[serde(default)]
    pub proxy: Option<serde_json::Value>,
    /// Ask the client about names the tenant does not list, waiting this
    /// long (plus 5 s); none: never asked.
    #[serde(default)]
    pub policy_decision_timeout_ms: Option<u64>,
}

/// Codex shell-environment policy. Every field is required when present.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EnvPolicy {
    pub inherit: EnvInherit,
    pub ignore_default_excludes: bool,
    pub exclude: Vec<String>,
    pub set: HashMap<String, String>,
    pub include_only: Vec<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum EnvInherit {
    All,
    Core,
    None,
}

/// Result of `process/start`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ExecResponse {
    pub process_id: String,
    /// 0.169.0 only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox_type: Option<SandboxType>,
}

/// Which sandbox the executor applied at the client's request (0.169.0).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum SandboxType {
    None,
    LinuxSeccomp,
}

/// Longest `waitMs` honoured; longer waits are clamped.
pub const MAX_READ_WAIT: std::time::Duration = std::time::Duration::from_secs(3600);

/// Params of `process/read`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReadParams {
    pub process_id: String,
    #[serde(default)]
    pub after_seq: Option<u64>,
    #[serde(default)]
    pub max_bytes: Option<usize>,
    #[serde(default)]
    pub wait_ms: Option<u64>,
}

/// Output stream of a chunk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum StreamName {
    Stdout,
    Stderr,
    Pty,
}

impl StreamName {
    pub fn as_str(self) -> &'static str {
        match self {
            StreamName::Stdout => "stdout",
            StreamName::Stderr => "stderr",
            StreamName::Pty => "pty",
        }
    }
}

/// One retained chunk in a `process/read` result.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ProcessOutputChunk {
    pub seq: u64,
    pub stream: StreamName,
    pub chunk: ByteChunk,
}

/// Result of `process/read`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReadResponse {
    pub chunks: Vec<ProcessOutputChunk>,
    pub next_seq: u64,
    pub exited: bool,
    pub exit_code: Option<i32>,
    pub closed: bool,
    /// Why the process died, when the gateway knows better than its exit
    /// code (worker death, OOM kill); otherwise null.
    pub failure: Option<String>,
    /// 0.169.0 only: always false (the gateway does not attribute failures
    /// to a sandbox).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox_denied: Option<bool>,
}

/// Params of `process/write`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WriteParams {
    pub process_id: String,
    pub chunk: ByteChunk,
    /// A repeated id is acknowledged and not written twice (required and
    /// non-empty in 0.169.0; optional in 0.130.0).
    #[serde(default)]
    pub write_id: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum WriteStatus {
    Accepted,
    UnknownProcess,
    StdinClosed,
    Starting,
}

/// Result of `process/write`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WriteResponse {
    pub status: WriteStatus,
}

/// Params of `process/terminate` and `process/closeStdin`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ProcessIdParams {
    pub process_id: String,
}

/// Result of `process/terminate`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TerminateResponse {
    pub running: bool,
}

/// Signal names of `process/signal` (extension).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum SignalName {
    Interrupt,
    Terminate,
    Kill,
    Hangup,
    Quit,
    User1,
    User2,
}

/// Params of `process/signal` (extension).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SignalParams {
    pub process_id: String,
    pub signal: SignalName,
}

/// Params of `process/resize` (extension).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ResizeParams {
    pub process_id: String,
    pub rows: u16,
    pub cols: u16,
}

/// Lifecycle state in `process/list`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum ProcessState {
    Starting,
    Running,
    Exited,
    Closed,
}

/// One entry of `process/list` (extension).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ProcessInfo {
    pub process_id: String,
    pub state: ProcessState,
    pub tty: bool,
    pub exit_code: Option<i32>,
    /// The seq the next event will take.
    pub next_seq: u64,
    /// Oldest seq still retained for `process/read`, if any output is retained.
    pub first_retained_seq: Option<u64>,
}

/// Result of `process/list` (extension).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ListResponse {
    pub processes: Vec<ProcessInfo>,
}

/// `process/output` notification.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OutputNotification {
    pub process_id: String,
    pub seq: u64,
    pub stream: StreamName,
    pub chunk: ByteChunk,
}

/// `process/exited` notification.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ExitedNotification {
    pub process_id: String,
    pub seq: u64,
    pub exit_code: i32,
    /// 0.169.0 only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox_denied: Option<bool>,
}

/// `process/closed` notification.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClosedNotification {
    pub process_id: String,
    pub seq: u64,
}

/// One event of a process's log, in seq order, as a stream subscriber
/// (gRPC `Attach`/`Exec`) sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProcessEvent {
    Output {
        seq: u64,
        stream: StreamName,
        data: bytes::Bytes,
    },
    Exited {
        seq: u64,
        code: i32,
        /// The signal that ended it, when one did (gRPC tells it).
        signal: Option<i32>,
    },
    Closed {
        seq: u64,
    },
}

impl ProcessEvent {
    pub fn seq(&self) -> u64 {
        match self {
            ProcessEvent::Output { seq, .. }
            | ProcessEvent::Exited { seq, .. }
            | ProcessEvent::Closed { seq } => *seq,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exec_params_defaults() {
        let p: ExecParams = serde_json::from_str(
            r#"{"processId":"p","argv":["true"],"cwd":"/","env":{},"tty":false}"#,
        )
        .unwrap();
        assert!(!p.pipe_stdin);
        assert_eq!(p.arg0, None);
        assert_eq!(p.env_policy, None);
    }

    #[test]
    fn env_policy_requires_every_field() {
        let e = serde_json::from_str::<EnvPolicy>(r#"{"inherit":"core"}"#).unwrap_err();
        assert!(e.to_string().contains("missing field"));
    }

    #[test]
    fn read_response_shape() {
        let r = ReadResponse {
            chunks: vec![ProcessOutputChunk {
                seq: 1,
                stream: StreamName::Stdout,
                chunk: ByteChunk(b"hi\n".to_vec()),
            }],
            next_seq: 2,
            exited: true,
            exit_code: Some(0),
            closed: true,
            failure: None,
            sandbox_denied: None,
        };
        assert_eq!(
            serde_json::to_string(&r).unwrap(),
            r#"{"chunks":[{"seq":1,"stream":"stdout","chunk":"aGkK"}],"nextSeq":2,"exited":true,"exitCode":0,"closed":true,"failure":null}"#
        );
    }
}
