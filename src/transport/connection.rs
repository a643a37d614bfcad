//! One JSON-RPC connection, whatever carries it: frames in, frames out.
//!
//! [`serve_connection`] owns one connection's protocol state (initialize
//! once, `initialized`, the session it holds) and runs requests
//! **concurrently**, bounded by a per-connection semaphore, so a long-poll
//! never blocks a later request. Responses may leave out of order; clients
//! match by id. Nothing here knows whether frames came from a websocket or
//! stdin.

use std::sync::Arc;

use futures_util::{Stream, StreamExt as _};
use parking_lot::Mutex;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt as _;

use super::admit::Caller;
use crate::dispatch::RpcRequest;
use crate::error::GatewayError;
use crate::gateway::Gateway;
use crate::outbound::{AttachToken, Outbound};
use crate::protocol::jsonrpc::{self, Inbound, RequestId};
use crate::protocol::methods;
use crate::protocol::process::{InitializeParams, InitializeResponse};
use crate::protocol::revision::Revision;
use crate::rpc::{Call, MethodFamily, Op, Outcome, Reply};
use crate::session::Session;

/// One inbound frame (a websocket message or a stdio line).
#[derive(Debug)]
pub enum InFrame {
    Text(String),
    /// The frame exceeded the size limit; the transport says how.
    TooLarge(String),
}

/// How the connection ends for its session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnClose {
    /// Websocket: detach; the session survives for the detach TTL.
    Detach,
    /// Stdio: the session ends with the stream and its processes are killed.
    Kill,
}

/// Per-connection facts the loop needs.
#[derive(Debug, Clone)]
pub struct ConnMeta {
    /// Prefix of the malformed-frame message (the reference's wording).
    pub parse_error_prefix: String,
    pub on_close: OnClose,
    /// Who the connection was admitted as; an error fails `initialize`
    /// with -32002 (stdio; websocket refuses the handshake instead).
    pub caller: Result<Caller, GatewayError>,
    /// Set when a resume of another replica's session may be relayed to
    /// it (a websocket client of a fleet replica; never a relayed one).
    pub relay: Option<RelayOrigin>,
}

/// What a relay to the owner of a session carries about the client.
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

/// The session a connection holds once initialized.
struct Attached {
    caller: Caller,
    session: Arc<Session>,
    token: AttachToken,
    initialized: bool,
}

