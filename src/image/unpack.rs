//! One layer's tar stream into a fresh directory, treating every byte as
//! hostile (docs/environments.md, "Security model").
//!
//! - Paths are relative and normal: an absolute path, a `..` component or
//!   more than [`MAX_PATH_DEPTH`] components refuses the layer (each entry
//!   walks its path, so depth costs every entry). Every directory on the
//!   way is opened with
//!   `O_NOFOLLOW`: a path through a symbolic link (the layer's own or one
//!   planted earlier in it) refuses the layer, so nothing is ever written
//!   outside the directory.
//! - Only regular files, directories, symbolic links (their targets are
//!   never followed here; at run time they resolve inside the image) and
//!   hard links to a regular file earlier in the same layer. Device nodes,
//!   FIFOs and anything else refuse the layer.
//! - Every file belongs to root; permission bits are kept without setuid
//!   and setgid (the view is mounted `nosuid,nodev` besides); extended
//!   attributes, file capabilities among them, are not applied.
//! - OCI whiteouts become overlayfs ones: `.wh.NAME` a 0/0 character
//!   device, `.wh..wh..opq` the `trusted.overlay.opaque` attribute.
//! - The uncompressed stream is counted against a byte budget and entries
//!   against an entry budget (a decompression or inode bomb stops at its
//!   bound) and hashed: its digest is the layer's `diff_id`, which the
//!   caller checks against the image's config before committing.
//! - Each file's bytes are taken from the store's [`Room`] before they
//!   are written (the store evicts what no one uses to give them), so the
//!   store never holds more than its bound.
//! - A `stop` flag is checked before each entry and each read: a pull
//!   that ends (its timeout) stops its unpack, which gives back what it
//!   took ([`UnpackError::Stopped`]).

use std::io::{self, Read};
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Component, Path};
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};

use rustix::fs::{AtFlags, FileType, Mode, OFlags, Timestamps};
use sha2::Digest as _;

/// How a layer's bytes are compressed (its media type).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compression {
    None,
    Gzip,
}

impl Compression {
    /// The compression a layer media type names; `None` for a type this
    /// gateway does not unpack (zstd, foreign layers, anything unknown).
    pub fn of_media_type(media_type: &str) -> Option<Compression> {
        match media_type {
            "application/vnd.oci.image.layer.v1.tar"
            | "application/vnd.oci.image.layer.nondistributable.v1.tar"
            | "application/vnd.docker.image.rootfs.diff.tar" => Some(Compression::None),
            "application/vnd.oci.image.layer.v1.tar+gzip"
            | "application/vnd.oci.image.layer.nondistributable.v1.tar+gzip"
            | "application/vnd.docker.image.rootfs.diff.tar.gzip" => Some(Compression::Gzip),
            _ => None,
        }
    }
}

/// What a layer unpacked to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Unpacked {
    /// SHA-256 of the uncompressed tar stream (hex).
    pub diff_id: [u8; 32],
    /// What it takes of the store: a block per entry, and each file's
    /// contents in whole blocks ([`BLOCK`]).
    pub bytes: u64,
    /// Entries created.
    pub entries: u64,
}

/// The store's unit of charge: an entry's inode and block, and the
/// block size a file's contents are rounded up to.
pub const BLOCK: u64 = 4096;

/// Most components of an entry's path (or a hard link's target): each
/// entry opens every directory on its way, so a layer nested thousands
/// deep costs its depth squared. Real images nest a few dozen at most.
pub const MAX_PATH_DEPTH: usize = 128;

