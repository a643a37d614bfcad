//! File operations (docs/protocol.md, "Filesystem") over a root that is
//! either the whole host (`/`, reference-compatible) or a tenant directory
//! confined with cap-std (`openat2(RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS)`).
//!
//! One entry point, [`run`], executes an [`FsOp`] against an [`FsRoot`]; it
//! runs in the tenant's worker (the default) or on the gateway's blocking
//! pool, and both sides use the same code. Reads and writes of file contents
//! only *open* the file there: the opened file comes back ([`FsDone::File`])
//! and the bytes move in the gateway.
//!
//! Invariants: every path is absolute and lexically normalised first; in a
//! confined root, nothing outside it is ever opened (`..`, absolute paths
//! outside, symlinks pointing out and symlinks swapped mid-call all fail),
//! files are opened `O_NONBLOCK` and checked to be regular (a planted FIFO
//! cannot hang a thread). Everything here blocks: callers pick the thread.

use std::io::{self, Read as _, Write as _};
use std::path::{Component, Path, PathBuf};
use std::time::SystemTime;

use cap_std::fs::{Dir, OpenOptions as CapOpenOptions, OpenOptionsExt as _};
use serde::{Deserialize, Serialize};

use crate::error::GatewayError;
use crate::protocol::fs::{
    CopyParams, CreateDirectoryParams, DirectoryEntry, MetadataResponse, PathParams,
    ReadDirectoryResponse, RemoveParams, WalkEntry, WalkError, WalkKind, WalkParams, WalkResponse,
};
use crate::protocol::path::WirePath;
use crate::protocol::revision::Revision;

/// Why a file operation failed, classified as the reference's
/// `map_fs_error` does (it crosses the worker link as is).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
pub enum FsError {
    /// The path does not exist: -32004.
    #[error("{0}")]
    NotFound(String),
    /// Refused (permission, not a regular file, outside the root): -32600.
    #[error("{0}")]
    InvalidRequest(String),
    /// The request itself is malformed (a relative path): -32602.
    #[error("{0}")]
    InvalidParams(String),
    /// Any other OS error: -32603 with its text.
    #[error("{0}")]
    Io(String),
    /// A path outside the tenant root: "not found" to a client (-32004),
    /// while the message says why.
    #[error("path `{0}` is outside the tenant root")]
    OutsideRoot(String),
    /// A file operation on a directory or a special file. The revisions
    /// word it differently (see [`FsError::into_gateway_error`]).
    #[error("path `{path}` is not a file")]
    NotAFile { path: String, is_dir: bool },
    /// `followSymlinks: false` and the path goes through a symbolic link.
    #[error("path contains a symbolic link")]
    SymlinkInPath,
}

impl FsError {
    /// The reference's `map_fs_error`: NotFound → -32004, InvalidInput and
    /// PermissionDenied → -32600, anything else → -32603; the message is the
    /// io::Error's Display text.
    pub fn from_io(e: &io::Error) -> FsError {
        let text = e.to_string();
        match e.kind() {
            io::ErrorKind::NotFound => FsError::NotFound(text),
            io::ErrorKind::InvalidInput | io::ErrorKind::PermissionDenied => {
                FsError::InvalidRequest(text)
            }
            _ => FsError::Io(text),
        }
    }
}

impl FsError {
    /// As a call error in a session of `revision`: 0.169.0 says a
    /// directory or special file "is not a file" (-32600), 0.130.0 gave the
    /// OS error (-32603 for a directory, -32600 for a special file).
    pub fn into_gateway_error(self, revision: Revision) -> GatewayError {
        match self {
            FsError::NotAFile { path, is_dir } => match (revision, is_dir) {
                (Revision::Nov2026, _) => {
                    GatewayError::InvalidRequest(format!("path `{path}` is not a file"))
                }
                (Revision::May2026, true) => {
                    GatewayError::Internal(io::Error::from_raw_os_error(libc::EISDIR).to_string())
                }
                (Revision::May2026, false) => {
                    GatewayError::InvalidRequest("not a regular file".to_owned())
                }
            },
            other => other.into(),
        }
    }
}

