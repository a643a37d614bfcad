//! The operation runner: an [`FsOp`] in, an [`FsDone`] (or [`FsError`]) out,
//! as the root's credentials; each operation's work is in its own file.

use std::io;

use serde::{Deserialize, Serialize};

use super::copy::copy;
use super::creds::FsCreds;
use super::error::{Failed, FsError};
use super::ops::{canonicalize, create_directory, get_metadata, read_directory, remove};
use super::root::{FsRoot, Target, is_escape, resolve_following};
use super::walk::walk;
use crate::protocol::fs::{
    CopyParams, CreateDirectoryParams, MetadataResponse, PathParams, ReadDirectoryResponse,
    RemoveParams, WalkParams, WalkResponse,
};
use crate::protocol::path::WirePath;

/// A file operation. Contents are not part of it: `OpenRead`/`OpenWrite`
/// return the opened file and the caller moves the bytes. Results name
/// paths on the host; the caller writes them in the session's form.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum FsOp {
    OpenRead(PathParams),
    OpenWrite(PathParams),
    CreateDirectory(CreateDirectoryParams),
    GetMetadata(PathParams),
    ReadDirectory(PathParams),
    Remove(RemoveParams),
    Copy(CopyParams),
    Canonicalize(PathParams),
    Walk(WalkParams),
    /// Which of the paths exist (a path outside the root does not).
    Exist(Vec<WirePath>),
}

/// What an [`FsOp`] produced.
#[derive(Debug)]
pub enum FsDone {
    Done,
    Metadata(MetadataResponse),
    Directory(ReadDirectoryResponse),
    File(std::fs::File),
    Path(String),
    Walk(WalkResponse),
    Exist(Vec<bool>),
}

/// Run one operation against `root`, as its credentials (blocking).
pub fn run(root: &FsRoot, op: FsOp) -> Result<FsDone, FsError> {
    let _as = root.creds.map(FsCreds::assume);
    let path = op.path().map(|p| p.as_str().to_owned()).unwrap_or_default();
    match op {
        FsOp::OpenRead(p) => open(root, &p, |t| t.open_read()),
        FsOp::OpenWrite(p) => open(root, &p, |t| t.open_write()),
        FsOp::CreateDirectory(p) => create_directory(root, p).map(|()| FsDone::Done),
        FsOp::GetMetadata(p) => get_metadata(root, p).map(FsDone::Metadata),
        FsOp::ReadDirectory(p) => read_directory(root, p).map(FsDone::Directory),
        FsOp::Remove(p) => remove(root, p).map(|()| FsDone::Done),
        FsOp::Copy(p) => copy(root, p).map(|()| FsDone::Done),
        FsOp::Canonicalize(p) => canonicalize(root, &p).map(FsDone::Path),
        FsOp::Walk(p) => walk(root, p).map(FsDone::Walk),
        FsOp::Exist(paths) => Ok(FsDone::Exist(
            paths
                .iter()
                .map(|p| {
                    root.resolve(p.as_str())
                        .is_ok_and(|t| t.symlink_metadata().is_ok())
                })
                .collect(),
        )),
    }
    .map_err(|e| match e {
        Failed::Fs(e) => e,
        // A symbolic link that leads out of the root (cap-std's refusal;
        // an absolute link counts, even one that points back inside).
        Failed::Io(e) if is_escape(&e) => FsError::OutsideRoot(path),
        Failed::Io(e) => FsError::from_io(&e),
    })
}

impl FsOp {
    /// The path the operation is about (the source of a copy).
    fn path(&self) -> Option<&WirePath> {
        match self {
            FsOp::OpenRead(p)
            | FsOp::OpenWrite(p)
            | FsOp::GetMetadata(p)
            | FsOp::ReadDirectory(p)
            | FsOp::Canonicalize(p) => Some(&p.path),
            FsOp::CreateDirectory(p) => Some(&p.path),
            FsOp::Remove(p) => Some(&p.path),
            FsOp::Copy(p) => Some(&p.source_path),
            FsOp::Walk(p) => Some(&p.path),
            FsOp::Exist(paths) => paths.first(),
        }
    }
}

fn open(
    root: &FsRoot,
    p: &PathParams,
    how: fn(&Target<'_>) -> io::Result<std::fs::File>,
) -> Result<FsDone, Failed> {
    let target = resolve_following(root, &p.path, p.follow_symlinks)?;
    match how(&target) {
        Ok(f) => Ok(FsDone::File(f)),
        Err(e) if e.raw_os_error() == Some(libc::EISDIR) => Err(FsError::NotAFile {
            path: target.abs().display().to_string(),
            is_dir: true,
        }
        .into()),
        Err(e) if e.kind() == io::ErrorKind::InvalidInput => Err(FsError::NotAFile {
            path: target.abs().display().to_string(),
            is_dir: false,
        }
        .into()),
        Err(e) => Err(e.into()),
    }
}
