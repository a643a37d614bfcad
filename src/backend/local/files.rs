//! Whole-file methods (`fs/readFile`, `fs/writeFile`, `fs/createDirectory`,
//! `fs/getMetadata`, `fs/readDirectory`, `fs/remove`, `fs/copy`,
//! `fs/canonicalize`, `fs/walk`) and the gRPC file streams. The same
//! handlers serve sessions and the gRPC calls that have none.

use super::{Shared, blocking, empty, unexpected};
use crate::error::GatewayError;
use crate::fs::{FsDone, FsError, FsOp};
use crate::outbound::Responder;
use crate::protocol::fs::{
    CanonicalizeResponse, CopyParams, CreateDirectoryParams, PathParams, ReadFileResponse,
    RemoveParams, WalkParams, WalkResponse, WriteFileParams,
};
use crate::protocol::revision::Policy;
use crate::protocol::{ByteChunk, base64_decode, jsonrpc};
use crate::rpc::{Call, Open, Opened, Outcome, Reply};

/// Answer a whole-file call; any other call needs a session (only gRPC's
/// session-less calls come here with one).
pub(super) async fn route(
    shared: &Shared,
    call: Call,
    policy: &'static Policy,
    reply: Option<Responder>,
) -> Result<Outcome, GatewayError> {
    let reply_of = |r: Result<Reply, GatewayError>| r.map(Outcome::Reply);
    match call {
        Call::FsReadFile(p) => read_file(shared, p, policy, reply).await,
        Call::FsWriteFile(p) => reply_of(write_file(shared, p, policy).await),
        Call::FsCreateDirectory(p) => reply_of(create_directory(shared, p, policy).await),
        Call::FsGetMetadata(p) => reply_of(get_metadata(shared, p, policy).await),
        Call::FsReadDirectory(p) => reply_of(read_directory(shared, p, policy).await),
        Call::FsRemove(p) => reply_of(remove(shared, p, policy).await),
        Call::FsCopy(p) => reply_of(copy(shared, p, policy).await),
        Call::FsCanonicalize(p) => reply_of(canonicalize(shared, p, policy).await),
        Call::FsWalk(p) => reply_of(walk(shared, p, policy).await),
        _ => Err(super::needs_session()),
    }
}

/// Run `op` where the tenant's file operations run, errors as `policy` words them.
async fn done(shared: &Shared, op: FsOp, policy: &Policy) -> Result<FsDone, GatewayError> {
    shared
        .fs(op)
        .await
        .map_err(|e| e.into_gateway_error(policy))
}

/// `fs/readFile`: over the limit is -32602 naming it. On a JSON-RPC
/// connection the reply's bytes are reserved in the caller's outbound
/// budgets (waiting for room) before the file is read, and it is encoded
/// as it is read, straight into the response frame, and sent from here.
async fn read_file(
    shared: &Shared,
    p: PathParams,
    policy: &Policy,
    reply: Option<Responder>,
) -> Result<Outcome, GatewayError> {
    let err = |e: FsError| e.into_gateway_error(policy);
    let file = shared.fs_file(FsOp::OpenRead(p)).await.map_err(err)?;
    let len = file
        .metadata()
        .map_err(|e| err(FsError::from_io(&e)))?
        .len();
    let limit = shared.max_read_file_bytes;
    if len > limit {
        return Err(GatewayError::InvalidParams(format!(
            "file is {len} bytes, over this gateway's fs/readFile limit of {limit} bytes (max_read_file_bytes); read it in blocks with fs/open and fs/readBlock, or stream it with gRPC FileService/ReadFile"
        )));
    }
    let Some(reply) = reply else {
        let data = blocking(move || crate::fs::read_whole(file, limit))
            .await
            .map_err(err)?;
        return Ok(Outcome::Reply(Reply::FsReadFile(ReadFileResponse {
            data_base64: ByteChunk(data),
        })));
    };
    let size = usize::try_from(crate::config::read_file_reply_bytes(len)).unwrap_or(usize::MAX);
    let held = reply
        .outbound()
        .reserve(size)
        .await
        .map_err(|_| crate::backend::closed_before_reply())?;
    let result = blocking(move || crate::fs::read_encoded(file, len))
        .await
        .map_err(err)?;
    reply
        .send_encoded(result, jsonrpc::ENVELOPE_GAP, held)
        .await;
    Ok(Outcome::Sent)
}