impl From<FsError> for GatewayError {
    fn from(e: FsError) -> GatewayError {
        match e {
            FsError::NotFound(m) => GatewayError::NotFound(m),
            FsError::InvalidRequest(m) => GatewayError::InvalidRequest(m),
            FsError::InvalidParams(m) => GatewayError::InvalidParams(m),
            FsError::Io(m) => GatewayError::Internal(m),
            outside @ FsError::OutsideRoot(_) => GatewayError::OutsideRoot(outside.to_string()),
            not_a_file @ FsError::NotAFile { .. } => {
                not_a_file.into_gateway_error(Revision::May2026)
            }
            symlink @ FsError::SymlinkInPath => GatewayError::InvalidRequest(symlink.to_string()),
        }
    }
}

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

/// cap-std refuses a resolution that would leave the root with this error
/// (it has no error type of its own for it).
fn is_escape(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::PermissionDenied
        && e.to_string() == "a path led outside of the filesystem"
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

/// Resolve `path`; with `follow: Some(false)`, refuse one that goes
/// through a symbolic link (the last component included).
fn resolve_following<'r>(
    root: &'r FsRoot,
    path: &WirePath,
    follow: Option<bool>,
) -> Result<Target<'r>, Failed> {
    let target = root.resolve(path.as_str())?;
    if follow == Some(false) && target.has_symlink()? {
        return Err(FsError::SymlinkInPath.into());
    }
    Ok(target)
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

/// An operation's failure before classification.
enum Failed {
    Fs(FsError),
    Io(io::Error),
}

impl From<io::Error> for Failed {
    fn from(e: io::Error) -> Failed {
        Failed::Io(e)
    }
}

impl From<FsError> for Failed {
    fn from(e: FsError) -> Failed {
        Failed::Fs(e)
    }
}

/// Where fs paths resolve, and as whom.
pub struct FsRoot {
    kind: RootKind,
    /// (uid, gid) file operations run as (`setfsuid`/`setfsgid` on the
    /// blocking thread for the duration of one operation): the kernel then
    /// checks the tenant's own permissions and new files are the tenant's.
    creds: Option<(u32, u32)>,
}

enum RootKind {
    /// The whole host: paths are used as given (the reference's behaviour).
    Host,
    /// Paths must lie inside `path`; all access goes through `dir`.
    Confined { path: PathBuf, dir: Dir },
}

impl std::fmt::Debug for FsRoot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.kind {
            RootKind::Host => f.write_str("FsRoot::Host"),
            RootKind::Confined { path, .. } => write!(f, "FsRoot::Confined({})", path.display()),
        }
    }
}

impl FsRoot {
    /// The whole host.
    pub fn host() -> FsRoot {
        FsRoot {
            kind: RootKind::Host,
            creds: None,
        }
    }

    /// Open a confined root at `path` (which must exist and be a directory).
    pub fn confined(path: &Path) -> io::Result<FsRoot> {
        let dir = Dir::open_ambient_dir(path, cap_std::ambient_authority())?;
        Ok(FsRoot {
            kind: RootKind::Confined {
                path: path.to_path_buf(),
                dir,
            },
            creds: None,
        })
    }

    /// A confined root reached through `tree` (a directory descriptor,
    /// such as a detached idmapped mount of `path`).
    pub fn confined_at(path: &Path, tree: std::os::fd::OwnedFd) -> FsRoot {
        FsRoot {
            kind: RootKind::Confined {
                path: path.to_path_buf(),
                dir: Dir::from_std_file(std::fs::File::from(tree)),
            },
            creds: None,
        }
    }

    /// Run file operations as `creds` (uid, gid).
    pub fn with_creds(mut self, creds: Option<(u32, u32)>) -> FsRoot {
        self.creds = creds;
        self
    }

    /// The root's path (`/` for the host).
    pub fn path(&self) -> &Path {
        match &self.kind {
            RootKind::Host => Path::new("/"),
            RootKind::Confined { path, .. } => path,
        }
    }

