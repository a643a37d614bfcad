//! The client's own types, shared by both backends, and the conversions
//! from the protocol's types into them (the websocket backend decodes
//! straight into the protocol types; the gRPC one maps its messages to
//! them first), so each result is turned into the client's form once.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::protocol::fs::{DirectoryEntry, MetadataResponse};
use crate::protocol::path::WirePath;
use crate::protocol::process::{
    self as wire, EnvInherit, EnvPolicy, ExecParams, ProcessState, SignalName, StreamName,
};

/// How long a dropped connection is retried before calls fail: below the
/// gateway's detach TTL for the sessions this client makes (80 s), so a
/// resume that succeeds finds the session.
pub const DEFAULT_RESUME_WITHIN: Duration = Duration::from_secs(60);

/// The size of one file block moved per request (the protocol's largest
/// `fs/readBlock`).
pub const FILE_BLOCK_BYTES: usize = 1024 * 1024;

/// File blocks in flight at once during a transfer.
pub const FILE_BLOCKS_IN_FLIGHT: usize = 8;

/// Events held for one attachment that is not being read; past this (or
/// [`ATTACH_BUFFER_BYTES`]) the link stops reading and the gateway holds
/// the process back.
pub const ATTACH_BUFFER_EVENTS: usize = 1024;

/// Output bytes held for one attachment that is not being read.
pub const ATTACH_BUFFER_BYTES: usize = 8 * 1024 * 1024;

/// Largest message the client accepts from the gateway (the gateway's
/// own answers stay far below: 1 MiB blocks, 256 KiB chunks).
pub const MAX_MESSAGE_BYTES: usize = 16 * 1024 * 1024;

/// Where and how to connect.
#[derive(Debug, Clone)]
pub struct ConnectOptions {
    /// `ws://` or `wss://` (exec-server JSON-RPC), `grpc://` or `http://`
    /// (gRPC, plaintext), `grpcs://` or `https://` (gRPC over TLS).
    pub url: String,
    /// The JWT, sent as `Authorization: Bearer`; empty: none sent (a
    /// client certificate authenticates instead).
    pub token: String,
    /// CA bundle (PEM) the gateway's certificate must chain to, for
    /// `wss://`, `grpcs://` and `https://`. None: the public web roots.
    pub ca: Option<std::path::PathBuf>,
    /// A client certificate chain and its key (PEM) to show the gateway.
    pub identity: Option<(std::path::PathBuf, std::path::PathBuf)>,
    /// `clientName` sent at `initialize`.
    pub client_name: String,
    /// Resume this session instead of creating one.
    pub resume_session: Option<String>,
    /// The image a new session's processes see as `/`: a reference its
    /// tenant may use. None: the tenant's own image (or the token's
    /// `image` claim), if any. Not sent when resuming.
    pub image: Option<String>,
    /// How long a dropped connection is retried.
    pub resume_within: Duration,
}

impl ConnectOptions {
    pub fn new(url: &str, token: &str) -> ConnectOptions {
        ConnectOptions {
            url: url.to_owned(),
            token: token.to_owned(),
            client_name: format!("exec-gateway-client/{}", env!("CARGO_PKG_VERSION")),
            resume_session: None,
            image: None,
            resume_within: DEFAULT_RESUME_WITHIN,
            ca: None,
            identity: None,
        }
    }

    /// The TLS a connection of these options dials with, offering `alpn`.
    pub(super) fn tls(&self, alpn: &[u8]) -> Result<std::sync::Arc<crate::tls::ClientTls>, String> {
        crate::tls::ClientTls::load(
            &crate::tls::client::ClientTlsFiles {
                ca: self.ca.clone(),
                identity: self.identity.clone(),
            },
            &[alpn],
            "client",
        )
    }

    /// `Authorization: Bearer …`, unless no token is given.
    pub(super) fn bearer(&self) -> Option<String> {
        (!self.token.is_empty()).then(|| format!("Bearer {}", self.token))
    }
}

/// A process to start.
#[derive(Debug, Clone)]
pub struct ProcessSpec {
    /// Chosen by the client, unique in the session.
    pub process_id: String,
    pub argv: Vec<String>,
    /// Absolute working directory; empty: the tenant's root.
    pub cwd: String,
    /// Variables laid over the tenant's base environment.
    pub env: BTreeMap<String, String>,
    /// Give the process a terminal (24×80 until resized).
    pub tty: bool,
    /// A writable stdin pipe (without `tty`); otherwise stdin is empty.
    pub pipe_stdin: bool,
}

