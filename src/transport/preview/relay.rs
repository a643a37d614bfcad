//! Previews of sessions another replica owns (docs/preview.md, "Fleet"):
//! the landing replica opens one `RelayService/Dial` stream to the owner
//! over the peer listener per connection into the session, with the
//! client's token (`authorization`) and preview cookies; the owner
//! decides who may open the preview exactly as for its own clients
//! ([`super::admit`]), connects inside the tenant's namespace and answers
//! who it let in; then the stream carries the bytes both ways and the
//! landing replica speaks HTTP over it as over a local connection.
//!
//! A kept relayed connection is used again only for the same credentials:
//! the owner checked those. A revocation or the session's end there ends
//! the stream with a status carrying HTTP status 410, and with it the
//! connection here and its request (a 410 too); the stream's plain end is
//! only the connection's (the server closed it after its answer, as an
//! HTTP/1.0 server does), and the request here still gets that answer.

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use futures_util::Stream;
use http_body_util::BodyExt as _;
use hyper::{Response, StatusCode};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio_util::sync::CancellationToken;
use tonic::{Code, Request, Status, Streaming};

use super::{Client, KeptUpstream, Opened};
use crate::fleet::pb::relay_service_client::RelayServiceClient;
use crate::fleet::pb::{
    DialOpen, DialOpened, DialRequest, DialResponse, dial_request, dial_response,
};
use crate::fleet::{CLIENT_ADDR_HEADER, CREDENTIAL_HEADER};
use crate::gateway::Gateway;
use crate::preview::Via;
use crate::preview::proxy::{self, CallerHeaders, ProxyBody, Upstream, failure};

/// Metadata of a refused dial: the HTTP status to answer.
const HTTP_STATUS: &str = "x-exec-gateway-http-status";
/// Most bytes of one relayed message.
const CHUNK_BYTES: usize = 64 << 10;
/// Messages queued each way before the other side is waited for.
const QUEUE: usize = 8;
/// Bytes the in-process pipe between hyper and the stream holds.
const PIPE_BYTES: usize = 256 << 10;

pub type DialStream = Pin<Box<dyn Stream<Item = Result<DialResponse, Status>> + Send>>;

/// The landing side: a connection into a session `replica` owns.
pub(super) async fn dial(
    gw: &Arc<Gateway>,
    client: &Client<'_>,
    replica: &str,
    (id, port): (&str, u16),
    (token, cookies): (Option<&str>, &[String]),
    kept: Option<KeptUpstream>,
) -> Result<Opened, Box<Response<ProxyBody>>> {
    if let Some(k) = kept {
        return reuse(gw, k).await;
    }
    let (tx, responses, opened) = match start_dial(
        gw,
        replica,
        (id, port),
        (token, cookies),
        false,
        client.peer,
    )
    .await
    {
        Ok(v) => v,
        Err((status, why)) => return Err(Box::new(failure(status, &why))),
    };
    let via = match opened.via.as_str() {
        "token" => Via::Token,
        // The epoch was the owner's to check.
        "url" => Via::Url { epoch: 0 },
        _ => Via::Public,
    };
    let bad_gateway = |why: String| {
        tracing::info!(session = id, replica, error = %why, "preview relay");
        Box::new(failure(StatusCode::BAD_GATEWAY, &unreachable(replica)))
    };
    let tenant = gw
        .tenants
        .get(&opened.session_tenant)
        .await
        .map_err(|e| bad_gateway(format!("tenant {}: {e}", opened.session_tenant)))?;
    let (near, far) = tokio::io::duplex(PIPE_BYTES);
    // As for a local connection (`super::connect_inside`): `stop`, the
    // owner's word that the preview was revoked or the session ended,
    // ends the requests; `closed`, also the stream's or the connection's
    // end, only the pump and the HTTP task.
    let stop = CancellationToken::new();
    let closed = stop.child_token();
    pump_landing(far, tx, responses, closed.clone(), Some(stop.clone()));
    let hold: proxy::Hold = Arc::new(super::StopOnDrop(closed.clone()));
    let up = Upstream::handshake(near, hold, closed)
        .await
        .map_err(|e| bad_gateway(e.to_string()))?;
    let non_empty = |s: String| Some(s).filter(|s| !s.is_empty());
    Ok(Opened {
        up,
        stop,
        caller: CallerHeaders {
            tenant: non_empty(opened.caller_tenant),
            subject: non_empty(opened.subject),
            via: via.name(),
        },
        via,
        tenant,
    })
}

fn unreachable(replica: &str) -> String {
    format!("the replica that owns this session ({replica}) cannot be reached")
}

/// A refused or failed dial: the HTTP status and the words to answer.
type DialFailure = (StatusCode, String);

