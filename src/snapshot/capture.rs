//! A workspace into a snapshot: its tree written as one tar stream (the
//! layer a push would send) and unpacked at once, by the image store's
//! unpacker, into the snapshot's directory.
//!
//! - The walk never follows a link and never leaves the workspace's
//!   filesystem: every directory is opened `O_NOFOLLOW` beneath its
//!   parent's descriptor, every file `O_NOFOLLOW | O_NONBLOCK` and checked
//!   to be the regular file the walk saw. A tenant's process that swaps a
//!   directory for a link cannot make the gateway read outside it.
//! - Regular files, directories and symbolic links are kept; FIFOs,
//!   sockets and device nodes, and mount points beneath the workspace, are
//!   skipped (counted). Hard links become copies.
//! - The stream is deterministic: entries in name order, owner 0:0 (the
//!   tenant's on restore), permission bits without setuid and setgid, the
//!   modification time; the same tree gives the same digest.
//! - What the unpacker reads is bounded (bytes and entries) and hashed;
//!   its digest names the snapshot's content.

use std::io::{self, Read, Write};
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;

use rustix::fs::{AtFlags, FileType, Mode, OFlags};

use crate::image::unpack::{Budget, Compression, Room, UnpackError, Unpacked, unpack};

/// What a capture made.
#[derive(Debug, Clone, Copy)]
pub struct Captured {
    pub unpacked: Unpacked,
    /// Entries left out: FIFOs, sockets, devices, mount points.
    pub skipped: u64,
}

