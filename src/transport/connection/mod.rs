//! One JSON-RPC connection, whatever carries it: frames in, frames out.
//!
//! The protocol state lives in [`machine`] (a plain state machine, tested
//! without I/O); [`serve_connection`] drives it: it reads frames, performs
//! the machine's actions, and runs calls **concurrently** through the
//! stack, bounded by a per-connection semaphore, so a long-poll never
//! blocks a later request. Responses may leave out of order; clients match
//! by id. Nothing here knows whether frames came from a websocket or stdin,
//! nor how a relay reaches another replica: a door that can relay plugs a
//! [`Relay`] in.
//!
//! `initialize` and `session/close` do not pass through the stack: they
//! change the connection's own state (which session it holds) rather than
//! run a call in a session, and the stack's innermost service runs calls
//! *in* a session. They are traced here (a span each) and counted in the
//! request metrics like any call; the per-tenant rate limit applies to the
//! calls a session makes.

pub mod machine;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use futures_util::{Stream, StreamExt as _};
use parking_lot::Mutex;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt as _;
use tracing::Instrument as _;

use super::authenticate::Caller;
use super::inbound::Charge;
use crate::dispatch::RpcRequest;
use crate::error::GatewayError;
use crate::gateway::Gateway;
use crate::outbound::{AttachToken, Outbound, Responder};
use crate::protocol::jsonrpc::{self, RequestId};
use crate::protocol::process::{InitializeParams, InitializeResponse};
use crate::protocol::revision::Policy;
use crate::rpc::{Call, Op, Outcome, Reply};
use crate::session::Session;
use machine::{Action, Held, Machine};
pub use machine::{FrameSource, InFrame};

/// How the connection ends for its session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnClose {
    /// Websocket: detach; the session survives for the detach TTL.
    Detach,
    /// Stdio: the session ends with the stream and its processes are killed.
    Kill,
}

/// Per-connection facts the driver needs.
#[derive(Clone)]
pub struct ConnMeta {
    /// Named in the malformed-frame message.
    pub source: FrameSource,
    pub on_close: OnClose,
    /// Who the connection authenticated as; an error fails `initialize`
    /// with -32002 (stdio; websocket refuses the handshake instead).
    pub caller: Result<Caller, GatewayError>,
    /// Set when a resume of another replica's session may be relayed to
    /// it (a websocket client of a fleet replica; never a relayed one).
    pub relay: Option<Arc<dyn Relay>>,
}

impl std::fmt::Debug for ConnMeta {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConnMeta")
            .field("on_close", &self.on_close)
            .field("relay", &self.relay.is_some())
            .finish_non_exhaustive()
    }
}

/// The inbound frames a relay carries on.
pub type Inbound<'a> = &'a mut (dyn Stream<Item = InFrame> + Unpin + Send);

/// Where a relay goes: the rest of a connection whose `initialize`
/// resumes a session another replica owns.
pub struct RelayStart<'a> {
    pub inbound: Inbound<'a>,
    pub out: &'a Outbound,
    pub gw: &'a Arc<Gateway>,
    pub session: &'a str,
    pub replica: &'a str,
    /// The `initialize` request's id (its error reply if the owner cannot
    /// be reached) and the request itself, the first frame relayed.
    pub id: &'a RequestId,
    pub first: String,
}

/// Carries a connection to the replica that owns its session (plugged in
/// by the door; see `transport::relay`).
pub trait Relay: Send + Sync {
    fn run<'a>(&'a self, start: RelayStart<'a>) -> Pin<Box<dyn Future<Output = ()> + Send + 'a>>;
}

/// The session a connection holds once initialized.
struct Attached {
    caller: Caller,
    session: Arc<Session>,
    token: AttachToken,
}

impl Held for Attached {
    fn policy(&self) -> &'static Policy {
        self.session.revision.policy()
    }
}

