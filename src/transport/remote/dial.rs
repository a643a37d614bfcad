//! This binary as a remote executor (`exec-gateway executor --remote URL
//! --executor-id ID`): it registers with a registry (an exec-gateway, or
//! anything speaking seed 001's flow), dials the rendezvous websocket it is
//! given, and serves the exec-server protocol there as the server, for its
//! own tenant on this host with every isolation layer the host allows.
//!
//! Each of `slots` links runs Codex's loop: register, connect, serve until
//! the link closes, sleep, again; the sleep starts at 1 s, doubles to 30 s
//! and falls back to 1 s after each connect. Sessions outlive their link
//! for the detach TTL, so a registry that restarts and comes back in time
//! resumes them. A registration refused with 4xx (401 and 403: a bad
//! credential) stops the executor, as Codex's does; unlike Codex's, an
//! unreachable registry, 5xx and 429 are retried, so a rolling restart of
//! the gateways does not stop executors.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;

use super::super::authenticate::executor_caller;
use crate::gateway::Gateway;
use crate::tls::ClientTls;

/// First pause between attempts; doubles up to [`BACKOFF_MAX`].
pub const BACKOFF_MIN: Duration = Duration::from_secs(1);
pub const BACKOFF_MAX: Duration = Duration::from_secs(30);
/// Time a registration request may take.
pub const REGISTER_TIMEOUT: Duration = Duration::from_secs(10);
/// Time connecting to the rendezvous may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Most links (concurrent sessions) one executor process serves.
pub const MAX_SLOTS: usize = 256;

/// What the executor registers as.
#[derive(Debug, Clone)]
pub struct ExecutorOptions {
    /// The registry's base URL (trailing `/` stripped).
    pub remote: String,
    pub executor_id: String,
    pub name: String,
    pub labels: BTreeMap<String, String>,
    /// Links held at once (sessions served at once).
    pub slots: usize,
    /// The tenant (on this host) sessions run as.
    pub tenant: String,
    /// CA bundle an `https://` registry's certificate must chain to
    /// (`--ca`). None: the public web roots.
    pub ca: Option<std::path::PathBuf>,
}

/// A registration that cannot succeed (the executor stops).
#[derive(Debug, Clone, thiserror::Error)]
#[error("{0}")]
pub struct Fatal(pub String);

enum Attempt {
    Fatal(String),
    Retry(String),
}

#[derive(Deserialize)]
struct Registered {
    url: String,
}

#[derive(Deserialize)]
struct ErrorBody {
    error: ErrorDetail,
}

#[derive(Deserialize)]
struct ErrorDetail {
    #[serde(default)]
    code: String,
    #[serde(default)]
    message: String,
}

/// The idempotency id of one run's registrations (Codex's scheme with our
/// own tag): the same within a run, new for each run.
fn idempotency_id(o: &ExecutorOptions, run: &uuid::Uuid) -> String {
    use sha2::Digest as _;
    let mut h = sha2::Sha256::new();
    h.update(o.executor_id.as_bytes());
    h.update([0]);
    h.update(o.name.as_bytes());
    h.update([0]);
    h.update(b"exec-gateway-executor-v1");
    h.update([0]);
    h.update(run.as_bytes());
    let hex: String = h.finalize().iter().map(|b| format!("{b:02x}")).collect();
    format!("exec-gateway-executor-{hex}")
}

async fn register(
    client: &reqwest::Client,
    o: &ExecutorOptions,
    token: &str,
    idempotency: &str,
) -> Result<String, Attempt> {
    let url = format!("{}/cloud/executor/{}/register", o.remote, o.executor_id);
    let body = serde_json::json!({
        "idempotency_id": idempotency,
        "executor_id": o.executor_id,
        "name": o.name,
        "labels": o.labels,
        "metadata": {},
    });
    let resp = client
        .post(&url)
        .bearer_auth(token)
        .header(reqwest::header::CONTENT_TYPE, "application/json")
        .body(body.to_string())
        .send()
        .await
        .map_err(|e| Attempt::Retry(format!("registry unreachable: {e}")))?;
    let status = resp.status();
    let text = resp.text().await.unwrap_or_default();
    if status.is_success() {
        let r: Registered = serde_json::from_str(&text)
            .map_err(|e| Attempt::Retry(format!("registry answer not understood: {e}")))?;
        if !(r.url.starts_with("ws://") || r.url.starts_with("wss://")) {
            return Err(Attempt::Fatal(
                "the registry answered a rendezvous URL that is not ws:// or wss://".to_owned(),
            ));
        }
        // Its ticket hands the link to whoever presents it first: never
        // in clear after a registration over TLS.
        if o.remote.starts_with("https://") && !r.url.starts_with("wss://") {
            return Err(Attempt::Fatal(
                "the registry was reached over https:// but answered a plaintext ws:// rendezvous URL; set executors.public_url to a wss:// URL on the registry".to_owned(),
            ));
        }
        return Ok(r.url);
    }
    let detail = match serde_json::from_str::<ErrorBody>(&text) {
        Ok(b) => format!("{}: {}", b.error.code, b.error.message),
        Err(_) => text.chars().take(4096).collect(),
    };
    let code = status.as_u16();
    if code == 401 || code == 403 {
        Err(Attempt::Fatal(format!(
            "executor registry authentication failed ({status}): {detail}"
        )))
    } else if status.is_server_error() || code == 429 || code == 408 {
        Err(Attempt::Retry(format!(
            "executor registry request failed ({status}): {detail}"
        )))
    } else {
        Err(Attempt::Fatal(format!(
            "executor registry request failed ({status}): {detail}"
        )))
    }
}

