//! `FileService` and `EnvironmentService`: where the call runs is the
//! named session's place, or the tenant's (see [`GrpcApi::file_session`]);
//! a file is streamed from the tenant's own root ([`Opened::File`], read on
//! the blocking pool) or from an executor in blocks ([`Opened::Blocks`]).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use futures_util::StreamExt as _;
use tokio::sync::mpsc;
use tonic::{Request, Response, Status, Streaming};

use super::convert;
use super::pb;
use super::services::{
    EventStream, FILE_CHUNK_BYTES, GrpcApi, StreamSlot, caller, finish, status, unexpected,
    while_token_holds,
};
use crate::fs::FsError;
use crate::outbound::Reservation;
use crate::protocol::fs::{CopyParams, CreateDirectoryParams, PathParams, RemoveParams};
use crate::protocol::path::WirePath;
use crate::rpc::{BlockFile, Call, NoParams, Open, Opened, Reply};
use crate::session::StreamGuard;
use crate::transport::authenticate::Caller;

/// A chunk on its way to the client, with its place in the outbound budget.
type Chunk = Result<(pb::ReadFileResponse, Reservation), Status>;

impl GrpcApi {
    /// A unary file call, where [`GrpcApi::file_session`] says.
    async fn file_call(
        &self,
        caller: &Caller,
        session_id: &str,
        call: Call,
    ) -> Result<Reply, Status> {
        let (session, _ephemeral) = self.file_session(caller, session_id).await?;
        self.call(caller, session, call).await
    }

    /// `WriteFile`'s messages, written where [`GrpcApi::file_session`] says.
    async fn write_file_from(
        &self,
        caller: &Caller,
        mut input: Streaming<pb::WriteFileRequest>,
    ) -> Result<Response<pb::WriteFileResponse>, Status> {
        let Some(first) = input.next().await.transpose()? else {
            return Err(Status::invalid_argument(
                "the first message must name the path",
            ));
        };
        let (session, _ephemeral) = self.file_session(caller, &first.session_id).await?;
        let _guard = session.session().map(|s| s.stream_guard());
        let open = Open::WriteFile(PathParams::plain(first.path));
        let opened = self.open(caller, session, open).await?;
        let mut written = 0u64;
        let mut next = Some(first.data);
        match opened {
            Opened::File(file) => {
                let file = Arc::new(file);
                while let Some(data) = next.take() {
                    written += data.len() as u64;
                    let f = file.clone();
                    tokio::task::spawn_blocking(move || crate::fs::write_whole(&f, &data))
                        .await
                        .map_err(|e| Status::internal(e.to_string()))?
                        .map_err(|e| status(e.into()))?;
                    next = input.next().await.transpose()?.map(|m| m.data);
                }
            }
            Opened::Blocks(file) => {
                let inbound = caller.tenant().inbound.clone();
                while let Some(data) = next.take() {
                    // Held (an executor without block calls gets the file
                    // whole at the end) against the tenant's inbound budget.
                    let held = inbound.try_reserve(data.len()).ok_or_else(|| {
                        Status::resource_exhausted(
                            "this tenant's inbound memory budget is full (max_inbound_bytes)",
                        )
                    })?;
                    let len = data.len() as u64;
                    file.write(written, data.to_vec(), held)
                        .await
                        .map_err(status)?;
                    written += len;
                    // What is held waits for the next message at most the
                    // inbound message timeout.
                    let wait = self.inbound_message_timeout();
                    next = tokio::time::timeout(wait, input.next())
                        .await
                        .map_err(|_| {
                            Status::deadline_exceeded(
                                "the next WriteFile message did not come in time (server.inbound_message_timeout)",
                            )
                        })?
                        .transpose()?
                        .map(|m| m.data);
                }
                file.finish().await.map_err(status)?;
            }
            Opened::Events(_) => return Err(unexpected()),
        }
        Ok(Response::new(pb::WriteFileResponse {
            bytes_written: written,
        }))
    }
}

/// The stream of `ReadFile` chunks from `rx`: each chunk's reservation is
/// released as tonic takes it (h2 then holds at most its per-stream send
/// buffer).
fn chunks(
    rx: mpsc::Receiver<Chunk>,
    stalled: Arc<AtomicBool>,
    slot: StreamSlot,
) -> EventStream<pb::ReadFileResponse> {
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
    finish(data_rx, stalled, slot)
}

