//! The tenant's resolver: its DNS queries (redirected to
//! `127.0.0.1:53` in its namespace) are answered only for names its
//! policy allows; the rest get NXDOMAIN and never leave the gateway, so
//! a forbidden name cannot be used to carry data out in queries.
//! Allowed queries go on unchanged, from the gateway's own marked socket,
//! to slirp4netns's DNS address (the host's resolver), and their A
//! answers are recorded (`Resolved`).

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::sync::Arc;
use std::time::Duration;

use hickory_proto::op::{Message, MessageType, OpCode, Query, ResponseCode};
use hickory_proto::rr::{Name, RData, RecordType};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

use super::sockets::Sockets;
use super::{Decision, Shared};
use crate::isolation::egress::DNS_ADDR;

/// Queries of one tenant being answered at once; past it a query is
/// dropped (its client asks again).
pub const MAX_QUERIES_IN_FLIGHT: usize = 64;
/// DNS-over-TCP connections of one tenant at once.
pub const MAX_TCP_CLIENTS: usize = 16;
/// How long the upstream resolver may take for one try (two tries).
const UPSTREAM_TIMEOUT: Duration = Duration::from_secs(3);
/// A DNS-over-TCP client idle this long is closed.
const TCP_IDLE: Duration = Duration::from_secs(10);

/// Answer UDP queries on `sock` until the tenant's egress ends.
pub async fn serve_udp(sock: tokio::net::UdpSocket, shared: Arc<Shared>) {
    let sock = Arc::new(sock);
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_QUERIES_IN_FLIGHT));
    let mut buf = vec![0u8; 4096];
    loop {
        let Ok((n, peer)) = sock.recv_from(&mut buf).await else {
            continue;
        };
        let Ok(permit) = slots.clone().try_acquire_owned() else {
            continue;
        };
        let query = buf[..n].to_vec();
        let (sock, shared) = (sock.clone(), shared.clone());
        crate::task::start("egress-dns-query", async move {
            if let Some(answer) = answer(&shared, &query, false).await {
                let _ = sock.send_to(&answer, peer).await;
            }
            drop(permit);
        });
    }
}

/// Answer DNS over TCP on `listener`.
pub async fn serve_tcp(listener: tokio::net::TcpListener, shared: Arc<Shared>) {
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_TCP_CLIENTS));
    loop {
        let Ok((mut conn, _)) = listener.accept().await else {
            continue;
        };
        let Ok(permit) = slots.clone().try_acquire_owned() else {
            continue;
        };
        let shared = shared.clone();
        crate::task::start("egress-dns-tcp", async move {
            loop {
                let mut len = [0u8; 2];
                let read = tokio::time::timeout(TCP_IDLE, conn.read_exact(&mut len)).await;
                if !matches!(read, Ok(Ok(_))) {
                    break;
                }
                let mut query = vec![0u8; usize::from(u16::from_be_bytes(len))];
                if !matches!(
                    tokio::time::timeout(TCP_IDLE, conn.read_exact(&mut query)).await,
                    Ok(Ok(_))
                ) {
                    break;
                }
                let Some(answer) = answer(&shared, &query, true).await else {
                    break;
                };
                let Ok(len) = u16::try_from(answer.len()) else {
                    break;
                };
                if conn.write_all(&len.to_be_bytes()).await.is_err()
                    || conn.write_all(&answer).await.is_err()
                {
                    break;
                }
            }
            drop(permit);
        });
    }
}

/// The reply to one query; `None` to drop it (not a DNS query at all).
async fn answer(shared: &Shared, query: &[u8], tcp: bool) -> Option<Vec<u8>> {
    let msg = Message::from_vec(query).ok()?;
    if msg.metadata.message_type != MessageType::Query {
        return None;
    }
    let reply = |code: ResponseCode| {
        let mut r = Message::error_msg(msg.metadata.id, msg.metadata.op_code, code);
        r.metadata.recursion_desired = msg.metadata.recursion_desired;
        r.metadata.recursion_available = true;
        r.add_queries(msg.queries.iter().cloned());
        r.to_vec().ok()
    };
    let [q] = msg.queries.as_slice() else {
        return reply(ResponseCode::FormErr);
    };
    if msg.metadata.op_code != OpCode::Query {
        return reply(ResponseCode::NotImp);
    }
    let Some(name) = crate::config::normalize_host(&q.name().to_ascii()) else {
        shared.decide(&Decision::dns_denied(
            &q.name().to_ascii(),
            "not a host name",
        ));
        return reply(ResponseCode::NXDomain);
    };
    if !shared.names().allows(&name, None) {
        shared.decide(&Decision::dns_denied(&name, "not in egress_names"));
        return reply(ResponseCode::NXDomain);
    }
    match upstream(shared, query, tcp).await {
        Ok(bytes) => {
            if let Ok(m) = Message::from_vec(&bytes)
                && q.query_type() == RecordType::A
            {
                let (addrs, ttl) = a_records(&m);
                shared.resolved.record(&name, &addrs, ttl);
            }
            shared.decide(&Decision::dns_allowed(&name, &shared.names()));
            Some(bytes)
        }
        Err(e) => {
            tracing::debug!(tenant = %shared.tenant, name, error = %e, "egress resolver: upstream failed");
            reply(ResponseCode::ServFail)
        }
    }
}

