//! The HTTP half of a preview: one request from a client passed to the
//! server inside a session, over an HTTP/1 connection made in the
//! tenant's network namespace, and its answer passed back.
//!
//! What the server receives is rewritten so that it can trust it: the
//! gateway's own credentials (its token, the preview cookie, the grant
//! parameter) are taken out, every `X-Exec-Gateway-*`, `Forwarded` and
//! `X-Forwarded-*` header the client sent is dropped, and the gateway's
//! own are set: who the caller is (`X-Exec-Gateway-Tenant`, `-Subject`,
//! `-Via`) and where the request came from (`X-Forwarded-For`, `-Proto`,
//! `-Host`, `-Prefix`). Hop-by-hop headers go no further in either
//! direction. Bodies stream both ways, each chunk charged to the tenant's
//! inbound or outbound byte budget while it is held, and end when they
//! move no byte for the idle timeout, or when the preview is revoked or
//! the session ends.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::BodyExt as _;
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper::header::{self, HeaderMap, HeaderName, HeaderValue};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio_util::sync::CancellationToken;

use crate::outbound::{ByteBudget, Reservation};

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;
/// A body passed on to the client.
pub type ProxyBody = http_body_util::combinators::UnsyncBoxBody<Bytes, BoxError>;
type UpBody = Watched<Incoming>;

/// Largest response head the server inside may send; also the most a
/// read from it takes at once (the body arrives in chunks of up to this).
pub const MAX_RESPONSE_HEAD_BYTES: usize = 1 << 20;

/// Why a request ended before its answer (a 410): the preview was
/// revoked or the session ended.
pub const REVOKED: &str = "the preview was revoked or its session ended";

/// The headers the gateway sets for the server inside; any the client
/// sent under these names is dropped.
pub const CALLER_HEADER_PREFIX: &str = "x-exec-gateway-";

/// Who the caller is, told to the server inside.
#[derive(Debug, Clone)]
pub struct CallerHeaders {
    pub tenant: Option<String>,
    pub subject: Option<String>,
    /// `token`, `url` or `public`.
    pub via: &'static str,
}

/// Where a request goes and how it is told.
pub struct Target {
    /// The path and query to ask the server for.
    pub path_and_query: String,
    /// `/preview/{session}/{port}` in a path preview (`X-Forwarded-Prefix`).
    pub prefix: Option<String>,
    /// A host preview: cookies the server sets stay on its host name.
    pub host_mode: bool,
    pub caller: CallerHeaders,
    pub peer: SocketAddr,
    /// `https` when the client reached the gateway over TLS.
    pub proto: &'static str,
    /// Whether the gateway's token came in `Authorization` (then it is
    /// the gateway's, not the server's, and is taken out).
    pub strip_authorization: bool,
}

/// Bounds of one request.
#[derive(Clone)]
pub struct Bounds {
    pub response_timeout: Duration,
    pub idle_timeout: Duration,
    pub inbound: Arc<ByteBudget>,
    pub outbound: Arc<ByteBudget>,
    /// Ends the request and its bodies: a revocation, the session's end;
    /// never the connection's own close (a server that closes it after
    /// each answer), which would race the answer it sent.
    pub stop: CancellationToken,
}

/// What a connection into a session holds (its slots, the session kept
/// alive) until the last of its users ends: its HTTP task, the client
/// connection that keeps it, and a websocket spliced onto it.
pub type Hold = Arc<dyn std::any::Any + Send + Sync>;

/// An HTTP/1 connection to a port inside a session.
pub struct Upstream {
    send: hyper::client::conn::http1::SendRequest<UpBody>,
    hold: Hold,
}

