//! The gRPC backend (`proto/exec_gateway/v1`). A gRPC session is made
//! with `CreateSession`; it lives while used. Calls carry the token as
//! metadata; the channel reconnects on its own, and an `Attach` stream
//! that breaks is opened again after the last seq it delivered.

use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _};
use tonic::codegen::InterceptedService;
use tonic::metadata::{Ascii, MetadataValue};
use tonic::transport::Channel;

use super::{
    Backoff, ClientError, ConnectOptions, DirEntry, Event, FILE_BLOCK_BYTES, MAX_MESSAGE_BYTES,
    Metadata, ProcessInfo, ProcessSpec, Result, Signal, Stream, WriteStatus, unique_prefix,
};
use crate::transport::grpc::pb;

type Svc = InterceptedService<Channel, Bearer>;

/// Adds `authorization: Bearer` to every call.
#[derive(Clone)]
pub(super) struct Bearer(MetadataValue<Ascii>);

impl tonic::service::Interceptor for Bearer {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        req.metadata_mut().insert("authorization", self.0.clone());
        Ok(req)
    }
}

/// A gRPC status as the JSON-RPC error it stands for.
fn status_error(s: tonic::Status) -> ClientError {
    use tonic::Code;
    let data = s
        .metadata()
        .get("x-exec-gateway-error-data")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| serde_json::from_str(v).ok());
    let message = s.message().to_owned();
    let code = match s.code() {
        Code::Unavailable if data.is_none() && is_transport(&message) => {
            return ClientError::Disconnected(message);
        }
        // What hyper and h2 report when the connection breaks mid-call.
        Code::Unknown | Code::Internal | Code::Cancelled if is_broken_stream(&message) => {
            return ClientError::Disconnected(message);
        }
        Code::InvalidArgument | Code::AlreadyExists | Code::FailedPrecondition => -32600,
        Code::NotFound if message.starts_with("unknown process id") => -32600,
        Code::NotFound => -32004,
        Code::Unimplemented => -32601,
        Code::Unavailable | Code::ResourceExhausted
            if data
                .as_ref()
                .is_some_and(|d: &serde_json::Value| d.get("quota").is_some()) =>
        {
            -32006
        }
        Code::Unavailable => -32001,
        Code::ResourceExhausted => -32006,
        Code::Unauthenticated => -32002,
        Code::PermissionDenied => -32003,
        Code::DeadlineExceeded => -32005,
        _ => -32603,
    };
    ClientError::Rpc {
        code,
        message,
        data,
    }
}

/// Whether an error ending a stream is the connection's.
fn is_broken_stream(message: &str) -> bool {
    let m = message.to_ascii_lowercase();
    m.starts_with("h2 protocol error")
        || m.starts_with("transport error")
        || m.contains("connection reset")
        || m.contains("broken pipe")
}

/// Whether an UNAVAILABLE is the connection's, not the gateway's answer.
fn is_transport(message: &str) -> bool {
    let m = message.to_ascii_lowercase();
    m.contains("transport")
        || m.contains("connection")
        || m.contains("connect")
        || m.contains("broken pipe")
        || m.contains("error trying")
}

pub(super) struct GrpcClient {
    opts: ConnectOptions,
    session_id: String,
    root: String,
    channel: Channel,
    bearer: Bearer,
    prefix: String,
    counter: std::sync::atomic::AtomicU64,
}