/// What the driver shares with the calls it runs.
struct Calls {
    gw: Arc<Gateway>,
    out: Outbound,
    in_flight: Arc<Semaphore>,
    /// Cancelled when the connection ends: its calls stop.
    cancel: CancellationToken,
    /// Penalty box: after this connection was shed, stop reading it for a
    /// while. TCP back-pressure then throttles a flooding client for free,
    /// instead of the gateway answering thousands of refusals a second at
    /// the expense of other tenants.
    penalty: Arc<Mutex<Option<tokio::time::Instant>>>,
}

/// Why the read loop stopped.
enum Stop {
    /// The client's stream ended: what it already asked is still answered
    /// where the answer can still reach it (stdio).
    Eof,
    /// The connection was closed here (shutdown, eviction, maximum age).
    Ended,
    /// The connection became a relay; its session is the owner's.
    Relayed,
    /// The client closed its session (`session/close`): nothing to detach.
    Closed,
}

/// Run one connection until its inbound stream ends, it is evicted, or the
/// gateway stops.
pub async fn serve_connection<S>(mut inbound: S, out: Outbound, gw: Arc<Gateway>, meta: ConnMeta)
where
    S: Stream<Item = InFrame> + Unpin + Send,
{
    let calls = Calls {
        in_flight: Arc::new(Semaphore::new(gw.settings.max_in_flight_per_connection)),
        cancel: CancellationToken::new(),
        penalty: Arc::default(),
        gw,
        out,
    };
    let mut conn = Machine::<Attached>::new(meta.source.clone());
    let stop = read_loop(&mut inbound, &calls, &meta, &mut conn).await;
    if matches!(stop, Stop::Eof) && meta.on_close == OnClose::Kill {
        drain(&calls).await;
    }
    calls.cancel.cancel();
    if let (Stop::Ended | Stop::Eof, Some(a)) = (stop, conn.into_held()) {
        match meta.on_close {
            OnClose::Detach => calls.gw.sessions.detach(&a.session, &a.token),
            OnClose::Kill => calls.gw.sessions.remove(&a.session),
        }
    }
}

async fn read_loop<S>(
    inbound: &mut S,
    calls: &Calls,
    meta: &ConnMeta,
    conn: &mut Machine<Attached>,
) -> Stop
where
    S: Stream<Item = InFrame> + Unpin + Send,
{
    let (gw, out) = (&calls.gw, &calls.out);
    let max_age = match meta.on_close {
        OnClose::Detach => gw.settings.max_connection_age.map(|age| {
            // Up to 10% later, so connections made together do not all
            // come back at once.
            let jitter = age.mul_f64(f64::from(rand_u16()) / f64::from(u16::MAX) / 10.0);
            tokio::time::Instant::now() + age + jitter
        }),
        OnClose::Kill => None,
    };
    let expiry = match (&meta.caller, meta.on_close) {
        (Ok(caller), OnClose::Detach) => caller.principal().expires_at.map(|at| {
            let left = at
                .duration_since(std::time::SystemTime::now())
                .unwrap_or_default();
            tokio::time::Instant::now() + left
        }),
        _ => None,
    };
    // One timer for both ends (every idle connection's state holds it):
    // the earlier one, the maximum age when they fall together (as when
    // each had a timer of its own, the age's first).
    let deadline = match (max_age, expiry) {
        (Some(age), Some(exp)) if age <= exp => Some((age, Deadline::MaxAge)),
        (_, Some(exp)) => Some((exp, Deadline::TokenExpiry)),
        (Some(age), None) => Some((age, Deadline::MaxAge)),
        (None, None) => None,
    };
    let key = match (&meta.caller, meta.on_close) {
        (Ok(caller), OnClose::Detach) => Some(caller.principal().key.clone()),
        _ => None,
    };
    loop {
        let pause = calls.penalty.lock().take();
        if let Some(until) = pause {
            tokio::select! {
                () = tokio::time::sleep_until(until) => {}
                () = gw.stopped() => {}
            }
        }
        let evicted = conn.held().map(|a| a.token.evicted.clone());
        let frame = tokio::select! {
            // Shutdown first: it also evicts every session, and its close
            // code must win.
            biased;
            () = gw.stopped() => {
                out.close(SHUTDOWN_CLOSE_CODE, "server shutting down").await;
                return Stop::Ended;
            }
            () = async { match &evicted { Some(t) => t.cancelled().await, None => std::future::pending().await } } => {
                if gw.is_stopped() {
                    out.close(SHUTDOWN_CLOSE_CODE, "server shutting down").await;
                } else {
                    out.close(4000, "session has been resumed by another connection").await;
                }
                return Stop::Ended;
            }
            // The connection's age, or the token that opened it no longer
            // holds: the session is detached, to be resumed (with a fresh
            // token).
            which = async { match deadline { Some((t, which)) => { tokio::time::sleep_until(t).await; which } None => std::future::pending().await } } => {
                match which {
                    Deadline::MaxAge => out.close(MAX_AGE_CLOSE_CODE, "connection reached its maximum age; resume the session").await,
                    Deadline::TokenExpiry => out.close(TOKEN_EXPIRED_CLOSE_CODE, "token expired; resume the session with a fresh token").await,
                }
                return Stop::Ended;
            }
            // A reload removed the key that verified it: as for an
            // expired token.
            () = async { match &key { Some(k) => k.removed().await, None => std::future::pending().await } } => {
                out.close(TOKEN_EXPIRED_CLOSE_CODE, "the token's key was removed; resume the session with a token of a configured key").await;
                return Stop::Ended;
            }
            f = inbound.next() => f,
        };
        let Some(frame) = frame else {
            return Stop::Eof;
        };
        // Each frame is handled in a future of its own, boxed: its state
        // (the action, the sends it awaits) would otherwise be part of
        // every idle connection's, a few KiB each.
        if let Some(stop) = Box::pin(on_frame(frame, inbound, calls, meta, conn)).await {
            return stop;
        }
    }
}