    /// Check a working directory for a process: absolute, inside the root,
    /// and (when confined) an existing directory reached without escaping.
    pub fn check_cwd(&self, cwd: &str) -> Result<(), FsError> {
        match &self.kind {
            RootKind::Host => Ok(()),
            RootKind::Confined { .. } => {
                // A missing or non-directory cwd fails as the reference's
                // spawn does: -32603 with the OS text.
                let meta = self
                    .resolve(cwd)?
                    .metadata()
                    .map_err(|e| FsError::Io(e.to_string()))?;
                if meta.is_dir() {
                    Ok(())
                } else {
                    Err(FsError::Io(
                        io::Error::from_raw_os_error(libc::ENOTDIR).to_string(),
                    ))
                }
            }
        }
    }

    fn resolve(&self, raw: &str) -> Result<Target<'_>, FsError> {
        let path = Path::new(raw);
        if !path.is_absolute() {
            return Err(FsError::InvalidParams(
                "AbsolutePathBuf deserialized without a base path".to_owned(),
            ));
        }
        let norm = normalize(path);
        match &self.kind {
            RootKind::Host => Ok(Target::Host(norm)),
            RootKind::Confined { path: root, dir } => {
                let rel = norm
                    .strip_prefix(root)
                    .map_err(|_| FsError::OutsideRoot(raw.to_owned()))?;
                let rel = if rel.as_os_str().is_empty() {
                    PathBuf::from(".")
                } else {
                    rel.to_path_buf()
                };
                Ok(Target::Confined { dir, rel, norm })
            }
        }
    }
}

/// Lexical normalisation: `.` dropped, `..` pops (never above `/`).
pub fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::from("/");
    for c in path.components() {
        match c {
            Component::Normal(p) => out.push(p),
            Component::ParentDir => {
                out.pop();
            }
            Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
        }
    }
    out
}

/// A resolved path: a host path, or a path relative to a confined `Dir`.
enum Target<'a> {
    Host(PathBuf),
    Confined {
        dir: &'a Dir,
        rel: PathBuf,
        /// The normalised absolute path, for messages and containment checks.
        norm: PathBuf,
    },
}

impl<'a> Target<'a> {
    fn abs(&self) -> &Path {
        match self {
            Target::Host(p) => p,
            Target::Confined { norm, .. } => norm,
        }
    }

