//! The `fs/*` calls. Whole files move in blocks through a handle
//! (`fs/open`, `fs/readBlock` / `fs/writeBlock`, `fs/close`), several
//! blocks in flight at once.

use futures_util::StreamExt as _;
use futures_util::stream::FuturesOrdered;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt as _};

use super::super::common::read_full;
use super::super::error::{ClientError, Result};
use super::super::types::{
    DirEntry, FILE_BLOCK_BYTES, FILE_BLOCKS_IN_FLIGHT, Metadata, dir_entry, metadata,
};
use super::WsClient;
use crate::protocol::ByteChunk;
use crate::protocol::fs::{
    CreateDirectoryParams, HandleParams, MetadataResponse, OpenMode, OpenParams, PathParams,
    ReadBlockParams, ReadBlockResponse, ReadDirectoryResponse, RemoveParams, WriteBlockParams,
};
use crate::protocol::methods;

impl WsClient {
    pub(in super::super) async fn read_file_to<W: AsyncWrite + Unpin + Send>(
        &self,
        path: &str,
        sink: &mut W,
    ) -> Result<u64> {
        let handle = self.open_handle(path, OpenMode::Read).await?;
        let result = self.read_blocks(&handle, sink).await;
        self.close_handle(&handle, result).await
    }

    /// `fs/open` under a fresh handle id.
    async fn open_handle(&self, path: &str, mode: OpenMode) -> Result<String> {
        let params = OpenParams {
            handle_id: self.ids.next("h"),
            path: self.wire_path(path)?,
            mode,
        };
        self.call_unit(methods::FS_OPEN, &params).await?;
        Ok(params.handle_id)
    }

    /// `fs/close` whatever `result` is; `result`'s error first.
    async fn close_handle(&self, handle: &str, result: Result<u64>) -> Result<u64> {
        let params = HandleParams {
            handle_id: handle.to_owned(),
        };
        let closed = self.call_unit(methods::FS_CLOSE, &params).await;
        let n = result?;
        closed?;
        Ok(n)
    }

    async fn read_blocks<W: AsyncWrite + Unpin + Send>(
        &self,
        handle: &str,
        sink: &mut W,
    ) -> Result<u64> {
        let read = |offset: u64| async move {
            let params = ReadBlockParams {
                handle_id: handle.to_owned(),
                offset,
                len: FILE_BLOCK_BYTES as u64,
            };
            let b: ReadBlockResponse = self.call(methods::FS_READ_BLOCK, &params).await?;
            Ok::<_, ClientError>((b.chunk.0, b.eof))
        };
        let mut inflight = FuturesOrdered::new();
        let mut offset = 0u64;
        let mut total = 0u64;
        let mut eof = false;
        loop {
            while !eof && inflight.len() < FILE_BLOCKS_IN_FLIGHT {
                inflight.push_back(read(offset));
                offset += FILE_BLOCK_BYTES as u64;
            }
            let Some(r) = inflight.next().await else {
                break;
            };
            let (data, at_end) = r?;
            if data.len() > FILE_BLOCK_BYTES {
                return Err(ClientError::Protocol(format!(
                    "a block of {} bytes where at most {FILE_BLOCK_BYTES} were asked",
                    data.len()
                )));
            }
            if eof {
                continue;
            }
            sink.write_all(&data).await?;
            total += data.len() as u64;
            // A short block is the end too (the file shrank meanwhile).
            if at_end || data.len() < FILE_BLOCK_BYTES {
                eof = true;
            }
        }
        sink.flush().await?;
        Ok(total)
    }

    pub(in super::super) async fn write_file_from<R: AsyncRead + Unpin + Send>(
        &self,
        path: &str,
        source: &mut R,
    ) -> Result<u64> {
        let handle = self.open_handle(path, OpenMode::Replace).await?;
        let result = self.write_blocks(&handle, source).await;
        self.close_handle(&handle, result).await
    }