impl Upstream {
    /// Speak HTTP/1 over `tcp`; the connection runs in a task of its own
    /// that holds `hold` and ends at `stop`.
    pub async fn handshake<T>(
        tcp: T,
        hold: Hold,
        stop: CancellationToken,
    ) -> Result<Upstream, hyper::Error>
    where
        T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin + 'static,
    {
        let (send, conn) = hyper::client::conn::http1::Builder::new()
            .max_buf_size(MAX_RESPONSE_HEAD_BYTES)
            .handshake(TokioIo::new(tcp))
            .await?;
        let held = hold.clone();
        crate::task::start("preview-upstream", async move {
            let _hold = held;
            tokio::select! {
                r = conn.with_upgrades() => {
                    if let Err(e) = r {
                        tracing::debug!(error = %e, "preview: upstream connection");
                    }
                }
                () = stop.cancelled() => {}
            }
        });
        Ok(Upstream { send, hold })
    }

    /// Whether another request may go on this connection now: the last
    /// answer was read to its end and the connection stays open (hyper
    /// closes it after an answer that says so: HTTP/1.0 without
    /// keep-alive, `Connection: close`).
    pub fn is_ready(&self) -> bool {
        self.send.is_ready()
    }
}

/// How a request failed, as the client is told.
pub fn failure(status: StatusCode, why: &str) -> Response<ProxyBody> {
    let mut r = Response::new(
        http_body_util::Full::new(Bytes::from(format!("{why}\n")))
            .map_err(|never| match never {})
            .boxed_unsync(),
    );
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    r
}