/// Run one connection until its inbound stream ends, it is evicted, or the
/// gateway stops.
pub async fn serve_connection<S>(mut inbound: S, out: Outbound, gw: Arc<Gateway>, meta: ConnMeta)
where
    S: Stream<Item = InFrame> + Unpin,
{
    let in_flight = Arc::new(Semaphore::new(gw.settings.max_in_flight_per_connection));
    let cancel = CancellationToken::new();
    let penalty: Arc<Mutex<Option<tokio::time::Instant>>> = Arc::default();
    let mut attached: Option<Attached> = None;
    let max_age = match meta.on_close {
        OnClose::Detach => gw.settings.max_connection_age.map(|age| {
            // Up to 10% later, so connections made together do not all
            // come back at once.
            let jitter = age.mul_f64(f64::from(rand_u16()) / f64::from(u16::MAX) / 10.0);
            tokio::time::Instant::now() + age + jitter
        }),
        OnClose::Kill => None,
    };
    loop {
        // Penalty box: after this connection was shed, stop reading it for a
        // while. TCP back-pressure then throttles a flooding client for free,
        // instead of the gateway answering thousands of refusals a second at
        // the expense of other tenants.
        let pause = penalty.lock().take();
        if let Some(until) = pause {
            tokio::select! {
                () = tokio::time::sleep_until(until) => {}
                () = gw.stopped() => {}
            }
        }
        let evicted = attached.as_ref().map(|a| a.token.evicted.clone());
        let frame = tokio::select! {
            // Shutdown first: it also evicts every session, and its close
            // code must win.
            biased;
            () = gw.stopped() => {
                out.close(SHUTDOWN_CLOSE_CODE, "server shutting down").await;
                break;
            }
            () = async { match &evicted { Some(t) => t.cancelled().await, None => std::future::pending().await } } => {
                if gw.is_stopped() {
                    out.close(SHUTDOWN_CLOSE_CODE, "server shutting down").await;
                } else {
                    out.close(4000, "session has been resumed by another connection").await;
                }
                break;
            }
            () = async { match max_age { Some(t) => tokio::time::sleep_until(t).await, None => std::future::pending().await } } => {
                out.close(MAX_AGE_CLOSE_CODE, "connection reached its maximum age; resume the session").await;
                break;
            }
            f = inbound.next() => f,
        };
        let Some(frame) = frame else { break };
        let text = match frame {
            InFrame::Text(t) => t,
            InFrame::TooLarge(reason) => {
                let e =
                    GatewayError::InvalidRequest(format!("{}: {reason}", meta.parse_error_prefix));
                out.send(jsonrpc::encode_error(&RequestId::UNKNOWN, &e.to_jsonrpc()))
                    .await;
                continue;
            }
        };
        // Envelope errors are worded as the session's revision words them.
        let current = attached
            .as_ref()
            .is_some_and(|a| a.session.revision.get() == Some(Revision::Nov2026));
        let malformed = |detail: String| {
            GatewayError::InvalidRequest(format!("{}: {detail}", meta.parse_error_prefix))
        };
        match jsonrpc::decode(&text) {
            Err(e) => {
                let detail = if current {
                    e.current_text()
                } else {
                    e.to_string()
                };
                out.send(jsonrpc::encode_error(
                    &RequestId::UNKNOWN,
                    &malformed(detail).to_jsonrpc(),
                ))
                .await;
            }
            Ok(Inbound::ClientResponse) => {
                tracing::debug!("ignoring a response sent by the client");
            }
            Ok(Inbound::Notification { bad_id: true, .. }) if current => {
                let e = malformed(jsonrpc::BAD_REQUEST_ID.to_owned());
                out.send(jsonrpc::encode_error(&RequestId::UNKNOWN, &e.to_jsonrpc()))
                    .await;
            }
            Ok(Inbound::Notification { method, .. }) => {
                if method == methods::INITIALIZED
                    && let Some(a) = attached.as_mut()
                {
                    a.initialized = true;
                    continue;
                }
                // The original specification's behaviour (not the reference binary's
                // silent close): answer on id -1 and keep the connection.
                let message = if method == methods::INITIALIZED {
                    "client must call initialize before sending initialized".to_owned()
                } else {
                    format!("unexpected notification `{method}`")
                };
                let e = GatewayError::InvalidRequest(message);
                out.send(jsonrpc::encode_error(&RequestId::UNKNOWN, &e.to_jsonrpc()))
                    .await;
            }
            Ok(Inbound::Request { id, method, .. }) if method == methods::SESSION_CLOSE => {
                // Extension: end the session now instead of leaving it
                // detached for its TTL (a client that is done frees its
                // quota); then close the connection.
                let Some(a) = attached.as_ref().filter(|a| a.initialized) else {
                    let e = GatewayError::InvalidRequest(
                        "client must call initialize before closing its session".to_owned(),
                    );
                    out.send(jsonrpc::encode_error(&id, &e.to_jsonrpc())).await;
                    continue;
                };
                tracing::debug!(session.id = %a.session.id, "session closed by its client");
                gw.sessions.remove(&a.session);
                out.send(jsonrpc::encode_response(&id, &crate::protocol::Empty {}))
                    .await;
                out.close(1000, "session closed").await;
                break;
            }
            Ok(Inbound::Request { id, method, params }) => {
                let Some(family) = MethodFamily::of(&method) else {
                    let e = GatewayError::MethodNotFound(method);
                    out.send(jsonrpc::encode_error(&id, &e.to_jsonrpc())).await;
                    continue;
                };
                if family == MethodFamily::Initialize {
                    let decoded: Result<InitializeParams, _> =
                        jsonrpc::decode_params(params).map_err(GatewayError::InvalidParams);
                    if let (Some(origin), None, Ok(p)) = (&meta.relay, &attached, &decoded)
                        && let Some(session) = p.resume_session_id.as_deref()
                        && let Some(replica) = peer_owner(&gw, session)
                    {
                        // Another replica owns the session: from here on this
                        // connection is a relay to it, frame for frame.
                        let first = text.clone();
                        // Boxed, as `initialize` below: a future awaited once
                        // per connection would otherwise size the state of
                        // every idle connection.
                        Box::pin(super::relay::run(
                            &mut inbound,
                            &out,
                            &gw,
                            super::relay::Target {
                                session,
                                replica: &replica,
                                origin,
                                id: &id,
                            },
                            first,
                        ))
                        .await;
                        cancel.cancel();
                        return;
                    }
                    let result =
                        Box::pin(initialize(&gw, &meta.caller, &mut attached, decoded, &out)).await;
                    let text = match result {
                        Ok(r) => jsonrpc::encode_response(&id, &r),
                        Err(e) => jsonrpc::encode_error(&id, &e.to_jsonrpc()),
                    };
                    out.send(text).await;
                    continue;
                }
                // Params are decoded before the initialize gate, as the
                // reference does: a malformed request says so even then.
                let call = match Call::decode(&method, params) {
                    Ok(call) => call,
                    Err(e) => {
                        out.send(jsonrpc::encode_error(&id, &e.to_jsonrpc())).await;
                        continue;
                    }
                };
                let ctx = match &attached {
                    None => Err(GatewayError::InvalidRequest(format!(
                        "client must call initialize before using {} methods",
                        family.label()
                    ))),
                    Some(a) if !a.initialized => Err(GatewayError::InvalidRequest(format!(
                        "client must send initialized before using {} methods",
                        family.label()
                    ))),
                    // Draining refuses new sessions only: live ones are
                    // served until the stop.
                    Some(a) => Ok(a),
                };
                let call = ctx.and_then(|a| {
                    a.session.admit_call(&call)?;
                    let mut ctx = a
                        .caller
                        .context(Some(a.session.clone()), a.token.evicted.clone());
                    ctx.reply = Some(out.clone());
                    Ok((call, ctx))
                });
                let (call, ctx) = match call {
                    Ok(v) => v,
                    Err(e) => {
                        out.send(jsonrpc::encode_error(&id, &e.to_jsonrpc())).await;
                        continue;
                    }
                };
                // Waiting here stops reading this connection: its own
                // back-pressure, invisible to other connections.
                let Ok(permit) = in_flight.clone().acquire_owned().await else {
                    break;
                };
                let svc = gw.stack.clone();
                let out = out.clone();
                let cancel = cancel.clone();
                let penalty = penalty.clone();
                crate::task::spawn("rpc", async move {
                    let req = RpcRequest {
                        op: Op::Call(call),
                        ctx,
                    };
                    tokio::select! {
                        result = svc.oneshot(req) => {
                            if let Err(e) = &result
                                && let Some(wait) = shed_penalty(e)
                            {
                                *penalty.lock() = Some(tokio::time::Instant::now() + wait);
                            }
                            let text = match result {
                                Ok(Outcome::Encoded(e)) => {
                                    out.send_reserved(envelope_around(&id, e.result, e.gap), e.held).await;
                                    drop(permit);
                                    return;
                                }
                                Ok(Outcome::Reply(reply)) => jsonrpc::encode_response(&id, &reply),
                                Ok(Outcome::Opened(_)) => jsonrpc::encode_error(
                                    &id,
                                    &GatewayError::Internal("unexpected stream".to_owned())
                                        .to_jsonrpc(),
                                ),
                                Err(e) => jsonrpc::encode_error(&id, &e.to_jsonrpc()),
                            };
                            out.send(text).await;
                        }
                        () = cancel.cancelled() => {}
                    }
                    drop(permit);
                });
            }
        }
    }
    cancel.cancel();
    if let Some(a) = attached {
        match meta.on_close {
            OnClose::Detach => gw.sessions.detach(&a.session, &a.token),
            OnClose::Kill => gw.sessions.remove(&a.session),
        }
    }
}

