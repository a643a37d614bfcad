//! One JSON-RPC connection's protocol state as a plain state machine: a
//! frame in, one [`Action`] out, no I/O. The driver (`super`) performs the
//! actions (sends, opens sessions, runs calls through the stack) and tells
//! the machine what became of an `initialize` ([`Machine::attach`]).
//!
//! What is decided here: envelope decoding and its errors (worded as the
//! session's revision words them), the initialize gate (`initialize` once,
//! then `initialized`, before any other method), notifications, method
//! lookup and params decoding (-32601 / -32602 before the gate, as the
//! reference does), and `session/close`'s gate.

use crate::error::GatewayError;
use crate::protocol::jsonrpc::{self, Inbound, RequestId};
use crate::protocol::methods;
use crate::protocol::process::InitializeParams;
use crate::protocol::revision::Policy;
use crate::rpc::{Call, MethodFamily};
use crate::transport::inbound::Charge;

/// Longest string request id accepted: every id is held for as long as its
/// request lives, and echoed in its reply.
pub const MAX_REQUEST_ID_BYTES: usize = 256;

/// One inbound frame (a websocket message or a stdio line).
#[derive(Debug)]
pub enum InFrame {
    /// A message, with what it is charged of the inbound budgets (nothing
    /// for stdio, whose one client is the operator).
    Text(String, Charge),
    /// The frame exceeded the size limit; the transport says how.
    TooLarge(String),
}

/// What the driver does with a frame.
#[derive(Debug)]
#[expect(
    clippy::large_enum_variant,
    reason = "calls are the hot path; boxing them costs an allocation per call"
)]
pub enum Action {
    /// Nothing (a response sent by the client, `initialized`).
    Nothing,
    /// Send this frame: an error decided here.
    Send(String),
    /// `initialize` on a connection without a session: open or resume one
    /// (or relay the connection to the replica that owns it), then
    /// [`Machine::attach`] it on success. `frame` is the request itself.
    Initialize {
        id: RequestId,
        params: Box<Result<InitializeParams, GatewayError>>,
        frame: String,
    },
    /// A call for the connection's session; the message's inbound charge
    /// is held until the call is answered (every other action gives it
    /// back as soon as the frame is decided).
    Call {
        id: RequestId,
        call: Call,
        charge: Charge,
        /// The client's W3C trace context (the envelope's `trace`), read
        /// only when spans are exported.
        trace: Option<crate::telemetry::TraceContext>,
    },
    /// `session/close`: end the session, answer, close the connection.
    CloseSession { id: RequestId },
    /// The client answered a request the gateway sent it (`result`
    /// `None` for an error).
    ClientAnswer { id: u64, result: Option<String> },
}

/// What the machine needs of the session a connection holds.
pub trait Held {
    /// How the session answers (its revision, once told).
    fn policy(&self) -> &'static Policy;
}

/// Where a connection's frames come from, as the malformed-frame message
/// names it (the reference's wording); written out only when one comes,
/// so an idle connection holds no copy of the text.
#[derive(Debug, Clone)]
pub enum FrameSource {
    Stdio,
    Websocket(std::net::SocketAddr),
    /// A client of another replica, as that replica named it.
    Relayed(std::sync::Arc<str>),
}

impl std::fmt::Display for FrameSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let peer: &dyn std::fmt::Display = match self {
            FrameSource::Stdio => {
                return f.write_str("failed to parse JSON-RPC message from exec-server stdio");
            }
            FrameSource::Websocket(peer) => peer,
            FrameSource::Relayed(client) => client,
        };
        write!(
            f,
            "failed to parse websocket JSON-RPC message from exec-server websocket {peer}"
        )
    }
}

/// The connection's state; `H` is what the driver keeps of its session.
#[derive(Debug)]
pub struct Machine<H> {
    /// Named in the malformed-frame message.
    source: FrameSource,
    phase: Phase<H>,
}

#[derive(Debug)]
enum Phase<H> {
    /// No session yet (or a failed `initialize`: retry allowed).
    New,
    /// `initialize` answered; `initialized` may or may not have come.
    Attached { held: H, initialized: bool },
}

impl<H: Held> Machine<H> {
    pub fn new(source: FrameSource) -> Self {
        Machine {
            source,
            phase: Phase::New,
        }
    }

    /// The session the connection holds, once `initialize` succeeded.
    pub fn held(&self) -> Option<&H> {
        match &self.phase {
            Phase::New => None,
            Phase::Attached { held, .. } => Some(held),
        }
    }

    /// The session, taken as the connection ends.
    pub fn into_held(self) -> Option<H> {
        match self.phase {
            Phase::New => None,
            Phase::Attached { held, .. } => Some(held),
        }
    }

