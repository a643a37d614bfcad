//! The seccomp programs of a tenant's processes: a deny-list (EPERM) and
//! the calls whose arguments seccomp cannot read answered ENOSYS (`clone3`
//! and `openat2`: libc falls back to `clone` and `openat`, whose flags and
//! modes the deny-list checks).
//!
//! A worker that spawns with `clone3(CLONE_INTO_CGROUP)` (cgroup v2: each
//! child starts in its own cgroup, with no `cgroup.procs` write) runs
//! without the `clone3` answer ([`Programs::worker`]) and installs
//! [`seal`] in every child before its exec: each tenant process still has
//! every program, the worker (the gateway's own code, not dumpable, out of
//! reach of `ptrace`) alone may call `clone3`.

use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock};

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule,
};

/// The programs a process installs, in order.
#[derive(Debug, Default)]
pub struct Programs {
    /// A tenant's process (and a worker that does not seal its children).
    pub all: Vec<Vec<libc::sock_filter>>,
    /// A worker that seals its children: `all` but `clone3`.
    pub worker: Vec<Vec<libc::sock_filter>>,
}

/// Socket families refused to tenant processes (`socket(2)`'s domain).
const DENIED_SOCKET_FAMILIES: &[libc::c_int] = &[libc::AF_VSOCK, libc::AF_PACKET, libc::AF_KEY];

/// Syscalls no tenant process needs: tracing and reading other processes,
/// kernel attack surface (bpf, io_uring, userfaultfd, perf, keyrings),
/// mounts and namespaces, modules, kexec, clock and swap control.
const DENIED: &[libc::c_long] = &[
    libc::SYS_ptrace,
    libc::SYS_process_vm_readv,
    libc::SYS_process_vm_writev,
    libc::SYS_bpf,
    libc::SYS_keyctl,
    libc::SYS_add_key,
    libc::SYS_request_key,
    libc::SYS_perf_event_open,
    libc::SYS_userfaultfd,
    libc::SYS_io_uring_setup,
    libc::SYS_io_uring_enter,
    libc::SYS_io_uring_register,
    libc::SYS_kexec_load,
    libc::SYS_kexec_file_load,
    libc::SYS_init_module,
    libc::SYS_finit_module,
    libc::SYS_delete_module,
    libc::SYS_open_by_handle_at,
    libc::SYS_name_to_handle_at,
    libc::SYS_mount,
    libc::SYS_umount2,
    libc::SYS_pivot_root,
    libc::SYS_fsopen,
    libc::SYS_fsconfig,
    libc::SYS_fsmount,
    libc::SYS_fspick,
    libc::SYS_move_mount,
    libc::SYS_open_tree,
    libc::SYS_mount_setattr,
    libc::SYS_unshare,
    libc::SYS_setns,
    libc::SYS_swapon,
    libc::SYS_swapoff,
    libc::SYS_reboot,
    libc::SYS_acct,
    libc::SYS_quotactl,
    libc::SYS_syslog,
    libc::SYS_settimeofday,
    libc::SYS_clock_settime,
    libc::SYS_iopl,
    libc::SYS_ioperm,
    // Would let a tenant process take its worker's link to the gateway.
    libc::SYS_pidfd_getfd,
];

/// Namespace flags refused to `clone`.
const CLONE_NAMESPACES: &[u64] = &[
    libc::CLONE_NEWUSER as u64,
    libc::CLONE_NEWNS as u64,
    libc::CLONE_NEWPID as u64,
    libc::CLONE_NEWNET as u64,
    libc::CLONE_NEWUTS as u64,
    libc::CLONE_NEWIPC as u64,
    libc::CLONE_NEWCGROUP as u64,
];

/// The programs as the kernel takes them, compiled once: the same for
/// every tenant (each activation would otherwise compile them again).
pub(super) fn compiled() -> Result<Arc<Programs>, String> {
    static COMPILED: OnceLock<Result<Arc<Programs>, String>> = OnceLock::new();
    COMPILED
        .get_or_init(|| {
            let arch = arch()?;
            let deny = kernel_layout(deny_list(arch)?)?;
            let enosys = |calls: &[i64]| kernel_layout(answer_enosys(calls, arch)?);
            Ok(Arc::new(Programs {
                all: vec![
                    deny.clone(),
                    enosys(&[libc::SYS_clone3, libc::SYS_openat2])?,
                ],
                worker: vec![deny, enosys(&[libc::SYS_openat2])?],
            }))
        })
        .clone()
}

/// What a sealing worker installs in each child before its exec: `clone3`
/// answered ENOSYS, the one program [`Programs::worker`] leaves out.
pub fn seal() -> Result<Vec<libc::sock_filter>, String> {
    kernel_layout(answer_enosys(&[libc::SYS_clone3], arch()?)?)
}

fn arch() -> Result<seccompiler::TargetArch, String> {
    std::env::consts::ARCH
        .try_into()
        .map_err(|e: seccompiler::BackendError| format!("seccomp: {e}"))
}

fn kernel_layout(program: BpfProgram) -> Result<Vec<libc::sock_filter>, String> {
    Ok(program
        .iter()
        .map(|i| libc::sock_filter {
            code: i.code,
            jt: i.jt,
            jf: i.jf,
            k: i.k,
        })
        .collect())
}