async fn initialize(
    gw: &Arc<Gateway>,
    caller: &Result<Caller, GatewayError>,
    attached: &mut Option<Attached>,
    params: Result<InitializeParams, GatewayError>,
    out: &Outbound,
) -> Result<Reply, GatewayError> {
    if attached.is_some() {
        return Err(GatewayError::InvalidRequest(
            "initialize may only be sent once per connection".to_owned(),
        ));
    }
    let params = params?;
    match params.resume_session_id.as_deref() {
        // Draining: no new sessions; resumes of live ones go on.
        None if gw.is_draining() => return Err(GatewayError::Draining),
        None => {}
        Some(id) => gw.check_local_owner(id)?,
    }
    let caller = caller
        .as_ref()
        .map_err(|e| GatewayError::Unauthenticated(format!("unauthenticated: {e}")))?;
    // A failed initialize leaves the connection uninitialised: retry allowed.
    let (session, token) = gw
        .sessions
        .open(
            caller.tenant(),
            params.resume_session_id.as_deref(),
            out.clone(),
        )
        .await?;
    let reply = Reply::Initialize(InitializeResponse {
        session_id: session.id.clone(),
        environment_info: Some(Box::new(session.backend.environment())),
    });
    *attached = Some(Attached {
        caller: caller.clone(),
        session,
        token,
        initialized: false,
    });
    Ok(reply)
}

/// The close code when the gateway stops: "service restart" (RFC 6455
/// registry), so clients reconnect, through the balancer, elsewhere.
pub const SHUTDOWN_CLOSE_CODE: u16 = 1012;

/// The close code when a connection reaches `server.max_connection_age`:
/// "going away"; the session is detached and resumable.
pub const MAX_AGE_CLOSE_CODE: u16 = 1001;