impl GrpcClient {
    pub(super) async fn connect(opts: ConnectOptions) -> Result<GrpcClient> {
        let target = super::redact_url(&opts.url);
        let connect_err = |detail: String| ClientError::Connect {
            url: target.clone(),
            detail,
        };
        let url = match opts.url.strip_prefix("grpc://") {
            Some(rest) => format!("http://{rest}"),
            None => opts.url.clone(),
        };
        let channel = Channel::from_shared(url)
            .map_err(|e| connect_err(e.to_string()))?
            .initial_stream_window_size(crate::transport::grpc::HTTP2_STREAM_WINDOW_BYTES)
            .initial_connection_window_size(crate::transport::grpc::HTTP2_CONNECTION_WINDOW_BYTES)
            .http2_adaptive_window(true)
            .tcp_nodelay(true)
            .connect()
            .await
            .map_err(|e| connect_err(error_chain(&e)))?;
        let bearer = Bearer(
            format!("Bearer {}", opts.token)
                .parse()
                .map_err(|_| connect_err("the token is not a valid header value".to_owned()))?,
        );
        let mut client = GrpcClient {
            opts,
            session_id: String::new(),
            root: String::new(),
            channel,
            bearer,
            prefix: unique_prefix(),
            counter: std::sync::atomic::AtomicU64::new(0),
        };
        let auth_err = |e: ClientError| match e {
            ClientError::Rpc { code, message, .. } if code == -32002 || code == -32003 => {
                connect_err(message)
            }
            e => e,
        };
        client.session_id = match client.opts.resume_session.clone() {
            Some(s) => {
                client
                    .sessions()
                    .resume_session(pb::ResumeSessionRequest { session_id: s })
                    .await
                    .map_err(status_error)
                    .map_err(auth_err)?
                    .into_inner()
                    .session_id
            }
            None => {
                client
                    .sessions()
                    .create_session(pb::CreateSessionRequest {
                        client_name: client.opts.client_name.clone(),
                    })
                    .await
                    .map_err(status_error)
                    .map_err(auth_err)?
                    .into_inner()
                    .session_id
            }
        };
        client.root = pb::environment_service_client::EnvironmentServiceClient::with_interceptor(
            client.channel.clone(),
            client.bearer.clone(),
        )
        .get_info(pb::GetInfoRequest {})
        .await
        .map_err(status_error)?
        .into_inner()
        .cwd;
        Ok(client)
    }

    pub(super) fn session_id(&self) -> &str {
        &self.session_id
    }

    pub(super) fn root(&self) -> &str {
        &self.root
    }

    fn sessions(&self) -> pb::session_service_client::SessionServiceClient<Svc> {
        pb::session_service_client::SessionServiceClient::with_interceptor(
            self.channel.clone(),
            self.bearer.clone(),
        )
    }

    fn processes(&self) -> pb::process_service_client::ProcessServiceClient<Svc> {
        pb::process_service_client::ProcessServiceClient::with_interceptor(
            self.channel.clone(),
            self.bearer.clone(),
        )
        .max_decoding_message_size(MAX_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_MESSAGE_BYTES)
    }

    fn files(&self) -> pb::file_service_client::FileServiceClient<Svc> {
        pb::file_service_client::FileServiceClient::with_interceptor(
            self.channel.clone(),
            self.bearer.clone(),
        )
        .max_decoding_message_size(MAX_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_MESSAGE_BYTES)
    }

    /// Run a unary call, retrying while the connection is down (the
    /// channel reconnects) or the gateway is overloaded.
    async fn retrying<T, F, Fut>(&self, mut call: F) -> Result<T>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        let mut backoff: Option<Backoff> = None;
        loop {
            match call().await.map_err(status_error) {
                Ok(r) => return Ok(r.into_inner()),
                Err(e @ ClientError::Disconnected(_)) => {
                    let b = backoff.get_or_insert_with(|| Backoff::new(self.opts.resume_within));
                    if !b.wait().await {
                        return Err(e);
                    }
                }
                Err(ClientError::Rpc { code: -32001, .. }) => {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(e) => return Err(e),
            }
        }
    }

    fn spec(spec: &ProcessSpec) -> pb::ProcessSpec {
        pb::ProcessSpec {
            process_id: spec.process_id.clone(),
            argv: spec.argv.clone(),
            cwd: spec.cwd.clone(),
            env: spec.env.clone().into_iter().collect(),
            tty: spec.tty,
            pipe_stdin: spec.pipe_stdin && !spec.tty,
            arg0: None,
            env_policy: Some(pb::EnvPolicy {
                inherit: pb::EnvInherit::All as i32,
                ..pb::EnvPolicy::default()
            }),
        }
    }

    pub(super) async fn start(&self, spec: &ProcessSpec) -> Result<()> {
        let spec = Self::spec(spec);
        let mut first = true;
        let r = self
            .retrying(|| {
                let retried = !first;
                first = false;
                let req = pb::StartRequest {
                    session_id: self.session_id.clone(),
                    spec: Some(spec.clone()),
                };
                let mut c = self.processes();
                async move {
                    match c.start(req).await {
                        // A start retried after a drop may find the first one done.
                        Err(s) if retried && s.code() == tonic::Code::AlreadyExists => {
                            Ok(tonic::Response::new(pb::StartResponse::default()))
                        }
                        r => r,
                    }
                }
            })
            .await;
        r.map(|_| ())
    }

