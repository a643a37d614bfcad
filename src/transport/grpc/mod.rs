//! The gRPC door (proto/exec_gateway/v1): the same tenants, sessions,
//! process tables and tower stack as JSON-RPC, plus health and reflection.
//!
//! Every request to the four services first passes [`Authenticate`], a
//! tower layer on the tonic server that authenticates the caller from its
//! `authorization: Bearer` metadata (module `transport::authenticate`): no method
//! can be reached unauthenticated. Streams are bounded: each server stream
//! has a small channel, and a slow reader back-pressures the process like a
//! slow websocket client.

mod convert;
mod egress;
mod files;
pub(crate) mod forward;
mod forward_port;
mod inbound;
mod io;
mod previews;
mod services;
mod sessions;

pub use io::ServerIo;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use hyper::http;

use crate::config::GRPC_RECEIVE_WINDOW_BYTES;
use crate::gateway::Gateway;
use crate::tls::Tls;
use crate::transport::authenticate::authenticate_with;
use crate::transport::limits::{ConnInfo, ConnectionLimits, Door, Guarded};
pub use services::GrpcApi;

/// Generated code, and the descriptor set for reflection.
pub mod pb {
    #![allow(clippy::all, clippy::pedantic, missing_docs, rust_2018_idioms)]
    tonic::include_proto!("exec_gateway.v1");

    pub const FILE_DESCRIPTOR_SET: &[u8] =
        include_bytes!(concat!(env!("OUT_DIR"), "/exec_gateway_descriptor.bin"));
}

/// Path prefixes served without a token: health checks (load balancers)
/// and reflection (the public schema).
const PUBLIC_PREFIXES: &[&str] = &[
    "/grpc.health.v1.",
    "/grpc.reflection.",
    // A preview relayed by a peer replica (only on the peer listener,
    // behind the fleet credential): the owner decides who may open it
    // from the token, cookies or public port the dial carries
    // (`transport::preview::relay`).
    "/exec_gateway.fleet.v1.RelayService/Dial",
];

/// Admits every call before it reaches a service (see the module docs).
#[derive(Clone)]
pub struct AuthenticateLayer {
    pub(crate) gw: Arc<Gateway>,
}

impl<S> tower::Layer<S> for AuthenticateLayer {
    type Service = Authenticate<S>;
    fn layer(&self, inner: S) -> Authenticate<S> {
        Authenticate {
            inner,
            gw: self.gw.clone(),
        }
    }
}

#[derive(Clone)]
pub struct Authenticate<S> {
    inner: S,
    gw: Arc<Gateway>,
}

