//! A workspace into a snapshot: its tree written as one tar stream (the
//! layer a push would send) and unpacked at once, by the image store's
//! unpacker, into the snapshot's directory.
//!
//! - The walk never follows a link and never leaves the workspace's
//!   filesystem: every directory is opened `O_NOFOLLOW` beneath its
//!   parent's descriptor, every file `O_NOFOLLOW | O_NONBLOCK` and checked
//!   to be the regular file the walk saw. A tenant's process that swaps a
//!   directory for a link cannot make the gateway read outside it.
//! - It reads as the tenant: the walking thread's filesystem ids are the
//!   tenant's (`setfsuid`, which also drops the thread's file capabilities),
//!   through the root the tenant's file calls use (its idmapped tree, or a
//!   fork's overlay), without the gateway's supplementary groups (the
//!   thread's own, dropped). What the tenant cannot read is skipped
//!   (counted), so a fork never shows it more than it could see.
//! - Regular files, directories and symbolic links are kept; FIFOs,
//!   sockets and device nodes, mount points beneath the workspace, names
//!   that are not UTF-8 and what the tenant cannot read are skipped
//!   (counted, and within the entry bound). Hard links become copies.
//! - The stream is deterministic: entries in name order, owner 0:0 (the
//!   tenant's on restore), permission bits without setuid and setgid, the
//!   modification time (to the second); the same tree gives the same
//!   digest. Directories get their times back once everything beneath
//!   them is written, and the tree's root the workspace root's mode.
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

/// Where a capture reads: the workspace's root directory (as the tenant's
/// file calls reach it), and the ids it reads as.
pub struct Source {
    pub root: OwnedFd,
    pub ids: Option<(u32, u32)>,
}

/// Write `source` as a tar stream and unpack it into `dest` (an empty
/// directory), charging `room`; at most `max_entries` entries, skipped
/// ones included. `hold` is called once the workspace is open and returns
/// a guard (the tenant's processes frozen) held until the last byte is
/// read from the workspace.
pub fn capture<G: Send>(
    source: Source,
    dest: &Path,
    max_entries: u64,
    room: &dyn Room,
    hold: impl FnOnce() -> io::Result<G>,
) -> Result<Captured, CaptureError> {
    let root_stat = rustix::fs::fstat(&source.root).map_err(io::Error::from)?;
    let (reader, writer) = io::pipe()?;
    let stop = AtomicBool::new(false);
    // The stream's bytes are bounded by what is charged (each file before
    // it is written, a block per entry) and by the entries.
    let budget = Budget {
        bytes: u64::MAX,
        entries: max_entries,
        whiteouts: false,
    };
    let held = hold()?;
    let walked = std::thread::scope(|scope| {
        let walker = scope.spawn(move || {
            // The tenant's ids and none of the gateway's groups (this
            // thread ends with the walk, so nothing is given back).
            if source.ids.is_some() {
                crate::fs::drop_thread_groups()?;
            }
            let as_tenant = source.ids.map(crate::fs::FsCreds::assume);
            let mut tar = tar::Builder::new(io::BufWriter::with_capacity(1 << 16, writer));
            tar.mode(tar::HeaderMode::Deterministic);
            let mut walk = Walk {
                dev: root_stat.st_dev,
                skipped: 0,
                seen: 0,
                max_entries,
                dirs: Vec::new(),
            };
            let walked = walk
                .run(&source.root, &mut tar)
                .and_then(|()| tar.into_inner())
                .and_then(|mut w| w.flush());
            // The gateway's own ids again before the hold ends: a thaw
            // written as the tenant is refused (`cgroup.freeze` is root's),
            // and the tenant would stay frozen.
            drop(as_tenant);
            drop(held);
            walked.map(|()| (walk.skipped, walk.dirs))
        });
        let unpacked = unpack(reader, Compression::None, dest, budget, room, &stop);
        let walked = walker
            .join()
            .unwrap_or_else(|_| Err(io::Error::other("the snapshot walk panicked")));
        match (unpacked, walked) {
            (Ok(unpacked), Ok((skipped, dirs))) => Ok((Captured { unpacked, skipped }, dirs)),
            (Ok(unpacked), Err(e)) => {
                // The stream ended early where the walk failed: what was
                // unpacked is given back with the directory.
                room.give(unpacked.bytes);
                Err(walk_error(e))
            }
            (Err(UnpackError::TooLarge(why)), _) => Err(CaptureError::TooLarge(why)),
            (Err(UnpackError::StoreFull), _) => Err(CaptureError::Full),
            (Err(_), Err(e)) => Err(walk_error(e)),
            (Err(e), Ok(_)) => Err(CaptureError::Io(io::Error::other(e.to_string()))),
        }
    });
    let (captured, dirs) = walked?;
    // The times of directories, now that nothing more is written beneath
    // them; the root's mode and times as the workspace's.
    for (path, mtime) in dirs {
        let _ = set_mtime(&dest.join(path), mtime);
    }
    let _ = std::fs::set_permissions(
        dest,
        std::os::unix::fs::PermissionsExt::from_mode(root_stat.st_mode & 0o1777),
    );
    let _ = set_mtime(dest, root_stat.st_mtime);
    Ok(captured)
}

