//! Test harness: runs the real `exec-gateway` binary on `127.0.0.1:0` and
//! talks to it with a real websocket client. Every await has a timeout whose
//! message says what was awaited.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::VecDeque;
use std::io::{BufRead as _, BufReader, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use base64::Engine as _;
use futures_util::{SinkExt as _, StreamExt as _};
use serde_json::{Value, json};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

/// Upper bound for any single event in a test, on the host.
pub const EVENT_TIMEOUT: Duration = Duration::from_secs(20);

/// [`EVENT_TIMEOUT`] times `EXEC_GATEWAY_TEST_TIME_SCALE` (default 1): the
/// VM lane (scripts/vm-test) runs under software emulation, 15-40x slower.
/// Only how long a wait may take before it fails changes, never what passes.
pub fn event_timeout() -> Duration {
    static SCALED: std::sync::OnceLock<Duration> = std::sync::OnceLock::new();
    *SCALED.get_or_init(|| {
        let scale = std::env::var("EXEC_GATEWAY_TEST_TIME_SCALE")
            .ok()
            .and_then(|s| s.parse::<u32>().ok())
            .unwrap_or(1)
            .clamp(1, 100);
        EVENT_TIMEOUT * scale
    })
}

pub fn b64(data: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(data)
}

/// A scratch directory any uid may write (mode 1777, like /tmp): tenants
/// of [`Gateway::start`] are unconfined (root `/`) but, the gateway running
/// as root, run as their own allocated uids.
pub fn scratch() -> tempfile::TempDir {
    use std::os::unix::fs::PermissionsExt as _;
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o1777))
        .expect("chmod scratch");
    dir
}

pub fn unb64(s: &str) -> Vec<u8> {
    base64::engine::general_purpose::STANDARD
        .decode(s)
        .expect("valid base64")
}

/// A running gateway process.
pub struct Gateway {
    pub child: Child,
    pub url: String,
    pub addr: String,
    /// `http://127.0.0.1:PORT` of the gRPC listener.
    pub grpc: String,
    /// `127.0.0.1:PORT` of the admin listener (`/metrics`, detailed `/readyz`).
    pub admin: String,
    /// `127.0.0.1:PORT` of the fleet's peer listener, when in a fleet.
    pub fleet: Option<String>,
    /// The HS256 secret of the config's key (tokens are minted with it).
    pub secret: Vec<u8>,
    pub dir: tempfile::TempDir,
}

/// A port for a listener a test configures before the process binds it.
/// Chosen below the kernel's ephemeral range, so the outgoing connections
/// of concurrent tests (which take ephemeral ports) cannot take it between
/// now and the bind; random, and free now.
#[allow(dead_code)]
pub fn free_port() -> u16 {
    let start = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32768);
    let (low, high) = (10_000u16, start.max(10_001));
    loop {
        let mut b = [0u8; 2];
        getrandom::fill(&mut b).expect("random");
        let port = low + u16::from_le_bytes(b) % (high - low);
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
}

/// A fresh random HS256 secret (hex, 64 bytes).
pub fn random_secret() -> Vec<u8> {
    let mut b = [0u8; 32];
    getrandom::fill(&mut b).expect("random");
    b.iter()
        .map(|x| format!("{x:02x}"))
        .collect::<String>()
        .into_bytes()
}

/// Seconds since the epoch.
pub fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// Mint an HS256 token for `tenant` with `scopes`.
pub fn mint(secret: &[u8], tenant: &str, scopes: &str) -> String {
    let claims = json!({"sub": "test", "tenant": tenant, "scope": scopes, "exp": now() + 3600});
    jsonwebtoken::encode(
        &jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256),
        &claims,
        &jsonwebtoken::EncodingKey::from_secret(secret),
    )
    .unwrap()
}

pub const ALL_SCOPES: &str = "exec fs:read fs:write";

