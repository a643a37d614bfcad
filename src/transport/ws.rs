//! The websocket door: hyper serves HTTP/1 on the listener (admitted and
//! timed by `transport::limits`), answers `/healthz` and a bare
//! `/readyz` for load balancers, and upgrades any other path to a
//! websocket carrying one JSON-RPC message per frame.
//!
//! The handshake is ours (not tungstenite's) so that a `Sec-WebSocket-Extensions`
//! offer such as permessage-deflate is *declined* per RFC 7692 (no extension
//! in the answer) instead of killing the connection as the reference does.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::{SinkExt as _, StreamExt as _};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{self, HeaderValue};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::{CloseFrame, Role, WebSocketConfig};
use tokio_tungstenite::tungstenite::{Error as WsError, Message};
use tokio_util::sync::CancellationToken;

use super::authenticate::{Caller, authenticate};
use super::connection::{ConnMeta, InFrame, OnClose, Relay, serve_connection};
use super::limits::{Conn, ConnectionLimits, Door, Guarded};
use super::relay::RelayOrigin;
use crate::gateway::Gateway;
use crate::outbound::{OutFrame, Outbound, QueuedText};

/// Largest HTTP request head accepted.
pub const MAX_HEADER_BYTES: usize = 16 * 1024;
/// Outbound frames written before one flush.
const WRITE_BATCH: usize = 32;

/// Accept connections until the gateway stops. Each is unauthenticated
/// (bounded by `limits`, closed at the handshake timeout) until its
/// upgrade authenticates.
pub async fn serve(listener: TcpListener, gw: Arc<Gateway>, limits: Arc<ConnectionLimits>) {
    while let Some((tcp, peer)) = super::next_connection(&listener, &gw, "websocket").await {
        let Some(conn) = limits.accept(Door::Websocket, peer.ip()) else {
            drop(tcp);
            continue;
        };
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!(error = %e, "set_nodelay failed");
        }
        let gw = gw.clone();
        let timeout = limits.handshake_timeout;
        crate::task::spawn("http-conn", async move {
            let io = Guarded::new(tcp, conn.clone(), Some(peer));
            let svc =
                hyper::service::service_fn(move |req| handle(req, gw.clone(), peer, conn.clone()));
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(timeout)
                .max_buf_size(MAX_HEADER_BYTES.max(8192))
                .serve_connection(TokioIo::new(io), svc)
                .with_upgrades();
            if let Err(e) = conn.await {
                tracing::debug!(%peer, error = %e, "http connection ended");
            }
        });
    }
}

fn response(status: StatusCode, body: impl Into<Bytes>) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(body.into()));
    *r.status_mut() = status;
    r
}

fn header_has_token(req: &Request<Incoming>, name: header::HeaderName, token: &str) -> bool {
    req.headers().get_all(name).iter().any(|v| {
        v.to_str()
            .map(|s| s.split(',').any(|t| t.trim().eq_ignore_ascii_case(token)))
            .unwrap_or(false)
    })
}

