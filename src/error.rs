//! `GatewayError` and the one table that maps it to wire codes.
//!
//! Handlers return typed errors; only this file knows JSON-RPC codes, gRPC
//! status codes and handshake HTTP statuses. Messages that the reference
//! defines are kept byte for byte (docs/protocol.md, "Errors").

use serde_json::json;

use crate::protocol::jsonrpc::ErrorObject;

/// JSON-RPC codes. The -320xx server range codes marked *ours* are the
/// gateway's (docs/protocol.md, "Errors").
pub mod code {
    pub const INVALID_REQUEST: i64 = -32600;
    pub const METHOD_NOT_FOUND: i64 = -32601;
    pub const INVALID_PARAMS: i64 = -32602;
    pub const INTERNAL: i64 = -32603;
    pub const NOT_FOUND: i64 = -32004;
    /// Ours: load shedding, the reference client's overload code.
    pub const OVERLOADED: i64 = -32001;
    /// Ours: authentication failed (stdio `initialize`).
    pub const UNAUTHENTICATED: i64 = -32002;
    /// Ours: scope or policy forbids the call.
    pub const FORBIDDEN: i64 = -32003;
    /// Ours: the request passed its deadline.
    pub const DEADLINE_EXCEEDED: i64 = -32005;
    /// Ours: a tenant quota is exhausted.
    pub const QUOTA_EXCEEDED: i64 = -32006;
    /// 0.169.0: the session is attached to another connection.
    pub const SESSION_ATTACHED: i64 = -32010;
    /// Ours: the replica that owns the session cannot be reached.
    pub const OWNER_UNAVAILABLE: i64 = -32007;
}

/// Wire-independent classification of an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    InvalidRequest,
    /// An unknown process or session id (-32600 like the reference; NOT_FOUND on gRPC).
    UnknownId,
    /// A process id already in use (-32600 like the reference; ALREADY_EXISTS on gRPC).
    AlreadyExists,
    MethodNotFound,
    InvalidParams,
    NotFound,
    /// A path outside the tenant root: "not found" to a client, counted apart.
    OutsideRoot,
    /// Resuming a session that another connection holds.
    SessionAttached,
    Internal,
    Overloaded,
    Unauthenticated,
    Forbidden,
    DeadlineExceeded,
    QuotaExceeded,
    Draining,
    /// The session's replica cannot be reached (fleet).
    OwnerUnavailable,
    /// The session's replica restarted since: the session is gone.
    OwnerLost,
    /// The remote executor that runs the session is gone or unreachable.
    ExecutorUnavailable,
    /// The remote executor answered with an error of its own.
    Executor,
    /// The tenant's own image is still being pulled: retry shortly.
    ImagePulling,
}

/// Every error a call can end in.
#[derive(Debug, Clone, thiserror::Error)]
pub enum GatewayError {
    /// -32600 with the given message (pre-init errors, bad base64, ...).
    #[error("{0}")]
    InvalidRequest(String),
    /// -32600 "unknown process id X" / "unknown session id X".
    #[error("{0}")]
    UnknownId(String),
    /// -32600 "process X already exists".
    #[error("{0}")]
    AlreadyExists(String),
    #[error("exec-server stub does not implement `{0}` yet")]
    MethodNotFound(String),
    #[error("{0}")]
    InvalidParams(String),
    /// -32004: a path that does not exist.
    #[error("{0}")]
    NotFound(String),
    /// -32004: a path outside the tenant root (the message says so).
    #[error("{0}")]
    OutsideRoot(String),
    /// Resuming a session another connection holds: -32010 for a 0.169.0
    /// session, -32600 for a 0.130.0 one (each reference's code).
    #[error("session {id} is already attached to another connection")]
    SessionAttached { id: String, current: bool },
    /// -32603 with a message safe to show (OS error text).
    #[error("{0}")]
    Internal(String),
    #[error("Server overloaded; retry later.")]
    Overloaded,
    /// -32001 from a rate limit, with when to retry.
    #[error("Server overloaded; retry later.")]
    RateLimited { retry_after_ms: u64 },
    /// -32003 "forbidden": the token lacks the scope this method needs.
    #[error("forbidden")]
    MissingScope(&'static str),
    #[error("{0}")]
    Unauthenticated(String),
    #[error("{0}")]
    Forbidden(String),
    #[error("request deadline exceeded")]
    DeadlineExceeded,
    #[error("quota exceeded: {quota} (limit {limit})")]
    QuotaExceeded {
        quota: &'static str,
        limit: u64,
        retry_after_ms: Option<u64>,
    },
    #[error("server is shutting down")]
    Draining,
    /// The session lives on another replica that cannot be reached.
    #[error("session {session} is owned by replica {replica}, which is unavailable: {detail}")]
    OwnerUnavailable {
        session: String,
        replica: String,
        detail: String,
    },
    /// The session lived on an earlier run of its replica.
    #[error(
        "session {session} was owned by replica {replica}, which has restarted since; its processes are gone"
    )]
    OwnerLost { session: String, replica: String },
    /// The session's remote executor is gone (or none is free to open it).
    #[error("executor {executor} of pool {pool} is unavailable: {detail}")]
    ExecutorUnavailable {
        pool: String,
        executor: String,
        detail: String,
    },
    /// An error the session's remote executor answered, passed on as it
    /// came (its code is from the same protocol).
    #[error("{message}")]
    Executor {
        code: i64,
        message: String,
        data: Option<serde_json::Value>,
    },
    /// A handshake that activates a tenant answered before its deadline
    /// while the tenant's image is still being pulled (the pull goes on):
    /// -32001, HTTP 503 with `Retry-After`, UNAVAILABLE.
    #[error("the image of tenant `{tenant}` is still being pulled; retry shortly")]
    ImagePulling { tenant: String, retry_after_ms: u64 },
}

