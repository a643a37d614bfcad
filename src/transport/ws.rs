//! The websocket listener: hyper serves HTTP/1 on the listener (limited and
//! timed by `transport::limits`), answers `/healthz` and a bare
//! `/readyz` for load balancers, and upgrades any other path to a
//! websocket carrying one JSON-RPC message per frame.
//!
//! The handshake is ours (not tungstenite's) so that a `Sec-WebSocket-Extensions`
//! offer such as permessage-deflate is *declined* per RFC 7692 (no extension
//! in the answer) instead of killing the connection as the reference does.
//! The connection an upgrade becomes is served by `transport::websocket`.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{self, HeaderValue};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;

use crate::tls::Tls;
use rustls::pki_types::CertificateDer;

use super::authenticate::authenticate_with;
use super::connection::Relay;
use super::fleet::relay::RelayOrigin;
use super::http::{response, switching_protocols};
use super::inbound::{InboundMeter, Metered};
use super::limits::{Conn, ConnectionLimits, Door, Guarded};
use super::preview::Kept;
use super::websocket::{
    WS_MAX_WRITE_BUFFER_BYTES, WS_WRITE_BUFFER_BYTES, run, server_websocket, split_direct,
};
use crate::gateway::Gateway;
use crate::preview::proxy::ProxyBody;
use http_body_util::BodyExt as _;

/// Largest HTTP request head accepted.
pub const MAX_HEADER_BYTES: usize = 16 * 1024;

/// Accept connections until the gateway stops. Each is unauthenticated
/// (bounded by `limits`, closed at the handshake timeout) until its
/// upgrade authenticates.
pub async fn serve(
    listener: TcpListener,
    gw: Arc<Gateway>,
    limits: Arc<ConnectionLimits>,
    tls: Option<Arc<Tls>>,
) {
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
        let acceptor = tls.as_ref().map(|t| t.acceptor());
        crate::task::start("http-conn", async move {
            // The handshake deadline covers the TLS handshake too.
            let io = Guarded::new(tcp, conn.clone(), Some(peer));
            let is_tls = acceptor.is_some();
            let kept = Arc::new(Kept::default());
            let svc = |cert: Option<Arc<CertificateDer<'static>>>| {
                hyper::service::service_fn(move |req| {
                    entry(
                        req,
                        gw.clone(),
                        peer,
                        conn.clone(),
                        cert.clone(),
                        (is_tls, kept.clone()),
                    )
                })
            };
            let http = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(timeout)
                .max_buf_size(MAX_HEADER_BYTES.max(8192))
                .clone();
            let served = match acceptor {
                None => {
                    http.serve_connection(TokioIo::new(io), svc(None))
                        .with_upgrades()
                        .await
                }
                Some(a) => match a.accept(io).into_fallible().await {
                    Ok(tls) => {
                        let cert = crate::tls::server::client_leaf(&tls);
                        http.serve_connection(TokioIo::new(tls), svc(cert))
                            .with_upgrades()
                            .await
                    }
                    Err((e, io)) => {
                        tracing::debug!(%peer, error = %e, "TLS handshake failed");
                        super::authenticate::audit_tls_refused("websocket", peer, &e);
                        crate::tls::server::close_refused(io).await;
                        return;
                    }
                },
            };
            if let Err(e) = served {
                tracing::debug!(%peer, error = %e, "http connection ended");
            }
        });
    }
}

/// An executor's registration in the audit trail.
fn audit_registration(executor: &str, credential: &str, peer: SocketAddr, status: StatusCode) {
    let event = if status.is_success() {
        "executor.registered"
    } else {
        "executor.refused"
    };
    crate::audit::emit(
        event,
        &crate::audit::Who::default(),
        serde_json::json!({
            "executor_id": crate::audit::clip(executor),
            "credential": credential,
            "remote": peer.to_string(),
            "status": status.as_u16(),
        }),
    );
}

fn header_has_token(req: &Request<Incoming>, name: header::HeaderName, token: &str) -> bool {
    req.headers().get_all(name).iter().any(|v| {
        v.to_str()
            .map(|s| s.split(',').any(|t| t.trim().eq_ignore_ascii_case(token)))
            .unwrap_or(false)
    })
}

/// A preview request (by host name or path) goes to the preview door;
/// anything else is the gateway's own.
async fn entry(
    req: Request<Incoming>,
    gw: Arc<Gateway>,
    peer: SocketAddr,
    conn: Arc<Conn>,
    client_cert: Option<Arc<CertificateDer<'static>>>,
    (tls, kept): (bool, Arc<Kept>),
) -> Result<Response<ProxyBody>, Infallible> {
    if let Some(route) = super::preview::route(&req, &gw) {
        let client = super::preview::Client {
            peer,
            conn: &conn,
            cert: client_cert.as_deref().map(|c| c.as_ref()),
            tls,
            kept: &kept,
        };
        return Ok(super::preview::serve(req, &gw, route, client).await);
    }
    // (after previews: a preview's host name owns all of its paths)
    if super::mcp::is_mcp(&gw, req.uri().path()) {
        let cert = client_cert.as_deref().map(|c| c.as_ref());
        let r = super::mcp::serve(req, &gw, peer, &conn, cert).await;
        return Ok(r.map(|b| b.map_err(|never| match never {}).boxed_unsync()));
    }
    let r = handle(req, gw, peer, conn, client_cert).await;
    Ok(
        r.map(|r| r.map(|b| b.map_err(|never| match never {}).boxed_unsync()))
            .unwrap_or_else(|never| match never {}),
    )
}