async fn handle(
    req: Request<Incoming>,
    gw: Arc<Gateway>,
    peer: SocketAddr,
    conn: Arc<Conn>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let is_upgrade = header_has_token(&req, header::CONNECTION, "upgrade")
        && header_has_token(&req, header::UPGRADE, "websocket");
    let registry_route = match super::registry::route(req.uri().path()) {
        Some(super::registry::Route::Register(id)) => Some((true, id.to_owned())),
        Some(super::registry::Route::Rendezvous(id)) => Some((false, id.to_owned())),
        None => None,
    };
    if !is_upgrade {
        if let Some((true, id)) = &registry_route
            && req.method() == hyper::Method::POST
        {
            let timeout = gw.settings.handshake_timeout;
            return Ok(super::registry::register(req, &gw, id, timeout).await);
        }
        return Ok(super::http::route_public(&req, &gw));
    }
    if req.method() != hyper::Method::GET {
        return Ok(response(
            StatusCode::METHOD_NOT_ALLOWED,
            "websocket upgrade needs GET\n",
        ));
    }
    // A browser page can open a websocket to any address and always says
    // where it comes from; exec-server clients send no Origin. Refuse one
    // that is not allowed, before authentication.
    if let Some(origin) = req.headers().get(header::ORIGIN) {
        let allowed = origin
            .to_str()
            .is_ok_and(|o| gw.settings.allowed_origins.iter().any(|a| a == o));
        if !allowed {
            tracing::info!(%peer, "websocket handshake with an Origin header refused");
            return Ok(response(StatusCode::FORBIDDEN, "origin not allowed\n"));
        }
    }
    if req
        .headers()
        .get(header::SEC_WEBSOCKET_VERSION)
        .map(HeaderValue::as_bytes)
        != Some(b"13")
    {
        let mut r = response(
            StatusCode::UPGRADE_REQUIRED,
            "unsupported websocket version\n",
        );
        r.headers_mut().insert(
            header::SEC_WEBSOCKET_VERSION,
            HeaderValue::from_static("13"),
        );
        return Ok(r);
    }
    let Some(key) = req.headers().get(header::SEC_WEBSOCKET_KEY) else {
        return Ok(response(
            StatusCode::BAD_REQUEST,
            "missing Sec-WebSocket-Key\n",
        ));
    };
    if let Some((false, id)) = &registry_route {
        let key = key.as_bytes().to_vec();
        return Ok(rendezvous(req, &gw, id, &conn, &key));
    }
    // Authenticate before the upgrade; the token is never logged.
    let token = crate::auth::bearer_token(
        req.headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok()),
        req.uri().query(),
    );
    let caller = match authenticate(&gw, token.as_deref()).await {
        Ok(c) => c,
        Err(e) => {
            tracing::info!(%peer, reason = e.outcome(), "websocket handshake refused");
            let status = StatusCode::from_u16(e.http_status()).unwrap_or(StatusCode::UNAUTHORIZED);
            let mut r = response(status, format!("{e}\n"));
            if status == StatusCode::UNAUTHORIZED {
                r.headers_mut().insert(
                    header::WWW_AUTHENTICATE,
                    HeaderValue::from_static("Bearer error=\"invalid_token\""),
                );
            }
            return Ok(r);
        }
    };
    if let Err(e) = conn.promote(caller.tenant()) {
        tracing::info!(%peer, tenant = %caller.tenant().name, "websocket refused: connection cap reached");
        let _ = e;
        return Ok(response(
            StatusCode::SERVICE_UNAVAILABLE,
            "connection limit reached; retry later\n",
        ));
    }
    let accept = tokio_tungstenite::tungstenite::handshake::derive_accept_key(key.as_bytes());
    let mut req = req;
    let upgrade = hyper::upgrade::on(&mut req);
    let limit = gw.settings.max_message_bytes;
    crate::task::spawn("ws-conn", async move {
        match upgrade.await {
            Ok(upgraded) => {
                let ws = server_websocket(upgraded, limit, WS_MAX_WRITE_BUFFER_BYTES).await;
                let relay = match (&gw.fleet, token) {
                    (Some(_), Some(token)) => Some(Arc::new(RelayOrigin {
                        token,
                        client: peer,
                    }) as Arc<dyn Relay>),
                    _ => None,
                };
                run(ws, gw, peer, caller, relay).await;
            }
            Err(e) => tracing::debug!(%peer, error = %e, "websocket upgrade failed"),
        }
    });
    Ok(switching_protocols(&accept))
}

/// The server side of an upgraded connection, messages up to `limit` bytes.
async fn server_websocket(
    upgraded: hyper::upgrade::Upgraded,
    limit: usize,
    max_write_buffer: usize,
) -> WebSocketStream<TokioIo<hyper::upgrade::Upgraded>> {
    let config = WebSocketConfig::default()
        .max_message_size(Some(limit))
        .max_frame_size(Some(limit))
        .read_buffer_size(WS_READ_BUFFER_BYTES)
        .write_buffer_size(WS_WRITE_BUFFER_BYTES)
        .max_write_buffer_size(max_write_buffer);
    WebSocketStream::from_raw_socket(TokioIo::new(upgraded), Role::Server, Some(config)).await
}

/// The 101 answer that completes a handshake.
fn switching_protocols(accept: &str) -> Response<Full<Bytes>> {
    let mut r = response(StatusCode::SWITCHING_PROTOCOLS, Bytes::new());
    let h = r.headers_mut();
    h.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
    h.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
    if let Ok(v) = HeaderValue::from_str(accept) {
        h.insert(header::SEC_WEBSOCKET_ACCEPT, v);
    }
    r
}

