//! `clone3(CLONE_INTO_CGROUP)`: a worker's child starts in its own cgroup
//! (cgroup v2, Linux 5.7+), so it never runs a step in the worker's and
//! writes no `cgroup.procs`. That write moves a running process: it takes
//! the kernel's threadgroup lock for writing, which (without the cgroup2
//! `favordynmods` mount option) waits for an RCU grace period when no
//! move happened lately, and holds every `fork` on the host meanwhile.
//! Created in its cgroup, the child takes that lock for reading only, as
//! every `fork` does. `CLONE_PIDFD` hands back the pidfd the worker would
//! otherwise open after the clone.
//!
//! glibc has no `clone3` wrapper that runs a function on a new stack, so
//! the call is made here (x86_64; elsewhere it answers ENOSYS and the
//! caller joins by `cgroup.procs`, as on cgroup v1). The child is made
//! exactly as module `vfork`'s `clone` makes it (`CLONE_VM | CLONE_VFORK`,
//! `SIGCHLD`): it runs `child` on its own stack and never returns into
//! this code.

#![allow(unsafe_code)]

use std::ffi::c_void;
use std::io;
use std::os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd};
use std::path::Path;

const CLONE_PIDFD: u64 = 0x1000;
const CLONE_INTO_CGROUP: u64 = 0x2_0000_0000;

/// `struct clone_args` up to `cgroup` (`CLONE_ARGS_SIZE_VER2`); the tests
/// of module `worker` make a process of a chosen pid with it.
#[repr(C)]
#[derive(Debug, Default)]
pub(crate) struct CloneArgs {
    pub(crate) flags: u64,
    pub(crate) pidfd: u64,
    pub(crate) child_tid: u64,
    pub(crate) parent_tid: u64,
    pub(crate) exit_signal: u64,
    pub(crate) stack: u64,
    pub(crate) stack_size: u64,
    pub(crate) tls: u64,
    pub(crate) set_tid: u64,
    pub(crate) set_tid_size: u64,
    pub(crate) cgroup: u64,
}

/// The cgroup directory a child is created in: a path descriptor (the
/// kernel checks the caller may write its `cgroup.procs`, as a move would).
pub fn open_dir(dir: &Path) -> io::Result<OwnedFd> {
    let c = super::cstring(dir)?;
    // SAFETY: a NUL-terminated path; the descriptor returned is ours.
    let fd = unsafe {
        libc::open(
            c.as_ptr(),
            libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: just opened for us.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// The kernel (or a seccomp filter above the gateway) has no
/// `clone3(CLONE_INTO_CGROUP)`: ENOSYS before 5.3, E2BIG or EINVAL (an
/// unknown flag, a larger `clone_args`) before 5.7.
pub fn unsupported(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::ENOSYS | libc::E2BIG | libc::EINVAL)
    )
}

/// Create a child in `cgroup` that shares this process's memory and runs
/// `child(arg)` on the stack `[stack, stack + size)` (16-byte aligned);
/// this thread is suspended until it execs or exits (`CLONE_VFORK`).
/// Returns its pid and pidfd.
///
/// # Safety
/// As `clone(CLONE_VM | CLONE_VFORK)`: `child` runs on the caller's memory
/// with only async-signal-safe calls and never returns (it execs or
/// `_exit`s); `arg` and the stack outlive it; every signal is blocked in
/// this thread meanwhile.
pub unsafe fn clone_vfork(
    child: extern "C" fn(*mut c_void) -> libc::c_int,
    arg: *mut c_void,
    (stack, size): (*mut u8, usize),
    cgroup: &OwnedFd,
) -> io::Result<(i32, OwnedFd)> {
    let mut pidfd: libc::c_int = -1;
    let args = CloneArgs {
        flags: libc::CLONE_VM as u64 | libc::CLONE_VFORK as u64 | CLONE_PIDFD | CLONE_INTO_CGROUP,
        pidfd: std::ptr::from_mut(&mut pidfd) as u64,
        exit_signal: libc::SIGCHLD as u64,
        stack: stack as u64,
        stack_size: size as u64,
        cgroup: cgroup.as_raw_fd() as u64,
        ..CloneArgs::default()
    };
    // SAFETY: the caller's contract; `args` and `pidfd` live across the
    // call, and the parent is back only once the child is gone from it.
    let ret = unsafe { raw_clone3(&args, child, arg) };
    if ret < 0 {
        return Err(io::Error::from_raw_os_error(-ret as i32));
    }
    // SAFETY: CLONE_PIDFD filled it with a descriptor we now own.
    let pidfd = unsafe { OwnedFd::from_raw_fd(pidfd) };
    Ok((ret as i32, pidfd))
}

/// The system call; the child side calls `child(arg)` on its new stack and
/// exits with what it returns (it never does: it execs or `_exit`s).
#[cfg(target_arch = "x86_64")]
unsafe fn raw_clone3(
    args: &CloneArgs,
    child: extern "C" fn(*mut c_void) -> libc::c_int,
    arg: *mut c_void,
) -> i64 {
    let ret: i64;
    // SAFETY: the caller's contract (see `clone_vfork`). In the parent only
    // rax, rcx and r11 change (the syscall's own). The child starts with
    // the stack pointer at the top of its stack (16-byte aligned, so
    // aligned as the ABI wants once `call` pushed its return address) and
    // leaves through `exit`, never through this function's epilogue.
    unsafe {
        std::arch::asm!(
            "syscall",
            "test rax, rax",
            "jnz 2f",
            "mov rdi, r12",
            "call r13",
            "mov edi, eax",
            "mov eax, {exit}",
            "syscall",
            "ud2",
            "2:",
            exit = const libc::SYS_exit,
            inlateout("rax") libc::SYS_clone3 => ret,
            in("rdi") std::ptr::from_ref(args),
            in("rsi") std::mem::size_of::<CloneArgs>(),
            in("r12") arg,
            in("r13") child,
            lateout("rcx") _,
            lateout("r11") _,
            options(nostack),
        );
    }
    ret
}

#[cfg(not(target_arch = "x86_64"))]
unsafe fn raw_clone3(
    _args: &CloneArgs,
    _child: extern "C" fn(*mut c_void) -> libc::c_int,
    _arg: *mut c_void,
) -> i64 {
    -i64::from(libc::ENOSYS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clone_args_has_the_kernels_layout() {
        // CLONE_ARGS_SIZE_VER2: `cgroup` is the last field it reads.
        assert_eq!(std::mem::size_of::<CloneArgs>(), 88);
        assert_eq!(std::mem::offset_of!(CloneArgs, cgroup), 80);
        assert_eq!(std::mem::offset_of!(CloneArgs, exit_signal), 32);
    }

    #[test]
    fn only_an_absent_call_is_unsupported() {
        for errno in [libc::ENOSYS, libc::E2BIG, libc::EINVAL] {
            assert!(unsupported(&io::Error::from_raw_os_error(errno)));
        }
        for errno in [libc::EACCES, libc::EPERM, libc::EBUSY, libc::ENOENT] {
            assert!(!unsupported(&io::Error::from_raw_os_error(errno)));
        }
    }
}
