//! The gRPC door (proto/exec_gateway/v1): prost messages ⇄ typed `Call`s
//! through the same tower stack, tenants, sessions and process tables as
//! JSON-RPC. Nothing here reaches a handler except through the stack.
//!
//! Auth reads `authorization: Bearer <jwt>` metadata with the websocket's
//! rules. Streams are bounded: each server stream has a small channel, and
//! Attach reads from the process's retained log, so a slow reader never
//! blocks a process or grows memory (it skips ahead past the retention).

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::Arc;

use futures_util::{Stream, StreamExt as _};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status, Streaming};
use tower::ServiceExt as _;

use crate::auth::Principal;
use crate::error::GatewayError;
use crate::exec::output::LogEvent;
use crate::gateway::Gateway;
use crate::protocol::ByteChunk;
use crate::protocol::fs::{CopyParams, CreateDirectoryParams, PathParams, RemoveParams};
use crate::protocol::process::{
    EnvInherit, EnvPolicy, ExecParams, ProcessIdParams, ProcessState, ReadParams, ResizeParams,
    SignalName, SignalParams, StreamName, WriteParams, WriteStatus,
};
use crate::rpc::{Call, Reply, RequestContext, RpcRequest};
use crate::session::Session;
use crate::tenant::Tenant;

/// Generated code, and the descriptor set for reflection.
pub mod pb {
    #![allow(clippy::all, clippy::pedantic, missing_docs, rust_2018_idioms)]
    tonic::include_proto!("exec_gateway.v1");

    pub const FILE_DESCRIPTOR_SET: &[u8] =
        include_bytes!(concat!(env!("OUT_DIR"), "/exec_gateway_descriptor.bin"));
}

/// Events buffered per server stream before the producer waits.
pub const STREAM_EVENTS: usize = 16;
/// Bytes per `ReadFile` message.
pub const FILE_CHUNK_BYTES: usize = 1024 * 1024;

type EventStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

/// The three services; cheap to clone.
#[derive(Clone)]
pub struct GrpcApi {
    gw: Arc<Gateway>,
}

struct Caller {
    principal: Arc<Principal>,
    tenant: Arc<Tenant>,
}

fn status(e: GatewayError) -> Status {
    e.to_grpc()
}

impl GrpcApi {
    pub fn new(gw: Arc<Gateway>) -> Self {
        Self { gw }
    }

    /// Authenticate a call from its metadata.
    async fn caller<T>(&self, req: &Request<T>) -> Result<Caller, Status> {
        let header = req
            .metadata()
            .get("authorization")
            .and_then(|v| v.to_str().ok());
        let token = crate::auth::bearer_token(header, None);
        let verified = match token {
            None => Err(crate::auth::AuthError::Missing),
            Some(t) => self.gw.auth.verify(&t).await,
        };
        let principal = verified.map_err(|e| {
            self.gw.metrics.auth_failure(e.reason());
            if e.http_status() == 403 {
                Status::permission_denied(e.to_string())
            } else {
                Status::unauthenticated(e.to_string())
            }
        })?;
        if self.gw.draining() {
            return Err(status(GatewayError::Draining));
        }
        let tenant = self
            .gw
            .tenants
            .get(&principal.tenant)
            .cloned()
            .ok_or_else(|| Status::unauthenticated("unknown tenant"))?;
        Ok(Caller {
            principal: Arc::new(principal),
            tenant,
        })
    }

    fn session(&self, caller: &Caller, id: &str) -> Result<Arc<Session>, Status> {
        self.gw.sessions.lookup(&caller.tenant, id).map_err(status)
    }

    /// Run a call through the stack.
    async fn call(
        &self,
        caller: &Caller,
        session: Option<Arc<Session>>,
        call: Call,
    ) -> Result<Reply, Status> {
        let req = RpcRequest {
            call,
            ctx: RequestContext {
                principal: caller.principal.clone(),
                tenant: caller.tenant.clone(),
                session,
                evicted: CancellationToken::new(),
            },
        };
        self.gw.stack.clone().oneshot(req).await.map_err(status)
    }

