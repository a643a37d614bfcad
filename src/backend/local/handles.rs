//! `fs/open`, `fs/readBlock`, `fs/writeBlock`, `fs/close`: file handles
//! that live as long as their session, bounded per session and per tenant.

use std::sync::Arc;

use super::{LocalSession, blocking, empty};
use crate::error::GatewayError;
use crate::fs::{FsError, FsOp};
use crate::protocol::ByteChunk;
use crate::protocol::fs::{
    HandleParams, OpenMode, OpenParams, PathParams, ReadBlockParams, ReadBlockResponse,
    WriteBlockParams,
};
use crate::protocol::revision::Policy;
use crate::rpc::Reply;

/// Open `fs/open` handles per session.
pub const MAX_FILE_HANDLES: usize = 64;
/// Largest `fs/readBlock` (the reference's limit).
pub const MAX_READ_BLOCK_BYTES: u64 = 1024 * 1024;

/// An `fs/open` handle.
pub(super) struct Handle {
    file: Arc<std::fs::File>,
    /// Its place in the tenant's `max_open_files`.
    _slot: tokio::sync::OwnedSemaphorePermit,
}

/// `fs/open`: `read` opens a regular file; `replace` creates or
/// truncates at once. Handles live as long as the session (bounded).
pub(super) async fn open(
    s: &LocalSession,
    p: OpenParams,
    policy: &Policy,
) -> Result<Reply, GatewayError> {
    crate::rpc::check_id_length("handleId", &p.handle_id)?;
    let exists =
        || GatewayError::InvalidRequest(format!("file handle `{}` already exists", p.handle_id));
    {
        let handles = s.handles.lock();
        if handles.contains_key(&p.handle_id) {
            return Err(exists());
        }
        if handles.len() >= MAX_FILE_HANDLES {
            return Err(GatewayError::InvalidRequest(format!(
                "too many open file handles (limit {MAX_FILE_HANDLES}); close some first"
            )));
        }
    }
    let slot = s
        .shared
        .open_files
        .clone()
        .try_acquire_owned()
        .map_err(|_| {
            GatewayError::InvalidRequest(
                "too many open file handles for this tenant (max_open_files); close some first"
                    .to_owned(),
            )
        })?;
    let path = PathParams {
        path: p.path.clone(),
        follow_symlinks: None,
    };
    let op = match p.mode {
        OpenMode::Read => FsOp::OpenRead(path),
        OpenMode::Replace => FsOp::OpenWrite(path),
    };
    let file = s
        .shared
        .fs_file(op)
        .await
        .map_err(|e| e.into_gateway_error(policy))?;
    let mut handles = s.handles.lock();
    if handles.contains_key(&p.handle_id) {
        return Err(exists());
    }
    handles.insert(
        p.handle_id.clone(),
        Handle {
            file: Arc::new(file),
            _slot: slot,
        },
    );
    Ok(Reply::FsOpen(HandleParams {
        handle_id: p.handle_id,
    }))
}

fn handle(s: &LocalSession, id: &str) -> Result<Arc<std::fs::File>, GatewayError> {
    s.handles
        .lock()
        .get(id)
        .map(|h| h.file.clone())
        .ok_or_else(|| GatewayError::NotFound(format!("unknown file handle `{id}`")))
}

pub(super) async fn read_block(
    s: &LocalSession,
    p: ReadBlockParams,
) -> Result<Reply, GatewayError> {
    if p.len == 0 || p.len > MAX_READ_BLOCK_BYTES {
        return Err(GatewayError::InvalidRequest(format!(
            "file read block length must be between 1 and {MAX_READ_BLOCK_BYTES}"
        )));
    }
    let file = handle(s, &p.handle_id)?;
    let (data, eof) = blocking(move || {
        use std::os::unix::fs::FileExt as _;
        let io = |e: std::io::Error| FsError::from_io(&e);
        let mut buf = vec![0u8; usize::try_from(p.len).unwrap_or(0)];
        let n = file.read_at(&mut buf, p.offset).map_err(io)?;
        buf.truncate(n);
        // As the reference: the end is told by a block shorter than asked
        // (a block that reaches the end exactly is not yet `eof`).
        Ok((buf, (n as u64) < p.len))
    })
    .await?;
    Ok(Reply::FsReadBlock(ReadBlockResponse {
        chunk: ByteChunk(data),
        eof,
    }))
}

pub(super) async fn write_block(
    s: &LocalSession,
    p: WriteBlockParams,
) -> Result<Reply, GatewayError> {
    if p.chunk.0.is_empty() || p.chunk.0.len() as u64 > MAX_READ_BLOCK_BYTES {
        return Err(GatewayError::InvalidRequest(format!(
            "file write block length must be between 1 and {MAX_READ_BLOCK_BYTES}"
        )));
    }
    let file = handle(s, &p.handle_id)?;
    blocking(move || {
        use std::os::unix::fs::FileExt as _;
        file.write_all_at(&p.chunk.0, p.offset)
            .map_err(|e| FsError::from_io(&e))
    })
    .await?;
    Ok(empty())
}

/// `fs/close`: an unknown handle is not an error.
pub(super) fn close(s: &LocalSession, p: &HandleParams) -> Reply {
    s.handles.lock().remove(&p.handle_id);
    empty()
}