impl<S> tower::Service<http::Request<tonic::body::Body>> for Authenticate<S>
where
    S: tower::Service<
            http::Request<tonic::body::Body>,
            Response = http::Response<tonic::body::Body>,
        > + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<tonic::body::Body>) -> Self::Future {
        // Clone-and-swap: the ready service handles this call.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let path = req.uri().path();
        if PUBLIC_PREFIXES.iter().any(|p| path.starts_with(p)) {
            return Box::pin(inner.call(req));
        }
        let token = crate::auth::bearer_token(
            req.headers()
                .get(http::header::AUTHORIZATION)
                .and_then(|v| v.to_str().ok()),
            None,
        );
        let gw = self.gw.clone();
        let (conn, cert, remote) = req
            .extensions()
            .get::<ConnInfo>()
            .map(|c| (Some(c.conn.clone()), c.client_cert.clone(), c.remote))
            .unwrap_or_default();
        // With spans exported, each call is one, continuing the caller's
        // `traceparent` (a client's, or a replica's forwarding it).
        let span = if crate::telemetry::exporting() {
            let span = tracing::info_span!("grpc.call", rpc.method = %req.uri().path());
            let header = |n: &str| req.headers().get(n).and_then(|v| v.to_str().ok());
            if let Some(t) = header("traceparent")
                .and_then(|tp| crate::telemetry::TraceContext::parse(tp, header("tracestate")))
            {
                crate::telemetry::set_remote_parent(&span, &t);
            }
            span
        } else {
            tracing::Span::none()
        };
        let call = async move {
            let cert = cert.as_deref().map(|c| c.as_ref());
            // The first authenticated call of a connection is its
            // handshake, for the audit trail; every refusal is one.
            let first = conn.as_ref().is_some_and(|c| !c.is_authenticated());
            // A connection's first call is answered before its deadline,
            // even while its tenant's image is still being pulled.
            let answer_by = conn.as_ref().and_then(|c| c.answer_by());
            let authenticated = authenticate_with(&gw, token.as_deref(), cert, answer_by)
                .await
                .and_then(|caller| {
                    // The first authenticated call moves the connection into
                    // the authenticated slots (its handshake deadline ends).
                    if let Some(conn) = &conn {
                        conn.promote(caller.tenant())?;
                    }
                    Ok(caller)
                });
            if first || authenticated.is_err() {
                crate::transport::authenticate::audit_handshake(
                    "grpc",
                    remote,
                    crate::transport::authenticate::credential_kind(token.as_deref(), cert),
                    &authenticated,
                );
            }
            match authenticated {
                Ok(caller) => {
                    // Its headers first: held with the request's parts
                    // (an extension), for as long as tonic or the service
                    // keeps them; none left, the call is refused at once
                    // (they are already read: waiting would hold them
                    // uncharged).
                    let mut req = req;
                    let bytes = inbound::header_bytes(&req);
                    match (
                        caller.tenant().inbound.try_reserve(bytes),
                        gw.inbound.try_reserve(bytes),
                    ) {
                        (Some(t), Some(g)) => {
                            req.extensions_mut()
                                .insert(Arc::new(crate::transport::inbound::Charge::new(t, g)));
                        }
                        _ => {
                            return Ok(crate::error::GatewayError::QuotaExceeded {
                                quota: "inbound_bytes",
                                limit: caller.tenant().settings.max_inbound_bytes as u64,
                                retry_after_ms: None,
                            }
                            .to_grpc()
                            .into_http());
                        }
                    }
                    // What the call sends is charged from here on.
                    let budgets = inbound::InboundBudgets {
                        tenant: caller.tenant().inbound.clone(),
                        gateway: gw.inbound.clone(),
                        message_timeout: gw.settings.inbound_message_timeout,
                    };
                    let mut req = req.map(|body| {
                        tonic::body::Body::new(inbound::MeteredBody::new(body, budgets))
                    });
                    req.extensions_mut().insert(caller);
                    inner.call(req).await
                }
                Err(e) => Ok(e.to_grpc().into_http()),
            }
        };
        // The call's span ends with its response body, not when the
        // handler returns: a streaming call (`Exec`, `Attach`, `ReadFile`)
        // is served while its stream is read.
        let held = span.clone();
        Box::pin(async move {
            let response = tracing::Instrument::instrument(call, span).await?;
            Ok(if held.is_none() {
                response
            } else {
                response.map(|body| tonic::body::Body::new(InSpan { body, span: held }))
            })
        })
    }
}

/// A response body polled in its call's span, which it holds until the
/// body is done or dropped (a span is exported when it closes).
struct InSpan {
    body: tonic::body::Body,
    span: tracing::Span,
}

