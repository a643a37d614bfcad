//! Codex's managed network for one process (`process/start` with
//! `networkProxy`; docs/isolation.md, "Asking the client"): an HTTP proxy
//! of its own in the tenant's namespace, named to the process in
//! `HTTP_PROXY` and its kin. Each request through it (`CONNECT host:port`
//! or an absolute-form HTTP request) is decided by the tenant's names;
//! one they do not list, for a tenant whose `egress_unlisted = "ask"` and
//! a process started with `policyDecisionTimeoutMs`, is asked of the
//! session's attached client with `network/policyRequest`, in the
//! reference's shapes, and denied on no answer, an error, a malformed one,
//! past the timeout (its value + 5 s) or past 256 waiting.
//!
//! Connections the process makes around the proxy meet the tenant's
//! transparent proxy as any other (its names only).

use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;

use super::{Decision, Shared, Via};
use crate::outbound::{Attachment, ClientAnswer};

/// The reference's margin over `policyDecisionTimeoutMs`.
pub const DECISION_MARGIN: Duration = Duration::from_secs(5);
/// Hosts a session remembers a decision for (`"scope": "session"`).
pub const MAX_REMEMBERED: usize = 1024;
/// The user name in a process's proxy URL (its password is its token).
const PROXY_USER: &str = "exg";
/// A request head read at most.
const MAX_HEAD_BYTES: usize = 16 << 10;
/// How long a client may take to send its request head.
const HEAD_TIMEOUT: Duration = Duration::from_secs(10);
/// Connections through one process's proxy at once.
pub const MAX_CONNECTIONS_PER_PROXY: usize = 64;

/// What the client decided for one host, remembered for its session.
pub type Remembered = Arc<parking_lot::Mutex<HashMap<(String, u16), bool>>>;

/// One process's proxy; it stops when dropped.
#[derive(Debug)]
pub struct ProcessProxy {
    pub port: u16,
    task: tokio::task::AbortHandle,
}

impl Drop for ProcessProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Who asks, and how long the answer may take.
#[derive(Clone)]
pub struct Asker {
    pub session: String,
    pub process_id: String,
    /// What the process's proxy URL carries: a request without it is
    /// another process's, refused (407).
    pub token: String,
    pub attachment: Arc<Attachment>,
    /// `policyDecisionTimeoutMs`; `None`: never asked.
    pub timeout: Option<Duration>,
    pub remembered: Remembered,
}

/// The environment that points a process at its proxy (the reference's
/// names).
pub fn proxy_env(port: u16, token: &str) -> Vec<(String, String)> {
    let url = format!("http://{PROXY_USER}:{token}@127.0.0.1:{port}");
    let mut env: Vec<(String, String)> = [
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "ALL_PROXY",
        "http_proxy",
        "https_proxy",
        "all_proxy",
        "npm_config_proxy",
        "npm_config_https_proxy",
        "PIP_PROXY",
    ]
    .iter()
    .map(|k| ((*k).to_owned(), url.clone()))
    .collect();
    for k in ["NO_PROXY", "no_proxy"] {
        env.push((k.to_owned(), "localhost,127.0.0.1,::1".to_owned()));
    }
    env.push(("CODEX_NETWORK_PROXY_ACTIVE".to_owned(), "1".to_owned()));
    env
}

impl super::TenantEgress {
    /// Start a proxy for one process.
    pub async fn process_proxy(&self, asker: Asker) -> std::io::Result<ProcessProxy> {
        let listener = self.shared.sockets.listener(0).await?;
        let port = listener.local_addr()?.port();
        let shared = self.shared.clone();
        let task = crate::task::start("egress-process-proxy", serve(listener, shared, asker));
        Ok(ProcessProxy {
            port,
            task: task.abort_handle(),
        })
    }
}

async fn serve(listener: tokio::net::TcpListener, shared: Arc<Shared>, asker: Asker) {
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS_PER_PROXY));
    loop {
        let Ok((conn, peer)) = listener.accept().await else {
            continue;
        };
        let Ok(permit) = slots.clone().try_acquire_owned() else {
            drop(conn);
            continue;
        };
        let (shared, asker) = (shared.clone(), asker.clone());
        crate::task::start("egress-process-proxy-connection", async move {
            handle(conn, peer, &shared, &asker).await;
            drop(permit);
        });
    }
}