    async fn session_call(
        &self,
        caller: &Caller,
        session_id: &str,
        call: Call,
    ) -> Result<Reply, Status> {
        let session = self.session(caller, session_id)?;
        self.call(caller, Some(session), call).await
    }
}

fn unexpected() -> Status {
    Status::internal("unexpected reply")
}

fn spec_to_params(spec: Option<pb::ProcessSpec>) -> Result<ExecParams, Status> {
    let spec = spec.ok_or_else(|| Status::invalid_argument("spec is required"))?;
    let env_policy = spec.env_policy.map(|p| EnvPolicy {
        inherit: match pb::EnvInherit::try_from(p.inherit) {
            Ok(pb::EnvInherit::All) => EnvInherit::All,
            Ok(pb::EnvInherit::Core) => EnvInherit::Core,
            _ => EnvInherit::None,
        },
        ignore_default_excludes: p.ignore_default_excludes,
        exclude: p.exclude,
        set: p.set.into_iter().collect(),
        include_only: p.include_only,
    });
    Ok(ExecParams {
        process_id: spec.process_id,
        argv: spec.argv,
        cwd: spec.cwd,
        env: spec.env.into_iter().collect::<HashMap<_, _>>(),
        tty: spec.tty,
        pipe_stdin: spec.pipe_stdin,
        arg0: spec.arg0,
        env_policy,
        hold_output: false,
    })
}

fn stream_kind(s: StreamName) -> i32 {
    match s {
        StreamName::Stdout => pb::OutputStream::Stdout as i32,
        StreamName::Stderr => pb::OutputStream::Stderr as i32,
        StreamName::Pty => pb::OutputStream::Pty as i32,
    }
}

fn to_event(e: LogEvent) -> pb::ProcessEvent {
    use pb::process_event::Event;
    match e {
        LogEvent::Output(c) => pb::ProcessEvent {
            seq: c.seq,
            event: Some(Event::Output(pb::OutputChunk {
                stream: stream_kind(c.stream),
                data: c.data,
            })),
        },
        LogEvent::Exited { seq, code } => pb::ProcessEvent {
            seq,
            event: Some(Event::Exited(pb::Exited { exit_code: code })),
        },
        LogEvent::Closed { seq } => pb::ProcessEvent {
            seq,
            event: Some(Event::Closed(pb::Closed {})),
        },
    }
}

/// Stream a process's events from `after_seq` until `closed` (or the client
/// goes away): the retained replay, then live events with back-pressure.
/// `guard` keeps the session alive; `on_end` runs at the end.
fn follow<T, F>(
    handle: crate::exec::ProcessHandle,
    after_seq: u64,
    guard: crate::session::StreamGuard,
    wrap: F,
    on_end: Option<Box<dyn FnOnce() + Send>>,
) -> EventStream<T>
where
    T: Send + 'static,
    F: Fn(pb::ProcessEvent) -> T + Send + 'static,
{
    let (tx, rx) = mpsc::channel::<Result<T, Status>>(STREAM_EVENTS);
    crate::task::spawn("grpc-follow", async move {
        let _guard = guard;
        let (replay, mut live) = handle.subscribe(after_seq);
        let mut cursor = after_seq;
        let mut replay = replay.into_iter();
        loop {
            let next = match replay.next() {
                Some(e) => Some(e),
                None => live.recv().await,
            };
            let Some(e) = next else {
                // The pump dropped us (too slow) before `closed`.
                let _ = tx
                    .send(Err(Status::aborted(format!(
                        "reader too slow; attach again with after_seq = {cursor}"
                    ))))
                    .await;
                break;
            };
            if e.seq() <= cursor {
                continue;
            }
            cursor = e.seq();
            let closed = matches!(e, LogEvent::Closed { .. });
            if tx.send(Ok(wrap(to_event(e)))).await.is_err() || closed {
                break;
            }
        }
        if let Some(f) = on_end {
            f();
        }
    });
    Box::pin(ReceiverStream::new(rx))
}

#[tonic::async_trait]
impl pb::session_service_server::SessionService for GrpcApi {
    async fn create_session(
        &self,
        req: Request<pb::CreateSessionRequest>,
    ) -> Result<Response<pb::CreateSessionResponse>, Status> {
        let caller = self.caller(&req).await?;
        let session = self
            .gw
            .sessions
            .create_detached(&caller.tenant)
            .map_err(status)?;
        Ok(Response::new(pb::CreateSessionResponse {
            session_id: session.id.clone(),
        }))
    }