/// Pass `req` to the server on `up`, and its answer back. An upgrade
/// (a websocket) is spliced once both sides have switched.
pub async fn send(
    up: &mut Upstream,
    mut req: Request<Incoming>,
    target: &Target,
    bounds: &Bounds,
) -> Response<ProxyBody> {
    // A body on a method whose servers often do not read one would be
    // read by the server as the next request, with headers the gateway
    // never checked: refused (GET, HEAD, TRACE), or the connection closes
    // after it (any other method a server may leave unread).
    let has_body = req.headers().contains_key(header::TRANSFER_ENCODING)
        || req
            .headers()
            .get(header::CONTENT_LENGTH)
            .is_some_and(|v| v.as_bytes() != b"0");
    let m = req.method();
    if has_body
        && (m == hyper::Method::GET || m == hyper::Method::HEAD || m == hyper::Method::TRACE)
    {
        return failure(
            StatusCode::BAD_REQUEST,
            "a GET, HEAD or TRACE request with a body",
        );
    }
    let close_after = has_body
        && !matches!(
            *m,
            hyper::Method::POST | hyper::Method::PUT | hyper::Method::PATCH
        );
    let upgrade = upgrade_of(req.headers());
    let downstream_upgrade = upgrade.is_some().then(|| hyper::upgrade::on(&mut req));
    let (parts, body) = req.into_parts();
    let mut out = Request::builder()
        .method(parts.method)
        .version(hyper::Version::HTTP_11);
    let Ok(uri) = target.path_and_query.parse::<hyper::Uri>() else {
        return failure(StatusCode::BAD_REQUEST, "bad request target");
    };
    out = out.uri(uri);
    let Some(headers) = out.headers_mut() else {
        return failure(StatusCode::BAD_REQUEST, "bad request");
    };
    request_headers(&parts.headers, headers, target, upgrade.as_ref());
    if close_after && upgrade.is_none() {
        headers.insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    let body = Watched::new(
        body,
        bounds.inbound.clone(),
        bounds.idle_timeout,
        bounds.stop.clone(),
    );
    let Ok(out) = out.body(body) else {
        return failure(StatusCode::BAD_REQUEST, "bad request");
    };
    if up.send.ready().await.is_err() {
        if bounds.stop.is_cancelled() {
            return failure(StatusCode::GONE, REVOKED);
        }
        return failure(
            StatusCode::BAD_GATEWAY,
            "the server in the session closed the connection",
        );
    }
    let answered = tokio::select! {
        r = tokio::time::timeout(bounds.response_timeout, up.send.send_request(out)) => r,
        () = bounds.stop.cancelled() => {
            return failure(StatusCode::GONE, REVOKED);
        }
    };
    let mut resp = match answered {
        Err(_) => {
            return failure(
                StatusCode::GATEWAY_TIMEOUT,
                "the server in the session did not answer in time",
            );
        }
        // The connection ended under the request because the preview was
        // revoked or the session ended: said as such.
        Ok(Err(_)) if bounds.stop.is_cancelled() => {
            return failure(StatusCode::GONE, REVOKED);
        }
        Ok(Err(e)) => {
            tracing::debug!(error = %e, "preview: upstream request");
            return failure(
                StatusCode::BAD_GATEWAY,
                "the server in the session did not answer with HTTP",
            );
        }
        Ok(Ok(r)) => r,
    };
    let switching = resp.status() == StatusCode::SWITCHING_PROTOCOLS;
    if switching {
        let (Some(down), Some(_)) = (downstream_upgrade, upgrade.as_ref()) else {
            return failure(
                StatusCode::BAD_GATEWAY,
                "the server in the session switched protocols unasked",
            );
        };
        let up_upgrade = hyper::upgrade::on(&mut resp);
        splice(down, up_upgrade, bounds.clone(), up.hold.clone());
    }
    let (mut parts, body) = resp.into_parts();
    // The gateway's own version, as every intermediary sends (RFC 9110
    // 2.5): an HTTP/1.0 server's would tell the client that this
    // connection closes after the answer, though it stays open.
    parts.version = hyper::Version::HTTP_11;
    let mut headers = HeaderMap::new();
    response_headers(&parts.headers, &mut headers, target.host_mode, switching);
    parts.headers = headers;
    let body = Watched::new(
        body,
        bounds.outbound.clone(),
        bounds.idle_timeout,
        bounds.stop.clone(),
    );
    Response::from_parts(parts, body.boxed_unsync())
}

/// The protocol a request asks to upgrade to, if it does.
fn upgrade_of(h: &HeaderMap) -> Option<HeaderValue> {
    let asks = h.get_all(header::CONNECTION).iter().any(|v| {
        v.to_str().is_ok_and(|s| {
            s.split(',')
                .any(|t| t.trim().eq_ignore_ascii_case("upgrade"))
        })
    });
    asks.then(|| h.get(header::UPGRADE).cloned()).flatten()
}

/// Headers that concern one hop only (RFC 9110 7.6.1), and any the
/// `Connection` header names.
fn hop_by_hop(h: &HeaderMap) -> Vec<HeaderName> {
    let mut names: Vec<HeaderName> = [
        header::CONNECTION,
        HeaderName::from_static("keep-alive"),
        header::PROXY_AUTHENTICATE,
        header::PROXY_AUTHORIZATION,
        header::TE,
        header::TRAILER,
        header::TRANSFER_ENCODING,
        header::UPGRADE,
        HeaderName::from_static("proxy-connection"),
    ]
    .into();
    for v in h.get_all(header::CONNECTION) {
        if let Ok(s) = v.to_str() {
            names.extend(
                s.split(',')
                    .filter_map(|t| HeaderName::try_from(t.trim()).ok()),
            );
        }
    }
    names
}

fn request_headers(
    from: &HeaderMap,
    to: &mut HeaderMap,
    target: &Target,
    upgrade: Option<&HeaderValue>,
) {
    let hop = hop_by_hop(from);
    for (name, value) in from {
        // Servers that map header names to variables (CGI, WSGI) take
        // `_` and `-` alike: `X-Exec-Gateway_Tenant` must go too.
        let n = name.as_str().replace('_', "-");
        if hop.contains(name)
            || n.starts_with(CALLER_HEADER_PREFIX)
            || n.starts_with("x-forwarded-")
            || n == "forwarded"
            || n == "x-real-ip"
            || (n == "authorization" && target.strip_authorization)
            || n == "cookie"
        {
            continue;
        }
        to.append(name.clone(), value.clone());
    }
    // The preview cookie is the gateway's; the server's own pass on.
    let cookies: Vec<&str> = from
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .map(str::trim)
        .filter(|c| !c.is_empty() && !super::is_preview_cookie(c))
        .collect();
    if !cookies.is_empty()
        && let Ok(v) = HeaderValue::from_str(&cookies.join("; "))
    {
        to.insert(header::COOKIE, v);
    }
    if let Some(u) = upgrade {
        to.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
        to.insert(header::UPGRADE, u.clone());
    }
    let set = |to: &mut HeaderMap, name: &'static str, value: &str| {
        if let Ok(v) = HeaderValue::from_str(value) {
            to.insert(HeaderName::from_static(name), v);
        }
    };
    set(to, "x-forwarded-for", &target.peer.ip().to_string());
    set(to, "x-real-ip", &target.peer.ip().to_string());
    set(to, "x-forwarded-proto", target.proto);
    if let Some(h) = from.get(header::HOST).and_then(|h| h.to_str().ok()) {
        set(to, "x-forwarded-host", h);
    }
    if let Some(p) = &target.prefix {
        set(to, "x-forwarded-prefix", p);
    }
    let c = &target.caller;
    set(to, "x-exec-gateway-via", c.via);
    if let Some(t) = &c.tenant {
        set(to, "x-exec-gateway-tenant", t);
    }
    if let Some(s) = &c.subject {
        set(to, "x-exec-gateway-subject", s);
    }
}

