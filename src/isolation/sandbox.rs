//! The sandbox of a tenant's processes (docs/isolation.md): the tenant's uid/gid with no supplementary groups, `no_new_privs`,
//! rlimits, Landlock (read-write only in the tenant root and its tmp dir,
//! read-exec on system dirs, signal and abstract-socket scoping) and a
//! seccomp deny-list.
//!
//! Everything that allocates is built once per tenant in the parent: the
//! Landlock ruleset fd and the BPF programs, applied between fork and exec
//! with raw syscalls only ([`Sandbox::hook`]). By default the hook confines
//! each tenant's worker (module `worker`) once, and everything it spawns
//! inherits it. With workers off, every child runs the hook itself
//! (module `spawn`).

#![allow(unsafe_code)]

use std::io;
use std::os::fd::{AsRawFd as _, OwnedFd};
use std::path::{Path, PathBuf};

use super::caps::{CapData, CapHeader, LINUX_CAPABILITY_VERSION_3};
use super::namespace::{Namespace, NamespaceSpec, NsRights};
use super::pid_parent::PidParentExec;
use super::seccomp::{self, Programs};
use landlock::{
    ABI, Access, AccessFs, BitFlags, CompatLevel, Compatible as _, PathBeneath, PathFd, Ruleset,
    RulesetAttr as _, RulesetCreatedAttr as _, Scope,
};

/// Highest Landlock ABI the ruleset is written for (scopes need 6).
const LANDLOCK_ABI_MAX: ABI = ABI::V6;

/// The Landlock ABI the rulesets use: the running kernel's, at most
/// [`LANDLOCK_ABI_MAX`]. An older kernel (6.1 has ABI 2) gets every right it
/// can enforce, all of them required, rather than no ruleset; what it
/// cannot enforce is named by [`landlock_gaps`] in `/readyz`.
pub fn landlock_abi() -> ABI {
    static ABI_IN_USE: std::sync::OnceLock<ABI> = std::sync::OnceLock::new();
    *ABI_IN_USE.get_or_init(|| {
        // SAFETY: landlock_create_ruleset(NULL, 0, VERSION) only returns
        // the ABI version (or an error).
        let v = unsafe {
            libc::syscall(
                libc::SYS_landlock_create_ruleset,
                std::ptr::null::<libc::c_void>(),
                0usize,
                1u32, // LANDLOCK_CREATE_RULESET_VERSION
            )
        };
        ABI::from(i32::try_from(v).unwrap_or(0)).min(LANDLOCK_ABI_MAX)
    })
}

/// `IoctlDev` where the ABI handles it (5), else nothing.
fn ioctl_dev() -> BitFlags<AccessFs> {
    AccessFs::from_all(landlock_abi()) & AccessFs::IoctlDev
}

/// The kernel's Landlock ABI as a number (0: none), for reports.
pub fn landlock_abi_number() -> u8 {
    let abi = landlock_abi();
    [ABI::V1, ABI::V2, ABI::V3, ABI::V4, ABI::V5, ABI::V6]
        .iter()
        .filter(|v| **v <= abi)
        .count() as u8
}

/// What the ruleset cannot enforce on this kernel (its ABI is below the one
/// each right needs); empty on 6.12 and later.
pub fn landlock_gaps() -> Vec<&'static str> {
    let abi = landlock_abi();
    [
        (ABI::V3, "truncating files outside the tenant's writable paths (ABI 3)"),
        (ABI::V5, "ioctl on devices (ABI 5)"),
        (
            ABI::V6,
            "signal and abstract unix socket scoping (ABI 6; the uid and PID namespace still separate tenants)",
        ),
    ]
    .into_iter()
    .filter(|(needs, _)| abi < *needs)
    .map(|(_, what)| what)
    .collect()
}
/// `RLIMIT_NOFILE` ceiling for tenant processes (each process; the
/// tenant's memory limit bounds the total, file structures being charged
/// to it).
pub const MAX_OPEN_FILES: u64 = 4096;

/// System directories tenant processes may read and execute.
const SYSTEM_RX: &[&str] = &[
    "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/opt",
];
/// Read-only: configuration and process information.
const SYSTEM_RO: &[&str] = &["/etc", "/proc", "/sys/devices/system/cpu"];
/// Character devices tenant processes may read and write.
const DEVICES_RW: &[&str] = &[
    "/dev/null",
    "/dev/zero",
    "/dev/full",
    "/dev/random",
    "/dev/urandom",
    "/dev/tty",
];
/// Terminals: read-write plus ioctls (without `IoctlDev` openpty fails).
const DEVICES_PTY: &[&str] = &["/dev/ptmx", "/dev/pts"];