    /// `initialize` succeeded with `held`.
    pub fn attach(&mut self, held: H) {
        self.phase = Phase::Attached {
            held,
            initialized: false,
        };
    }

    fn malformed(&self, detail: &str) -> GatewayError {
        GatewayError::InvalidRequest(format!("{}: {detail}", self.source))
    }

    /// Envelope errors are worded as the session's revision words them.
    fn current_texts(&self) -> bool {
        self.held().is_some_and(|h| h.policy().current_error_texts)
    }

    /// The next step for one inbound frame.
    pub fn on_frame(&mut self, frame: InFrame) -> Action {
        let (text, charge) = match frame {
            InFrame::Text(t, charge) => (t, charge),
            InFrame::TooLarge(reason) => return unknown_error(&self.malformed(&reason)),
        };
        let current = self.current_texts();
        let (id, method, params) = match jsonrpc::decode(&text) {
            Err(e) => {
                let detail = if current {
                    e.current_text()
                } else {
                    e.to_string()
                };
                return unknown_error(&self.malformed(&detail));
            }
            Ok(Inbound::ClientResponse { id, result }) => {
                return match (id, &self.phase) {
                    (Some(id), Phase::Attached { .. }) => Action::ClientAnswer { id, result },
                    _ => {
                        tracing::debug!("ignoring a response sent by the client");
                        Action::Nothing
                    }
                };
            }
            Ok(Inbound::Notification { bad_id: true, .. }) if current => {
                return unknown_error(&self.malformed(jsonrpc::BAD_REQUEST_ID));
            }
            Ok(Inbound::Notification { method, .. }) => return self.on_notification(&method),
            Ok(Inbound::Request {
                id: RequestId::String(id),
                ..
            }) if id.len() > MAX_REQUEST_ID_BYTES => {
                // Never echoed: a request's id is held (and echoed) for as
                // long as the request lives.
                return unknown_error(&GatewayError::InvalidRequest(format!(
                    "request id is {} bytes; at most {MAX_REQUEST_ID_BYTES} are accepted",
                    id.len()
                )));
            }
            Ok(Inbound::Request { id, method, params }) => (id, method, params),
        };
        if method == methods::SESSION_CLOSE {
            return self.on_close(id);
        }
        let Some(family) = MethodFamily::of(&method) else {
            return error(&id, &GatewayError::MethodNotFound(method));
        };
        if family == MethodFamily::Initialize {
            let params = jsonrpc::decode_params(params).map_err(GatewayError::InvalidParams);
            return self.on_initialize(id, params, text);
        }
        // Params are decoded before the initialize gate, as the reference
        // does: a malformed request says so even then.
        let call = match Call::decode(&method, params) {
            Ok(call) => call,
            Err(e) => return error(&id, &e),
        };
        match &self.phase {
            Phase::New => error(
                &id,
                &GatewayError::InvalidRequest(format!(
                    "client must call initialize before using {} methods",
                    family.label()
                )),
            ),
            Phase::Attached {
                initialized: false, ..
            } => error(
                &id,
                &GatewayError::InvalidRequest(format!(
                    "client must send initialized before using {} methods",
                    family.label()
                )),
            ),
            Phase::Attached { .. } => Action::Call {
                id,
                call,
                charge,
                trace: crate::telemetry::exporting()
                    .then(|| jsonrpc::trace_of(&text))
                    .flatten(),
            },
        }
    }

    fn on_notification(&mut self, method: &str) -> Action {
        if method == methods::INITIALIZED
            && let Phase::Attached { initialized, .. } = &mut self.phase
        {
            *initialized = true;
            return Action::Nothing;
        }
        // The original specification's behaviour (not the reference
        // binary's silent close): answer on id -1 and keep the connection.
        let message = if method == methods::INITIALIZED {
            "client must call initialize before sending initialized".to_owned()
        } else {
            format!("unexpected notification `{method}`")
        };
        unknown_error(&GatewayError::InvalidRequest(message))
    }

    fn on_initialize(
        &self,
        id: RequestId,
        params: Result<InitializeParams, GatewayError>,
        frame: String,
    ) -> Action {
        if self.held().is_some() {
            // As the reference: the params are checked first.
            if let Err(e) = &params {
                return error(&id, e);
            }
            return error(
                &id,
                &GatewayError::InvalidRequest(
                    "initialize may only be sent once per connection".to_owned(),
                ),
            );
        }
        Action::Initialize {
            id,
            params: Box::new(params),
            frame,
        }
    }