/// Why a layer was refused.
#[derive(Debug, thiserror::Error)]
pub enum UnpackError {
    #[error("hostile layer: {0}")]
    Hostile(String),
    #[error("layer too large: {0}")]
    TooLarge(String),
    /// The store could not give the bytes a file needs, even after
    /// evicting what it could.
    #[error("the image store is full")]
    StoreFull,
    #[error("layer unreadable: {0}")]
    Io(#[from] io::Error),
    /// Told to stop (the pull ended: its timeout).
    #[error("unpack stopped: its pull ended")]
    Stopped,
}

/// Where the bytes an unpack writes are charged: the store's free bytes.
pub trait Room: Sync {
    /// Take `n` bytes; `false` if they cannot be had (they are taken
    /// anyway: the caller gives back all it took when the unpack fails).
    fn take(&self, n: u64) -> bool;
    /// Give back `n` bytes taken before.
    fn give(&self, n: u64);
}

/// Free bytes, never more than they are.
impl Room for AtomicI64 {
    fn take(&self, n: u64) -> bool {
        let n = i64::try_from(n).unwrap_or(i64::MAX);
        self.fetch_sub(n, Ordering::SeqCst) >= n
    }

    fn give(&self, n: u64) {
        self.fetch_add(i64::try_from(n).unwrap_or(i64::MAX), Ordering::SeqCst);
    }
}

/// The bounds of one unpack.
#[derive(Debug, Clone, Copy)]
pub struct Budget {
    /// Uncompressed bytes (the tar stream as a whole).
    pub bytes: u64,
    pub entries: u64,
    /// OCI whiteouts (`.wh.NAME`, `.wh..wh..opq`) become overlayfs ones.
    /// Off for a layer that is the only one (a workspace snapshot): there
    /// nothing lies below to hide, and such names are plain files.
    pub whiteouts: bool,
}

/// Counts, bounds and hashes what passes through; stops when told.
struct Counted<'a, R> {
    inner: R,
    hash: sha2::Sha256,
    read: u64,
    limit: u64,
    stop: &'a AtomicBool,
}

impl<R: Read> Read for Counted<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.stop.load(Ordering::Relaxed) {
            // Reported as `Stopped` by `unpack`, whatever wraps it.
            return Err(io::Error::other("stopped"));
        }
        let n = self.inner.read(buf)?;
        self.read += n as u64;
        if self.read > self.limit {
            return Err(io::Error::new(
                io::ErrorKind::FileTooLarge,
                format!("more than {} bytes uncompressed", self.limit),
            ));
        }
        self.hash.update(&buf[..n]);
        Ok(n)
    }
}

const WHITEOUT_PREFIX: &str = ".wh.";
const OPAQUE: &str = ".wh..wh..opq";

/// Unpack `blob` (compressed as `compression`) into `dest`, an empty
/// directory the caller made, taking each file's bytes from `room` (the
/// store's free bytes) before it is written; on failure what was taken
/// is given back (the caller removes `dest`). Once `stop` is set, it
/// fails with [`UnpackError::Stopped`] before the next entry or read.
/// On success the caller owns the `bytes` taken.
pub fn unpack(
    blob: impl Read,
    compression: Compression,
    dest: &Path,
    budget: Budget,
    room: &dyn Room,
    stop: &AtomicBool,
) -> Result<Unpacked, UnpackError> {
    let mut charged = 0u64;
    let r = unpack_charged(blob, compression, dest, budget, room, stop, &mut charged);
    if r.is_err() {
        room.give(charged);
        if stop.load(Ordering::SeqCst) {
            return Err(UnpackError::Stopped);
        }
    }
    r
}