/// What confines one tenant's processes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SandboxSpec {
    /// Run as this uid/gid, with no supplementary groups.
    pub uid: Option<(u32, u32)>,
    /// Landlock read-write paths (the tenant root, its tmp dir, extras);
    /// `None` leaves Landlock off.
    pub landlock_rw: Option<Vec<PathBuf>>,
    /// Extra read-only paths granted to the tenant.
    pub landlock_ro: Vec<PathBuf>,
    /// Install the seccomp deny-list.
    pub seccomp: bool,
    /// The gateway's key files: never granted by the read-only rules, even
    /// where they sit under a system directory.
    pub hidden: Vec<PathBuf>,
    /// The tenant's own namespaces (private `/tmp`, IPC, UTS, network).
    pub namespace: Option<NamespaceSpec>,
}

/// A tenant's sandbox, ready to apply after fork.
#[derive(Debug)]
pub struct Sandbox {
    pub spec: SandboxSpec,
    ruleset: Option<OwnedFd>,
    namespace: Option<std::sync::Arc<Namespace>>,
    /// How the parent of a PID namespace's init execs itself.
    pid_parent: Option<std::sync::Arc<PidParentExec>>,
    /// The seccomp programs (module `seccomp`), in the kernel's layout,
    /// converted once and shared by every hook.
    filters: std::sync::Arc<Programs>,
}

impl Sandbox {
    /// Build the Landlock ruleset and the BPF programs for `spec`.
    pub fn new(spec: SandboxSpec) -> Result<Sandbox, String> {
        let ruleset = match &spec.landlock_rw {
            Some(rw) => {
                let image = spec.namespace.as_ref().is_some_and(|n| n.image.is_some());
                Some(landlock_ruleset(
                    rw,
                    &spec.landlock_ro,
                    &spec.hidden,
                    image,
                )?)
            }
            None => None,
        };
        let namespace = match &spec.namespace {
            Some(ns) => Some(std::sync::Arc::new(
                Namespace::new(ns).map_err(|e| format!("namespaces: {e}"))?,
            )),
            None => None,
        };
        let pid_parent = match &namespace {
            Some(ns) if ns.pid() => Some(std::sync::Arc::new(
                PidParentExec::new().map_err(|e| format!("namespaces: {e}"))?,
            )),
            _ => None,
        };
        let filters = if spec.seccomp {
            seccomp::compiled()?
        } else {
            std::sync::Arc::new(Programs::default())
        };
        Ok(Sandbox {
            spec,
            ruleset,
            namespace,
            pid_parent,
            filters,
        })
    }

    /// The post-fork step for `pre_exec`, after any cgroup join (which needs
    /// root): drop groups, gid, uid; `no_new_privs`; rlimits; Landlock;
    /// seccomp. Only syscalls on data prepared here; nothing allocates.
    pub fn hook(&self) -> impl Fn() -> io::Result<()> + Send + Sync + 'static {
        self.hook_with(false)
    }

    /// The hook of a worker that seals its children (`seals_children`: it
    /// may call `clone3`, and installs [`seccomp::seal`] in each child) or
    /// not ([`Sandbox::hook`]).
    pub fn worker_hook(
        &self,
        seals_children: bool,
    ) -> impl Fn() -> io::Result<()> + Send + Sync + 'static {
        self.hook_with(seals_children)
    }

    fn hook_with(
        &self,
        seals_children: bool,
    ) -> impl Fn() -> io::Result<()> + Send + Sync + 'static {
        let uid = self.spec.uid;
        let ruleset = self.ruleset.as_ref().map(|f| f.as_raw_fd());
        let filters = self.filters.clone();
        let namespace = self.namespace.clone();
        let pid_parent = self.pid_parent.clone();
        let (pty_dir, pty_file, proc) = ns_rights();
        move || {
            let rights = ruleset.map(|fd| NsRights {
                ruleset: fd,
                pty_dir,
                pty_file,
                proc,
            });
            // SAFETY: async-signal-safe syscalls on values computed before
            // fork; the fd and programs outlive the call (owned by the
            // closure or the parent's `Sandbox`, which the child shares).
            unsafe {
                if let Some(ns) = &namespace {
                    ns.enter(rights)?;
                    if let Some(parent) = &pid_parent {
                        // Only children enter the new PID namespace: the
                        // child goes on (to exec the worker as its init);
                        // this process becomes its parent, sandboxed the
                        // same, and execs `pidns-parent` (holding nothing
                        // of the gateway's).
                        let child = libc::syscall(libc::SYS_clone, libc::SIGCHLD, 0, 0, 0, 0);
                        if child < 0 {
                            return Err(io::Error::last_os_error());
                        }
                        if child > 0 {
                            // It spawns nothing: every program.
                            if apply(uid, ruleset, &filters.all).is_ok() {
                                parent.exec();
                            }
                            libc::kill(child as libc::pid_t, libc::SIGKILL);
                            libc::_exit(127);
                        }
                        ns.enter_pid1(rights)?;
                    }
                }
                let own = if seals_children {
                    &filters.worker
                } else {
                    &filters.all
                };
                apply(uid, ruleset, own)
            }
        }
    }
}