    async fn write_blocks<R: AsyncRead + Unpin + Send>(
        &self,
        handle: &str,
        source: &mut R,
    ) -> Result<u64> {
        let write = |offset: u64, chunk: Vec<u8>| async move {
            let params = WriteBlockParams {
                handle_id: handle.to_owned(),
                offset,
                chunk: ByteChunk(chunk),
            };
            self.call_unit(methods::FS_WRITE_BLOCK, &params).await
        };
        let mut inflight = FuturesOrdered::new();
        let mut offset = 0u64;
        let mut buf = vec![0u8; FILE_BLOCK_BYTES];
        let mut done = false;
        loop {
            while !done && inflight.len() < FILE_BLOCKS_IN_FLIGHT {
                let n = read_full(source, &mut buf).await?;
                if n == 0 {
                    done = true;
                    break;
                }
                inflight.push_back(write(offset, buf[..n].to_vec()));
                offset += n as u64;
                if n < buf.len() {
                    done = true;
                }
            }
            match inflight.next().await {
                Some(r) => r?,
                None => break,
            }
        }
        Ok(offset)
    }

    pub(in super::super) async fn create_directory(
        &self,
        path: &str,
        recursive: bool,
    ) -> Result<()> {
        let params = CreateDirectoryParams {
            path: self.wire_path(path)?,
            recursive,
            follow_symlinks: None,
        };
        self.call_unit(methods::FS_CREATE_DIRECTORY, &params).await
    }

    pub(in super::super) async fn metadata(&self, path: &str) -> Result<Metadata> {
        let m: MetadataResponse = self
            .call(methods::FS_GET_METADATA, &self.path_params(path)?)
            .await?;
        Ok(metadata(m))
    }

    pub(in super::super) async fn read_directory(&self, path: &str) -> Result<Vec<DirEntry>> {
        let r: ReadDirectoryResponse = self
            .call(methods::FS_READ_DIRECTORY, &self.path_params(path)?)
            .await?;
        Ok(r.entries.into_iter().map(dir_entry).collect())
    }

    pub(in super::super) async fn remove(
        &self,
        path: &str,
        recursive: bool,
        force: bool,
    ) -> Result<()> {
        let params = RemoveParams {
            path: self.wire_path(path)?,
            recursive,
            force,
            follow_symlinks: None,
        };
        self.call_unit(methods::FS_REMOVE, &params).await
    }

