//! Websocket sessions owned by another replica (docs/fleet.md).
//!
//! The landing replica ([`run`]) authenticated the client at the handshake;
//! when its `initialize` resumes a session another replica owns, the
//! connection becomes a relay: the `initialize` frame and every later one
//! go to the owner over one `RelayService/Open` stream on the peer
//! listener, and the owner's frames come back, frame for frame. The owner
//! ([`RelayApi`]) runs the relayed frames through the same connection loop
//! as its own websocket clients, under the client's own token: the tenant
//! check, scopes, quotas and the stack are all the owner's.
//!
//! Failure is precise: an owner that cannot be reached answers the
//! `initialize` with -32007 naming the replica; a relay whose owner goes
//! away closes with 4001 and says which replica; an owner that shuts down
//! closes with its own 1012.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use bytes::Bytes;
use futures_util::{Stream, StreamExt as _};
use tonic::{Request, Response, Status, Streaming};

use super::super::authenticate::Caller;
use super::super::connection::{
    ConnMeta, FrameSource, InFrame, OnClose, Relay, RelayStart, serve_connection,
};
use crate::error::GatewayError;
use crate::fleet::{CLIENT_ADDR_HEADER, CREDENTIAL_HEADER};
use crate::gateway::Gateway;
use crate::outbound::{OutFrame, Outbound};
use crate::protocol::jsonrpc::{self, RequestId};
use crate::transport::inbound::Charge;

/// Generated code of the fleet's relay protocol (`crate::fleet::pb`).
pub use crate::fleet::pb;

use pb::open_response::Frame;
use pb::relay_service_client::RelayServiceClient;
use pb::relay_service_server::RelayService;
use pb::{Close, OpenRequest, OpenResponse};

/// Client frames queued toward the owner before the relay stops reading
/// the client (its back-pressure).
const RELAY_QUEUE: usize = 16;
/// Close code when the owner goes away mid-relay (private range; the
/// registry's 1014 "bad gateway" is refused as a protocol error by
/// tungstenite, which the Codex client uses).
pub const OWNER_GONE_CLOSE_CODE: u16 = 4001;
/// Largest relayed frame: a websocket message at most, plus room.
pub fn max_relay_frame(gw: &Gateway) -> usize {
    gw.settings.max_message_bytes.saturating_add(64 * 1024)
}

/// The replica a peer request came from (a request extension the peer
/// listener sets).
#[derive(Debug, Clone)]
pub struct PeerReplica(pub String);

/// What a relay to the owner of a session carries about the client: the
/// [`Relay`] the websocket door plugs into its connections.
#[derive(Clone)]
pub struct RelayOrigin {
    /// The client's bearer token, verified again by the owner.
    pub token: String,
    pub client: std::net::SocketAddr,
}

impl std::fmt::Debug for RelayOrigin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RelayOrigin")
            .field("client", &self.client)
            .finish_non_exhaustive()
    }
}

impl Relay for RelayOrigin {
    fn run<'a>(&'a self, start: RelayStart<'a>) -> Pin<Box<dyn Future<Output = ()> + Send + 'a>> {
        Box::pin(run(start, self))
    }
}

