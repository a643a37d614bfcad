//! The `gateway/preview/*` extension methods' types (docs/preview.md).

use serde::{Deserialize, Serialize};

/// Params of `gateway/preview/create`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CreateParams {
    /// A port on the session's own loopback, 1 to 65535.
    pub port: u16,
    /// Open to anyone who has the URL, without a credential, until
    /// `gateway/preview/revoke`. Default false: a signed URL.
    #[serde(default)]
    pub public: bool,
    /// How long a signed URL lasts (default `[preview] url_ttl`, at most
    /// `[preview] max_url_ttl`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_in_secs: Option<u64>,
}

/// Params of `gateway/preview/revoke`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PortParams {
    pub port: u16,
}

/// What `gateway/preview/create` answers.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Preview {
    pub port: u16,
    /// The URL to open: the port's host name under `[preview] base_url`,
    /// with the signed grant for a signed preview (exchanged for a cookie
    /// on first use). None without a `base_url`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// The path on the gateway's client listener (`/preview/{session}/{port}/`),
    /// for callers with a token of the `preview` scope (and anyone, when
    /// public).
    pub path: String,
    pub public: bool,
    /// When a signed URL stops working (milliseconds since the Unix
    /// epoch); none for a public one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at_ms: Option<u64>,
}

/// One port in `gateway/preview/list`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct PortState {
    pub port: u16,
    pub public: bool,
}

/// What `gateway/preview/list` answers.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ListResponse {
    /// Ports with preview state (public, or revoked once).
    pub ports: Vec<PortState>,
    /// Connections open into the session's ports through previews now.
    pub open_connections: u64,
}