    /// Extension: a client that is done ends its session now instead of
    /// leaving it detached for its TTL (and frees its quota).
    fn on_close(&self, id: RequestId) -> Action {
        match &self.phase {
            Phase::Attached {
                initialized: true, ..
            } => Action::CloseSession { id },
            _ => error(
                &id,
                &GatewayError::InvalidRequest(
                    "client must call initialize before closing its session".to_owned(),
                ),
            ),
        }
    }
}

fn error(id: &RequestId, e: &GatewayError) -> Action {
    Action::Send(jsonrpc::encode_error(id, &e.to_jsonrpc()))
}

/// An error that belongs to no request (id -1).
fn unknown_error(e: &GatewayError) -> Action {
    error(&RequestId::UNKNOWN, e)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::panic)]
    use super::*;
    use crate::protocol::revision::{MAY_2026, NOV_2026};

    struct Fake(&'static Policy);

    impl Held for Fake {
        fn policy(&self) -> &'static Policy {
            self.0
        }
    }

    const STDIO: &str = "failed to parse JSON-RPC message from exec-server stdio";

    fn machine() -> Machine<Fake> {
        Machine::new(FrameSource::Stdio)
    }

    fn text(s: &str) -> InFrame {
        InFrame::Text(s.to_owned(), Charge::default())
    }

    /// The error a `Send` carries: (id, code, message).
    fn sent(a: Action) -> (serde_json::Value, i64, String) {
        let Action::Send(t) = a else {
            panic!("not a send: {a:?}")
        };
        let v: serde_json::Value = serde_json::from_str(&t).unwrap();
        (
            v["id"].clone(),
            v["error"]["code"].as_i64().unwrap(),
            v["error"]["message"].as_str().unwrap().to_owned(),
        )
    }

    const INIT: &str = r#"{"id":1,"method":"initialize","params":{"clientName":"t"}}"#;
    const LIST: &str = r#"{"id":2,"method":"process/list"}"#;

    fn initialized(policy: &'static Policy) -> Machine<Fake> {
        let mut m = machine();
        assert!(matches!(m.on_frame(text(INIT)), Action::Initialize { .. }));
        m.attach(Fake(policy));
        assert!(matches!(
            m.on_frame(text(r#"{"method":"initialized"}"#)),
            Action::Nothing
        ));
        m
    }

    #[test]
    fn calls_wait_for_initialize_then_initialized() {
        let mut m = machine();
        let (id, code, msg) = sent(m.on_frame(text(LIST)));
        assert_eq!((id, code), (serde_json::json!(2), -32600));
        assert_eq!(msg, "client must call initialize before using exec methods");
        let Action::Initialize { id, params, frame } = m.on_frame(text(INIT)) else {
            panic!()
        };
        assert_eq!(id, RequestId::Integer(1));
        assert_eq!(params.unwrap().client_name, "t");
        assert_eq!(frame, INIT);
        m.attach(Fake(&MAY_2026));
        let (_, _, msg) = sent(m.on_frame(text(LIST)));
        assert_eq!(
            msg,
            "client must send initialized before using exec methods"
        );
        assert!(matches!(
            m.on_frame(text(r#"{"method":"initialized"}"#)),
            Action::Nothing
        ));
        assert!(matches!(m.on_frame(text(LIST)), Action::Call { .. }));
        // Once per connection.
        let (_, code, msg) = sent(m.on_frame(text(INIT)));
        assert_eq!(code, -32600);
        assert_eq!(msg, "initialize may only be sent once per connection");
        // Malformed params are reported first, as the reference does.
        let (_, code, msg) =
            sent(m.on_frame(text(r#"{"id":9,"method":"initialize","params":{}}"#)));
        assert_eq!(code, -32602);
        assert_eq!(msg, "missing field `clientName`");
    }

    /// A call keeps what its message is charged of the inbound budgets
    /// until it is answered; a frame that becomes anything else gives it
    /// back at once.
    #[test]
    fn only_a_call_keeps_its_messages_inbound_charge() {
        use crate::outbound::ByteBudget;
        use prometheus_client::metrics::gauge::Gauge;
        let held = Gauge::default();
        let tenant = ByteBudget::new(4096, held.clone(), Gauge::default(), Gauge::default());
        let charged = |s: &str| {
            let charge = Charge::new(
                tenant.try_reserve(s.len()).unwrap(),
                ByteBudget::unlimited().try_reserve(s.len()).unwrap(),
            );
            InFrame::Text(s.to_owned(), charge)
        };
        let mut m = Machine::<Fake>::new(FrameSource::Stdio);
        m.attach(Fake(&NOV_2026));
        assert!(matches!(
            m.on_frame(charged(r#"{"method":"initialized"}"#)),
            Action::Nothing
        ));
        assert_eq!(held.get(), 0);
        assert!(matches!(m.on_frame(charged("{not json")), Action::Send(_)));
        assert_eq!(held.get(), 0);
        let Action::Call { charge, .. } = m.on_frame(charged(LIST)) else {
            panic!("not a call")
        };
        assert_eq!(charge.bytes(), LIST.len());
        assert_eq!(held.get(), LIST.len() as i64);
        drop(charge);
        assert_eq!(held.get(), 0);
    }

    #[test]
    fn a_failed_initialize_may_be_retried() {
        let mut m = machine();
        assert!(matches!(m.on_frame(text(INIT)), Action::Initialize { .. }));
        // The driver did not attach: the next initialize is asked again.
        assert!(matches!(m.on_frame(text(INIT)), Action::Initialize { .. }));
        assert!(m.held().is_none());
    }

    #[test]
    fn unknown_methods_and_bad_params_are_answered_before_the_gate() {
        let mut m = machine();
        let (id, code, _) = sent(m.on_frame(text(r#"{"id":"x","method":"nope/nope"}"#)));
        assert_eq!((id, code), (serde_json::json!("x"), -32601));
        let (_, code, msg) = sent(m.on_frame(text(
            r#"{"id":3,"method":"process/start","params":{"processId":"p"}}"#,
        )));
        assert_eq!((code, msg.as_str()), (-32602, "missing field `argv`"));
        // Bad initialize params are the driver's to answer (after the
        // once-per-connection check, as the reference orders them).
        let Action::Initialize { params, .. } = m.on_frame(text(
            r#"{"id":4,"method":"initialize","params":{"clientName":5}}"#,
        )) else {
            panic!()
        };
        assert_eq!(params.unwrap_err().to_jsonrpc().code, -32602);
    }

    #[test]
    fn malformed_frames_answer_on_id_minus_one_in_the_sessions_words() {
        let mut m = machine();
        let (id, code, msg) = sent(m.on_frame(text("{not json")));
        assert_eq!((id, code), (serde_json::json!(-1), -32600));
        assert!(msg.starts_with(&format!("{STDIO}: ")), "{msg}");
        let (_, _, msg) = sent(m.on_frame(InFrame::TooLarge("16 MiB".to_owned())));
        assert_eq!(msg, format!("{STDIO}: 16 MiB"));
        // A null id: a notification to 0.130.0, refused by 0.169.0.
        let bad_id = r#"{"id":null,"method":"process/list"}"#;
        let (_, _, may) = sent(initialized(&MAY_2026).on_frame(text(bad_id)));
        assert_eq!(may, "unexpected notification `process/list`");
        let (_, _, nov) = sent(initialized(&NOV_2026).on_frame(text(bad_id)));
        assert_eq!(nov, format!("{STDIO}: {}", jsonrpc::BAD_REQUEST_ID));
    }

    #[test]
    fn request_ids_longer_than_256_bytes_are_refused_without_an_echo() {
        let mut m = initialized(&MAY_2026);
        let at_limit = "i".repeat(MAX_REQUEST_ID_BYTES);
        let frame = format!(r#"{{"id":"{at_limit}","method":"process/list"}}"#);
        let Action::Call { id, .. } = m.on_frame(text(&frame)) else {
            panic!()
        };
        assert_eq!(id, RequestId::String(at_limit.clone()));
        let frame = format!(r#"{{"id":"{at_limit}i","method":"process/list"}}"#);
        let (id, code, msg) = sent(m.on_frame(text(&frame)));
        assert_eq!((id, code), (serde_json::json!(-1), -32600));
        assert_eq!(msg, "request id is 257 bytes; at most 256 are accepted");
    }

    #[test]
    fn notifications_and_client_responses() {
        let mut m = machine();
        let (_, _, msg) = sent(m.on_frame(text(r#"{"method":"initialized"}"#)));
        assert_eq!(
            msg,
            "client must call initialize before sending initialized"
        );
        let (_, _, msg) = sent(m.on_frame(text(r#"{"method":"what"}"#)));
        assert_eq!(msg, "unexpected notification `what`");
        assert!(matches!(
            m.on_frame(text(r#"{"id":9,"result":{}}"#)),
            Action::Nothing
        ));
    }

    #[test]
    fn session_close_needs_an_initialized_session() {
        let close = r#"{"id":7,"method":"session/close"}"#;
        let (_, code, _) = sent(machine().on_frame(text(close)));
        assert_eq!(code, -32600);
        let Action::CloseSession { id } = initialized(&MAY_2026).on_frame(text(close)) else {
            panic!()
        };
        assert_eq!(id, RequestId::Integer(7));
    }
}
