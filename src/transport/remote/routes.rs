//! The executor registry's HTTP routes on the client port (both websockets
//! upgraded in `ws`, checked here):
//!
//! - May's (seed 001): `POST /cloud/executor/{id}/register` with an
//!   executor credential, and the rendezvous websocket
//!   `GET /cloud/executor/{id}/rendezvous?ticket=`;
//! - Codex 0.169.0's direct transport, SigV4-signed:
//!   `POST /cloud/environment/{id}/direct/register` and the websocket
//!   `GET /cloud/environment/{id}/direct/ws?registration=`.
//!
//! Errors are `{"error":{"code","message"}}` bodies, which Codex's executor
//! prints: 401 for a missing or invalid credential, 403 for a valid token
//! that is not an executor credential for a configured pool (both make an
//! executor stop), 400 for a malformed registration, 429 when the pool is
//! full, 503 while draining.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt as _, Full, Limited};
use hyper::body::Incoming;
use hyper::header::{self, HeaderValue};
use hyper::{Request, Response, StatusCode};

use crate::auth::AuthError;
use crate::gateway::Gateway;
use crate::registry::{MAX_REGISTRATION_BYTES, RegisterBody, Registry, ticket::Ticket};

/// What a registry path names.
#[derive(Debug, PartialEq, Eq)]
pub enum Route<'a> {
    Register(&'a str),
    Rendezvous(&'a str),
    DirectRegister(&'a str),
    DirectDial(&'a str),
}

/// Parse `/cloud/executor/{id}/register` or `.../rendezvous`, and
/// `/cloud/environment/{id}/direct/register` or `.../direct/ws`.
pub fn route(path: &str) -> Option<Route<'_>> {
    if let Some(rest) = path.strip_prefix("/cloud/environment/") {
        let (id, action) = rest.split_once('/')?;
        return match action {
            "direct/register" => Some(Route::DirectRegister(id)),
            "direct/ws" => Some(Route::DirectDial(id)),
            _ => None,
        };
    }
    let rest = path.strip_prefix("/cloud/executor/")?;
    let (id, action) = rest.split_once('/')?;
    match action {
        "register" => Some(Route::Register(id)),
        "rendezvous" => Some(Route::Rendezvous(id)),
        _ => None,
    }
}

fn json_error(status: u16, code: &str, message: &str) -> Response<Full<Bytes>> {
    let body = serde_json::json!({"error": {"code": code, "message": message}}).to_string();
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_REQUEST);
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r
}

/// A plain HTTP answer.
pub type HttpResponse = Response<Full<Bytes>>;

fn boxed_error(status: u16, code: &str, message: &str) -> Box<HttpResponse> {
    Box::new(json_error(status, code, message))
}

/// Whether a refused credential is a bad token (401) or a good token that
/// is not an executor's (403).
fn is_forbidden(e: &AuthError) -> bool {
    matches!(
        e,
        AuthError::NoScope
            | AuthError::ExecutorCredential
            | AuthError::NotExecutorCredential(_)
            | AuthError::MissingClaim(_)
            | AuthError::UnknownTenant
            | AuthError::TenantMismatch
    )
}

/// Answer a registration.
pub async fn register(
    req: Request<Incoming>,
    gw: &Gateway,
    executor_id: &str,
    body_timeout: Duration,
) -> Response<Full<Bytes>> {
    let registry = match open_registry(gw) {
        Ok(r) => r,
        Err(r) => return *r,
    };
    let token = crate::auth::bearer_token(
        req.headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok()),
        None,
    );
    let principal = match token {
        None => Err(AuthError::Missing),
        Some(t) => gw.auth().verify_executor(&t).await,
    };
    let principal = match principal {
        Ok(p) => p,
        Err(e) => {
            registry.refused(e.reason());
            let status = if is_forbidden(&e) { 403 } else { 401 };
            let code = if status == 403 {
                "forbidden"
            } else {
                "unauthenticated"
            };
            let mut r = json_error(status, code, &e.to_string());
            if status == 401 {
                r.headers_mut().insert(
                    header::WWW_AUTHENTICATE,
                    HeaderValue::from_static("Bearer error=\"invalid_token\""),
                );
            }
            return r;
        }
    };
    let host = req
        .headers()
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let bytes = match read_body(req.into_body(), body_timeout, &registry).await {
        Ok(b) => b,
        Err(r) => return *r,
    };
    let body: RegisterBody = if bytes.iter().all(u8::is_ascii_whitespace) {
        RegisterBody::default()
    } else {
        match serde_json::from_slice(&bytes) {
            Ok(b) => b,
            Err(e) => {
                registry.refused("bad_body");
                return json_error(400, "bad_request", &format!("registration body: {e}"));
            }
        }
    };
    answer(registry.register(&principal, executor_id, body, host.as_deref()))
}