/// Relay the rest of a client connection to the session's owner.
async fn run(t: RelayStart<'_>, origin: &RelayOrigin) {
    let RelayStart {
        inbound,
        out,
        gw,
        first,
        ..
    } = t;
    let _live = gw.relay_guard();
    let unavailable = |detail: String| GatewayError::OwnerUnavailable {
        session: t.session.to_owned(),
        replica: t.replica.to_owned(),
        detail,
    };
    // Each queued frame keeps the inbound charge it was read under until
    // the stream to the owner takes it: the relay holds no more of what a
    // client sent than a direct connection does.
    let (tx, rx) = tokio::sync::mpsc::channel::<(OpenRequest, Charge)>(RELAY_QUEUE);
    let opened = async {
        let fleet = gw
            .fleet
            .as_ref()
            .ok_or_else(|| unavailable("not in a fleet".to_owned()))?;
        let channel = fleet.channel(t.session, t.replica)?;
        let mut req = Request::new(
            tokio_stream::wrappers::ReceiverStream::new(rx).map(|(frame, _charge)| frame),
        );
        let md = req.metadata_mut();
        let header = |v: &str| {
            v.parse::<tonic::metadata::AsciiMetadataValue>()
                .map_err(|_| GatewayError::Internal("unencodable relay metadata".to_owned()))
        };
        md.insert(CREDENTIAL_HEADER, header(&fleet.credential(t.replica)?)?);
        md.insert(
            "authorization",
            header(&format!("Bearer {}", origin.token))?,
        );
        md.insert(CLIENT_ADDR_HEADER, header(&origin.client.to_string())?);
        let _ = tx
            .send((
                OpenRequest {
                    text: Bytes::from(first.into_bytes()),
                },
                Charge::default(),
            ))
            .await;
        let limit = max_relay_frame(gw);
        let mut client = RelayServiceClient::new(channel)
            .max_decoding_message_size(limit)
            .max_encoding_message_size(limit);
        match tokio::time::timeout(fleet.dial_timeout * 2, client.open(req)).await {
            Ok(Ok(r)) => Ok(r.into_inner()),
            Ok(Err(status)) => Err(from_status(status, &unavailable)),
            Err(_) => Err(unavailable("timed out".to_owned())),
        }
    };
    let mut responses = match opened.await {
        Ok(r) => r,
        Err(e) => {
            tracing::info!(session = ?t.session, replica = t.replica, error = ?e.to_string(), "relay refused");
            out.send(jsonrpc::encode_error(t.id, &e.to_jsonrpc())).await;
            return;
        }
    };
    tracing::debug!(session = ?t.session, replica = t.replica, "relaying");
    let up = async {
        while let Some(frame) = inbound.next().await {
            match frame {
                InFrame::Text(text, charge) => {
                    // A frame that carries a trace context is a hop of
                    // that trace here (the owner continues it from the
                    // same frame).
                    if crate::telemetry::exporting()
                        && let Some(trace) = jsonrpc::trace_of(&text)
                    {
                        let span = tracing::info_span!("relay.frame", replica = t.replica);
                        crate::telemetry::set_remote_parent(&span, &trace);
                    }
                    let req = OpenRequest {
                        text: Bytes::from(text.into_bytes()),
                    };
                    if tx.send((req, charge)).await.is_err() {
                        return;
                    }
                }
                InFrame::TooLarge(reason) => {
                    // The transport ends the connection (1009) after this.
                    let e = GatewayError::InvalidRequest(format!("message too large: {reason}"));
                    out.send(jsonrpc::encode_error(&RequestId::UNKNOWN, &e.to_jsonrpc()))
                        .await;
                    return;
                }
            }
        }
    };
    let down = async {
        loop {
            match responses.message().await {
                Ok(Some(OpenResponse {
                    frame: Some(Frame::Text(b)),
                })) => {
                    let text = String::from_utf8(b.to_vec())
                        .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned());
                    if !out.send(text).await {
                        return false;
                    }
                }
                Ok(Some(OpenResponse {
                    frame: Some(Frame::Close(c)),
                })) => {
                    let code = u16::try_from(c.code).unwrap_or(1011);
                    out.close(code, c.reason).await;
                    return true;
                }
                Ok(Some(OpenResponse { frame: None })) => {}
                Ok(None) => {
                    // The owner ended the connection without a close.
                    out.close(1000, "").await;
                    return false;
                }
                Err(status) => {
                    tracing::info!(session = ?t.session, replica = t.replica, status = ?status.message(), "relay lost its owner");
                    out.close(
                        OWNER_GONE_CLOSE_CODE,
                        truncate_reason(format!("session owner replica {} is gone", t.replica)),
                    )
                    .await;
                    return false;
                }
            }
        }
    };
    tokio::pin!(up);
    let owner_closed = tokio::select! {
        () = &mut up => false,
        closed = down => closed,
        () = gw.stopped() => {
            out.close(super::super::connection::SHUTDOWN_CLOSE_CODE, "server shutting down").await;
            false
        }
    };
    if owner_closed {
        // The owner's stream ends only when the client's does: the owner
        // (a draining one) learns from that that the client answered the
        // close, so had every frame before it. The websocket ends the read
        // side within its slow-client bound if the client never answers.
        tokio::select! {
            () = &mut up => {}
            () = gw.stopped() => {}
        }
    }
}

