//! A tenant's own namespaces (docs/isolation.md, "Namespaces"): mount, IPC,
//! UTS and optionally network. In the mount namespace `/tmp` is the
//! tenant's private directory, and a tenant root that lies under `/tmp`
//! is bound back at its own path, so the tenant still sees it (and no
//! other tenant's). The worker enters them once and its children inherit
//! them; with workers off, every child enters its own.
//!
//! Everything is prepared before fork: the private directory and the root
//! are held as `O_PATH` descriptors and attached with `open_tree` +
//! `move_mount`, so nothing a tenant may have planted in its `/tmp` (a
//! symlink where a mount point should be) is ever followed.

#![allow(unsafe_code)]

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd};
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use super::egress::{TenantNet, loopback_up};
use super::idmap::IdMap;

/// A raw syscall's result: its value, or the OS error it set.
fn check(r: libc::c_long) -> io::Result<libc::c_long> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

/// What a tenant's namespaces look like.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NamespaceSpec {
    /// Host directory mounted on `/tmp` (none: `/tmp` stays the host's, for
    /// an unconfined tenant that only wants its own network).
    pub tmp: Option<PathBuf>,
    /// The tenant root (bound back at its path when it lies under `/tmp`).
    pub root: PathBuf,
    /// The network the tenant's processes see.
    pub net: NetSpec,
    /// Directories that must not exist for the tenant (other tenants'
    /// roots, the gateway's state directory): an empty read-only tmpfs
    /// with mode 000 is mounted on each.
    pub hide_dirs: Vec<PathBuf>,
    /// Files that must not be readable (the gateway's key files, resolved):
    /// `/dev/null` is bound over each.
    pub hide_files: Vec<PathBuf>,
    /// A new devpts instance on `/dev/pts` (its `ptmx` bound on
    /// `/dev/ptmx`): the tenant's terminals only. For workers, which enter
    /// once; each entry adds two rules to the tenant's Landlock ruleset.
    pub private_devpts: bool,
    /// The root's files appear as the tenant's own (an idmapped mount of
    /// the root; module `idmap`).
    pub idmap: Option<IdMap>,
    /// A PID namespace with its own `/proc` (for workers: the worker is
    /// its init, so the tenant sees only its own processes, and everything
    /// in it dies with the worker). Entering forks: the caller's process
    /// stays outside as the namespace's parent ([`pid_parent_main`]).
    pub pid: bool,
    /// An ancestor of the root (not under `/tmp`) the tenant's uid cannot
    /// search, such as `/root`: an empty tmpfs is mounted on it, holding
    /// only the path down to the root, which is bound back there.
    pub cover: Option<PathBuf>,
    /// An image's view (module `image::view`): a read-only overlay on the
    /// host that becomes the namespace's `/` (pivot_root), with the host's
    /// `/dev`, `/sys` (and `/proc` without a PID namespace), the private
    /// `/tmp`, `resolv.conf` and the root bound into it. Nothing else of
    /// the host is reachable, so nothing needs hiding.
    pub image: Option<PathBuf>,
    /// A fork's workspace (module `snapshot::workspace`): the tree
    /// attached at the root's path instead of the root itself.
    pub workspace: Option<PathBuf>,
}

/// A tenant's network.
#[derive(Debug, Clone, Default)]
pub enum NetSpec {
    /// The host's (`network = "host"`).
    #[default]
    Host,
    /// A new namespace with only loopback (`network = "none"`).
    Loopback,
    /// The tenant's namespace, shared by its workers, with the way out
    /// its egress allows; its `resolv.conf` is bound over the host's.
    Joined(Arc<TenantNet>),
}

impl PartialEq for NetSpec {
    fn eq(&self, other: &NetSpec) -> bool {
        match (self, other) {
            (NetSpec::Host, NetSpec::Host) | (NetSpec::Loopback, NetSpec::Loopback) => true,
            (NetSpec::Joined(a), NetSpec::Joined(b)) => Arc::ptr_eq(a, b),
            _ => false,
        }
    }
}

