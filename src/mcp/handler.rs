//! The MCP handler of one MCP session: the tools its caller's scopes
//! grant, run in the session's gateway session (opened at the first tool
//! call, ended with the MCP session).

use std::borrow::Cow;
use std::sync::{Arc, OnceLock};

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, Implementation,
    InitializeRequestParams, InitializeResult, ListToolsResult, PaginatedRequestParams,
    ProtocolVersion, ServerCapabilities, ServerConfig, Tool, ToolAnnotations,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, ServerHandler};
use serde_json::Value;

use super::Door;
use super::link::Link;
use super::tools::{self, ToolError};

/// One MCP session's server.
pub struct McpServer {
    /// Set at creation (stdio) or by the request that initializes the
    /// session (HTTP: the door puts it in the request's extensions).
    door: OnceLock<Arc<Door>>,
    /// The gateway session; replaced by `fork_snapshot`.
    link: tokio::sync::Mutex<Option<Arc<Link>>>,
}

impl McpServer {
    pub fn new(door: Option<Arc<Door>>) -> McpServer {
        let cell = OnceLock::new();
        if let Some(d) = door {
            let _ = cell.set(d);
        }
        McpServer {
            door: cell,
            link: tokio::sync::Mutex::new(None),
        }
    }

    fn door(&self) -> Result<&Arc<Door>, ErrorData> {
        self.door
            .get()
            .ok_or_else(|| ErrorData::internal_error("MCP session has no caller", None))
    }

    /// The gateway session, opened now (as the caller of this request,
    /// `door`) if there is none or it ended (its token expired).
    async fn link(&self, door: &Door) -> Result<Arc<Link>, ToolError> {
        let mut slot = self.link.lock().await;
        if let Some(l) = slot.as_ref().filter(|l| l.is_open()) {
            return Ok(l.clone());
        }
        let link = Arc::new(Link::open((door.open)(), None).await?);
        *slot = Some(link.clone());
        Ok(link)
    }

    async fn fork(&self, door: &Door, snapshot: &str) -> Result<Value, ToolError> {
        let mut slot = self.link.lock().await;
        // The fork opens first: a refusal leaves the session as it was.
        let link = Arc::new(Link::open((door.open)(), Some(snapshot)).await?);
        let previous = slot.replace(link.clone());
        drop(previous);
        Ok(
            serde_json::json!({"snapshot_id": snapshot, "session_id": link.session_id, "cwd": link.cwd}),
        )
    }
}

/// The door an HTTP request came through (its caller, authenticated).
fn request_door(context: &RequestContext<RoleServer>) -> Option<Arc<Door>> {
    context
        .extensions
        .get::<hyper::http::request::Parts>()
        .and_then(|p| p.extensions.get::<Arc<Door>>())
        .cloned()
}

fn tool(spec: &tools::Spec) -> Tool {
    let input = match (spec.input)() {
        Value::Object(m) => m,
        _ => Default::default(),
    };
    let mut annotations = ToolAnnotations::new();
    annotations.read_only_hint = Some(spec.read_only);
    annotations.destructive_hint = Some(spec.destructive);
    annotations.open_world_hint = Some(false);
    Tool::new(spec.name, spec.description, Arc::new(input)).with_annotations(annotations)
}

fn result(v: Result<Value, ToolError>) -> CallToolResult {
    match v {
        Ok(v) => {
            let text = serde_json::to_string_pretty(&v).unwrap_or_default();
            let mut r = CallToolResult::success(vec![ContentBlock::text(text)]);
            r.structured_content = Some(v);
            r
        }
        Err(ToolError(msg)) => CallToolResult::error(vec![ContentBlock::text(msg)]),
    }
}

impl ServerHandler for McpServer {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new(
                "exec-gateway",
                env!("CARGO_PKG_VERSION"),
            ))
            .with_instructions(
                "Tools that run commands and work on files in a sandbox of the exec-gateway: \
run_command for a command to completion, process_* for long-running ones, read_file, write_file, \
list_directory and search_files for files. Relative paths are under the sandbox's root.",
            )
    }

    /// Sessions are this server's point (one sandbox session per MCP
    /// session), so it speaks the revisions with a handshake: up to
    /// 2025-11-25 (docs/mcp.md).
    fn supported_protocol_versions(&self) -> Cow<'static, [ProtocolVersion]> {
        Cow::Borrowed(ProtocolVersion::known_up_to(
            &ProtocolVersion::LATEST_WITH_INITIALIZE,
        ))
    }

    async fn initialize(
        &self,
        request: InitializeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<InitializeResult, ErrorData> {
        if self.door.get().is_none() {
            let door = request_door(&context)
                .ok_or_else(|| ErrorData::internal_error("MCP session has no caller", None))?;
            let _ = self.door.set(door);
        }
        context.peer.set_peer_info(request.clone());
        self.negotiate_initialize(&request)
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let scopes = match request_door(&context) {
            Some(d) => d.scopes,
            None => self.door()?.scopes,
        };
        Ok(ListToolsResult::with_all_items(
            tools::TOOLS
                .iter()
                .filter(|t| scopes.grants(t.scope))
                .map(tool)
                .collect(),
        ))
    }

    fn get_tool(&self, name: &str) -> Option<Tool> {
        let scopes = self.door.get()?.scopes;
        tools::spec(name)
            .filter(|t| scopes.grants(t.scope))
            .map(tool)
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        // This request's caller (HTTP: each request is authenticated, and
        // `McpHttp` let only the session's own tenant and subject in), else
        // the session's.
        let door = match request_door(&context) {
            Some(d) => d,
            None => self.door()?.clone(),
        };
        let scopes = door.scopes;
        let Some(spec) = tools::spec(&request.name) else {
            return Err(ErrorData::invalid_params(
                format!("unknown tool `{}`", request.name),
                None,
            ));
        };
        if !scopes.grants(spec.scope) {
            return Ok(CallToolResponse::Complete(result(Err(ToolError(format!(
                "tool `{}` needs the `{}` scope, which this token lacks",
                spec.name,
                spec.scope.name()
            ))))));
        }
        let args = Value::Object(request.arguments.unwrap_or_default());
        let out = if spec.name == "fork_snapshot" {
            match tools::fork_target(args) {
                Ok(id) => self.fork(&door, &id).await,
                Err(e) => Err(e),
            }
        } else {
            match self.link(&door).await {
                Ok(link) => tools::call(&link, spec.name, args).await,
                Err(e) => Err(e),
            }
        };
        Ok(CallToolResponse::Complete(result(out)))
    }
}
