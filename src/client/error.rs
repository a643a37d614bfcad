//! What went wrong, and the one place that maps each backend's errors to
//! it: a JSON-RPC error object (websocket) or a gRPC status (mapped to the
//! JSON-RPC code it stands for), and which errors are worth retrying.

use std::time::Duration;

use crate::error::code;
use crate::protocol::jsonrpc::ErrorObject;

/// What went wrong.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The gateway could not be reached, or refused the connection (the
    /// HTTP status and the gateway's reason).
    #[error("cannot connect to {url}: {detail}")]
    Connect { url: String, detail: String },
    /// The connection dropped and could not be resumed in time.
    #[error("connection lost: {0}")]
    Disconnected(String),
    /// The gateway answered a call with an error. `code` is the JSON-RPC
    /// code (gRPC statuses are mapped to the nearest one); `data` as sent.
    #[error("{message} ({code})")]
    Rpc {
        code: i64,
        message: String,
        data: Option<serde_json::Value>,
    },
    /// The gateway answered with something this client does not understand.
    #[error("unexpected answer from the gateway: {0}")]
    Protocol(String),
    /// A local file or stream failed.
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// A usage error (a bad URL, a relative path).
    #[error("{0}")]
    Usage(String),
}

impl ClientError {
    /// Whether a process id or file handle was already in use.
    pub fn is_already_exists(&self) -> bool {
        matches!(self, ClientError::Rpc { code: code::INVALID_REQUEST, message, .. } if message.ends_with("already exists"))
    }

    /// Whether a path or process was not found.
    pub fn is_not_found(&self) -> bool {
        match self {
            ClientError::Rpc {
                code: code::NOT_FOUND,
                ..
            } => true,
            ClientError::Rpc {
                code: code::INVALID_REQUEST,
                message,
                ..
            } => message.starts_with("unknown process id"),
            _ => false,
        }
    }

    pub(super) fn protocol(e: impl std::fmt::Display) -> ClientError {
        ClientError::Protocol(e.to_string())
    }
}

pub type Result<T, E = ClientError> = std::result::Result<T, E>;

/// A JSON-RPC error response as the client's error.
pub(super) fn rpc_error(e: ErrorObject) -> ClientError {
    ClientError::Rpc {
        code: e.code,
        message: e.message,
        data: e.data,
    }
}

/// A gRPC status as the JSON-RPC error it stands for; a broken
/// connection as [`ClientError::Disconnected`].
pub(super) fn status_error(s: tonic::Status) -> ClientError {
    use tonic::Code;
    let data = s
        .metadata()
        .get("x-exec-gateway-error-data")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| serde_json::from_str(v).ok());
    let message = s.message().to_owned();
    // The gateway refused this client's certificate after the handshake
    // (TLS 1.3 checks it last): no retry helps.
    let chain = super::common::error_chain(&s);
    if let Some(alert) = chain.find("received fatal alert") {
        return ClientError::Rpc {
            code: code::UNAUTHENTICATED,
            message: format!(
                "the gateway refused the TLS connection (its client certificate?): {}",
                &chain[alert..]
            ),
            data: None,
        };
    }
    let code = match s.code() {
        Code::Unavailable
            if data.is_none() && (is_transport(&message) || is_broken_stream(&message)) =>
        {
            return ClientError::Disconnected(message);
        }
        // What hyper and h2 report when the connection breaks mid-call.
        Code::Unknown | Code::Internal | Code::Cancelled if is_broken_stream(&message) => {
            return ClientError::Disconnected(message);
        }
        Code::InvalidArgument | Code::AlreadyExists | Code::FailedPrecondition => {
            code::INVALID_REQUEST
        }
        Code::NotFound if message.starts_with("unknown process id") => code::INVALID_REQUEST,
        Code::NotFound => code::NOT_FOUND,
        Code::Unimplemented => code::METHOD_NOT_FOUND,
        Code::Unavailable | Code::ResourceExhausted
            if data
                .as_ref()
                .is_some_and(|d: &serde_json::Value| d.get("quota").is_some()) =>
        {
            code::QUOTA_EXCEEDED
        }
        Code::Unavailable => code::OVERLOADED,
        Code::ResourceExhausted => code::QUOTA_EXCEEDED,
        Code::Unauthenticated => code::UNAUTHENTICATED,
        Code::PermissionDenied => code::FORBIDDEN,
        Code::DeadlineExceeded => code::DEADLINE_EXCEEDED,
        _ => code::INTERNAL,
    };
    ClientError::Rpc {
        code,
        message,
        data,
    }
}

/// Whether an error ending a stream is the connection's.
fn is_broken_stream(message: &str) -> bool {
    let m = message.to_ascii_lowercase();
    m.starts_with("h2 protocol error")
        || m.starts_with("transport error")
        || m.contains("connection reset")
        || m.contains("broken pipe")
        // hyper's word for a call whose connection went away under it.
        || m == "operation was canceled"
        // A stream a balancer ended when the replica behind it died.
        || m.contains("stream was terminated without a final status")
}