    async fn resume_session(
        &self,
        req: Request<pb::ResumeSessionRequest>,
    ) -> Result<Response<pb::ResumeSessionResponse>, Status> {
        let caller = self.caller(&req).await?;
        let session = self.session(&caller, &req.get_ref().session_id)?;
        Ok(Response::new(pb::ResumeSessionResponse {
            session_id: session.id.clone(),
        }))
    }
}

#[tonic::async_trait]
impl pb::process_service_server::ProcessService for GrpcApi {
    async fn start(
        &self,
        req: Request<pb::StartRequest>,
    ) -> Result<Response<pb::StartResponse>, Status> {
        let caller = self.caller(&req).await?;
        let r = req.into_inner();
        let params = spec_to_params(r.spec)?;
        match self
            .session_call(&caller, &r.session_id, Call::ProcessStart(params))
            .await?
        {
            Reply::ProcessStart(s) => Ok(Response::new(pb::StartResponse {
                process_id: s.process_id,
            })),
            _ => Err(unexpected()),
        }
    }

    type AttachStream = EventStream<pb::AttachResponse>;

    async fn attach(
        &self,
        req: Request<pb::AttachRequest>,
    ) -> Result<Response<Self::AttachStream>, Status> {
        let caller = self.caller(&req).await?;
        let r = req.into_inner();
        let session = self.session(&caller, &r.session_id)?;
        let call = Call::ProcessAttach(ProcessIdParams {
            process_id: r.process_id,
        });
        let Reply::Process(handle) = self.call(&caller, Some(session.clone()), call).await? else {
            return Err(unexpected());
        };
        Ok(Response::new(follow(
            handle,
            r.after_seq,
            session.stream_guard(),
            |event| pb::AttachResponse { event: Some(event) },
            None,
        )))
    }

    async fn read(
        &self,
        req: Request<pb::ReadRequest>,
    ) -> Result<Response<pb::ReadResponse>, Status> {
        let caller = self.caller(&req).await?;
        let r = req.into_inner();
        let call = Call::ProcessRead(ReadParams {
            process_id: r.process_id,
            after_seq: Some(r.after_seq),
            max_bytes: (r.max_bytes > 0)
                .then(|| usize::try_from(r.max_bytes).unwrap_or(usize::MAX)),
            wait_ms: Some(r.wait_ms),
        });
        match self.session_call(&caller, &r.session_id, call).await? {
            Reply::ProcessRead(rr) => Ok(Response::new(pb::ReadResponse {
                chunks: rr
                    .chunks
                    .into_iter()
                    .map(|c| pb::ReadChunk {
                        seq: c.seq,
                        stream: stream_kind(c.stream),
                        data: c.chunk.0.into(),
                    })
                    .collect(),
                next_seq: rr.next_seq,
                exited: rr.exited,
                exit_code: rr.exit_code,
                closed: rr.closed,
            })),
            _ => Err(unexpected()),
        }
    }

    async fn write(
        &self,
        req: Request<pb::WriteRequest>,
    ) -> Result<Response<pb::WriteResponse>, Status> {
        let caller = self.caller(&req).await?;
        let r = req.into_inner();
        let call = Call::ProcessWrite(WriteParams {
            process_id: r.process_id,
            chunk: ByteChunk(r.data.to_vec()),
            write_id: r.write_id,
        });
        match self.session_call(&caller, &r.session_id, call).await? {
            Reply::ProcessWrite(w) => Ok(Response::new(pb::WriteResponse {
                status: match w.status {
                    WriteStatus::Accepted => pb::WriteStatus::Accepted,
                    WriteStatus::UnknownProcess => pb::WriteStatus::UnknownProcess,
                    WriteStatus::StdinClosed => pb::WriteStatus::StdinClosed,
                    WriteStatus::Starting => pb::WriteStatus::Starting,
                } as i32,
            })),
            _ => Err(unexpected()),
        }
    }

