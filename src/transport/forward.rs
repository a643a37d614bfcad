//! Port forwarding's doors (docs/forward.md): what both ask before a
//! forward opens ([`admit`]: the caller's scope, its session, its tenant's
//! namespace and streams, the connection inside made), how it ends
//! ([`ends`]) and its audit trail; and the websocket door (`GET
//! /forward/{session}/{port}`), which admits before the upgrade so that each
//! refusal is an HTTP status a client can read. The gRPC door is
//! `grpc::forward_port`.

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;

use super::authenticate::Caller;
use super::http::{response, switching_protocols};
use crate::error::GatewayError;
use crate::gateway::Gateway;
use crate::session::{Session, StreamGuard};

/// Why a forward was not opened; each door tells it its own way, with the
/// same words.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// The token lacks the `forward` scope.
    Scope,
    /// No such session of the caller's tenant (another tenant's included).
    UnknownSession(String),
    /// The tenant has no network namespace of its own.
    NoNet,
    /// The tenant's `max_streams` are all open.
    Streams,
    /// Nothing accepts connections on the port.
    Unreachable(u16),
}

impl Refusal {
    /// The one-line reason, as the client and the audit trail see it.
    pub(crate) fn reason(&self) -> String {
        match self {
            Refusal::Scope => "the token lacks the forward scope".to_owned(),
            Refusal::UnknownSession(id) => format!("unknown session id {}", id.escape_debug()),
            Refusal::NoNet => {
                "forwarding needs the tenant's own network (network = \"isolated\")".to_owned()
            }
            Refusal::Streams => "the tenant's streams (max_streams) are all open".to_owned(),
            Refusal::Unreachable(port) => {
                format!("nothing accepts connections on port {port} in the session's network")
            }
        }
    }

    pub(crate) fn http_status(&self) -> StatusCode {
        match self {
            Refusal::Scope => StatusCode::FORBIDDEN,
            Refusal::UnknownSession(_) => StatusCode::NOT_FOUND,
            Refusal::NoNet => StatusCode::CONFLICT,
            Refusal::Streams => StatusCode::SERVICE_UNAVAILABLE,
            Refusal::Unreachable(_) => StatusCode::BAD_GATEWAY,
        }
    }

    /// The gRPC status: PERMISSION_DENIED, NOT_FOUND, FAILED_PRECONDITION,
    /// RESOURCE_EXHAUSTED (the `streams` quota, as other streams tell it),
    /// UNAVAILABLE.
    pub(crate) fn to_grpc(&self, caller: &Caller) -> tonic::Status {
        match self {
            Refusal::Scope => {
                GatewayError::MissingScope(crate::auth::Scope::Forward.name()).to_grpc()
            }
            Refusal::UnknownSession(_) => tonic::Status::not_found(self.reason()),
            Refusal::NoNet => tonic::Status::failed_precondition(self.reason()),
            Refusal::Streams => GatewayError::QuotaExceeded {
                quota: "streams",
                limit: caller.tenant().settings.max_streams as u64,
                retry_after_ms: None,
            }
            .to_grpc(),
            Refusal::Unreachable(_) => tonic::Status::unavailable(self.reason()),
        }
    }
}

/// An admitted forward: its connection inside the tenant's namespace,
/// its session, and what it holds while open (one of the tenant's
/// streams; its session kept alive). Dropping it gives them back.
pub(crate) struct Admitted {
    pub tcp: tokio::net::TcpStream,
    pub session: Arc<Session>,
    pub permit: tokio::sync::OwnedSemaphorePermit,
    pub hold: StreamGuard,
}

/// Where a forward comes from, for the audit trail: its door (`websocket`,
/// `grpc`) and the client's address.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Origin {
    pub door: &'static str,
    pub peer: Option<SocketAddr>,
}

impl Origin {
    fn peer(&self) -> String {
        self.peer.map(|p| p.to_string()).unwrap_or_default()
    }
}