/// Whether an UNAVAILABLE is the connection's, not the gateway's answer.
fn is_transport(message: &str) -> bool {
    let m = message.to_ascii_lowercase();
    m.contains("transport")
        || m.contains("connection")
        || m.contains("connect")
        || m.contains("broken pipe")
        || m.contains("error trying")
}

/// A balancer (or the gateway) answered the handshake 502, 503 or 504: the
/// replica behind it died mid-handshake, or is over its connection limit.
/// A websocket handshake creates nothing (the session comes with
/// `initialize`, after it), so asking again is safe.
pub(super) fn is_unavailable_at_handshake(e: &ClientError) -> bool {
    matches!(e, ClientError::Connect { detail, .. }
        if ["502", "503", "504"].iter().any(|s| detail.starts_with(s)))
}

/// The replica reached is draining and takes no new session
/// (`data.reason = "serverShuttingDown"`); another connection through the
/// balancer reaches another replica.
pub(super) fn is_draining(e: &ClientError) -> bool {
    matches!(e, ClientError::Rpc { data: Some(d), .. } if d.get("reason").and_then(|r| r.as_str()) == Some("serverShuttingDown"))
}

/// -32001: the gateway or the tenant is over a limit; retry after a while.
pub(super) fn is_overloaded(e: &ClientError) -> bool {
    matches!(
        e,
        ClientError::Rpc {
            code: code::OVERLOADED,
            ..
        }
    )
}

/// Whether a failed resume may succeed if tried again: the old connection
/// has not let go yet, the gateway is overloaded, or it could not be
/// reached (but not when it refused the token).
pub(super) fn is_transient(e: &ClientError) -> bool {
    match e {
        ClientError::Rpc { message, .. } => {
            message.contains("already attached to another connection") || is_overloaded(e)
        }
        // A refused token will be refused again.
        ClientError::Connect { detail, .. } => {
            !(detail.starts_with("401") || detail.starts_with("403"))
        }
        _ => true,
    }
}

/// How long to wait before retrying an overloaded call: the gateway's
/// `retryAfterMs` when it says, 100 ms otherwise (10 ms to 5 s).
pub(super) fn retry_after(e: &ClientError) -> Duration {
    let ms = match e {
        ClientError::Rpc { data: Some(d), .. } => {
            d.get("retryAfterMs").and_then(serde_json::Value::as_u64)
        }
        _ => None,
    };
    Duration::from_millis(ms.unwrap_or(100).clamp(10, 5_000))
}