    fn join(&self, name: &std::ffi::OsStr) -> Target<'a> {
        match self {
            Target::Host(p) => Target::Host(p.join(name)),
            Target::Confined { dir, rel, norm } => Target::Confined {
                dir,
                rel: rel.join(name),
                norm: norm.join(name),
            },
        }
    }

    /// True if any component below the root (the last included) is a
    /// symbolic link.
    fn has_symlink(&self) -> io::Result<bool> {
        let (base, rel): (Option<&Dir>, &Path) = match self {
            Target::Host(p) => (None, p),
            Target::Confined { dir, rel, .. } => (Some(dir), rel),
        };
        let mut prefix = PathBuf::new();
        for c in rel.components() {
            prefix.push(c);
            let is_link = match base {
                None => std::fs::symlink_metadata(&prefix).map(|m| m.file_type().is_symlink()),
                Some(d) => d
                    .symlink_metadata(&prefix)
                    .map(|m| m.file_type().is_symlink()),
            };
            match is_link {
                Ok(true) => return Ok(true),
                Ok(false) => {}
                // A missing component: the operation reports it.
                Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
                Err(e) => return Err(e),
            }
        }
        Ok(false)
    }

    fn canonicalize(&self) -> io::Result<PathBuf> {
        match self {
            Target::Host(p) => std::fs::canonicalize(p),
            Target::Confined { dir, rel, norm } => {
                let real = dir.canonicalize(rel)?;
                // The root's own path, plus the resolved path beneath it.
                let root = norm
                    .ancestors()
                    .nth(rel.components().filter(|c| *c != Component::CurDir).count())
                    .unwrap_or(Path::new("/"));
                Ok(normalize(&root.join(real)))
            }
        }
    }

    fn metadata(&self) -> io::Result<Meta> {
        match self {
            Target::Host(p) => std::fs::metadata(p).map(Meta::Std),
            Target::Confined { dir, rel, .. } => dir.metadata(rel).map(Meta::Cap),
        }
    }

    fn symlink_metadata(&self) -> io::Result<Meta> {
        match self {
            Target::Host(p) => std::fs::symlink_metadata(p).map(Meta::Std),
            Target::Confined { dir, rel, .. } => dir.symlink_metadata(rel).map(Meta::Cap),
        }
    }

    /// Open for reading: non-blocking (FIFOs cannot hang us), regular files only.
    fn open_read(&self) -> io::Result<std::fs::File> {
        let file = match self {
            Target::Host(p) => {
                use std::os::unix::fs::OpenOptionsExt as _;
                std::fs::OpenOptions::new()
                    .read(true)
                    .custom_flags(libc::O_NONBLOCK)
                    .open(p)?
            }
            Target::Confined { dir, rel, .. } => {
                let mut o = CapOpenOptions::new();
                o.read(true).custom_flags(libc::O_NONBLOCK);
                dir.open_with(rel, &o)?.into_std()
            }
        };
        let meta = file.metadata()?;
        if meta.is_dir() {
            return Err(io::Error::from_raw_os_error(libc::EISDIR));
        }
        if !meta.is_file() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "not a regular file",
            ));
        }
        Ok(file)
    }

    fn open_write(&self) -> io::Result<std::fs::File> {
        let file = match self {
            Target::Host(p) => {
                use std::os::unix::fs::OpenOptionsExt as _;
                std::fs::OpenOptions::new()
                    .write(true)
                    .create(true)
                    .truncate(true)
                    .custom_flags(libc::O_NONBLOCK)
                    .open(p)?
            }
            Target::Confined { dir, rel, .. } => {
                let mut o = CapOpenOptions::new();
                o.write(true)
                    .create(true)
                    .truncate(true)
                    .custom_flags(libc::O_NONBLOCK);
                dir.open_with(rel, &o)?.into_std()
            }
        };
        if !file.metadata()?.is_file() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "not a regular file",
            ));
        }
        Ok(file)
    }

    fn create_dir(&self, recursive: bool) -> io::Result<()> {
        match (self, recursive) {
            (Target::Host(p), true) => std::fs::create_dir_all(p),
            (Target::Host(p), false) => std::fs::create_dir(p),
            (Target::Confined { dir, rel, .. }, true) => dir.create_dir_all(rel),
            (Target::Confined { dir, rel, .. }, false) => dir.create_dir(rel),
        }
    }

    /// Entry names of a directory.
    fn list(&self) -> io::Result<Vec<std::ffi::OsString>> {
        match self {
            Target::Host(p) => std::fs::read_dir(p)?
                .map(|e| e.map(|e| e.file_name()))
                .collect(),
            Target::Confined { dir, rel, .. } => dir
                .read_dir(rel)?
                .map(|e| e.map(|e| e.file_name()))
                .collect(),
        }
    }

    fn remove_file(&self) -> io::Result<()> {
        match self {
            Target::Host(p) => std::fs::remove_file(p),
            Target::Confined { dir, rel, .. } => dir.remove_file(rel),
        }
    }

    fn remove_dir(&self, recursive: bool) -> io::Result<()> {
        match (self, recursive) {
            (Target::Host(p), true) => std::fs::remove_dir_all(p),
            (Target::Host(p), false) => std::fs::remove_dir(p),
            (Target::Confined { dir, rel, .. }, true) => dir.remove_dir_all(rel),
            (Target::Confined { dir, rel, .. }, false) => dir.remove_dir(rel),
        }
    }

    fn read_link(&self) -> io::Result<PathBuf> {
        match self {
            Target::Host(p) => std::fs::read_link(p),
            // The link's text, not resolved: it is copied verbatim.
            Target::Confined { dir, rel, .. } => dir.read_link_contents(rel),
        }
    }

    fn symlink(&self, original: &Path) -> io::Result<()> {
        match self {
            Target::Host(p) => std::os::unix::fs::symlink(original, p),
            Target::Confined { dir, rel, .. } => dir.symlink_contents(original, rel),
        }
    }
}

enum Meta {
    Std(std::fs::Metadata),
    Cap(cap_std::fs::Metadata),
}