impl Eq for NetSpec {}

/// The host's mount points at or below any of `dirs`, deepest first.
fn mounts_under(dirs: &[&Path]) -> Vec<PathBuf> {
    let table = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let mut out: Vec<PathBuf> = table
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(|m| PathBuf::from(unescape_mount_point(m)))
        .filter(|m| dirs.iter().any(|d| m.starts_with(d)))
        .collect();
    out.sort_by_key(|m| std::cmp::Reverse(m.components().count()));
    out.dedup();
    out
}

/// A mountinfo path: space, tab, newline and backslash come as `\ooo`.
fn unescape_mount_point(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            out.push((b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0'));
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Files of a tenant's `/proc` that read as empty.
const PROC_MASKED_FILES: &[&std::ffi::CStr] = &[
    c"/proc/kallsyms",
    c"/proc/kcore",
    c"/proc/keys",
    c"/proc/key-users",
    c"/proc/latency_stats",
    c"/proc/timer_list",
    c"/proc/sched_debug",
    c"/proc/sysrq-trigger",
];
/// Directories of a tenant's `/proc` that read as empty.
const PROC_MASKED_DIRS: &[&std::ffi::CStr] = &[c"/proc/acpi", c"/proc/scsi", c"/proc/asound"];

/// Where the root tree is attached in the namespace.
#[derive(Debug)]
enum Base {
    /// Below the private `/tmp`.
    Tmp,
    /// Below a fresh tmpfs mounted on this ancestor.
    Cover(CString),
    /// On its own path (only its idmapping changes).
    InPlace(CString),
    /// Below `/` of an image's view, after the pivot.
    Image,
}

/// The root's tree, re-attached in the namespace.
#[derive(Debug)]
struct RootMount {
    fd: OwnedFd,
    base: Base,
    /// The path from the base down to the root.
    components: Vec<CString>,
    userns: Option<Arc<OwnedFd>>,
}

/// Landlock rights for what is mounted anew in the namespace (the
/// private devpts, `/proc`), granted there: rules name inodes, and these
/// exist only once mounted.
#[derive(Debug, Clone, Copy)]
pub struct NsRights {
    pub ruleset: libc::c_int,
    /// On the devpts instance's root (terminals beneath).
    pub pty_dir: u64,
    /// On its `ptmx` file, as bound on `/dev/ptmx`.
    pub pty_file: u64,
    /// On the new `/proc`.
    pub proc: u64,
}

/// A [`NamespaceSpec`] made ready to enter after fork.
#[derive(Debug)]
pub struct Namespace {
    flags: libc::c_int,
    tmp: Option<OwnedFd>,
    /// The root, when it is attached anew (under `/tmp`, a cover, or
    /// idmapped).
    root: Option<RootMount>,
    net: NetSpec,
    /// The tenant's `resolv.conf` (joined networks), held `O_PATH`.
    resolv_conf: Option<OwnedFd>,
    /// Its CA bundle (an intercepting egress), held `O_PATH`.
    ca_bundle: Option<OwnedFd>,
    /// Mounts of the host's under what the namespace hides or replaces
    /// (other tenants' `/tmp` tmpfs, other gateways' mounts): detached in
    /// the namespace, so its mountinfo does not name them.
    detach: Vec<CString>,
    hide_dirs: Vec<CString>,
    hide_files: Vec<CString>,
    private_devpts: bool,
    pid: bool,
    /// The image view's path, when `/` is an image.
    image: Option<CString>,
}

const OPEN_TREE_CLONE: libc::c_uint = 1;
const AT_RECURSIVE: libc::c_uint = 0x8000;
const MOVE_MOUNT_F_EMPTY_PATH: libc::c_uint = 0x4;
const MOVE_MOUNT_T_SYMLINKS: libc::c_uint = 0x10;
const MOVE_MOUNT_T_EMPTY_PATH: libc::c_uint = 0x40;

fn path_fd(p: &Path) -> io::Result<OwnedFd> {
    open_path(p, libc::O_DIRECTORY)
}

fn open_path(p: &Path, flags: libc::c_int) -> io::Result<OwnedFd> {
    let c = CString::new(p.as_os_str().as_encoded_bytes())
        .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: a plain open of a NUL-terminated path.
    let fd = unsafe { libc::open(c.as_ptr(), libc::O_PATH | libc::O_CLOEXEC | flags) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor we own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

impl Namespace {
    pub fn new(spec: &NamespaceSpec) -> io::Result<Namespace> {
        let tmp = spec.tmp.as_deref().map(path_fd).transpose()?;
        let cstring = |p: &Path| {
            CString::new(p.as_os_str().as_encoded_bytes())
                .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))
        };
        let below = |base: &Path| -> io::Result<Option<Vec<CString>>> {
            let Ok(rel) = spec.root.strip_prefix(base) else {
                return Ok(None);
            };
            if rel.as_os_str().is_empty() {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("a tenant root cannot be {} itself", base.display()),
                ));
            }
            rel.components()
                .map(|c| match c {
                    Component::Normal(n) => CString::new(n.as_encoded_bytes())
                        .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput)),
                    _ => Err(io::Error::from(io::ErrorKind::InvalidInput)),
                })
                .collect::<io::Result<Vec<_>>>()
                .map(Some)
        };
        let placed = match (&tmp, below(Path::new("/tmp"))?) {
            (Some(_), Some(components)) => Some((Base::Tmp, components)),
            _ => match spec.cover.as_deref() {
                Some(cover) => below(cover)?
                    .map(|c| Ok::<_, io::Error>((Base::Cover(cstring(cover)?), c)))
                    .transpose()?,
                None => None,
            },
        };
        let placed = match placed {
            // Under an image the root is always bound in anew, below `/`
            // (or below the private /tmp, as above).
            Some((Base::Tmp, c)) => Some((Base::Tmp, c)),
            _ if spec.image.is_some() => {
                Some((Base::Image, below(Path::new("/"))?.unwrap_or_default()))
            }
            None if spec.idmap.is_some() || spec.workspace.is_some() => {
                Some((Base::InPlace(cstring(&spec.root)?), Vec::new()))
            }
            p => p,
        };
        let root = match placed {
            Some((base, components)) => Some(RootMount {
                fd: path_fd(spec.workspace.as_deref().unwrap_or(&spec.root))?,
                base,
                components,
                userns: spec.idmap.map(super::idmap::userns).transpose()?,
            }),
            None => None,
        };
        let mut flags = libc::CLONE_NEWNS | libc::CLONE_NEWIPC | libc::CLONE_NEWUTS;
        if spec.net == NetSpec::Loopback {
            flags |= libc::CLONE_NEWNET;
        }
        let resolv_conf = match &spec.net {
            NetSpec::Joined(net) => Some(open_path(net.resolv_conf(), libc::O_NOFOLLOW)?),
            _ => None,
        };
        let ca_bundle = match &spec.net {
            NetSpec::Joined(net) => net
                .ca_bundle()
                .map(|b| open_path(b, libc::O_NOFOLLOW))
                .transpose()?,
            _ => None,
        };
        if spec.pid {
            flags |= libc::CLONE_NEWPID;
        }
        let cstrings = |paths: &[PathBuf]| {
            paths
                .iter()
                .map(|p| {
                    CString::new(p.as_os_str().as_encoded_bytes())
                        .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))
                })
                .collect::<io::Result<Vec<_>>>()
        };
        Ok(Namespace {
            flags,
            tmp,
            root,
            net: spec.net.clone(),
            resolv_conf,
            ca_bundle,
            detach: {
                let mut under: Vec<&Path> = spec.hide_dirs.iter().map(PathBuf::as_path).collect();
                if spec.tmp.is_some() {
                    under.push(Path::new("/tmp"));
                }
                under.extend(spec.cover.as_deref());
                cstrings(&mounts_under(&under))?
            },
            hide_dirs: cstrings(&spec.hide_dirs)?,
            hide_files: cstrings(&spec.hide_files)?,
            private_devpts: spec.private_devpts,
            pid: spec.pid,
            image: spec.image.as_deref().map(cstring).transpose()?,
        })
    }

    /// Whether entering makes a PID namespace (the caller must then fork:
    /// only its children are in it).
    pub fn pid(&self) -> bool {
        self.pid
    }

    /// In the first child of the PID namespace (its init), after
    /// [`Namespace::enter`]: mount its own `/proc` and grant it read-only.
    ///
    /// # Safety
    /// Call only in a single-threaded child between fork and exec.
    pub unsafe fn enter_pid1(&self, rights: Option<NsRights>) -> io::Result<()> {
        // SAFETY: mount and a Landlock rule on NUL-terminated paths.
        unsafe {
            self.pivot()?;
            if libc::mount(
                c"proc".as_ptr(),
                c"/proc".as_ptr(),
                c"proc".as_ptr(),
                libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
                std::ptr::null(),
            ) < 0
            {
                return Err(io::Error::last_os_error());
            }
            // What of the host the new /proc still shows: kernel symbol
            // addresses (readable where perf_event_paranoid <= 1), timers,
            // scheduler and key details (those other runtimes mask too).
            for file in PROC_MASKED_FILES {
                let r = libc::mount(
                    c"/dev/null".as_ptr(),
                    file.as_ptr(),
                    std::ptr::null(),
                    libc::MS_BIND,
                    std::ptr::null(),
                );
                if r < 0 && io::Error::last_os_error().raw_os_error() != Some(libc::ENOENT) {
                    return Err(io::Error::last_os_error());
                }
            }
            for dir in PROC_MASKED_DIRS {
                let r = libc::mount(
                    c"exec-gateway-masked".as_ptr(),
                    dir.as_ptr(),
                    c"tmpfs".as_ptr(),
                    libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
                    c"size=4k,nr_inodes=1,mode=000".as_ptr().cast(),
                );
                if r < 0 && io::Error::last_os_error().raw_os_error() != Some(libc::ENOENT) {
                    return Err(io::Error::last_os_error());
                }
            }
            if let Some(r) = rights {
                add_rule(r.ruleset, c"/proc", libc::O_DIRECTORY, r.proc)?;
            }
        }
        Ok(())
    }

    /// Enter the namespaces and arrange the mounts. Post-fork, before the
    /// capabilities go: raw syscalls on data prepared in [`Namespace::new`].
    ///
    /// # Safety
    /// Call only in a single-threaded child between fork and exec.
    pub unsafe fn enter(&self, rights: Option<NsRights>) -> io::Result<()> {
        // SAFETY (whole body): raw syscalls with valid, NUL-terminated
        // arguments; descriptors opened here are closed here.
        unsafe {
            let clone = |fd: libc::c_int, flags: libc::c_uint| {
                check(libc::syscall(
                    libc::SYS_open_tree,
                    fd,
                    c"".as_ptr(),
                    flags
                        | OPEN_TREE_CLONE
                        | libc::O_CLOEXEC as libc::c_uint
                        | libc::AT_EMPTY_PATH as libc::c_uint,
                ))
                .map(|fd| fd as libc::c_int)
            };
            // Detached copies of the trees, taken while their mounts are
            // still in this (the host's) namespace: a mount of another
            // namespace cannot be cloned.
            let root_tree = match &self.root {
                Some(r) => {
                    let tree = clone(r.fd.as_raw_fd(), AT_RECURSIVE)?;
                    if let Some(ns) = &r.userns {
                        super::idmap::set_idmap(tree, ns.as_raw_fd())?;
                    }
                    Some(tree)
                }
                None => None,
            };
            let tmp_tree = match &self.tmp {
                Some(fd) => Some(clone(fd.as_raw_fd(), 0)?),
                None => None,
            };
            let resolv_tree = match &self.resolv_conf {
                Some(fd) => Some(clone(fd.as_raw_fd(), 0)?),
                None => None,
            };
            let bundle_tree = match &self.ca_bundle {
                Some(fd) => Some(clone(fd.as_raw_fd(), 0)?),
                None => None,
            };
            if let NetSpec::Joined(net) = &self.net {
                check(libc::setns(net.netns().as_raw_fd(), libc::CLONE_NEWNET).into())?;
            }
            check(libc::unshare(self.flags).into())?;
            // Nothing mounted here propagates back to the host.
            check(
                libc::mount(
                    std::ptr::null(),
                    c"/".as_ptr(),
                    std::ptr::null(),
                    libc::MS_REC | libc::MS_PRIVATE,
                    std::ptr::null(),
                )
                .into(),
            )?;
            if let Some(view) = &self.image {
                // The view becomes `/`: what the tenant sees of the host
                // is what is bound into it here (the skeleton layer holds
                // each mount point as a directory, whatever the image has).
                check(libc::chdir(view.as_ptr()).into())?;
                let bind = |from: &std::ffi::CStr, to: &std::ffi::CStr| {
                    check(
                        libc::mount(
                            from.as_ptr(),
                            to.as_ptr(),
                            std::ptr::null(),
                            libc::MS_BIND | libc::MS_REC,
                            std::ptr::null(),
                        )
                        .into(),
                    )
                };
                bind(c"/dev", c"dev")?;
                bind(c"/sys", c"sys")?;
                // Also with a PID namespace: until its init mounts its own
                // over it, the exec of the gateway's binary goes through
                // `/proc/self/fd`.
                bind(c"/proc", c"proc")?;
                let attach = |tree: libc::c_int, to: &std::ffi::CStr| {
                    let r = check(libc::syscall(
                        libc::SYS_move_mount,
                        tree,
                        c"".as_ptr(),
                        libc::AT_FDCWD,
                        to.as_ptr(),
                        MOVE_MOUNT_F_EMPTY_PATH,
                    ));
                    libc::close(tree);
                    r
                };
                if let Some(tree) = resolv_tree {
                    attach(tree, c"etc/resolv.conf")?;
                }
                if let Some(tree) = bundle_tree {
                    // Only over a file the image has: an image without one
                    // there (or with a link) keeps its own, and its TLS to
                    // intercepted hosts fails, as it should.
                    libc::syscall(
                        libc::SYS_move_mount,
                        tree,
                        c"".as_ptr(),
                        libc::AT_FDCWD,
                        c"etc/ssl/certs/ca-certificates.crt".as_ptr(),
                        MOVE_MOUNT_F_EMPTY_PATH,
                    );
                    libc::close(tree);
                }
                if let Some(tree) = tmp_tree {
                    attach(tree, c"tmp")?;
                }
                // The rest is mounted relative to the view (the working
                // directory); the pivot comes last (`pivot`), in the PID
                // namespace's init when there is one: its parent, left
                // outside, still execs this binary from the host's root.
            }
            let (resolv_tree, tmp_tree, bundle_tree) = if self.image.is_some() {
                (None, None, None)
            } else {
                (resolv_tree, tmp_tree, bundle_tree)
            };
            for m in self.detach.iter().filter(|_| self.image.is_none()) {
                libc::umount2(m.as_ptr(), libc::MNT_DETACH);
            }
            // Hide what the tenant must not reach, in the host's view of
            // the paths (before any tree the tenant writes is attached).
            // A path that does not exist has nothing to hide.
            let hidden = |r: libc::c_int| {
                if r < 0 && io::Error::last_os_error().raw_os_error() != Some(libc::ENOENT) {
                    Err(io::Error::last_os_error())
                } else {
                    Ok(())
                }
            };
            for dir in self.hide_dirs.iter().filter(|_| self.image.is_none()) {
                hidden(libc::mount(
                    c"exec-gateway-hidden".as_ptr(),
                    dir.as_ptr(),
                    c"tmpfs".as_ptr(),
                    libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
                    c"size=4k,nr_inodes=1,mode=000".as_ptr().cast(),
                ))?;
            }
            for file in self.hide_files.iter().filter(|_| self.image.is_none()) {
                hidden(libc::mount(
                    c"/dev/null".as_ptr(),
                    file.as_ptr(),
                    std::ptr::null(),
                    libc::MS_BIND,
                    std::ptr::null(),
                ))?;
            }
            // The tenant's resolv.conf, and its CA bundle (an intercepting
            // egress), over the host's: over the file a symlink there names
            // (systemd-resolved's stub), in this namespace only; a host
            // without one has nothing to cover.
            for (tree, path) in [
                (resolv_tree, c"/etc/resolv.conf"),
                (bundle_tree, c"/etc/ssl/certs/ca-certificates.crt"),
            ] {
                let Some(tree) = tree else { continue };
                let r = libc::syscall(
                    libc::SYS_move_mount,
                    tree,
                    c"".as_ptr(),
                    libc::AT_FDCWD,
                    path.as_ptr(),
                    MOVE_MOUNT_F_EMPTY_PATH | MOVE_MOUNT_T_SYMLINKS,
                );
                let covered = hidden(r as libc::c_int);
                libc::close(tree);
                covered?;
            }
            if let Some(tmp_tree) = tmp_tree {
                check(libc::syscall(
                    libc::SYS_move_mount,
                    tmp_tree,
                    c"".as_ptr(),
                    libc::AT_FDCWD,
                    c"/tmp".as_ptr(),
                    MOVE_MOUNT_F_EMPTY_PATH,
                ))?;
                libc::close(tmp_tree);
            }
            if let (Some(tree), Some(r)) = (root_tree, &self.root) {
                let base = match &r.base {
                    Base::Tmp => c"/tmp",
                    Base::Cover(path) => {
                        // Only the way down to the root, searchable.
                        check(
                            libc::mount(
                                c"exec-gateway-cover".as_ptr(),
                                path.as_ptr(),
                                c"tmpfs".as_ptr(),
                                libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
                                c"size=64k,nr_inodes=64,mode=0755".as_ptr().cast(),
                            )
                            .into(),
                        )?;
                        path.as_c_str()
                    }
                    Base::InPlace(path) => path.as_c_str(),
                    Base::Image => c".",
                };
                // Under an image, below the view (the working directory).
                let base = match (&r.base, &self.image) {
                    (Base::Tmp, Some(_)) => c"tmp",
                    _ => base,
                };
                // Walk (and create) the mount point without following links.
                let mut dir = check(
                    libc::open(
                        base.as_ptr(),
                        libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
                    )
                    .into(),
                )? as libc::c_int;
                for c in &r.components {
                    libc::mkdirat(dir, c.as_ptr(), 0o755);
                    let next = libc::openat(
                        dir,
                        c.as_ptr(),
                        libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
                    );
                    libc::close(dir);
                    dir = check(next.into())? as libc::c_int;
                }
                check(libc::syscall(
                    libc::SYS_move_mount,
                    tree,
                    c"".as_ptr(),
                    dir,
                    c"".as_ptr(),
                    MOVE_MOUNT_F_EMPTY_PATH | MOVE_MOUNT_T_EMPTY_PATH,
                ))?;
                libc::close(dir);
                libc::close(tree);
            }
            // Under an image, the view's (relative: the working directory).
            let (dev_pts, dev_ptmx, pts_ptmx) = if self.image.is_some() {
                (c"dev/pts", c"dev/ptmx", c"dev/pts/ptmx")
            } else {
                (c"/dev/pts", c"/dev/ptmx", c"/dev/pts/ptmx")
            };
            if self.private_devpts {
                check(
                    libc::mount(
                        c"devpts".as_ptr(),
                        dev_pts.as_ptr(),
                        c"devpts".as_ptr(),
                        libc::MS_NOSUID | libc::MS_NOEXEC,
                        c"newinstance,ptmxmode=0666,mode=0620".as_ptr().cast(),
                    )
                    .into(),
                )?;
                check(
                    libc::mount(
                        pts_ptmx.as_ptr(),
                        dev_ptmx.as_ptr(),
                        std::ptr::null(),
                        libc::MS_BIND,
                        std::ptr::null(),
                    )
                    .into(),
                )?;
                if let Some(r) = rights {
                    add_rule(r.ruleset, dev_pts, libc::O_DIRECTORY, r.pty_dir)?;
                    add_rule(r.ruleset, dev_ptmx, 0, r.pty_file)?;
                }
            }
            if self.net == NetSpec::Loopback {
                loopback_up()?;
            }
            if !self.pid {
                self.pivot()?;
            }
        }
        Ok(())
    }

    /// Under an image: make the view (the working directory, everything
    /// mounted in it) `/`, and let go of the host's root.
    ///
    /// # Safety
    /// Call only in a single-threaded child between fork and exec.
    unsafe fn pivot(&self) -> io::Result<()> {
        if self.image.is_none() {
            return Ok(());
        }
        // SAFETY: raw syscalls on NUL-terminated constants.
        unsafe {
            // A mount namespace of its own first: pivot_root moves every
            // process of the namespace whose root is the old one, and the
            // PID namespace's parent (which shares it) must keep the
            // host's root to exec this binary.
            check(libc::unshare(libc::CLONE_NEWNS).into())?;
            check(libc::syscall(
                libc::SYS_pivot_root,
                c".".as_ptr(),
                c".".as_ptr(),
            ))?;
            // The host's root, stacked under the view: gone.
            check(libc::umount2(c".".as_ptr(), libc::MNT_DETACH).into())?;
            check(libc::chdir(c"/".as_ptr()).into())?;
        }
        Ok(())
    }
}

