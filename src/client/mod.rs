//! A client for the gateway, over websocket (the exec-server JSON-RPC
//! protocol) or gRPC, with one API: connect with a token, start processes,
//! attach to their output from any seq, write and close stdin, signal,
//! resize, wait for the exit, and file operations. A dropped connection is
//! resumed: calls in flight are retried on the resumed session (writes
//! carry a write id, so none is applied twice) and attachments catch up
//! from their last seq, without losing or repeating output.
//!
//! `exec-gateway exec`, `cp`, `ps` and `snapshot` are built on it, and so
//! is the benchmark. The tenant's snapshots: [`Client::snapshot`].
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
//!         Event::OutputLost { chunks } => eprintln!("{chunks} chunks no longer retained"),
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
pub mod forward;
pub mod snapshots;

mod common;
mod error;
mod grpc;
mod types;
mod ws;

use tokio::io::{AsyncRead, AsyncWrite};

pub use self::common::redact_url;
pub use self::error::{ClientError, Result};
pub use self::snapshots::{Snapshot, SnapshotOp};
pub use self::types::{
    ATTACH_BUFFER_BYTES, ATTACH_BUFFER_EVENTS, ConnectOptions, DEFAULT_RESUME_WITHIN, DirEntry,
    Event, FILE_BLOCK_BYTES, FILE_BLOCKS_IN_FLIGHT, MAX_MESSAGE_BYTES, Metadata, ProcessInfo,
    ProcessSpec, Signal, Stream, WriteStatus,
};

/// A connected client: one session on the gateway.
pub struct Client {
    inner: Inner,
}

enum Inner {
    Ws(ws::WsClient),
    Grpc(grpc::GrpcClient),
}

/// Which door a URL names.
fn is_grpc_url(url: &str) -> bool {
    ["grpc://", "grpcs://", "http://", "https://"]
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
                "`{}`: expected a ws://, wss://, grpc://, grpcs://, http:// or https:// URL",
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
        match &self.inner {
            // Whole in memory: written again if the connection breaks
            // mid-stream (a write replaces the file, so twice is once).
            Inner::Grpc(c) => c.write_file_retrying(&self.absolute(path), &data).await,
            Inner::Ws(_) => self.write_file_from(path, &mut data.as_slice()).await,
        }
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