/// The Landlock rights of what a namespace mounts anew, as raw bits: the
/// terminals (`DEVICES_PTY`: on a directory, and on the `ptmx` file) and
/// `/proc` (read-only, as in `SYSTEM_RO`).
fn ns_rights() -> (u64, u64, u64) {
    let read_no_exec = AccessFs::from_read(landlock_abi()) & !AccessFs::Execute;
    let file_rw = AccessFs::from_file(landlock_abi()) & !AccessFs::Execute;
    let dir = file_rw | ioctl_dev() | read_no_exec;
    (
        dir.bits(),
        (dir & AccessFs::from_file(landlock_abi())).bits(),
        read_no_exec.bits(),
    )
}

/// Highest capability number any kernel may define (dropping one the
/// running kernel lacks fails with EINVAL, harmlessly).
const CAP_LAST_POSSIBLE: libc::c_ulong = 63;
/// Securebits: uid 0 gains nothing on exec (`NOROOT`), a uid change always
/// clears capabilities (`NO_SETUID_FIXUP` locked off), `KEEP_CAPS` locked
/// off, no ambient raise; every bit locked.
const LOCKED_SECUREBITS: libc::c_ulong = 1 // SECBIT_NOROOT
    | 1 << 1 // SECBIT_NOROOT_LOCKED
    | 1 << 3 // SECBIT_NO_SETUID_FIXUP_LOCKED
    | 1 << 5 // SECBIT_KEEP_CAPS_LOCKED
    | 1 << 6 // SECBIT_NO_CAP_AMBIENT_RAISE
    | 1 << 7; // SECBIT_NO_CAP_AMBIENT_RAISE_LOCKED

fn errno() -> i32 {
    io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// Apply the sandbox to the calling (single-threaded, post-fork) process.
unsafe fn apply(
    uid: Option<(u32, u32)>,
    ruleset: Option<i32>,
    filters: &[Vec<libc::sock_filter>],
) -> io::Result<()> {
    let check = |r: libc::c_long| {
        if r < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(())
        }
    };
    // SAFETY (whole body): raw syscalls with valid arguments; see `hook`.
    unsafe {
        let core = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        check(libc::setrlimit(libc::RLIMIT_CORE, &core).into())?;
        let mut files = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut files) == 0 && files.rlim_max > MAX_OPEN_FILES
        {
            files.rlim_max = MAX_OPEN_FILES;
            files.rlim_cur = files.rlim_cur.min(MAX_OPEN_FILES);
            check(libc::setrlimit(libc::RLIMIT_NOFILE, &files).into())?;
        }
        // No capability, ever: empty the bounding set, lock uid 0 out of
        // regaining capabilities on exec, clear ambient; after the uid
        // change, empty effective/permitted/inheritable too. Without
        // CAP_SETPCAP (an unprivileged gateway) the first two fail with
        // EPERM, and there is nothing to drop.
        for cap in 0..=CAP_LAST_POSSIBLE {
            let r = libc::prctl(libc::PR_CAPBSET_DROP, cap, 0, 0, 0);
            if r < 0 && errno() == libc::EPERM {
                break;
            }
        }
        let r = libc::prctl(libc::PR_SET_SECUREBITS, LOCKED_SECUREBITS, 0, 0, 0);
        if r < 0 && errno() != libc::EPERM {
            return Err(io::Error::last_os_error());
        }
        check(
            libc::prctl(
                libc::PR_CAP_AMBIENT,
                libc::PR_CAP_AMBIENT_CLEAR_ALL,
                0,
                0,
                0,
            )
            .into(),
        )?;
        if let Some((u, g)) = uid {
            check(libc::setgroups(0, std::ptr::null()).into())?;
            check(libc::setresgid(g, g, g).into())?;
            check(libc::setresuid(u, u, u).into())?;
        }
        let header = CapHeader {
            version: LINUX_CAPABILITY_VERSION_3,
            pid: 0,
        };
        let none = [CapData::default(); 2];
        check(libc::syscall(libc::SYS_capset, &header, none.as_ptr()))?;
        check(libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0).into())?;
        if let Some(fd) = ruleset {
            check(libc::syscall(libc::SYS_landlock_restrict_self, fd, 0))?;
        }
        for f in filters {
            let prog = libc::sock_fprog {
                len: f.len() as libc::c_ushort,
                filter: f.as_ptr().cast_mut(),
            };
            check(
                libc::prctl(
                    libc::PR_SET_SECCOMP,
                    libc::SECCOMP_MODE_FILTER,
                    &prog as *const libc::sock_fprog,
                )
                .into(),
            )?;
        }
    }
    Ok(())
}

