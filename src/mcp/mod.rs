//! The MCP server: the gateway's capabilities as Model Context Protocol
//! tools, for agents that take their tools over MCP (docs/mcp.md).
//!
//! Two doors make MCP sessions: `exec-gateway mcp` (stdio, one session,
//! the token from `EXEC_GATEWAY_TOKEN`, as `exec-gateway stdio`) and the
//! client listener's `[mcp] path` (streamable HTTP, each request
//! authenticated like every other call). Either hands this module a
//! [`Door`]: who the caller is and how to open an exec-server connection
//! for it. That is the one seam: each MCP session's tools run in one
//! gateway session ([`link::Link`]) which the door serves as it serves
//! its own clients, so scopes, rate and in-flight limits, quotas, audit
//! and metrics apply to a tool exactly as to the call it makes.
//!
//! - `tools.rs`: the tools, their schemas and their bounds.
//! - `handler.rs`: the MCP handler (`list_tools` by scope, `call_tool`).
//! - `link.rs`: the in-process exec-server connection.
//! - `http.rs`: the streamable HTTP service: sessions owned by their
//!   caller, bounded per tenant.
//!
//! The protocol is rmcp's (the official Rust SDK): the handshake, version
//! negotiation, JSON-RPC framing and both transports.

mod handler;
pub mod http;
mod link;
mod tools;

use std::sync::Arc;

use tokio::io::DuplexStream;

pub use handler::McpServer;

use crate::auth::Scopes;

/// Calls one MCP session has in flight on its gateway session at once;
/// more wait (the MCP client's own back-pressure).
pub const MAX_CALLS_IN_FLIGHT: usize = 16;
/// Largest exec-server message the link reads back (the gateway's answers
/// are far smaller: tools ask for at most [`tools::MAX_TOOL_BYTES`]).
pub const MAX_LINK_MESSAGE_BYTES: usize = 16 * 1024 * 1024;
/// Bytes of the in-process pipe between an MCP session and its gateway
/// session, each way.
pub const PIPE_BYTES: usize = 256 * 1024;

/// Who the MCP session's caller is, and how to reach the gateway as them.
pub struct Door {
    /// The tenant and subject (an HTTP session is only ever used by the
    /// caller that made it).
    pub tenant: String,
    pub subject: Option<String>,
    /// The token's scopes: which tools are listed and callable.
    pub scopes: Scopes,
    /// Open an exec-server connection for this caller: the door serves the
    /// returned pipe's other end.
    pub open: Box<dyn Fn() -> DuplexStream + Send + Sync>,
}

impl std::fmt::Debug for Door {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Door")
            .field("tenant", &self.tenant)
            .field("subject", &self.subject)
            .finish()
    }
}

impl Door {
    /// Whether `other` is the same caller (tenant and subject).
    pub fn same_caller(&self, other: &Door) -> bool {
        self.tenant == other.tenant && self.subject == other.subject
    }
}

/// Serve one MCP session over stdin/stdout until the client closes it.
pub async fn serve_stdio(door: Arc<Door>) -> Result<(), String> {
    use rmcp::ServiceExt as _;
    let server = McpServer::new(Some(door));
    let running = server
        .serve(rmcp::transport::stdio())
        .await
        .map_err(|e| format!("MCP handshake failed: {e}"))?;
    running
        .waiting()
        .await
        .map_err(|e| format!("MCP session failed: {e}"))?;
    Ok(())
}