/// `fs/writeFile`: bad base64 is the reference's -32600.
async fn write_file(
    shared: &Shared,
    p: WriteFileParams,
    policy: &Policy,
) -> Result<Reply, GatewayError> {
    let err = |e: FsError| e.into_gateway_error(policy);
    let data = base64_decode(&p.data_base64).map_err(|e| {
        GatewayError::InvalidRequest(format!(
            "fs/writeFile requires valid base64 dataBase64: {e}"
        ))
    })?;
    let open = PathParams {
        path: p.path,
        follow_symlinks: p.follow_symlinks,
    };
    let file = shared.fs_file(FsOp::OpenWrite(open)).await.map_err(err)?;
    blocking(move || crate::fs::write_whole(&file, &data))
        .await
        .map_err(err)?;
    Ok(empty())
}

async fn create_directory(
    shared: &Shared,
    p: CreateDirectoryParams,
    policy: &Policy,
) -> Result<Reply, GatewayError> {
    done(shared, FsOp::CreateDirectory(p), policy).await?;
    Ok(empty())
}

async fn get_metadata(
    shared: &Shared,
    p: PathParams,
    policy: &Policy,
) -> Result<Reply, GatewayError> {
    match done(shared, FsOp::GetMetadata(p), policy).await? {
        FsDone::Metadata(mut m) => {
            if !policy.metadata_has_size {
                m.size = None;
            }
            Ok(Reply::FsGetMetadata(m))
        }
        other => Err(unexpected(&other).into()),
    }
}

async fn read_directory(
    shared: &Shared,
    p: PathParams,
    policy: &Policy,
) -> Result<Reply, GatewayError> {
    match done(shared, FsOp::ReadDirectory(p), policy).await? {
        FsDone::Directory(d) => Ok(Reply::FsReadDirectory(d)),
        other => Err(unexpected(&other).into()),
    }
}

async fn remove(shared: &Shared, p: RemoveParams, policy: &Policy) -> Result<Reply, GatewayError> {
    done(shared, FsOp::Remove(p), policy).await?;
    Ok(empty())
}

async fn copy(shared: &Shared, p: CopyParams, policy: &Policy) -> Result<Reply, GatewayError> {
    done(shared, FsOp::Copy(p), policy).await?;
    Ok(empty())
}

async fn canonicalize(
    shared: &Shared,
    p: PathParams,
    policy: &Policy,
) -> Result<Reply, GatewayError> {
    match done(shared, FsOp::Canonicalize(p), policy).await? {
        FsDone::Path(path) => Ok(Reply::FsCanonicalize(CanonicalizeResponse {
            path: policy.wire_path(&path),
        })),
        other => Err(unexpected(&other).into()),
    }
}

async fn walk(shared: &Shared, p: WalkParams, policy: &Policy) -> Result<Reply, GatewayError> {
    match done(shared, FsOp::Walk(p), policy).await? {
        FsDone::Walk(mut w) => {
            rewrite_walk(&mut w, policy);
            Ok(Reply::FsWalk(w))
        }
        other => Err(unexpected(&other).into()),
    }
}

/// A walk's host paths in the session's form.
fn rewrite_walk(w: &mut WalkResponse, policy: &Policy) {
    for e in &mut w.entries {
        e.path = policy.wire_path(&e.path);
    }
    for e in &mut w.errors {
        e.path = policy.wire_path(&e.path);
    }
}

/// gRPC `ReadFile`/`WriteFile`: a file opened, confined as `fs/readFile`
/// and `fs/writeFile`, for the door to stream.
pub(super) async fn open_stream(
    shared: &Shared,
    open: Open,
    policy: &Policy,
) -> Result<Outcome, GatewayError> {
    let op = match open {
        Open::ReadFile(p) => FsOp::OpenRead(p),
        Open::WriteFile(p) => FsOp::OpenWrite(p),
        Open::Events(_) | Open::Exec(_) => {
            return Err(GatewayError::Internal("not a file stream".to_owned()));
        }
    };
    let file = shared
        .fs_file(op)
        .await
        .map_err(|e| e.into_gateway_error(policy))?;
    Ok(Outcome::Opened(Opened::File(file)))
}