/// The tenant's Landlock ruleset: everything handled, `rw` granted fully,
/// system dirs read(-exec), devices, ptys with `IoctlDev`; signals and
/// abstract unix sockets scoped to the process's own domain. Paths that do
/// not exist are skipped. Enforcement of the handled rights is required
/// (`HardRequirement`): a kernel that cannot is reported by the probe.
/// The ruleset for a sandbox: `rw` and `ro` granted beside the system's
/// directories. Under an `image` the host's system directories are not
/// the tenant's `/`: only what the host's loader maps the worker from is
/// granted of them (and `/proc`), so a descriptor that reaches the host's
/// tree (the loader's library directories, open while the worker loads)
/// leads to nothing else of it.
fn landlock_ruleset(
    rw: &[PathBuf],
    ro: &[PathBuf],
    hidden: &[PathBuf],
    image: bool,
) -> Result<OwnedFd, String> {
    let e = |e: landlock::RulesetError| format!("landlock: {e}");
    let all = AccessFs::from_all(landlock_abi());
    let read = AccessFs::from_read(landlock_abi());
    let read_no_exec = read & !AccessFs::Execute;
    let file_rw = AccessFs::from_file(landlock_abi()) & !AccessFs::Execute;
    let ruleset = Ruleset::default()
        .set_compatibility(CompatLevel::HardRequirement)
        .handle_access(all)
        .map_err(e)?;
    let ruleset = if landlock_abi() >= ABI::V6 {
        ruleset
            .scope(Scope::Signal | Scope::AbstractUnixSocket)
            .map_err(e)?
    } else {
        ruleset
    };
    let mut created = ruleset.create().map_err(e)?;
    let mut grant = |path: &std::path::Path, access| -> Result<(), String> {
        match PathFd::new(path) {
            Ok(fd) => {
                // Files get only the file rights of `access`.
                let is_dir = path.is_dir();
                let access = if is_dir {
                    access
                } else {
                    access & AccessFs::from_file(landlock_abi())
                };
                created
                    .as_mut()
                    .add_rule(PathBeneath::new(fd, access))
                    .map(|_| ())
                    .map_err(e)
            }
            Err(_) => Ok(()),
        }
    };
    // Read-only grants go around the gateway's own files: a directory that
    // holds one is granted entry by entry instead.
    let mut ro_grants: Vec<(PathBuf, BitFlags<AccessFs>)> = Vec::new();
    let loader_dirs: Vec<PathBuf> = if image {
        crate::isolation::loader::host_loader()
            .map_err(|e| format!("the host's loader: {e}"))?
            .dirs()
            .to_vec()
    } else {
        SYSTEM_RX.iter().map(PathBuf::from).collect()
    };
    for p in &loader_dirs {
        around_hidden(p, read, hidden, 0, &mut ro_grants);
    }
    // Under the read-only system dirs, what the host keeps from other
    // users (no read bit for others: /etc/shadow, TLS and SSH host keys)
    // is kept from every tenant too, whatever its uid (uid 0 without
    // capabilities would still read a root-owned 0600 file).
    let mut hidden = hidden.to_vec();
    hidden.extend_from_slice(private_system_entries());
    let hidden = &hidden[..];
    for p in SYSTEM_RO {
        // The image has its own `/etc`, granted with its entries (`ro`).
        if image && *p == "/etc" {
            continue;
        }
        around_hidden(Path::new(p), read_no_exec, hidden, 0, &mut ro_grants);
    }
    for p in ro {
        around_hidden(p, read, hidden, 0, &mut ro_grants);
    }
    for (p, access) in ro_grants {
        grant(&p, access)?;
    }
    for p in DEVICES_RW {
        grant(std::path::Path::new(p), file_rw)?;
    }
    for p in DEVICES_PTY {
        grant(
            std::path::Path::new(p),
            file_rw | ioctl_dev() | read_no_exec,
        )?;
    }
    for p in rw {
        grant(p, all)?;
    }
    Option::<OwnedFd>::from(created)
        .ok_or_else(|| "landlock is not supported by this kernel".to_owned())
}