fn unpack_charged(
    blob: impl Read,
    compression: Compression,
    dest: &Path,
    budget: Budget,
    room: &dyn Room,
    stop: &AtomicBool,
    charged: &mut u64,
) -> Result<Unpacked, UnpackError> {
    let decoded: Box<dyn Read> = match compression {
        Compression::None => Box::new(blob),
        // Every member, as other runtimes read a layer (Go's gzip reader
        // is multistream): the diff_id covers them all.
        Compression::Gzip => Box::new(flate2::read::MultiGzDecoder::new(blob)),
    };
    let mut counted = Counted {
        inner: decoded,
        hash: sha2::Sha256::new(),
        read: 0,
        limit: budget.bytes,
        stop,
    };
    let root = rustix::fs::open(
        dest,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    let mut bytes = 0u64;
    let mut entries = 0u64;
    {
        let mut archive = tar::Archive::new(&mut counted);
        for entry in archive.entries().map_err(too_large_or_io)? {
            if stop.load(Ordering::Relaxed) {
                return Err(UnpackError::Stopped);
            }
            let mut entry = entry.map_err(too_large_or_io)?;
            entries += 1;
            if entries > budget.entries {
                return Err(UnpackError::TooLarge(format!(
                    "more than {} entries",
                    budget.entries
                )));
            }
            // A pax global header (`git archive` writes one) names no
            // file: its settings are not applied.
            if entry.header().entry_type() == tar::EntryType::XGlobalHeader {
                continue;
            }
            // Every entry costs the store its inode and a block, whatever
            // it is (a million empty directories are not free).
            *charged += BLOCK;
            if !room.take(BLOCK) {
                return Err(UnpackError::StoreFull);
            }
            let path = entry.path().map_err(too_large_or_io)?.into_owned();
            let Some((parent, name)) = split(&path)? else {
                continue; // `.` itself
            };
            let dir = walk(&root, &parent)?;
            if budget.whiteouts && name == OPAQUE {
                set_opaque(&dir)?;
                continue;
            }
            if let Some(hidden) = name.strip_prefix(WHITEOUT_PREFIX)
                && budget.whiteouts
            {
                check_name(hidden, &path)?;
                clear(&dir, hidden)?;
                rustix::fs::mknodat(&dir, hidden, FileType::CharacterDevice, Mode::empty(), 0)?;
                continue;
            }
            let header = entry.header();
            let mode = Mode::from_raw_mode(header.mode().map_err(too_large_or_io)? & 0o1777);
            let mtime = header.mtime().unwrap_or(0);
            let kind = header.entry_type();
            match kind {
                tar::EntryType::Directory => {
                    match rustix::fs::statat(&dir, name.as_str(), AtFlags::SYMLINK_NOFOLLOW) {
                        Ok(st) if FileType::from_raw_mode(st.st_mode) == FileType::Directory => {}
                        Ok(_) => {
                            clear(&dir, &name)?;
                            rustix::fs::mkdirat(&dir, name.as_str(), mode)?;
                        }
                        Err(_) => rustix::fs::mkdirat(&dir, name.as_str(), mode)?,
                    }
                    // Umask-free, and permissions as the layer says.
                    rustix::fs::chmodat(&dir, name.as_str(), mode, AtFlags::empty())?;
                }
                tar::EntryType::Regular | tar::EntryType::Continuous => {
                    // Its size as the header says (what the copy below
                    // reads at most), taken before a byte is written; a
                    // size the stream cannot hold is not taken (taking it
                    // would evict images for nothing).
                    let size = entry.size();
                    if bytes.saturating_add(size) > budget.bytes {
                        return Err(UnpackError::TooLarge(format!(
                            "more than {} bytes uncompressed",
                            budget.bytes
                        )));
                    }
                    // In whole blocks, as the disk holds it.
                    let blocks = size.div_ceil(BLOCK) * BLOCK;
                    *charged += blocks;
                    if !room.take(blocks) {
                        return Err(UnpackError::StoreFull);
                    }
                    clear(&dir, &name)?;
                    let f = rustix::fs::openat(
                        &dir,
                        name.as_str(),
                        OFlags::WRONLY
                            | OFlags::CREATE
                            | OFlags::EXCL
                            | OFlags::NOFOLLOW
                            | OFlags::CLOEXEC,
                        Mode::from_raw_mode(0o600),
                    )?;
                    let mut file = std::fs::File::from(f);
                    let n = io::copy(&mut entry, &mut file).map_err(too_large_or_io)?;
                    if n != size {
                        return Err(hostile(&path, "a file shorter than its header says"));
                    }
                    bytes += n;
                    rustix::fs::fchmod(&file, mode)?;
                }
                tar::EntryType::Symlink => {
                    let target = entry
                        .link_name()
                        .map_err(too_large_or_io)?
                        .ok_or_else(|| hostile(&path, "a symbolic link without a target"))?;
                    clear(&dir, &name)?;
                    rustix::fs::symlinkat(target.as_ref(), &dir, name.as_str())?;
                }
                tar::EntryType::Link => {
                    let target = entry
                        .link_name()
                        .map_err(too_large_or_io)?
                        .ok_or_else(|| hostile(&path, "a hard link without a target"))?
                        .into_owned();
                    let Some((tparent, tname)) = split(&target)? else {
                        return Err(hostile(&path, "a hard link to the layer's root"));
                    };
                    let tdir = walk(&root, &tparent)?;
                    let st = rustix::fs::statat(&tdir, tname.as_str(), AtFlags::SYMLINK_NOFOLLOW)
                        .map_err(|_| {
                        hostile(&path, "a hard link to nothing earlier in its layer")
                    })?;
                    if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile {
                        return Err(hostile(
                            &path,
                            "a hard link to something not a regular file",
                        ));
                    }
                    clear(&dir, &name)?;
                    rustix::fs::linkat(
                        &tdir,
                        tname.as_str(),
                        &dir,
                        name.as_str(),
                        AtFlags::empty(),
                    )?;
                    continue; // times and mode are the target's
                }
                other => {
                    return Err(hostile(
                        &path,
                        &format!("an entry of type {other:?} (only files, directories and links)"),
                    ));
                }
            }
            let t = rustix::fs::Timespec {
                tv_sec: i64::try_from(mtime).unwrap_or(0),
                tv_nsec: 0,
            };
            let times = Timestamps {
                last_access: t,
                last_modification: t,
            };
            // A time the filesystem refuses is not worth refusing a layer.
            let _ = rustix::fs::utimensat(&dir, name.as_str(), &times, AtFlags::SYMLINK_NOFOLLOW);
        }
    }
    // The rest of the stream (the end-of-archive blocks and any padding)
    // is part of the diff_id.
    io::copy(&mut counted, &mut io::sink()).map_err(too_large_or_io)?;
    Ok(Unpacked {
        diff_id: counted.hash.finalize().into(),
        bytes: *charged,
        entries,
    })
}

impl From<rustix::io::Errno> for UnpackError {
    fn from(e: rustix::io::Errno) -> UnpackError {
        UnpackError::Io(e.into())
    }
}

fn hostile(path: &Path, what: &str) -> UnpackError {
    UnpackError::Hostile(format!("{}: {what}", path.display()))
}

fn too_large_or_io(e: io::Error) -> UnpackError {
    if e.kind() == io::ErrorKind::FileTooLarge {
        UnpackError::TooLarge(e.to_string())
    } else {
        UnpackError::Io(e)
    }
}

/// A name a whiteout may hide: one normal component.
fn check_name(name: &str, path: &Path) -> Result<(), UnpackError> {
    if name.is_empty() || name == "." || name == ".." || name.contains('/') {
        return Err(hostile(path, "a whiteout of no single name"));
    }
    Ok(())
}

/// A path's parent components and last name; `None` for the root itself.
/// Absolute paths, `..` and more than [`MAX_PATH_DEPTH`] components
/// refuse the layer.
fn split(path: &Path) -> Result<Option<(Vec<String>, String)>, UnpackError> {
    let mut parts = Vec::new();
    for c in path.components() {
        match c {
            Component::Normal(n) => {
                let n = n
                    .to_str()
                    .ok_or_else(|| hostile(path, "a name that is not UTF-8"))?;
                if parts.len() == MAX_PATH_DEPTH {
                    // Its first components: the whole would be kilobytes.
                    let shown: std::path::PathBuf = path.components().take(8).collect();
                    return Err(UnpackError::Hostile(format!(
                        "{}/...: a path deeper than {MAX_PATH_DEPTH} components",
                        shown.display()
                    )));
                }
                parts.push(n.to_owned());
            }
            Component::CurDir => {}
            Component::RootDir | Component::Prefix(_) => {
                return Err(hostile(path, "an absolute path"));
            }
            Component::ParentDir => return Err(hostile(path, "a `..` component")),
        }
    }
    Ok(parts.pop().map(|last| (parts, last)))
}

/// Open (creating as needed, mode 0755) the directory `parts` below
/// `root`, never through a symbolic link.
fn walk(root: &OwnedFd, parts: &[String]) -> Result<OwnedFd, UnpackError> {
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let mut dir = rustix::fs::openat(root, ".", flags, Mode::empty())?;
    for p in parts {
        match rustix::fs::mkdirat(&dir, p.as_str(), Mode::from_raw_mode(0o755)) {
            Ok(()) | Err(rustix::io::Errno::EXIST) => {}
            Err(e) => return Err(e.into()),
        }
        dir = rustix::fs::openat(&dir, p.as_str(), flags, Mode::empty()).map_err(|e| {
            if e == rustix::io::Errno::LOOP || e == rustix::io::Errno::NOTDIR {
                UnpackError::Hostile(format!(
                    "{}: a path through a symbolic link or a file",
                    parts.join("/")
                ))
            } else {
                e.into()
            }
        })?;
    }
    Ok(dir)
}

/// Remove whatever `name` is in `dir` (a directory with its contents).
fn clear(dir: &OwnedFd, name: &str) -> Result<(), UnpackError> {
    clear_at(dir, name, 0)
}

/// Deepest directory nesting [`clear`] descends (a layer's own paths are
/// bounded by PATH_MAX; this only stops a runaway).
const MAX_DEPTH: usize = 512;

fn empty_dir(dir: &OwnedFd, depth: usize) -> Result<(), UnpackError> {
    if depth > MAX_DEPTH {
        return Err(UnpackError::Hostile(
            "directories nested too deep".to_owned(),
        ));
    }
    let mut names = Vec::new();
    let it = rustix::fs::Dir::read_from(dir)?;
    for e in it {
        let e = e?;
        let n = e.file_name().to_bytes();
        if n != b"." && n != b".." {
            names.push(String::from_utf8_lossy(n).into_owned());
        }
    }
    for n in names {
        clear_at(dir, &n, depth + 1)?;
    }
    Ok(())
}

fn clear_at(dir: &OwnedFd, name: &str, depth: usize) -> Result<(), UnpackError> {
    match rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(st) if FileType::from_raw_mode(st.st_mode) == FileType::Directory => {
            let sub = rustix::fs::openat(
                dir,
                name,
                OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::empty(),
            )?;
            empty_dir(&sub, depth)?;
            rustix::fs::unlinkat(dir, name, AtFlags::REMOVEDIR)?;
        }
        Ok(_) => rustix::fs::unlinkat(dir, name, AtFlags::empty())?,
        Err(_) => {}
    }
    Ok(())
}

