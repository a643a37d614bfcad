//! The MCP door on the client listener (`[mcp] path`, docs/mcp.md): each
//! request is authenticated as a websocket handshake is (bearer token or
//! client certificate; a draining replica refuses), then handed to the
//! gateway's MCP service with a [`Door`] that opens exec-server
//! connections as that caller — served by the stdio door's code over an
//! in-process pipe, so every tool call passes the same stack.

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::{BodyExt as _, Full};
use hyper::body::Incoming;
use hyper::header::{self, HeaderValue};
use hyper::{Request, Response, StatusCode};

use super::authenticate::{Caller, authenticate_with};
use super::limits::Conn;
use crate::gateway::Gateway;
use crate::mcp::http::McpBody;
use crate::mcp::{Door, PIPE_BYTES};

/// How long a request's body may take to arrive whole; its bytes are held
/// in the tenant's inbound budget meanwhile.
pub const MCP_BODY_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// Whether `path` is the MCP endpoint.
pub fn is_mcp(gw: &Gateway, path: &str) -> bool {
    gw.mcp.as_ref().is_some_and(|m| m.path() == path)
}

fn plain(status: StatusCode, text: String) -> Response<McpBody> {
    let mut r = Response::new(Full::new(Bytes::from(text)).boxed());
    *r.status_mut() = status;
    r
}

/// The door that opens `caller`'s exec-server connections.
pub fn door(gw: &Arc<Gateway>, caller: Caller) -> Door {
    let principal = caller.principal().clone();
    let gw = gw.clone();
    Door {
        tenant: caller.tenant().name.to_string(),
        subject: principal.subject.clone(),
        scopes: principal.scopes,
        open: Box::new(move || {
            let (ours, theirs) = tokio::io::duplex(PIPE_BYTES);
            let (read, write) = tokio::io::split(theirs);
            crate::task::start(
                "mcp-session",
                super::stdio::serve(read, write, gw.clone(), Ok(caller.clone())),
            );
            ours
        }),
    }
}

pub async fn serve(
    req: Request<Incoming>,
    gw: &Arc<Gateway>,
    peer: SocketAddr,
    conn: &Arc<Conn>,
    cert: Option<&[u8]>,
) -> Response<McpBody> {
    let Some(mcp) = gw.mcp.clone() else {
        return plain(StatusCode::NOT_FOUND, "not found\n".into());
    };
    // A header only: a token in the URL would be in every proxy's log.
    let token = crate::auth::bearer_token(
        req.headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok()),
        None,
    );
    let authenticated = authenticate_with(gw, token.as_deref(), cert, conn.answer_by()).await;
    super::authenticate::audit_handshake(
        "mcp",
        Some(peer),
        super::authenticate::credential_kind(token.as_deref(), cert),
        &authenticated,
    );
    let caller = match authenticated {
        Ok(c) => c,
        Err(e) => {
            let mut r = plain(StatusCode::UNAUTHORIZED, format!("{e}\n"));
            *r.status_mut() = super::authenticate::refusal_headers(&e, r.headers_mut());
            return r;
        }
    };
    if conn.promote(caller.tenant()).is_err() {
        return plain(
            StatusCode::SERVICE_UNAVAILABLE,
            "connection limit reached\n".into(),
        );
    }
    // The body is read here, whole, within a deadline and charged to the
    // tenant's inbound budget while it is held: a client that sends part
    // of a body and stops holds nothing for long, and one tenant's
    // requests cannot hold more than its budget.
    let max = gw.settings.mcp.max_request_bytes;
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    if declared.is_some_and(|n| n > max) {
        return plain(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("an MCP request is at most {max} bytes\n"),
        );
    }
    let Some(_held) = caller.tenant().inbound.try_reserve(declared.unwrap_or(max)) else {
        let mut r = plain(
            StatusCode::SERVICE_UNAVAILABLE,
            "the tenant's inbound budget is full; retry later\n".into(),
        );
        r.headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        return r;
    };
    let (parts, body) = req.into_parts();
    let read = http_body_util::Limited::new(body, max).collect();
    let body = match tokio::time::timeout(MCP_BODY_TIMEOUT, read).await {
        Ok(Ok(b)) => b.to_bytes(),
        Ok(Err(_)) => {
            return plain(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("an MCP request is at most {max} bytes\n"),
            );
        }
        Err(_) => {
            return plain(
                StatusCode::REQUEST_TIMEOUT,
                "the request's body did not arrive in time\n".into(),
            );
        }
    };
    let req = Request::from_parts(parts, Full::new(body));
    mcp.handle(req, Arc::new(door(gw, caller))).await
}
