//! The peer listener (`[fleet] listen`): where replicas reach the sessions
//! they own for each other (docs/fleet.md).
//!
//! HTTP/2 only, one connection per peer carrying every relay and forwarded
//! call. Each request passes two checks before any service: the fleet
//! credential ([`FleetAuth`]: a token signed with the fleet key, addressed
//! to this replica) and then the client's own bearer token, exactly as on
//! the public gRPC door. Nothing here relays again: a session that is not
//! this replica's is refused with the error that names its owner.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use hyper::http;

use super::super::grpc::{ApiServices, AuthenticateLayer, GrpcApi};
use super::super::limits::{ConnInfo, ConnectionLimits, Door, LimitSettings};
use super::relay::pb::relay_service_server::RelayServiceServer;
use super::relay::{PeerReplica, RelayApi, max_relay_frame};
use crate::fleet::CREDENTIAL_HEADER;
use crate::gateway::Gateway;

/// Peer connections, authenticated or not. A fleet of a few dozen
/// replicas keeps one or two each.
const MAX_PEER_CONNECTIONS: usize = 1024;
/// Connections that have not yet shown a credential.
const MAX_PEER_UNAUTHENTICATED: usize = 64;
/// Streams per peer connection: every relayed websocket is one, so this
/// is far above the public door's.
const MAX_PEER_STREAMS: u32 = 16 * 1024;
/// HTTP/2 windows: relayed output is bulk.
const PEER_STREAM_WINDOW_BYTES: u32 = 4 * 1024 * 1024;
const PEER_CONNECTION_WINDOW_BYTES: u32 = 32 * 1024 * 1024;

/// Checks the fleet credential of every request (see the module docs).
#[derive(Clone)]
pub struct FleetAuthLayer {
    gw: Arc<Gateway>,
}

impl<S> tower::Layer<S> for FleetAuthLayer {
    type Service = FleetAuth<S>;
    fn layer(&self, inner: S) -> FleetAuth<S> {
        FleetAuth {
            inner,
            gw: self.gw.clone(),
        }
    }
}

#[derive(Clone)]
pub struct FleetAuth<S> {
    inner: S,
    gw: Arc<Gateway>,
}

impl<S, B> tower::Service<http::Request<B>> for FleetAuth<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<tonic::body::Body>>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    B: Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: http::Request<B>) -> Self::Future {
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let verified = match (&self.gw.fleet, req.headers().get(CREDENTIAL_HEADER)) {
            (None, _) => Err("not in a fleet".to_owned()),
            (_, None) => Err("missing".to_owned()),
            (Some(fleet), Some(v)) => v
                .to_str()
                .map_err(|_| "malformed".to_owned())
                .and_then(|t| fleet.verify(t)),
        };
        let from = match verified {
            Ok(from) => from,
            Err(reason) => {
                let label = if reason == "missing" {
                    "missing"
                } else {
                    "invalid"
                };
                self.gw
                    .metrics
                    .fleet_auth_failures
                    .get_or_create(&crate::metrics::ReasonLabel {
                        reason: label.to_owned(),
                    })
                    .inc();
                tracing::debug!(reason = ?reason, "peer request without a valid fleet credential");
                let status = tonic::Status::unauthenticated(format!(
                    "a valid fleet credential is required ({label})"
                ));
                return Box::pin(async move { Ok(status.into_http()) });
            }
        };
        // A peer connection carries many tenants: it takes a door slot, not
        // a tenant's; the client's token is checked next, per request. The
        // connection's information goes here, so the next layer never
        // sees the peer's own (mTLS) certificate as a client's.
        if let Some(info) = req.extensions_mut().remove::<ConnInfo>()
            && let Err(e) = info.conn.promote_link()
        {
            let status = e.to_grpc();
            return Box::pin(async move { Ok(status.into_http()) });
        }
        req.extensions_mut().insert(PeerReplica(from));
        Box::pin(inner.call(req))
    }
}

/// Serve the peer listener until the gateway stops.
pub async fn serve(
    listener: tokio::net::TcpListener,
    gw: Arc<Gateway>,
    tls: Option<Arc<crate::tls::Tls>>,
) {
    let limits = ConnectionLimits::new(
        LimitSettings {
            max_unauthenticated: MAX_PEER_UNAUTHENTICATED,
            // Peers and a tenant's own processes can share an address: no
            // per-source refusal, so a full pool evicts its oldest idle
            // connection instead, and a peer's (authenticated within
            // milliseconds) is not kept out.
            max_unauthenticated_per_source: usize::MAX,
            // No websocket door here: peer connections take `grpc` slots.
            websocket: 0,
            grpc: MAX_PEER_CONNECTIONS,
            handshake_timeout: gw.settings.handshake_timeout,
        },
        gw.metrics.clone(),
    );
    let incoming = super::super::grpc::accepted(listener, gw.clone(), limits, Door::Peer, tls);
    let services = ApiServices::new(&GrpcApi::new(gw.clone()));
    let relay_limit = max_relay_frame(&gw);
    let result = tonic::transport::Server::builder()
        .initial_stream_window_size(Some(PEER_STREAM_WINDOW_BYTES))
        .initial_connection_window_size(Some(PEER_CONNECTION_WINDOW_BYTES))
        .max_frame_size(Some(super::super::grpc::HTTP2_MAX_FRAME_BYTES))
        .max_concurrent_streams(MAX_PEER_STREAMS)
        .http2_keepalive_interval(Some(std::time::Duration::from_secs(30)))
        .http2_keepalive_timeout(Some(std::time::Duration::from_secs(10)))
        .layer(
            tower::ServiceBuilder::new()
                .layer(FleetAuthLayer { gw: gw.clone() })
                .layer(AuthenticateLayer { gw: gw.clone() })
                .into_inner(),
        )
        .add_service(
            RelayServiceServer::new(RelayApi::new(gw.clone()))
                .max_decoding_message_size(relay_limit)
                .max_encoding_message_size(relay_limit),
        )
        .add_service(services.sessions)
        .add_service(services.processes)
        .add_service(services.files)
        .add_service(services.environment)
        .serve_with_incoming_shutdown(incoming, gw.stopped())
        .await;
    if let Err(e) = result {
        tracing::error!(error = %e, "peer listener failed");
    }
}