/// Which end of a connection its timer stands for.
#[derive(Clone, Copy)]
enum Deadline {
    MaxAge,
    TokenExpiry,
}

/// Act on one frame; `Some` when the connection stops.
async fn on_frame<S>(
    frame: InFrame,
    inbound: &mut S,
    calls: &Calls,
    meta: &ConnMeta,
    conn: &mut Machine<Attached>,
) -> Option<Stop>
where
    S: Stream<Item = InFrame> + Unpin + Send,
{
    let (gw, out) = (&calls.gw, &calls.out);
    match conn.on_frame(frame) {
        Action::Nothing => {}
        Action::ClientAnswer { id, result } => {
            if let Some(held) = conn.held() {
                held.session.answer_client(id, result);
            }
        }
        Action::Send(text) => {
            out.send(text).await;
        }
        Action::Initialize { id, params, frame } => {
            if let (Some(relay), Ok(p)) = (&meta.relay, params.as_ref())
                && let Some(session) = p.resume_session_id.as_deref()
                && let Some(replica) = peer_owner(gw, session)
            {
                // Another replica owns the session: from here on this
                // connection is a relay to it, frame for frame. Boxed,
                // as `initialize` below: a future awaited once per
                // connection would otherwise size every frame's boxed
                // state, calls included.
                relay
                    .run(RelayStart {
                        inbound,
                        out,
                        gw,
                        session,
                        replica: &replica,
                        id: &id,
                        first: frame,
                    })
                    .await;
                return Some(Stop::Relayed);
            }
            let span = tracing::info_span!("rpc", method = "initialize");
            let init = Box::pin(initialize(gw, &meta.caller, *params, out)).instrument(span);
            // Read on meanwhile (an image pull can take minutes): a
            // websocket's pings are answered below the frames as they
            // are read.
            let (result, early) = Box::pin(read_meanwhile(inbound, init)).await;
            count(gw, &meta.caller, "initialize", result.as_ref().err());
            let text = match result {
                Ok((reply, attached)) => {
                    conn.attach(attached);
                    jsonrpc::encode_response(&id, &reply)
                }
                Err(e) => jsonrpc::encode_error(&id, &e.to_jsonrpc()),
            };
            out.send(text).await;
            match early {
                None => {}
                Some(None) => return Some(Stop::Eof),
                // Boxed: this future would otherwise contain itself.
                Some(Some(f)) => return Box::pin(on_frame(f, inbound, calls, meta, conn)).await,
            }
        }
        Action::CloseSession { id } => {
            // Calls sent before the close are answered first.
            drain(calls).await;
            if let Some(a) = conn.held() {
                tracing::debug!(session.id = %a.session.id, "session closed by its client");
                gw.sessions.remove(&a.session);
                count(gw, &meta.caller, "session/close", None);
            }
            out.send(jsonrpc::encode_response(&id, &crate::protocol::Empty {}))
                .await;
            out.close(1000, "session closed").await;
            return Some(Stop::Closed);
        }
        Action::Call {
            id,
            call,
            charge,
            trace,
        } => {
            // A call before `initialize` was answered by the machine.
            let a = conn.held()?;
            if !start_call(calls, a, id, call, charge, trace).await {
                return Some(Stop::Ended);
            }
        }
    }
    None
}

