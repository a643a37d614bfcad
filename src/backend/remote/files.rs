//! gRPC's streamed files (`ReadFile`, `WriteFile`) on a remote executor.
//!
//! An executor that speaks the current protocol (0.169.0) opens a handle
//! (`fs/open`) and moves blocks (`fs/readBlock`, `fs/writeBlock`, at most
//! [`BLOCK_BYTES`] each, an answer longer than asked cut), closed with
//! `fs/close`: nothing is held here but the block in flight. One of May's
//! (0.130.0) has only whole-file calls:
//! - a read is one `fs/readFile` of a regular file (checked first: such an
//!   executor reads a device until its memory runs out), served in blocks
//!   from memory; the answer is bounded by the link's
//!   `server.max_message_bytes`;
//! - a write is sent whole when the stream ends, at most
//!   [`WHOLE_FILE_MAX_BYTES`], held against the tenant's inbound budget;
//!   its directory is checked when the stream opens, and nothing is
//!   written (an existing file is left as it was) unless the stream ends
//!   well.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use parking_lot::Mutex;

use super::RemoteSession;
use crate::error::GatewayError;
use crate::outbound::Reservation;
use crate::protocol::ByteChunk;
use crate::protocol::fs::{
    HandleParams, OpenMode, OpenParams, PathParams, ReadBlockParams, WriteBlockParams,
    WriteFileParams,
};
use crate::protocol::path::WirePath;
use crate::rpc::{BlockFile, BoxFuture, Call, Reply};

/// The largest block moved in one call (`fs/readBlock`'s own limit).
pub const BLOCK_BYTES: usize = 1024 * 1024;
/// The largest file written whole to an executor without block calls
/// (0.130.0): it goes in one websocket frame, base64 (4/3 larger), and
/// such an executor takes frames of at most 16 MiB.
pub const WHOLE_FILE_MAX_BYTES: usize = 8 * 1024 * 1024;

/// A file open on the session's executor.
pub struct RemoteFile {
    session: Arc<RemoteSession>,
    how: How,
    /// `finish` ran (a handle is then closed).
    finished: AtomicBool,
}

enum How {
    /// A handle on the executor.
    Handle(String),
    /// A whole file read at open.
    Read(Vec<u8>),
    /// A whole file written at the end: the path, the bytes so far (and
    /// their reservations).
    Write(WirePath, Mutex<(Vec<u8>, Vec<Reservation>)>),
}

fn too_large() -> GatewayError {
    GatewayError::InvalidParams(format!(
        "the file is over {WHOLE_FILE_MAX_BYTES} bytes, the most this gateway writes whole to an executor without block calls (fs/open: Codex 0.169.0 executors have them)"
    ))
}

impl RemoteFile {
    /// Open `path` for reading (`write`: false) or create/truncate it.
    pub(super) async fn open(
        session: Arc<RemoteSession>,
        path: PathParams,
        write: bool,
    ) -> Result<RemoteFile, GatewayError> {
        if session.uris {
            let handle_id = uuid::Uuid::new_v4().simple().to_string();
            let call = Call::FsOpen(OpenParams {
                handle_id: handle_id.clone(),
                path: path.path,
                mode: if write {
                    OpenMode::Replace
                } else {
                    OpenMode::Read
                },
            });
            session.typed(&call).await?;
            return Ok(RemoteFile::new(session, How::Handle(handle_id)));
        }
        if write {
            // Nothing is written (an existing file is not truncated) until
            // the whole file is there; a bad directory fails now.
            let parent = std::path::Path::new(path.path.as_str())
                .parent()
                .map(|p| p.display().to_string())
                .ok_or_else(|| GatewayError::InvalidParams("a file path is needed".to_owned()))?;
            let meta = session
                .typed(&Call::FsGetMetadata(PathParams::plain(parent.clone())))
                .await?;
            if !matches!(meta, Reply::FsGetMetadata(m) if m.is_directory) {
                return Err(GatewayError::InvalidParams(format!(
                    "{parent} is not a directory"
                )));
            }
            let how = How::Write(path.path, Mutex::new((Vec::new(), Vec::new())));
            return Ok(RemoteFile::new(session, how));
        }
        // Only a regular file is read whole: such an executor reads a
        // device (`/dev/zero`) until its memory runs out. Its answer is
        // bounded by the link's `server.max_message_bytes` (a larger file
        // closes the link).
        let meta = session.typed(&Call::FsGetMetadata(path.clone())).await?;
        if !matches!(meta, Reply::FsGetMetadata(m) if m.is_file) {
            return Err(GatewayError::InvalidParams(format!(
                "{} is not a regular file",
                path.path.as_str()
            )));
        }
        let data = match session.typed(&Call::FsReadFile(path)).await? {
            Reply::FsReadFile(r) => r.data_base64.0,
            _ => return Err(GatewayError::Internal("unexpected reply".to_owned())),
        };
        Ok(RemoteFile::new(session, How::Read(data)))
    }

