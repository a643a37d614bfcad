//! A client for the gateway, over websocket (the exec-server JSON-RPC
//! protocol) or gRPC, with one API: connect with a token, start processes,
//! attach to their output from any seq, write and close stdin, signal,
//! resize, wait for the exit, and file operations. A dropped connection is
//! resumed: calls in flight are retried on the resumed session (writes
//! carry a write id, so none is applied twice) and attachments catch up
//! from their last seq, without losing or repeating output.
//!
//! `exec-gateway exec`, `cp` and `ps` are built on it, and so is the
//! benchmark.
//!
//! ```no_run
//! use exec_gateway::client::{Client, Event, ProcessSpec};
//!
//! # async fn run() -> Result<(), exec_gateway::client::ClientError> {
//! let token = std::env::var("EXEC_GATEWAY_TOKEN").unwrap_or_default();
//! // `grpc://HOST:PORT` speaks gRPC instead; the API is the same.
//! let client = Client::connect("ws://127.0.0.1:8765", &token).await?;
//! client
//!     .start(&ProcessSpec::new("p1", ["sh", "-c", "echo hello; exit 3"]))
//!     .await?;
//! let mut events = client.attach("p1", 0).await?;
//! while let Some(event) = events.next().await? {
//!     match event {
//!         Event::Output { data, .. } => print!("{}", String::from_utf8_lossy(&data)),
//!         Event::Exited { code, .. } => println!("exit code {code}"),
//!     }
//! }
//! client
//!     .write_file("/tmp/hello.txt", b"hello\n".to_vec())
//!     .await?;
//! assert_eq!(client.read_file("/tmp/hello.txt").await?, b"hello\n");
//! # Ok(())
//! # }
//! ```
//!
//! `examples/client.rs` is the same program, runnable against a local
//! `exec-gateway serve`.

pub mod copy;
mod grpc;
mod ws;

use std::collections::BTreeMap;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite};

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

/// What went wrong.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The gateway could not be reached, or refused the connection (the
    /// HTTP status and the gateway's reason).
    #[error("cannot connect to {url}: {detail}")]
    Connect { url: String, detail: String },
    /// The connection dropped and could not be resumed in time.
    #[error("connection lost: {0}")]
    Disconnected(String),
    /// The gateway answered a call with an error. `code` is the JSON-RPC
    /// code (gRPC statuses are mapped to the nearest one); `data` as sent.
    #[error("{message} ({code})")]
    Rpc {
        code: i64,
        message: String,
        data: Option<serde_json::Value>,
    },
    /// The gateway answered with something this client does not understand.
    #[error("unexpected answer from the gateway: {0}")]
    Protocol(String),
    /// A local file or stream failed.
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// A usage error (a bad URL, a relative path).
    #[error("{0}")]
    Usage(String),
}

impl ClientError {
    /// Whether a process id or file handle was already in use.
    pub fn is_already_exists(&self) -> bool {
        matches!(self, ClientError::Rpc { code: -32600, message, .. } if message.ends_with("already exists"))
    }

    /// Whether a path or process was not found.
    pub fn is_not_found(&self) -> bool {
        match self {
            ClientError::Rpc { code: -32004, .. } => true,
            ClientError::Rpc {
                code: -32600,
                message,
                ..
            } => message.starts_with("unknown process id"),
            _ => false,
        }
    }

    fn protocol(e: impl std::fmt::Display) -> ClientError {
        ClientError::Protocol(e.to_string())
    }
}

pub type Result<T, E = ClientError> = std::result::Result<T, E>;

/// Where and how to connect.
#[derive(Debug, Clone)]
pub struct ConnectOptions {
    /// `ws://` or `wss://` (exec-server JSON-RPC), `grpc://` or `http://`
    /// (gRPC, plaintext).
    pub url: String,
    /// The JWT, sent as `Authorization: Bearer`.
    pub token: String,
    /// `clientName` sent at `initialize`.
    pub client_name: String,
    /// Resume this session instead of creating one.
    pub resume_session: Option<String>,
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
            resume_within: DEFAULT_RESUME_WITHIN,
        }
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

