//! MCP over streamable HTTP on the client listener (`[mcp] path`).
//!
//! rmcp's service keeps the sessions (`Mcp-Session-Id`), their SSE
//! streams and their idle expiry; this wrapper adds what a shared
//! gateway needs around it: a session is used only by the caller (tenant
//! and subject) that made it — anyone else is told it does not exist —
//! and each tenant, and the gateway, holds a bounded number of them.

use std::collections::{HashMap, HashSet};
use std::convert::Infallible;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt as _, Full};
use hyper::body::Body;
use hyper::{Request, Response, StatusCode};
use parking_lot::Mutex;
use prometheus_client::metrics::gauge::Gauge;
use rmcp::transport::streamable_http_server::session::local::{LocalSessionManager, SessionConfig};
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};

use super::{Door, McpServer};
use crate::config::McpSettings;

/// Owners' keys of sessions being made (a slot held while rmcp answers
/// the `initialize`, so concurrent ones cannot pass the bounds together).
const PENDING: &str = "\0pending-";

/// The header naming an MCP session.
pub const SESSION_HEADER: &str = "mcp-session-id";

struct Owner {
    tenant: String,
    subject: Option<String>,
}

/// A new session's slot, held while rmcp answers its `initialize`.
struct Pending<'a> {
    owners: &'a Mutex<HashMap<String, Owner>>,
    key: String,
}

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        self.owners.lock().remove(&self.key);
    }
}

/// The MCP service of one gateway.
pub struct McpHttp {
    service: StreamableHttpService<McpServer, LocalSessionManager>,
    manager: Arc<LocalSessionManager>,
    owners: Mutex<HashMap<String, Owner>>,
    settings: McpSettings,
    /// `exec_gateway_mcp_sessions`.
    open: Gauge,
}

pub type McpBody = BoxBody<Bytes, Infallible>;

fn plain(status: StatusCode, text: &str) -> Response<McpBody> {
    let mut r = Response::new(Full::new(Bytes::from(text.to_owned())).boxed());
    *r.status_mut() = status;
    r.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}

impl McpHttp {
    pub fn new(settings: &McpSettings, open: Gauge) -> McpHttp {
        let mut session = SessionConfig::default();
        session.keep_alive = Some(settings.idle_timeout);
        let mut manager = LocalSessionManager::default();
        manager.session_config = session;
        let manager = Arc::new(manager);
        // Callers authenticate with a bearer header (never a cookie), so a
        // page that rebinds a name to the gateway has no credential to
        // send: the Host allow-list, which guards servers without
        // authentication, would only refuse the gateway's own names.
        let config = StreamableHttpServerConfig::default()
            .disable_allowed_hosts()
            .with_max_request_body_bytes(settings.max_request_bytes);
        let service =
            StreamableHttpService::new(|| Ok(McpServer::new(None)), manager.clone(), config);
        McpHttp {
            service,
            manager,
            owners: Mutex::new(HashMap::new()),
            settings: settings.clone(),
            open,
        }
    }

    /// Forget owners of sessions rmcp no longer has (expired, deleted).
    async fn prune(&self) {
        let live: HashSet<String> = {
            let sessions = self.manager.sessions.read().await;
            sessions.keys().map(|k| k.to_string()).collect()
        };
        let mut owners = self.owners.lock();
        owners.retain(|id, _| id.starts_with(PENDING) || live.contains(id));
        self.count(&owners);
    }

    fn count(&self, owners: &HashMap<String, Owner>) {
        let n = owners.keys().filter(|k| !k.starts_with(PENDING)).count();
        self.open.set(i64::try_from(n).unwrap_or(i64::MAX));
    }

    /// Where the client listener serves it.
    pub fn path(&self) -> &str {
        &self.settings.path
    }

    /// Serve one request of an authenticated caller.
    pub async fn handle<B>(&self, mut req: Request<B>, door: Arc<Door>) -> Response<McpBody>
    where
        B: Body + Send + 'static,
        B::Error: std::fmt::Display,
    {
        let session = req
            .headers()
            .get(SESSION_HEADER)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        self.prune().await;
        let mut pending = None;
        match &session {
            Some(id) => {
                let mine = self
                    .owners
                    .lock()
                    .get(id)
                    .is_some_and(|o| o.tenant == door.tenant && o.subject == door.subject);
                if !mine {
                    // Another caller's session, or none: the same answer.
                    return plain(StatusCode::NOT_FOUND, "no such MCP session\n");
                }
            }
            None if req.method() == hyper::Method::POST => {
                let mut owners = self.owners.lock();
                let of_tenant = owners.values().filter(|o| o.tenant == door.tenant).count();
                if of_tenant >= self.settings.max_sessions_per_tenant
                    || owners.len() >= self.settings.max_sessions
                {
                    drop(owners);
                    let mut r = plain(
                        StatusCode::TOO_MANY_REQUESTS,
                        "too many MCP sessions open; close one (DELETE) or wait for an idle one to end\n",
                    );
                    r.headers_mut().insert(
                        hyper::header::RETRY_AFTER,
                        hyper::header::HeaderValue::from_static("5"),
                    );
                    return r;
                }
                let key = format!("{PENDING}{}", uuid::Uuid::new_v4().simple());
                owners.insert(
                    key.clone(),
                    Owner {
                        tenant: door.tenant.clone(),
                        subject: None,
                    },
                );
                pending = Some(key);
            }
            None => {}
        }
        // The slot is given back however this ends, the request's future
        // dropped by a client gone mid-`initialize` included.
        let _pending = pending.map(|key| Pending {
            owners: &self.owners,
            key,
        });
        let (tenant, subject) = (door.tenant.clone(), door.subject.clone());
        let deleting = req.method() == hyper::Method::DELETE;
        req.extensions_mut().insert(door);
        let response = self.service.handle(req).await;
        match session {
            Some(id) if deleting && response.status().is_success() => {
                let mut owners = self.owners.lock();
                owners.remove(&id);
                self.count(&owners);
            }
            Some(_) => {}
            None => {
                if let Some(id) = response
                    .headers()
                    .get(SESSION_HEADER)
                    .and_then(|v| v.to_str().ok())
                {
                    let mut owners = self.owners.lock();
                    owners.insert(id.to_owned(), Owner { tenant, subject });
                    self.count(&owners);
                }
            }
        }
        response
    }
}