/// Open a dial to `replica` and wait for its answer: the stream's two
/// ends and who the owner let in.
async fn start_dial(
    gw: &Gateway,
    replica: &str,
    (id, port): (&str, u16),
    (token, cookies): (Option<&str>, &[String]),
    forward: bool,
    peer: SocketAddr,
) -> Result<
    (
        tokio::sync::mpsc::Sender<DialRequest>,
        Streaming<DialResponse>,
        DialOpened,
    ),
    DialFailure,
> {
    let bad_gateway = |why: String| {
        tracing::info!(session = id, replica, error = %why, "relay dial");
        (StatusCode::BAD_GATEWAY, unreachable(replica))
    };
    let Some(fleet) = gw.fleet.as_ref() else {
        return Err(bad_gateway("not in a fleet".to_owned()));
    };
    let (tx, rx) = tokio::sync::mpsc::channel::<DialRequest>(QUEUE);
    let mut req = Request::new(tokio_stream::wrappers::ReceiverStream::new(rx));
    let md = req.metadata_mut();
    let value = |v: &str| v.parse::<tonic::metadata::AsciiMetadataValue>().ok();
    let credential = fleet
        .credential(replica)
        .map_err(|e| bad_gateway(e.to_string()))?;
    if let Some(v) = value(&credential) {
        md.insert(CREDENTIAL_HEADER, v);
    }
    if let Some(v) = token.and_then(|t| value(&format!("Bearer {t}"))) {
        md.insert("authorization", v);
    }
    if let Some(v) = value(&peer.to_string()) {
        md.insert(CLIENT_ADDR_HEADER, v);
    }
    let open = DialRequest {
        msg: Some(dial_request::Msg::Open(DialOpen {
            session_id: id.to_owned(),
            port: u32::from(port),
            cookies: cookies.to_vec(),
            forward,
        })),
    };
    let _ = tx.send(open).await;
    let channel = fleet
        .channel(id, replica)
        .map_err(|e| bad_gateway(e.to_string()))?;
    let mut rpc = RelayServiceClient::new(channel);
    let answered = tokio::time::timeout(fleet.dial_timeout * 2, rpc.dial(req)).await;
    let mut responses: Streaming<DialResponse> = match answered {
        Err(_) => return Err(bad_gateway("timed out".to_owned())),
        Ok(Err(status)) => return Err(refused_by_owner(&status, replica)),
        Ok(Ok(r)) => r.into_inner(),
    };
    match responses.message().await {
        Ok(Some(DialResponse {
            msg: Some(dial_response::Msg::Opened(o)),
        })) => Ok((tx, responses, o)),
        Ok(_) => Err(bad_gateway("no answer".to_owned())),
        Err(status) => Err(refused_by_owner(&status, replica)),
    }
}

/// The landing side of a port forward of a session `replica` owns: the
/// bytes of the connection the owner made, as a stream.
pub async fn dial_forward(
    gw: &Gateway,
    replica: &str,
    (id, port): (&str, u16),
    token: Option<&str>,
    peer: SocketAddr,
) -> Result<tokio::io::DuplexStream, DialFailure> {
    let (tx, responses, _) = start_dial(gw, replica, (id, port), (token, &[]), true, peer).await?;
    let (near, far) = tokio::io::duplex(PIPE_BYTES);
    pump_landing(far, tx, responses, CancellationToken::new(), None);
    Ok(near)
}

/// The owner's refusal as the client is told it.
fn refused_by_owner(status: &Status, replica: &str) -> DialFailure {
    let http = status
        .metadata()
        .get(HTTP_STATUS)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u16>().ok())
        .and_then(|v| StatusCode::from_u16(v).ok());
    match http {
        Some(code) => (code, status.message().trim_end().to_owned()),
        None => {
            tracing::info!(replica, status = %status, "relay refused");
            (
                StatusCode::BAD_GATEWAY,
                format!("the replica that owns this session ({replica}) refused the relay"),
            )
        }
    }
}

