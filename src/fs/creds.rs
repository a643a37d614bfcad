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
