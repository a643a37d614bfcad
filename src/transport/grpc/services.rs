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
use crate::gateway::Gateway;
use crate::protocol::ByteChunk;
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

pub(super) type EventStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

/// The four services; cheap to clone.
#[derive(Clone)]
pub struct GrpcApi {
    pub(super) gw: Arc<Gateway>,
}

pub(super) fn status(e: GatewayError) -> Status {
    e.to_grpc()
}

pub(super) fn unexpected() -> Status {
    Status::internal("unexpected reply")
}

/// The caller the authentication layer admitted.
pub(super) fn caller<T>(req: &Request<T>) -> Result<Caller, Status> {
    req.extensions()
        .get::<Caller>()
        .cloned()
        .ok_or_else(|| Status::internal("the call was not authenticated"))
}

/// Where a gRPC call runs: in a session; without one, in a session's
/// place (its image: file calls naming a local session); or in the
/// tenant's.
pub(super) enum FilePlace {
    Session(Arc<Session>),
    PlaceOf(Arc<Session>),
    Tenant,
}

impl From<Option<Arc<Session>>> for FilePlace {
    fn from(s: Option<Arc<Session>>) -> FilePlace {
        s.map_or(FilePlace::Tenant, FilePlace::Session)
    }
}

impl FilePlace {
    /// The session a stream keeps alive (its detach TTL does not run out
    /// under the stream): the one it runs in or whose place it uses.
    pub(super) fn session(&self) -> Option<&Arc<Session>> {
        match self {
            FilePlace::Session(s) | FilePlace::PlaceOf(s) => Some(s),
            FilePlace::Tenant => None,
        }
    }
}

impl GrpcApi {
    pub fn new(gw: Arc<Gateway>) -> Self {
        Self { gw }
    }

    pub(super) fn session(&self, caller: &Caller, id: &str) -> Result<Arc<Session>, Status> {
        self.gw.check_local_owner(id).map_err(status)?;
        let session = self
            .gw
            .sessions
            .lookup(caller.tenant(), id)
            .map_err(status)?;
        session
            .check_image_claim(caller.principal().image.as_deref())
            .map_err(status)?;
        Ok(session)
    }

    /// Where a file or environment call runs: on the executor of the
    /// session named (`id`), if it runs on one; without a session, a
    /// tenant placed on executors gets a session for this call, removed
    /// when the returned guard is dropped; otherwise sessionless (the gRPC
    /// API's answers, whatever revision a named session speaks), in the
    /// named session's place (its image) or the tenant's own.
    pub(super) async fn file_session(
        &self,
        caller: &Caller,
        id: &str,
    ) -> Result<(FilePlace, Option<Ephemeral>), Status> {
        if !id.is_empty() {
            let session = self.session(caller, id)?;
            return Ok(if session.backend.is_remote() {
                (FilePlace::Session(session), None)
            } else {
                (FilePlace::PlaceOf(session), None)
            });
        }
        if !caller.tenant().places_on_executors() {
            // A token whose `image` claim names another image than the
            // tenant's own runs its calls there, in a session opened for
            // the call (as an `Exec` without a session does).
            let tenant = caller.tenant();
            let elsewhere = caller.principal().image.as_deref().is_some_and(|c| {
                tenant.image.is_none()
                    || crate::config::ImageSource::parse(c).ok().as_ref()
                        != tenant.settings.image.as_ref()
            });
            if !elsewhere {
                return Ok((FilePlace::Tenant, None));
            }
            let session = self.new_session(caller, None, None).await?;
            return Ok((
                FilePlace::PlaceOf(session.clone()),
                Some(self.ephemeral(session)),
            ));
        }
        let session = self.new_session(caller, None, None).await?;
        Ok((
            FilePlace::Session(session.clone()),
            Some(self.ephemeral(session)),
        ))
    }

    fn ephemeral(&self, session: Arc<Session>) -> Ephemeral {
        Ephemeral {
            sessions: self.gw.sessions.clone(),
            session,
        }
    }

    pub(super) fn inbound_message_timeout(&self) -> std::time::Duration {
        self.gw.settings.inbound_message_timeout
    }