impl GatewayError {
    /// Exhaustive classification: no `_ =>` arm, so a new variant is a compile error here.
    pub fn kind(&self) -> ErrorKind {
        match self {
            GatewayError::InvalidRequest(_) => ErrorKind::InvalidRequest,
            GatewayError::UnknownId(_) => ErrorKind::UnknownId,
            GatewayError::AlreadyExists(_) => ErrorKind::AlreadyExists,
            GatewayError::MethodNotFound(_) => ErrorKind::MethodNotFound,
            GatewayError::InvalidParams(_) => ErrorKind::InvalidParams,
            GatewayError::NotFound(_) => ErrorKind::NotFound,
            GatewayError::OutsideRoot(_) => ErrorKind::OutsideRoot,
            GatewayError::SessionAttached { .. } => ErrorKind::SessionAttached,
            GatewayError::Internal(_) => ErrorKind::Internal,
            GatewayError::Overloaded | GatewayError::RateLimited { .. } => ErrorKind::Overloaded,
            GatewayError::MissingScope(_) => ErrorKind::Forbidden,
            GatewayError::Unauthenticated(_) => ErrorKind::Unauthenticated,
            GatewayError::Forbidden(_) => ErrorKind::Forbidden,
            GatewayError::DeadlineExceeded => ErrorKind::DeadlineExceeded,
            GatewayError::QuotaExceeded { .. } => ErrorKind::QuotaExceeded,
            GatewayError::Draining => ErrorKind::Draining,
            GatewayError::OwnerUnavailable { .. } => ErrorKind::OwnerUnavailable,
            GatewayError::OwnerLost { .. } => ErrorKind::OwnerLost,
            GatewayError::ExecutorUnavailable { .. } => ErrorKind::ExecutorUnavailable,
            GatewayError::Executor { .. } => ErrorKind::Executor,
            GatewayError::ImagePulling { .. } => ErrorKind::ImagePulling,
        }
    }

