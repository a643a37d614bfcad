//! The four gRPC services: each method converts its message into an
//! operation, runs it through the stack and converts the result back. The
//! caller was admitted by the server's authentication layer
//! ([`super::Authenticate`]); a method only reads it from the request.

use std::pin::Pin;
use std::sync::Arc;

use futures_util::{Stream, StreamExt as _};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status, Streaming};
use tower::ServiceExt as _;

use super::convert;
use super::pb;
use crate::dispatch::RpcRequest;
use crate::error::GatewayError;
use crate::fs::FsError;
use crate::gateway::Gateway;
use crate::outbound::Reservation;
use crate::protocol::ByteChunk;
use crate::protocol::fs::{CopyParams, CreateDirectoryParams, PathParams, RemoveParams};
use crate::protocol::path::WirePath;
use crate::protocol::process::{
    ProcessEvent, ProcessIdParams, ReadParams, ResizeParams, SignalParams, WriteParams, WriteStatus,
};
use crate::rpc::{Call, EventSource, NoParams, Op, Open, Opened, Outcome, Reply};
use crate::session::{Session, StreamGuard};
use crate::transport::authenticate::Caller;

/// Events buffered per server stream before the producer waits.
pub const STREAM_EVENTS: usize = 16;
/// Bytes per `ReadFile` message.
pub const FILE_CHUNK_BYTES: usize = 1024 * 1024;

type EventStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

/// The four services; cheap to clone.
#[derive(Clone)]
pub struct GrpcApi {
    gw: Arc<Gateway>,
}

fn status(e: GatewayError) -> Status {
    e.to_grpc()
}

fn unexpected() -> Status {
    Status::internal("unexpected reply")
}

/// The caller the authentication layer admitted.
fn caller<T>(req: &Request<T>) -> Result<Caller, Status> {
    req.extensions()
        .get::<Caller>()
        .cloned()
        .ok_or_else(|| Status::internal("the call was not authenticated"))
}

impl GrpcApi {
    pub fn new(gw: Arc<Gateway>) -> Self {
        Self { gw }
    }

    fn session(&self, caller: &Caller, id: &str) -> Result<Arc<Session>, Status> {
        self.gw.check_local_owner(id).map_err(status)?;
        self.gw.sessions.lookup(caller.tenant(), id).map_err(status)
    }

    /// A new session with no connection; refused while draining.
    async fn new_session(&self, caller: &Caller) -> Result<Arc<Session>, Status> {
        if self.gw.is_draining() {
            return Err(status(crate::error::GatewayError::Draining));
        }
        self.gw
            .sessions
            .create_detached(caller.tenant())
            .await
            .map_err(status)
    }

    /// Run an operation through the stack.
    async fn run(
        &self,
        caller: &Caller,
        session: Option<Arc<Session>>,
        op: Op,
    ) -> Result<Outcome, Status> {
        let req = RpcRequest {
            op,
            ctx: caller.context(session, CancellationToken::new()),
        };
        self.gw.stack.clone().oneshot(req).await.map_err(status)
    }

    async fn call(
        &self,
        caller: &Caller,
        session: Option<Arc<Session>>,
        call: Call,
    ) -> Result<Reply, Status> {
        match self.run(caller, session, Op::Call(call)).await? {
            Outcome::Reply(r) => Ok(r),
            Outcome::Opened(_) | Outcome::Sent => Err(unexpected()),
        }
    }

    async fn open(
        &self,
        caller: &Caller,
        session: Option<Arc<Session>>,
        open: Open,
    ) -> Result<Opened, Status> {
        match self.run(caller, session, Op::Open(open)).await? {
            Outcome::Opened(o) => Ok(o),
            Outcome::Reply(_) | Outcome::Sent => Err(unexpected()),
        }
    }