/// An executor dialling its rendezvous URL: the ticket is checked before
/// the upgrade, and the websocket becomes a link of its pool.
fn rendezvous(
    mut req: Request<Incoming>,
    gw: &Arc<Gateway>,
    executor_id: &str,
    conn: &Arc<Conn>,
    key: &[u8],
) -> Response<Full<Bytes>> {
    let (registry, ticket) = match super::registry::rendezvous(&req, gw, executor_id) {
        Ok(v) => v,
        Err(r) => return *r,
    };
    if conn.promote_link().is_err() {
        registry.refused("connections");
        return response(
            StatusCode::SERVICE_UNAVAILABLE,
            "connection limit reached; retry later\n",
        );
    }
    let accept = tokio_tungstenite::tungstenite::handshake::derive_accept_key(key);
    // An executor's messages are bounded like a client's: a larger one
    // (an `fs/readFile` answer of a big file) ends the link.
    let limit = gw.settings.max_message_bytes;
    let upgrade = hyper::upgrade::on(&mut req);
    crate::task::spawn("executor-link", async move {
        match upgrade.await {
            Ok(upgraded) => {
                // Calls go to the executor whole (up to the message limit).
                let ws = server_websocket(upgraded, limit, limit + WS_WRITE_BUFFER_BYTES).await;
                registry.attach(ticket, crate::executors::Link::start(ws));
            }
            Err(e) => tracing::debug!(error = %e, "executor link upgrade failed"),
        }
    });
    switching_protocols(&accept)
}

/// Bytes read from the socket per read call. Small keeps idle sessions cheap
/// (tungstenite keeps this much zero-filled per connection: at 8 KiB, a
/// third of an idle session's 26 KiB); large messages are assembled across
/// reads, 512 of them for a 1 MiB one.
const WS_READ_BUFFER_BYTES: usize = 2 * 1024;
/// Bytes of frames gathered before tungstenite writes to the socket.
const WS_WRITE_BUFFER_BYTES: usize = 64 * 1024;
/// Bytes queued in tungstenite beyond which a write fails and the
/// connection ends: room for one fragment and what a client that sends
/// pings and never reads makes us queue in pongs (it is cut off here).
const WS_MAX_WRITE_BUFFER_BYTES: usize = 4 * 1024 * 1024;
/// Messages larger than this go out as fragments of about this size
/// (RFC 6455 §5.4): a large reply is never copied whole into the write
/// buffer, and the buffer's bound above stays small.
const WS_FRAGMENT_BYTES: usize = 1024 * 1024;

/// Ping and pong frames a client may send per second (on average over
/// [`CONTROL_WINDOW`]) before the connection is closed.
const MAX_CONTROL_FRAMES_PER_SECOND: u32 = 50;
const CONTROL_WINDOW: Duration = Duration::from_secs(10);

/// Counts control frames in fixed windows.
#[derive(Default)]
struct ControlBudget {
    window_start: Option<tokio::time::Instant>,
    count: u32,
}

impl ControlBudget {
    /// Count one; true once the window's budget is spent.
    fn note(&mut self, now: tokio::time::Instant) -> bool {
        match self.window_start {
            Some(start) if now.duration_since(start) < CONTROL_WINDOW => self.count += 1,
            _ => {
                self.window_start = Some(now);
                self.count = 1;
            }
        }
        let limit = MAX_CONTROL_FRAMES_PER_SECOND * CONTROL_WINDOW.as_secs() as u32;
        self.count > limit
    }
}

/// Feed one text message, fragmented when large (cut at UTF-8 boundaries).
async fn feed_text<S>(sink: &mut S, text: String) -> Result<(), WsError>
where
    S: futures_util::Sink<Message, Error = WsError> + Unpin,
{
    use tokio_tungstenite::tungstenite::protocol::frame::Frame;
    use tokio_tungstenite::tungstenite::protocol::frame::coding::{Data, OpCode};
    if text.len() <= WS_FRAGMENT_BYTES {
        return sink.feed(Message::text(text)).await;
    }
    let mut cuts = Vec::new();
    let mut start = 0;
    while start < text.len() {
        let mut end = (start + WS_FRAGMENT_BYTES).min(text.len());
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        cuts.push((start, end));
        start = end;
    }
    let bytes = Bytes::from(text.into_bytes());
    let last = cuts.len() - 1;
    for (i, (a, b)) in cuts.into_iter().enumerate() {
        let opcode = OpCode::Data(if i == 0 { Data::Text } else { Data::Continue });
        sink.feed(Message::Frame(Frame::message(
            bytes.slice(a..b),
            opcode,
            i == last,
        )))
        .await?;
    }
    Ok(())
}