/// `struct landlock_path_beneath_attr`.
#[repr(C, packed)]
struct PathBeneath {
    allowed_access: u64,
    parent_fd: libc::c_int,
}

/// Add a path-beneath rule for `path` (opened `O_PATH` here) to `ruleset`.
unsafe fn add_rule(
    ruleset: libc::c_int,
    path: &std::ffi::CStr,
    flags: libc::c_int,
    access: u64,
) -> io::Result<()> {
    // SAFETY: open/syscall/close with valid arguments.
    unsafe {
        let fd = libc::open(path.as_ptr(), libc::O_PATH | libc::O_CLOEXEC | flags);
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        let attr = PathBeneath {
            allowed_access: access,
            parent_fd: fd,
        };
        let r = libc::syscall(
            libc::SYS_landlock_add_rule,
            ruleset,
            1, // LANDLOCK_RULE_PATH_BENEATH
            &attr as *const PathBeneath,
            0,
        );
        let err = io::Error::last_os_error();
        libc::close(fd);
        if r < 0 { Err(err) } else { Ok(()) }
    }
}

/// Body of `exec-gateway pidns-parent`: what stays outside a PID namespace
/// as the parent of its init (exec'd, so it holds nothing of the
/// gateway's). It waits for its one child and exits as that child did,
/// so the gateway sees the worker's end in its own.
pub fn pid_parent_main() -> std::process::ExitCode {
    use nix::sys::wait::{WaitStatus, wait};
    loop {
        match wait() {
            Ok(WaitStatus::Exited(_, code)) => {
                return std::process::ExitCode::from(u8::try_from(code).unwrap_or(1));
            }
            Ok(WaitStatus::Signaled(_, sig, _)) => {
                return std::process::ExitCode::from(128u8.saturating_add(sig as u8));
            }
            Ok(_) | Err(nix::errno::Errno::EINTR) => continue,
            Err(_) => return std::process::ExitCode::FAILURE,
        }
    }
}
