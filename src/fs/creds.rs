//! The tenant credentials one file operation runs as (`setfsuid`/`setfsgid`
//! on the blocking thread, restored when the operation ends).

/// The blocking thread's filesystem uid/gid switched to a tenant's for one
/// operation, and back to the gateway's when dropped. `setfsuid` is per
/// thread, and a non-zero fsuid drops the thread's file capabilities
/// (`CAP_DAC_OVERRIDE`...), so the kernel checks the tenant's permissions.
pub struct FsCreds {
    uid: libc::uid_t,
    gid: libc::gid_t,
}

impl FsCreds {
    #[allow(unsafe_code)]
    pub fn assume((uid, gid): (u32, u32)) -> FsCreds {
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

/// Give up this thread's supplementary groups (a raw `setgroups`, which
/// changes the calling thread only: libc's would change every thread of
/// the gateway). For a thread that reads as a tenant and then ends: a
/// tenant's processes have no supplementary groups, so the thread must not
/// read through the gateway's.
#[allow(unsafe_code)]
pub fn drop_thread_groups() -> std::io::Result<()> {
    // SAFETY: a raw syscall with a zero-length list.
    let r = unsafe {
        libc::syscall(
            libc::SYS_setgroups,
            0 as libc::size_t,
            std::ptr::null::<libc::gid_t>(),
        )
    };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}