/// One row of [`Client::list`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessInfo {
    pub process_id: String,
    /// `starting`, `running`, `exited` or `closed`.
    pub state: String,
    pub tty: bool,
    pub exit_code: Option<i32>,
    pub next_seq: u64,
}

/// What [`Client::metadata`] tells.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Metadata {
    pub is_directory: bool,
    pub is_file: bool,
    pub is_symlink: bool,
    pub size: u64,
    pub modified_at_ms: i64,
}

/// One entry of [`Client::read_directory`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirEntry {
    pub file_name: String,
    pub is_directory: bool,
    pub is_file: bool,
}

/// A connected client: one session on the gateway.
pub struct Client {
    inner: Inner,
}

enum Inner {
    Ws(ws::WsClient),
    Grpc(grpc::GrpcClient),
}

/// `url` as it may be shown: no password, no `access_token` value.
pub fn redact_url(url: &str) -> String {
    let Ok(mut u) = url::Url::parse(url) else {
        return url.split(['?', '#']).next().unwrap_or_default().to_owned();
    };
    if u.password().is_some() {
        let _ = u.set_password(Some("REDACTED"));
    }
    if u.query().is_some() {
        let pairs: Vec<(String, String)> = u
            .query_pairs()
            .map(|(k, v)| {
                let v = if k == "access_token" {
                    "REDACTED".to_owned()
                } else {
                    v.into_owned()
                };
                (k.into_owned(), v)
            })
            .collect();
        u.query_pairs_mut().clear().extend_pairs(pairs);
    }
    u.into()
}

/// Which door a URL names.
fn is_grpc_url(url: &str) -> bool {
    ["grpc://", "http://", "https://"]
        .iter()
        .any(|p| url.starts_with(p))
}

impl Client {
    /// Connect to `url` with `token` and create a session.
    pub async fn connect(url: &str, token: &str) -> Result<Client> {
        Client::connect_with(ConnectOptions::new(url, token)).await
    }

    /// Connect with every option.
    pub async fn connect_with(options: ConnectOptions) -> Result<Client> {
        let inner = if is_grpc_url(&options.url) {
            Inner::Grpc(grpc::GrpcClient::connect(options).await?)
        } else if options.url.starts_with("ws://") || options.url.starts_with("wss://") {
            Inner::Ws(ws::WsClient::connect(options).await?)
        } else {
            return Err(ClientError::Usage(format!(
                "`{}`: expected a ws://, wss://, grpc:// or http:// URL",
                options.url
            )));
        };
        Ok(Client { inner })
    }

    /// The session's id (resume it with [`ConnectOptions::resume_session`]).
    pub fn session_id(&self) -> &str {
        match &self.inner {
            Inner::Ws(c) => c.session_id(),
            Inner::Grpc(c) => c.session_id(),
        }
    }

    /// The tenant's root: where relative paths and processes start.
    pub fn root(&self) -> &str {
        match &self.inner {
            Inner::Ws(c) => c.root(),
            Inner::Grpc(c) => c.root(),
        }
    }

    /// Resolve `path` against the tenant's root when it is relative.
    pub fn absolute(&self, path: &str) -> String {
        if path.starts_with('/') {
            return path.to_owned();
        }
        let root = self.root().trim_end_matches('/');
        match path {
            "" | "." => {
                if root.is_empty() {
                    "/".to_owned()
                } else {
                    root.to_owned()
                }
            }
            p => format!("{root}/{}", p.trim_start_matches("./")),
        }
    }

    /// Start a process. A start retried after a dropped connection that
    /// finds its own process already there counts as started.
    pub async fn start(&self, spec: &ProcessSpec) -> Result<()> {
        let mut spec = spec.clone();
        spec.cwd = self.absolute(&spec.cwd);
        match &self.inner {
            Inner::Ws(c) => c.start(&spec).await,
            Inner::Grpc(c) => c.start(&spec).await,
        }
    }

    /// End the session now: its processes are killed and the gateway
    /// forgets it, instead of keeping it for a resume until its TTL runs
    /// out (a tenant's sessions are limited; a client that is done should
    /// say so).
    pub async fn close(&self) -> Result<()> {
        match &self.inner {
            Inner::Ws(c) => c.close().await,
            Inner::Grpc(c) => c.close().await,
        }
    }

