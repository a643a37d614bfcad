//! One intercepted connection: TLS ended with the tenant CA's certificate
//! for the name, HTTP/1.1 requests read one at a time, each checked to
//! name the same host, its header values' placeholders replaced, and sent
//! on over the gateway's own verified TLS connection to that host.

use std::collections::BTreeSet;
use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{Either, Full};
use hyper::body::Incoming;
use hyper::header::{CONTENT_LENGTH, HOST, HeaderValue, TRANSFER_ENCODING, UPGRADE};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

use super::{Substitution, Value};
use crate::egress::live::Entry;
use crate::egress::{Decision, Shared, Via};

/// How long either TLS handshake may take.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a request's head may take to arrive.
const HEAD_TIMEOUT: Duration = Duration::from_secs(30);
/// The largest request head taken (its headers' names and values): room
/// for a secret of the largest size `http/request` may already have put in.
const MAX_HEAD_BYTES: usize = 128 << 10;
/// The largest its headers may grow to with the values put in (a header
/// of placeholders must not make the gateway build megabytes).
pub const MAX_SUBSTITUTED_HEAD_BYTES: usize = 256 << 10;

type Body = Either<Incoming, Full<Bytes>>;

/// The client's stream, with the bytes already read from it (its
/// ClientHello) given back first.
struct Replayed {
    first: Vec<u8>,
    at: usize,
    inner: TcpStream,
}