    /// A new session with no connection (running `image`, if asked and
    /// allowed); refused while draining.
    pub(super) async fn new_session(
        &self,
        caller: &Caller,
        image: Option<&str>,
        snapshot: Option<&str>,
    ) -> Result<Arc<Session>, Status> {
        if self.gw.is_draining() {
            return Err(status(crate::error::GatewayError::Draining));
        }
        let image = crate::transport::connection::session_place(&self.gw, caller, image, snapshot)
            .await
            .map_err(status)?;
        self.gw
            .sessions
            .create_detached(
                caller.tenant(),
                caller.principal().subject.as_deref(),
                image,
            )
            .await
            .map_err(status)
    }

    /// Run an operation through the stack.
    async fn run(
        &self,
        caller: &Caller,
        session: impl Into<FilePlace>,
        op: Op,
    ) -> Result<Outcome, Status> {
        let mut ctx = caller.context(None, CancellationToken::new());
        match session.into() {
            FilePlace::Session(s) => ctx.session = Some(s),
            FilePlace::PlaceOf(s) => ctx.place = Some(s),
            FilePlace::Tenant => {}
        }
        let req = RpcRequest { op, ctx };
        self.gw.stack.clone().oneshot(req).await.map_err(status)
    }

    pub(super) async fn call(
        &self,
        caller: &Caller,
        session: impl Into<FilePlace>,
        call: Call,
    ) -> Result<Reply, Status> {
        match self.run(caller, session, Op::Call(call)).await? {
            Outcome::Reply(r) => Ok(r),
            Outcome::Opened(_) | Outcome::Sent => Err(unexpected()),
        }
    }

    pub(super) async fn open(
        &self,
        caller: &Caller,
        session: impl Into<FilePlace>,
        open: Open,
    ) -> Result<Opened, Status> {
        match self.run(caller, session, Op::Open(open)).await? {
            Outcome::Opened(o) => Ok(o),
            Outcome::Reply(_) | Outcome::Sent => Err(unexpected()),
        }
    }

    /// A place among the caller's tenant's open streams.
    pub(super) fn stream_slot(&self, caller: &Caller) -> Result<StreamSlot, Status> {
        let tenant = caller.tenant();
        match tenant.streams.clone().try_acquire_owned() {
            Ok(permit) => Ok(StreamSlot {
                expires_at: caller.principal().expires_at,
                key: caller.principal().key.clone(),
                permit,
                stall: self.gw.settings.slow_client_timeout,
            }),
            // A quota like the others: its name and limit in the error data.
            Err(_) => Err(GatewayError::QuotaExceeded {
                quota: "streams",
                limit: tenant.settings.max_streams as u64,
                retry_after_ms: None,
            }
            .to_grpc()),
        }
    }

    /// `StreamInput`'s chunks, each a `process/write`.
    async fn stream_input_from(
        &self,
        caller: &Caller,
        mut input: Streaming<pb::StreamInputRequest>,
    ) -> Result<Response<pb::StreamInputResponse>, Status> {
        let Some(first) = input.next().await.transpose()? else {
            return Ok(Response::new(pb::StreamInputResponse { bytes_written: 0 }));
        };
        let session = self.session(caller, &first.session_id)?;
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
            match self.call(caller, Some(session.clone()), call).await? {
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

    pub(super) async fn session_call(
        &self,
        caller: &Caller,
        session_id: &str,
        call: Call,
    ) -> Result<Reply, Status> {
        let session = self.session(caller, session_id)?;
        self.call(caller, Some(session), call).await
    }
}

/// A session opened for one call: removed (its processes ended) when
/// dropped, however the call ends (a client that goes away mid-call
/// included).
pub(super) struct Ephemeral {
    sessions: Arc<crate::session::SessionRegistry>,
    session: Arc<Session>,
}

impl Drop for Ephemeral {
    fn drop(&mut self) {
        self.sessions.remove(&self.session);
    }
}

/// Stream a process's events from `after_seq` until `closed` (or the client
/// goes away): the retained replay, then live events with back-pressure.
/// `guard` keeps the session alive; `keep` is dropped at the end.
fn follow<T, F>(
    source: Arc<dyn EventSource>,
    after_seq: u64,
    guard: StreamGuard,
    wrap: F,
    keep: Option<Ephemeral>,
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
                // The source failed (a remote process or link gone), or
                // dropped us (too slow) before `closed`.
                let err = source.failure().map_or_else(
                    || {
                        Status::aborted(format!(
                            "reader too slow; attach again with after_seq = {cursor}"
                        ))
                    },
                    status,
                );
                let _ = send(Err(err)).await;
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
        drop(keep);
    });
    finish(rx, ended, slot)
}