/// Bytes between the pipe's far end and the stream, until both ends are
/// done or `closed`, which it cancels when it ends. The owner's 410 (a
/// revocation, the session's end) cancels `stopped` first.
fn pump_landing(
    far: tokio::io::DuplexStream,
    tx: tokio::sync::mpsc::Sender<DialRequest>,
    mut responses: Streaming<DialResponse>,
    closed: CancellationToken,
    stopped: Option<CancellationToken>,
) {
    crate::task::start("preview-relay", async move {
        let (mut r, mut w) = tokio::io::split(far);
        // Owning `tx`: when the client's side ends, so does the stream.
        let up = async move {
            let mut buf = vec![0u8; CHUNK_BYTES];
            loop {
                let n = match r.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => n,
                };
                let m = DialRequest {
                    msg: Some(dial_request::Msg::Data(Bytes::copy_from_slice(&buf[..n]))),
                };
                if tx.send(m).await.is_err() {
                    return;
                }
            }
        };
        let down = async {
            loop {
                match responses.message().await {
                    Ok(Some(m)) => {
                        if let Some(dial_response::Msg::Data(b)) = m.msg
                            && w.write_all(&b).await.is_err()
                        {
                            return;
                        }
                    }
                    Ok(None) => break,
                    Err(status) => {
                        // Before the close below: the request waiting on
                        // this connection is told why (a 410, not a 502).
                        if let Some(s) = &stopped
                            && is_gone(&status)
                        {
                            s.cancel();
                        }
                        break;
                    }
                }
            }
            let _ = w.shutdown().await;
        };
        tokio::select! {
            () = async { tokio::join!(up, down); } => {}
            () = closed.cancelled() => {}
        }
        closed.cancel();
    });
}

/// Whether the owner ended a dial with a 410: the preview was revoked or
/// the session ended.
fn is_gone(status: &Status) -> bool {
    status
        .metadata()
        .get(HTTP_STATUS)
        .is_some_and(|v| v.as_bytes() == StatusCode::GONE.as_str().as_bytes())
}

/// The first message of a dial, the client's token and address.
pub struct DialIn {
    pub open: DialOpen,
    pub token: Option<String>,
    pub peer: SocketAddr,
    pub requests: Streaming<DialRequest>,
}

/// Read a dial's first message (`open`).
pub async fn read_open(req: Request<Streaming<DialRequest>>) -> Result<DialIn, Status> {
    let peer: SocketAddr = req
        .metadata()
        .get(CLIENT_ADDR_HEADER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
        .unwrap_or(SocketAddr::from(([0, 0, 0, 0], 0)));
    let token = crate::auth::bearer_token(
        req.metadata()
            .get("authorization")
            .and_then(|v| v.to_str().ok()),
        None,
    );
    let mut requests = req.into_inner();
    let open = match requests.message().await? {
        Some(DialRequest {
            msg: Some(dial_request::Msg::Open(o)),
        }) => o,
        _ => return Err(Status::invalid_argument("the first message must be `open`")),
    };
    Ok(DialIn {
        open,
        token,
        peer,
        requests,
    })
}

/// The port a dial names.
pub fn dial_port(open: &DialOpen) -> Result<u16, Status> {
    u16::try_from(open.port)
        .ok()
        .filter(|p| *p > 0)
        .ok_or_else(|| Status::invalid_argument("port must be 1 to 65535"))
}

/// The owner's side of a preview's `RelayService/Dial`.
pub async fn serve_dial(
    gw: &Arc<Gateway>,
    d: DialIn,
) -> Result<tonic::Response<DialStream>, Status> {
    let port = dial_port(&d.open)?;
    let peer = d.peer;
    let cookies: Vec<&str> = d
        .open
        .cookies
        .iter()
        .take(crate::preview::MAX_COOKIES_TRIED)
        .map(String::as_str)
        .collect();
    let id = d.open.session_id.as_str();
    let admitted = super::admit(
        gw,
        peer,
        None,
        None,
        (id, port),
        d.token.as_deref(),
        &cookies,
    )
    .await;
    let (session, via, caller) = match admitted {
        Ok(v) => v,
        Err(r) => return Err(to_status(*r).await),
    };
    let revoked = match session.ports.check(port, &via) {
        Ok(r) => r,
        Err(e) => return Err(to_status(super::refusal(gw, peer, &session, port, e)).await),
    };
    let (tcp, hold, stop) =
        match super::connect_inside(gw, peer, &session, port, &via, revoked).await {
            Ok(v) => v,
            Err(r) => return Err(to_status(*r).await),
        };
    let opened = DialOpened {
        via: via.name().to_owned(),
        session_tenant: session.tenant.name.to_string(),
        caller_tenant: caller.tenant.unwrap_or_default(),
        subject: caller.subject.unwrap_or_default(),
    };
    let idle = gw.settings.preview.idle_timeout;
    Ok(tonic::Response::new(pump_owner(
        tcp, hold, d.requests, opened, stop, idle,
    )))
}

/// The owner's pump: `opened` first, then the connection's bytes both
/// ways until either side ends, nothing comes from the server for `idle`,
/// or `stop` (a revocation, the session's end), which ends the stream at
/// once with a 410; `hold` is held until then.
pub fn pump_owner<T, H>(
    io: T,
    hold: H,
    mut requests: Streaming<DialRequest>,
    opened: DialOpened,
    stop: CancellationToken,
    idle: std::time::Duration,
) -> DialStream
where
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + 'static,
    H: Send + 'static,
{
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<DialResponse, Status>>(QUEUE);
    let first = DialResponse {
        msg: Some(dial_response::Msg::Opened(opened)),
    };
    let stopped = Box::pin(stop.clone().cancelled_owned());
    crate::task::start("relay-dial", async move {
        let _hold = hold;
        if tx.send(Ok(first)).await.is_err() {
            return;
        }
        let (mut r, mut w) = tokio::io::split(io);
        let up = async {
            while let Ok(Some(m)) = requests.message().await {
                if let Some(dial_request::Msg::Data(b)) = m.msg
                    && w.write_all(&b).await.is_err()
                {
                    return;
                }
            }
            let _ = w.shutdown().await;
        };
        // Owning `tx`: when the server's side ends, so does the stream
        // (the landing replica's client sees the close).
        let down = async move {
            let mut buf = vec![0u8; CHUNK_BYTES];
            loop {
                let n = match tokio::time::timeout(idle, r.read(&mut buf)).await {
                    Ok(Ok(0)) | Ok(Err(_)) | Err(_) => return,
                    Ok(Ok(n)) => n,
                };
                let m = DialResponse {
                    msg: Some(dial_response::Msg::Data(Bytes::copy_from_slice(&buf[..n]))),
                };
                if tx.send(Ok(m)).await.is_err() {
                    return;
                }
            }
        };
        // Either side's end ends it: the landing replica's (its client
        // went away), or the server's (what it sent is delivered first).
        tokio::select! {
            () = up => {}
            () = down => {}
            () = stop.cancelled() => {}
        }
    });
    Box::pin(UntilStopped {
        rx: tokio_stream::wrappers::ReceiverStream::new(rx),
        stop: Some(stopped),
    })
}

/// The owner's messages until `stop`, then at once (what is still queued
/// is not delivered) a status carrying HTTP status 410, and the end: the
/// landing replica tells a revocation or the session's end from the
/// server closing the connection, the stream's plain end after all it
/// sent.
struct UntilStopped {
    rx: tokio_stream::wrappers::ReceiverStream<Result<DialResponse, Status>>,
    stop: Option<Pin<Box<tokio_util::sync::WaitForCancellationFutureOwned>>>,
}

impl Stream for UntilStopped {
    type Item = Result<DialResponse, Status>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        let Some(stop) = this.stop.as_mut() else {
            return Poll::Ready(None);
        };
        if stop.as_mut().poll(cx).is_ready() {
            this.stop = None;
            return Poll::Ready(Some(Err(http_refusal(StatusCode::GONE, proxy::REVOKED))));
        }
        Pin::new(&mut this.rx).poll_next(cx)
    }
}