    /// A short label for metrics.
    pub fn outcome(&self) -> &'static str {
        match self.kind() {
            ErrorKind::InvalidRequest => "invalid_request",
            ErrorKind::UnknownId => "unknown_id",
            ErrorKind::AlreadyExists => "already_exists",
            ErrorKind::MethodNotFound => "method_not_found",
            ErrorKind::InvalidParams => "invalid_params",
            ErrorKind::NotFound => "not_found",
            ErrorKind::OutsideRoot => "outside_root",
            ErrorKind::SessionAttached => "session_attached",
            ErrorKind::Internal => "internal",
            ErrorKind::Overloaded => "overloaded",
            ErrorKind::Unauthenticated => "unauthenticated",
            ErrorKind::Forbidden => "forbidden",
            ErrorKind::DeadlineExceeded => "deadline_exceeded",
            ErrorKind::QuotaExceeded => "quota_exceeded",
            ErrorKind::Draining => "draining",
            ErrorKind::OwnerUnavailable => "owner_unavailable",
            ErrorKind::OwnerLost => "owner_lost",
            ErrorKind::ExecutorUnavailable => "executor_unavailable",
            ErrorKind::Executor => "executor_error",
            ErrorKind::ImagePulling => "image_pulling",
        }
    }

    /// The JSON-RPC error object for this error: the one table.
    pub fn to_jsonrpc(&self) -> ErrorObject {
        let code = match self.kind() {
            ErrorKind::InvalidRequest | ErrorKind::UnknownId | ErrorKind::AlreadyExists => {
                code::INVALID_REQUEST
            }
            ErrorKind::MethodNotFound => code::METHOD_NOT_FOUND,
            ErrorKind::InvalidParams => code::INVALID_PARAMS,
            ErrorKind::NotFound | ErrorKind::OutsideRoot => code::NOT_FOUND,
            ErrorKind::SessionAttached => match self {
                GatewayError::SessionAttached { current: true, .. } => code::SESSION_ATTACHED,
                _ => code::INVALID_REQUEST,
            },
            ErrorKind::Internal => code::INTERNAL,
            ErrorKind::Overloaded | ErrorKind::ImagePulling => code::OVERLOADED,
            ErrorKind::Unauthenticated => code::UNAUTHENTICATED,
            ErrorKind::Forbidden => code::FORBIDDEN,
            ErrorKind::DeadlineExceeded => code::DEADLINE_EXCEEDED,
            ErrorKind::QuotaExceeded => code::QUOTA_EXCEEDED,
            // The reference client knows draining as an invalid request with a reason.
            ErrorKind::Draining => code::INVALID_REQUEST,
            ErrorKind::OwnerUnavailable => code::OWNER_UNAVAILABLE,
            // Like an unknown session (the client starts a new one), with a reason.
            ErrorKind::OwnerLost => code::INVALID_REQUEST,
            ErrorKind::ExecutorUnavailable => code::OWNER_UNAVAILABLE,
            ErrorKind::Executor => match self {
                GatewayError::Executor { code, .. } => *code,
                _ => code::INTERNAL,
            },
        };
        let data = match self {
            GatewayError::QuotaExceeded {
                quota,
                limit,
                retry_after_ms,
            } => Some(match retry_after_ms {
                Some(ms) => json!({"quota": quota, "limit": limit, "retryAfterMs": ms}),
                None => json!({"quota": quota, "limit": limit}),
            }),
            GatewayError::Draining => Some(json!({"reason": "serverShuttingDown"})),
            GatewayError::RateLimited { retry_after_ms } => {
                Some(json!({"reason": "rateLimited", "retryAfterMs": retry_after_ms}))
            }
            GatewayError::ImagePulling { retry_after_ms, .. } => {
                Some(json!({"reason": "imagePulling", "retryAfterMs": retry_after_ms}))
            }
            GatewayError::MissingScope(scope) => Some(json!({"requiredScope": scope})),
            GatewayError::OwnerUnavailable { replica, .. } => {
                Some(json!({"reason": "ownerUnavailable", "replica": replica}))
            }
            GatewayError::OwnerLost { replica, .. } => {
                Some(json!({"reason": "ownerRestarted", "replica": replica}))
            }
            GatewayError::ExecutorUnavailable { pool, executor, .. } => {
                Some(json!({"reason": "executorUnavailable", "pool": pool, "executor": executor}))
            }
            GatewayError::Executor { data, .. } => data.clone(),
            _ => None,
        };
        ErrorObject {
            code,
            message: self.to_string(),
            data,
        }
    }

    /// The gRPC status for this error: the same table's other column.
    pub fn to_grpc(&self) -> tonic::Status {
        use tonic::Code;
        let code = match self.kind() {
            ErrorKind::InvalidRequest | ErrorKind::InvalidParams => Code::InvalidArgument,
            ErrorKind::UnknownId | ErrorKind::NotFound | ErrorKind::OutsideRoot => Code::NotFound,
            ErrorKind::SessionAttached => Code::FailedPrecondition,
            ErrorKind::AlreadyExists => Code::AlreadyExists,
            ErrorKind::MethodNotFound => Code::Unimplemented,
            ErrorKind::Internal => Code::Internal,
            // Transient: retry (elsewhere); the data says when for rate limits.
            ErrorKind::Overloaded
            | ErrorKind::Draining
            | ErrorKind::OwnerUnavailable
            | ErrorKind::ImagePulling => Code::Unavailable,
            ErrorKind::OwnerLost => Code::NotFound,
            ErrorKind::ExecutorUnavailable => Code::Unavailable,
            ErrorKind::Executor => match self {
                GatewayError::Executor { code, message, .. } => executor_grpc_code(*code, message),
                _ => Code::Unknown,
            },
            ErrorKind::Unauthenticated => Code::Unauthenticated,
            ErrorKind::Forbidden => Code::PermissionDenied,
            ErrorKind::DeadlineExceeded => Code::DeadlineExceeded,
            ErrorKind::QuotaExceeded => Code::ResourceExhausted,
        };
        // Both go in headers, which clients cap (8 KiB by default in
        // grpc-go and grpcio): an executor's long text is cut.
        let message = crate::protocol::truncate_text(self.to_string(), MAX_GRPC_ERROR_TEXT);
        let mut status = tonic::Status::new(code, message);
        if let Some(data) = self.to_jsonrpc().data
            && let data = data.to_string()
            && data.len() <= MAX_GRPC_ERROR_TEXT
            && let Ok(v) = tonic::metadata::MetadataValue::try_from(data)
        {
            // Machine-readable details (quota, limit, retryAfterMs) as JSON.
            status.metadata_mut().insert("x-exec-gateway-error-data", v);
        }
        status
    }

    /// The HTTP status of a refused websocket handshake (authentication
    /// happens before the upgrade): the same table's third column.
    pub fn http_status(&self) -> u16 {
        match self.kind() {
            ErrorKind::Unauthenticated => 401,
            ErrorKind::Forbidden => 403,
            ErrorKind::Overloaded | ErrorKind::Draining | ErrorKind::ImagePulling => 503,
            ErrorKind::DeadlineExceeded => 504,
            ErrorKind::QuotaExceeded => 429,
            ErrorKind::NotFound | ErrorKind::UnknownId | ErrorKind::OutsideRoot => 404,
            ErrorKind::SessionAttached => 409,
            ErrorKind::OwnerUnavailable | ErrorKind::ExecutorUnavailable => 502,
            ErrorKind::OwnerLost => 404,
            ErrorKind::Executor => 502,
            ErrorKind::Internal => 500,
            ErrorKind::InvalidRequest
            | ErrorKind::AlreadyExists
            | ErrorKind::MethodNotFound
            | ErrorKind::InvalidParams => 400,
        }
    }
}

