//! The tenant's connections out, redirected to `127.0.0.1:1019` in its
//! namespace: each is decided by the name it carries (TLS SNI, HTTP
//! `Host`) or, without one, by the name its address was resolved from,
//! then joined to a connection the gateway makes from its own marked
//! socket in the same namespace (so the tenant's address rules, its
//! connection cap and slirp4netns's costs apply to it as to any other).
//!
//! A connection that names a host goes to that host's addresses as the
//! gateway resolves them, never to an address the process picked: a
//! mismatched SNI reaches the name's server or nothing.

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;

use super::sniff::{MAX_SNIFF_BYTES, Proto, Sniff, sniff};
use super::{Decision, Shared, Via};
use crate::isolation::egress::PROXY_PORT;

/// How long a connection may take to send the bytes that name its host
/// (when its address names none).
const SNIFF_TIMEOUT: Duration = Duration::from_secs(10);
/// How long the connection out may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Each direction's copy buffer.
const COPY_BUFFER: usize = 64 << 10;

/// Accept the tenant's redirected connections until its egress ends.
pub async fn serve(listener: tokio::net::TcpListener, shared: Arc<Shared>) {
    loop {
        let Ok((conn, _)) = listener.accept().await else {
            continue;
        };
        // The tenant's connections out are bounded like its others:
        // past its cap a new one is closed at once.
        let Ok(permit) = shared.slots.clone().try_acquire_owned() else {
            reset(conn);
            shared.decide(&Decision::denied(
                None,
                None,
                0,
                Via::Address,
                "max_egress_connections",
            ));
            continue;
        };
        let shared = shared.clone();
        crate::task::start("egress-connection", async move {
            handle(conn, &shared).await;
            drop(permit);
        });
    }
}

/// Close with a reset: the client sees ECONNRESET, as from a refusing peer.
fn reset(conn: TcpStream) {
    abort_on_close(&conn);
    drop(conn);
}

/// `SO_LINGER` zero: the close sends a reset, at once (it never blocks).
fn abort_on_close(conn: &TcpStream) {
    let _ = nix::sys::socket::setsockopt(
        conn,
        nix::sys::socket::sockopt::Linger,
        &libc::linger {
            l_onoff: 1,
            l_linger: 0,
        },
    );
}

/// Where the client meant to connect (before the redirect); `None` for a
/// connection made to the proxy's own address.
fn original_destination(conn: &TcpStream) -> Option<SocketAddrV4> {
    let raw = nix::sys::socket::getsockopt(conn, nix::sys::socket::sockopt::OriginalDst).ok()?;
    let addr = SocketAddrV4::new(
        Ipv4Addr::from(u32::from_be(raw.sin_addr.s_addr)),
        u16::from_be(raw.sin_port),
    );
    (addr != SocketAddrV4::new(Ipv4Addr::LOCALHOST, PROXY_PORT)).then_some(addr)
}