    /// Start a process and stream its events in one call (`Exec`).
    pub(super) async fn exec(&self, spec: &ProcessSpec) -> Result<GrpcAttachment> {
        use futures_util::StreamExt as _;
        let mut a = self.attachment(&spec.process_id, 0);
        let req = pb::ExecRequest {
            session_id: self.session_id.clone(),
            spec: Some(Self::spec(spec)),
        };
        // The gateway starts the process before it answers: a refused
        // start is this call's status.
        let stream = self
            .processes()
            .exec(req)
            .await
            .map_err(status_error)?
            .into_inner();
        a.stream = Some(Box::pin(stream.map(|r| r.map(|m| m.event))));
        Ok(a)
    }

    fn attachment(&self, process_id: &str, after_seq: u64) -> GrpcAttachment {
        GrpcAttachment {
            client: self.processes(),
            session_id: self.session_id.clone(),
            process_id: process_id.to_owned(),
            resume_within: self.opts.resume_within,
            stream: None,
            cursor: after_seq,
            last_seq: after_seq,
            exited: false,
            closed: false,
            resyncs: 0,
        }
    }

    pub(super) async fn attach(&self, process_id: &str, after_seq: u64) -> Result<GrpcAttachment> {
        let mut a = self.attachment(process_id, after_seq);
        a.open().await?;
        Ok(a)
    }

    pub(super) async fn close(&self) -> Result<()> {
        self.retrying(|| {
            let req = pb::CloseSessionRequest {
                session_id: self.session_id.clone(),
            };
            let mut c = self.sessions();
            async move { c.close_session(req).await }
        })
        .await
        .map(|_| ())
    }

    pub(super) async fn write(&self, process_id: &str, data: &[u8]) -> Result<WriteStatus> {
        let write_id = format!(
            "w-{}-{}",
            self.prefix,
            self.counter
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        );
        let r = self
            .retrying(|| {
                let req = pb::WriteRequest {
                    session_id: self.session_id.clone(),
                    process_id: process_id.to_owned(),
                    data: bytes::Bytes::copy_from_slice(data),
                    write_id: Some(write_id.clone()),
                };
                let mut c = self.processes();
                async move { c.write(req).await }
            })
            .await?;
        Ok(match pb::WriteStatus::try_from(r.status) {
            Ok(pb::WriteStatus::Accepted) => WriteStatus::Accepted,
            Ok(pb::WriteStatus::UnknownProcess) => WriteStatus::UnknownProcess,
            Ok(pb::WriteStatus::StdinClosed) => WriteStatus::StdinClosed,
            Ok(pb::WriteStatus::Starting) => WriteStatus::Starting,
            _ => return Err(ClientError::Protocol(format!("write status {}", r.status))),
        })
    }

    pub(super) async fn close_stdin(&self, process_id: &str) -> Result<()> {
        self.retrying(|| {
            let req = pb::CloseStdinRequest {
                session_id: self.session_id.clone(),
                process_id: process_id.to_owned(),
            };
            let mut c = self.processes();
            async move { c.close_stdin(req).await }
        })
        .await
        .map(|_| ())
    }

    pub(super) async fn signal(&self, process_id: &str, signal: Signal) -> Result<()> {
        let kind = match signal {
            Signal::Interrupt => pb::SignalKind::Interrupt,
            Signal::Terminate => pb::SignalKind::Terminate,
            Signal::Kill => pb::SignalKind::Kill,
            Signal::Hangup => pb::SignalKind::Hangup,
            Signal::Quit => pb::SignalKind::Quit,
            Signal::User1 => pb::SignalKind::User1,
            Signal::User2 => pb::SignalKind::User2,
        };
        self.retrying(|| {
            let req = pb::SignalRequest {
                session_id: self.session_id.clone(),
                process_id: process_id.to_owned(),
                signal: kind as i32,
            };
            let mut c = self.processes();
            async move { c.signal(req).await }
        })
        .await
        .map(|_| ())
    }

    pub(super) async fn resize(&self, process_id: &str, rows: u16, cols: u16) -> Result<()> {
        self.retrying(|| {
            let req = pb::ResizeRequest {
                session_id: self.session_id.clone(),
                process_id: process_id.to_owned(),
                rows: u32::from(rows),
                cols: u32::from(cols),
            };
            let mut c = self.processes();
            async move { c.resize(req).await }
        })
        .await
        .map(|_| ())
    }

    pub(super) async fn terminate(&self, process_id: &str) -> Result<bool> {
        self.retrying(|| {
            let req = pb::TerminateRequest {
                session_id: self.session_id.clone(),
                process_id: process_id.to_owned(),
            };
            let mut c = self.processes();
            async move { c.terminate(req).await }
        })
        .await
        .map(|r| r.running)
    }