impl ProcessSpec {
    pub fn new<I, S>(process_id: &str, argv: I) -> ProcessSpec
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        ProcessSpec {
            process_id: process_id.to_owned(),
            argv: argv.into_iter().map(Into::into).collect(),
            cwd: String::new(),
            env: BTreeMap::new(),
            tty: false,
            pipe_stdin: false,
        }
    }

    /// A stdin pipe is asked for only without a terminal.
    pub(super) fn wants_pipe_stdin(&self) -> bool {
        self.pipe_stdin && !self.tty
    }

    /// The `process/start` params: `env` laid over the tenant's whole
    /// base environment (`envPolicy` inherit all, nothing excluded).
    pub(super) fn exec_params(&self, cwd: WirePath) -> ExecParams {
        ExecParams {
            process_id: self.process_id.clone(),
            argv: self.argv.clone(),
            cwd,
            env: self.env.clone().into_iter().collect(),
            tty: self.tty,
            pipe_stdin: self.wants_pipe_stdin(),
            arg0: None,
            env_policy: Some(EnvPolicy {
                inherit: EnvInherit::All,
                ignore_default_excludes: false,
                exclude: Vec::new(),
                set: Default::default(),
                include_only: Vec::new(),
            }),
            sandbox: None,
            network_proxy: None,
        }
    }
}

/// Which stream output came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    Stdout,
    Stderr,
    /// A terminal's output (stdout and stderr together).
    Pty,
}

/// What an attachment yields, in seq order; the stream ends after the
/// process has closed (exited and every stream reached its end).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    Output {
        seq: u64,
        stream: Stream,
        data: bytes::Bytes,
    },
    /// The exit code, as the session's revision reports it (128 + n for
    /// a pipe process signal n killed, over websocket; 1 under a
    /// terminal), and the signal when one killed it and the gateway says
    /// so (gRPC). Output may still follow (a background child holding the
    /// pipe).
    Exited { code: i32, signal: Option<i32> },
    /// Output the gateway no longer retained when this client caught up
    /// (it keeps a process's newest 1 MiB while a connection is away):
    /// `chunks` chunks are missing before the next output.
    OutputLost { chunks: u64 },
}

/// Signals `signal` sends to a process group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signal {
    Interrupt,
    Terminate,
    Kill,
    Hangup,
    Quit,
    User1,
    User2,
}

impl Signal {
    /// The protocol's name (`process/signal`).
    pub fn name(self) -> &'static str {
        match self {
            Signal::Interrupt => "interrupt",
            Signal::Terminate => "terminate",
            Signal::Kill => "kill",
            Signal::Hangup => "hangup",
            Signal::Quit => "quit",
            Signal::User1 => "user1",
            Signal::User2 => "user2",
        }
    }

    /// The signal of a Unix signal number, if the protocol has it.
    pub fn from_number(n: i32) -> Option<Signal> {
        Some(match n {
            libc::SIGINT => Signal::Interrupt,
            libc::SIGTERM => Signal::Terminate,
            libc::SIGKILL => Signal::Kill,
            libc::SIGHUP => Signal::Hangup,
            libc::SIGQUIT => Signal::Quit,
            libc::SIGUSR1 => Signal::User1,
            libc::SIGUSR2 => Signal::User2,
            _ => return None,
        })
    }

    /// The protocol's signal.
    pub(super) fn wire(self) -> SignalName {
        match self {
            Signal::Interrupt => SignalName::Interrupt,
            Signal::Terminate => SignalName::Terminate,
            Signal::Kill => SignalName::Kill,
            Signal::Hangup => SignalName::Hangup,
            Signal::Quit => SignalName::Quit,
            Signal::User1 => SignalName::User1,
            Signal::User2 => SignalName::User2,
        }
    }
}

/// Whether a write reached the process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteStatus {
    Accepted,
    UnknownProcess,
    /// The process has no stdin (or it was closed).
    StdinClosed,
    /// The process is still being spawned; retry.
    Starting,
}

/// One row of [`Client::list`](super::Client::list).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessInfo {
    pub process_id: String,
    /// `starting`, `running`, `exited` or `closed`.
    pub state: String,
    pub tty: bool,
    pub exit_code: Option<i32>,
    pub next_seq: u64,
}

/// What [`Client::metadata`](super::Client::metadata) tells.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Metadata {
    pub is_directory: bool,
    pub is_file: bool,
    pub is_symlink: bool,
    pub size: u64,
    pub modified_at_ms: i64,
}

/// One entry of [`Client::read_directory`](super::Client::read_directory).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirEntry {
    pub file_name: String,
    pub is_directory: bool,
    pub is_file: bool,
}

pub(super) fn stream(s: StreamName) -> Stream {
    match s {
        StreamName::Stdout => Stream::Stdout,
        StreamName::Stderr => Stream::Stderr,
        StreamName::Pty => Stream::Pty,
    }
}