impl AsyncRead for Replayed {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        if self.at < self.first.len() {
            let n = (self.first.len() - self.at).min(buf.remaining());
            let at = self.at;
            buf.put_slice(&self.first[at..at + n]);
            self.at += n;
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for Replayed {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// What one connection did, for its audit event.
#[derive(Default)]
struct Tally {
    requests: AtomicU64,
    /// Requests naming another host (answered 421).
    misdirected: AtomicU64,
    /// Requests whose headers were too large (answered 431).
    refused: AtomicU64,
    substituted: parking_lot::Mutex<BTreeSet<String>>,
}

/// Serve the tenant's connection `client` (whose ClientHello is `first`)
/// to `name`:`port`, already allowed, over `upstream` (connected to the
/// name's address).
#[allow(clippy::too_many_arguments)]
pub(in crate::egress) async fn serve(
    client: TcpStream,
    first: Vec<u8>,
    upstream: TcpStream,
    name: &str,
    port: u16,
    sub: &Substitution,
    shared: &Shared,
    live: Entry,
) {
    let addr = upstream.peer_addr().ok().and_then(|a| match a.ip() {
        std::net::IpAddr::V4(v4) => Some(v4),
        std::net::IpAddr::V6(_) => None,
    });
    let deny = |why: &str| {
        shared.decide(&Decision::denied(Some(name), addr, port, Via::Tls, why));
    };
    // The host first: a client never meets the tenant's CA for a host
    // whose own certificate does not verify.
    let Ok(server_name) = rustls::pki_types::ServerName::try_from(name.to_owned()) else {
        deny("not a TLS server name");
        return;
    };
    let connector = tokio_rustls::TlsConnector::from(sub.upstream.clone());
    let up = match tokio::time::timeout(HANDSHAKE_TIMEOUT, connector.connect(server_name, upstream))
        .await
    {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => {
            deny(&format!("the host's TLS: {e}"));
            super::super::sniff::refuse_tls(client).await;
            return;
        }
        Err(_) => {
            deny("the host's TLS: timed out");
            super::super::sniff::refuse_tls(client).await;
            return;
        }
    };
    let config = match sub.ca.server_config(name) {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!(tenant = %shared.tenant, name, error = %e, "egress: cannot make the intercepting certificate");
            deny("intercepting certificate");
            super::super::sniff::refuse_tls(client).await;
            return;
        }
    };
    // The handshake's records go out as written (Nagle would hold the
    // last behind the client's delayed ACK: 40 ms a connection).
    let _ = client.set_nodelay(true);
    let acceptor = tokio_rustls::TlsAcceptor::from(config);
    let replayed = Replayed {
        first,
        at: 0,
        inner: client,
    };
    let Ok(Ok(down)) = tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(replayed)).await
    else {
        // The client refused the tenant CA's certificate (it pins, or
        // does not trust the bundle) or went away.
        deny("the client's TLS (does it trust the tenant's CA bundle?)");
        return;
    };
    let (sender, conn) = match hyper::client::conn::http1::Builder::new()
        .handshake::<_, Incoming>(TokioIo::new(up))
        .await
    {
        Ok(pair) => pair,
        Err(e) => {
            deny(&format!("the host's HTTP: {e}"));
            return;
        }
    };
    let upstream_conn = crate::task::start("egress-intercept-upstream", async move {
        let _ = conn.with_upgrades().await;
    });
    let ctx = Arc::new(Forward {
        name: name.to_owned(),
        port,
        values: sub.values(&shared.tenant, name, port),
        sender: tokio::sync::Mutex::new(sender),
        tally: Tally::default(),
        upgrade: parking_lot::Mutex::new(None),
    });
    let service = {
        let ctx = ctx.clone();
        hyper::service::service_fn(move |req| {
            let ctx = ctx.clone();
            async move { Ok::<_, Infallible>(ctx.forward(req).await) }
        })
    };
    let served = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(HEAD_TIMEOUT)
        .max_buf_size(2 * MAX_HEAD_BYTES)
        .serve_connection(TokioIo::new(down), service)
        .with_upgrades();
    // An upgraded connection (a WebSocket) is still this one: it holds
    // the tenant's connection slot and closes with a policy change.
    let closed = tokio::select! {
        _ = served => false,
        () = live.closed() => true,
    };
    let upgrade = ctx.upgrade.lock().take();
    if let Some(mut copy) = upgrade {
        if !closed {
            tokio::select! {
                _ = &mut copy => {}
                () = live.closed() => {}
            }
        }
        copy.abort();
    }
    upstream_conn.abort();
    let misdirected = ctx.tally.misdirected.load(Ordering::Relaxed);
    if misdirected > 0 {
        deny(&format!(
            "{misdirected} request(s) on the intercepted connection named another host (421)"
        ));
    }
    let refused = ctx.tally.refused.load(Ordering::Relaxed);
    if refused > 0 {
        deny(&format!(
            "{refused} request(s) on the intercepted connection had headers over the bounds (431)"
        ));
    }
    let used = std::mem::take(&mut *ctx.tally.substituted.lock());
    let requests = ctx.tally.requests.load(Ordering::Relaxed);
    if !used.is_empty() {
        crate::audit::emit(
            "egress.substituted",
            &crate::audit::Who {
                tenant: Some(&shared.tenant),
                ..Default::default()
            },
            serde_json::json!({
                "name": crate::audit::clip(name),
                "port": port,
                "requests": requests,
                "secrets": used.into_iter().collect::<Vec<_>>(),
            }),
        );
    }
}

/// One intercepted connection's requests.
struct Forward {
    name: String,
    port: u16,
    values: Vec<Value>,
    sender: tokio::sync::Mutex<hyper::client::conn::http1::SendRequest<Incoming>>,
    tally: Tally,
    /// The copy of an upgraded connection, once there is one.
    upgrade: parking_lot::Mutex<Option<tokio::task::JoinHandle<()>>>,
}

fn plain(status: StatusCode, text: &str) -> Response<Body> {
    let mut r = Response::new(Either::Right(Full::new(Bytes::from(format!(
        "exec-gateway: {text}\n"
    )))));
    *r.status_mut() = status;
    r.headers_mut()
        .insert("content-type", HeaderValue::from_static("text/plain"));
    r.headers_mut()
        .insert("connection", HeaderValue::from_static("close"));
    r
}

impl Forward {
    /// Whether an authority (`Host`, or an absolute URI's) names this
    /// connection's host and port.
    fn same_host(&self, authority: &str) -> bool {
        let (host, port) = match authority.rsplit_once(':') {
            Some((h, p)) if !h.contains(']') => (h, p.parse::<u16>().ok()),
            _ => (authority, Some(443)),
        };
        let host = host.strip_suffix('.').unwrap_or(host);
        host.eq_ignore_ascii_case(&self.name) && port == Some(self.port)
    }