/// Mark `dir` opaque for overlayfs (it hides the layers below).
fn set_opaque(dir: &impl AsFd) -> Result<(), UnpackError> {
    rustix::fs::fsetxattr(
        dir,
        "trusted.overlay.opaque",
        b"y",
        rustix::fs::XattrFlags::empty(),
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layer(build: impl FnOnce(&mut tar::Builder<Vec<u8>>)) -> Vec<u8> {
        let mut b = tar::Builder::new(Vec::new());
        build(&mut b);
        b.into_inner().unwrap()
    }

    fn file(b: &mut tar::Builder<Vec<u8>>, path: &str, mode: u32, data: &[u8]) {
        let mut h = tar::Header::new_gnu();
        h.set_size(data.len() as u64);
        h.set_mode(mode);
        h.set_entry_type(tar::EntryType::Regular);
        // set_path refuses `..` and absolute paths: write the raw name.
        let name = &mut h.as_old_mut().name;
        name[..path.len()].copy_from_slice(path.as_bytes());
        h.set_cksum();
        b.append(&h, data).unwrap();
    }

    fn link(b: &mut tar::Builder<Vec<u8>>, kind: tar::EntryType, path: &str, target: &str) {
        let mut h = tar::Header::new_gnu();
        h.set_size(0);
        h.set_mode(0o777);
        h.set_entry_type(kind);
        h.as_old_mut().name[..path.len()].copy_from_slice(path.as_bytes());
        h.as_old_mut().linkname[..target.len()].copy_from_slice(target.as_bytes());
        h.set_cksum();
        b.append(&h, &[][..]).unwrap();
    }

    const BUDGET: Budget = Budget {
        bytes: 1 << 20,
        entries: 100,
        whiteouts: true,
    };

    fn run(bytes: &[u8]) -> (tempfile::TempDir, Result<Unpacked, UnpackError>) {
        let d = tempfile::tempdir().unwrap();
        let r = unpack(
            bytes,
            Compression::None,
            d.path(),
            BUDGET,
            &AtomicI64::new(1 << 30),
            &AtomicBool::new(false),
        );
        (d, r)
    }

    #[test]
    fn files_links_and_whiteouts_unpack() {
        let t = layer(|b| {
            file(b, "usr/bin/tool", 0o4755, b"#!/bin/sh\n");
            link(b, tar::EntryType::Symlink, "bin", "usr/bin");
            link(b, tar::EntryType::Link, "usr/bin/again", "usr/bin/tool");
            file(b, "etc/.wh.gone", 0o644, b"");
            file(b, "opt/.wh..wh..opq", 0o644, b"");
        });
        let (d, r) = run(&t);
        let u = r.unwrap();
        let p = d.path();
        use std::os::unix::fs::{FileTypeExt as _, MetadataExt as _};
        let m = std::fs::metadata(p.join("usr/bin/tool")).unwrap();
        assert_eq!(m.mode() & 0o7777, 0o755, "setuid dropped");
        assert_eq!(m.nlink(), 2);
        assert_eq!(
            std::fs::read_link(p.join("bin")).unwrap(),
            Path::new("usr/bin")
        );
        let w = std::fs::symlink_metadata(p.join("etc/gone")).unwrap();
        assert!(w.file_type().is_char_device() && w.rdev() == 0);
        // Five entries, and the file's 10 bytes in a block of their own.
        assert_eq!(u.bytes, 5 * BLOCK + BLOCK);
        let mut h = sha2::Sha256::new();
        h.update(&t);
        assert_eq!(u.diff_id, <[u8; 32]>::from(h.finalize()));
    }

    #[test]
    fn room_is_taken_before_a_file_is_written_and_given_back_on_failure() {
        let t = layer(|b| {
            file(b, "a", 0o644, &[1; 60]);
            file(b, "b", 0o644, &[2; 60]);
        });
        let d = tempfile::tempdir().unwrap();
        let room = AtomicI64::new(100);
        let r = unpack(
            &t[..],
            Compression::None,
            d.path(),
            BUDGET,
            &room,
            &AtomicBool::new(false),
        );
        assert!(matches!(r, Err(UnpackError::StoreFull)), "{r:?}");
        assert_eq!(room.load(Ordering::SeqCst), 100);
        assert!(!d.path().join("b").exists(), "written past the room");
    }

    #[test]
    fn hostile_entries_refuse_the_layer_and_write_nothing_outside() {
        let outside = tempfile::tempdir().unwrap();
        let o = outside.path().display().to_string();
        let cases: Vec<(&str, Vec<u8>)> = vec![
            ("dotdot", layer(|b| file(b, "../escape", 0o644, b"x"))),
            (
                "absolute",
                layer(|b| file(b, &format!("{o}/abs"), 0o644, b"x")),
            ),
            (
                "through a symlink",
                layer(|b| {
                    link(b, tar::EntryType::Symlink, "out", &o);
                    file(b, "out/planted", 0o644, b"x");
                }),
            ),
            (
                "hard link out",
                layer(|b| link(b, tar::EntryType::Link, "h", &format!("{o}/x"))),
            ),
            (
                "device",
                layer(|b| {
                    let mut h = tar::Header::new_gnu();
                    h.set_path("dev/sda").unwrap();
                    h.set_size(0);
                    h.set_entry_type(tar::EntryType::Block);
                    h.set_cksum();
                    b.append(&h, &[][..]).unwrap();
                }),
            ),
            (
                "bomb",
                layer(|b| file(b, "big", 0o644, &vec![0u8; 2 << 20])),
            ),
            (
                "entries",
                layer(|b| {
                    for i in 0..200 {
                        file(b, &format!("f{i}"), 0o644, b"");
                    }
                }),
            ),
        ];
        std::fs::write(outside.path().join("x"), b"target").unwrap();
        for (what, t) in cases {
            let (_d, r) = run(&t);
            assert!(r.is_err(), "{what} was unpacked");
        }
        let left: Vec<_> = std::fs::read_dir(outside.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(left, vec![std::ffi::OsString::from("x")]);
    }

    /// A path of `depth` components (GNU long names past 100 bytes).
    fn deep(depth: usize) -> Vec<u8> {
        let path = vec!["d"; depth].join("/");
        let mut b = tar::Builder::new(Vec::new());
        let mut h = tar::Header::new_gnu();
        h.set_size(1);
        h.set_mode(0o644);
        h.set_entry_type(tar::EntryType::Regular);
        b.append_data(&mut h, &path, &b"x"[..]).unwrap();
        b.into_inner().unwrap()
    }

    /// Guards the depth bound: a path of `MAX_PATH_DEPTH` components
    /// unpacks, one more is refused as hostile before any of it is made.
    #[test]
    fn paths_deeper_than_the_bound_are_refused() {
        let (d, r) = run(&deep(MAX_PATH_DEPTH));
        r.unwrap();
        let mut p = d.path().to_path_buf();
        p.extend(vec!["d"; MAX_PATH_DEPTH]);
        assert_eq!(std::fs::read(p).unwrap(), b"x");
        let (d, r) = run(&deep(MAX_PATH_DEPTH + 1));
        let Err(UnpackError::Hostile(why)) = r else {
            panic!("{r:?}")
        };
        assert!(why.contains("a path deeper than 128 components"), "{why}");
        assert_eq!(std::fs::read_dir(d.path()).unwrap().count(), 0);
    }

    /// Sets `stop` once `after` bytes have been read from it.
    struct StopAfter<'a> {
        inner: &'a [u8],
        after: usize,
        stop: &'a AtomicBool,
    }

    impl Read for StopAfter<'_> {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            if self.after == 0 {
                self.stop.store(true, Ordering::SeqCst);
            }
            let most = buf.len().min(self.after.max(1));
            let n = self.inner.read(&mut buf[..most])?;
            self.after = self.after.saturating_sub(n);
            Ok(n)
        }
    }

    /// Guards the unpack's stop: told to stop part way (as a pull past
    /// its timeout tells it), it fails with `Stopped` before the next
    /// entry, having given back every byte it took; told before it starts,
    /// it makes nothing.
    #[test]
    fn a_stopped_unpack_stops_and_gives_back_what_it_took() {
        let t = layer(|b| {
            for i in 0..50 {
                file(b, &format!("f{i}"), 0o644, &[7; 100]);
            }
        });
        let d = tempfile::tempdir().unwrap();
        let room = AtomicI64::new(1 << 20);
        let stop = AtomicBool::new(false);
        let blob = StopAfter {
            inner: &t,
            after: 10 * 1024,
            stop: &stop,
        };
        let r = unpack(blob, Compression::None, d.path(), BUDGET, &room, &stop);
        assert!(matches!(r, Err(UnpackError::Stopped)), "{r:?}");
        assert_eq!(room.load(Ordering::SeqCst), 1 << 20, "charges kept");
        let made = std::fs::read_dir(d.path()).unwrap().count();
        assert!((1..50).contains(&made), "{made} files made");
        let d = tempfile::tempdir().unwrap();
        let stop = AtomicBool::new(true);
        let r = unpack(&t[..], Compression::None, d.path(), BUDGET, &room, &stop);
        assert!(matches!(r, Err(UnpackError::Stopped)), "{r:?}");
        assert_eq!(room.load(Ordering::SeqCst), 1 << 20);
        assert_eq!(std::fs::read_dir(d.path()).unwrap().count(), 0);
    }
}
