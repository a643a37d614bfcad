//! Sockets of the gateway's own in a tenant's network namespace: a socket
//! belongs to the namespace of the thread that made it, so one thread per
//! tenant joins the namespace once and makes them on request (it does
//! nothing else, and ends when the tenant's egress does).

use std::io;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::os::fd::OwnedFd;
use std::sync::mpsc;

use nix::sys::socket::{self, AddressFamily, SockFlag, SockType, SockaddrIn, sockopt};

use crate::isolation::egress::{GATEWAY_MARK, RESOLVER_MARK, TenantNet};

/// Requests for sockets waiting at once; past it a request fails at once
/// (the tenant's connections are bounded before they get here: this is
/// a backstop).
const MAX_WAITING: usize = 256;

type Job = (SockType, tokio::sync::oneshot::Sender<io::Result<OwnedFd>>);

/// The maker of a tenant's sockets.
#[derive(Debug)]
pub struct Sockets {
    tx: mpsc::SyncSender<Job>,
}

impl Sockets {
    /// Start the thread, in `net`'s namespace.
    pub fn start(net: &TenantNet) -> io::Result<Sockets> {
        let ns = net.netns().try_clone_to_owned()?;
        let (tx, rx) = mpsc::sync_channel::<Job>(MAX_WAITING);
        let (ready_tx, ready_rx) = mpsc::channel();
        std::thread::Builder::new()
            .name("egress-sockets".into())
            .spawn(move || {
                let joined = nix::sched::setns(&ns, nix::sched::CloneFlags::CLONE_NEWNET);
                let _ = ready_tx.send(joined.map_err(io::Error::from));
                if joined.is_err() {
                    return;
                }
                drop(ns);
                while let Ok((kind, reply)) = rx.recv() {
                    let _ = reply.send(raw(kind));
                }
            })?;
        ready_rx
            .recv()
            .map_err(|_| io::Error::other("the egress socket thread ended"))??;
        Ok(Sockets { tx })
    }

    async fn make(&self, kind: SockType) -> io::Result<OwnedFd> {
        let (reply, rx) = tokio::sync::oneshot::channel();
        self.tx.try_send((kind, reply)).map_err(|e| match e {
            mpsc::TrySendError::Full(_) => io::Error::other("too many egress sockets waiting"),
            mpsc::TrySendError::Disconnected(_) => {
                io::Error::other("the egress socket thread ended")
            }
        })?;
        rx.await
            .map_err(|_| io::Error::other("the egress socket thread ended"))?
    }

    /// A TCP socket bound to `127.0.0.1:port` and listening, for the tenant's
    /// redirected connections.
    pub async fn listener(&self, port: u16) -> io::Result<tokio::net::TcpListener> {
        let fd = self.make(SockType::Stream).await?;
        socket::setsockopt(&fd, sockopt::ReuseAddr, &true)?;
        socket::bind(
            std::os::fd::AsRawFd::as_raw_fd(&fd),
            &SockaddrIn::from(SocketAddrV4::new(Ipv4Addr::LOCALHOST, port)),
        )?;
        socket::listen(
            &fd,
            socket::Backlog::new(1024).unwrap_or(socket::Backlog::MAXCONN),
        )?;
        tokio::net::TcpListener::from_std(std::net::TcpListener::from(fd))
    }

    /// A UDP socket bound to `127.0.0.1:port`, for the tenant's DNS queries.
    pub async fn udp_bound(&self, port: u16) -> io::Result<tokio::net::UdpSocket> {
        let fd = self.make(SockType::Datagram).await?;
        socket::bind(
            std::os::fd::AsRawFd::as_raw_fd(&fd),
            &SockaddrIn::from(SocketAddrV4::new(Ipv4Addr::LOCALHOST, port)),
        )?;
        tokio::net::UdpSocket::from_std(std::net::UdpSocket::from(fd))
    }

    /// A marked TCP socket, to connect out through the tenant's way out.
    pub async fn tcp_out(&self) -> io::Result<tokio::net::TcpSocket> {
        let fd = self.make(SockType::Stream).await?;
        socket::setsockopt(&fd, sockopt::Mark, &GATEWAY_MARK)?;
        Ok(tokio::net::TcpSocket::from_std_stream(
            std::net::TcpStream::from(fd),
        ))
    }

    /// A resolver-marked TCP socket (DNS over TCP to slirp4netns's).
    pub async fn resolver_tcp(&self) -> io::Result<tokio::net::TcpSocket> {
        let fd = self.make(SockType::Stream).await?;
        socket::setsockopt(&fd, sockopt::Mark, &RESOLVER_MARK)?;
        Ok(tokio::net::TcpSocket::from_std_stream(
            std::net::TcpStream::from(fd),
        ))
    }

    /// An unmarked TCP socket: its connections meet the tenant's rules as
    /// its processes' do (redirected to the proxy under names).
    pub async fn tcp_plain(&self) -> io::Result<tokio::net::TcpSocket> {
        let fd = self.make(SockType::Stream).await?;
        Ok(tokio::net::TcpSocket::from_std_stream(
            std::net::TcpStream::from(fd),
        ))
    }

    /// An unmarked UDP socket (a DNS query as the tenant's processes ask).
    pub async fn udp_plain(&self) -> io::Result<tokio::net::UdpSocket> {
        let fd = self.make(SockType::Datagram).await?;
        tokio::net::UdpSocket::from_std(std::net::UdpSocket::from(fd))
    }

    /// A resolver-marked UDP socket, for the resolver's queries out, from
    /// a port in [`RESOLVER_SOURCE_PORTS`]: one no tenant process can have.
    /// (An ephemeral port, which the tenant's queries also take, left a
    /// connection-tracking entry behind for 30 s that a tenant query from
    /// the same port then matched: it went out unredirected and was
    /// refused, or the gateway's was taken for the tenant's.)
    pub async fn udp_out(&self) -> io::Result<tokio::net::UdpSocket> {
        let fd = self.make(SockType::Datagram).await?;
        socket::setsockopt(&fd, sockopt::Mark, &RESOLVER_MARK)?;
        let (lo, hi) = (*RESOLVER_SOURCE_PORTS.start(), *RESOLVER_SOURCE_PORTS.end());
        let mut r = [0u8; 2];
        getrandom::fill(&mut r).map_err(io::Error::other)?;
        let first = u16::from_le_bytes(r) % (hi - lo + 1);
        // From a random one on, the first free.
        for i in 0..=(hi - lo) {
            let port = lo + (first + i) % (hi - lo + 1);
            let at = SockaddrIn::from(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, port));
            match socket::bind(std::os::fd::AsRawFd::as_raw_fd(&fd), &at) {
                Ok(()) => return tokio::net::UdpSocket::from_std(std::net::UdpSocket::from(fd)),
                Err(nix::errno::Errno::EADDRINUSE) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Err(io::Error::from(nix::errno::Errno::EADDRINUSE))
    }
}

/// The source ports of the resolver's queries out: below 1024, which a
/// tenant's processes (without `CAP_NET_BIND_SERVICE`) can neither bind nor
/// be given, and clear of the resolver's and the proxy's own.
pub const RESOLVER_SOURCE_PORTS: std::ops::RangeInclusive<u16> = 600..=999;

/// A non-blocking IPv4 socket of `kind`, in this thread's namespace.
fn raw(kind: SockType) -> io::Result<OwnedFd> {
    socket::socket(
        AddressFamily::Inet,
        kind,
        SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC,
        None,
    )
    .map_err(io::Error::from)
}