    /// A place among the caller's tenant's open streams.
    fn stream_slot(&self, caller: &Caller) -> Result<StreamSlot, Status> {
        let tenant = caller.tenant();
        match tenant.streams.clone().try_acquire_owned() {
            Ok(permit) => Ok(StreamSlot {
                expires_at: caller.principal().expires_at,
                permit,
                stall: self.gw.settings.slow_client_timeout,
            }),
            Err(_) => Err(Status::resource_exhausted(format!(
                "too many open streams for this tenant (max_streams {})",
                tenant.settings.max_streams
            ))),
        }
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

/// Stream a process's events from `after_seq` until `closed` (or the client
/// goes away): the retained replay, then live events with back-pressure.
/// `guard` keeps the session alive; `on_end` runs at the end.
#[allow(clippy::too_many_arguments)]
fn follow<T, F>(
    source: Arc<dyn EventSource>,
    after_seq: u64,
    guard: StreamGuard,
    wrap: F,
    on_end: Option<Box<dyn FnOnce() + Send>>,
    slot: StreamSlot,
) -> EventStream<T>
where
    T: Send + 'static,
    F: Fn(pb::ProcessEvent) -> T + Send + 'static,
{
    let (tx, rx) = mpsc::channel::<Result<T, Status>>(STREAM_EVENTS);
    let stalled = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stall = slot.stall;
    let ended = stalled.clone();
    crate::task::start("grpc-follow", async move {
        let _guard = guard;
        // Sends wait for the client at most the slow-client timeout.
        let send = |item| {
            let tx = tx.clone();
            let stalled = stalled.clone();
            async move {
                match tokio::time::timeout(stall, tx.send(item)).await {
                    Ok(r) => r.is_ok(),
                    Err(_) => {
                        stalled.store(true, std::sync::atomic::Ordering::Release);
                        false
                    }
                }
            }
        };
        let (replay, mut live) = source.subscribe(after_seq);
        let mut cursor = after_seq;
        let mut replay = replay.into_iter();
        loop {
            let next = match replay.next() {
                Some(e) => Some(e),
                None => tokio::select! {
                    e = live.recv() => e,
                    // The client went away: stop (and drop the source's
                    // channel, which ends a remote source's polls).
                    () = tx.closed() => break,
                },
            };
            let Some(e) = next else {
                // The process dropped us (too slow) before `closed`.
                let _ = send(Err(Status::aborted(format!(
                    "reader too slow; attach again with after_seq = {cursor}"
                ))))
                .await;
                break;
            };
            if e.seq() <= cursor {
                continue;
            }
            cursor = e.seq();
            let closed = matches!(e, ProcessEvent::Closed { .. });
            if !send(Ok(wrap(convert::event(e)))).await || closed {
                break;
            }
        }
        if let Some(f) = on_end {
            f();
        }
    });
    finish(rx, ended, slot.permit, slot.expires_at)
}

/// An open server stream's place in its tenant's `max_streams`, and how
/// long it may wait for its client.
pub struct StreamSlot {
    permit: tokio::sync::OwnedSemaphorePermit,
    stall: std::time::Duration,
    /// When the caller's token expires: the stream ends then.
    expires_at: Option<std::time::SystemTime>,
}

/// The receiving end of a server stream: it ends with DEADLINE_EXCEEDED if
/// the producer gave up on a client that stopped reading (never a silent
/// end that looks complete), and with UNAUTHENTICATED when the caller's
/// token expires (`expires_at`); the slot is held until the stream is
/// dropped.
fn finish<T: Send + 'static>(
    rx: mpsc::Receiver<Result<T, Status>>,
    stalled: Arc<std::sync::atomic::AtomicBool>,
    permit: tokio::sync::OwnedSemaphorePermit,
    expires_at: Option<std::time::SystemTime>,
) -> EventStream<T> {
    let expired = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let expiry = {
        let expired = expired.clone();
        async move {
            match expires_at {
                Some(at) => {
                    let left = at
                        .duration_since(std::time::SystemTime::now())
                        .unwrap_or_default();
                    tokio::time::sleep(left).await;
                    expired.store(true, std::sync::atomic::Ordering::Release);
                }
                None => std::future::pending().await,
            }
        }
    };
    let tail = futures_util::stream::once(async move {
        let _permit = permit;
        if expired.load(std::sync::atomic::Ordering::Acquire) {
            return Some(Err(Status::unauthenticated(
                "token expired; call again with a fresh token",
            )));
        }
        stalled.load(std::sync::atomic::Ordering::Acquire).then(|| {
            Err(Status::deadline_exceeded(
                "the client stopped reading for longer than the slow-client timeout",
            ))
        })
    })
    .filter_map(std::future::ready);
    Box::pin(
        ReceiverStream::new(rx)
            .take_until(Box::pin(expiry))
            .chain(tail),
    )
}

#[tonic::async_trait]
impl pb::session_service_server::SessionService for GrpcApi {
    async fn create_session(
        &self,
        req: Request<pb::CreateSessionRequest>,
    ) -> Result<Response<pb::CreateSessionResponse>, Status> {
        let caller = caller(&req)?;
        let session = self.new_session(&caller).await?;
        Ok(Response::new(pb::CreateSessionResponse {
            session_id: session.id.clone(),
        }))
    }