fn response_headers(from: &HeaderMap, to: &mut HeaderMap, host_mode: bool, switching: bool) {
    let hop = hop_by_hop(from);
    // A body the server framed with both: the chunks were decoded, its
    // length would be a lie.
    let chunked = from.contains_key(header::TRANSFER_ENCODING);
    for (name, value) in from {
        if chunked && name == header::CONTENT_LENGTH {
            continue;
        }
        let keep_for_upgrade = switching && (name == header::CONNECTION || name == header::UPGRADE);
        if hop.contains(name) && !keep_for_upgrade {
            continue;
        }
        if host_mode && name == header::SET_COOKIE {
            // A cookie for the whole preview domain would reach every
            // other session's preview: it stays on this host name.
            if let Some(v) = host_only_cookie(value) {
                to.append(name.clone(), v);
            }
            continue;
        }
        to.append(name.clone(), value.clone());
    }
}

/// `Set-Cookie` without its `Domain` attribute; none if it names the
/// gateway's own preview cookie.
fn host_only_cookie(v: &HeaderValue) -> Option<HeaderValue> {
    let s = v.to_str().ok()?;
    let mut parts = s.split(';');
    let first = parts.next()?.trim();
    if super::is_preview_cookie(first) {
        return None;
    }
    let kept: Vec<&str> = std::iter::once(first)
        .chain(parts.map(str::trim).filter(|a| {
            let key = a.split_once('=').map_or(*a, |(k, _)| k);
            !key.trim().eq_ignore_ascii_case("domain")
        }))
        .collect();
    HeaderValue::from_str(&kept.join("; ")).ok()
}

/// Both sides have switched protocols: pass bytes both ways until either
/// closes, nothing moves for the idle timeout, or `bounds.stop`.
fn splice(
    down: hyper::upgrade::OnUpgrade,
    up: hyper::upgrade::OnUpgrade,
    bounds: Bounds,
    hold: Hold,
) {
    crate::task::start("preview-upgrade", async move {
        let _hold = hold;
        let (Ok(down), Ok(up)) = (down.await, up.await) else {
            return;
        };
        let mut down = TokioIo::new(down);
        let mut up = TokioIo::new(up);
        let moved = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let copy = async {
            let mut a = Counting(&mut down, moved.clone());
            let mut b = Counting(&mut up, moved.clone());
            tokio::io::copy_bidirectional_with_sizes(&mut a, &mut b, 16 << 10, 16 << 10).await
        };
        let idle = async {
            let mut seen = u64::MAX;
            loop {
                tokio::time::sleep(bounds.idle_timeout).await;
                let now = moved.load(std::sync::atomic::Ordering::Relaxed);
                if now == seen {
                    return;
                }
                seen = now;
            }
        };
        tokio::select! {
            r = copy => {
                if let Err(e) = r {
                    tracing::debug!(error = %e, "preview: upgraded connection");
                }
            }
            () = idle => {}
            () = bounds.stop.cancelled() => {}
        }
    });
}

