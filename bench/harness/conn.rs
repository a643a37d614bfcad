//! A raw JSON-RPC websocket connection: the lean client (borrowed fields,
//! SIMD base64) and the frames a parsing client reads.

use std::time::Duration;

use futures_util::{SinkExt as _, StreamExt as _};
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

use super::{BenchResult, err};

type Ws = WebSocketStream<MaybeTlsStream<TcpStream>>;

pub(crate) struct Conn {
    pub(crate) ws: Ws,
    next_id: i64,
    /// The session `initialize` returned.
    pub(crate) session_id: String,
    /// Working directory of the processes it starts.
    pub(crate) cwd: String,
}

impl Conn {
    pub(crate) async fn open(url: &str) -> BenchResult<Conn> {
        Self::open_in(url, "/tmp").await
    }

    pub(crate) async fn open_in(url: &str, cwd: &str) -> BenchResult<Conn> {
        Self::open_with(url, cwd, json!({"clientName": "bench"})).await
    }

    /// Resume session `sid` (retrying while its previous connection is
    /// still being closed).
    pub(crate) async fn resume(url: &str, sid: &str) -> BenchResult<Conn> {
        let mut last = String::new();
        for _ in 0..100 {
            match Self::open_with(
                url,
                "/tmp",
                json!({"clientName": "bench", "resumeSessionId": sid}),
            )
            .await
            {
                Ok(c) => return Ok(c),
                Err(e) if e.contains("already attached") => {
                    last = e;
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                Err(e) => return Err(e),
            }
        }
        Err(last)
    }

    pub(crate) async fn open_with(url: &str, cwd: &str, init: Value) -> BenchResult<Conn> {
        Self::open_from(url, cwd, init, None).await
    }

    /// [`Conn::open_with`] from the loopback address `source` (one address
    /// has about 28,000 ephemeral ports: more sessions need more sources).
    pub(crate) async fn open_from(
        url: &str,
        cwd: &str,
        init: Value,
        source: Option<std::net::IpAddr>,
    ) -> BenchResult<Conn> {
        let (ws, _) = match source {
            None => tokio_tungstenite::connect_async(url).await.map_err(err)?,
            Some(ip) => {
                let req =
                    tokio_tungstenite::tungstenite::client::IntoClientRequest::into_client_request(
                        url,
                    )
                    .map_err(err)?;
                let host = req.uri().host().ok_or("no host")?.to_owned();
                let port = req.uri().port_u16().ok_or("no port")?;
                let addr: std::net::SocketAddr = format!("{host}:{port}").parse().map_err(err)?;
                let socket = tokio::net::TcpSocket::new_v4().map_err(err)?;
                socket.bind((ip, 0).into()).map_err(err)?;
                let tcp = socket.connect(addr).await.map_err(err)?;
                // A small read buffer: tungstenite's default 128 KiB, zero
                // filled, would take 12.5 GiB for 100,000 connections.
                let config = tokio_tungstenite::tungstenite::protocol::WebSocketConfig::default()
                    .read_buffer_size(4096);
                tokio_tungstenite::client_async_with_config(
                    req,
                    MaybeTlsStream::Plain(tcp),
                    Some(config),
                )
                .await
                .map_err(err)?
            }
        };
        if let MaybeTlsStream::Plain(s) = ws.get_ref() {
            let _ = s.set_nodelay(true);
        }
        let mut c = Conn {
            ws,
            next_id: 1,
            session_id: String::new(),
            cwd: cwd.to_owned(),
        };
        let r = c.call("initialize", init).await?;
        c.session_id = r["sessionId"].as_str().unwrap_or_default().to_owned();
        c.ws.send(Message::text(r#"{"method":"initialized"}"#))
            .await
            .map_err(err)?;
        Ok(c)
    }

    pub(crate) async fn send(&mut self, method: &str, params: Value) -> BenchResult<i64> {
        let id = self.next_id;
        self.next_id += 1;
        let text = json!({"id": id, "method": method, "params": params}).to_string();
        self.ws.send(Message::text(text)).await.map_err(err)?;
        Ok(id)
    }

    pub(crate) async fn next_text(&mut self) -> BenchResult<String> {
        loop {
            match self.ws.next().await {
                Some(Ok(Message::Text(t))) => return Ok(t.as_str().to_owned()),
                Some(Ok(_)) => continue,
                Some(Err(e)) => return Err(err(e)),
                None => return Err("connection closed".to_owned()),
            }
        }
    }

    pub(crate) async fn call(&mut self, method: &str, params: Value) -> BenchResult<Value> {
        let id = self.send(method, params).await?;
        loop {
            let v: Value = serde_json::from_str(&self.next_text().await?).map_err(err)?;
            if v.get("id") == Some(&json!(id)) {
                return match v.get("result") {
                    Some(r) => Ok(r.clone()),
                    None => Err(format!("{method} failed: {v}")),
                };
            }
        }
    }

    /// Start `argv` and wait for its `process/closed`; returns output bytes.
    pub(crate) async fn run_to_close(&mut self, pid: &str, argv: &[&str]) -> BenchResult<u64> {
        let id = self
            .send(
                "process/start",
                json!({"processId": pid, "argv": argv, "cwd": self.cwd,
                       "env": {"PATH": "/usr/bin:/bin"}, "tty": false}),
            )
            .await?;
        #[derive(Deserialize)]
        struct Msg<'a> {
            #[serde(default)]
            id: Option<i64>,
            #[serde(default, borrow)]
            method: Option<&'a str>,
            #[serde(default, borrow)]
            params: Option<Params<'a>>,
            #[serde(default)]
            error: Option<Value>,
        }
        #[derive(Deserialize)]
        struct Params<'a> {
            #[serde(default, borrow, rename = "processId")]
            process_id: Option<&'a str>,
            #[serde(default, borrow)]
            chunk: Option<&'a str>,
        }
        let mut bytes = 0u64;
        let mut buf = Vec::new();
        loop {
            let text = self.next_text().await?;
            let m: Msg<'_> = serde_json::from_str(&text).map_err(err)?;
            if m.id == Some(id)
                && let Some(e) = m.error
            {
                return Err(format!("start failed: {e}"));
            }
            let Some(p) = m.params else { continue };
            if p.process_id != Some(pid) {
                continue;
            }
            match m.method {
                Some("process/output") => {
                    if let Some(chunk) = p.chunk {
                        buf.clear();
                        base64_simd::STANDARD
                            .decode_append(chunk, &mut buf)
                            .map_err(err)?;
                        bytes += buf.len() as u64;
                    }
                }
                Some("process/closed") => return Ok(bytes),
                _ => {}
            }
        }
    }
}