async fn handle(mut client: TcpStream, shared: &Shared) {
    let Some(dest) = original_destination(&client) else {
        reset(client);
        return;
    };
    let (addr, port) = (*dest.ip(), dest.port());
    // The allowed name this address was resolved from, if any.
    let names = shared.names();
    let attributed = shared
        .resolved
        .names_of(addr)
        .into_iter()
        .find(|n| names.allows(n, Some(port)));
    let mut first = Vec::new();
    // An attributed address is connected at once: a server-first
    // protocol (SSH, SMTP) sends before its client does.
    let mut early = None;
    let sniffed = match &attributed {
        None => read_name(&mut client, &mut first).await,
        Some(name) => {
            let up = match connect(shared, dest).await {
                Ok(u) => u,
                Err(e) => {
                    let why = format!("connect: {e}");
                    shared.decide(&Decision::denied(
                        Some(name),
                        Some(addr),
                        port,
                        Via::Address,
                        &why,
                    ));
                    reset(client);
                    return;
                }
            };
            let s = tokio::select! {
                s = read_name(&mut client, &mut first) => s,
                _ = up.readable() => None,
            };
            early = Some(up);
            s
        }
    };
    let (name, via) = match (sniffed, attributed) {
        (Some(Sniff::Name(proto, name)), _) => (name, Via::of(proto)),
        (Some(Sniff::Opaque) | None, Some(attributed)) => (attributed, Via::Address),
        (Some(Sniff::Malformed(proto)), _) => {
            shared.decide(&Decision::denied(
                None,
                Some(addr),
                port,
                Via::of(proto),
                "malformed",
            ));
            refuse(client, Some(proto), None).await;
            return;
        }
        (Some(Sniff::More), _) => {
            reset(client);
            return;
        }
        // TLS or HTTP that names no host: they always can (SNI, `Host`),
        // and an address alone would let them reach any site sharing it.
        (Some(Sniff::Nameless(proto)), _) => {
            shared.decide(&Decision::denied(
                None,
                Some(addr),
                port,
                Via::of(proto),
                "no host name",
            ));
            refuse(client, Some(proto), None).await;
            return;
        }
        (Some(Sniff::Opaque) | None, None) => {
            shared.decide(&Decision::denied(
                None,
                Some(addr),
                port,
                Via::Address,
                "no name, and the address was not resolved from an allowed name",
            ));
            refuse(client, None, None).await;
            return;
        }
    };
    let proto = match via {
        Via::Tls => Some(Proto::Tls),
        Via::Http => Some(Proto::Http),
        _ => None,
    };
    let Some(rule) = names.rule_for(&name, Some(port)).map(ToString::to_string) else {
        shared.decide(&Decision::denied(
            Some(&name),
            Some(addr),
            port,
            via,
            "not in egress_names",
        ));
        refuse(client, proto, Some(&name)).await;
        return;
    };
    // Where to connect: the address the process chose when it is one of
    // the name's, else the name's first.
    let target = if shared.resolved.resolves_to(&name, addr) {
        addr
    } else {
        match super::dns::resolve(shared, &name).await {
            Ok(addrs) if addrs.contains(&addr) => addr,
            Ok(addrs) => addrs[0],
            Err(e) => {
                tracing::debug!(tenant = %shared.tenant, name, error = %e, "egress: cannot resolve");
                shared.decide(&Decision::denied(
                    Some(&name),
                    Some(addr),
                    port,
                    via,
                    "does not resolve",
                ));
                reset(client);
                return;
            }
        }
    };
    if target.is_loopback() || target.is_unspecified() {
        shared.decide(&Decision::denied(
            Some(&name),
            Some(target),
            port,
            via,
            "resolves to loopback",
        ));
        reset(client);
        return;
    }
    let upstream = match early {
        Some(up) if target == addr => Ok(up),
        _ => connect(shared, SocketAddrV4::new(target, port)).await,
    };
    let mut upstream = match upstream {
        Ok(u) => u,
        Err(e) => {
            shared.decide(&Decision::denied(
                Some(&name),
                Some(target),
                port,
                via,
                &format!("connect: {e}"),
            ));
            reset(client);
            return;
        }
    };
    shared.decide(&Decision::allowed(&name, target, port, via, &rule));
    let live = shared.live.open(&name, port);
    if via == Via::Tls
        && let Some(sub) = &shared.substitution
        && sub.intercepts(&name, port)
    {
        super::substitute::intercept::serve(
            client, first, upstream, &name, port, sub, shared, live,
        )
        .await;
        return;
    }
    // One request per plain HTTP connection: a next one could name
    // another host (pipelined, or after a keep-alive).
    if via == Via::Http {
        first = close_after_first(&first);
    }
    if !first.is_empty() && upstream.write_all(&first).await.is_err() {
        return;
    }
    drop(first);
    tokio::select! {
        _ = tokio::io::copy_bidirectional_with_sizes(&mut client, &mut upstream, COPY_BUFFER, COPY_BUFFER) => {}
        () = live.closed() => {
            // The policy no longer allows it.
            abort_on_close(&client);
        }
    }
}