/// The tar stream of a snapshot's tree (the layer a push sends): the
/// capture's walk over the tree, as the gateway, so the same bytes as the
/// capture's stream and the same digest (the tree keeps the modes and
/// times the stream gave it). Returns the entries it skipped (none, for a
/// tree the unpacker wrote).
pub fn layer(tree: &Path, out: impl Write, max_entries: u64) -> io::Result<u64> {
    let root = rustix::fs::open(
        tree,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    let st = rustix::fs::fstat(&root)?;
    let mut tar = tar::Builder::new(out);
    tar.mode(tar::HeaderMode::Deterministic);
    let mut walk = Walk {
        dev: st.st_dev,
        skipped: 0,
        seen: 0,
        max_entries,
        dirs: Vec::new(),
    };
    walk.run(&root, &mut tar)?;
    tar.into_inner()?.flush()?;
    Ok(walk.skipped)
}

/// Give the directories of `tree`, unpacked from the tar stream in
/// `layer`, the times the stream gives them (their writes changed them):
/// a restored tree then gives its stream back, byte for byte.
pub fn dir_times_from(layer: &Path, tree: &Path) -> io::Result<()> {
    let mut archive = tar::Archive::new(io::BufReader::with_capacity(
        1 << 16,
        std::fs::File::open(layer)?,
    ));
    let mut dirs = Vec::new();
    for entry in archive.entries()? {
        let entry = entry?;
        if entry.header().entry_type() == tar::EntryType::Directory {
            let path = entry.path()?.into_owned();
            let mtime = i64::try_from(entry.header().mtime()?).unwrap_or(0);
            dirs.push((path, mtime));
        }
    }
    // Opened beneath the tree without following a link: a later entry
    // may have made a directory's name a link out of it.
    let root = rustix::fs::open(
        tree,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    for (path, mtime) in dirs.into_iter().rev() {
        let Ok(dir) = rustix::fs::openat2(
            &root,
            &path,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
            rustix::fs::ResolveFlags::BENEATH | rustix::fs::ResolveFlags::NO_SYMLINKS,
        ) else {
            continue;
        };
        let t = rustix::fs::Timespec {
            tv_sec: mtime,
            tv_nsec: 0,
        };
        rustix::fs::futimens(
            &dir,
            &rustix::fs::Timestamps {
                last_access: t,
                last_modification: t,
            },
        )?;
    }
    Ok(())
}

fn walk_error(e: io::Error) -> CaptureError {
    if e.kind() == io::ErrorKind::FileTooLarge {
        CaptureError::TooLarge(e.to_string())
    } else {
        CaptureError::Io(e)
    }
}

fn set_mtime(path: &Path, mtime: i64) -> io::Result<()> {
    let t = rustix::fs::Timespec {
        tv_sec: mtime,
        tv_nsec: 0,
    };
    rustix::fs::utimensat(
        rustix::fs::CWD,
        path,
        &rustix::fs::Timestamps {
            last_access: t,
            last_modification: t,
        },
        AtFlags::SYMLINK_NOFOLLOW,
    )?;
    Ok(())
}

/// One directory still to write: its descriptor and its path in the tar.
struct Pending {
    dir: OwnedFd,
    path: PathBuf,
    depth: usize,
}

/// The walk's state: its device (mount points are skipped), counts, and
/// the directories whose times are set once the unpack is done.
struct Walk {
    dev: u64,
    skipped: u64,
    /// Entries listed, skipped ones included (`max_entries` bounds them:
    /// the names of a directory are held while it is written).
    seen: u64,
    max_entries: u64,
    dirs: Vec<(PathBuf, i64)>,
}

/// Whether an error means the tenant may not read or search it (skipped),
/// rather than a failure of the walk.
fn denied(e: &rustix::io::Errno) -> bool {
    matches!(*e, rustix::io::Errno::ACCESS | rustix::io::Errno::PERM)
}

impl Walk {
    fn too_many(&self) -> io::Error {
        io::Error::new(
            io::ErrorKind::FileTooLarge,
            format!("more than {} entries", self.max_entries),
        )
    }

    fn run<W: Write>(&mut self, root: &OwnedFd, tar: &mut tar::Builder<W>) -> io::Result<()> {
        let mut stack = vec![Pending {
            dir: rustix::io::dup(root)?,
            path: PathBuf::new(),
            depth: 0,
        }];
        while let Some(p) = stack.pop() {
            let mut names: Vec<Vec<u8>> = Vec::new();
            let listing = match rustix::fs::Dir::read_from(&p.dir) {
                Ok(l) => l,
                Err(e) if denied(&e) => {
                    self.skipped += 1;
                    continue;
                }
                Err(e) => return Err(e.into()),
            };
            for entry in listing {
                let entry = entry?;
                let name = entry.file_name().to_bytes();
                if name != b"." && name != b".." {
                    self.seen += 1;
                    if self.seen > self.max_entries {
                        return Err(self.too_many());
                    }
                    names.push(name.to_vec());
                }
            }
            names.sort();
            let mut subdirs = Vec::new();
            for name in names {
                let os = std::ffi::OsStr::from_bytes(&name);
                if std::str::from_utf8(&name).is_err() {
                    self.skipped += 1;
                    continue;
                }
                let path = p.path.join(os);
                let Ok(st) = rustix::fs::statat(&p.dir, os, AtFlags::SYMLINK_NOFOLLOW) else {
                    self.skipped += 1;
                    continue; // gone since the listing, or not the tenant's to see
                };
                let kind = FileType::from_raw_mode(st.st_mode);
                // A directory on another device is a mount point. (Files
                // are not judged by theirs: in a fork's overlay a file
                // reports the device of the layer it lies in.)
                if kind == FileType::Directory && st.st_dev != self.dev {
                    self.skipped += 1;
                    continue;
                }
                let mut h = tar::Header::new_gnu();
                h.set_mode(st.st_mode & 0o1777);
                h.set_uid(0);
                h.set_gid(0);
                h.set_mtime(u64::try_from(st.st_mtime).unwrap_or(0));
                match kind {
                    FileType::Directory => {
                        if p.depth + 1 >= MAX_DEPTH {
                            return Err(io::Error::new(
                                io::ErrorKind::FileTooLarge,
                                format!("directories nested deeper than {MAX_DEPTH}"),
                            ));
                        }
                        let dir = match rustix::fs::openat(
                            &p.dir,
                            os,
                            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                            Mode::empty(),
                        ) {
                            Ok(d) => d,
                            Err(e) if denied(&e) => {
                                self.skipped += 1;
                                continue;
                            }
                            Err(e) => return Err(e.into()),
                        };
                        h.set_entry_type(tar::EntryType::Directory);
                        h.set_size(0);
                        tar.append_data(&mut h, &path, io::empty())?;
                        self.dirs.push((path.clone(), st.st_mtime));
                        subdirs.push(Pending {
                            dir,
                            path,
                            depth: p.depth + 1,
                        });
                    }
                    FileType::RegularFile => {
                        let fd = match rustix::fs::openat(
                            &p.dir,
                            os,
                            OFlags::RDONLY
                                | OFlags::NOFOLLOW
                                | OFlags::NONBLOCK
                                | OFlags::NOCTTY
                                | OFlags::CLOEXEC,
                            Mode::empty(),
                        ) {
                            Ok(f) => f,
                            Err(e) if denied(&e) => {
                                self.skipped += 1;
                                continue;
                            }
                            Err(e) => return Err(e.into()),
                        };
                        let now = rustix::fs::fstat(&fd)?;
                        if FileType::from_raw_mode(now.st_mode) != FileType::RegularFile
                            || now.st_ino != st.st_ino
                        {
                            self.skipped += 1;
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
                        if std::str::from_utf8(target.as_bytes()).is_err() {
                            self.skipped += 1;
                            continue;
                        }
                        let target = std::ffi::OsStr::from_bytes(target.as_bytes());
                        h.set_entry_type(tar::EntryType::Symlink);
                        h.set_size(0);
                        tar.append_link(&mut h, &path, target)?;
                    }
                    _ => self.skipped += 1,
                }
            }
            // Depth first, in name order.
            stack.extend(subdirs.into_iter().rev());
        }
        Ok(())
    }
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