    fn path_params(&self, path: &str) -> Result<PathParams> {
        Ok(PathParams {
            path: self.wire_path(path)?,
            follow_symlinks: None,
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::sync::Arc;

    use parking_lot::Mutex;
    use serde_json::json;

    use super::super::testing::fake;
    use super::*;
    use crate::protocol::base64_decode;
    use crate::protocol::revision::Revision;

    #[tokio::test]
    async fn a_file_is_read_in_blocks_through_a_handle() {
        let f = fake(Revision::Nov2026, |m, p| {
            Ok(match m {
                "fs/readBlock" if p["offset"] == 0 => json!({"chunk": "aGVsbG8=", "eof": true}),
                "fs/readBlock" => json!({"chunk": "", "eof": true}),
                "fs/open" => json!({"handleId": p["handleId"]}),
                _ => json!({}),
            })
        });
        let mut out = Vec::new();
        let n = f.client.read_file_to("/d/f", &mut out).await.unwrap();
        assert_eq!((n, out.as_slice()), (5, &b"hello"[..]));
        let methods = f.methods();
        assert_eq!(methods.first().unwrap(), "fs/open");
        assert_eq!(methods.last().unwrap(), "fs/close");
        let open = f.params(0);
        assert_eq!(open["path"], "file:///d/f");
        assert_eq!(open["mode"], "read");
        let handle = open["handleId"].as_str().unwrap().to_owned();
        assert!(handle.starts_with("h-"));
        assert_eq!(
            f.params(1),
            json!({"handleId": handle, "offset": 0, "len": FILE_BLOCK_BYTES})
        );
        assert_eq!(f.params(methods.len() - 1), json!({"handleId": handle}));
    }

    #[tokio::test]
    async fn a_failed_read_still_closes_its_handle() {
        let f = fake(Revision::Nov2026, |m, _| match m {
            "fs/readBlock" => Err(super::super::testing::error(-32603, "I/O error")),
            _ => Ok(json!({})),
        });
        let e = f
            .client
            .read_file_to("/f", &mut Vec::new())
            .await
            .unwrap_err();
        assert!(matches!(e, ClientError::Rpc { code: -32603, .. }), "{e:?}");
        assert_eq!(f.methods().last().unwrap(), "fs/close");
    }

    #[tokio::test]
    async fn a_file_is_written_in_blocks_at_their_offsets() {
        type Blocks = Arc<Mutex<Vec<(u64, Vec<u8>)>>>;
        let blocks: Blocks = Arc::default();
        let f = fake(Revision::May2026, {
            let blocks = blocks.clone();
            move |m, p| {
                if m == "fs/writeBlock" {
                    let data = base64_decode(p["chunk"].as_str().unwrap()).unwrap();
                    blocks.lock().push((p["offset"].as_u64().unwrap(), data));
                }
                Ok(json!({}))
            }
        });
        let data: Vec<u8> = (0..FILE_BLOCK_BYTES + 3).map(|i| i as u8).collect();
        let n = f
            .client
            .write_file_from("/f", &mut data.as_slice())
            .await
            .unwrap();
        assert_eq!(n, data.len() as u64);
        assert_eq!(f.params(0)["mode"], "replace");
        assert_eq!(
            f.params(0)["path"],
            "/f",
            "a May session writes plain paths"
        );
        let mut blocks = blocks.lock().clone();
        blocks.sort();
        assert_eq!(blocks.len(), 2);
        assert_eq!(blocks[0].0, 0);
        assert_eq!(blocks[1].0, FILE_BLOCK_BYTES as u64);
        assert_eq!([blocks[0].1.clone(), blocks[1].1.clone()].concat(), data);
        assert_eq!(f.methods().last().unwrap(), "fs/close");
    }

    #[tokio::test]
    async fn metadata_directories_and_removal() {
        let f = fake(Revision::Nov2026, |m, _| {
            Ok(match m {
                "fs/getMetadata" => json!({"isDirectory": true, "isFile": false,
                    "isSymlink": false, "size": 4096, "createdAtMs": 1, "modifiedAtMs": 2}),
                "fs/readDirectory" => json!({"entries": [
                    {"fileName": "a", "isDirectory": false, "isFile": true}]}),
                _ => json!({}),
            })
        });
        let c = &f.client;
        let m = c.metadata("/d").await.unwrap();
        assert!(m.is_directory && !m.is_file && m.size == 4096 && m.modified_at_ms == 2);
        let entries = c.read_directory("/d").await.unwrap();
        assert_eq!(
            entries,
            [DirEntry {
                file_name: "a".into(),
                is_directory: false,
                is_file: true
            }]
        );
        c.create_directory("/d/e", false).await.unwrap();
        c.remove("/d", true, false).await.unwrap();
        let path = json!("file:///d");
        assert_eq!(f.params(0), json!({"path": path, "followSymlinks": null}));
        assert_eq!(f.params(1), f.params(0));
        assert_eq!(
            f.params(2),
            json!({"path": "file:///d/e", "recursive": false, "followSymlinks": null})
        );
        assert_eq!(
            f.params(3),
            json!({"path": path, "recursive": true, "force": false, "followSymlinks": null})
        );
        assert_eq!(
            f.methods(),
            [
                "fs/getMetadata",
                "fs/readDirectory",
                "fs/createDirectory",
                "fs/remove"
            ]
        );
    }
}