    async fn forward(&self, mut req: Request<Incoming>) -> Response<Body> {
        self.tally.requests.fetch_add(1, Ordering::Relaxed);
        // Every name the request gives must be the connection's: a secret
        // goes to the host it is bound to, never to another site served
        // from the same address (domain fronting).
        let hosts: Vec<String> = req
            .headers()
            .get_all(HOST)
            .iter()
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
            .chain(req.uri().authority().map(|a| a.as_str().to_owned()))
            .collect();
        if hosts.is_empty() || !hosts.iter().all(|h| self.same_host(h)) {
            self.tally.misdirected.fetch_add(1, Ordering::Relaxed);
            return plain(
                StatusCode::MISDIRECTED_REQUEST,
                "this connection's requests must name its host (Host and TLS name differ)",
            );
        }
        if req.uri().authority().is_some() {
            let origin_form = req
                .uri()
                .path_and_query()
                .map_or("/", |p| p.as_str())
                .parse();
            match origin_form {
                Ok(u) => *req.uri_mut() = u,
                Err(_) => return plain(StatusCode::BAD_REQUEST, "bad request target"),
            }
        }
        // One framing only on the way on: a body that is chunked has no
        // length besides (the host reads what hyper framed, nothing of the
        // body as a request of its own).
        if req.headers().contains_key(TRANSFER_ENCODING) {
            req.headers_mut().remove(CONTENT_LENGTH);
        }
        let head: usize = req
            .headers()
            .iter()
            .map(|(k, v)| k.as_str().len() + v.len() + 4)
            .sum();
        if head > MAX_HEAD_BYTES {
            self.tally.refused.fetch_add(1, Ordering::Relaxed);
            return plain(
                StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
                "request headers over 128 KiB",
            );
        }
        // What the values would make of them, counted before anything is
        // built.
        let grown: usize = req.headers().values().map(|v| self.grown_len(v)).sum();
        if head + grown > MAX_SUBSTITUTED_HEAD_BYTES {
            self.tally.refused.fetch_add(1, Ordering::Relaxed);
            return plain(
                StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
                "request headers over 256 KiB with the secrets' values in",
            );
        }
        for v in req.headers_mut().values_mut() {
            if let Some(new) = self.substituted(v) {
                *v = new;
            }
        }
        let client_upgrade = req
            .headers()
            .contains_key(UPGRADE)
            .then(|| hyper::upgrade::on(&mut req));
        let mut sender = self.sender.lock().await;
        if sender.ready().await.is_err() {
            return plain(StatusCode::BAD_GATEWAY, "the host closed the connection");
        }
        let mut resp = match sender.send_request(req).await {
            Ok(r) => r,
            Err(e) => {
                return plain(StatusCode::BAD_GATEWAY, &format!("the host: {e}"));
            }
        };
        drop(sender);
        if resp.status() == StatusCode::SWITCHING_PROTOCOLS
            && let Some(client_upgrade) = client_upgrade
        {
            let host_upgrade = hyper::upgrade::on(&mut resp);
            let copy = crate::task::start("egress-intercept-upgrade", async move {
                if let (Ok(c), Ok(h)) = (client_upgrade.await, host_upgrade.await) {
                    let (mut c, mut h) = (TokioIo::new(c), TokioIo::new(h));
                    let _ = tokio::io::copy_bidirectional(&mut c, &mut h).await;
                }
            });
            *self.upgrade.lock() = Some(copy);
        }
        resp.map(Either::Left)
    }

    /// How many bytes `v` gains with its placeholders replaced.
    fn grown_len(&self, v: &HeaderValue) -> usize {
        let bytes = v.as_bytes();
        self.values
            .iter()
            .map(|x| {
                let p = x.placeholder.as_bytes();
                let mut n = 0;
                let mut at = 0;
                while let Some(i) = bytes[at..].windows(p.len()).position(|w| w == p) {
                    n += 1;
                    at += i + p.len();
                }
                n * x.value.len().saturating_sub(p.len())
            })
            .sum()
    }

    /// `v` with every bound placeholder in it replaced by its value, if it
    /// holds one.
    fn substituted(&self, v: &HeaderValue) -> Option<HeaderValue> {
        let bytes = v.as_bytes();
        let present: Vec<&Value> = self
            .values
            .iter()
            .filter(|x| {
                bytes
                    .windows(x.placeholder.len())
                    .any(|w| w == x.placeholder.as_bytes())
            })
            .collect();
        if present.is_empty() {
            return None;
        }
        // Bytes, not text: what surrounds a placeholder goes on as it came.
        let mut out = bytes.to_vec();
        let mut used = self.tally.substituted.lock();
        for x in present {
            out = replace_all(&out, x.placeholder.as_bytes(), x.value.as_bytes());
            used.insert(x.secret.clone());
        }
        let mut out = HeaderValue::from_bytes(&out).ok()?;
        out.set_sensitive(true);
        Some(out)
    }
}

/// `hay` with every `needle` in it replaced by `with`.
fn replace_all(hay: &[u8], needle: &[u8], with: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(hay.len());
    let mut at = 0;
    while let Some(i) = hay[at..].windows(needle.len()).position(|w| w == needle) {
        out.extend_from_slice(&hay[at..at + i]);
        out.extend_from_slice(with);
        at += i + needle.len();
    }
    out.extend_from_slice(&hay[at..]);
    out
}

#[cfg(test)]
mod tests {
    use super::replace_all;

    #[test]
    fn only_the_placeholder_changes() {
        assert_eq!(
            replace_all(b"\xffBearer PH and PH\xfe", b"PH", b"value"),
            b"\xffBearer value and value\xfe".to_vec()
        );
        assert_eq!(replace_all(b"none", b"PH", b"v"), b"none".to_vec());
    }
}