/// A refusal as a status the landing replica turns back into the same
/// HTTP answer.
pub fn http_refusal(code: StatusCode, why: &str) -> Status {
    let grpc = match code.as_u16() {
        401 => Code::Unauthenticated,
        403 => Code::PermissionDenied,
        404 => Code::NotFound,
        409 => Code::FailedPrecondition,
        503 => Code::ResourceExhausted,
        _ => Code::Unavailable,
    };
    let mut s = Status::new(grpc, why.to_owned());
    if let Ok(v) = code.as_u16().to_string().parse() {
        s.metadata_mut().insert(HTTP_STATUS, v);
    }
    s
}

/// A refusal the door built, as a status the landing replica turns back
/// into the same HTTP answer.
async fn to_status(r: Response<ProxyBody>) -> Status {
    let code = r.status();
    let body = r
        .into_body()
        .collect()
        .await
        .map(|b| String::from_utf8_lossy(&b.to_bytes()).into_owned())
        .unwrap_or_default();
    http_refusal(code, body.trim_end())
}

/// A kept relayed connection, used again for the same credentials: who it
/// let in is what it said when it was dialled.
async fn reuse(gw: &Arc<Gateway>, k: KeptUpstream) -> Result<Opened, Box<Response<ProxyBody>>> {
    let Some((via, tenant, caller)) = k.relayed else {
        return Err(Box::new(failure(
            StatusCode::BAD_GATEWAY,
            "the kept connection was not relayed",
        )));
    };
    let tenant = gw.tenants.get(&tenant).await.map_err(|e| {
        Box::new(failure(
            StatusCode::BAD_GATEWAY,
            &format!("tenant {tenant}: {e}"),
        ))
    })?;
    Ok(Opened {
        up: k.up,
        stop: k.stop,
        via,
        caller,
        tenant,
    })
}