/// Serve one JSON-RPC connection over `ws` (the server role, whoever
/// dialled) for `caller`.
pub(crate) async fn run<S>(
    ws: WebSocketStream<S>,
    gw: Arc<Gateway>,
    peer: SocketAddr,
    caller: Caller,
    relay: Option<Arc<dyn Relay>>,
) where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (mut sink, mut stream) = ws.split();
    let (out, mut rx) = Outbound::channel(caller.tenant().outbound.clone());
    let done = CancellationToken::new();
    let slow_client_timeout = gw.settings.slow_client_timeout;

    // Writer: batches whatever is queued, flushes once, and gives up on a
    // client that stalls a write past the slow-client timeout.
    let writer_done = done.clone();
    let writer = crate::task::spawn("ws-writer", async move {
        let mut batch = Vec::with_capacity(WRITE_BATCH);
        loop {
            let first = tokio::select! {
                f = rx.recv() => f,
                () = writer_done.cancelled() => None,
            };
            let Some(first) = first else { break };
            batch.push(first);
            while batch.len() < WRITE_BATCH {
                match rx.try_recv() {
                    Ok(f) => batch.push(f),
                    Err(_) => break,
                }
            }
            let write = async {
                let mut close = None;
                // Reservations are released once their frames are flushed
                // to the socket (not when copied into the write buffer).
                let mut written = Vec::with_capacity(batch.len());
                for frame in batch.drain(..) {
                    match frame {
                        OutFrame::Text(queued) => {
                            let QueuedText { text, held } = *queued;
                            feed_text(&mut sink, text).await?;
                            written.push(held);
                        }
                        OutFrame::Close(c) => {
                            close = Some(CloseFrame {
                                code: CloseCode::from(c.code),
                                reason: c.reason.into(),
                            });
                            break;
                        }
                    }
                }
                sink.flush().await?;
                drop(written);
                Ok::<_, WsError>(close)
            };
            match tokio::time::timeout(slow_client_timeout, write).await {
                Ok(Ok(None)) => {}
                Ok(Ok(Some(close))) => {
                    let _ = tokio::time::timeout(
                        Duration::from_secs(1),
                        sink.send(Message::Close(Some(close))),
                    )
                    .await;
                    break;
                }
                Ok(Err(e)) => {
                    tracing::debug!(%peer, error = %e, "websocket write failed");
                    break;
                }
                Err(_) => {
                    tracing::info!(%peer, "closing a client that stopped reading");
                    break;
                }
            }
        }
        writer_done.cancel();
        let _ = tokio::time::timeout(Duration::from_secs(1), sink.close()).await;
    });

    // Reader: frames → InFrame; ping/pong are answered by tungstenite.
    let (in_tx, in_rx) = mpsc::channel::<InFrame>(1);
    let reader_done = done.clone();
    let too_large = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let reader_too_large = too_large.clone();
    let reader = crate::task::spawn("ws-reader", async move {
        let mut pings = ControlBudget::default();
        loop {
            let msg = tokio::select! {
                m = stream.next() => m,
                () = reader_done.cancelled() => break,
            };
            let frame = match msg {
                None | Some(Ok(Message::Close(_))) => break,
                Some(Ok(Message::Text(t))) => InFrame::Text(t.as_str().to_owned()),
                Some(Ok(Message::Binary(b))) => match String::from_utf8(b.to_vec()) {
                    Ok(t) => InFrame::Text(t),
                    // Not JSON: let the decoder produce the malformed answer.
                    Err(_) => InFrame::Text(String::from_utf8_lossy(&b).into_owned()),
                },
                Some(Ok(Message::Ping(_) | Message::Pong(_))) => {
                    // Each ping costs a pong; a client may keep a
                    // connection alive with a few, not flood with them.
                    if pings.note(tokio::time::Instant::now()) {
                        tracing::info!(%peer, "closing a client that floods pings");
                        break;
                    }
                    continue;
                }
                Some(Ok(_)) => continue,
                Some(Err(WsError::Capacity(e))) => {
                    reader_too_large.store(true, std::sync::atomic::Ordering::Relaxed);
                    let _ = in_tx.send(InFrame::TooLarge(e.to_string())).await;
                    break;
                }
                Some(Err(e)) => {
                    tracing::debug!(%peer, error = %e, "websocket read failed");
                    break;
                }
            };
            if in_tx.send(frame).await.is_err() {
                break;
            }
        }
    });

    let meta = ConnMeta {
        parse_error_prefix: format!(
            "failed to parse websocket JSON-RPC message from exec-server websocket {peer}"
        ),
        on_close: OnClose::Detach,
        caller: Ok(caller),
        relay,
    };
    let inbound = tokio_stream_from(in_rx);
    serve_connection(inbound, out.clone(), gw, meta).await;
    // A too-large frame ended the read side: say so with 1009 before closing.
    if too_large.load(std::sync::atomic::Ordering::Relaxed) {
        out.close(1009, "message too big").await;
    } else {
        out.close(1000, "").await;
    }
    drop(out);
    // Give queued responses a moment to drain, then stop both halves.
    let _ = tokio::time::timeout(Duration::from_secs(2), writer).await;
    done.cancel();
    let _ = reader.await;
}

fn tokio_stream_from(
    rx: mpsc::Receiver<InFrame>,
) -> impl futures_util::Stream<Item = InFrame> + Unpin {
    futures_util::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|f| (f, rx)) })
        .boxed()
}