    async fn resume_session(
        &self,
        req: Request<pb::ResumeSessionRequest>,
    ) -> Result<Response<pb::ResumeSessionResponse>, Status> {
        let caller = caller(&req)?;
        let session = self.session(&caller, &req.get_ref().session_id)?;
        Ok(Response::new(pb::ResumeSessionResponse {
            session_id: session.id.clone(),
        }))
    }

    async fn close_session(
        &self,
        req: Request<pb::CloseSessionRequest>,
    ) -> Result<Response<pb::CloseSessionResponse>, Status> {
        let caller = caller(&req)?;
        let session = self.session(&caller, &req.get_ref().session_id)?;
        self.gw.sessions.remove(&session);
        Ok(Response::new(pb::CloseSessionResponse {}))
    }
}

#[tonic::async_trait]
impl pb::process_service_server::ProcessService for GrpcApi {
    async fn start(
        &self,
        req: Request<pb::StartRequest>,
    ) -> Result<Response<pb::StartResponse>, Status> {
        let caller = caller(&req)?;
        let r = req.into_inner();
        let params = convert::spec_to_params(r.spec)?;
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
        let caller = caller(&req)?;
        let slot = self.stream_slot(&caller)?;
        let r = req.into_inner();
        let session = self.session(&caller, &r.session_id)?;
        let open = Open::Events(ProcessIdParams {
            process_id: r.process_id,
        });
        let Opened::Events(source) = self.open(&caller, Some(session.clone()), open).await? else {
            return Err(unexpected());
        };
        Ok(Response::new(follow(
            source,
            r.after_seq,
            session.stream_guard(),
            |event| pb::AttachResponse { event: Some(event) },
            None,
            slot,
        )))
    }

    async fn read(
        &self,
        req: Request<pb::ReadRequest>,
    ) -> Result<Response<pb::ReadResponse>, Status> {
        let caller = caller(&req)?;
        let r = req.into_inner();
        let call = Call::ProcessRead(ReadParams {
            process_id: r.process_id,
            after_seq: Some(r.after_seq),
            max_bytes: (r.max_bytes > 0)
                .then(|| usize::try_from(r.max_bytes).unwrap_or(usize::MAX)),
            wait_ms: Some(r.wait_ms),
        });
        match self.session_call(&caller, &r.session_id, call).await? {
            Reply::ProcessRead(rr) => Ok(Response::new(convert::read(rr))),
            _ => Err(unexpected()),
        }
    }

    async fn write(
        &self,
        req: Request<pb::WriteRequest>,
    ) -> Result<Response<pb::WriteResponse>, Status> {
        let caller = caller(&req)?;
        let r = req.into_inner();
        let call = Call::ProcessWrite(WriteParams {
            process_id: r.process_id,
            chunk: ByteChunk(r.data.to_vec()),
            write_id: r.write_id,
        });
        match self.session_call(&caller, &r.session_id, call).await? {
            Reply::ProcessWrite(w) => Ok(Response::new(pb::WriteResponse {
                status: convert::write_status(w.status),
            })),
            _ => Err(unexpected()),
        }
    }