/// Deepest directory level expanded to go around a hidden file.
const HIDE_DEPTH: usize = 8;

/// `path` with `access`, or, when a hidden path lies beneath it, each of
/// its entries except the hidden one (recursively).
/// Read-only system dirs scanned for entries others may not read.
const SYSTEM_RO_SCANNED: &[&str] = &["/etc"];
/// Entries visited by that scan, at most.
const SCAN_LIMIT: usize = 20_000;

/// The private entries of [`SYSTEM_RO_SCANNED`], scanned once per process
/// (every tenant's ruleset and the probes use the same list).
fn private_system_entries() -> &'static [PathBuf] {
    static ENTRIES: std::sync::OnceLock<Vec<PathBuf>> = std::sync::OnceLock::new();
    ENTRIES.get_or_init(|| {
        let mut out = Vec::new();
        for p in SYSTEM_RO_SCANNED {
            private_entries(Path::new(p), 0, &mut 0, &mut out);
        }
        out
    })
}

/// Collect the entries under `dir` that others may not read (files
/// without `o+r`, directories without `o+rx`); symlinks are not followed.
fn private_entries(dir: &Path, depth: usize, seen: &mut usize, out: &mut Vec<PathBuf>) {
    use std::os::unix::fs::PermissionsExt as _;
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        *seen += 1;
        if *seen > SCAN_LIMIT {
            return;
        }
        let Ok(meta) = e.path().symlink_metadata() else {
            continue;
        };
        let mode = meta.permissions().mode();
        if meta.is_dir() {
            if mode & 0o005 != 0o005 {
                out.push(e.path());
            } else if depth + 1 < HIDE_DEPTH {
                private_entries(&e.path(), depth + 1, seen, out);
            }
        } else if meta.is_file() && mode & 0o004 == 0 {
            out.push(e.path());
        }
    }
}

fn around_hidden(
    path: &Path,
    access: BitFlags<AccessFs>,
    hidden: &[PathBuf],
    depth: usize,
    out: &mut Vec<(PathBuf, BitFlags<AccessFs>)>,
) {
    if hidden.iter().any(|h| h == path) {
        return;
    }
    // Below the granted top level, a symlink is never granted: a rule is
    // taken on what the path opens, so granting `hs.key -> ..data/hs.key`
    // would grant the hidden key itself (a Kubernetes Secret volume is laid
    // out so). Access through a symlink is checked on its target's own path.
    if depth > 0 && path.is_symlink() {
        return;
    }
    let beneath = hidden.iter().any(|h| h.starts_with(path));
    if !beneath || depth >= HIDE_DEPTH || !path.is_dir() {
        out.push((path.to_path_buf(), access));
        return;
    }
    if let Ok(entries) = std::fs::read_dir(path) {
        for e in entries.flatten() {
            around_hidden(&e.path(), access, hidden, depth + 1, out);
        }
    }
}

/// Probe a layer by doing it: run `/bin/true` under a sandbox with only
/// that layer; `Err` says why it cannot be used.
pub fn probe(spec: SandboxSpec) -> Result<(), String> {
    use std::os::unix::process::CommandExt as _;
    let sandbox = Sandbox::new(spec)?;
    let hook = sandbox.hook();
    let mut cmd = std::process::Command::new("/bin/true");
    cmd.env_clear().stdin(std::process::Stdio::null());
    // SAFETY: the hook only performs raw syscalls (see `Sandbox::hook`).
    unsafe {
        cmd.pre_exec(hook);
    }
    match cmd.status() {
        Ok(s) if s.success() => Ok(()),
        Ok(s) => Err(format!("a probe child exited with {s}")),
        Err(e) => Err(format!("a probe child could not start: {e}")),
    }
}
