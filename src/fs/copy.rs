//! `fs/copy`: files, symbolic links (verbatim) and directory trees, within
//! one root.

use std::io;

use super::error::{Failed, FsError};
use super::root::{FsRoot, Target};
use crate::protocol::fs::CopyParams;

/// `fs/copy` with the reference's rules.
pub(super) fn copy(root: &FsRoot, p: CopyParams) -> Result<(), Failed> {
    let refuse = |m: &str| Err(Failed::Fs(FsError::InvalidRequest(m.to_owned())));
    let src = root.resolve(p.source_path.as_str())?;
    let dst = root.resolve(p.destination_path.as_str())?;
    let meta = src.symlink_metadata()?;
    if meta.is_dir() {
        if !p.recursive {
            return refuse("fs/copy requires recursive: true when sourcePath is a directory");
        }
        if dst.abs().starts_with(src.abs()) {
            return refuse("fs/copy cannot copy a directory to itself or one of its descendants");
        }
        copy_dir(&src, &dst)?;
    } else if meta.is_symlink() {
        dst.symlink(&src.read_link()?)?;
    } else if meta.is_file() {
        copy_file(&src, &dst)?;
    } else {
        return refuse("fs/copy only supports regular files, directories, and symlinks");
    }
    Ok(())
}

fn copy_file(src: &Target<'_>, dst: &Target<'_>) -> io::Result<()> {
    let mut from = src.open_read()?;
    let mut to = dst.open_write()?;
    io::copy(&mut from, &mut to)?;
    Ok(())
}

fn copy_dir(src: &Target<'_>, dst: &Target<'_>) -> io::Result<()> {
    match dst.create_dir(false) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e),
    }
    for name in src.list()? {
        let (s, d) = (src.join(&name), dst.join(&name));
        let meta = s.symlink_metadata()?;
        if meta.is_dir() {
            copy_dir(&s, &d)?;
        } else if meta.is_symlink() {
            d.symlink(&s.read_link()?)?;
        } else if meta.is_file() {
            copy_file(&s, &d)?;
        }
        // Special files (FIFOs, sockets, devices) are skipped, as the reference.
    }
    Ok(())
}