/// Read the client's first bytes until they name a host (or show they
/// will not); `None` if it sent nothing for [`SNIFF_TIMEOUT`].
async fn read_name(client: &mut TcpStream, buf: &mut Vec<u8>) -> Option<Sniff> {
    let deadline = tokio::time::Instant::now() + SNIFF_TIMEOUT;
    let mut chunk = vec![0u8; 4096];
    loop {
        let n = match tokio::time::timeout_at(deadline, client.read(&mut chunk)).await {
            Err(_) if buf.is_empty() => return None,
            Err(_) => return Some(sniff_final(buf)),
            Ok(Ok(0) | Err(_)) => return Some(Sniff::More),
            Ok(Ok(n)) => n,
        };
        buf.extend_from_slice(&chunk[..n]);
        match sniff(buf) {
            Sniff::More if buf.len() < MAX_SNIFF_BYTES => {}
            Sniff::More => return Some(sniff_final(buf)),
            done => return Some(done),
        }
    }
}

/// What incomplete first bytes amount to once no more come.
fn sniff_final(buf: &[u8]) -> Sniff {
    match buf.first() {
        Some(0x16) => Sniff::Malformed(Proto::Tls),
        _ => Sniff::Opaque,
    }
}

/// Tell a refused client why, in its protocol, and close.
async fn refuse(mut client: TcpStream, proto: Option<Proto>, name: Option<&str>) {
    match proto {
        Some(Proto::Tls) => super::sniff::refuse_tls(client).await,
        Some(Proto::Http) => {
            let body = format!(
                "exec-gateway: egress to {} is not allowed for this tenant (egress_names)\n",
                name.unwrap_or("this address")
            );
            let head = format!(
                "HTTP/1.1 403 Forbidden\r\nContent-Type: text/plain\r\nConnection: close\r\nContent-Length: {}\r\n\r\n",
                body.len()
            );
            let _ = client.write_all(head.as_bytes()).await;
            let _ = client.write_all(body.as_bytes()).await;
            let _ = client.shutdown().await;
        }
        None => reset(client),
    }
}

/// The connection out, from a marked socket in the tenant's namespace.
async fn connect(shared: &Shared, to: SocketAddrV4) -> std::io::Result<TcpStream> {
    let sock = shared.sockets.tcp_out().await?;
    let conn = tokio::time::timeout(CONNECT_TIMEOUT, sock.connect(SocketAddr::V4(to)))
        .await
        .map_err(|_| std::io::Error::other("timed out"))??;
    conn.set_nodelay(true)?;
    Ok(conn)
}

/// `first`, an HTTP request head and what followed it, with its
/// `Connection` made `close` (its `Keep-Alive` dropped), so the server
/// answers it alone; a request to upgrade the connection is left as it is.
fn close_after_first(first: &[u8]) -> Vec<u8> {
    let Some(end) = first.windows(4).position(|w| w == b"\r\n\r\n") else {
        return first.to_vec();
    };
    let head = &first[..end];
    let named = |line: &[u8], name: &str| {
        line.iter()
            .position(|b| *b == b':')
            .is_some_and(|i| line[..i].trim_ascii().eq_ignore_ascii_case(name.as_bytes()))
    };
    let lines: Vec<&[u8]> = head.split(|b| *b == b'\n').collect();
    if lines.iter().any(|l| named(l, "upgrade")) {
        return first.to_vec();
    }
    let mut out = Vec::with_capacity(first.len() + 19);
    for l in lines {
        if named(l, "connection") || named(l, "keep-alive") || named(l, "proxy-connection") {
            continue;
        }
        out.extend_from_slice(l.strip_suffix(b"\r").unwrap_or(l));
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"Connection: close\r\n\r\n");
    out.extend_from_slice(&first[end + 4..]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plain_http_request_asks_the_server_to_close_after_it() {
        let r = close_after_first(
            b"GET / HTTP/1.1\r\nHost: a.test\r\nConnection: keep-alive\r\nKeep-Alive: 5\r\n\r\nGET / HTTP/1.1\r\nHost: b.test\r\n\r\n",
        );
        assert_eq!(
            String::from_utf8(r).unwrap(),
            "GET / HTTP/1.1\r\nHost: a.test\r\nConnection: close\r\n\r\nGET / HTTP/1.1\r\nHost: b.test\r\n\r\n"
        );
        let up =
            b"GET / HTTP/1.1\r\nHost: a.test\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n";
        assert_eq!(close_after_first(up), up.to_vec());
    }
}