/// A close reason fits a control frame (123 bytes).
fn truncate_reason(s: String) -> String {
    crate::protocol::truncate_text(s, 120)
}

/// An owner's refusal keeps its meaning; a transport failure names the replica.
fn from_status(status: Status, unavailable: &dyn Fn(String) -> GatewayError) -> GatewayError {
    use tonic::Code;
    match status.code() {
        Code::Unauthenticated => GatewayError::Unauthenticated(status.message().to_owned()),
        Code::PermissionDenied => GatewayError::Forbidden(status.message().to_owned()),
        Code::ResourceExhausted => GatewayError::Overloaded,
        _ => unavailable(status.message().to_owned()),
    }
}

/// The owner's side: `RelayService` on the peer listener.
#[derive(Clone)]
pub struct RelayApi {
    gw: Arc<Gateway>,
}

impl RelayApi {
    pub fn new(gw: Arc<Gateway>) -> Self {
        Self { gw }
    }
}

type ResponseStream = Pin<Box<dyn Stream<Item = Result<OpenResponse, Status>> + Send>>;

#[tonic::async_trait]
impl RelayService for RelayApi {
    type OpenStream = ResponseStream;
    type DialStream = crate::transport::preview::DialStream;

    /// A preview's connection into a session of this replica
    /// (`transport::preview::relay`).
    async fn dial(
        &self,
        req: Request<Streaming<pb::DialRequest>>,
    ) -> Result<Response<Self::DialStream>, Status> {
        let d = crate::transport::preview::read_open(req).await?;
        if d.open.forward {
            crate::transport::forward::serve_dial(&self.gw, d).await
        } else {
            crate::transport::preview::serve_dial(&self.gw, d).await
        }
    }

    async fn open(
        &self,
        req: Request<Streaming<OpenRequest>>,
    ) -> Result<Response<ResponseStream>, Status> {
        let caller = req
            .extensions()
            .get::<Caller>()
            .cloned()
            .ok_or_else(|| Status::internal("the relay was not authenticated"))?;
        let client = req
            .metadata()
            .get(CLIENT_ADDR_HEADER)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("unknown")
            .to_owned();
        let from = req
            .extensions()
            .get::<PeerReplica>()
            .map(|p| p.0.clone())
            .unwrap_or_default();
        // Relayed frames are charged here as the owner's own clients'
        // messages are, until their calls are answered; while there is no
        // room the stream is not read, and HTTP/2 holds the relay back.
        let (tenant_budget, gateway_budget) =
            (caller.tenant().inbound.clone(), self.gw.inbound.clone());
        let frames = req
            .into_inner()
            .take_while(|r| std::future::ready(r.is_ok()))
            .filter_map(|r| std::future::ready(r.ok()))
            .then(move |f| {
                let (tenant, gateway) = (tenant_budget.clone(), gateway_budget.clone());
                async move {
                    let n = f.text.len();
                    let charge = Charge::new(tenant.reserve(n).await, gateway.reserve(n).await);
                    InFrame::Text(
                        String::from_utf8(f.text.to_vec())
                            .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned()),
                        charge,
                    )
                }
            })
            .boxed();
        let (out, rx) = Outbound::channel(caller.tenant().outbound.clone());
        let meta = ConnMeta {
            source: FrameSource::Relayed(client.as_str().into()),
            on_close: OnClose::Detach,
            caller: Ok(caller),
            relay: None,
        };
        tracing::debug!(%client, from, "serving a relayed connection");
        let gw = self.gw.clone();
        crate::task::start("relay-conn", async move {
            serve_connection(frames, out, gw, meta).await;
        });
        let stream = futures_util::stream::unfold(rx, |mut rx| async move {
            let frame = rx.recv().await?;
            let msg = match frame {
                OutFrame::Text(queued) => OpenResponse {
                    frame: Some(Frame::Text(Bytes::from(queued.text.into_bytes()))),
                },
                OutFrame::Close(close) => OpenResponse {
                    frame: Some(Frame::Close(Close {
                        code: u32::from(close.code),
                        reason: close.reason,
                    })),
                },
            };
            Some((Ok(msg), rx))
        });
        Ok(Response::new(Box::pin(stream)))
    }
}
