//! Capabilities: the raw `capget`/`capset` structures, and what the gateway
//! gives up of its own at start.

#![allow(unsafe_code)]

use std::io;

pub(super) const LINUX_CAPABILITY_VERSION_3: u32 = 0x2008_0522;

/// `struct __user_cap_header_struct`.
#[repr(C)]
pub(super) struct CapHeader {
    pub(super) version: u32,
    pub(super) pid: libc::c_int,
}

/// `struct __user_cap_data_struct` (two of them for version 3).
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub(super) struct CapData {
    pub(super) effective: u32,
    pub(super) permitted: u32,
    pub(super) inheritable: u32,
}

/// `CAP_SYS_RESOURCE`.
const CAP_SYS_RESOURCE: u32 = 24;

/// Give up `CAP_SYS_RESOURCE` (effective, permitted, inheritable) before
/// any thread starts: every thread made afterwards lacks it. A holder
/// writes past disk quotas (the kernel's quota code lets it through), so
/// the gateway's own file operations on a tenant's behalf would not be
/// bound by the tenant's project quota. The gateway needs it for nothing:
/// its limits are lowered, never raised, past the hard limit. A no-op
/// without the capability.
pub fn drop_sys_resource() -> io::Result<()> {
    let header = CapHeader {
        version: LINUX_CAPABILITY_VERSION_3,
        pid: 0,
    };
    let mut data = [CapData::default(); 2];
    // SAFETY: capget/capset of the calling thread with a version-3 header
    // and the two data structs that version takes.
    unsafe {
        if libc::syscall(libc::SYS_capget, &header, data.as_mut_ptr()) < 0 {
            return Err(io::Error::last_os_error());
        }
        let bit = 1u32 << (CAP_SYS_RESOURCE % 32);
        let d = &mut data[(CAP_SYS_RESOURCE / 32) as usize];
        if d.effective & bit == 0 && d.permitted & bit == 0 {
            return Ok(());
        }
        d.effective &= !bit;
        d.permitted &= !bit;
        d.inheritable &= !bit;
        if libc::syscall(libc::SYS_capset, &header, data.as_ptr()) < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}