fn rand_u16() -> u16 {
    let mut b = [0u8; 2];
    let _ = getrandom::fill(&mut b);
    u16::from_le_bytes(b)
}

/// The replica that owns `session`, when it is another one.
fn peer_owner(gw: &Gateway, session: &str) -> Option<String> {
    if crate::rpc::check_id_length("resumeSessionId", session).is_err() {
        return None;
    }
    match gw.owner(session) {
        crate::fleet::Owner::Peer(r) => Some(r.to_owned()),
        _ => None,
    }
}

/// Shortest and longest pause after a connection is shed.
const SHED_PENALTY_MIN: std::time::Duration = std::time::Duration::from_millis(50);
const SHED_PENALTY_MAX: std::time::Duration = std::time::Duration::from_millis(250);

/// How long to stop reading a connection whose call was shed, if at all.
fn shed_penalty(e: &GatewayError) -> Option<std::time::Duration> {
    match e {
        GatewayError::RateLimited { retry_after_ms } => Some(
            std::time::Duration::from_millis(*retry_after_ms)
                .clamp(SHED_PENALTY_MIN, SHED_PENALTY_MAX),
        ),
        GatewayError::Overloaded => Some(SHED_PENALTY_MIN),
        _ => None,
    }
}

/// The response around an encoded `result` that starts with `gap` spaces:
/// the head is written over them when it fits (no copy of the result),
/// else the result is copied behind it.
fn envelope_around(id: &RequestId, mut result: String, gap: usize) -> String {
    let id_json = serde_json::to_string(id).unwrap_or_else(|_| "-1".to_owned());
    let head_len = r#"{"id":,"result":"#.len() + id_json.len();
    let spaces = result
        .as_bytes()
        .get(..gap)
        .is_some_and(|g| g.iter().all(|b| *b == b' '));
    if gap > 0 && head_len <= gap && spaces {
        let head = format!(r#"{{"id":{id_json},"result":"#);
        result.replace_range(..head.len(), &head);
        result.push('}');
        return result;
    }
    envelope(id, result.trim_start())
}

/// A response around an already serialised `result`.
fn envelope(id: &RequestId, result: &str) -> String {
    let id_json = serde_json::to_string(id).unwrap_or_else(|_| "-1".to_owned());
    let mut s = String::with_capacity(result.len() + id_json.len() + 20);
    s.push_str(r#"{"id":"#);
    s.push_str(&id_json);
    s.push_str(r#","result":"#);
    s.push_str(result);
    s.push('}');
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::fs::ReadFileResponse;

    #[test]
    fn an_envelope_around_an_encoded_result_matches_serde() {
        for id in [RequestId::Integer(7), RequestId::String("a\"b".into())] {
            let reply = Reply::FsReadFile(ReadFileResponse {
                data_base64: crate::protocol::ByteChunk(b"hi\n".to_vec()),
            });
            let result = serde_json::to_string(&reply).unwrap_or_default();
            assert_eq!(
                envelope(&id, &result),
                jsonrpc::encode_response(&id, &reply)
            );
        }
    }

    #[test]
    fn a_response_is_built_in_place_when_its_head_fits_the_gap() {
        let gap = crate::protocol::jsonrpc::ENVELOPE_GAP;
        let result = format!("{}{}", " ".repeat(gap), r#"{"dataBase64":"aGkK"}"#);
        let long = "x".repeat(gap);
        for id in [
            RequestId::Integer(i64::MAX),
            RequestId::String("a\"b".into()),
            RequestId::String(long),
        ] {
            let mut spare = result.clone();
            spare.reserve(1);
            let ptr = spare.as_ptr();
            let fits = serde_json::to_string(&id).unwrap().len() + 16 <= gap;
            let text = envelope_around(&id, spare, gap);
            assert!(text.starts_with(r#"{"id":"#), "{text}");
            let v: serde_json::Value = serde_json::from_str(&text).unwrap();
            let expected: serde_json::Value = serde_json::from_str(&jsonrpc::encode_response(
                &id,
                &Reply::FsReadFile(ReadFileResponse {
                    data_base64: crate::protocol::ByteChunk(b"hi\n".to_vec()),
                }),
            ))
            .unwrap();
            assert_eq!(v, expected);
            // In place (the same allocation) exactly when the head fits.
            assert_eq!(text.as_ptr() == ptr, fits, "{text}");
        }
        // No gap, or a result shorter than the gap: copied, never a panic.
        assert_eq!(
            envelope_around(&RequestId::Integer(1), "{}".to_owned(), gap),
            r#"{"id":1,"result":{}}"#
        );
        assert_eq!(
            envelope_around(&RequestId::Integer(1), "{}".to_owned(), 0),
            r#"{"id":1,"result":{}}"#
        );
    }
}