    fn new(session: Arc<RemoteSession>, how: How) -> RemoteFile {
        RemoteFile {
            session,
            how,
            finished: AtomicBool::new(false),
        }
    }
}

impl BlockFile for RemoteFile {
    fn read(
        &self,
        offset: u64,
        len: usize,
    ) -> BoxFuture<'_, Result<(Vec<u8>, bool), GatewayError>> {
        Box::pin(async move {
            let len = len.clamp(1, BLOCK_BYTES);
            match &self.how {
                How::Handle(id) => {
                    let call = Call::FsReadBlock(ReadBlockParams {
                        handle_id: id.clone(),
                        offset,
                        len: len as u64,
                    });
                    match self.session.typed(&call).await? {
                        // Never more than asked for, whatever it sent.
                        Reply::FsReadBlock(b) if b.chunk.0.len() > len => {
                            let mut data = b.chunk.0;
                            data.truncate(len);
                            Ok((data, false))
                        }
                        Reply::FsReadBlock(b) => Ok((b.chunk.0, b.eof)),
                        _ => Err(GatewayError::Internal("unexpected reply".to_owned())),
                    }
                }
                How::Read(data) => {
                    let start = usize::try_from(offset).map_or(data.len(), |o| o.min(data.len()));
                    let end = start.saturating_add(len).min(data.len());
                    Ok((data[start..end].to_vec(), end == data.len()))
                }
                How::Write(..) => Err(GatewayError::Internal(
                    "the file is open for writing".to_owned(),
                )),
            }
        })
    }

    fn write(
        &self,
        offset: u64,
        data: Vec<u8>,
        held: Reservation,
    ) -> BoxFuture<'_, Result<(), GatewayError>> {
        Box::pin(async move {
            match &self.how {
                How::Handle(id) => {
                    // Blocks go at most BLOCK_BYTES at a time.
                    let mut at = offset;
                    for block in data.chunks(BLOCK_BYTES) {
                        let call = Call::FsWriteBlock(WriteBlockParams {
                            handle_id: id.clone(),
                            offset: at,
                            chunk: ByteChunk(block.to_vec()),
                        });
                        self.session.typed(&call).await?;
                        at += block.len() as u64;
                    }
                    drop(held);
                    Ok(())
                }
                How::Write(_, buffer) => {
                    let mut buffer = buffer.lock();
                    if buffer.0.len() + data.len() > WHOLE_FILE_MAX_BYTES {
                        return Err(too_large());
                    }
                    buffer.0.extend_from_slice(&data);
                    buffer.1.push(held);
                    Ok(())
                }
                How::Read(_) => Err(GatewayError::Internal(
                    "the file is open for reading".to_owned(),
                )),
            }
        })
    }

    fn finish(&self) -> BoxFuture<'_, Result<(), GatewayError>> {
        Box::pin(async move {
            self.finished.store(true, Ordering::Release);
            match &self.how {
                How::Handle(id) => {
                    let call = Call::FsClose(HandleParams {
                        handle_id: id.clone(),
                    });
                    self.session.typed(&call).await.map(drop)
                }
                How::Write(path, buffer) => {
                    let (data, held) = std::mem::take(&mut *buffer.lock());
                    use base64::Engine as _;
                    let call = Call::FsWriteFile(WriteFileParams {
                        path: path.clone(),
                        data_base64: base64::engine::general_purpose::STANDARD.encode(&data),
                        follow_symlinks: None,
                    });
                    drop(data);
                    let sent = self.session.typed(&call).await.map(drop);
                    drop(held);
                    sent
                }
                How::Read(_) => Ok(()),
            }
        })
    }
}

impl Drop for RemoteFile {
    /// A handle not closed (the stream failed or was dropped) is closed on
    /// the executor in the background.
    fn drop(&mut self) {
        if let How::Handle(id) = &self.how
            && !self.finished.load(Ordering::Acquire)
        {
            let (session, id) = (self.session.clone(), id.clone());
            crate::task::start("remote-file-close", async move {
                let _ = session
                    .typed(&Call::FsClose(HandleParams { handle_id: id }))
                    .await;
            });
        }
    }
}