/// `calls` answered ENOSYS (libc falls back to an older call whose
/// arguments the deny-list can read), everything else allowed.
fn answer_enosys(calls: &[i64], arch: seccompiler::TargetArch) -> Result<BpfProgram, String> {
    let e = |e: seccompiler::BackendError| format!("seccomp: {e}");
    SeccompFilter::new(
        calls.iter().map(|n| (*n, Vec::new())).collect(),
        SeccompAction::Allow,
        SeccompAction::Errno(libc::ENOSYS as u32),
        arch,
    )
    .map_err(e)?
    .try_into()
    .map_err(e)
}

/// The deny-list: EPERM for the calls and arguments no tenant process
/// needs, everything else allowed.
fn deny_list(arch: seccompiler::TargetArch) -> Result<BpfProgram, String> {
    let e = |e: seccompiler::BackendError| format!("seccomp: {e}");
    let mut deny: BTreeMap<i64, Vec<SeccompRule>> =
        DENIED.iter().map(|n| (*n, Vec::new())).collect();
    let clone_rules = CLONE_NAMESPACES
        .iter()
        .map(|flag| {
            SeccompCondition::new(
                0,
                SeccompCmpArgLen::Qword,
                SeccompCmpOp::MaskedEq(*flag),
                *flag,
            )
            .and_then(|c| SeccompRule::new(vec![c]))
        })
        .collect::<Result<Vec<_>, _>>()
        .map_err(e)?;
    deny.insert(libc::SYS_clone, clone_rules);
    // Socket families that reach past the host's network stack: the
    // hypervisor (vsock) and the kernel's own configuration (netlink is
    // kept: `ip` and glibc's getaddrinfo read through it).
    let socket_rules = DENIED_SOCKET_FAMILIES
        .iter()
        .map(|family| {
            SeccompCondition::new(0, SeccompCmpArgLen::Dword, SeccompCmpOp::Eq, *family as u64)
                .and_then(|c| SeccompRule::new(vec![c]))
        })
        .collect::<Result<Vec<_>, _>>()
        .map_err(e)?;
    deny.insert(libc::SYS_socket, socket_rules);
    // Setting another process's limits: where a tenant shares the
    // gateway's uid (a gateway not run as root) it could shrink the
    // gateway's RLIMIT_NOFILE and stop every accept. Its own (pid 0, what
    // setrlimit sends) and reading any (no new limit) stay allowed.
    deny.insert(
        libc::SYS_prlimit64,
        vec![
            SeccompRule::new(vec![
                SeccompCondition::new(0, SeccompCmpArgLen::Dword, SeccompCmpOp::Ne, 0)
                    .map_err(e)?,
                SeccompCondition::new(2, SeccompCmpArgLen::Qword, SeccompCmpOp::Ne, 0)
                    .map_err(e)?,
            ])
            .map_err(e)?,
        ],
    );
    // No setuid or setgid bits: a tenant whose root is idmapped creates
    // files the host sees as the root owner's (root's, typically), so a
    // setuid file it made would be a setuid-root program for anyone on
    // the host. (Inside, no_new_privs makes the bits meaningless anyway.)
    for (nr, rules) in set_id_mode_rules().map_err(e)? {
        deny.entry(nr).or_default().extend(rules);
    }
    let deny = SeccompFilter::new(
        deny,
        SeccompAction::Allow,
        SeccompAction::Errno(libc::EPERM as u32),
        arch,
    )
    .map_err(e)?;
    deny.try_into().map_err(e)
}

/// Rules matching a mode argument with `S_ISUID` or `S_ISGID`, for the
/// calls that set a mode (open-like ones only when they create).
fn set_id_mode_rules() -> Result<Vec<(i64, Vec<SeccompRule>)>, seccompiler::BackendError> {
    const SET_ID: u64 = 0o6000;
    let creating = [libc::O_CREAT as u64, libc::O_TMPFILE as u64];
    // (syscall, mode argument, flags argument)
    let calls: &[(i64, u8, Option<u8>)] = &[
        (libc::SYS_chmod, 1, None),
        (libc::SYS_fchmod, 1, None),
        (libc::SYS_fchmodat, 2, None),
        (libc::SYS_fchmodat2, 2, None),
        (libc::SYS_creat, 1, None),
        (libc::SYS_mknod, 1, None),
        (libc::SYS_mknodat, 2, None),
        (libc::SYS_open, 2, Some(1)),
        (libc::SYS_openat, 3, Some(2)),
    ];
    let mut out = Vec::new();
    for &(nr, mode, flags) in calls {
        let mut rules = Vec::new();
        for bits in [0o4000, 0o2000, 0o6000] {
            let m = SeccompCondition::new(
                mode,
                SeccompCmpArgLen::Dword,
                SeccompCmpOp::MaskedEq(SET_ID),
                bits,
            )?;
            match flags {
                None => rules.push(SeccompRule::new(vec![m])?),
                Some(f) => {
                    for c in creating {
                        let f = SeccompCondition::new(
                            f,
                            SeccompCmpArgLen::Dword,
                            SeccompCmpOp::MaskedEq(c),
                            c,
                        )?;
                        rules.push(SeccompRule::new(vec![m.clone(), f])?);
                    }
                }
            }
        }
        out.push((nr, rules));
    }
    Ok(out)
}
