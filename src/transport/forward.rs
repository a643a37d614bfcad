//! The websocket door of port forwarding (`GET /forward/{session}/{port}`,
//! docs/forward.md): the authenticated caller's scope, its session and its
//! tenant's namespace checked, the connection inside made, before the
//! upgrade, so that each refusal is an HTTP status a client can read.

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;

use super::authenticate::Caller;
use super::http::{response, switching_protocols};
use crate::gateway::Gateway;

/// Open a forward for `caller` to `route`'s session and port, answering
/// the handshake (`accept`) or why not.
pub(super) async fn open(
    mut req: Request<Incoming>,
    gw: Arc<Gateway>,
    caller: Caller,
    route: Result<(&str, u16), &'static str>,
    accept: &str,
    peer: SocketAddr,
) -> Response<Full<Bytes>> {
    let (session_id, port) = match route {
        Ok(r) => r,
        Err(why) => return response(StatusCode::BAD_REQUEST, format!("{why}\n")),
    };
    let refused = |status: StatusCode, why: &str| {
        crate::audit::emit(
            "forward.refused",
            &crate::audit::Who {
                tenant: Some(&caller.tenant().name),
                subject: caller.principal().subject.as_deref(),
                session: None,
            },
            serde_json::json!({ "port": port, "reason": why, "peer": peer.to_string() }),
        );
        response(status, format!("{why}\n"))
    };
    if !caller
        .principal()
        .scopes
        .grants(crate::auth::Scope::Forward)
    {
        return refused(StatusCode::FORBIDDEN, "the token lacks the forward scope");
    }
    // Another tenant's session answers like an unknown one.
    let Ok(session) = gw.sessions.lookup(caller.tenant(), session_id) else {
        return refused(
            StatusCode::NOT_FOUND,
            &format!("unknown session id {}", session_id.escape_debug()),
        );
    };
    let Some(net) = caller.tenant().net.clone() else {
        return refused(
            StatusCode::CONFLICT,
            "forwarding needs the tenant's own network (network = \"isolated\")",
        );
    };
    let Ok(permit) = caller.tenant().streams.clone().try_acquire_owned() else {
        return refused(
            StatusCode::SERVICE_UNAVAILABLE,
            "the tenant's streams (max_streams) are all open",
        );
    };
    let tcp = match crate::forward::connect(&net, port).await {
        Ok(t) => t,
        Err(e) => {
            tracing::info!(tenant = %caller.tenant().name, port, error = %e, "forward: connect");
            return refused(
                StatusCode::BAD_GATEWAY,
                &format!("nothing accepts connections on port {port} in the session's network"),
            );
        }
    };
    crate::audit::emit(
        "forward.opened",
        &crate::audit::Who {
            tenant: Some(&caller.tenant().name),
            subject: caller.principal().subject.as_deref(),
            session: Some(&session.id),
        },
        serde_json::json!({ "port": port, "peer": peer.to_string() }),
    );
    let upgrade = hyper::upgrade::on(&mut req);
    let tenant = caller.tenant().name.clone();
    let subject = caller.principal().subject.clone();
    let sid = session.id.clone();
    // A forward keeps its session alive, like an attached stream, and
    // ends with it; and, like every connection, when its token stops
    // holding or it reaches `server.max_connection_age`.
    let hold = session.stream_guard();
    let stop = ends(&gw, &caller, session.ended.clone());
    let stall = gw.settings.slow_client_timeout;
    crate::task::start("forward", async move {
        let Ok(upgraded) = upgrade.await else {
            return;
        };
        let ws = super::websocket::server_websocket(
            TokioIo::new(upgraded),
            crate::forward::MAX_CHUNK_BYTES,
            super::websocket::WS_MAX_WRITE_BUFFER_BYTES,
        )
        .await;
        let moved = crate::forward::serve(ws, tcp, stall, stop).await;
        drop((permit, hold));
        crate::audit::emit(
            "forward.closed",
            &crate::audit::Who {
                tenant: Some(&tenant),
                subject: subject.as_deref(),
                session: Some(&sid),
            },
            serde_json::json!({ "port": port, "up": moved.up, "down": moved.down, "ended": moved.ended }),
        );
    });
    switching_protocols(accept)
}

/// Resolves when a forward must end, with its close code and reason: its
/// session ended, its token expired or lost its key (a reload), or the
/// connection reached `server.max_connection_age`.
fn ends(
    gw: &Gateway,
    caller: &Caller,
    session_ended: tokio_util::sync::CancellationToken,
) -> impl std::future::Future<Output = (u16, &'static str)> + Send + 'static {
    let expires_at = caller.principal().expires_at;
    let key = caller.principal().key.clone();
    let max_age = gw.settings.max_connection_age;
    async move {
        let expiry = async {
            match expires_at {
                Some(at) => {
                    let left = at
                        .duration_since(std::time::SystemTime::now())
                        .unwrap_or_default();
                    tokio::time::sleep(left).await;
                }
                None => std::future::pending().await,
            }
        };
        let aged = async {
            match max_age {
                Some(age) => tokio::time::sleep(age).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            () = session_ended.cancelled() => (1001, "the session ended"),
            () = expiry => (1008, "token expired"),
            () = key.removed() => (1008, "the token's key was removed"),
            () = aged => (1001, "the connection reached its maximum age"),
        }
    }
}