/// What one request through the proxy asks for.
struct Target {
    /// `http` or `https_connect`, as the reference names them.
    protocol: &'static str,
    method: String,
    host: String,
    port: u16,
    /// An absolute-form request's head, rewritten to origin form.
    forward: Option<Vec<u8>>,
}

async fn handle(mut conn: TcpStream, peer: SocketAddr, shared: &Shared, asker: &Asker) {
    let mut buf = Vec::new();
    let Some(target) = read_head(&mut conn, &mut buf, &asker.token).await else {
        let _ = conn
            .write_all(
                b"HTTP/1.1 400 Bad Request\r\nConnection: close\r\nContent-Length: 0\r\n\r\n",
            )
            .await;
        return;
    };
    let (allowed, source, reason) = decide(shared, asker, &target).await;
    notify_decision(asker, &target, peer, allowed, source, &reason);
    let names = shared.names();
    let rule = names
        .rule_for(&target.host, Some(target.port))
        .map(ToString::to_string)
        .unwrap_or_else(|| format!("asked: {source}"));
    let ctx = Some((asker.session.as_str(), asker.process_id.as_str()));
    if allowed.is_none() {
        let mut d = Decision::denied(Some(&target.host), None, target.port, Via::Proxy, &reason);
        d.process = ctx;
        shared.decide(&d);
        let decision = if reason == "ask" { "ask" } else { "deny" };
        let body = json!({
            "status": "blocked", "host": target.host, "reason": reason, "decision": decision,
            "source": source, "protocol": target.protocol, "port": target.port,
            "message": "Request blocked by network policy.",
        })
        .to_string();
        let head = format!(
            "HTTP/1.1 403 Forbidden\r\nx-proxy-error: blocked-by-policy\r\nContent-Type: application/json\r\nConnection: close\r\nContent-Length: {}\r\n\r\n",
            body.len()
        );
        let _ = conn.write_all(head.as_bytes()).await;
        let _ = conn.write_all(body.as_bytes()).await;
        return;
    }
    let up = match connect(shared, &target.host, target.port).await {
        Ok((up, addr)) => {
            let mut d = Decision::allowed(&target.host, addr, target.port, Via::Proxy, &rule);
            d.process = ctx;
            shared.decide(&d);
            up
        }
        Err(e) => {
            let why = format!("connect: {e}");
            let mut d = Decision::denied(Some(&target.host), None, target.port, Via::Proxy, &why);
            d.process = ctx;
            shared.decide(&d);
            let _ = conn
                .write_all(
                    b"HTTP/1.1 502 Bad Gateway\r\nConnection: close\r\nContent-Length: 0\r\n\r\n",
                )
                .await;
            return;
        }
    };
    let mut up = up;
    let started = match &target.forward {
        None => conn
            .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
            .await
            .is_ok(),
        Some(head) => up.write_all(head).await.is_ok(),
    };
    if !started {
        return;
    }
    let live = shared.live.open(&target.host, target.port);
    // A tunnel to a host a substituting secret is bound to is intercepted
    // as the transparent path's connections are.
    if target.forward.is_none()
        && let Some(sub) = &shared.substitution
        && sub.intercepts(&target.host, target.port)
        && speaks_tls(&conn, &up).await
    {
        super::substitute::intercept::serve(
            conn,
            Vec::new(),
            up,
            &target.host,
            target.port,
            sub,
            shared,
            live,
        )
        .await;
        return;
    }
    tokio::select! {
        _ = tokio::io::copy_bidirectional(&mut conn, &mut up) => {}
        () = live.closed() => {}
    }
}

/// How long a tunnel to an intercepted host waits for either end's first
/// byte before it is joined as it is.
const FIRST_BYTES_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// Whether a tunnel's client opens with a TLS handshake (its first byte
/// a handshake record), read without taking it; a server that speaks
/// first (SSH) or a client that sends something else is not TLS.
async fn speaks_tls(conn: &TcpStream, up: &TcpStream) -> bool {
    let mut first = [0u8; 1];
    tokio::select! {
        r = conn.peek(&mut first) => matches!(r, Ok(1)) && first[0] == 0x16,
        _ = up.readable() => false,
        () = tokio::time::sleep(FIRST_BYTES_TIMEOUT) => false,
    }
}

