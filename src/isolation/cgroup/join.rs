//! Joining a cgroup from a forked child, before exec (async-signal-safe).

#![allow(unsafe_code)]

use std::io;

/// Move the calling process into the cgroup whose `cgroup.procs` is
/// `procs` (writing "0" means "myself"). Safe between fork and exec:
/// open/write/close on a path computed before fork, nothing allocated.
pub fn join_self(procs: &std::ffi::CStr) -> io::Result<()> {
    // SAFETY: async-signal-safe syscalls on a valid NUL-terminated path; the
    // fd is closed on every path.
    unsafe {
        let fd = libc::open(procs.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        let ok = libc::write(fd, b"0".as_ptr().cast(), 1) == 1;
        let err = io::Error::last_os_error();
        libc::close(fd);
        if ok { Ok(()) } else { Err(err) }
    }
}