async fn handle(
    req: Request<Incoming>,
    gw: Arc<Gateway>,
    peer: SocketAddr,
    conn: Arc<Conn>,
    client_cert: Option<Arc<CertificateDer<'static>>>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let is_upgrade = header_has_token(&req, header::CONNECTION, "upgrade")
        && header_has_token(&req, header::UPGRADE, "websocket");
    use super::remote::routes::{self, Route};
    let path = req.uri().path().to_owned();
    let registry_route = routes::route(&path);
    if !is_upgrade {
        let timeout = gw.settings.handshake_timeout;
        return Ok(match registry_route {
            Some(Route::Register(id)) if req.method() == hyper::Method::POST => {
                let r = routes::register(req, &gw, id, timeout).await;
                audit_registration(id, "token", peer, r.status());
                r
            }
            Some(Route::DirectRegister(id)) if req.method() == hyper::Method::POST => {
                let r = routes::direct_register(req, &gw, id, timeout).await;
                audit_registration(id, "sigv4", peer, r.status());
                r
            }
            _ => super::http::route_public(&req, &gw),
        });
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
    let link = match registry_route {
        Some(Route::Rendezvous(id)) => Some(routes::rendezvous(&req, &gw, id)),
        Some(Route::DirectDial(id)) => Some(routes::direct_dial(&req, &gw, id)),
        _ => None,
    };
    if let Some(checked) = link {
        let key = key.as_bytes().to_vec();
        return Ok(rendezvous(req, &gw, checked, &conn, &key));
    }
    // A draining fleet replica takes no new connection: 503 before the
    // upgrade, which a balancer retries on another replica (nginx
    // `proxy_next_upstream http_503`, HAProxy `retry-on 503`); a resume of
    // a session here then reaches it through that replica's relay. A
    // replica alone keeps accepting, so its own sessions can be resumed
    // while they finish.
    if gw.fleet.is_some() && gw.is_draining() {
        tracing::info!(%peer, "websocket handshake refused: draining");
        let mut r = response(
            StatusCode::SERVICE_UNAVAILABLE,
            "draining; retry on another replica\n",
        );
        r.headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        return Ok(r);
    }
    // Authenticate before the upgrade; the token is never logged.
    let token = crate::auth::bearer_token(
        req.headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok()),
        req.uri().query(),
    );
    let cert = client_cert.as_deref().map(|c| c.as_ref());
    // Answered before the connection's deadline even while the tenant's
    // image is still being pulled (503 with `Retry-After`).
    let authenticated = authenticate_with(&gw, token.as_deref(), cert, conn.answer_by()).await;
    super::authenticate::audit_handshake(
        "websocket",
        Some(peer),
        super::authenticate::credential_kind(token.as_deref(), cert),
        &authenticated,
    );
    let caller = match authenticated {
        Ok(c) => c,
        Err(e) => {
            tracing::info!(%peer, reason = e.outcome(), "websocket handshake refused");
            let mut r = response(StatusCode::UNAUTHORIZED, format!("{e}\n"));
            *r.status_mut() = super::authenticate::refusal_headers(&e, r.headers_mut());
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
    if let Some(route) = crate::forward::route(&path) {
        return Ok(
            super::forward::open(req, gw, caller, route, &accept, (peer, token.as_deref())).await,
        );
    }
    let mut req = req;
    let upgrade = hyper::upgrade::on(&mut req);
    let limit = gw.settings.max_message_bytes;
    crate::task::start("ws-conn", async move {
        match upgrade.await {
            Ok(upgraded) => {
                // What the client sends is charged to its tenant and the
                // gateway as it is read.
                let meter = InboundMeter::new(caller.tenant().inbound.clone(), gw.inbound.clone());
                let io = Metered::new(TokioIo::new(upgraded), meter.clone());
                // Data frames go straight to the socket; tungstenite reads
                // and answers pings through the other side.
                let (side, writer) = split_direct(io);
                let ws = server_websocket(side, limit, WS_MAX_WRITE_BUFFER_BYTES).await;
                let relay = match (&gw.fleet, token) {
                    (Some(_), Some(token)) => Some(Arc::new(RelayOrigin {
                        token,
                        client: peer,
                    }) as Arc<dyn Relay>),
                    _ => None,
                };
                run(ws, Some(writer), gw, peer, caller, relay, Some(meter)).await;
            }
            Err(e) => tracing::debug!(%peer, error = %e, "websocket upgrade failed"),
        }
    });
    Ok(switching_protocols(&accept))
}

/// An executor dialling its rendezvous (or direct registration) URL,
/// checked before the upgrade: the websocket becomes a link of its pool.
fn rendezvous(
    mut req: Request<Incoming>,
    gw: &Arc<Gateway>,
    checked: Result<
        (
            Arc<crate::registry::Registry>,
            crate::registry::ticket::Ticket,
        ),
        Box<super::remote::routes::HttpResponse>,
    >,
    conn: &Arc<Conn>,
    key: &[u8],
) -> Response<Full<Bytes>> {
    let (registry, ticket) = match checked {
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
    crate::task::start("executor-link", async move {
        match upgrade.await {
            Ok(upgraded) => {
                // Calls go to the executor whole (up to the message limit).
                let ws =
                    server_websocket(TokioIo::new(upgraded), limit, limit + WS_WRITE_BUFFER_BYTES)
                        .await;
                registry.attach(ticket, crate::registry::Link::start(ws));
            }
            Err(e) => tracing::debug!(error = %e, "executor link upgrade failed"),
        }
    });
    switching_protocols(&accept)
}
