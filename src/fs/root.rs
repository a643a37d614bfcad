//! The tenant root and path confinement: the one place that decides whether
//! a path may be reached, and the only code that touches the filesystem for
//! the operations (security-critical; meant to be reviewed on its own).
//!
//! What it guarantees, for a root made by [`FsRoot::confined`] or
//! [`FsRoot::confined_at`]:
//!
//! - A path is used only if it is absolute (a relative one is
//!   `InvalidParams`), and only after lexical normalisation ([`normalize`]:
//!   `.` dropped, `..` pops, never above `/`).
//! - The normalised path must lie at or below the root's path, compared
//!   component by component; anything else is `OutsideRoot` before any
//!   system call. What remains is a path *relative* to the root.
//! - Every access (`Target`) goes through the root's directory
//!   descriptor with cap-std, which resolves each component beneath it
//!   (`openat2(RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS)` where the kernel
//!   has it): `..` through a symlink, symlinks pointing out and symlinks
//!   swapped in mid-call all fail; `is_escape` recognises cap-std's refusal.
//! - An absolute symlink naming a path inside the root (`ln -s "$PWD/x"`)
//!   works: when cap-std refuses a path, it is expanded once ([`expand`]:
//!   each link read without following, an absolute target kept only if it
//!   lies under the root's path, then taken relative to the root) and the
//!   expansion is resolved by cap-std again. A link swapped between the
//!   two is resolved beneath the root or refused, never followed out.
//! - Files are opened `O_NONBLOCK` and checked to be regular (a planted
//!   FIFO cannot hang a thread; a directory or device is refused).
//! - `followSymlinks: false` refuses a path with a symbolic link in any
//!   component (`resolve_following`); confinement does not depend on it.
//! - A process's working directory must resolve, beneath the root, to an
//!   existing directory ([`FsRoot::check_cwd`]).
//!
//! [`FsRoot::host`] confines nothing: paths are used as given (the
//! reference's behaviour). Not here: the credentials an operation runs as
//! (`creds.rs`) and what each operation does (`run.rs` and its siblings).

use std::io;
use std::path::{Component, Path, PathBuf};

use cap_std::fs::{Dir, OpenOptions as CapOpenOptions, OpenOptionsExt as _};

use super::error::{Failed, FsError};
use super::meta::Meta;
use crate::protocol::path::WirePath;

/// Where fs paths resolve, and as whom.
pub struct FsRoot {
    kind: RootKind,
    /// (uid, gid) file operations run as (`setfsuid`/`setfsgid` on the
    /// blocking thread for the duration of one operation): the kernel then
    /// checks the tenant's own permissions and new files are the tenant's.
    pub(super) creds: Option<(u32, u32)>,
}