    /// Start a process and attach to it from its first event, in one step
    /// (no read to catch up; over gRPC, one `Exec` call).
    pub async fn exec(&self, spec: &ProcessSpec) -> Result<Attachment<'_>> {
        let mut spec = spec.clone();
        spec.cwd = self.absolute(&spec.cwd);
        let inner = match &self.inner {
            Inner::Ws(c) => AttachInner::Ws(c.exec(&spec).await?),
            Inner::Grpc(c) => AttachInner::Grpc(Box::new(c.exec(&spec).await?)),
        };
        Ok(Attachment { inner })
    }

    /// The process's events after seq `after_seq` (0: from the start),
    /// then live ones until it closes.
    pub async fn attach(&self, process_id: &str, after_seq: u64) -> Result<Attachment<'_>> {
        let inner = match &self.inner {
            Inner::Ws(c) => AttachInner::Ws(c.attach(process_id, after_seq)?),
            Inner::Grpc(c) => AttachInner::Grpc(Box::new(c.attach(process_id, after_seq).await?)),
        };
        Ok(Attachment { inner })
    }

    /// Write to the process's stdin (or terminal).
    pub async fn write(&self, process_id: &str, data: &[u8]) -> Result<WriteStatus> {
        match &self.inner {
            Inner::Ws(c) => c.write(process_id, data).await,
            Inner::Grpc(c) => c.write(process_id, data).await,
        }
    }

    /// Close the process's stdin: it reads EOF (a terminal gets `^D`).
    pub async fn close_stdin(&self, process_id: &str) -> Result<()> {
        match &self.inner {
            Inner::Ws(c) => c.close_stdin(process_id).await,
            Inner::Grpc(c) => c.close_stdin(process_id).await,
        }
    }

    /// Send `signal` to the process's group.
    pub async fn signal(&self, process_id: &str, signal: Signal) -> Result<()> {
        match &self.inner {
            Inner::Ws(c) => c.signal(process_id, signal).await,
            Inner::Grpc(c) => c.signal(process_id, signal).await,
        }
    }

    /// Set a terminal's size.
    pub async fn resize(&self, process_id: &str, rows: u16, cols: u16) -> Result<()> {
        match &self.inner {
            Inner::Ws(c) => c.resize(process_id, rows, cols).await,
            Inner::Grpc(c) => c.resize(process_id, rows, cols).await,
        }
    }

    /// Kill the process group; whether it was running.
    pub async fn terminate(&self, process_id: &str) -> Result<bool> {
        match &self.inner {
            Inner::Ws(c) => c.terminate(process_id).await,
            Inner::Grpc(c) => c.terminate(process_id).await,
        }
    }

    /// The session's processes (closed ones while retained).
    pub async fn list(&self) -> Result<Vec<ProcessInfo>> {
        match &self.inner {
            Inner::Ws(c) => c.list().await,
            Inner::Grpc(c) => c.list().await,
        }
    }

    /// Wait for the process to close, discarding its output; its exit code
    /// (128 + n when the gateway says signal n killed it).
    pub async fn wait(&self, process_id: &str) -> Result<i32> {
        let mut a = self.attach(process_id, 0).await?;
        let mut code = None;
        while let Some(e) = a.next().await? {
            if let Event::Exited { code: c, signal } = e {
                code = Some(signal.map_or(c, |s| 128 + s));
            }
        }
        code.ok_or_else(|| ClientError::Protocol("the process closed without an exit".to_owned()))
    }

    /// A whole file (use [`Client::read_file_to`] for large ones).
    pub async fn read_file(&self, path: &str) -> Result<Vec<u8>> {
        let mut out = Vec::new();
        self.read_file_to(path, &mut out).await?;
        Ok(out)
    }

    /// Stream a file into `sink`, in blocks; the bytes copied.
    pub async fn read_file_to<W: AsyncWrite + Unpin + Send>(
        &self,
        path: &str,
        sink: &mut W,
    ) -> Result<u64> {
        let path = self.absolute(path);
        match &self.inner {
            Inner::Ws(c) => c.read_file_to(&path, sink).await,
            Inner::Grpc(c) => c.read_file_to(&path, sink).await,
        }
    }

    /// Create or replace a file with `data`.
    pub async fn write_file(&self, path: &str, data: Vec<u8>) -> Result<u64> {
        self.write_file_from(path, &mut data.as_slice()).await
    }

    /// Create or replace a file with what `source` yields, in blocks; the
    /// bytes written.
    pub async fn write_file_from<R: AsyncRead + Unpin + Send>(
        &self,
        path: &str,
        source: &mut R,
    ) -> Result<u64> {
        let path = self.absolute(path);
        match &self.inner {
            Inner::Ws(c) => c.write_file_from(&path, source).await,
            Inner::Grpc(c) => c.write_file_from(&path, source).await,
        }
    }

    /// Create a directory (and its parents with `recursive`).
    pub async fn create_directory(&self, path: &str, recursive: bool) -> Result<()> {
        let path = self.absolute(path);
        match &self.inner {
            Inner::Ws(c) => c.create_directory(&path, recursive).await,
            Inner::Grpc(c) => c.create_directory(&path, recursive).await,
        }
    }

    /// What a path is (symbolic links followed, except for `is_symlink`).
    pub async fn metadata(&self, path: &str) -> Result<Metadata> {
        let path = self.absolute(path);
        match &self.inner {
            Inner::Ws(c) => c.metadata(&path).await,
            Inner::Grpc(c) => c.metadata(&path).await,
        }
    }

    /// A directory's entries.
    pub async fn read_directory(&self, path: &str) -> Result<Vec<DirEntry>> {
        let path = self.absolute(path);
        match &self.inner {
            Inner::Ws(c) => c.read_directory(&path).await,
            Inner::Grpc(c) => c.read_directory(&path).await,
        }
    }

    /// Remove a file or directory.
    pub async fn remove(&self, path: &str, recursive: bool, force: bool) -> Result<()> {
        let path = self.absolute(path);
        match &self.inner {
            Inner::Ws(c) => c.remove(&path, recursive, force).await,
            Inner::Grpc(c) => c.remove(&path, recursive, force).await,
        }
    }
}

