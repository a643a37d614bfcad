//! File descriptors the gateway inherited from whoever started it (a shell
//! redirect, a supervisor, a test harness) must never reach a worker or a
//! tenant process: one of them may be a key file.

#![allow(unsafe_code)]

/// Mark every descriptor above stderr close-on-exec. Called once at
/// start-up, before any thread or child exists; descriptors the gateway
/// opens itself are close-on-exec already (Rust opens them so), and the ones
/// it hands to a child are dup'ed into place after fork.
pub fn close_inherited_on_exec() {
    // SAFETY: close_range only changes descriptor flags.
    let r = unsafe {
        libc::syscall(
            libc::SYS_close_range,
            3u32,
            u32::MAX,
            libc::CLOSE_RANGE_CLOEXEC,
        )
    };
    if r == 0 {
        return;
    }
    // Kernels before 5.11: one fcntl per open descriptor.
    let Ok(dir) = std::fs::read_dir("/proc/self/fd") else {
        return;
    };
    let fds: Vec<i32> = dir
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .filter(|fd| *fd > 2)
        .collect();
    for fd in fds {
        // SAFETY: flag change on a descriptor number; a stale one (the
        // directory's own) fails harmlessly with EBADF.
        unsafe {
            libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC);
        }
    }
}