    async fn stream_input(
        &self,
        req: Request<Streaming<pb::StreamInputRequest>>,
    ) -> Result<Response<pb::StreamInputResponse>, Status> {
        let caller = self.caller(&req).await?;
        let mut input = req.into_inner();
        let Some(first) = input.next().await.transpose()? else {
            return Ok(Response::new(pb::StreamInputResponse { bytes_written: 0 }));
        };
        let session = self.session(&caller, &first.session_id)?;
        let process_id = first.process_id;
        let mut written = 0u64;
        let mut next = Some(first.data);
        loop {
            let Some(data) = next.take() else { break };
            let len = data.len() as u64;
            // Each chunk is a process/write through the stack (scope, rate).
            let call = Call::ProcessWrite(WriteParams {
                process_id: process_id.clone(),
                chunk: ByteChunk(data.to_vec()),
                write_id: None,
            });
            match self.call(&caller, Some(session.clone()), call).await? {
                Reply::ProcessWrite(w) if w.status == WriteStatus::Accepted => written += len,
                Reply::ProcessWrite(w) => {
                    return Err(Status::failed_precondition(format!(
                        "stdin not writable: {:?}",
                        w.status
                    )));
                }
                _ => return Err(unexpected()),
            }
            next = input.next().await.transpose()?.map(|m| m.data);
        }
        Ok(Response::new(pb::StreamInputResponse {
            bytes_written: written,
        }))
    }

    async fn close_stdin(
        &self,
        req: Request<pb::CloseStdinRequest>,
    ) -> Result<Response<pb::CloseStdinResponse>, Status> {
        let caller = self.caller(&req).await?;
        let r = req.into_inner();
        let call = Call::ProcessCloseStdin(ProcessIdParams {
            process_id: r.process_id,
        });
        self.session_call(&caller, &r.session_id, call).await?;
        Ok(Response::new(pb::CloseStdinResponse {}))
    }

    async fn signal(
        &self,
        req: Request<pb::SignalRequest>,
    ) -> Result<Response<pb::SignalResponse>, Status> {
        let caller = self.caller(&req).await?;
        let r = req.into_inner();
        let signal = match pb::SignalKind::try_from(r.signal) {
            Ok(pb::SignalKind::Interrupt) => SignalName::Interrupt,
            Ok(pb::SignalKind::Terminate) => SignalName::Terminate,
            Ok(pb::SignalKind::Kill) => SignalName::Kill,
            Ok(pb::SignalKind::Hangup) => SignalName::Hangup,
            Ok(pb::SignalKind::Quit) => SignalName::Quit,
            Ok(pb::SignalKind::User1) => SignalName::User1,
            Ok(pb::SignalKind::User2) => SignalName::User2,
            _ => return Err(Status::invalid_argument("signal is required")),
        };
        let call = Call::ProcessSignal(SignalParams {
            process_id: r.process_id,
            signal,
        });
        self.session_call(&caller, &r.session_id, call).await?;
        Ok(Response::new(pb::SignalResponse {}))
    }

    async fn resize(
        &self,
        req: Request<pb::ResizeRequest>,
    ) -> Result<Response<pb::ResizeResponse>, Status> {
        let caller = self.caller(&req).await?;
        let r = req.into_inner();
        let dim = |v: u32| {
            u16::try_from(v)
                .map_err(|_| Status::invalid_argument("rows and cols must fit in 16 bits"))
        };
        let call = Call::ProcessResize(ResizeParams {
            process_id: r.process_id,
            rows: dim(r.rows)?,
            cols: dim(r.cols)?,
        });
        self.session_call(&caller, &r.session_id, call).await?;
        Ok(Response::new(pb::ResizeResponse {}))
    }

    async fn terminate(
        &self,
        req: Request<pb::TerminateRequest>,
    ) -> Result<Response<pb::TerminateResponse>, Status> {
        let caller = self.caller(&req).await?;
        let r = req.into_inner();
        let call = Call::ProcessTerminate(ProcessIdParams {
            process_id: r.process_id,
        });
        match self.session_call(&caller, &r.session_id, call).await? {
            Reply::ProcessTerminate(t) => {
                Ok(Response::new(pb::TerminateResponse { running: t.running }))
            }
            _ => Err(unexpected()),
        }
    }