/// Every check a forward passes before it opens, in order: the `forward`
/// scope; the session is the caller tenant's (another tenant's answers
/// like an unknown one); the tenant has a namespace of its own; one of its
/// streams is free; and the connection to `127.0.0.1:port` inside is made.
/// Audited: `forward.refused` or `forward.opened`.
pub(crate) async fn admit(
    gw: &Gateway,
    caller: &Caller,
    session_id: &str,
    port: u16,
    origin: Origin,
) -> Result<Admitted, Refusal> {
    let refused = |why: Refusal| {
        crate::audit::emit(
            "forward.refused",
            &crate::audit::Who {
                tenant: Some(&caller.tenant().name),
                subject: caller.principal().subject.as_deref(),
                session: None,
            },
            serde_json::json!({ "port": port, "reason": why.reason(), "peer": origin.peer(), "door": origin.door }),
        );
        why
    };
    if !caller
        .principal()
        .scopes
        .grants(crate::auth::Scope::Forward)
    {
        return Err(refused(Refusal::Scope));
    }
    let Ok(session) = gw.sessions.lookup(caller.tenant(), session_id) else {
        return Err(refused(Refusal::UnknownSession(session_id.to_owned())));
    };
    let Some(net) = caller.tenant().net.clone() else {
        return Err(refused(Refusal::NoNet));
    };
    let Ok(permit) = caller.tenant().streams.clone().try_acquire_owned() else {
        return Err(refused(Refusal::Streams));
    };
    let tcp = match crate::forward::connect(&net, port).await {
        Ok(t) => t,
        Err(e) => {
            tracing::info!(tenant = %caller.tenant().name, port, error = %e, "forward: connect");
            return Err(refused(Refusal::Unreachable(port)));
        }
    };
    crate::audit::emit(
        "forward.opened",
        &crate::audit::Who {
            tenant: Some(&caller.tenant().name),
            subject: caller.principal().subject.as_deref(),
            session: Some(&session.id),
        },
        serde_json::json!({ "port": port, "peer": origin.peer(), "door": origin.door }),
    );
    let hold = session.stream_guard();
    Ok(Admitted {
        tcp,
        session,
        permit,
        hold,
    })
}

/// `forward.closed`: what a forward moved and why it ended.
pub(crate) struct Closed<'a> {
    pub tenant: &'a str,
    pub subject: Option<&'a str>,
    pub session: &'a str,
    pub port: u16,
    pub door: &'static str,
}

impl Closed<'_> {
    pub(crate) fn emit(&self, moved: &crate::forward::Moved) {
        crate::audit::emit(
            "forward.closed",
            &crate::audit::Who {
                tenant: Some(self.tenant),
                subject: self.subject,
                session: Some(self.session),
            },
            serde_json::json!({ "port": self.port, "up": moved.up, "down": moved.down, "ended": moved.ended, "door": self.door }),
        );
    }
}

/// Open a forward for `caller` to `route`'s session and port, answering
/// the handshake (`accept`) or why not.
pub(super) async fn open(
    mut req: Request<Incoming>,
    gw: Arc<Gateway>,
    caller: Caller,
    route: Result<(&str, u16), &'static str>,
    accept: &str,
    (peer, token): (SocketAddr, Option<&str>),
) -> Response<Full<Bytes>> {
    let (session_id, port) = match route {
        Ok(r) => r,
        Err(why) => return response(StatusCode::BAD_REQUEST, format!("{why}\n")),
    };
    if let Some(f) = &gw.fleet
        && let crate::fleet::Owner::Peer(replica) = f.owner(session_id)
    {
        return relayed(
            req,
            &gw,
            &caller,
            (replica, session_id, port),
            accept,
            (peer, token),
        )
        .await;
    }
    let origin = Origin {
        door: "websocket",
        peer: Some(peer),
    };
    let admitted = match admit(&gw, &caller, session_id, port, origin).await {
        Ok(a) => a,
        Err(why) => return response(why.http_status(), format!("{}\n", why.reason())),
    };
    let upgrade = hyper::upgrade::on(&mut req);
    let tenant = caller.tenant().name.clone();
    let subject = caller.principal().subject.clone();
    // A forward keeps its session alive, like an attached stream, and
    // ends with it; and, like every connection, when its token stops
    // holding or it reaches `server.max_connection_age`.
    let stop = ends(&gw, &caller, admitted.session.ended.clone());
    let stall = gw.settings.slow_client_timeout;
    crate::task::start("forward", async move {
        let Admitted {
            tcp,
            session,
            permit,
            hold,
        } = admitted;
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
        Closed {
            tenant: &tenant,
            subject: subject.as_deref(),
            session: &session.id,
            port,
            door: "websocket",
        }
        .emit(&moved);
    });
    switching_protocols(accept)
}