    pub(super) async fn list(&self) -> Result<Vec<ProcessInfo>> {
        let r = self
            .retrying(|| {
                let req = pb::ListRequest {
                    session_id: self.session_id.clone(),
                };
                let mut c = self.processes();
                async move { c.list(req).await }
            })
            .await?;
        Ok(r.processes
            .into_iter()
            .map(|p| ProcessInfo {
                state: match pb::ProcessState::try_from(p.state) {
                    Ok(pb::ProcessState::Starting) => "starting",
                    Ok(pb::ProcessState::Running) => "running",
                    Ok(pb::ProcessState::Exited) => "exited",
                    Ok(pb::ProcessState::Closed) => "closed",
                    _ => "unknown",
                }
                .to_owned(),
                process_id: p.process_id,
                tty: p.tty,
                exit_code: p.exit_code,
                next_seq: p.next_seq,
            })
            .collect())
    }

    pub(super) async fn read_file_to<W: AsyncWrite + Unpin + Send>(
        &self,
        path: &str,
        sink: &mut W,
    ) -> Result<u64> {
        // A broken stream goes on from the bytes already written.
        let mut total = 0u64;
        let mut backoff: Option<Backoff> = None;
        loop {
            let req = pb::ReadFileRequest {
                path: path.to_owned(),
                offset: total,
                length: 0,
            };
            let broken = match self.files().read_file(req).await {
                Ok(r) => {
                    let mut stream = r.into_inner();
                    loop {
                        match stream.message().await {
                            Ok(Some(m)) => {
                                sink.write_all(&m.data).await?;
                                total += m.data.len() as u64;
                            }
                            Ok(None) => {
                                sink.flush().await?;
                                return Ok(total);
                            }
                            Err(s) => break status_error(s),
                        }
                    }
                }
                Err(s) => status_error(s),
            };
            match broken {
                e @ ClientError::Disconnected(_) => {
                    let b = backoff.get_or_insert_with(|| Backoff::new(self.opts.resume_within));
                    if !b.wait().await {
                        return Err(e);
                    }
                }
                e => return Err(e),
            }
        }
    }

    pub(super) async fn write_file_from<R: AsyncRead + Unpin + Send>(
        &self,
        path: &str,
        source: &mut R,
    ) -> Result<u64> {
        // Blocks are read ahead into a bounded channel the call streams.
        let (tx, rx) = tokio::sync::mpsc::channel::<pb::WriteFileRequest>(4);
        let call = {
            let mut files = self.files();
            async move {
                files
                    .write_file(tokio_stream::wrappers::ReceiverStream::new(rx))
                    .await
            }
        };
        let path = path.to_owned();
        let feed = async move {
            let mut first = true;
            loop {
                let mut buf = vec![0u8; FILE_BLOCK_BYTES];
                let mut n = 0;
                while n < buf.len() {
                    let got = source.read(&mut buf[n..]).await?;
                    if got == 0 {
                        break;
                    }
                    n += got;
                }
                buf.truncate(n);
                if n == 0 && !first {
                    return Ok::<(), ClientError>(());
                }
                let msg = pb::WriteFileRequest {
                    path: if first { path.clone() } else { String::new() },
                    data: buf.into(),
                };
                first = false;
                if tx.send(msg).await.is_err() {
                    // The call ended early; its status says why.
                    return Ok(());
                }
                if n < FILE_BLOCK_BYTES {
                    return Ok(());
                }
            }
        };
        let (fed, answer) = tokio::join!(feed, call);
        let written = answer.map_err(status_error)?.into_inner().bytes_written;
        fed?;
        Ok(written)
    }

    pub(super) async fn create_directory(&self, path: &str, recursive: bool) -> Result<()> {
        self.retrying(|| {
            let req = pb::CreateDirectoryRequest {
                path: path.to_owned(),
                recursive,
            };
            let mut c = self.files();
            async move { c.create_directory(req).await }
        })
        .await
        .map(|_| ())
    }

    pub(super) async fn metadata(&self, path: &str) -> Result<Metadata> {
        let m = self
            .retrying(|| {
                let req = pb::GetMetadataRequest {
                    path: path.to_owned(),
                };
                let mut c = self.files();
                async move { c.get_metadata(req).await }
            })
            .await?;
        Ok(Metadata {
            is_directory: m.is_directory,
            is_file: m.is_file,
            is_symlink: m.is_symlink,
            size: m.size,
            modified_at_ms: m.modified_at_ms,
        })
    }