    async fn list(
        &self,
        req: Request<pb::ListRequest>,
    ) -> Result<Response<pb::ListResponse>, Status> {
        let caller = self.caller(&req).await?;
        let r = req.into_inner();
        match self
            .session_call(&caller, &r.session_id, Call::ProcessList)
            .await?
        {
            Reply::ProcessList(l) => Ok(Response::new(pb::ListResponse {
                processes: l
                    .processes
                    .into_iter()
                    .map(|p| pb::ProcessInfo {
                        process_id: p.process_id,
                        state: match p.state {
                            ProcessState::Starting => pb::ProcessState::Starting,
                            ProcessState::Running => pb::ProcessState::Running,
                            ProcessState::Exited => pb::ProcessState::Exited,
                            ProcessState::Closed => pb::ProcessState::Closed,
                        } as i32,
                        tty: p.tty,
                        exit_code: p.exit_code,
                        next_seq: p.next_seq,
                        first_retained_seq: p.first_retained_seq,
                    })
                    .collect(),
            })),
            _ => Err(unexpected()),
        }
    }

    type ExecStream = EventStream<pb::ExecResponse>;

    async fn exec(
        &self,
        req: Request<pb::ExecRequest>,
    ) -> Result<Response<Self::ExecStream>, Status> {
        let caller = self.caller(&req).await?;
        let r = req.into_inner();
        let mut params = spec_to_params(r.spec)?;
        params.hold_output = true;
        let process_id = params.process_id.clone();
        // No session given: one just for this call, removed when it ends.
        let (session, ephemeral) = if r.session_id.is_empty() {
            let s = self
                .gw
                .sessions
                .create_detached(&caller.tenant)
                .map_err(status)?;
            (s, true)
        } else {
            (self.session(&caller, &r.session_id)?, false)
        };
        let cleanup = {
            let (sessions, session) = (self.gw.sessions.clone(), session.clone());
            move || sessions.remove(&session)
        };
        let started = self
            .call(&caller, Some(session.clone()), Call::ProcessStart(params))
            .await;
        if let Err(e) = started {
            if ephemeral {
                cleanup();
            }
            return Err(e);
        }
        let call = Call::ProcessAttach(ProcessIdParams { process_id });
        let Reply::Process(handle) = self.call(&caller, Some(session.clone()), call).await? else {
            return Err(unexpected());
        };
        let on_end: Option<Box<dyn FnOnce() + Send>> = if ephemeral {
            Some(Box::new(cleanup))
        } else {
            None
        };
        Ok(Response::new(follow(
            handle,
            0,
            session.stream_guard(),
            |event| pb::ExecResponse { event: Some(event) },
            on_end,
        )))
    }
}

#[tonic::async_trait]
impl pb::file_service_server::FileService for GrpcApi {
    type ReadFileStream = EventStream<pb::ReadFileResponse>;