/// Resolves when a forward must end, with its close code and reason: its
/// session ended (1001), its token expired or lost its key (a reload;
/// 1008), or the connection reached `server.max_connection_age` (1001).
pub(crate) fn ends(
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

/// A forward of a session another replica owns: the owner admits it (its
/// own checks, on the client's token) and the bytes go over the peer
/// listener (`transport::preview::dial_forward`); here it ends, like any
/// forward, with the token or the connection's age.
async fn relayed(
    mut req: Request<Incoming>,
    gw: &Arc<Gateway>,
    caller: &Caller,
    (replica, session_id, port): (&str, &str, u16),
    accept: &str,
    (peer, token): (SocketAddr, Option<&str>),
) -> Response<Full<Bytes>> {
    let io = match super::preview::dial_forward(gw, replica, (session_id, port), token, peer).await
    {
        Ok(io) => io,
        Err((status, why)) => return response(status, format!("{why}\n")),
    };
    let upgrade = hyper::upgrade::on(&mut req);
    let stop = ends(gw, caller, tokio_util::sync::CancellationToken::new());
    let stall = gw.settings.slow_client_timeout;
    crate::task::start("forward-relayed", async move {
        let Ok(upgraded) = upgrade.await else {
            return;
        };
        let ws = super::websocket::server_websocket(
            TokioIo::new(upgraded),
            crate::forward::MAX_CHUNK_BYTES,
            super::websocket::WS_MAX_WRITE_BUFFER_BYTES,
        )
        .await;
        crate::forward::serve(ws, io, stall, stop).await;
    });
    switching_protocols(accept)
}

/// The owner's side of a port forward relayed by another replica
/// (`RelayService/Dial` with `forward`): [`admit`] on the client's token,
/// as the websocket door would, then the bytes.
pub(crate) async fn serve_dial(
    gw: &Arc<Gateway>,
    d: super::preview::DialIn,
) -> Result<tonic::Response<super::preview::DialStream>, tonic::Status> {
    let port = super::preview::dial_port(&d.open)?;
    let authenticated =
        super::authenticate::authenticate_with(gw, d.token.as_deref(), None, None).await;
    let caller = authenticated.map_err(|e| {
        let status = StatusCode::from_u16(e.http_status()).unwrap_or(StatusCode::UNAUTHORIZED);
        super::preview::http_refusal(status, &e.to_string())
    })?;
    let origin = Origin {
        door: "relay",
        peer: Some(d.peer),
    };
    let admitted = admit(gw, &caller, &d.open.session_id, port, origin)
        .await
        .map_err(|why| super::preview::http_refusal(why.http_status(), &why.reason()))?;
    let Admitted {
        tcp,
        session,
        permit,
        hold,
    } = admitted;
    let opened = crate::fleet::pb::DialOpened {
        via: "token".to_owned(),
        session_tenant: session.tenant.name.to_string(),
        caller_tenant: caller.tenant().name.to_string(),
        subject: caller.principal().subject.clone().unwrap_or_default(),
    };
    // It ends with the session; the landing replica ends it with the
    // token and the connection's age.
    let stop = session.ended.clone();
    Ok(tonic::Response::new(super::preview::pump_owner(
        tcp,
        (permit, hold),
        d.requests,
        opened,
        stop,
        crate::forward::IDLE_TIMEOUT,
    )))
}