/// Await `work` while reading `inbound`, so that what the door does as
/// frames are read goes on meanwhile (a websocket answers pings). The
/// first frame read (`Some(None)`: the end of the stream) is kept for
/// after `work`, and reading then waits: a client sends nothing else
/// before `initialize` is answered, and nothing more is held.
async fn read_meanwhile<S, F>(inbound: &mut S, work: F) -> (F::Output, Option<Option<InFrame>>)
where
    S: Stream<Item = InFrame> + Unpin + Send,
    F: Future,
{
    let mut work = std::pin::pin!(work);
    let mut early = None;
    loop {
        tokio::select! {
            biased;
            out = &mut work => return (out, early),
            f = inbound.next(), if early.is_none() => early = Some(f),
        }
    }
}

/// How long a connection that ends in order (`session/close`, stdio's
/// end of input) waits for the calls it already accepted to answer.
const DRAIN_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// Wait (bounded) until every call in flight on the connection answered.
async fn drain(calls: &Calls) {
    let all = u32::try_from(calls.gw.settings.max_in_flight_per_connection).unwrap_or(u32::MAX);
    let _ = tokio::time::timeout(DRAIN_TIMEOUT, calls.in_flight.acquire_many(all)).await;
}

/// Validate a call against its session and run it through the stack in
/// its own task. False when the connection can take no more calls.
async fn start_call(
    calls: &Calls,
    a: &Attached,
    id: RequestId,
    call: Call,
    charge: Charge,
    trace: Option<crate::telemetry::TraceContext>,
) -> bool {
    let out = &calls.out;
    if let Err(e) = a.session.validate_call(&call) {
        out.send(jsonrpc::encode_error(&id, &e.to_jsonrpc())).await;
        return true;
    }
    let mut ctx = a
        .caller
        .context(Some(a.session.clone()), a.token.evicted.clone());
    ctx.reply = Some(Responder::new(out.clone(), id.clone()));
    // Waiting here stops reading this connection: its own back-pressure,
    // invisible to other connections.
    let Ok(permit) = calls.in_flight.clone().acquire_owned().await else {
        return false;
    };
    let svc = calls.gw.stack.clone();
    let out = out.clone();
    let cancel = calls.cancel.clone();
    let penalty = calls.penalty.clone();
    // With spans exported, each call is one, continuing the client's trace.
    let span = if crate::telemetry::exporting() {
        let span = tracing::info_span!("jsonrpc.call", rpc.method = call.method());
        if let Some(t) = &trace {
            crate::telemetry::set_remote_parent(&span, t);
        }
        span
    } else {
        tracing::Span::none()
    };
    let task = async move {
        // What the client sent for this call stays charged while it runs.
        let _charge = charge;
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
                    // The handler sent it through the responder.
                    Ok(Outcome::Sent) => None,
                    Ok(Outcome::Reply(reply)) => Some(jsonrpc::encode_response(&id, &reply)),
                    Ok(Outcome::Opened(_)) => Some(jsonrpc::encode_error(
                        &id,
                        &GatewayError::Internal("unexpected stream".to_owned()).to_jsonrpc(),
                    )),
                    Err(e) => Some(jsonrpc::encode_error(&id, &e.to_jsonrpc())),
                };
                if let Some(text) = text {
                    out.send(text).await;
                }
            }
            () = cancel.cancelled() => {}
        }
        drop(permit);
    };
    crate::task::start("rpc", tracing::Instrument::instrument(task, span));
    true
}