    async fn read_file(
        &self,
        req: Request<pb::ReadFileRequest>,
    ) -> Result<Response<Self::ReadFileStream>, Status> {
        let caller = self.caller(&req).await?;
        let call = Call::FsOpenRead(PathParams {
            path: req.into_inner().path,
        });
        let Reply::File(file) = self.call(&caller, None, call).await? else {
            return Err(unexpected());
        };
        let (tx, rx) = mpsc::channel(4);
        // Blocking reads on the blocking pool; the bounded channel is the
        // back-pressure (a slow reader holds one thread, not memory).
        tokio::task::spawn_blocking(move || {
            use std::io::Read as _;
            let mut f: &std::fs::File = &file.0;
            loop {
                let mut buf = vec![0u8; FILE_CHUNK_BYTES];
                match f.read(&mut buf) {
                    Ok(0) => break,
                    Ok(n) => {
                        buf.truncate(n);
                        if tx
                            .blocking_send(Ok(pb::ReadFileResponse { data: buf.into() }))
                            .is_err()
                        {
                            break;
                        }
                    }
                    Err(e) => {
                        let _ = tx.blocking_send(Err(status(GatewayError::from_fs_io(&e))));
                        break;
                    }
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn write_file(
        &self,
        req: Request<Streaming<pb::WriteFileRequest>>,
    ) -> Result<Response<pb::WriteFileResponse>, Status> {
        let caller = self.caller(&req).await?;
        let mut input = req.into_inner();
        let Some(first) = input.next().await.transpose()? else {
            return Err(Status::invalid_argument(
                "the first message must name the path",
            ));
        };
        let call = Call::FsOpenWrite(PathParams { path: first.path });
        let Reply::File(file) = self.call(&caller, None, call).await? else {
            return Err(unexpected());
        };
        let mut written = 0u64;
        let mut next = Some(first.data);
        while let Some(data) = next.take() {
            written += data.len() as u64;
            let f = file.clone();
            tokio::task::spawn_blocking(move || {
                use std::io::Write as _;
                let mut w: &std::fs::File = &f.0;
                w.write_all(&data)
            })
            .await
            .map_err(|e| Status::internal(e.to_string()))?
            .map_err(|e| status(GatewayError::from_fs_io(&e)))?;
            next = input.next().await.transpose()?.map(|m| m.data);
        }
        Ok(Response::new(pb::WriteFileResponse {
            bytes_written: written,
        }))
    }

    async fn create_directory(
        &self,
        req: Request<pb::CreateDirectoryRequest>,
    ) -> Result<Response<pb::CreateDirectoryResponse>, Status> {
        let caller = self.caller(&req).await?;
        let r = req.into_inner();
        let call = Call::FsCreateDirectory(CreateDirectoryParams {
            path: r.path,
            recursive: r.recursive,
        });
        self.call(&caller, None, call).await?;
        Ok(Response::new(pb::CreateDirectoryResponse {}))
    }

    async fn get_metadata(
        &self,
        req: Request<pb::GetMetadataRequest>,
    ) -> Result<Response<pb::GetMetadataResponse>, Status> {
        let caller = self.caller(&req).await?;
        let call = Call::FsGetMetadata(PathParams {
            path: req.into_inner().path,
        });
        match self.call(&caller, None, call).await? {
            Reply::FsGetMetadata(m) => Ok(Response::new(pb::GetMetadataResponse {
                is_directory: m.is_directory,
                is_file: m.is_file,
                is_symlink: m.is_symlink,
                created_at_ms: m.created_at_ms,
                modified_at_ms: m.modified_at_ms,
            })),
            _ => Err(unexpected()),
        }
    }

    async fn read_directory(
        &self,
        req: Request<pb::ReadDirectoryRequest>,
    ) -> Result<Response<pb::ReadDirectoryResponse>, Status> {
        let caller = self.caller(&req).await?;
        let call = Call::FsReadDirectory(PathParams {
            path: req.into_inner().path,
        });
        match self.call(&caller, None, call).await? {
            Reply::FsReadDirectory(d) => Ok(Response::new(pb::ReadDirectoryResponse {
                entries: d
                    .entries
                    .into_iter()
                    .map(|e| pb::DirectoryEntry {
                        file_name: e.file_name,
                        is_directory: e.is_directory,
                        is_file: e.is_file,
                    })
                    .collect(),
            })),
            _ => Err(unexpected()),
        }
    }

    async fn remove(
        &self,
        req: Request<pb::RemoveRequest>,
    ) -> Result<Response<pb::RemoveResponse>, Status> {
        let caller = self.caller(&req).await?;
        let r = req.into_inner();
        let call = Call::FsRemove(RemoveParams {
            path: r.path,
            recursive: r.recursive,
            force: r.force,
        });
        self.call(&caller, None, call).await?;
        Ok(Response::new(pb::RemoveResponse {}))
    }

    async fn copy(
        &self,
        req: Request<pb::CopyRequest>,
    ) -> Result<Response<pb::CopyResponse>, Status> {
        let caller = self.caller(&req).await?;
        let r = req.into_inner();
        let call = Call::FsCopy(CopyParams {
            source_path: r.source_path,
            destination_path: r.destination_path,
            recursive: r.recursive,
        });
        self.call(&caller, None, call).await?;
        Ok(Response::new(pb::CopyResponse {}))
    }
}

/// Largest gRPC message in either direction.
pub const MAX_GRPC_MESSAGE_BYTES: usize = 16 * 1024 * 1024;
/// HTTP/2 flow-control windows (per stream, per connection).
pub const HTTP2_STREAM_WINDOW_BYTES: u32 = 4 * 1024 * 1024;
pub const HTTP2_CONNECTION_WINDOW_BYTES: u32 = 16 * 1024 * 1024;
/// Largest HTTP/2 frame we accept (peers send at most what we advertise).
pub const HTTP2_MAX_FRAME_BYTES: u32 = 1024 * 1024;
/// Concurrent HTTP/2 streams per connection.
pub const MAX_CONCURRENT_STREAMS: u32 = 256;

/// Serve gRPC (with health and reflection) on `listener` until `gw.stopped`.
pub async fn serve(listener: tokio::net::TcpListener, gw: Arc<Gateway>) {
    use pb::file_service_server::FileServiceServer;
    use pb::process_service_server::ProcessServiceServer;
    use pb::session_service_server::SessionServiceServer;
    let api = GrpcApi::new(gw.clone());
    let (health, health_service) = tonic_health::server::health_reporter();
    health.set_serving::<ProcessServiceServer<GrpcApi>>().await;
    health.set_serving::<FileServiceServer<GrpcApi>>().await;
    health.set_serving::<SessionServiceServer<GrpcApi>>().await;
    let reflection = match tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(pb::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1()
    {
        Ok(r) => Some(r),
        Err(e) => {
            tracing::error!(error = %e, "gRPC reflection unavailable");
            None
        }
    };
    // Flip health to NOT_SERVING as soon as draining starts.
    let draining = {
        let (gw, health) = (gw.clone(), health.clone());
        crate::task::spawn("grpc-health-drain", async move {
            gw.draining_started().await;
            health
                .set_not_serving::<ProcessServiceServer<GrpcApi>>()
                .await;
            health.set_not_serving::<FileServiceServer<GrpcApi>>().await;
            health
                .set_not_serving::<SessionServiceServer<GrpcApi>>()
                .await;
            health
                .set_service_status("", tonic_health::ServingStatus::NotServing)
                .await;
        })
    };
    let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener).map(|s| {
        if let Ok(s) = &s {
            let _ = s.set_nodelay(true);
        }
        s
    });
    let result = tonic::transport::Server::builder()
        // Bulk streams need more than HTTP/2's 64 KiB default windows;
        // adaptive (BDP) windows grow them as the link allows.
        .initial_stream_window_size(Some(HTTP2_STREAM_WINDOW_BYTES))
        .initial_connection_window_size(Some(HTTP2_CONNECTION_WINDOW_BYTES))
        .http2_adaptive_window(Some(true))
        .max_frame_size(Some(HTTP2_MAX_FRAME_BYTES))
        .max_concurrent_streams(MAX_CONCURRENT_STREAMS)
        .concurrency_limit_per_connection(gw.settings.max_in_flight_per_connection)
        .http2_keepalive_interval(Some(std::time::Duration::from_secs(30)))
        .http2_keepalive_timeout(Some(std::time::Duration::from_secs(10)))
        .add_service(health_service)
        .add_optional_service(reflection)
        .add_service(
            SessionServiceServer::new(api.clone())
                .max_decoding_message_size(MAX_GRPC_MESSAGE_BYTES)
                .max_encoding_message_size(MAX_GRPC_MESSAGE_BYTES),
        )
        .add_service(
            ProcessServiceServer::new(api.clone())
                .max_decoding_message_size(MAX_GRPC_MESSAGE_BYTES)
                .max_encoding_message_size(MAX_GRPC_MESSAGE_BYTES),
        )
        .add_service(
            FileServiceServer::new(api)
                .max_decoding_message_size(MAX_GRPC_MESSAGE_BYTES)
                .max_encoding_message_size(MAX_GRPC_MESSAGE_BYTES),
        )
        .serve_with_incoming_shutdown(incoming, gw.stopped.cancelled())
        .await;
    if let Err(e) = result {
        tracing::error!(error = %e, "gRPC server failed");
    }
    draining.abort();
}
