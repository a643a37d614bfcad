//! The parent a PID namespace's init leaves outside it: a fresh exec of
//! this binary (`exec-gateway pidns-parent`), holding nothing of the
//! gateway's, prepared before fork and exec'd after it.

#![allow(unsafe_code)]

use std::io;
use std::os::fd::{AsRawFd as _, OwnedFd};

/// `exec-gateway pidns-parent`, ready to exec after fork: the binary as an
/// `O_PATH` descriptor, argv and an empty environment.
#[derive(Debug)]
pub(super) struct PidParentExec {
    exe: OwnedFd,
    _args: [std::ffi::CString; 2],
    argv: [*const libc::c_char; 3],
    envp: [*const libc::c_char; 1],
}

// SAFETY: the pointers point into `_args`, owned alongside and never
// changed; they are only read (by execveat).
unsafe impl Send for PidParentExec {}
// SAFETY: as above.
unsafe impl Sync for PidParentExec {}

impl PidParentExec {
    pub(super) fn new() -> io::Result<PidParentExec> {
        use std::os::fd::FromRawFd as _;
        // SAFETY: a plain open; the descriptor is ours.
        let exe = unsafe {
            let fd = libc::open(c"/proc/self/exe".as_ptr(), libc::O_PATH | libc::O_CLOEXEC);
            if fd < 0 {
                return Err(io::Error::last_os_error());
            }
            OwnedFd::from_raw_fd(fd)
        };
        let args = [c"exec-gateway".to_owned(), c"pidns-parent".to_owned()];
        let argv = [args[0].as_ptr(), args[1].as_ptr(), std::ptr::null()];
        Ok(PidParentExec {
            exe,
            _args: args,
            argv,
            envp: [std::ptr::null()],
        })
    }

    /// Exec it; returns only on failure.
    pub(super) unsafe fn exec(&self) {
        // SAFETY: NUL-terminated argv/envp arrays that outlive the call.
        unsafe {
            libc::syscall(
                libc::SYS_execveat,
                self.exe.as_raw_fd(),
                c"".as_ptr(),
                self.argv.as_ptr(),
                self.envp.as_ptr(),
                libc::AT_EMPTY_PATH,
            );
        }
    }
}