/// Read `file` of the tenant's root on the blocking pool. Each chunk's
/// bytes are reserved in the tenant's outbound budget before it is read;
/// a client that stops reading for the slow-client timeout ends the stream
/// (and frees the file and its thread).
fn read_local(
    file: std::fs::File,
    r: &pb::ReadFileRequest,
    budget: Arc<crate::outbound::ByteBudget>,
    tx: mpsc::Sender<Chunk>,
    stalled: Arc<AtomicBool>,
    stall: std::time::Duration,
) {
    let (offset, length) = (r.offset, r.length);
    let rt = tokio::runtime::Handle::current();
    tokio::task::spawn_blocking(move || {
        use std::io::{Read as _, Seek as _};
        let send = |item| match rt.block_on(tokio::time::timeout(stall, tx.send(item))) {
            Ok(r) => r.is_ok(),
            Err(_) => {
                stalled.store(true, Ordering::Release);
                false
            }
        };
        let mut f = &file;
        if offset > 0
            && let Err(e) = f.seek(std::io::SeekFrom::Start(offset))
        {
            send(Err(status(FsError::from_io(&e).into())));
            return;
        }
        let mut left = if length == 0 { u64::MAX } else { length };
        while left > 0 {
            let want = usize::try_from(left).map_or(FILE_CHUNK_BYTES, |l| l.min(FILE_CHUNK_BYTES));
            let Ok(held) = rt.block_on(tokio::time::timeout(stall, budget.reserve(want))) else {
                stalled.store(true, Ordering::Release);
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
}

/// What keeps an executor's session alive while one of its files is
/// streamed: the session (its detach TTL does not run out under a stream)
/// and, for a session opened for this call, its removal at the end.
type Keep = (Option<StreamGuard>, Option<super::services::Ephemeral>);

/// Read `file` from an executor in blocks, with the same budget and
/// slow-client rules; `keep` lives until the end.
#[allow(clippy::too_many_arguments)]
fn read_remote(
    file: Box<dyn BlockFile>,
    r: &pb::ReadFileRequest,
    budget: Arc<crate::outbound::ByteBudget>,
    tx: mpsc::Sender<Chunk>,
    stalled: Arc<AtomicBool>,
    stall: std::time::Duration,
    keep: Keep,
) {
    let (mut offset, length) = (r.offset, r.length);
    crate::task::start("grpc-read-remote-file", async move {
        let _keep = keep;
        let mut left = if length == 0 { u64::MAX } else { length };
        while left > 0 {
            let want = usize::try_from(left).map_or(FILE_CHUNK_BYTES, |l| l.min(FILE_CHUNK_BYTES));
            let held = tokio::select! {
                r = tokio::time::timeout(stall, budget.reserve(want)) => r,
                () = tx.closed() => break,
            };
            let Ok(held) = held else {
                stalled.store(true, Ordering::Release);
                break;
            };
            let block = tokio::select! {
                b = file.read(offset, want) => b,
                () = tx.closed() => break,
            };
            let item = match block {
                Ok((data, eof)) => {
                    let n = data.len() as u64;
                    (offset, left) = (offset + n, left.saturating_sub(n));
                    if n == 0 {
                        break;
                    }
                    if eof {
                        left = 0;
                    }
                    Ok((pb::ReadFileResponse { data: data.into() }, held))
                }
                Err(e) => {
                    left = 0;
                    Err(status(e))
                }
            };
            match tokio::time::timeout(stall, tx.send(item)).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) => break,
                Err(_) => {
                    stalled.store(true, Ordering::Release);
                    break;
                }
            }
        }
        let _ = file.finish().await;
    });
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
        let (session, ephemeral) = self.file_session(&caller, &r.session_id).await?;
        let guard = session.session().map(|s| s.stream_guard());
        let open = Open::ReadFile(PathParams::plain(r.path.clone()));
        let opened = self.open(&caller, session, open).await?;
        let (tx, rx) = mpsc::channel::<Chunk>(4);
        let budget = caller.tenant().outbound.clone();
        let stalled = Arc::new(AtomicBool::new(false));
        let stall = slot.stall;
        match opened {
            Opened::File(file) => read_local(file, &r, budget, tx, stalled.clone(), stall),
            Opened::Blocks(file) => {
                let keep = (guard, ephemeral);
                read_remote(file, &r, budget, tx, stalled.clone(), stall, keep);
            }
            Opened::Events(_) => return Err(unexpected()),
        }
        Ok(Response::new(chunks(rx, stalled, slot)))
    }

    async fn write_file(
        &self,
        req: Request<Streaming<pb::WriteFileRequest>>,
    ) -> Result<Response<pb::WriteFileResponse>, Status> {
        let caller = caller(&req)?;
        // An open file, here or on an executor: one of the tenant's streams.
        let _slot = self.stream_slot(&caller)?;
        let input = req.into_inner();
        while_token_holds(&caller, self.write_file_from(&caller, input)).await
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
        self.file_call(&caller, &r.session_id, call).await?;
        Ok(Response::new(pb::CreateDirectoryResponse {}))
    }

    async fn get_metadata(
        &self,
        req: Request<pb::GetMetadataRequest>,
    ) -> Result<Response<pb::GetMetadataResponse>, Status> {
        let caller = caller(&req)?;
        let r = req.into_inner();
        let call = Call::FsGetMetadata(PathParams::plain(r.path));
        match self.file_call(&caller, &r.session_id, call).await? {
            Reply::FsGetMetadata(m) => Ok(Response::new(convert::metadata(m))),
            _ => Err(unexpected()),
        }
    }

    async fn read_directory(
        &self,
        req: Request<pb::ReadDirectoryRequest>,
    ) -> Result<Response<pb::ReadDirectoryResponse>, Status> {
        let caller = caller(&req)?;
        let r = req.into_inner();
        let call = Call::FsReadDirectory(PathParams::plain(r.path));
        match self.file_call(&caller, &r.session_id, call).await? {
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
        self.file_call(&caller, &r.session_id, call).await?;
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
        self.file_call(&caller, &r.session_id, call).await?;
        Ok(Response::new(pb::CopyResponse {}))
    }

    async fn canonicalize(
        &self,
        req: Request<pb::CanonicalizeRequest>,
    ) -> Result<Response<pb::CanonicalizeResponse>, Status> {
        let caller = caller(&req)?;
        let r = req.into_inner();
        let call = Call::FsCanonicalize(PathParams::plain(r.path));
        match self.file_call(&caller, &r.session_id, call).await? {
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
        let r = req.into_inner();
        let session_id = r.session_id.clone();
        let call = Call::FsWalk(convert::walk_request(r));
        match self.file_call(&caller, &session_id, call).await? {
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
        let call = Call::EnvironmentInfo(NoParams);
        match self
            .file_call(&caller, &req.get_ref().session_id, call)
            .await?
        {
            Reply::EnvironmentInfo(e) => Ok(Response::new(convert::environment(*e))),
            _ => Err(unexpected()),
        }
    }
}