/// The A records of an answer, and the shortest TTL among them.
fn a_records(m: &Message) -> (Vec<Ipv4Addr>, Duration) {
    let mut ttl = u32::MAX;
    let addrs = m
        .answers
        .iter()
        .filter_map(|r| match &r.data {
            RData::A(a) => {
                ttl = ttl.min(r.ttl);
                Some(a.0)
            }
            _ => None,
        })
        .collect();
    (addrs, Duration::from_secs(u64::from(ttl.min(86_400))))
}

/// Send `query` to slirp4netns's resolver from a marked socket, over UDP
/// (two tries; a truncated answer is asked again over TCP) or TCP.
async fn upstream(shared: &Shared, query: &[u8], tcp: bool) -> std::io::Result<Vec<u8>> {
    ask(&shared.sockets, true, query, tcp).await
}

/// Send `query` to the namespace's DNS address from a socket of the
/// gateway's: `marked` past the redirection (the resolver's own), or not
/// (then asked as the tenant's processes ask: under names, of the
/// resolver, with its policy).
async fn ask(sockets: &Sockets, marked: bool, query: &[u8], tcp: bool) -> std::io::Result<Vec<u8>> {
    let dns = SocketAddr::V4(SocketAddrV4::new(DNS_ADDR, 53));
    if !tcp {
        let sock = if marked {
            sockets.udp_out().await?
        } else {
            sockets.udp_plain().await?
        };
        sock.connect(dns).await?;
        let mut buf = vec![0u8; 4096];
        for _ in 0..2 {
            sock.send(query).await?;
            let Ok(got) = tokio::time::timeout(UPSTREAM_TIMEOUT, sock.recv(&mut buf)).await else {
                continue;
            };
            let n = got?;
            // Same id as asked, else not ours.
            if n < 12 || buf[..2] != query[..2] {
                continue;
            }
            let truncated = buf[2] & 0x02 != 0;
            if !truncated {
                return Ok(buf[..n].to_vec());
            }
            break;
        }
    }
    let sock = if marked {
        sockets.resolver_tcp().await?
    } else {
        sockets.tcp_plain().await?
    };
    let mut conn = tokio::time::timeout(UPSTREAM_TIMEOUT, sock.connect(dns))
        .await
        .map_err(|_| std::io::Error::other("resolver connect timed out"))??;
    let len = u16::try_from(query.len()).map_err(|_| std::io::Error::other("query too long"))?;
    conn.write_all(&len.to_be_bytes()).await?;
    conn.write_all(query).await?;
    let mut l = [0u8; 2];
    tokio::time::timeout(UPSTREAM_TIMEOUT, conn.read_exact(&mut l))
        .await
        .map_err(|_| std::io::Error::other("resolver timed out"))??;
    let mut out = vec![0u8; usize::from(u16::from_be_bytes(l))];
    tokio::time::timeout(UPSTREAM_TIMEOUT, conn.read_exact(&mut out))
        .await
        .map_err(|_| std::io::Error::other("resolver timed out"))??;
    Ok(out)
}

/// `name`'s IPv4 addresses as the proxy connects to them: a fresh
/// recorded answer, else a query of its own (recorded too).
pub async fn resolve(shared: &Shared, name: &str) -> std::io::Result<Vec<Ipv4Addr>> {
    if let Some(a) = shared.resolved.fresh(name) {
        return Ok(a);
    }
    let (addrs, ttl) = lookup(&shared.sockets, true, name).await?;
    shared.resolved.record(name, &addrs, ttl);
    Ok(addrs)
}

/// `name`'s IPv4 addresses and their TTL, asked from the namespace's DNS
/// address (`marked`: see [`ask`]).
pub async fn lookup(
    sockets: &Sockets,
    marked: bool,
    name: &str,
) -> std::io::Result<(Vec<Ipv4Addr>, Duration)> {
    let qname = Name::from_ascii(format!("{}.", name.trim_end_matches('.')))
        .map_err(|e| std::io::Error::other(format!("{name}: {e}")))?;
    let mut q = Message::query();
    q.metadata.recursion_desired = true;
    q.add_query(Query::query(qname, RecordType::A));
    let bytes = q.to_vec().map_err(std::io::Error::other)?;
    let answer = ask(sockets, marked, &bytes, false).await?;
    let m = Message::from_vec(&answer).map_err(std::io::Error::other)?;
    let (addrs, ttl) = a_records(&m);
    if addrs.is_empty() {
        return Err(std::io::Error::other(format!(
            "{name} has no IPv4 address ({})",
            m.metadata.response_code
        )));
    }
    Ok((addrs, ttl))
}