/// A registration's body, whole: at most [`MAX_REGISTRATION_BYTES`], within
/// `timeout`.
async fn read_body(
    body: Incoming,
    timeout: Duration,
    registry: &Registry,
) -> Result<Bytes, Box<HttpResponse>> {
    match tokio::time::timeout(
        timeout,
        Limited::new(body, MAX_REGISTRATION_BYTES).collect(),
    )
    .await
    {
        Ok(Ok(b)) => Ok(b.to_bytes()),
        Ok(Err(_)) => {
            registry.refused("body_too_large");
            Err(boxed_error(
                413,
                "too_large",
                &format!("a registration is at most {MAX_REGISTRATION_BYTES} bytes"),
            ))
        }
        Err(_) => {
            registry.refused("body_timeout");
            Err(boxed_error(
                408,
                "timeout",
                "the registration body did not arrive in time",
            ))
        }
    }
}

/// A registration's answer as JSON, or its refusal.
fn answer<T: serde::Serialize>(r: Result<T, crate::registry::Refusal>) -> HttpResponse {
    match r {
        Ok(answer) => {
            let body = serde_json::to_string(&answer).unwrap_or_default();
            let mut r = Response::new(Full::new(Bytes::from(body)));
            r.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            );
            r
        }
        Err(refusal) => json_error(refusal.status, refusal.code, &refusal.message),
    }
}

/// Check a rendezvous before its upgrade: the ticket in the query, for the
/// executor in the path.
pub fn rendezvous(
    req: &Request<Incoming>,
    gw: &Gateway,
    executor_id: &str,
) -> Result<(std::sync::Arc<Registry>, Ticket), Box<HttpResponse>> {
    let registry = open_registry(gw)?;
    let ticket = req.uri().query().and_then(|q| {
        url::form_urlencoded::parse(q.as_bytes())
            .find(|(k, _)| k == "ticket")
            .map(|(_, v)| v.into_owned())
    });
    let Some(ticket) = ticket else {
        registry.refused("ticket_missing");
        return Err(boxed_error(
            401,
            "unauthenticated",
            "missing rendezvous ticket",
        ));
    };
    match registry.redeem(executor_id, &ticket) {
        Ok(t) => Ok((registry, t)),
        Err(r) => Err(boxed_error(r.status, r.code, &r.message)),
    }
}

/// The registry, unless this gateway has none or is draining.
fn open_registry(gw: &Gateway) -> Result<std::sync::Arc<Registry>, Box<HttpResponse>> {
    let Some(registry) = gw.executors.clone() else {
        return Err(boxed_error(
            404,
            "not_found",
            "this gateway has no executor pools",
        ));
    };
    if gw.is_draining() {
        registry.refused("draining");
        return Err(boxed_error(
            503,
            "draining",
            "this gateway is shutting down",
        ));
    }
    Ok(registry)
}

/// Answer a direct (SigV4) registration.
pub async fn direct_register(
    req: Request<Incoming>,
    gw: &Gateway,
    executor_id: &str,
    body_timeout: Duration,
) -> HttpResponse {
    let registry = match open_registry(gw) {
        Ok(r) => r,
        Err(r) => return *r,
    };
    let (parts, body) = req.into_parts();
    let target = parts
        .uri
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .to_owned();
    let bytes = match read_body(body, body_timeout, &registry).await {
        Ok(b) => b,
        Err(r) => return *r,
    };
    let host = parts
        .headers
        .get(header::HOST)
        .and_then(|v| v.to_str().ok());
    answer(registry.direct_register(executor_id, &target, &parts.headers, &bytes, host))
}

/// Check a direct registration's dial before its upgrade.
pub fn direct_dial(
    req: &Request<Incoming>,
    gw: &Gateway,
    executor_id: &str,
) -> Result<(std::sync::Arc<Registry>, Ticket), Box<HttpResponse>> {
    let registry = open_registry(gw)?;
    let target = req.uri().path_and_query().map_or("/", |p| p.as_str());
    match registry.direct_dial(executor_id, target, req.headers()) {
        Ok(t) => Ok((registry, t)),
        Err(r) => {
            let mut resp = boxed_error(r.status, r.code, &r.message);
            if r.status == 503 {
                resp.headers_mut()
                    .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
            }
            Err(resp)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes() {
        assert_eq!(
            route("/cloud/executor/e-1/register"),
            Some(Route::Register("e-1"))
        );
        assert_eq!(
            route("/cloud/executor/e-1/rendezvous"),
            Some(Route::Rendezvous("e-1"))
        );
        assert_eq!(route("/cloud/executor/e-1/other"), None);
        assert_eq!(
            route("/cloud/environment/e-1/direct/register"),
            Some(Route::DirectRegister("e-1"))
        );
        assert_eq!(
            route("/cloud/environment/e-1/direct/ws"),
            Some(Route::DirectDial("e-1"))
        );
        assert_eq!(route("/cloud/environment/e-1/register"), None);
        assert_eq!(route("/cloud/executor/"), None);
        assert_eq!(route("/"), None);
    }
}