/// A process's events, from a seq on. Survives dropped connections: it
/// resumes from the last seq it yielded.
pub struct Attachment<'c> {
    inner: AttachInner<'c>,
}

enum AttachInner<'c> {
    Ws(ws::WsAttachment<'c>),
    Grpc(Box<grpc::GrpcAttachment>),
}

impl Attachment<'_> {
    /// The next event; `None` once the process has closed.
    pub async fn next(&mut self) -> Result<Option<Event>> {
        match &mut self.inner {
            AttachInner::Ws(a) => a.next().await,
            AttachInner::Grpc(a) => a.next().await,
        }
    }

    /// The seq of the last output yielded: attach again after it to go on.
    pub fn cursor(&self) -> u64 {
        match &self.inner {
            AttachInner::Ws(a) => a.cursor(),
            AttachInner::Grpc(a) => a.cursor(),
        }
    }

    /// How many times the attachment has re-synchronised after a dropped
    /// connection or a lagging reader.
    pub fn resyncs(&self) -> u64 {
        match &self.inner {
            AttachInner::Ws(a) => a.resyncs(),
            AttachInner::Grpc(a) => a.resyncs(),
        }
    }
}

/// -32001: the gateway or the tenant is over a limit; retry after a while.
fn is_overloaded(e: &ClientError) -> bool {
    matches!(e, ClientError::Rpc { code: -32001, .. })
}

/// Backoff between reconnection attempts.
struct Backoff {
    next: Duration,
    deadline: tokio::time::Instant,
}

impl Backoff {
    fn new(within: Duration) -> Backoff {
        Backoff {
            next: Duration::from_millis(50),
            deadline: tokio::time::Instant::now() + within,
        }
    }

    /// Sleep before the next attempt; false once the time is up.
    async fn wait(&mut self) -> bool {
        let now = tokio::time::Instant::now();
        if now >= self.deadline {
            return false;
        }
        tokio::time::sleep(self.next.min(self.deadline - now)).await;
        self.next = (self.next * 2).min(Duration::from_secs(2));
        true
    }
}

/// A unique prefix for the ids this client makes up (write ids).
fn unique_prefix() -> String {
    uuid::Uuid::new_v4().simple().to_string()[..12].to_owned()
}