/// One link's loop, until a fatal refusal or the gateway stops.
async fn slot(
    gw: Arc<Gateway>,
    o: Arc<ExecutorOptions>,
    token: Arc<str>,
    idempotency: Arc<str>,
    tls: Arc<ClientTls>,
    index: usize,
) -> Result<(), Fatal> {
    let caller = executor_caller(&gw, &o.tenant)
        .await
        .ok_or_else(|| Fatal(format!("tenant `{}` is not configured", o.tenant)))?;
    let config = WebSocketConfig::default()
        .max_message_size(Some(gw.settings.max_message_bytes))
        .max_frame_size(Some(gw.settings.max_message_bytes));
    let mut backoff = BACKOFF_MIN;
    loop {
        let attempt = async {
            // The TLS files are looked at again for each registration
            // (a rotated CA bundle applies without a restart).
            let tls_config = tls.config();
            let client = reqwest::Client::builder()
                .timeout(REGISTER_TIMEOUT)
                .use_preconfigured_tls((*tls_config).clone())
                .build()
                .map_err(|e| Attempt::Fatal(format!("HTTP client: {e}")))?;
            let url = register(&client, &o, &token, &idempotency).await?;
            tracing::info!(executor = %o.executor_id, slot = index, "registered");
            let connect = tokio_tungstenite::connect_async_tls_with_config(
                &url,
                Some(config),
                true,
                Some(tokio_tungstenite::Connector::Rustls(tls_config)),
            );
            match tokio::time::timeout(CONNECT_TIMEOUT, connect).await {
                Ok(Ok((ws, _))) => Ok(ws),
                Ok(Err(e)) => Err(Attempt::Retry(format!("rendezvous connect failed: {e}"))),
                Err(_) => Err(Attempt::Retry("rendezvous connect timed out".to_owned())),
            }
        };
        let outcome = tokio::select! {
            a = attempt => a,
            () = gw.stopped() => return Ok(()),
        };
        match outcome {
            Ok(ws) => {
                backoff = BACKOFF_MIN;
                tracing::info!(executor = %o.executor_id, slot = index, "link up");
                let peer = std::net::SocketAddr::from(([0, 0, 0, 0], 0));
                use super::super::websocket::{TUNGSTENITE_WRITES, run};
                run(
                    ws,
                    TUNGSTENITE_WRITES,
                    gw.clone(),
                    peer,
                    caller.clone(),
                    None,
                    None,
                )
                .await;
                tracing::info!(executor = %o.executor_id, slot = index, "link closed");
            }
            Err(Attempt::Fatal(m)) => return Err(Fatal(m)),
            Err(Attempt::Retry(m)) => {
                tracing::warn!(executor = %o.executor_id, slot = index, "{m}");
            }
        }
        tokio::select! {
            () = tokio::time::sleep(backoff) => {}
            () = gw.stopped() => return Ok(()),
        }
        backoff = (backoff * 2).min(BACKOFF_MAX);
    }
}

/// Serve as an executor until a registration is refused for good (the
/// error) or the gateway stops.
pub async fn run(gw: Arc<Gateway>, o: ExecutorOptions, token: String) -> Result<(), Fatal> {
    let tls = ClientTls::load(
        &crate::tls::client::trusting(o.ca.as_deref()),
        &[crate::tls::ALPN_HTTP1],
        "executor --ca",
    )
    .map_err(|e| Fatal(format!("--ca: {e}")))?;
    let run_id = uuid::Uuid::new_v4();
    let idempotency: Arc<str> = Arc::from(idempotency_id(&o, &run_id));
    let token: Arc<str> = Arc::from(token);
    let o = Arc::new(o);
    let mut slots = tokio::task::JoinSet::new();
    for i in 0..o.slots.clamp(1, MAX_SLOTS) {
        slots.spawn(slot(
            gw.clone(),
            o.clone(),
            token.clone(),
            idempotency.clone(),
            tls.clone(),
            i,
        ));
    }
    while let Some(done) = slots.join_next().await {
        match done {
            Ok(Err(fatal)) => {
                slots.abort_all();
                return Err(fatal);
            }
            Ok(Ok(())) => {}
            Err(e) => tracing::error!(error = %e, "executor slot failed"),
        }
    }
    Ok(())
}