impl Gateway {
    /// Start with two host-rooted tenants (`t1`, `t2`), an HS256 key, and
    /// `extra_toml` appended.
    pub fn start(extra_toml: &str) -> Gateway {
        Self::start_with(|dir| {
            format!(
                "[[auth.keys]]\nalgorithm = \"HS256\"\nsecret_file = \"{}/hs256.key\"\n\
                 [tenants.t1]\nroot = \"/\"\n[tenants.t2]\nroot = \"/\"\n{extra_toml}",
                dir.display()
            )
        })
    }

    /// Start with a config written by `config(dir)`; `dir/hs256.key` holds the secret.
    pub fn start_with(config: impl FnOnce(&Path) -> String) -> Gateway {
        Self::start_binary(Path::new(env!("CARGO_BIN_EXE_exec-gateway")), config)
    }

    /// [`Gateway::start_with`], running the gateway binary at `binary`.
    pub fn start_binary(binary: &Path, config: impl FnOnce(&Path) -> String) -> Gateway {
        Self::launch(binary, None, &[], config)
    }

    /// Start the binary with `secret` as its HS256 key (a fresh one if
    /// `None`) and `args` added to `serve`.
    pub fn launch(
        binary: &Path,
        secret: Option<Vec<u8>>,
        args: &[String],
        config: impl FnOnce(&Path) -> String,
    ) -> Gateway {
        let dir = tempfile::tempdir().expect("tempdir");
        let secret = secret.unwrap_or_else(random_secret);
        std::fs::write(dir.path().join("hs256.key"), &secret).expect("write key");
        let text = config(dir.path());
        let config = dir.path().join("gateway.toml");
        std::fs::write(&config, text).expect("write config");
        let mut cmd = Command::new(binary);
        cmd.arg("serve")
            .arg("--listen")
            .arg("ws://127.0.0.1:0")
            .arg("--grpc-listen")
            .arg("127.0.0.1:0")
            .arg("--admin-listen")
            .arg("127.0.0.1:0")
            .arg("--config")
            .arg(&config)
            .args(args)
            // Its own state dir (tenants' private /tmp): gateways of
            // concurrent tests must not share one.
            .env("XDG_STATE_HOME", dir.path().join("state"))
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        // A binary (or wrapper script) another test just wrote is still
        // open for writing in any child forked meanwhile, until that child
        // execs: exec fails with ETXTBSY for that moment (a test that
        // writes its own wrapper, tests/kernel.rs, met it). Tried again.
        let mut tries = 0;
        let mut child = loop {
            match cmd.spawn() {
                Err(e) if e.kind() == std::io::ErrorKind::ExecutableFileBusy && tries < 100 => {
                    tries += 1;
                    std::thread::sleep(Duration::from_millis(10));
                }
                other => break other.expect("spawn gateway"),
            }
        };
        let stdout = child.stdout.take().expect("stdout");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut r = BufReader::new(stdout);
            let (mut ws, mut grpc, mut admin) = (String::new(), String::new(), String::new());
            let _ = r.read_line(&mut ws);
            let _ = r.read_line(&mut grpc);
            let _ = r.read_line(&mut admin);
            let mut fleet = None;
            if admin.starts_with("fleet ") {
                fleet = Some(
                    admin
                        .trim()
                        .replace("fleet https://", "")
                        .replace("fleet http://", ""),
                );
                admin.clear();
                let _ = r.read_line(&mut admin);
            }
            let _ = tx.send((ws, grpc, admin, fleet));
        });
        let (line, grpc_line, admin_line, fleet) = rx
            .recv_timeout(event_timeout())
            .expect("gateway printed its URLs");
        // `wss://` and `grpcs://` when the gateway serves TLS.
        let url = line.trim().to_owned();
        let addr = url
            .strip_prefix("ws://")
            .or_else(|| url.strip_prefix("wss://"))
            .unwrap_or_default()
            .to_owned();
        assert!(addr.starts_with("127.0.0.1:"), "first line: {url:?}");
        let grpc = grpc_line
            .trim()
            .replace("grpcs://", "https://")
            .replace("grpc://", "http://");
        assert!(
            grpc.starts_with("http://127.0.0.1:") || grpc.starts_with("https://127.0.0.1:"),
            "second line: {grpc_line:?}"
        );
        let admin = admin_line
            .trim()
            .replace("admin https://", "")
            .replace("admin http://", "");
        assert!(
            admin.starts_with("127.0.0.1:"),
            "third line: {admin_line:?}"
        );
        Gateway {
            child,
            url,
            addr,
            grpc,
            admin,
            fleet,
            secret,
            dir,
        }
    }

    pub fn token(&self, tenant: &str) -> String {
        mint(&self.secret, tenant, ALL_SCOPES)
    }

    /// A client of tenant `t1`.
    pub async fn connect(&self) -> Client {
        Client::connect(&self.url, &self.token("t1")).await
    }

    pub async fn connect_as(&self, token: &str) -> Client {
        Client::connect(&self.url, token).await
    }

    /// An initialized session of `tenant` with all scopes.
    pub async fn session_of(&self, tenant: &str) -> (Client, String) {
        let mut c = self.connect_as(&self.token(tenant)).await;
        let sid = c.initialize().await;
        (c, sid)
    }

    /// The HTTP status and body of a websocket handshake with these headers
    /// (no upgrade happens on failure).
    pub async fn handshake(&self, path: &str, authorization: Option<&str>) -> (u16, String) {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let mut s = TcpStream::connect(&self.addr).await.expect("connect");
        let auth = authorization
            .map(|a| format!("Authorization: {a}\r\n"))
            .unwrap_or_default();
        let req = format!(
            "GET {path} HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
             Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n{auth}\r\n"
        );
        s.write_all(req.as_bytes()).await.expect("write");
        let mut buf = vec![0u8; 4096];
        let n = tokio::time::timeout(event_timeout(), s.read(&mut buf))
            .await
            .expect("handshake timeout")
            .expect("read");
        let text = String::from_utf8_lossy(&buf[..n]).into_owned();
        let status = text
            .split_whitespace()
            .nth(1)
            .and_then(|v| v.parse().ok())
            .expect("status");
        let body = text.split("\r\n\r\n").nth(1).unwrap_or("").to_owned();
        (status, body)
    }

    /// [`Gateway::handshake`], asked again while the answer is a 503 saying
    /// the tenant's image is still being pulled (a slow machine's pull can
    /// outlast the handshake), until the event timeout.
    pub async fn handshake_pulled(&self, path: &str, authorization: Option<&str>) -> (u16, String) {
        let deadline = tokio::time::Instant::now() + event_timeout();
        loop {
            let (status, body) = self.handshake(path, authorization).await;
            if status != 503
                || !body.contains("still being pulled")
                || tokio::time::Instant::now() >= deadline
            {
                return (status, body);
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }

    /// A connected, initialized client.
    pub async fn session(&self) -> (Client, String) {
        let mut c = self.connect().await;
        let sid = c.initialize().await;
        (c, sid)
    }

    pub fn signal(&self, sig: i32) {
        let pid = self.child.id() as i32;
        // SAFETY-free: use the kill command to avoid unsafe in tests.
        let status = Command::new("kill")
            .arg(format!("-{sig}"))
            .arg(pid.to_string())
            .status()
            .expect("kill");
        assert!(status.success());
    }

    /// Wait for exit, up to the timeout.
    pub fn wait_exit(&mut self) -> std::process::ExitStatus {
        let deadline = std::time::Instant::now() + event_timeout();
        loop {
            if let Some(s) = self.child.try_wait().expect("try_wait") {
                return s;
            }
            assert!(std::time::Instant::now() < deadline, "gateway did not exit");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// GET `path` on the client port (websocket listener).
    pub async fn http_get(&self, path: &str) -> (u16, String) {
        http_get_at(&self.addr, path, None).await
    }

    /// GET `path` on the admin listener.
    /// The value of metric `name` with exactly `labels`, if exported.
    /// Configuration reloads so far with this outcome (`ok`, `refused`).
    pub async fn reloads(&self, outcome: &str) -> f64 {
        self.metric(
            "exec_gateway_config_reloads_total",
            &format!("outcome=\"{outcome}\""),
        )
        .await
        .unwrap_or(0.0)
    }

    pub async fn metric(&self, name: &str, labels: &str) -> Option<f64> {
        let (_, body) = self.admin_get("/metrics").await;
        metric(&body, name, labels)
    }

    pub async fn admin_get(&self, path: &str) -> (u16, String) {
        http_get_at(&self.admin, path, None).await
    }
}

/// GET `path` from `addr` (with `authorization`, if given): status and body.
pub async fn http_get_at(addr: &str, path: &str, authorization: Option<&str>) -> (u16, String) {
    {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let auth = authorization
            .map(|a| format!("Authorization: {a}\r\n"))
            .unwrap_or_default();
        let mut s = tokio::time::timeout(event_timeout(), TcpStream::connect(addr))
            .await
            .expect("connect timeout")
            .expect("connect");
        let req = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n{auth}\r\n");
        s.write_all(req.as_bytes()).await.expect("write");
        let mut buf = Vec::new();
        tokio::time::timeout(event_timeout(), s.read_to_end(&mut buf))
            .await
            .expect("http response timeout")
            .expect("read");
        let text = String::from_utf8_lossy(&buf).into_owned();
        let status: u16 = text
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .expect("status line");
        let body = text.split("\r\n\r\n").nth(1).unwrap_or("").to_owned();
        (status, body)
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        // Killed, it leaves its image views mounted (the next gateway on
        // the store would unmount them): gone with its directory instead.
        let mut under = oci::Unmounts::default();
        under.watch(self.dir.path());
    }
}

/// A websocket JSON-RPC client that keeps notifications and responses apart.
pub struct Client {
    pub ws: WebSocketStream<MaybeTlsStream<TcpStream>>,
    next_id: i64,
    /// Messages read while looking for something else.
    pub pending: VecDeque<Value>,
}

impl Client {
    /// A `wss://` connection trusting what `tls` trusts; the handshake's
    /// error when it fails.
    pub async fn connect_tls(
        url: &str,
        token: &str,
        tls: std::sync::Arc<rustls::ClientConfig>,
    ) -> Result<Client, tokio_tungstenite::tungstenite::Error> {
        use tokio_tungstenite::tungstenite::client::IntoClientRequest as _;
        let mut req = url.into_client_request().expect("request");
        req.headers_mut().insert(
            "authorization",
            format!("Bearer {token}").parse().expect("header"),
        );
        let connector = tokio_tungstenite::Connector::Rustls(tls);
        let (ws, _) = tokio::time::timeout(
            event_timeout(),
            tokio_tungstenite::connect_async_tls_with_config(req, None, false, Some(connector)),
        )
        .await
        .expect("websocket connect timeout")?;
        Ok(Client::from_ws(ws))
    }

    /// Connects as `token`. A handshake refused with 503 because the
    /// tenant's image is still being pulled is retried after its
    /// Retry-After, as a client honouring it would (a slow machine can take
    /// longer than the handshake to pull), until the event timeout.
    pub async fn connect(url: &str, token: &str) -> Client {
        use tokio_tungstenite::tungstenite::Error as WsError;
        use tokio_tungstenite::tungstenite::client::IntoClientRequest as _;
        let deadline = tokio::time::Instant::now() + event_timeout();
        let ws = loop {
            let mut req = url.into_client_request().expect("request");
            req.headers_mut().insert(
                "authorization",
                format!("Bearer {token}").parse().expect("header"),
            );
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            match tokio::time::timeout(left, tokio_tungstenite::connect_async(req))
                .await
                .expect("websocket connect timeout")
            {
                Ok((ws, _)) => break ws,
                Err(WsError::Http(resp))
                    if resp.status() == 503
                        && resp.body().as_deref().is_some_and(|b| {
                            String::from_utf8_lossy(b).contains("still being pulled")
                        }) =>
                {
                    let after = resp
                        .headers()
                        .get("retry-after")
                        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok())
                        .unwrap_or(1);
                    tokio::time::sleep(Duration::from_secs(after)).await;
                }
                Err(e) => panic!("websocket connect: {e:?}"),
            }
        };
        Client {
            ws,
            next_id: 1,
            pending: VecDeque::new(),
        }
    }

    /// A client over an already connected websocket.
    pub fn from_ws(ws: WebSocketStream<MaybeTlsStream<TcpStream>>) -> Client {
        Client {
            ws,
            next_id: 1,
            pending: VecDeque::new(),
        }
    }

    pub async fn send_raw(&mut self, text: &str) {
        tokio::time::timeout(
            event_timeout(),
            self.ws.send(Message::text(text.to_owned())),
        )
        .await
        .expect("send timeout")
        .expect("send");
    }

    pub async fn send(&mut self, v: &Value) {
        self.send_raw(&v.to_string()).await;
    }

    /// Next message from the socket (not from `pending`); None on close.
    pub async fn recv_raw(&mut self) -> Option<Value> {
        loop {
            let msg = tokio::time::timeout(event_timeout(), self.ws.next())
                .await
                .expect("timed out waiting for a message")?;
            match msg {
                Ok(Message::Text(t)) => {
                    return Some(serde_json::from_str(t.as_str()).expect("server sent JSON"));
                }
                Ok(Message::Close(_)) | Err(_) => return None,
                Ok(_) => continue,
            }
        }
    }

    /// The next message matching `pred`, keeping the others for later.
    pub async fn wait_for(&mut self, what: &str, pred: impl Fn(&Value) -> bool) -> Value {
        if let Some(i) = self.pending.iter().position(&pred) {
            return self.pending.remove(i).expect("index valid");
        }
        loop {
            let v = self
                .recv_raw()
                .await
                .unwrap_or_else(|| panic!("connection closed while waiting for {what}"));
            if pred(&v) {
                return v;
            }
            self.pending.push_back(v);
        }
    }

    /// Send a request and return its id.
    pub async fn request_id(&mut self, method: &str, params: Value) -> i64 {
        let id = self.next_id;
        self.next_id += 1;
        self.send(&json!({"id": id, "method": method, "params": params}))
            .await;
        id
    }

    /// The whole response object (result or error) for `id`.
    pub async fn response(&mut self, id: i64) -> Value {
        self.wait_for(&format!("response {id}"), |v| {
            v.get("id") == Some(&json!(id))
                && (v.get("result").is_some() || v.get("error").is_some())
        })
        .await
    }

    /// Call and return the full response object.
    pub async fn call_raw(&mut self, method: &str, params: Value) -> Value {
        let id = self.request_id(method, params).await;
        self.response(id).await
    }

    /// Call and expect a result.
    pub async fn call(&mut self, method: &str, params: Value) -> Value {
        let r = self.call_raw(method, params).await;
        match r.get("result") {
            Some(v) => v.clone(),
            None => panic!("{method} failed: {r}"),
        }
    }

    /// Call and expect an error; returns (code, message).
    pub async fn call_err(&mut self, method: &str, params: Value) -> (i64, String) {
        let r = self.call_raw(method, params).await;
        let e = r
            .get("error")
            .unwrap_or_else(|| panic!("{method} unexpectedly succeeded: {r}"));
        (
            e["code"].as_i64().expect("code"),
            e["message"].as_str().expect("message").to_owned(),
        )
    }

    /// Resume session `sid` on this connection (retrying while the one
    /// that held it is still going away), then send `initialized`; the
    /// `initialize` result.
    pub async fn resume(&mut self, sid: &str) -> Value {
        let deadline = tokio::time::Instant::now() + event_timeout();
        loop {
            let r = self
                .call_raw(
                    "initialize",
                    json!({"clientName": "t", "resumeSessionId": sid}),
                )
                .await;
            if let Some(result) = r.get("result") {
                let result = result.clone();
                self.send(&json!({"method": "initialized"})).await;
                return result;
            }
            let message = r["error"]["message"].as_str().unwrap_or_default();
            assert!(message.contains("already attached"), "resume refused: {r}");
            assert!(tokio::time::Instant::now() < deadline, "never resumed: {r}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    pub async fn initialize(&mut self) -> String {
        let r = self.call("initialize", json!({"clientName": "test"})).await;
        self.send(&json!({"method": "initialized"})).await;
        r["sessionId"].as_str().expect("sessionId").to_owned()
    }

    /// Read stderr notifications until their text holds `needle`.
    pub async fn stderr_until(&mut self, needle: &str) -> String {
        let mut stderr = String::new();
        while !stderr.contains(needle) {
            let v = self
                .wait_for(needle, |v| {
                    v["method"] == "process/output" && v["params"]["stream"] == "stderr"
                })
                .await;
            stderr.push_str(&String::from_utf8_lossy(&unb64(
                v["params"]["chunk"].as_str().expect("chunk"),
            )));
        }
        stderr
    }

    /// Start a pipe process with PATH set.
    pub async fn start(&mut self, id: &str, argv: &[&str]) -> Value {
        self.call(
            "process/start",
            json!({"processId": id, "argv": argv, "cwd": "/tmp",
                   "env": {"PATH": "/usr/bin:/bin"}, "tty": false}),
        )
        .await
    }

    /// The first line process `id` writes (on any stream).
    pub async fn first_line(&mut self, id: &str) -> String {
        let mut text = String::new();
        while !text.contains('\n') {
            let v = self
                .wait_for("a line of output", |v| {
                    v["method"] == "process/output" && v["params"]["processId"] == id
                })
                .await;
            text.push_str(&String::from_utf8_lossy(&unb64(
                v["params"]["chunk"].as_str().expect("chunk"),
            )));
        }
        text.lines().next().unwrap_or_default().to_owned()
    }

    /// Collect notifications of process `id` until `process/closed`; returns
    /// (stdout+pty bytes, stderr bytes, exit code, seqs in arrival order).
    pub async fn collect(&mut self, id: &str) -> Collected {
        let mut c = Collected::default();
        loop {
            let v = self
                .wait_for(&format!("events of {id}"), |v| {
                    v["params"]["processId"] == json!(id)
                        && v["method"]
                            .as_str()
                            .is_some_and(|m| m.starts_with("process/"))
                })
                .await;
            let p = &v["params"];
            c.seqs.push(p["seq"].as_u64().expect("seq"));
            match v["method"].as_str().expect("method") {
                "process/output" => {
                    let data = unb64(p["chunk"].as_str().expect("chunk"));
                    if p["stream"] == "stderr" {
                        c.stderr.extend(data);
                    } else {
                        c.stdout.extend(data);
                    }
                }
                "process/exited" => c.exit_code = p["exitCode"].as_i64(),
                "process/closed" => return c,
                other => panic!("unexpected {other}"),
            }
        }
    }

    /// Run `script` with `/bin/sh -c` in `cwd`, no terminal; (stdout and
    /// stderr, exit code).
    pub async fn sh(&mut self, id: &str, cwd: &str, script: &str) -> (String, i64) {
        self.call(
            "process/start",
            json!({"processId": id, "argv": ["/bin/sh", "-c", script], "cwd": cwd,
                   "env": {"PATH": "/bin:/usr/bin"}, "tty": false}),
        )
        .await;
        let out = self.collect(id).await;
        (
            String::from_utf8_lossy(&out.stdout).into_owned()
                + &String::from_utf8_lossy(&out.stderr),
            out.exit_code.unwrap_or(-1),
        )
    }

    /// `fs/writeFile` of `data` at `path`.
    pub async fn write_text(&mut self, path: &str, data: &str) {
        self.call(
            "fs/writeFile",
            json!({"path": path, "dataBase64": b64(data.as_bytes())}),
        )
        .await;
    }
}

#[derive(Debug, Default)]
pub struct Collected {
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    pub exit_code: Option<i64>,
    pub seqs: Vec<u64>,
}

/// The cgroup2 mount point, if any (`/sys/fs/cgroup/unified` on a hybrid
/// host such as this one).
pub fn cgroup2_mount() -> Option<String> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    info.lines().find_map(|l| {
        let (pre, post) = l.split_once(" - ")?;
        (post.split_whitespace().next()? == "cgroup2")
            .then(|| pre.split_whitespace().nth(4).map(str::to_owned))?
    })
}

/// True if a process with this pid exists (and is not a zombie).
pub fn pid_alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(s) => !s
            .rsplit(')')
            .next()
            .is_some_and(|rest| rest.trim_start().starts_with('Z')),
        Err(_) => false,
    }
}

/// The value of metric `name` with exactly `labels` in `text`.
pub fn metric(text: &str, name: &str, labels: &str) -> Option<f64> {
    let key = format!("{name}{{{labels}}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&key))
        .and_then(|v| v.trim().parse().ok())
}

/// Poll `cond` until true or the timeout.
pub async fn eventually(what: &str, cond: impl Fn() -> bool) {
    let deadline = tokio::time::Instant::now() + event_timeout();
    while !cond() {
        assert!(tokio::time::Instant::now() < deadline, "timed out: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

pub fn write_file(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    let mut f = std::fs::File::create(&p).expect("create");
    f.write_all(text.as_bytes()).expect("write");
    p
}

/// `serve --config FILE` that should exit at once. A gateway that starts
/// instead would serve forever: it is killed, and the test fails on the
/// status (not a hang).
pub fn serve_expecting_refusal(config: &Path) -> std::process::Output {
    serve_expecting_refusal_as(Path::new(env!("CARGO_BIN_EXE_exec-gateway")), config)
}

/// [`serve_expecting_refusal`] through `exe` (a wrapper script that ends
/// by exec-ing the gateway with its arguments).
pub fn serve_expecting_refusal_as(exe: &Path, config: &Path) -> std::process::Output {
    // A state directory of its own (root's default, /var/lib, may be
    // read-only, as in the VM lane).
    let state = tempfile::tempdir().expect("tempdir");
    let mut child = Command::new(exe)
        .args(["serve", "--listen", "ws://127.0.0.1:0", "--config"])
        .arg(config)
        .env("XDG_STATE_HOME", state.path())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("serve");
    // A gateway that starts prints its URL: then there is no refusal to
    // wait for (the caller sees the success in the exit status, killed).
    let mut stdout = child.stdout.take().expect("stdout");
    let (tx, started) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut first = [0u8; 1];
        if std::io::Read::read(&mut stdout, &mut first).is_ok_and(|n| n == 1) {
            let _ = tx.send(());
        }
    });
    let deadline = std::time::Instant::now() + event_timeout();
    while child.try_wait().expect("serve").is_none()
        && std::time::Instant::now() < deadline
        && started.try_recv().is_err()
    {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let _ = child.kill();
    child.wait_with_output().expect("serve")
}

/// A sleep length no other test uses ("60.<pid><n>").
pub fn unique_seconds() -> String {
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(1);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!("60.{}{n}", std::process::id())
}

/// The host pid of the process whose argv is `argv`.
pub async fn host_pid_of(argv: &[&str]) -> i32 {
    let want: Vec<u8> = argv
        .iter()
        .flat_map(|a| [a.as_bytes(), b"\0"].concat())
        .collect();
    let deadline = std::time::Instant::now() + event_timeout();
    loop {
        if let Some(pid) = host_pids_where(|c| c == want).first() {
            return *pid;
        }
        assert!(std::time::Instant::now() < deadline, "no process {argv:?}");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// Host pids whose raw `/proc/PID/cmdline` passes `keep`.
pub fn host_pids_where(keep: impl Fn(&[u8]) -> bool) -> Vec<i32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| keep(&c)))
        .collect()
}

// === Keys made with openssl, for JWT tests ===

pub fn openssl(args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .output()
        .expect("openssl runs");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Generate a key pair with openssl; returns (private PEM, public PEM path).
pub fn keypair(dir: &Path, name: &str, genpkey: &[&str]) -> (Vec<u8>, String) {
    let key = dir.join(format!("{name}.pem"));
    let pubkey = dir.join(format!("{name}.pub.pem"));
    let mut args = vec!["genpkey"];
    args.extend_from_slice(genpkey);
    args.extend_from_slice(&["-out", key.to_str().unwrap()]);
    openssl(&args);
    openssl(&[
        "pkey",
        "-in",
        key.to_str().unwrap(),
        "-pubout",
        "-out",
        pubkey.to_str().unwrap(),
    ]);
    (std::fs::read(&key).unwrap(), pubkey.display().to_string())
}

pub fn rsa(dir: &Path, name: &str) -> (Vec<u8>, String) {
    keypair(
        dir,
        name,
        &["-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048"],
    )
}

/// An RSA public key as a JWK (n from openssl's modulus, e = 65537).
pub fn rsa_jwk(pub_pem: &str, kid: &str) -> Value {
    let out = Command::new("openssl")
        .args(["rsa", "-pubin", "-in", pub_pem, "-noout", "-modulus"])
        .output()
        .unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    let hex = text.trim().trim_start_matches("Modulus=");
    let bytes: Vec<u8> = (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
        .collect();
    let n = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes);
    json!({"kty": "RSA", "kid": kid, "use": "sig", "alg": "RS256", "n": n, "e": "AQAB"})
}

/// gRPC helpers shared by the gRPC and fleet tests.
pub mod direct;
pub mod fleet;
pub mod forward;
pub mod oci;
pub mod pki;

/// `exec-gateway serve` on `config` (ws on an ephemeral port, no admin
/// listener), run to its end: for configurations it must refuse.
pub fn serve_refused(config: &Path) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_exec-gateway"))
        .args([
            "serve",
            "--listen",
            "ws://127.0.0.1:0",
            "--admin-listen",
            "off",
            "--config",
        ])
        .arg(config)
        .output()
        .expect("run serve")
}

pub mod grpc {
    use exec_gateway::transport::grpc::pb;
    use tonic::Request;
    use tonic::transport::Channel;

    /// `msg` with `authorization: Bearer token`.
    pub fn authed<T>(msg: T, token: &str) -> Request<T> {
        let mut r = Request::new(msg);
        r.metadata_mut()
            .insert("authorization", format!("Bearer {token}").parse().unwrap());
        r
    }

    /// A connected channel to `url` (`http://HOST:PORT`).
    pub async fn channel(url: &str) -> Channel {
        tokio::time::timeout(
            super::event_timeout(),
            Channel::from_shared(url.to_owned()).unwrap().connect(),
        )
        .await
        .expect("grpc connect timeout")
        .expect("grpc connect")
    }

    /// A pipe process spec in /tmp with PATH set.
    pub fn spec(id: &str, argv: &[&str]) -> pb::ProcessSpec {
        pb::ProcessSpec {
            process_id: id.into(),
            argv: argv.iter().map(|s| (*s).to_owned()).collect(),
            cwd: "/tmp".into(),
            env: [("PATH".to_owned(), "/usr/bin:/bin".to_owned())].into(),
            ..Default::default()
        }
    }
}