enum RootKind {
    /// The whole host: paths are used as given (the reference's behaviour).
    Host,
    /// Paths must lie inside `path`; all access goes through `dir`.
    /// Under an image (`image`: its `/`, as the tenant's processes see
    /// it), a path outside the root resolves beneath the image instead,
    /// where the mount is read-only.
    Confined {
        path: PathBuf,
        dir: Dir,
        image: Option<Dir>,
    },
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
                image: None,
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
                image: None,
            },
            creds: None,
        }
    }

    /// Paths outside the root resolve beneath `/` as this process sees it
    /// (a worker whose `/` is the tenant's image): the file API then sees
    /// what the tenant's processes see.
    pub fn with_image_root(mut self) -> io::Result<FsRoot> {
        if let RootKind::Confined { image, .. } = &mut self.kind {
            *image = Some(Dir::open_ambient_dir("/", cap_std::ambient_authority())?);
        }
        Ok(self)
    }

    /// A descriptor of the root directory as file operations reach it (its
    /// idmapped tree, a fork's overlay); none for the host.
    pub fn dir_fd(&self) -> Option<std::os::fd::OwnedFd> {
        match &self.kind {
            RootKind::Host => None,
            RootKind::Confined { dir, .. } => {
                use std::os::fd::AsFd as _;
                // Opened anew for reading (the root may be held `O_PATH`).
                rustix::fs::openat(
                    dir.as_fd(),
                    ".",
                    rustix::fs::OFlags::RDONLY
                        | rustix::fs::OFlags::DIRECTORY
                        | rustix::fs::OFlags::CLOEXEC,
                    rustix::fs::Mode::empty(),
                )
                .ok()
            }
        }
    }

    /// Who file operations run as (uid, gid), if set.
    pub fn creds(&self) -> Option<(u32, u32)> {
        self.creds
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
                let meta = self.resolve(cwd)?.metadata().map_err(|e| {
                    if is_escape(&e) {
                        FsError::OutsideRoot(cwd.to_owned())
                    } else {
                        FsError::Io(super::error::os_text(&e))
                    }
                })?;
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

    pub(super) fn resolve(&self, raw: &str) -> Result<Target<'_>, FsError> {
        let path = Path::new(raw);
        if !path.is_absolute() {
            return Err(FsError::InvalidParams(
                "AbsolutePathBuf deserialized without a base path".to_owned(),
            ));
        }
        let norm = normalize(path);
        match &self.kind {
            RootKind::Host => Ok(Target::Host(norm)),
            RootKind::Confined {
                path: root,
                dir,
                image,
            } => {
                let (root, dir, rel) = match (norm.strip_prefix(root), image) {
                    (Ok(rel), _) => (root.as_path(), dir, rel),
                    (Err(_), Some(image)) => (
                        Path::new("/"),
                        image,
                        norm.strip_prefix("/").unwrap_or(&norm),
                    ),
                    (Err(_), None) => return Err(FsError::OutsideRoot(raw.to_owned())),
                };
                let rel = if rel.as_os_str().is_empty() {
                    PathBuf::from(".")
                } else {
                    rel.to_path_buf()
                };
                Ok(Target::Confined {
                    dir,
                    root,
                    rel,
                    norm,
                })
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
pub(super) enum Target<'a> {
    Host(PathBuf),
    Confined {
        dir: &'a Dir,
        /// The root's own path (absolute symlink targets are read against it).
        root: &'a Path,
        rel: PathBuf,
        /// The normalised absolute path, for messages and containment checks.
        norm: PathBuf,
    },
}

impl<'a> Target<'a> {
    pub(super) fn abs(&self) -> &Path {
        match self {
            Target::Host(p) => p,
            Target::Confined { norm, .. } => norm,
        }
    }

    pub(super) fn join(&self, name: &std::ffi::OsStr) -> Target<'a> {
        match self {
            Target::Host(p) => Target::Host(p.join(name)),
            Target::Confined {
                dir,
                root,
                rel,
                norm,
            } => Target::Confined {
                dir,
                root,
                rel: rel.join(name),
                norm: norm.join(name),
            },
        }
    }

    /// Run `op` on the root's directory and this path beneath it. If cap-std
    /// refuses the path as an escape, it may hold absolute symlinks naming
    /// paths inside the root: `op` runs once more on the [`expand`]ed path
    /// (`last`: whether `op` follows a link in the last component).
    fn beneath<T>(&self, last: bool, op: impl Fn(&Dir, &Path) -> io::Result<T>) -> io::Result<T> {
        let Target::Confined { dir, root, rel, .. } = self else {
            return Err(io::Error::from(io::ErrorKind::Unsupported));
        };
        match op(dir, rel) {
            Err(e) if is_escape(&e) => op(dir, &expand(dir, root, rel, last)?),
            r => r,
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

    pub(super) fn canonicalize(&self) -> io::Result<PathBuf> {
        match self {
            Target::Host(p) => std::fs::canonicalize(p),
            Target::Confined { root, .. } => {
                // The root's own path, plus the resolved path beneath it.
                let real = self.beneath(true, |d, rel| d.canonicalize(rel))?;
                Ok(normalize(&root.join(real)))
            }
        }
    }

    pub(super) fn metadata(&self) -> io::Result<Meta> {
        match self {
            Target::Host(p) => std::fs::metadata(p).map(Meta::Std),
            Target::Confined { .. } => self.beneath(true, |d, rel| d.metadata(rel).map(Meta::Cap)),
        }
    }

    pub(super) fn symlink_metadata(&self) -> io::Result<Meta> {
        match self {
            Target::Host(p) => std::fs::symlink_metadata(p).map(Meta::Std),
            Target::Confined { .. } => {
                self.beneath(false, |d, rel| d.symlink_metadata(rel).map(Meta::Cap))
            }
        }
    }

    /// Open for reading: non-blocking (FIFOs cannot hang us), regular files only.
    pub(super) fn open_read(&self) -> io::Result<std::fs::File> {
        let file = match self {
            Target::Host(p) => {
                use std::os::unix::fs::OpenOptionsExt as _;
                std::fs::OpenOptions::new()
                    .read(true)
                    .custom_flags(libc::O_NONBLOCK)
                    .open(p)?
            }
            Target::Confined { .. } => {
                let mut o = CapOpenOptions::new();
                o.read(true).custom_flags(libc::O_NONBLOCK);
                self.beneath(true, |d, rel| d.open_with(rel, &o))?
                    .into_std()
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

    pub(super) fn open_write(&self) -> io::Result<std::fs::File> {
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
            Target::Confined { .. } => {
                let mut o = CapOpenOptions::new();
                o.write(true)
                    .create(true)
                    .truncate(true)
                    .custom_flags(libc::O_NONBLOCK);
                self.beneath(true, |d, rel| d.open_with(rel, &o))?
                    .into_std()
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

    pub(super) fn create_dir(&self, recursive: bool) -> io::Result<()> {
        match (self, recursive) {
            (Target::Host(p), true) => std::fs::create_dir_all(p),
            (Target::Host(p), false) => std::fs::create_dir(p),
            (Target::Confined { .. }, true) => {
                match self.beneath(true, |d, rel| d.create_dir_all(rel)) {
                    // A link to a directory is one (cap-std's check of
                    // what exists does not follow it).
                    Err(e)
                        if e.kind() == io::ErrorKind::AlreadyExists
                            && self.metadata().is_ok_and(|m| m.is_dir()) =>
                    {
                        Ok(())
                    }
                    r => r,
                }
            }
            (Target::Confined { .. }, false) => self.beneath(false, |d, rel| d.create_dir(rel)),
        }
    }

    /// Entry names of a directory.
    pub(super) fn list(&self) -> io::Result<Vec<std::ffi::OsString>> {
        match self {
            Target::Host(p) => std::fs::read_dir(p)?
                .map(|e| e.map(|e| e.file_name()))
                .collect(),
            Target::Confined { .. } => self
                .beneath(true, |d, rel| d.read_dir(rel))?
                .map(|e| e.map(|e| e.file_name()))
                .collect(),
        }
    }

    pub(super) fn remove_file(&self) -> io::Result<()> {
        match self {
            Target::Host(p) => std::fs::remove_file(p),
            Target::Confined { .. } => self.beneath(false, |d, rel| d.remove_file(rel)),
        }
    }

    pub(super) fn remove_dir(&self, recursive: bool) -> io::Result<()> {
        match (self, recursive) {
            (Target::Host(p), true) => std::fs::remove_dir_all(p),
            (Target::Host(p), false) => std::fs::remove_dir(p),
            (Target::Confined { .. }, true) => self.beneath(false, |d, rel| d.remove_dir_all(rel)),
            (Target::Confined { .. }, false) => self.beneath(false, |d, rel| d.remove_dir(rel)),
        }
    }

    pub(super) fn read_link(&self) -> io::Result<PathBuf> {
        match self {
            Target::Host(p) => std::fs::read_link(p),
            // The link's text, not resolved: it is copied verbatim.
            Target::Confined { .. } => self.beneath(false, |d, rel| d.read_link_contents(rel)),
        }
    }

    pub(super) fn symlink(&self, original: &Path) -> io::Result<()> {
        match self {
            Target::Host(p) => std::os::unix::fs::symlink(original, p),
            Target::Confined { .. } => {
                self.beneath(false, |d, rel| d.symlink_contents(original, rel))
            }
        }
    }
}

/// Most symbolic links one expansion follows (the kernel's MAXSYMLINKS).
const MAX_LINKS: usize = 40;

fn escape() -> io::Error {
    io::Error::new(
        io::ErrorKind::PermissionDenied,
        "a path led outside of the filesystem",
    )
}

/// `rel` (beneath `dir`, the root at `root`) with its symbolic links
/// replaced by what they name (the last component's only with `last`), as
/// a path beneath the root: a relative target continues where the link
/// is, an absolute one must lie under `root` and continues from the root,
/// and `..` above the root is an escape. Links are read, never followed
/// (the result is resolved by cap-std again, so a link swapped in
/// meanwhile is confined as any other). Once a component is missing, the
/// rest is kept as written: the operation reports what is missing.
fn expand(dir: &Dir, root: &Path, rel: &Path, last: bool) -> io::Result<PathBuf> {
    use std::ffi::OsString;
    let push_all = |todo: &mut Vec<OsString>, p: &Path| {
        let parts: Vec<OsString> = p
            .components()
            .filter_map(|c| match c {
                Component::Normal(n) => Some(n.to_os_string()),
                Component::ParentDir => Some(OsString::from("..")),
                _ => None,
            })
            .collect();
        todo.extend(parts.into_iter().rev());
    };
    let mut done = PathBuf::new();
    let mut todo = Vec::new();
    push_all(&mut todo, rel);
    let mut links = 0;
    while let Some(name) = todo.pop() {
        if name == ".." {
            if !done.pop() {
                return Err(escape());
            }
            continue;
        }
        let here = done.join(&name);
        if !todo.is_empty() || last {
            match dir.symlink_metadata(&here) {
                Ok(m) if m.file_type().is_symlink() => {
                    links += 1;
                    if links > MAX_LINKS {
                        return Err(io::Error::from_raw_os_error(libc::ELOOP));
                    }
                    let target = dir.read_link_contents(&here)?;
                    if target.is_absolute() {
                        let inside = target.strip_prefix(root).map_err(|_| escape())?;
                        done = PathBuf::new();
                        push_all(&mut todo, inside);
                    } else {
                        push_all(&mut todo, &target);
                    }
                    continue;
                }
                Ok(_) => {}
                Err(_) => {
                    done.push(name);
                    while let Some(rest) = todo.pop() {
                        done.push(rest);
                    }
                    break;
                }
            }
        }
        done = here;
    }
    if done.as_os_str().is_empty() {
        done.push(".");
    }
    Ok(done)
}

/// Resolve `path`; with `follow: Some(false)`, refuse one that goes
/// through a symbolic link (the last component included).
pub(super) fn resolve_following<'r>(
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

/// cap-std refuses a resolution that would leave the root with this error
/// (it has no error type of its own for it).
pub(super) fn is_escape(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::PermissionDenied
        && e.to_string() == "a path led outside of the filesystem"
}

#[cfg(test)]
mod tests {
    use super::*;

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