impl http_body::Body for InSpan {
    type Data = bytes::Bytes;
    type Error = tonic::Status;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        let this = self.get_mut();
        let _entered = this.span.enter();
        let frame = Pin::new(&mut this.body).poll_frame(cx);
        if matches!(frame, Poll::Ready(None)) {
            // Done: the span closes now, though hyper may keep the body.
            drop(_entered);
            this.span = tracing::Span::none();
        }
        frame
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

impl Drop for InSpan {
    fn drop(&mut self) {
        // A span's end time is when it was last exited: a stream the
        // client cancelled ends now, not at its last poll.
        let _entered = self.span.enter();
    }
}

/// Largest gRPC message in either direction.
pub const MAX_GRPC_MESSAGE_BYTES: usize = 16 * 1024 * 1024;
/// HTTP/2 flow-control windows the gateway's own client asks for (per
/// stream, per connection): bulk output and file reads come this way.
pub const HTTP2_STREAM_WINDOW_BYTES: u32 = 4 * 1024 * 1024;
pub const HTTP2_CONNECTION_WINDOW_BYTES: u32 = 16 * 1024 * 1024;
/// Largest HTTP/2 frame we accept (peers send at most what we advertise).
pub const HTTP2_MAX_FRAME_BYTES: u32 = 1024 * 1024;
/// Concurrent HTTP/2 streams per connection (gRPC's usual 100): each
/// costs a few KiB of stream state however little it sends.
pub const MAX_CONCURRENT_STREAMS: u32 = 100;
/// Largest header list (metadata) of a request, as HTTP/2 counts it (each
/// field's name and value plus 32 bytes): a token, `traceparent` and a
/// client's own metadata fit; larger is refused by HTTP/2 itself (431,
/// REFUSED_STREAM) before the gateway holds it. hyper's default is 16 KiB.
pub const GRPC_MAX_HEADER_LIST_BYTES: u32 = 8 * 1024;

/// Connections handed from the accept loop to tonic at once.
const ACCEPT_QUEUE: usize = 64;

/// Accept connections, admitting each as unauthenticated (module
/// `transport::limits`): refused ones are dropped at once, admitted ones
/// are closed at the handshake timeout unless a call authenticates first
/// (this also bounds the wait for the HTTP/2 preface).
pub(crate) fn accepted(
    listener: tokio::net::TcpListener,
    gw: Arc<Gateway>,
    limits: Arc<ConnectionLimits>,
    door: Door,
    tls: Option<Arc<Tls>>,
) -> impl futures_util::Stream<Item = Result<ServerIo, std::io::Error>> {
    let (tx, rx) = tokio::sync::mpsc::channel(ACCEPT_QUEUE);
    crate::task::start("grpc-accept", async move {
        while let Some((tcp, peer)) =
            crate::transport::next_connection(&listener, &gw, door.name()).await
        {
            let Some(conn) = limits.accept(door, peer.ip()) else {
                drop(tcp);
                continue;
            };
            let _ = tcp.set_nodelay(true);
            let io = Guarded::new(tcp, conn, Some(peer));
            let Some(tls) = &tls else {
                if tx.send(Ok(ServerIo::Plain(io))).await.is_err() {
                    break;
                }
                continue;
            };
            // The TLS handshake runs on its own (within the handshake
            // deadline), so a slow one holds up no other connection.
            let (acceptor, tx) = (tls.acceptor(), tx.clone());
            crate::task::start("grpc-tls-accept", async move {
                match acceptor.accept(io).into_fallible().await {
                    Ok(s) => {
                        let _ = tx.send(Ok(ServerIo::Tls(Box::new(s)))).await;
                    }
                    Err((e, io)) => {
                        tracing::debug!(%peer, error = %e, "TLS handshake failed");
                        crate::transport::authenticate::audit_tls_refused(door.name(), peer, &e);
                        crate::tls::server::close_refused(io).await;
                    }
                }
            });
        }
    });
    tokio_stream::wrappers::ReceiverStream::new(rx)
}

/// The reflection builder: the gateway's services, health, and both
/// reflection services (each lists the same set).
fn reflection() -> tonic_reflection::server::Builder<'static> {
    tonic_reflection::server::Builder::configure()
        .include_reflection_service(false)
        .register_encoded_file_descriptor_set(pb::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_reflection::pb::v1::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_reflection::pb::v1alpha::FILE_DESCRIPTOR_SET)
}

/// The four services of the API, each with the gateway's message limits
/// (the client listener and the peer listener serve the same).
pub struct ApiServices {
    pub sessions: pb::session_service_server::SessionServiceServer<GrpcApi>,
    pub processes: pb::process_service_server::ProcessServiceServer<GrpcApi>,
    pub files: pb::file_service_server::FileServiceServer<GrpcApi>,
    pub environment: pb::environment_service_server::EnvironmentServiceServer<GrpcApi>,
}

impl ApiServices {
    pub fn new(api: &GrpcApi) -> ApiServices {
        use pb::environment_service_server::EnvironmentServiceServer;
        use pb::file_service_server::FileServiceServer;
        use pb::process_service_server::ProcessServiceServer;
        use pb::session_service_server::SessionServiceServer;
        let m = MAX_GRPC_MESSAGE_BYTES;
        ApiServices {
            sessions: SessionServiceServer::new(api.clone())
                .max_decoding_message_size(m)
                .max_encoding_message_size(m),
            processes: ProcessServiceServer::new(api.clone())
                .max_decoding_message_size(m)
                .max_encoding_message_size(m),
            files: FileServiceServer::new(api.clone())
                .max_decoding_message_size(m)
                .max_encoding_message_size(m),
            environment: EnvironmentServiceServer::new(api.clone())
                .max_decoding_message_size(m)
                .max_encoding_message_size(m),
        }
    }
}

