//! A TCP connection to a port on a tenant's own loopback, made from
//! inside its network namespace.

#![allow(unsafe_code)]

use std::io;
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::os::fd::{AsRawFd as _, OwnedFd};
use std::sync::Arc;

use crate::isolation::egress::TenantNet;

/// Connect to `127.0.0.1:port` in `net`'s namespace. A thread of its own
/// joins the namespace (a thread's namespace is its own; it ends after,
/// so no other work ever runs in it) and connects; the socket it made
/// stays in that namespace, and is handed back non-blocking.
pub async fn connect(net: &Arc<TenantNet>, port: u16) -> io::Result<tokio::net::TcpStream> {
    let ns: OwnedFd = net.netns().try_clone_to_owned()?;
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("forward-connect".into())
        .spawn(move || {
            let _ = tx.send(connect_in(&ns, port));
        })?;
    let stream = rx
        .await
        .map_err(|_| io::Error::other("the connecting thread ended"))??;
    stream.set_nonblocking(true)?;
    stream.set_nodelay(true)?;
    tokio::net::TcpStream::from_std(stream)
}

fn connect_in(ns: &OwnedFd, port: u16) -> io::Result<TcpStream> {
    // SAFETY: setns on a descriptor we hold, for this thread alone; the
    // thread does nothing else and ends.
    if unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) } < 0 {
        return Err(io::Error::last_os_error());
    }
    TcpStream::connect_timeout(
        &SocketAddr::from((Ipv4Addr::LOCALHOST, port)),
        super::CONNECT_TIMEOUT,
    )
}