    pub(super) async fn read_directory(&self, path: &str) -> Result<Vec<DirEntry>> {
        let r = self
            .retrying(|| {
                let req = pb::ReadDirectoryRequest {
                    path: path.to_owned(),
                };
                let mut c = self.files();
                async move { c.read_directory(req).await }
            })
            .await?;
        Ok(r.entries
            .into_iter()
            .map(|e| DirEntry {
                file_name: e.file_name,
                is_directory: e.is_directory,
                is_file: e.is_file,
            })
            .collect())
    }

    pub(super) async fn remove(&self, path: &str, recursive: bool, force: bool) -> Result<()> {
        self.retrying(|| {
            let req = pb::RemoveRequest {
                path: path.to_owned(),
                recursive,
                force,
            };
            let mut c = self.files();
            async move { c.remove(req).await }
        })
        .await
        .map(|_| ())
    }
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

/// The events of an `Attach` or `Exec` stream.
type EventStream = std::pin::Pin<
    Box<dyn futures_util::Stream<Item = Result<Option<pb::ProcessEvent>, tonic::Status>> + Send>,
>;

/// A process's events over an `Attach` stream, opened again after the
/// last seq when it breaks.
pub(super) struct GrpcAttachment {
    client: pb::process_service_client::ProcessServiceClient<Svc>,
    session_id: String,
    process_id: String,
    resume_within: Duration,
    stream: Option<EventStream>,
    /// The last output seq yielded.
    cursor: u64,
    /// The last seq of any event seen.
    last_seq: u64,
    exited: bool,
    closed: bool,
    resyncs: u64,
}

impl GrpcAttachment {
    pub(super) fn cursor(&self) -> u64 {
        self.cursor
    }

    pub(super) fn resyncs(&self) -> u64 {
        self.resyncs
    }

    async fn open(&mut self) -> Result<()> {
        let mut backoff = Backoff::new(self.resume_within);
        loop {
            let req = pb::AttachRequest {
                session_id: self.session_id.clone(),
                process_id: self.process_id.clone(),
                after_seq: self.last_seq,
            };
            match self.client.attach(req).await.map_err(status_error) {
                Ok(s) => {
                    use futures_util::StreamExt as _;
                    self.stream = Some(Box::pin(s.into_inner().map(|r| r.map(|m| m.event))));
                    return Ok(());
                }
                Err(e @ ClientError::Disconnected(_)) => {
                    if !backoff.wait().await {
                        return Err(e);
                    }
                }
                Err(e) => return Err(e),
            }
        }
    }

    pub(super) async fn next(&mut self) -> Result<Option<Event>> {
        loop {
            if self.closed {
                return Ok(None);
            }
            let Some(stream) = self.stream.as_mut() else {
                self.resyncs += 1;
                self.open().await?;
                continue;
            };
            let msg = match futures_util::StreamExt::next(stream).await {
                Some(Ok(m)) => m,
                None => {
                    // Ended before `closed`: attach again.
                    self.stream = None;
                    continue;
                }
                Some(Err(s)) => {
                    let e = status_error(s);
                    // A reader the live feed dropped, or a broken connection:
                    // attach again after the last seq.
                    if matches!(e, ClientError::Disconnected(_))
                        || e.to_string().contains("attach again")
                    {
                        self.stream = None;
                        continue;
                    }
                    return Err(e);
                }
            };
            let Some(ev) = msg else { continue };
            if ev.seq <= self.last_seq {
                continue;
            }
            self.last_seq = ev.seq;
            match ev.event {
                Some(pb::process_event::Event::Output(o)) => {
                    self.cursor = ev.seq;
                    let stream = match pb::OutputStream::try_from(o.stream) {
                        Ok(pb::OutputStream::Stderr) => Stream::Stderr,
                        Ok(pb::OutputStream::Pty) => Stream::Pty,
                        _ => Stream::Stdout,
                    };
                    return Ok(Some(Event::Output {
                        seq: ev.seq,
                        stream,
                        data: o.data,
                    }));
                }
                Some(pb::process_event::Event::Exited(x)) if !self.exited => {
                    self.exited = true;
                    return Ok(Some(Event::Exited {
                        code: x.exit_code,
                        signal: x.signal,
                    }));
                }
                Some(pb::process_event::Event::Closed(_)) => self.closed = true,
                Some(pb::process_event::Event::Exited(_)) | None => {}
            }
        }
    }
}