pub(super) fn write_status(s: wire::WriteStatus) -> WriteStatus {
    match s {
        wire::WriteStatus::Accepted => WriteStatus::Accepted,
        wire::WriteStatus::UnknownProcess => WriteStatus::UnknownProcess,
        wire::WriteStatus::StdinClosed => WriteStatus::StdinClosed,
        wire::WriteStatus::Starting => WriteStatus::Starting,
    }
}

/// A state's name in [`ProcessInfo::state`]; `None` (a state this client
/// does not know) is `unknown`.
pub(super) fn state_name(s: Option<ProcessState>) -> &'static str {
    match s {
        Some(ProcessState::Starting) => "starting",
        Some(ProcessState::Running) => "running",
        Some(ProcessState::Exited) => "exited",
        Some(ProcessState::Closed) => "closed",
        None => "unknown",
    }
}

pub(super) fn process_info(p: wire::ProcessInfo) -> ProcessInfo {
    ProcessInfo {
        process_id: p.process_id,
        state: state_name(Some(p.state)).to_owned(),
        tty: p.tty,
        exit_code: p.exit_code,
        next_seq: p.next_seq,
    }
}

/// A size the server does not tell (0.130.0) is 0.
pub(super) fn metadata(m: MetadataResponse) -> Metadata {
    Metadata {
        is_directory: m.is_directory,
        is_file: m.is_file,
        is_symlink: m.is_symlink,
        size: m.size.unwrap_or(0),
        modified_at_ms: m.modified_at_ms,
    }
}

pub(super) fn dir_entry(e: DirectoryEntry) -> DirEntry {
    DirEntry {
        file_name: e.file_name,
        is_directory: e.is_directory,
        is_file: e.is_file,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn exec_params_are_what_the_client_always_sent() {
        let mut spec = ProcessSpec::new("p1", ["sh", "-c", "true"]);
        spec.env.insert("A".into(), "1".into());
        spec.pipe_stdin = true;
        let json = |spec: &ProcessSpec| {
            serde_json::to_value(spec.exec_params(WirePath::parse("file:///tmp".into()))).unwrap()
        };
        assert_eq!(
            json(&spec),
            serde_json::json!({
                "processId": "p1", "argv": ["sh", "-c", "true"], "cwd": "file:///tmp",
                "env": {"A": "1"}, "tty": false, "pipeStdin": true, "arg0": null,
                "envPolicy": {"inherit": "all", "ignoreDefaultExcludes": false,
                              "exclude": [], "set": {}, "includeOnly": []},
                "sandbox": null,
            })
        );
        // A terminal has no stdin pipe, whatever was asked.
        spec.tty = true;
        assert_eq!(json(&spec)["pipeStdin"], false);
        assert_eq!(json(&spec)["tty"], true);
    }

    #[test]
    fn signals_carry_their_protocol_names() {
        for s in [
            Signal::Interrupt,
            Signal::Terminate,
            Signal::Kill,
            Signal::Hangup,
            Signal::Quit,
            Signal::User1,
            Signal::User2,
        ] {
            assert_eq!(
                serde_json::to_value(s.wire()).unwrap(),
                serde_json::Value::from(s.name())
            );
        }
        assert_eq!(Signal::from_number(libc::SIGTERM), Some(Signal::Terminate));
        assert_eq!(Signal::from_number(libc::SIGSEGV), None);
    }

    #[test]
    fn results_convert_field_by_field() {
        let m: MetadataResponse = serde_json::from_str(
            r#"{"isDirectory":false,"isFile":true,"isSymlink":true,"createdAtMs":1,"modifiedAtMs":2}"#,
        )
        .unwrap();
        assert_eq!(
            metadata(m),
            Metadata {
                is_directory: false,
                is_file: true,
                is_symlink: true,
                size: 0,
                modified_at_ms: 2
            }
        );
        let p: wire::ProcessInfo = serde_json::from_str(
            r#"{"processId":"p","state":"exited","tty":true,"exitCode":3,"nextSeq":7,"firstRetainedSeq":null}"#,
        )
        .unwrap();
        assert_eq!(
            process_info(p),
            ProcessInfo {
                process_id: "p".into(),
                state: "exited".into(),
                tty: true,
                exit_code: Some(3),
                next_seq: 7
            }
        );
        assert_eq!(state_name(None), "unknown");
        assert_eq!(stream(StreamName::Pty), Stream::Pty);
        assert_eq!(
            write_status(wire::WriteStatus::StdinClosed),
            WriteStatus::StdinClosed
        );
    }
}