/// Count a session-lifecycle request beside the calls the stack counts.
fn count(
    gw: &Gateway,
    caller: &Result<Caller, GatewayError>,
    method: &str,
    e: Option<&GatewayError>,
) {
    let tenant = match caller {
        Ok(c) => c.tenant().name.to_string(),
        Err(_) => String::new(),
    };
    gw.metrics
        .count_request(&tenant, method, e.map_or("ok", GatewayError::outcome));
}

async fn initialize(
    gw: &Arc<Gateway>,
    caller: &Result<Caller, GatewayError>,
    params: Result<InitializeParams, GatewayError>,
    out: &Outbound,
) -> Result<(Reply, Attached), GatewayError> {
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
    if let Some(id) = params.resume_session_id.as_deref() {
        let claimed = caller.principal().image.as_deref();
        match gw.sessions.lookup(caller.tenant(), id) {
            Ok(session) => session.check_image_claim(claimed)?,
            // Not held here: an executor's session (resumed on it after a
            // restart), which runs no image, so none a claim allows.
            Err(e) if claimed.is_some() => return Err(e),
            Err(_) => {}
        }
    }
    let image = match params.resume_session_id {
        None => {
            session_place(
                gw,
                caller,
                params.image.as_deref(),
                params.snapshot.as_deref(),
            )
            .await?
        }
        Some(_) => None,
    };
    // A failed initialize leaves the connection uninitialised: retry allowed.
    let (session, token) = gw
        .sessions
        .open(
            caller.tenant(),
            caller.principal().subject.as_deref(),
            params.resume_session_id.as_deref(),
            out.clone(),
            image,
        )
        .await?;
    if let Some(id) = params.snapshot.as_deref()
        && params.resume_session_id.is_none()
    {
        crate::audit::emit(
            "snapshot.forked",
            &crate::audit::Who {
                tenant: Some(&session.tenant.name),
                subject: caller.principal().subject.as_deref(),
                session: Some(&session.id),
            },
            serde_json::json!({ "snapshot_id": id }),
        );
    }
    let reply = Reply::Initialize(InitializeResponse {
        session_id: session.id.clone(),
        environment_info: Some(Box::new(session.backend.environment())),
    });
    Ok((
        reply,
        Attached {
            caller: caller.clone(),
            session,
            token,
        },
    ))
}

/// Where a new session is: the image it asked for (`image`), or a fork of
/// `snapshot` (on the image the snapshot was taken on), within what the
/// caller's token allows.
pub async fn session_place(
    gw: &Gateway,
    caller: &Caller,
    image: Option<&str>,
    snapshot: Option<&str>,
) -> Result<Option<crate::session::ChosenImage>, GatewayError> {
    let Some(id) = snapshot else {
        return session_image(gw, caller, image).await;
    };
    if !caller
        .principal()
        .scopes
        .grants(crate::auth::Scope::Snapshot)
    {
        return Err(GatewayError::MissingScope(
            crate::auth::Scope::Snapshot.name(),
        ));
    }
    let snapshots = caller.tenant().snapshots.clone().ok_or_else(|| {
        GatewayError::InvalidParams(
            "this tenant's sessions cannot start from a snapshot: they need a root of their own and the namespaces and workers layers".to_owned(),
        )
    })?;
    // Here, or pulled from the snapshot registry (another replica's).
    let (meta, fresh) = snapshots
        .store
        .restore(id, snapshots.owner)
        .await
        .map_err(|e| {
            if let crate::snapshot::SnapshotError::Io(why)
            | crate::snapshot::SnapshotError::Remote(why) = &e
            {
                tracing::error!(snapshot = id, error = %why, "restore");
            }
            GatewayError::from(e)
        })?;
    let placed = fork_place(gw, caller, image, id, &meta, &snapshots).await;
    // A copy restored only to be refused (its image not the tenant's, the
    // token's claim) is not kept, nor charged.
    if placed.is_err() && fresh {
        let _ = snapshots.store.delete(id);
    }
    placed
}