/// A refused token at connect time is a connection error.
pub(super) fn auth_as_connect(e: ClientError, url: &str) -> ClientError {
    match e {
        ClientError::Rpc { code, message, .. }
            if code == code::UNAUTHENTICATED || code == code::FORBIDDEN =>
        {
            ClientError::Connect {
                url: url.to_owned(),
                detail: message,
            }
        }
        e => e,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use serde_json::json;

    fn rpc(code: i64, message: &str) -> ClientError {
        rpc_error(ErrorObject {
            code,
            message: message.to_owned(),
            data: None,
        })
    }

    #[test]
    fn error_objects_keep_code_message_and_data() {
        let e = rpc_error(ErrorObject {
            code: -32006,
            message: "quota".into(),
            data: Some(json!({"quota": "processes"})),
        });
        match e {
            ClientError::Rpc {
                code,
                message,
                data,
            } => {
                assert_eq!((code, message.as_str()), (-32006, "quota"));
                assert_eq!(data, Some(json!({"quota": "processes"})));
            }
            e => panic!("{e:?}"),
        }
    }

    #[test]
    fn not_found_and_already_exists_read_the_reference_messages() {
        assert!(rpc(-32600, "process p1 already exists").is_already_exists());
        assert!(!rpc(-32600, "unknown process id p1").is_already_exists());
        assert!(!rpc(-32004, "process p1 already exists").is_already_exists());
        assert!(rpc(-32004, "no such file").is_not_found());
        assert!(rpc(-32600, "unknown process id p1").is_not_found());
        assert!(!rpc(-32600, "bad base64").is_not_found());
        assert!(!ClientError::Disconnected("x".into()).is_not_found());
    }

    fn status(code: tonic::Code, message: &str, data: Option<&str>) -> ClientError {
        let mut s = tonic::Status::new(code, message);
        if let Some(d) = data {
            s.metadata_mut()
                .insert("x-exec-gateway-error-data", d.parse().unwrap());
        }
        status_error(s)
    }

    fn code_of(e: ClientError) -> i64 {
        match e {
            ClientError::Rpc { code, .. } => code,
            e => panic!("not an rpc error: {e:?}"),
        }
    }

    #[test]
    fn grpc_statuses_map_to_json_rpc_codes() {
        use tonic::Code;
        for (c, message, want) in [
            (Code::InvalidArgument, "bad", -32600),
            (Code::AlreadyExists, "process p already exists", -32600),
            (Code::FailedPrecondition, "x", -32600),
            (Code::NotFound, "unknown process id p", -32600),
            (Code::NotFound, "no such file", -32004),
            (Code::Unimplemented, "x", -32601),
            (Code::Unavailable, "overloaded", -32001),
            (Code::ResourceExhausted, "x", -32006),
            (Code::Unauthenticated, "x", -32002),
            (Code::PermissionDenied, "x", -32003),
            (Code::DeadlineExceeded, "x", -32005),
            (Code::Internal, "boom", -32603),
        ] {
            assert_eq!(code_of(status(c, message, None)), want, "{c:?} {message}");
        }
        // A quota refusal says so in its data, whatever the status.
        let e = status(Code::Unavailable, "x", Some(r#"{"quota":"processes"}"#));
        assert!(
            matches!(&e, ClientError::Rpc { code: -32006, data: Some(d), .. } if d["quota"] == "processes")
        );
        // Data comes through as sent.
        let e = status(Code::Unavailable, "busy", Some(r#"{"retryAfterMs":700}"#));
        assert_eq!(retry_after(&e), Duration::from_millis(700));
    }

    #[test]
    fn a_handshake_the_balancer_could_not_complete_is_asked_again() {
        let connect = |detail: &str| ClientError::Connect {
            url: "ws://h".into(),
            detail: detail.into(),
        };
        assert!(is_unavailable_at_handshake(&connect(
            "502 Bad Gateway <html>..."
        )));
        assert!(is_unavailable_at_handshake(&connect(
            "503 Service Unavailable connection limit reached"
        )));
        assert!(!is_unavailable_at_handshake(&connect("401 Unauthorized")));
        assert!(!is_unavailable_at_handshake(&connect(
            "IO error: Connection refused (os error 111)"
        )));
    }

    #[test]
    fn a_draining_replica_is_told_by_its_reason() {
        let draining = ClientError::Rpc {
            code: -32600,
            message: "server is shutting down".into(),
            data: Some(json!({"reason": "serverShuttingDown"})),
        };
        assert!(is_draining(&draining));
        assert!(!is_draining(&rpc(-32600, "server is shutting down")));
        let other = ClientError::Rpc {
            code: -32600,
            message: "x".into(),
            data: Some(json!({"reason": "ownerRestarted"})),
        };
        assert!(!is_draining(&other));
    }

    #[test]
    fn broken_connections_are_disconnections() {
        use tonic::Code;
        for (c, message) in [
            (
                Code::Unavailable,
                "error trying to connect: Connection refused",
            ),
            (Code::Unknown, "h2 protocol error: stream reset"),
            (Code::Internal, "transport error"),
            (Code::Cancelled, "Connection reset by peer"),
            // Seen when a connection is reset mid-call (the soak's cuts).
            (Code::Cancelled, "operation was canceled"),
            // A call forwarded through a replica that was killed (the
            // soak's replica chaos).
            (Code::Unavailable, "h2 protocol error: http2 error"),
            // What tonic says of a stream HAProxy ended when the replica
            // forwarding it was killed (the soak's replica chaos).
            (
                Code::Internal,
                "protocol error: missing grpc-status trailer, stream was terminated without a final status (possible truncation by a proxy or load balancer)",
            ),
        ] {
            assert!(
                matches!(status(c, message, None), ClientError::Disconnected(m) if m == message),
                "{c:?} {message}"
            );
        }
        // The gateway's own UNAVAILABLE (with data) is an answer.
        let e = status(
            Code::Unavailable,
            "connection limit",
            Some(r#"{"reason":"x"}"#),
        );
        assert_eq!(code_of(e), -32001);
    }

    #[test]
    fn retries_follow_the_gateways_hint_within_bounds() {
        let with = |d: serde_json::Value| ClientError::Rpc {
            code: -32001,
            message: "busy".into(),
            data: Some(d),
        };
        assert_eq!(
            retry_after(&with(json!({"retryAfterMs": 250}))),
            Duration::from_millis(250)
        );
        assert_eq!(
            retry_after(&with(json!({"retryAfterMs": 1}))),
            Duration::from_millis(10)
        );
        assert_eq!(
            retry_after(&with(json!({"retryAfterMs": 60_000}))),
            Duration::from_secs(5)
        );
        assert_eq!(retry_after(&rpc(-32001, "x")), Duration::from_millis(100));
        assert!(is_overloaded(&rpc(-32001, "x")));
        assert!(!is_overloaded(&rpc(-32006, "x")));
    }

    #[test]
    fn a_refused_token_is_not_retried() {
        let connect = |detail: &str| ClientError::Connect {
            url: "ws://x".into(),
            detail: detail.into(),
        };
        assert!(!is_transient(&connect("401 Unauthorized bad token")));
        assert!(!is_transient(&connect("403 Forbidden")));
        assert!(is_transient(&connect("Connection refused")));
        assert!(is_transient(&rpc(
            -32010,
            "session s is already attached to another connection"
        )));
        assert!(is_transient(&rpc(-32001, "busy")));
        assert!(!is_transient(&rpc(-32600, "unknown session id s")));
        assert!(is_transient(&ClientError::Disconnected("x".into())));
        assert!(matches!(
            auth_as_connect(rpc(-32002, "bad token"), "grpc://h"),
            ClientError::Connect { url, detail } if url == "grpc://h" && detail == "bad token"
        ));
        assert_eq!(code_of(auth_as_connect(rpc(-32600, "x"), "u")), -32600);
    }
}
