//! Plain HTTP on the websocket listener: `/healthz` (alive), `/readyz`
//! (accepting new sessions; 503 while draining) and `/metrics` (Prometheus).

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{self, HeaderValue};
use hyper::{Request, Response, StatusCode};

use crate::gateway::Gateway;

fn text(status: StatusCode, content_type: &'static str, body: String) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    r.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    r
}

/// Answer a non-upgrade request.
pub fn route(req: &Request<Incoming>, gw: &Gateway) -> Response<Full<Bytes>> {
    const PLAIN: &str = "text/plain; charset=utf-8";
    if req.method() != hyper::Method::GET && req.method() != hyper::Method::HEAD {
        return text(
            StatusCode::METHOD_NOT_ALLOWED,
            PLAIN,
            "method not allowed\n".into(),
        );
    }
    match req.uri().path() {
        "/healthz" => text(StatusCode::OK, PLAIN, "ok\n".into()),
        "/readyz" => {
            if gw.is_draining() {
                text(StatusCode::SERVICE_UNAVAILABLE, PLAIN, "draining\n".into())
            } else {
                text(
                    StatusCode::OK,
                    PLAIN,
                    format!("ready\n{}", gw.isolation_report()),
                )
            }
        }
        "/metrics" => text(
            StatusCode::OK,
            "text/plain; version=0.0.4; charset=utf-8",
            gw.metrics_text(),
        ),
        _ => text(
            StatusCode::NOT_FOUND,
            PLAIN,
            "not found; connect with a websocket client\n".into(),
        ),
    }
}