/// The checks of a fork of `meta` and its mount.
async fn fork_place(
    gw: &Gateway,
    caller: &Caller,
    image: Option<&str>,
    id: &str,
    meta: &crate::snapshot::Snapshot,
    snapshots: &crate::backend::local::Snapshots,
) -> Result<Option<crate::session::ChosenImage>, GatewayError> {
    match (image, meta.image.as_deref()) {
        (Some(asked), Some(taken)) if asked != taken => {
            return Err(GatewayError::InvalidParams(format!(
                "snapshot {id} was taken on image `{taken}`; a fork runs on it"
            )));
        }
        (Some(_), None) => {
            return Err(GatewayError::InvalidParams(format!(
                "snapshot {id} was taken on the host's userland; a fork runs on it"
            )));
        }
        // A token that may run only its claimed image may not run a fork
        // of the host's userland either.
        (None, None) if caller.principal().image.is_some() => {
            return Err(GatewayError::Forbidden(format!(
                "snapshot {id} was taken on the host's userland; the token's image claim names an image"
            )));
        }
        _ => {}
    }
    let chosen = session_image(gw, caller, meta.image.as_deref().or(image)).await?;
    let (workspace, _) = snapshots.fork(id)?;
    let mut chosen = chosen.unwrap_or_default();
    chosen.fork = Some(workspace);
    Ok(Some(chosen))
}

/// The image a new session asked for (`asked`) within what the caller's
/// token allows (its `image` claim names the only one it may run).
pub async fn session_image(
    gw: &Gateway,
    caller: &Caller,
    asked: Option<&str>,
) -> Result<Option<crate::session::ChosenImage>, GatewayError> {
    let claimed = caller.principal().image.as_deref();
    let wanted = match (asked, claimed) {
        (Some(a), Some(c)) if a != c => {
            return Err(GatewayError::Forbidden(
                "the token's image claim names another image".to_owned(),
            ));
        }
        (a, c) => a.or(c),
    };
    let Some(wanted) = wanted else {
        return Ok(None);
    };
    let source = crate::config::ImageSource::parse(wanted)
        .map_err(|e| GatewayError::InvalidParams(format!("image: {e}")))?;
    let view = gw.tenants.session_image(caller.tenant(), &source).await?;
    Ok(Some(crate::session::ChosenImage {
        view: Some(view),
        source: Some(source),
        fork: None,
    }))
}

/// The close code when the gateway stops: "service restart" (RFC 6455
/// registry), so clients reconnect, through the balancer, elsewhere.
pub const SHUTDOWN_CLOSE_CODE: u16 = 1012;

/// The close code when a connection reaches `server.max_connection_age`:
/// "going away"; the session is detached and resumable.
pub const MAX_AGE_CLOSE_CODE: u16 = 1001;

/// The close code when the token that opened a connection expires:
/// "policy violation"; the session is detached, resumable with a fresh token.
pub const TOKEN_EXPIRED_CLOSE_CODE: u16 = 1008;

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shed_calls_pause_the_connection_within_bounds() {
        let rate = |ms| GatewayError::RateLimited { retry_after_ms: ms };
        assert_eq!(shed_penalty(&rate(1)), Some(SHED_PENALTY_MIN));
        assert_eq!(
            shed_penalty(&rate(100)),
            Some(std::time::Duration::from_millis(100))
        );
        assert_eq!(shed_penalty(&rate(60_000)), Some(SHED_PENALTY_MAX));
        assert_eq!(
            shed_penalty(&GatewayError::Overloaded),
            Some(SHED_PENALTY_MIN)
        );
        assert_eq!(shed_penalty(&GatewayError::Draining), None);
    }
}