impl Meta {
    fn is_dir(&self) -> bool {
        match self {
            Meta::Std(m) => m.is_dir(),
            Meta::Cap(m) => m.is_dir(),
        }
    }
    fn is_file(&self) -> bool {
        match self {
            Meta::Std(m) => m.is_file(),
            Meta::Cap(m) => m.is_file(),
        }
    }
    fn is_symlink(&self) -> bool {
        match self {
            Meta::Std(m) => m.file_type().is_symlink(),
            Meta::Cap(m) => m.file_type().is_symlink(),
        }
    }
    fn len(&self) -> u64 {
        match self {
            Meta::Std(m) => m.len(),
            Meta::Cap(m) => m.len(),
        }
    }
    /// Device and inode: a directory's identity (walks visit each once).
    fn id(&self) -> (u64, u64) {
        use cap_std::fs::MetadataExt as _;
        use std::os::unix::fs::MetadataExt as _;
        match self {
            Meta::Std(m) => (m.dev(), m.ino()),
            Meta::Cap(m) => (m.dev(), m.ino()),
        }
    }
    fn created(&self) -> Option<SystemTime> {
        match self {
            Meta::Std(m) => m.created().ok(),
            Meta::Cap(m) => m.created().ok().map(cap_std::time::SystemTime::into_std),
        }
    }
    fn modified(&self) -> Option<SystemTime> {
        match self {
            Meta::Std(m) => m.modified().ok(),
            Meta::Cap(m) => m.modified().ok().map(cap_std::time::SystemTime::into_std),
        }
    }
}

fn millis(t: Option<SystemTime>) -> i64 {
    t.and_then(|t| t.duration_since(SystemTime::UNIX_EPOCH).ok())
        .and_then(|d| i64::try_from(d.as_millis()).ok())
        .unwrap_or(0)
}

/// The blocking thread's filesystem uid/gid switched to a tenant's for one
/// operation, and back to the gateway's when dropped. `setfsuid` is per
/// thread, and a non-zero fsuid drops the thread's file capabilities
/// (`CAP_DAC_OVERRIDE`...), so the kernel checks the tenant's permissions.
struct FsCreds {
    uid: libc::uid_t,
    gid: libc::gid_t,
}

impl FsCreds {
    #[allow(unsafe_code)]
    fn assume((uid, gid): (u32, u32)) -> FsCreds {
        // SAFETY: setfsgid/setfsuid affect only this thread's credentials and
        // return the previous ids; they cannot fail in a way that matters
        // here (an unknown id is still applied).
        unsafe {
            let gid0 = libc::setfsgid(gid) as libc::gid_t;
            let uid0 = libc::setfsuid(uid) as libc::uid_t;
            FsCreds {
                uid: uid0,
                gid: gid0,
            }
        }
    }
}

impl Drop for FsCreds {
    #[allow(unsafe_code)]
    fn drop(&mut self) {
        // SAFETY: as in `assume`; restores the thread's previous ids.
        unsafe {
            libc::setfsuid(self.uid);
            libc::setfsgid(self.gid);
        }
    }
}

/// Read an opened file for `fs/readFile`, refusing one over `limit` bytes.
pub fn read_whole(mut file: std::fs::File, limit: u64) -> Result<Vec<u8>, FsError> {
    let too_large =
        || FsError::InvalidRequest(format!("file is too large to read: limit is {limit} bytes"));
    let len = file.metadata().map_err(|e| FsError::from_io(&e))?.len();
    if len > limit {
        return Err(too_large());
    }
    let mut data = Vec::with_capacity(usize::try_from(len).unwrap_or(0));
    std::io::Read::by_ref(&mut file)
        .take(limit + 1)
        .read_to_end(&mut data)
        .map_err(|e| FsError::from_io(&e))?;
    if data.len() as u64 > limit {
        return Err(too_large());
    }
    Ok(data)
}

/// Bytes read per step while encoding a file (a multiple of 3, so the
/// base64 of the steps concatenates).
const ENCODE_STEP_BYTES: usize = 3 * 256 * 1024;