/// Serve gRPC (with health and reflection) on `listener` until the gateway
/// stops.
pub async fn serve(
    listener: tokio::net::TcpListener,
    gw: Arc<Gateway>,
    limits: Arc<ConnectionLimits>,
    tls: Option<Arc<Tls>>,
) {
    use pb::environment_service_server::EnvironmentServiceServer;
    use pb::file_service_server::FileServiceServer;
    use pb::process_service_server::ProcessServiceServer;
    use pb::session_service_server::SessionServiceServer;
    let services = ApiServices::new(&GrpcApi::new(gw.clone()));
    let (health, health_service) = tonic_health::server::health_reporter();
    health.set_serving::<ProcessServiceServer<GrpcApi>>().await;
    health.set_serving::<FileServiceServer<GrpcApi>>().await;
    health.set_serving::<SessionServiceServer<GrpcApi>>().await;
    health
        .set_serving::<EnvironmentServiceServer<GrpcApi>>()
        .await;
    // Both reflection versions: grpcurl and grpcui speak v1, Python's
    // grpcio-reflection, Postman and older tools only v1alpha.
    let reflection_v1 = reflection()
        .build_v1()
        .map_err(|e| tracing::error!(error = %e, "gRPC reflection v1 unavailable"))
        .ok();
    let reflection_v1alpha = reflection()
        .build_v1alpha()
        .map_err(|e| tracing::error!(error = %e, "gRPC reflection v1alpha unavailable"))
        .ok();
    // Flip health to NOT_SERVING as soon as draining starts.
    let draining = {
        let (gw, health) = (gw.clone(), health.clone());
        crate::task::start("grpc-health-drain", async move {
            gw.draining_started().await;
            health
                .set_not_serving::<ProcessServiceServer<GrpcApi>>()
                .await;
            health.set_not_serving::<FileServiceServer<GrpcApi>>().await;
            health
                .set_not_serving::<SessionServiceServer<GrpcApi>>()
                .await;
            health
                .set_not_serving::<EnvironmentServiceServer<GrpcApi>>()
                .await;
            health
                .set_service_status("", tonic_health::ServingStatus::NotServing)
                .await;
        })
    };
    let incoming = accepted(listener, gw.clone(), limits, Door::Grpc, tls);
    let result = tonic::transport::Server::builder()
        // Uploads need more than HTTP/2's 64 KiB default windows. Fixed,
        // not adaptive: what a connection may have sent and the gateway not
        // yet read is its window, which its tenant's inbound budget holds
        // while it is authenticated (module `transport::limits`).
        .initial_stream_window_size(Some(GRPC_RECEIVE_WINDOW_BYTES))
        .initial_connection_window_size(Some(GRPC_RECEIVE_WINDOW_BYTES))
        .http2_adaptive_window(Some(false))
        .max_frame_size(Some(HTTP2_MAX_FRAME_BYTES))
        // No more streams than calls served at once: a stream past the
        // in-flight limit would wait in hyper with its headers held and
        // uncharged; so it waits at the client.
        .max_concurrent_streams(
            MAX_CONCURRENT_STREAMS
                .min(u32::try_from(gw.settings.max_in_flight_per_connection).unwrap_or(u32::MAX)),
        )
        .http2_max_header_list_size(Some(GRPC_MAX_HEADER_LIST_BYTES))
        .concurrency_limit_per_connection(gw.settings.max_in_flight_per_connection)
        .http2_keepalive_interval(Some(std::time::Duration::from_secs(30)))
        .http2_keepalive_timeout(Some(std::time::Duration::from_secs(10)))
        .layer(
            tower::ServiceBuilder::new()
                .layer(AuthenticateLayer { gw: gw.clone() })
                .layer(forward::ForwardLayer::new(gw.clone()))
                .into_inner(),
        )
        .add_service(health_service)
        .add_optional_service(reflection_v1)
        .add_optional_service(reflection_v1alpha)
        .add_service(services.sessions)
        .add_service(services.processes)
        .add_service(services.files)
        .add_service(services.environment)
        .serve_with_incoming_shutdown(incoming, gw.stopped())
        .await;
    if let Err(e) = result {
        tracing::error!(error = %e, "gRPC server failed");
    }
    draining.abort();
}
