//! Plain HTTP: on the client port only what a load balancer needs
//! (`/healthz` alive, `/readyz` accepting sessions, no details); everything
//! an operator reads (`/metrics`, `/readyz` with the isolation report, any
//! future admin route) on the admin listener (`server.admin_listen`,
//! loopback by default, a bearer token required when it is not).

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{self, HeaderValue};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

use crate::gateway::Gateway;
use crate::tls::Tls;

const PLAIN: &str = "text/plain; charset=utf-8";
/// Concurrent admin connections.
pub const ADMIN_MAX_CONNECTIONS: usize = 64;
/// Admin connections from one address at once: one source cannot take
/// every slot and starve the scrapes of the others.
pub const ADMIN_MAX_PER_SOURCE: usize = 8;
/// Time an admin client has to send its request head.
const ADMIN_HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// Time an admin connection may stay open.
const ADMIN_CONNECTION_TIMEOUT: Duration = Duration::from_secs(60);

fn text(status: StatusCode, content_type: &'static str, body: String) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    r.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    r
}

fn method_allowed(req: &Request<Incoming>) -> bool {
    req.method() == hyper::Method::GET || req.method() == hyper::Method::HEAD
}

fn not_allowed() -> Response<Full<Bytes>> {
    text(
        StatusCode::METHOD_NOT_ALLOWED,
        PLAIN,
        "method not allowed\n".into(),
    )
}

fn ready_status(gw: &Gateway) -> (StatusCode, &'static str) {
    if gw.is_draining() {
        (StatusCode::SERVICE_UNAVAILABLE, "draining\n")
    } else {
        (StatusCode::OK, "ready\n")
    }
}

/// Answer a non-upgrade request on the client port: status only.
pub fn route_public(req: &Request<Incoming>, gw: &Gateway) -> Response<Full<Bytes>> {
    if !method_allowed(req) {
        return not_allowed();
    }
    match req.uri().path() {
        "/healthz" => text(StatusCode::OK, PLAIN, "ok\n".into()),
        "/readyz" => {
            let (status, body) = ready_status(gw);
            text(status, PLAIN, body.into())
        }
        _ => text(
            StatusCode::NOT_FOUND,
            PLAIN,
            "not found; connect with a websocket client\n".into(),
        ),
    }
}

/// Answer a request on the admin listener.
fn route_admin(req: &Request<Incoming>, gw: &Gateway) -> Response<Full<Bytes>> {
    if !method_allowed(req) {
        return not_allowed();
    }
    if let Some(token) = &gw.settings.admin_token {
        let given = req
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(str::trim)
            .unwrap_or("");
        if !constant_time_eq(given.as_bytes(), &token.0) {
            let mut r = text(
                StatusCode::UNAUTHORIZED,
                PLAIN,
                "admin token required\n".into(),
            );
            r.headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            return r;
        }
    }
    match req.uri().path() {
        "/healthz" => text(StatusCode::OK, PLAIN, "ok\n".into()),
        "/readyz" => {
            let (status, head) = ready_status(gw);
            let body = if status == StatusCode::OK {
                let executors = gw
                    .executors
                    .as_ref()
                    .map(|r| r.report())
                    .unwrap_or_default();
                format!(
                    "{head}{}{}{executors}{}",
                    gw.isolation_report(),
                    gw.limits_report(),
                    gw.tenants.images_report()
                )
            } else {
                head.to_owned()
            };
            text(status, PLAIN, body)
        }
        "/metrics" => text(
            StatusCode::OK,
            "text/plain; version=0.0.4; charset=utf-8",
            gw.metrics_text(),
        ),
        "/accounting" => {
            let only = req.uri().query().and_then(|q| {
                url::form_urlencoded::parse(q.as_bytes())
                    .find(|(k, _)| k == "tenant")
                    .map(|(_, v)| v.into_owned())
            });
            text(
                StatusCode::OK,
                "application/x-ndjson",
                gw.accounting_text(only.as_deref()),
            )
        }
        _ => text(
            StatusCode::NOT_FOUND,
            PLAIN,
            "not found; admin routes: /metrics /readyz /healthz /accounting\n".into(),
        ),
    }
}

