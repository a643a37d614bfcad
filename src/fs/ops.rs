//! The single-path operations: create a directory, metadata, canonical
//! path, list a directory, remove.

use std::io;
use std::path::Path;

use super::error::{Failed, FsError};
use super::meta::millis;
use super::root::{FsRoot, Target, resolve_following};
use crate::protocol::fs::{
    CreateDirectoryParams, DirectoryEntry, MetadataResponse, PathParams, ReadDirectoryResponse,
    RemoveParams,
};

pub(super) fn create_directory(root: &FsRoot, p: CreateDirectoryParams) -> Result<(), Failed> {
    Ok(resolve_following(root, &p.path, p.follow_symlinks)?.create_dir(p.recursive)?)
}

/// `fs/getMetadata`: `is*` follow symlinks except `isSymlink`; `size` is
/// the followed file's (a 0.130.0 session does not get it).
pub(super) fn get_metadata(root: &FsRoot, p: PathParams) -> Result<MetadataResponse, Failed> {
    let target = resolve_following(root, &p.path, p.follow_symlinks)?;
    let meta = target.metadata()?;
    let is_symlink = target
        .symlink_metadata()
        .map(|m| m.is_symlink())
        .unwrap_or(false);
    Ok(MetadataResponse {
        is_directory: meta.is_dir(),
        is_file: meta.is_file(),
        is_symlink,
        size: Some(meta.len()),
        created_at_ms: millis(meta.created()),
        modified_at_ms: millis(meta.modified()),
    })
}

/// `fs/canonicalize`: symlinks resolved (within the root), `..` removed.
pub(super) fn canonicalize(root: &FsRoot, p: &PathParams) -> Result<String, Failed> {
    let target = root.resolve(p.path.as_str())?;
    Ok(target.canonicalize()?.display().to_string())
}

/// `fs/readDirectory`: readdir order; entries whose stat fails are skipped.
pub(super) fn read_directory(
    root: &FsRoot,
    p: PathParams,
) -> Result<ReadDirectoryResponse, Failed> {
    let target = root.resolve(p.path.as_str())?;
    let entries = target
        .list()?
        .into_iter()
        .filter_map(|name| {
            let meta = target.join(&name).metadata().ok()?;
            Some(DirectoryEntry {
                file_name: name.to_string_lossy().into_owned(),
                is_directory: meta.is_dir(),
                is_file: meta.is_file(),
            })
        })
        .collect();
    Ok(ReadDirectoryResponse { entries })
}

/// `fs/remove`: a symlink itself is removed, never its target.
pub(super) fn remove(root: &FsRoot, p: RemoveParams) -> Result<(), Failed> {
    let target = resolve_following(root, &p.path, p.follow_symlinks)?;
    if matches!(target, Target::Confined { ref rel, .. } if rel == Path::new(".")) {
        return Err(
            FsError::InvalidRequest("refusing to remove the tenant root".to_owned()).into(),
        );
    }
    let result = match target.symlink_metadata() {
        Ok(m) if m.is_dir() => target.remove_dir(p.recursive),
        Ok(_) => target.remove_file(),
        Err(e) => Err(e),
    };
    match result {
        Err(e) if e.kind() == io::ErrorKind::NotFound && p.force => Ok(()),
        r => Ok(r?),
    }
}