/// Allowed (`Some(())`) or not, with the reference's `source` and
/// `reason`.
async fn decide(shared: &Shared, asker: &Asker, t: &Target) -> (Option<()>, &'static str, String) {
    if shared.names().allows(&t.host, Some(t.port)) {
        return (Some(()), "baseline_policy", "allow".to_owned());
    }
    let key = (t.host.clone(), t.port);
    if let Some(allowed) = asker.remembered.lock().get(&key).copied() {
        return match allowed {
            true => (Some(()), "decider", "not_allowed".to_owned()),
            false => (None, "decider", "not_allowed".to_owned()),
        };
    }
    let (Some(timeout), true) = (
        asker.timeout,
        shared.ask.load(std::sync::atomic::Ordering::Acquire),
    ) else {
        return (None, "baseline_policy", "not_allowed".to_owned());
    };
    let valid_host = !t.host.is_empty()
        && t.host.len() <= 253
        && !t.host.chars().any(|c| c.is_control() || c.is_whitespace());
    if !valid_host {
        return (None, "decider", "not_allowed".to_owned());
    }
    let params = json!({
        "processId": asker.process_id,
        "request": { "protocol": t.protocol, "host": t.host, "port": t.port },
    });
    let answer = asker
        .attachment
        .request(
            crate::protocol::methods::NETWORK_POLICY_REQUEST,
            params,
            timeout + DECISION_MARGIN,
        )
        .await;
    let ClientAnswer::Result(result) = answer else {
        return (None, "decider", "not_allowed".to_owned());
    };
    match parse_decision(&result) {
        Some(("allow", _, session)) => {
            if session {
                remember(&asker.remembered, key, true);
            }
            (Some(()), "decider", "not_allowed".to_owned())
        }
        Some((kind @ ("deny" | "ask"), reason, session)) => {
            if session && kind == "deny" {
                remember(&asker.remembered, key, false);
            }
            let reason = if kind == "ask" {
                "ask".to_owned()
            } else {
                reason
            };
            (None, "decider", reason)
        }
        _ => (None, "decider", "not_allowed".to_owned()),
    }
}

fn remember(r: &Remembered, key: (String, u16), allowed: bool) {
    let mut r = r.lock();
    if r.len() < MAX_REMEMBERED || r.contains_key(&key) {
        r.insert(key, allowed);
    }
}

/// `{"decision":{"type":"allow"|"deny"|"ask","reason"?,"scope"?}}`: deny and
/// ask need a reason of at most 1,024 bytes without control characters;
/// `"scope": "session"` (the gateway's extension) remembers it.
fn parse_decision(result: &str) -> Option<(&'static str, String, bool)> {
    let v: serde_json::Value = serde_json::from_str(result).ok()?;
    let d = v.get("decision")?;
    let kind = match d.get("type")?.as_str()? {
        "allow" => "allow",
        "deny" => "deny",
        "ask" => "ask",
        _ => return None,
    };
    let session = d.get("scope").and_then(|s| s.as_str()) == Some("session");
    // A reason, where there is one, is well formed (whatever the type:
    // a garbled allow is no allow).
    let reason = match d.get("reason") {
        None | Some(serde_json::Value::Null) if kind == "allow" => String::new(),
        None | Some(serde_json::Value::Null) => return None,
        Some(r) => r.as_str()?.to_owned(),
    };
    if reason.len() > 1024 || reason.chars().any(char::is_control) {
        return None;
    }
    Some((kind, reason, session))
}

/// `network/policyDecision`, the reference's audit notification to the
/// client (best effort).
fn notify_decision(
    asker: &Asker,
    t: &Target,
    peer: SocketAddr,
    allowed: Option<()>,
    source: &str,
    reason: &str,
) {
    let decision = match (allowed, reason) {
        (Some(()), _) => "allow",
        (None, "ask") => "ask",
        (None, _) => "deny",
    };
    let text = json!({
        "method": crate::protocol::methods::NETWORK_POLICY_DECISION,
        "params": {
            "processId": asker.process_id,
            "timestamp": humantime::format_rfc3339_millis(std::time::SystemTime::now()).to_string(),
            "scope": "domain", "decision": decision, "source": source, "reason": reason,
            "protocol": t.protocol, "host": t.host, "port": t.port,
            "method": t.method, "client": peer.to_string(),
            "policyOverride": allowed.is_some() && source == "decider",
        },
    })
    .to_string();
    let attachment = asker.attachment.clone();
    crate::task::start("egress-policy-decision", async move {
        attachment.notify(text).await;
    });
}