/// Compare without an early exit, so timing does not reveal a prefix.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Serve the admin listener until the gateway stops.
pub async fn serve_admin(listener: TcpListener, gw: Arc<Gateway>, tls: Option<Arc<Tls>>) {
    let slots = Arc::new(Semaphore::new(ADMIN_MAX_CONNECTIONS));
    let sources: Arc<parking_lot::Mutex<HashMap<IpAddr, usize>>> = Arc::default();
    while let Some((tcp, peer)) = super::next_connection(&listener, &gw, "admin").await {
        let Some(source) = SourceSlot::take(&sources, peer.ip()) else {
            drop(tcp);
            continue;
        };
        let Ok(permit) = slots.clone().try_acquire_owned() else {
            drop(tcp);
            continue;
        };
        let gw = gw.clone();
        let acceptor = tls.as_ref().map(|t| t.acceptor());
        crate::task::start("admin-conn", async move {
            let svc = hyper::service::service_fn(move |req| {
                let r = route_admin(&req, &gw);
                crate::audit::emit(
                    "admin.access",
                    &crate::audit::Who::default(),
                    serde_json::json!({
                        "remote": peer.to_string(),
                        "method": req.method().as_str(),
                        "path": crate::audit::clip(req.uri().path()),
                        "status": r.status().as_u16(),
                    }),
                );
                async move { Ok::<_, Infallible>(r) }
            });
            let http = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(ADMIN_HEADER_TIMEOUT)
                .clone();
            let served = async {
                match acceptor {
                    None => http.serve_connection(TokioIo::new(tcp), svc).await,
                    Some(a) => {
                        match tokio::time::timeout(ADMIN_HEADER_TIMEOUT, a.accept(tcp)).await {
                            Ok(Ok(s)) => http.serve_connection(TokioIo::new(s), svc).await,
                            Ok(Err(e)) => {
                                tracing::debug!(%peer, error = %e, "admin TLS handshake failed");
                                Ok(())
                            }
                            Err(_) => Ok(()),
                        }
                    }
                }
            };
            if let Ok(Err(e)) = tokio::time::timeout(ADMIN_CONNECTION_TIMEOUT, served).await {
                tracing::debug!(%peer, error = %e, "admin connection ended");
            }
            drop(permit);
            drop(source);
        });
    }
}

/// One of a source address's admin connections; given back on drop.
struct SourceSlot {
    sources: Arc<parking_lot::Mutex<HashMap<IpAddr, usize>>>,
    ip: IpAddr,
}

impl SourceSlot {
    fn take(
        sources: &Arc<parking_lot::Mutex<HashMap<IpAddr, usize>>>,
        ip: IpAddr,
    ) -> Option<SourceSlot> {
        let mut map = sources.lock();
        let n = map.entry(ip).or_default();
        if *n >= ADMIN_MAX_PER_SOURCE {
            return None;
        }
        *n += 1;
        Some(SourceSlot {
            sources: sources.clone(),
            ip,
        })
    }
}

impl Drop for SourceSlot {
    fn drop(&mut self) {
        let mut map = self.sources.lock();
        if let Some(n) = map.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                map.remove(&self.ip);
            }
        }
    }
}

/// An answer of `status` with `body`.
pub(super) fn response(status: StatusCode, body: impl Into<Bytes>) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(body.into()));
    *r.status_mut() = status;
    r
}

/// The 101 answer that completes a handshake.
pub(super) fn switching_protocols(accept: &str) -> Response<Full<Bytes>> {
    let mut r = response(StatusCode::SWITCHING_PROTOCOLS, Bytes::new());
    let h = r.headers_mut();
    h.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
    h.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
    if let Ok(v) = HeaderValue::from_str(accept) {
        h.insert(header::SEC_WEBSOCKET_ACCEPT, v);
    }
    r
}

#[cfg(test)]
mod tests {
    use super::constant_time_eq;

    #[test]
    fn tokens_compare_whole() {
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"ab", b"abc"));
    }
}
