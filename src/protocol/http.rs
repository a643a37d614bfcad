//! `http/request` and `http/request/bodyDelta` (docs/protocol.md, "HTTP"):
//! HTTP performed by the gateway inside the tenant's network.

use serde::{Deserialize, Serialize};

/// One request header; `valueEnvVar` names a tenant secret whose value
/// follows `value` (0.169.0; the May revision ignores it).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Header {
    pub name: String,
    pub value: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value_env_var: Option<String>,
}

/// `follow` (the default: at most 10) or `stop` (the 3xx is the answer).
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub enum RedirectPolicy {
    #[default]
    Follow,
    Stop,
}

/// Params of `http/request`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HttpRequestParams {
    pub method: String,
    pub url: String,
    #[serde(default)]
    pub headers: Vec<Header>,
    #[serde(default)]
    pub body_base64: Option<String>,
    #[serde(default)]
    pub timeout_ms: Option<u64>,
    #[serde(default)]
    pub redirect_policy: RedirectPolicy,
    pub request_id: String,
    #[serde(default)]
    pub stream_response: bool,
}

/// A response header (names lowercase, in the server's order).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct ResponseHeader {
    pub name: String,
    pub value: String,
}

/// What `http/request` answers.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Response {
    pub status: u16,
    pub headers: Vec<ResponseHeader>,
    /// The body; empty when it streams as `http/request/bodyDelta`.
    pub body_base64: String,
}

/// `http/request/bodyDelta` params.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct BodyDelta {
    pub request_id: String,
    pub seq: u64,
    pub delta_base64: String,
    pub done: bool,
    pub error: Option<String>,
}