/// An open server stream's place in its tenant's `max_streams`, how long
/// it may wait for its client, and how long its caller's token holds.
pub struct StreamSlot {
    pub(super) permit: tokio::sync::OwnedSemaphorePermit,
    pub(super) stall: std::time::Duration,
    /// When the caller's token expires: the stream ends then.
    pub(super) expires_at: Option<std::time::SystemTime>,
    /// The configured key that verified the caller's token: the stream
    /// ends when a reload removes it.
    pub(super) key: crate::auth::KeyLife,
}

impl StreamSlot {
    /// Resolves when the caller's token stops holding: see [`token_ends`].
    pub(super) fn token_ends(&self) -> impl Future<Output = &'static str> + use<> {
        token_ends(self.expires_at, self.key.clone())
    }
}

/// Resolves when a caller's token stops holding, with why: it expires
/// (`expires_at`), or a reload removes the key that verified it (as each
/// later call would then refuse it).
async fn token_ends(
    expires_at: Option<std::time::SystemTime>,
    key: crate::auth::KeyLife,
) -> &'static str {
    let expiry = async move {
        match expires_at {
            Some(at) => {
                let left = at
                    .duration_since(std::time::SystemTime::now())
                    .unwrap_or_default();
                tokio::time::sleep(left).await;
            }
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        () = expiry => "token expired; call again with a fresh token",
        () = key.removed() => "the token's key was removed by a configuration reload; call again with a token of a configured key",
    }
}

/// A client-streaming call's `work`, ended with UNAUTHENTICATED when the
/// caller's token stops holding (as a server stream is, by [`finish`]).
pub(super) async fn while_token_holds<T>(
    caller: &Caller,
    work: impl Future<Output = Result<T, Status>>,
) -> Result<T, Status> {
    let p = caller.principal();
    tokio::select! {
        r = work => r,
        why = token_ends(p.expires_at, p.key.clone()) => Err(Status::unauthenticated(why)),
    }
}

/// The receiving end of a server stream: it ends with DEADLINE_EXCEEDED if
/// the producer gave up on a client that stopped reading (never a silent
/// end that looks complete), and with UNAUTHENTICATED when the caller's
/// token stops holding (it expires, or a reload removes its key: see
/// [`StreamSlot::token_ends`]); the slot is held until the stream is
/// dropped.
pub(super) fn finish<T: Send + 'static>(
    rx: mpsc::Receiver<Result<T, Status>>,
    stalled: Arc<std::sync::atomic::AtomicBool>,
    slot: StreamSlot,
) -> EventStream<T> {
    let ended_by = Arc::new(std::sync::OnceLock::<&'static str>::new());
    let token_ends = {
        let (ended_by, ends) = (ended_by.clone(), slot.token_ends());
        async move {
            let _ = ended_by.set(ends.await);
        }
    };
    let permit = slot.permit;
    let tail = futures_util::stream::once(async move {
        let _permit = permit;
        if let Some(why) = ended_by.get() {
            return Some(Err(Status::unauthenticated(*why)));
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
            .take_until(Box::pin(token_ends))
            .chain(tail),
    )
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
        let input = req.into_inner();
        while_token_holds(&caller, self.stream_input_from(&caller, input)).await
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
        // No session given: one just for this call, removed when it ends
        // (or as soon as the call fails or its client goes away).
        let (session, ephemeral) = if r.session_id.is_empty() {
            let session = self.new_session(&caller, None, None).await?;
            (session.clone(), Some(self.ephemeral(session)))
        } else {
            (self.session(&caller, &r.session_id)?, None)
        };
        let open = Open::Exec(Box::new(params));
        let Opened::Events(source) = self.open(&caller, Some(session.clone()), open).await? else {
            return Err(unexpected());
        };
        Ok(Response::new(follow(
            source,
            0,
            session.stream_guard(),
            |event| pb::ExecResponse { event: Some(event) },
            ephemeral,
            slot,
        )))
    }
}
