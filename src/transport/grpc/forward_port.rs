//! `SessionService/ForwardPort`: port forwarding's gRPC door
//! (docs/forward.md). The first request names the session and the port;
//! it passes the same checks as the websocket door
//! (`transport::forward::admit`), then requests carry bytes to the server
//! and responses bytes from it, each at most 64 KiB. Unlike a websocket,
//! gRPC has half-close: the end of the request stream shuts down the
//! sending side of the connection, and responses go on until the server
//! closes its side.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use super::pb;
use super::pb::forward_port_request::Kind as Up;
use super::pb::forward_port_response::Kind as Down;
use super::services::{EventStream, caller, while_token_holds};
use crate::forward::{Activity, MAX_CHUNK_BYTES, Moved};
use crate::gateway::Gateway;
use crate::transport::forward::{Admitted, Closed, Origin, admit, ends};
use crate::transport::limits::ConnInfo;

/// Responses buffered per forward before reading from the server waits
/// for the client (each at most [`MAX_CHUNK_BYTES`]).
const RESPONSES: usize = 2;

type Sent = Result<pb::ForwardPortResponse, Status>;

pub(super) async fn forward_port(
    gw: &Arc<Gateway>,
    req: Request<Streaming<pb::ForwardPortRequest>>,
) -> Result<Response<EventStream<pb::ForwardPortResponse>>, Status> {
    let caller = caller(&req)?;
    let peer = req.extensions().get::<ConnInfo>().and_then(|c| c.remote);
    let mut input = req.into_inner();
    let first = while_token_holds(&caller, input.message()).await?;
    let Some(pb::ForwardPortRequest {
        kind: Some(Up::Open(open)),
    }) = first
    else {
        return Err(Status::invalid_argument(
            "the first message of ForwardPort must be `open`",
        ));
    };
    let port = match u16::try_from(open.port) {
        Ok(p) if p > 0 => p,
        _ => return Err(Status::invalid_argument("the port must be 1 to 65535")),
    };
    let origin = Origin { door: "grpc", peer };
    let Admitted {
        tcp,
        session,
        permit,
        hold,
    } = admit(gw, &caller, &open.session_id, port, origin)
        .await
        .map_err(|why| why.to_grpc(&caller))?;
    let (tx, rx) = mpsc::channel::<Sent>(RESPONSES);
    let opened = pb::ForwardPortResponse {
        kind: Some(Down::Opened(pb::ForwardPortOpened {
            port: u32::from(port),
        })),
    };
    // A fresh channel has room.
    let _ = tx.try_send(Ok(opened));
    // Like the websocket door: it ends with its session, its token, the
    // maximum connection age; it keeps its session alive while open.
    let stop = ends(gw, &caller, session.ended.clone());
    let stall = gw.settings.slow_client_timeout;
    let tenant = caller.tenant().name.clone();
    let subject = caller.principal().subject.clone();
    crate::task::start("grpc-forward-port", async move {
        let (moved, status) = pump(input, tcp, &tx, stall, stop).await;
        if let Some(status) = status {
            let _ = tokio::time::timeout(stall, tx.send(Err(status))).await;
        }
        drop((tx, permit, hold));
        Closed {
            tenant: &tenant,
            subject: subject.as_deref(),
            session: &session.id,
            port,
            door: "grpc",
        }
        .emit(&moved);
    });
    Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
}