/// Counts the bytes read through it (the idle check of a splice).
struct Counting<'a, S>(&'a mut S, Arc<std::sync::atomic::AtomicU64>);

impl<S: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for Counting<'_, S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut *self.0).poll_read(cx, buf);
        let n = buf.filled().len() - before;
        if n > 0 {
            self.1
                .fetch_add(n as u64, std::sync::atomic::Ordering::Relaxed);
        }
        r
    }
}

impl<S: tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite for Counting<'_, S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut *self.0).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut *self.0).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut *self.0).poll_shutdown(cx)
    }
}

type Reserving = Pin<Box<dyn Future<Output = Reservation> + Send>>;

/// A body passed through: each data chunk holds its bytes of `budget`
/// until the next is asked for (the previous one was taken), and the body
/// fails when no chunk comes for `idle` or at `stop`.
pub struct Watched<B> {
    inner: B,
    budget: Arc<ByteBudget>,
    held: Option<Reservation>,
    waiting: Option<(Frame<Bytes>, Reserving)>,
    idle: Duration,
    timer: Pin<Box<tokio::time::Sleep>>,
    stop: Pin<Box<tokio_util::sync::WaitForCancellationFutureOwned>>,
}

impl<B> Watched<B> {
    pub fn new(inner: B, budget: Arc<ByteBudget>, idle: Duration, stop: CancellationToken) -> Self {
        Watched {
            inner,
            budget,
            held: None,
            waiting: None,
            idle,
            timer: Box::pin(tokio::time::sleep(idle)),
            stop: Box::pin(stop.cancelled_owned()),
        }
    }
}

#[derive(Debug, thiserror::Error)]
enum Ended {
    #[error("no byte moved for the idle timeout")]
    Idle,
    #[error("the preview was revoked or its session ended")]
    Stopped,
}

impl<B> Body for Watched<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        // The previous chunk was taken: its bytes are no longer held here.
        this.held = None;
        if this.stop.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Some(Err(Ended::Stopped.into())));
        }
        if let Some((_, reserving)) = this.waiting.as_mut() {
            let Poll::Ready(r) = reserving.as_mut().poll(cx) else {
                return Poll::Pending;
            };
            this.held = Some(r);
            let frame = this.waiting.take().map(|(f, _)| f);
            return Poll::Ready(frame.map(Ok));
        }
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                this.timer
                    .as_mut()
                    .reset(tokio::time::Instant::now() + this.idle);
                let n = frame.data_ref().map_or(0, Bytes::len);
                if n == 0 {
                    return Poll::Ready(Some(Ok(frame)));
                }
                if let Some(r) = this.budget.try_reserve(n) {
                    this.held = Some(r);
                    return Poll::Ready(Some(Ok(frame)));
                }
                let budget = this.budget.clone();
                let mut reserving: Reserving = Box::pin(async move { budget.reserve(n).await });
                if let Poll::Ready(r) = reserving.as_mut().poll(cx) {
                    this.held = Some(r);
                    return Poll::Ready(Some(Ok(frame)));
                }
                this.waiting = Some((frame, reserving));
                Poll::Pending
            }
            Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(e.into()))),
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => {
                if this.timer.as_mut().poll(cx).is_ready() {
                    return Poll::Ready(Some(Err(Ended::Idle.into())));
                }
                Poll::Pending
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.waiting.is_none() && self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
