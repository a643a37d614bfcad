//! The file calls over gRPC: whole files stream in blocks (`ReadFile`,
//! `WriteFile`); the rest are unary calls.

use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt as _};

use super::super::common::{Backoff, read_full};
use super::super::error::{ClientError, Result, status_error};
use super::super::types::{DirEntry, FILE_BLOCK_BYTES, Metadata, dir_entry, metadata};
use super::GrpcClient;
use crate::protocol::fs::{DirectoryEntry, MetadataResponse};
use crate::transport::grpc::pb;

impl GrpcClient {
    pub(in super::super) async fn read_file_to<W: AsyncWrite + Unpin + Send>(
        &self,
        path: &str,
        sink: &mut W,
    ) -> Result<u64> {
        // A broken stream goes on from the bytes already written.
        let mut total = 0u64;
        let mut backoff: Option<Backoff> = None;
        loop {
            let req = pb::ReadFileRequest {
                session_id: self.session_id.clone(),
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

    /// [`Self::write_file_from`] for bytes in memory, sent again while the
    /// connection is down (as unary calls are retried).
    pub(in super::super) async fn write_file_retrying(
        &self,
        path: &str,
        data: &[u8],
    ) -> Result<u64> {
        let mut backoff: Option<Backoff> = None;
        loop {
            match self.write_file_from(path, &mut &data[..]).await {
                Err(e @ ClientError::Disconnected(_)) => {
                    let b = backoff.get_or_insert_with(|| Backoff::new(self.opts.resume_within));
                    if !b.wait().await {
                        return Err(e);
                    }
                }
                r => return r,
            }
        }
    }

    pub(in super::super) async fn write_file_from<R: AsyncRead + Unpin + Send>(
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
                let n = read_full(source, &mut buf).await?;
                buf.truncate(n);
                if n == 0 && !first {
                    return Ok::<(), ClientError>(());
                }
                let msg = pb::WriteFileRequest {
                    session_id: self.session_id.clone(),
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

    pub(in super::super) async fn create_directory(
        &self,
        path: &str,
        recursive: bool,
    ) -> Result<()> {
        self.retrying(|| {
            let req = pb::CreateDirectoryRequest {
                session_id: self.session_id.clone(),
                path: path.to_owned(),
                recursive,
            };
            let mut c = self.files();
            async move { c.create_directory(req).await }
        })
        .await
        .map(|_| ())
    }

    pub(in super::super) async fn metadata(&self, path: &str) -> Result<Metadata> {
        let m = self
            .retrying(|| {
                let req = pb::GetMetadataRequest {
                    session_id: self.session_id.clone(),
                    path: path.to_owned(),
                };
                let mut c = self.files();
                async move { c.get_metadata(req).await }
            })
            .await?;
        Ok(metadata(wire_metadata(m)))
    }

    pub(in super::super) async fn read_directory(&self, path: &str) -> Result<Vec<DirEntry>> {
        let r = self
            .retrying(|| {
                let req = pb::ReadDirectoryRequest {
                    session_id: self.session_id.clone(),
                    path: path.to_owned(),
                };
                let mut c = self.files();
                async move { c.read_directory(req).await }
            })
            .await?;
        Ok(r.entries
            .into_iter()
            .map(|e| dir_entry(wire_entry(e)))
            .collect())
    }

    pub(in super::super) async fn remove(
        &self,
        path: &str,
        recursive: bool,
        force: bool,
    ) -> Result<()> {
        self.retrying(|| {
            let req = pb::RemoveRequest {
                session_id: self.session_id.clone(),
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

fn wire_metadata(m: pb::GetMetadataResponse) -> MetadataResponse {
    MetadataResponse {
        is_directory: m.is_directory,
        is_file: m.is_file,
        is_symlink: m.is_symlink,
        size: Some(m.size),
        created_at_ms: m.created_at_ms,
        modified_at_ms: m.modified_at_ms,
    }
}

fn wire_entry(e: pb::DirectoryEntry) -> DirectoryEntry {
    DirectoryEntry {
        file_name: e.file_name,
        is_directory: e.is_directory,
        is_file: e.is_file,
    }
}