/// The JSON `result` of `fs/readFile` for an opened file of `len` bytes,
/// base64-encoded as it is read: only one step of raw bytes is ever held
/// besides the result. It starts with [`crate::protocol::jsonrpc::ENVELOPE_GAP`] spaces
/// and has room for one more byte at the end: the response is built in
/// place around it. A file that grew past `len` since it was measured is
/// an error (the reply's bytes were reserved for `len`).
pub fn read_encoded(mut file: std::fs::File, len: u64) -> Result<String, FsError> {
    let gap = crate::protocol::jsonrpc::ENVELOPE_GAP;
    let capacity = usize::try_from(len.div_ceil(3) * 4 + 20)
        .unwrap_or(0)
        .saturating_add(gap + 1);
    let mut out = String::with_capacity(capacity);
    out.extend(std::iter::repeat_n(' ', gap));
    out.push_str(r#"{"dataBase64":""#);
    let mut buf = vec![0u8; ENCODE_STEP_BYTES];
    let mut total = 0u64;
    loop {
        // Fill the step completely (short reads happen) so only the last
        // step's base64 is padded.
        let mut filled = 0;
        while filled < buf.len() {
            match file.read(&mut buf[filled..]) {
                Ok(0) => break,
                Ok(n) => filled += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(FsError::from_io(&e)),
            }
        }
        total += filled as u64;
        if total > len {
            return Err(FsError::Io(
                "file grew while it was being read; read it again".to_owned(),
            ));
        }
        crate::protocol::base64_into(&buf[..filled], &mut out);
        if filled < buf.len() {
            break;
        }
    }
    out.push_str("\"}");
    Ok(out)
}

/// Write all of `data` to an opened file, mapping errors as `fs/writeFile`.
pub fn write_whole(mut file: &std::fs::File, data: &[u8]) -> Result<(), FsError> {
    file.write_all(data).map_err(|e| FsError::from_io(&e))
}

fn create_directory(root: &FsRoot, p: CreateDirectoryParams) -> Result<(), Failed> {
    Ok(resolve_following(root, &p.path, p.follow_symlinks)?.create_dir(p.recursive)?)
}

/// `fs/getMetadata`: `is*` follow symlinks except `isSymlink`; `size` is
/// the followed file's (a 0.130.0 session does not get it).
fn get_metadata(root: &FsRoot, p: PathParams) -> Result<MetadataResponse, Failed> {
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
fn canonicalize(root: &FsRoot, p: &PathParams) -> Result<String, Failed> {
    let target = root.resolve(p.path.as_str())?;
    Ok(target.canonicalize()?.display().to_string())
}

/// Most entries a walk returns and directories it reads, whatever a
/// client asks.
pub const MAX_WALK_ENTRIES: u64 = 100_000;

/// `fs/walk`: breadth first, entries sorted by name within a directory,
/// the root's entries at depth 0; directories below `maxDepth` are read,
/// `.hidden` ones listed but not read when pruning, symbolic links to
/// directories listed (and read once per directory) only when following,
/// other symbolic links and special files skipped.
fn walk(root: &FsRoot, p: WalkParams) -> Result<WalkResponse, Failed> {
    let o = p.options;
    // A zero depth lists the directory's own entries (as 0.169.0 does).
    if o.max_directories == 0 || o.max_entries == 0 {
        return Err(FsError::InvalidRequest(
            "filesystem walk limits must be greater than zero".to_owned(),
        )
        .into());
    }
    let (max_entries, max_dirs) = (
        o.max_entries.min(MAX_WALK_ENTRIES) as usize,
        o.max_directories.min(MAX_WALK_ENTRIES) as usize,
    );
    let start = root.resolve(p.path.as_str())?;
    let mut out = WalkResponse {
        entries: Vec::new(),
        errors: Vec::new(),
        truncated: false,
    };
    if !start.metadata()?.is_dir() {
        return Ok(out);
    }
    let mut seen = std::collections::HashSet::new();
    if let Ok(m) = start.metadata() {
        seen.insert(m.id());
    }
    let mut queue = std::collections::VecDeque::from([(start, 0u64)]);
    let mut dirs_read = 0usize;
    'walk: while let Some((dir, depth)) = queue.pop_front() {
        if dirs_read >= max_dirs {
            out.truncated = true;
            break;
        }
        dirs_read += 1;
        let mut names = match dir.list() {
            Ok(n) => n,
            Err(e) => {
                out.errors.push(WalkError {
                    path: dir.abs().display().to_string(),
                    message: e.to_string(),
                });
                continue;
            }
        };
        names.sort();
        for name in names {
            let child = dir.join(&name);
            let Ok(lmeta) = child.symlink_metadata() else {
                continue;
            };
            let kind = if lmeta.is_symlink() {
                match child.metadata() {
                    Ok(m) if m.is_dir() && o.follow_directory_symlinks => WalkKind::Directory,
                    _ => continue,
                }
            } else if lmeta.is_dir() {
                WalkKind::Directory
            } else if lmeta.is_file() {
                WalkKind::File
            } else {
                continue;
            };
            if out.entries.len() >= max_entries {
                out.truncated = true;
                break 'walk;
            }
            out.entries.push(WalkEntry {
                path: child.abs().display().to_string(),
                kind,
            });
            let hidden = name.to_string_lossy().starts_with('.');
            if kind == WalkKind::Directory
                && depth < o.max_depth
                && !(hidden && o.prune_hidden_directories)
                && child.metadata().is_ok_and(|m| seen.insert(m.id()))
            {
                queue.push_back((child, depth + 1));
            }
        }
    }
    Ok(out)
}

/// `fs/readDirectory`: readdir order; entries whose stat fails are skipped.
fn read_directory(root: &FsRoot, p: PathParams) -> Result<ReadDirectoryResponse, Failed> {
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
fn remove(root: &FsRoot, p: RemoveParams) -> Result<(), Failed> {
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

/// `fs/copy` with the reference's rules.
fn copy(root: &FsRoot, p: CopyParams) -> Result<(), Failed> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[allow(clippy::unwrap_used)]
    fn a_file_encoded_as_read_matches_serde_and_refuses_to_grow() {
        use std::io::Write as _;
        // Longer than one step, and not a multiple of 3.
        let data: Vec<u8> = (0..ENCODE_STEP_BYTES * 2 + 7).map(|i| i as u8).collect();
        let mut f = tempfile::tempfile().unwrap();
        f.write_all(&data).unwrap();
        let len = data.len() as u64;
        let reopen = |f: &std::fs::File| {
            let mut c = f.try_clone().unwrap();
            std::io::Seek::rewind(&mut c).unwrap();
            c
        };
        let expected = serde_json::to_string(&crate::protocol::fs::ReadFileResponse {
            data_base64: crate::protocol::ByteChunk(data),
        })
        .unwrap();
        let encoded = read_encoded(reopen(&f), len).unwrap();
        let gap = crate::protocol::jsonrpc::ENVELOPE_GAP;
        assert_eq!(encoded[..gap], " ".repeat(gap));
        assert_eq!(&encoded[gap..], expected);
        // Room for the response's closing brace without a reallocation.
        assert!(encoded.capacity() > encoded.len());
        // Measured one byte short: the file grew since.
        assert!(read_encoded(reopen(&f), len - 1).is_err());
    }

    #[test]
    fn io_errors_map_like_the_reference() {
        let e = FsError::from_io(&io::Error::from_raw_os_error(libc::ENOENT));
        assert_eq!(
            e,
            FsError::NotFound("No such file or directory (os error 2)".into())
        );
        assert_eq!(GatewayError::from(e).to_jsonrpc().code, -32004);
        let e = FsError::from_io(&io::Error::from_raw_os_error(libc::EACCES));
        assert_eq!(GatewayError::from(e).to_jsonrpc().code, -32600);
        let e = FsError::from_io(&io::Error::from_raw_os_error(libc::ENOTEMPTY));
        assert_eq!(e.to_string(), "Directory not empty (os error 39)");
        assert_eq!(GatewayError::from(e).to_jsonrpc().code, -32603);
    }

    #[test]
    fn normalize_is_lexical() {
        assert_eq!(
            normalize(Path::new("/a/b/../c/./d")),
            PathBuf::from("/a/c/d")
        );
        assert_eq!(normalize(Path::new("/../..")), PathBuf::from("/"));
    }

    #[test]
    fn confined_root_rejects_outside_paths() {
        let tmp = tempfile::tempdir().unwrap();
        let root = FsRoot::confined(tmp.path()).unwrap();
        let outside = format!("{}/../etc/passwd", tmp.path().display());
        let e = root.resolve(&outside).err().unwrap();
        assert!(matches!(e, FsError::OutsideRoot(_)), "{e:?}");
        let e = root.resolve("relative").err().unwrap();
        assert!(matches!(e, FsError::InvalidParams(_)), "{e:?}");
        assert!(root.resolve(&tmp.path().display().to_string()).is_ok());
    }
}