/// Read a proxy request's head: `CONNECT host:port` or an absolute-form
/// `http://` request.
async fn read_head(conn: &mut TcpStream, buf: &mut Vec<u8>, token: &str) -> Option<Target> {
    let deadline = tokio::time::Instant::now() + HEAD_TIMEOUT;
    let mut chunk = [0u8; 4096];
    let head_len = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        if buf.len() >= MAX_HEAD_BYTES {
            return None;
        }
        let n = tokio::time::timeout_at(deadline, conn.read(&mut chunk))
            .await
            .ok()?
            .ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let mut headers = [httparse::EMPTY_HEADER; 64];
    let mut req = httparse::Request::new(&mut headers);
    let httparse::Status::Complete(_) = req.parse(&buf[..head_len]).ok()? else {
        return None;
    };
    use base64::Engine as _;
    let want = format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(format!("{PROXY_USER}:{token}"))
    );
    let authorized = req
        .headers
        .iter()
        .any(|h| h.name.eq_ignore_ascii_case("proxy-authorization") && h.value == want.as_bytes());
    if !authorized {
        let _ = conn
            .write_all(b"HTTP/1.1 407 Proxy Authentication Required\r\nProxy-Authenticate: Basic realm=\"exec-gateway\"\r\nConnection: close\r\nContent-Length: 0\r\n\r\n")
            .await;
        let _ = conn.shutdown().await;
        return None;
    }
    let method = req.method?.to_owned();
    let path = req.path?;
    if method == "CONNECT" {
        let (host, port) = split_authority(path)?;
        return Some(Target {
            protocol: "https_connect",
            method,
            host,
            port,
            forward: None,
        });
    }
    let url = url::Url::parse(path).ok()?;
    if url.scheme() != "http" {
        return None;
    }
    let host = host_of(&url)?;
    let port = url.port_or_known_default()?;
    // Origin form, and one request per connection (a next one could name
    // another host).
    let mut target = url.path().to_owned();
    if let Some(q) = url.query() {
        target.push('?');
        target.push_str(q);
    }
    let mut head = format!("{method} {target} HTTP/1.1\r\n").into_bytes();
    for h in req.headers.iter() {
        let name = h.name.to_ascii_lowercase();
        if name.starts_with("proxy-") || name == "connection" || name == "keep-alive" {
            continue;
        }
        head.extend_from_slice(h.name.as_bytes());
        head.extend_from_slice(b": ");
        head.extend_from_slice(h.value);
        head.extend_from_slice(b"\r\n");
    }
    head.extend_from_slice(b"Connection: close\r\n\r\n");
    head.extend_from_slice(&buf[head_len..]);
    Some(Target {
        protocol: "http",
        method,
        host,
        port,
        forward: Some(head),
    })
}

/// `host:port`, strictly: no user, path, query or fragment, one colon.
fn split_authority(a: &str) -> Option<(String, u16)> {
    if a.contains(['@', '/', '?', '#', '[', '\\']) || a.matches(':').count() != 1 {
        return None;
    }
    let (h, p) = a.split_once(':')?;
    if p.is_empty() || !p.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let port = p.parse().ok()?;
    let url = url::Url::parse(&format!("http://{h}/")).ok()?;
    Some((host_of(&url)?, port))
}

fn host_of(url: &url::Url) -> Option<String> {
    match url.host()? {
        url::Host::Domain(d) => crate::config::normalize_host(d),
        url::Host::Ipv4(a) => Some(a.to_string()),
        url::Host::Ipv6(_) => None,
    }
}

/// A marked connection to `host:port` (resolved by the namespace's
/// resolver past the redirection), under the namespace's address rules.
async fn connect(shared: &Shared, host: &str, port: u16) -> std::io::Result<(TcpStream, Ipv4Addr)> {
    let addrs = match host.parse::<Ipv4Addr>() {
        Ok(a) => vec![a],
        Err(_) => super::dns::lookup(&shared.sockets, true, host).await?.0,
    };
    let mut last = std::io::Error::other("no address");
    for a in addrs {
        let sock = shared.sockets.tcp_out().await?;
        match tokio::time::timeout(
            Duration::from_secs(10),
            sock.connect(SocketAddr::V4(SocketAddrV4::new(a, port))),
        )
        .await
        {
            Ok(Ok(c)) => return Ok((c, a)),
            Ok(Err(e)) => last = e,
            Err(_) => last = std::io::Error::other("timed out"),
        }
    }
    Err(last)
}