/// Why a capture failed.
#[derive(Debug, thiserror::Error)]
pub enum CaptureError {
    /// Past the snapshot's bounds (bytes, entries, depth).
    #[error("{0}")]
    TooLarge(String),
    #[error("the tenant's snapshot share is used up")]
    Full,
    #[error("{0}")]
    Io(#[from] io::Error),
}

/// Deepest directory nesting a capture walks (the unpacker's bound).
const MAX_DEPTH: usize = crate::image::unpack::MAX_PATH_DEPTH;

/// Write `workspace` as a tar stream and unpack it into `dest` (an empty
/// directory), charging `room`. `hold` is called once the workspace is
/// open and returns a guard (the tenant's processes frozen) held until
/// the last byte is read from the workspace.
pub fn capture<G: Send>(
    workspace: &Path,
    dest: &Path,
    budget: Budget,
    room: &dyn Room,
    hold: impl FnOnce() -> io::Result<G>,
) -> Result<Captured, CaptureError> {
    let root = rustix::fs::open(
        workspace,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(io::Error::from)?;
    let dev = rustix::fs::fstat(&root).map_err(io::Error::from)?.st_dev;
    let (reader, writer) = io::pipe()?;
    let stop = AtomicBool::new(false);
    let held = hold()?;
    std::thread::scope(|scope| {
        let walker = scope.spawn(move || {
            let mut tar = tar::Builder::new(io::BufWriter::with_capacity(1 << 16, writer));
            tar.mode(tar::HeaderMode::Deterministic);
            let mut skipped = 0u64;
            let walked = walk(&root, dev, &mut tar, &mut skipped)
                .and_then(|()| tar.into_inner())
                .and_then(|mut w| w.flush());
            drop(held);
            walked.map(|()| skipped)
        });
        let unpacked = unpack(reader, Compression::None, dest, budget, room, &stop);
        let walked = walker
            .join()
            .unwrap_or_else(|_| Err(io::Error::other("the snapshot walk panicked")));
        match (unpacked, walked) {
            (Ok(unpacked), Ok(skipped)) => Ok(Captured { unpacked, skipped }),
            (Err(UnpackError::TooLarge(why)), _) => Err(CaptureError::TooLarge(why)),
            (Err(UnpackError::StoreFull), _) => Err(CaptureError::Full),
            (_, Err(e)) if e.kind() == io::ErrorKind::FileTooLarge => {
                Err(CaptureError::TooLarge(e.to_string()))
            }
            (_, Err(e)) => Err(CaptureError::Io(e)),
            (Err(e), Ok(_)) => Err(CaptureError::Io(io::Error::other(e.to_string()))),
        }
    })
}

/// One directory still to write: its descriptor and its path in the tar.
struct Pending {
    dir: OwnedFd,
    path: PathBuf,
    depth: usize,
}

fn walk<W: Write>(
    root: &OwnedFd,
    dev: u64,
    tar: &mut tar::Builder<W>,
    skipped: &mut u64,
) -> io::Result<()> {
    let mut stack = vec![Pending {
        dir: rustix::io::dup(root)?,
        path: PathBuf::new(),
        depth: 0,
    }];
    while let Some(p) = stack.pop() {
        let mut names: Vec<Vec<u8>> = Vec::new();
        for entry in rustix::fs::Dir::read_from(&p.dir)? {
            let entry = entry?;
            let name = entry.file_name().to_bytes();
            if name != b"." && name != b".." {
                names.push(name.to_vec());
            }
        }
        names.sort();
        let mut subdirs = Vec::new();
        for name in names {
            let os = std::ffi::OsStr::from_bytes(&name);
            let path = p.path.join(os);
            let Ok(st) = rustix::fs::statat(&p.dir, os, AtFlags::SYMLINK_NOFOLLOW) else {
                continue; // gone since the listing
            };
            // A directory on another device is a mount point. (Files are
            // not judged by theirs: in a fork's overlay a file reports
            // the device of the layer it lies in.)
            if FileType::from_raw_mode(st.st_mode) == FileType::Directory && st.st_dev != dev {
                *skipped += 1;
                continue;
            }
            let mut h = tar::Header::new_gnu();
            h.set_mode(st.st_mode & 0o1777);
            h.set_uid(0);
            h.set_gid(0);
            h.set_mtime(u64::try_from(st.st_mtime).unwrap_or(0));
            match FileType::from_raw_mode(st.st_mode) {
                FileType::Directory => {
                    if p.depth + 1 >= MAX_DEPTH {
                        return Err(io::Error::new(
                            io::ErrorKind::FileTooLarge,
                            format!("directories nested deeper than {MAX_DEPTH}"),
                        ));
                    }
                    h.set_entry_type(tar::EntryType::Directory);
                    h.set_size(0);
                    tar.append_data(&mut h, &path, io::empty())?;
                    let dir = rustix::fs::openat(
                        &p.dir,
                        os,
                        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                        Mode::empty(),
                    )?;
                    subdirs.push(Pending {
                        dir,
                        path,
                        depth: p.depth + 1,
                    });
                }
                FileType::RegularFile => {
                    let fd = rustix::fs::openat(
                        &p.dir,
                        os,
                        OFlags::RDONLY
                            | OFlags::NOFOLLOW
                            | OFlags::NONBLOCK
                            | OFlags::NOCTTY
                            | OFlags::CLOEXEC,
                        Mode::empty(),
                    )?;
                    let now = rustix::fs::fstat(&fd)?;
                    if FileType::from_raw_mode(now.st_mode) != FileType::RegularFile
                        || now.st_ino != st.st_ino
                    {
                        continue; // replaced since the listing
                    }
                    let size = u64::try_from(now.st_size).unwrap_or(0);
                    h.set_entry_type(tar::EntryType::Regular);
                    h.set_size(size);
                    let file = std::fs::File::from(fd);
                    tar.append_data(
                        &mut h,
                        &path,
                        Exact {
                            inner: file,
                            left: size,
                        },
                    )?;
                }
                FileType::Symlink => {
                    let target = rustix::fs::readlinkat(&p.dir, os, Vec::new())?;
                    let target = std::ffi::OsStr::from_bytes(target.as_bytes());
                    h.set_entry_type(tar::EntryType::Symlink);
                    h.set_size(0);
                    tar.append_link(&mut h, &path, target)?;
                }
                _ => *skipped += 1,
            }
        }
        // Depth first, in name order.
        stack.extend(subdirs.into_iter().rev());
    }
    Ok(())
}

/// Exactly `left` bytes of `inner`: cut where it grew, zeros where it
/// shrank (the tar header already holds the size).
struct Exact<R> {
    inner: R,
    left: u64,
}

impl<R: Read> Read for Exact<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.left == 0 {
            return Ok(0);
        }
        let want = usize::try_from(self.left)
            .unwrap_or(usize::MAX)
            .min(buf.len());
        let n = match self.inner.read(&mut buf[..want])? {
            0 => {
                buf[..want].fill(0);
                want
            }
            n => n,
        };
        self.left -= n as u64;
        Ok(n)
    }
}

/// Give every entry under `dir` (itself included) to `ids`: a restored
/// workspace is its tenant's, whatever the capture read.
pub fn chown_tree(dir: &Path, (uid, gid): (u32, u32)) -> io::Result<()> {
    let root = rustix::fs::open(
        dir,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    let ids = |fd: &OwnedFd, name: &std::ffi::OsStr| {
        rustix::fs::chownat(
            fd,
            name,
            Some(rustix::fs::Uid::from_raw(uid)),
            Some(rustix::fs::Gid::from_raw(gid)),
            AtFlags::SYMLINK_NOFOLLOW,
        )
    };
    rustix::fs::fchown(
        &root,
        Some(rustix::fs::Uid::from_raw(uid)),
        Some(rustix::fs::Gid::from_raw(gid)),
    )?;
    let mut stack = vec![root];
    while let Some(dir) = stack.pop() {
        let mut names = Vec::new();
        for entry in rustix::fs::Dir::read_from(&dir)? {
            let entry = entry?;
            let name = entry.file_name().to_bytes();
            if name != b"." && name != b".." {
                names.push((name.to_vec(), entry.file_type()));
            }
        }
        for (name, kind) in names {
            let os = std::ffi::OsStr::from_bytes(&name);
            ids(&dir, os)?;
            if kind == FileType::Directory {
                stack.push(rustix::fs::openat(
                    &dir,
                    os,
                    OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                    Mode::empty(),
                )?);
            }
        }
    }
    Ok(())
}