/// How one direction ended: the status the call ends with (none: OK, or
/// the client is gone) and why, for the audit trail.
type End = (Option<Status>, &'static str);

/// Carry bytes between the request stream and `tcp`, and the server's
/// bytes to `tx`, until the server closes its side (OK), the client goes
/// away, nothing moves for [`crate::forward::IDLE_TIMEOUT`], a side holds a
/// write back for `stall`, or `stop` resolves. The end of the request
/// stream shuts down the connection's sending side and goes on.
async fn pump(
    mut input: Streaming<pb::ForwardPortRequest>,
    tcp: tokio::net::TcpStream,
    tx: &mpsc::Sender<Sent>,
    stall: Duration,
    stop: impl std::future::Future<Output = (u16, &'static str)>,
) -> (Moved, Option<Status>) {
    let (mut from_server, mut to_server) = tcp.into_split();
    let activity = Activity::new();
    let up = AtomicU64::new(0);
    let down = AtomicU64::new(0);
    let upward = async {
        loop {
            match input.message().await {
                Ok(Some(pb::ForwardPortRequest {
                    kind: Some(Up::Data(b)),
                })) => {
                    if b.len() > MAX_CHUNK_BYTES {
                        let s =
                            Status::resource_exhausted("a data message over 64 KiB (65536 bytes)");
                        return (Some(s), "a message over 64 KiB");
                    }
                    match tokio::time::timeout(stall, to_server.write_all(&b)).await {
                        Ok(Ok(())) => {}
                        Ok(Err(_)) => return server_failed(),
                        Err(_) => {
                            let s = Status::deadline_exceeded(
                                "the server stopped reading for longer than the slow-client timeout",
                            );
                            return (Some(s), "the server stopped reading");
                        }
                    }
                    up.fetch_add(b.len() as u64, Ordering::Relaxed);
                    activity.touch();
                }
                Ok(Some(pb::ForwardPortRequest {
                    kind: Some(Up::Open(_)),
                })) => {
                    let s = Status::invalid_argument("`open` only in the first message");
                    return (Some(s), "a second open");
                }
                Ok(Some(pb::ForwardPortRequest { kind: None })) => {}
                // Half-close: the server reads the end of its input; what
                // it says goes on being delivered.
                Ok(None) => break,
                Err(_) => return (None, "the client's stream failed"),
            }
        }
        if to_server.shutdown().await.is_err() {
            return server_failed();
        }
        std::future::pending::<End>().await
    };
    let downward = async {
        let mut buf = vec![0u8; MAX_CHUNK_BYTES];
        loop {
            match from_server.read(&mut buf).await {
                Ok(0) => return (None, "the server closed the connection"),
                Ok(n) => {
                    let chunk = pb::ForwardPortResponse {
                        kind: Some(Down::Data(Bytes::copy_from_slice(&buf[..n]))),
                    };
                    match tokio::time::timeout(stall, tx.send(Ok(chunk))).await {
                        Ok(Ok(())) => {}
                        Ok(Err(_)) => return (None, "the client went away"),
                        Err(_) => {
                            let s = Status::deadline_exceeded(
                                "the client stopped reading for longer than the slow-client timeout",
                            );
                            return (Some(s), "the client stopped reading");
                        }
                    }
                    down.fetch_add(n as u64, Ordering::Relaxed);
                    activity.touch();
                }
                Err(_) => return server_failed(),
            }
        }
    };
    // `stop` first: a session's end is signalled before its processes are
    // killed, so when the server's close wakes this, the session's end is
    // already there and is what the call ends with (polled in a random
    // order, the server's close won at times: OK instead of UNAVAILABLE).
    let (status, ended) = tokio::select! {
        biased;
        (code, why) = stop => {
            // 1008: the token; 1001: the session, the maximum age.
            let s = if code == 1008 {
                Status::unauthenticated(why)
            } else {
                Status::unavailable(why)
            };
            (Some(s), why)
        }
        end = upward => end,
        end = downward => end,
        () = tx.closed() => (None, "the client went away"),
        () = activity.idle() => (
            Some(Status::deadline_exceeded("idle: no byte either way for 10 minutes")),
            "idle",
        ),
    };
    let moved = Moved {
        up: up.load(Ordering::Relaxed),
        down: down.load(Ordering::Relaxed),
        ended,
    };
    (moved, status)
}

fn server_failed() -> End {
    (
        Some(Status::unavailable("the server's connection failed")),
        "the server's connection failed",
    )
}