    async fn stream_input(
        &self,
        req: Request<Streaming<pb::StreamInputRequest>>,
    ) -> Result<Response<pb::StreamInputResponse>, Status> {
        let caller = caller(&req)?;
        let mut input = req.into_inner();
        let Some(first) = input.next().await.transpose()? else {
            return Ok(Response::new(pb::StreamInputResponse { bytes_written: 0 }));
        };
        let session = self.session(&caller, &first.session_id)?;
        let process_id = first.process_id;
        let mut written = 0u64;
        let mut next = Some(first.data);
        while let Some(data) = next.take() {
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
        let caller = caller(&req)?;
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
        let caller = caller(&req)?;
        let r = req.into_inner();
        let call = Call::ProcessSignal(SignalParams {
            process_id: r.process_id,
            signal: convert::signal(r.signal)?,
        });
        self.session_call(&caller, &r.session_id, call).await?;
        Ok(Response::new(pb::SignalResponse {}))
    }

    async fn resize(
        &self,
        req: Request<pb::ResizeRequest>,
    ) -> Result<Response<pb::ResizeResponse>, Status> {
        let caller = caller(&req)?;
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
        let caller = caller(&req)?;
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
        let caller = caller(&req)?;
        let r = req.into_inner();
        match self
            .session_call(&caller, &r.session_id, Call::ProcessList(NoParams))
            .await?
        {
            Reply::ProcessList(l) => Ok(Response::new(convert::list(l))),
            _ => Err(unexpected()),
        }
    }

    type ExecStream = EventStream<pb::ExecResponse>;

    async fn exec(
        &self,
        req: Request<pb::ExecRequest>,
    ) -> Result<Response<Self::ExecStream>, Status> {
        let caller = caller(&req)?;
        let slot = self.stream_slot(&caller)?;
        let r = req.into_inner();
        let params = convert::spec_to_params(r.spec)?;
        // No session given: one just for this call, removed when it ends.
        let (session, ephemeral) = if r.session_id.is_empty() {
            (self.new_session(&caller).await?, true)
        } else {
            (self.session(&caller, &r.session_id)?, false)
        };
        let cleanup = {
            let (sessions, session) = (self.gw.sessions.clone(), session.clone());
            move || sessions.remove(&session)
        };
        let source = match self
            .open(&caller, Some(session.clone()), Open::Exec(Box::new(params)))
            .await
        {
            Ok(Opened::Events(source)) => source,
            Ok(Opened::File(_)) => return Err(unexpected()),
            Err(e) => {
                if ephemeral {
                    cleanup();
                }
                return Err(e);
            }
        };
        let on_end: Option<Box<dyn FnOnce() + Send>> = if ephemeral {
            Some(Box::new(cleanup))
        } else {
            None
        };
        Ok(Response::new(follow(
            source,
            0,
            session.stream_guard(),
            |event| pb::ExecResponse { event: Some(event) },
            on_end,
            slot,
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
        let caller = caller(&req)?;
        let slot = self.stream_slot(&caller)?;
        let r = req.into_inner();
        let open = Open::ReadFile(PathParams::plain(r.path));
        let Opened::File(file) = self.open(&caller, None, open).await? else {
            return Err(unexpected());
        };
        let (tx, rx) = mpsc::channel::<Result<(pb::ReadFileResponse, Reservation), Status>>(4);
        let budget = caller.tenant().outbound.clone();
        let stalled = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let ended = stalled.clone();
        let stall = slot.stall;
        let rt = tokio::runtime::Handle::current();
        // Blocking reads on the blocking pool. Each chunk's bytes are
        // reserved in the tenant's outbound budget before it is read, until
        // tonic takes it; a client that stops reading for the slow-client
        // timeout ends the stream (and frees the file and its thread).
        tokio::task::spawn_blocking(move || {
            use std::io::{Read as _, Seek as _};
            let send = |item| match rt.block_on(tokio::time::timeout(stall, tx.send(item))) {
                Ok(r) => r.is_ok(),
                Err(_) => {
                    stalled.store(true, std::sync::atomic::Ordering::Release);
                    false
                }
            };
            let mut f = &file;
            if r.offset > 0
                && let Err(e) = f.seek(std::io::SeekFrom::Start(r.offset))
            {
                send(Err(status(FsError::from_io(&e).into())));
                return;
            }
            let mut left = if r.length == 0 { u64::MAX } else { r.length };
            while left > 0 {
                let want =
                    usize::try_from(left).map_or(FILE_CHUNK_BYTES, |l| l.min(FILE_CHUNK_BYTES));
                let Ok(held) = rt.block_on(tokio::time::timeout(stall, budget.reserve(want)))
                else {
                    stalled.store(true, std::sync::atomic::Ordering::Release);
                    break;
                };
                let mut buf = vec![0u8; want];
                match f.read(&mut buf) {
                    Ok(0) => break,
                    Ok(n) => {
                        buf.truncate(n);
                        left = left.saturating_sub(n as u64);
                        if !send(Ok((pb::ReadFileResponse { data: buf.into() }, held))) {
                            break;
                        }
                    }
                    Err(e) => {
                        send(Err(status(FsError::from_io(&e).into())));
                        break;
                    }
                }
            }
        });
        // The reservation is released as tonic takes the chunk (h2 then
        // holds at most its per-stream send buffer).
        let (data_tx, data_rx) = mpsc::channel(1);
        crate::task::start("grpc-read-file", async move {
            let mut rx = rx;
            while let Some(item) = rx.recv().await {
                let item = item.map(|(chunk, held)| {
                    drop(held);
                    chunk
                });
                if data_tx.send(item).await.is_err() {
                    break;
                }
            }
        });
        Ok(Response::new(finish(
            data_rx,
            ended,
            slot.permit,
            slot.expires_at,
        )))
    }

    async fn write_file(
        &self,
        req: Request<Streaming<pb::WriteFileRequest>>,
    ) -> Result<Response<pb::WriteFileResponse>, Status> {
        let caller = caller(&req)?;
        let mut input = req.into_inner();
        let Some(first) = input.next().await.transpose()? else {
            return Err(Status::invalid_argument(
                "the first message must name the path",
            ));
        };
        let open = Open::WriteFile(PathParams::plain(first.path));
        let Opened::File(file) = self.open(&caller, None, open).await? else {
            return Err(unexpected());
        };
        let file = Arc::new(file);
        let mut written = 0u64;
        let mut next = Some(first.data);
        while let Some(data) = next.take() {
            written += data.len() as u64;
            let f = file.clone();
            tokio::task::spawn_blocking(move || crate::fs::write_whole(&f, &data))
                .await
                .map_err(|e| Status::internal(e.to_string()))?
                .map_err(|e| status(e.into()))?;
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
        let caller = caller(&req)?;
        let r = req.into_inner();
        let call = Call::FsCreateDirectory(CreateDirectoryParams {
            path: WirePath::plain(r.path),
            recursive: r.recursive,
            follow_symlinks: None,
        });
        self.call(&caller, None, call).await?;
        Ok(Response::new(pb::CreateDirectoryResponse {}))
    }

    async fn get_metadata(
        &self,
        req: Request<pb::GetMetadataRequest>,
    ) -> Result<Response<pb::GetMetadataResponse>, Status> {
        let caller = caller(&req)?;
        let call = Call::FsGetMetadata(PathParams::plain(req.into_inner().path));
        match self.call(&caller, None, call).await? {
            Reply::FsGetMetadata(m) => Ok(Response::new(convert::metadata(m))),
            _ => Err(unexpected()),
        }
    }

    async fn read_directory(
        &self,
        req: Request<pb::ReadDirectoryRequest>,
    ) -> Result<Response<pb::ReadDirectoryResponse>, Status> {
        let caller = caller(&req)?;
        let call = Call::FsReadDirectory(PathParams::plain(req.into_inner().path));
        match self.call(&caller, None, call).await? {
            Reply::FsReadDirectory(d) => Ok(Response::new(convert::directory(d))),
            _ => Err(unexpected()),
        }
    }

    async fn remove(
        &self,
        req: Request<pb::RemoveRequest>,
    ) -> Result<Response<pb::RemoveResponse>, Status> {
        let caller = caller(&req)?;
        let r = req.into_inner();
        let call = Call::FsRemove(RemoveParams {
            path: WirePath::plain(r.path),
            recursive: r.recursive,
            force: r.force,
            follow_symlinks: None,
        });
        self.call(&caller, None, call).await?;
        Ok(Response::new(pb::RemoveResponse {}))
    }

    async fn copy(
        &self,
        req: Request<pb::CopyRequest>,
    ) -> Result<Response<pb::CopyResponse>, Status> {
        let caller = caller(&req)?;
        let r = req.into_inner();
        let call = Call::FsCopy(CopyParams {
            source_path: WirePath::plain(r.source_path),
            destination_path: WirePath::plain(r.destination_path),
            recursive: r.recursive,
        });
        self.call(&caller, None, call).await?;
        Ok(Response::new(pb::CopyResponse {}))
    }

    async fn canonicalize(
        &self,
        req: Request<pb::CanonicalizeRequest>,
    ) -> Result<Response<pb::CanonicalizeResponse>, Status> {
        let caller = caller(&req)?;
        let call = Call::FsCanonicalize(PathParams::plain(req.into_inner().path));
        match self.call(&caller, None, call).await? {
            Reply::FsCanonicalize(c) => {
                Ok(Response::new(pb::CanonicalizeResponse { path: c.path }))
            }
            _ => Err(unexpected()),
        }
    }

    async fn walk(
        &self,
        req: Request<pb::WalkRequest>,
    ) -> Result<Response<pb::WalkResponse>, Status> {
        let caller = caller(&req)?;
        let call = Call::FsWalk(convert::walk_request(req.into_inner()));
        match self.call(&caller, None, call).await? {
            Reply::FsWalk(w) => Ok(Response::new(convert::walk(w))),
            _ => Err(unexpected()),
        }
    }
}

#[tonic::async_trait]
impl pb::environment_service_server::EnvironmentService for GrpcApi {
    async fn get_info(
        &self,
        req: Request<pb::GetInfoRequest>,
    ) -> Result<Response<pb::GetInfoResponse>, Status> {
        let caller = caller(&req)?;
        match self
            .call(&caller, None, Call::EnvironmentInfo(NoParams))
            .await?
        {
            Reply::EnvironmentInfo(e) => Ok(Response::new(convert::environment(*e))),
            _ => Err(unexpected()),
        }
    }
}
