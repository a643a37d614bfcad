//! `[mcp]`: the MCP server on the client listener (docs/mcp.md).
//! Imports only `common`.

use std::time::Duration;

use serde::Deserialize;

use super::common::{ConfigError, duration, positive};

/// Default `[mcp] path`: where the client listener serves MCP's
/// streamable HTTP.
pub const DEFAULT_MCP_PATH: &str = "/mcp";
/// Default `[mcp] max_sessions_per_tenant`: MCP sessions one tenant holds
/// open at once (each is one sandbox session with its processes).
pub const DEFAULT_MAX_MCP_SESSIONS_PER_TENANT: usize = 16;
/// Default `[mcp] max_sessions`: MCP sessions of all tenants at once.
pub const DEFAULT_MAX_MCP_SESSIONS: usize = 1024;
/// Default `[mcp] idle_timeout`: an MCP session no request has used for
/// this long ends (and with it its sandbox session and processes). Above
/// the longest tool call (`run_command`'s 10 minutes): rmcp counts a
/// session with a call in flight as idle.
pub const DEFAULT_MCP_IDLE_TIMEOUT: Duration = Duration::from_secs(900);
/// Default `[mcp] max_request_bytes`: the largest MCP request body.
pub const DEFAULT_MAX_MCP_REQUEST_BYTES: usize = 4 * 1024 * 1024;

/// `[mcp]`
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct McpConfig {
    /// Serve MCP on the client listener (default true: it is one more
    /// encoding of calls the websocket door already takes, behind the
    /// same authentication and limits).
    pub enabled: Option<bool>,
    pub path: Option<String>,
    pub max_sessions_per_tenant: Option<usize>,
    pub max_sessions: Option<usize>,
    pub idle_timeout: Option<String>,
    pub max_request_bytes: Option<usize>,
}

/// Validated `[mcp]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct McpSettings {
    pub enabled: bool,
    pub path: String,
    pub max_sessions_per_tenant: usize,
    pub max_sessions: usize,
    pub idle_timeout: Duration,
    pub max_request_bytes: usize,
}

impl Default for McpSettings {
    fn default() -> Self {
        McpSettings {
            enabled: true,
            path: DEFAULT_MCP_PATH.to_owned(),
            max_sessions_per_tenant: DEFAULT_MAX_MCP_SESSIONS_PER_TENANT,
            max_sessions: DEFAULT_MAX_MCP_SESSIONS,
            idle_timeout: DEFAULT_MCP_IDLE_TIMEOUT,
            max_request_bytes: DEFAULT_MAX_MCP_REQUEST_BYTES,
        }
    }
}

/// Paths the client listener already answers (or reserves): `[mcp] path`
/// may not be one of them or under one.
const TAKEN: &[&str] = &[
    "/healthz",
    "/readyz",
    "/metrics",
    "/accounting",
    "/preview",
    "/forward",
    "/cloud",
];

impl McpConfig {
    pub fn validate(&self) -> Result<McpSettings, ConfigError> {
        let path = self
            .path
            .clone()
            .unwrap_or_else(|| DEFAULT_MCP_PATH.to_owned());
        let ok = path.len() > 1
            && path.len() <= 128
            && path.starts_with('/')
            && !path.ends_with('/')
            && path
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"/-_.".contains(&b))
            && !path.contains("//")
            && !path.split('/').any(|s| s == "." || s == "..");
        if !ok {
            return Err(ConfigError(format!(
                "[mcp] path `{path}`: expected an absolute path of letters, digits, `-`, `_`, `.` and `/`, not ending in `/`"
            )));
        }
        if let Some(t) = TAKEN
            .iter()
            .find(|t| path == **t || path.starts_with(&format!("{t}/")))
        {
            return Err(ConfigError(format!(
                "[mcp] path `{path}` is taken by the gateway's own `{t}`"
            )));
        }
        let max_request_bytes = positive(
            "[mcp] max_request_bytes",
            self.max_request_bytes,
            DEFAULT_MAX_MCP_REQUEST_BYTES,
        )?;
        if max_request_bytes > 64 * 1024 * 1024 {
            return Err(ConfigError(
                "[mcp] max_request_bytes: at most 64 MiB".to_owned(),
            ));
        }
        let idle_timeout = duration(
            "[mcp] idle_timeout",
            self.idle_timeout.as_deref(),
            DEFAULT_MCP_IDLE_TIMEOUT,
        )?;
        if idle_timeout < Duration::from_secs(1) {
            return Err(ConfigError("[mcp] idle_timeout: at least 1s".to_owned()));
        }
        Ok(McpSettings {
            enabled: self.enabled.unwrap_or(true),
            path,
            max_sessions_per_tenant: positive(
                "[mcp] max_sessions_per_tenant",
                self.max_sessions_per_tenant,
                DEFAULT_MAX_MCP_SESSIONS_PER_TENANT,
            )?,
            max_sessions: positive(
                "[mcp] max_sessions",
                self.max_sessions,
                DEFAULT_MAX_MCP_SESSIONS,
            )?,
            idle_timeout,
            max_request_bytes,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_path(p: &str) -> Result<McpSettings, ConfigError> {
        McpConfig {
            path: Some(p.to_owned()),
            ..McpConfig::default()
        }
        .validate()
    }

    #[test]
    fn paths_that_could_shadow_or_escape_are_refused() {
        assert_eq!(with_path("/mcp").unwrap().path, "/mcp");
        assert_eq!(with_path("/agents/mcp").unwrap().path, "/agents/mcp");
        for bad in [
            "mcp",
            "/",
            "/mcp/",
            "/a//b",
            "/a/../b",
            "/metrics",
            "/preview/x",
            "/forward",
            "/a b",
            "/a?b",
        ] {
            assert!(with_path(bad).is_err(), "{bad} accepted");
        }
    }

    #[test]
    fn bounds_are_checked() {
        let c = McpConfig {
            max_sessions_per_tenant: Some(0),
            ..McpConfig::default()
        };
        assert!(c.validate().is_err());
        let c = McpConfig {
            idle_timeout: Some("10ms".into()),
            ..McpConfig::default()
        };
        assert!(c.validate().is_err());
        assert_eq!(
            McpConfig::default().validate().unwrap(),
            McpSettings::default()
        );
    }
}