impl GatewayError {
    /// When to retry, where the error says (a refused handshake's
    /// `Retry-After`, in whole seconds rounded up).
    pub fn retry_after(&self) -> Option<std::time::Duration> {
        match self {
            GatewayError::RateLimited { retry_after_ms }
            | GatewayError::ImagePulling { retry_after_ms, .. }
            | GatewayError::QuotaExceeded {
                retry_after_ms: Some(retry_after_ms),
                ..
            } => Some(std::time::Duration::from_millis(*retry_after_ms)),
            _ => None,
        }
    }
}

/// The longest error message (and error data, as JSON) a gRPC status
/// carries.
pub const MAX_GRPC_ERROR_TEXT: usize = 1024;

/// The gRPC code of an executor's JSON-RPC error, as the gateway's own
/// answer of that code would have: by its code, and what is missing
/// (an unknown process, an OS error 2 in an "internal" error, as Codex
/// words a missing file on some calls) is NOT_FOUND, as a missing file of
/// the tenant's own root is.
fn executor_grpc_code(code: i64, message: &str) -> tonic::Code {
    use tonic::Code;
    match code {
        code::NOT_FOUND => Code::NotFound,
        code::METHOD_NOT_FOUND => Code::Unimplemented,
        _ if message.starts_with("unknown process") => Code::NotFound,
        _ if message.ends_with("(os error 2)") => Code::NotFound,
        code::INVALID_REQUEST | code::INVALID_PARAMS => Code::InvalidArgument,
        code::INTERNAL => Code::Internal,
        _ => Code::Unknown,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quota_carries_data() {
        let e = GatewayError::QuotaExceeded {
            quota: "processes",
            limit: 4,
            retry_after_ms: None,
        };
        let o = e.to_jsonrpc();
        assert_eq!(o.code, -32006);
        assert_eq!(o.data, Some(json!({"quota":"processes","limit":4})));
        assert_eq!(
            GatewayError::Overloaded.to_jsonrpc().message,
            "Server overloaded; retry later."
        );
    }

    #[test]
    fn an_image_still_pulling_is_retryable_on_every_door() {
        let e = GatewayError::ImagePulling {
            tenant: "a".into(),
            retry_after_ms: 1000,
        };
        assert_eq!(e.http_status(), 503);
        assert_eq!(e.retry_after(), Some(std::time::Duration::from_secs(1)));
        let o = e.to_jsonrpc();
        assert_eq!(o.code, code::OVERLOADED);
        assert_eq!(
            o.data,
            Some(json!({"reason": "imagePulling", "retryAfterMs": 1000}))
        );
        let s = e.to_grpc();
        assert_eq!(s.code(), tonic::Code::Unavailable);
        assert!(
            s.message().contains("still being pulled"),
            "{}",
            s.message()
        );
        assert!(s.metadata().get("x-exec-gateway-error-data").is_some());
    }
}
