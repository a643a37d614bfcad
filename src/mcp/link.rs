//! One MCP session's gateway session: an exec-server JSON-RPC connection
//! over an in-process pipe, which the door that made the MCP session
//! serves exactly as it serves its own clients (the stdio door's line
//! codec, the connection driver, the tower stack with its scope, rate
//! and in-flight guards, the audit trail, the metrics). Notifications are
//! not needed here (output is read with `process/read`) and are dropped.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};

use parking_lot::Mutex;
use serde_json::{Value, json};
use tokio::io::{
    AsyncBufReadExt as _, AsyncReadExt as _, AsyncWriteExt as _, BufReader, DuplexStream, WriteHalf,
};
use tokio::sync::{Semaphore, oneshot};

use super::{MAX_CALLS_IN_FLIGHT, MAX_LINK_MESSAGE_BYTES};
use crate::protocol::methods;

/// An error the gateway answered (its JSON-RPC code and message), or the
/// link's end.
#[derive(Debug, Clone)]
pub struct CallError {
    pub code: i64,
    pub message: String,
}

impl std::fmt::Display for CallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} (code {})", self.message, self.code)
    }
}

type Pending = Arc<Mutex<Option<HashMap<i64, oneshot::Sender<Result<Value, CallError>>>>>>;

/// A connected, initialized gateway session.
pub struct Link {
    writer: tokio::sync::Mutex<WriteHalf<DuplexStream>>,
    pending: Pending,
    next_id: AtomicI64,
    permits: Semaphore,
    /// The gateway session's id and its processes' default directory.
    pub session_id: String,
    pub cwd: String,
    reader: tokio::task::JoinHandle<()>,
}

impl Drop for Link {
    fn drop(&mut self) {
        // The pipe's other end sees EOF once the writer goes; the reader
        // would end with it, but need not be waited for.
        self.reader.abort();
    }
}

fn ended() -> CallError {
    CallError {
        code: crate::error::code::INTERNAL,
        message: "the gateway session ended".to_owned(),
    }
}

impl Link {
    /// Open the session over `pipe` (whose other end the door serves):
    /// `initialize` (with `snapshot`, a fork of it) and `initialized`.
    pub async fn open(pipe: DuplexStream, snapshot: Option<&str>) -> Result<Link, CallError> {
        let (read, write) = tokio::io::split(pipe);
        let pending: Pending = Arc::new(Mutex::new(Some(HashMap::new())));
        let reader =
            crate::task::start("mcp-link", read_loop(BufReader::new(read), pending.clone()));
        let mut link = Link {
            writer: tokio::sync::Mutex::new(write),
            pending,
            next_id: AtomicI64::new(1),
            permits: Semaphore::new(MAX_CALLS_IN_FLIGHT),
            session_id: String::new(),
            cwd: String::new(),
            reader,
        };
        let mut params =
            json!({"clientName": format!("exec-gateway-mcp/{}", env!("CARGO_PKG_VERSION"))});
        if let Some(s) = snapshot {
            params["snapshot"] = json!(s);
        }
        let init = link.call(methods::INITIALIZE, params).await?;
        link.send(&json!({"jsonrpc": "2.0", "method": methods::INITIALIZED}))
            .await?;
        link.session_id = init["sessionId"].as_str().unwrap_or_default().to_owned();
        let info = link.call(methods::ENVIRONMENT_INFO, json!({})).await?;
        let cwd = info["cwd"].as_str().unwrap_or("/").to_owned();
        link.cwd = crate::protocol::path::WirePath::parse(cwd)
            .as_str()
            .to_owned();
        Ok(link)
    }

    async fn send(&self, msg: &Value) -> Result<(), CallError> {
        let mut line = serde_json::to_vec(msg).map_err(|e| CallError {
            code: crate::error::code::INTERNAL,
            message: e.to_string(),
        })?;
        line.push(b'\n');
        let mut w = self.writer.lock().await;
        w.write_all(&line).await.map_err(|_| ended())?;
        w.flush().await.map_err(|_| ended())
    }

    /// Call `method`; its result, or the error the gateway answered.
    pub async fn call(&self, method: &str, params: Value) -> Result<Value, CallError> {
        let _permit = self.permits.acquire().await.map_err(|_| ended())?;
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        match self.pending.lock().as_mut() {
            Some(p) => p.insert(id, tx),
            None => return Err(ended()),
        };
        let sent = self
            .send(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}))
            .await;
        if let Err(e) = sent {
            if let Some(p) = self.pending.lock().as_mut() {
                p.remove(&id);
            }
            return Err(e);
        }
        rx.await.unwrap_or_else(|_| Err(ended()))
    }

    /// Whether the gateway session is still there.
    pub fn is_open(&self) -> bool {
        self.pending.lock().is_some()
    }
}

async fn read_loop(mut read: BufReader<tokio::io::ReadHalf<DuplexStream>>, pending: Pending) {
    let mut line = Vec::new();
    loop {
        line.clear();
        // Bounded: a line longer than the gateway's own largest answer
        // ends the link (the gateway never sends one).
        let n = match (&mut read)
            .take(MAX_LINK_MESSAGE_BYTES as u64 + 1)
            .read_until(b'\n', &mut line)
            .await
        {
            Ok(n) => n,
            Err(_) => break,
        };
        if n == 0 || (n > MAX_LINK_MESSAGE_BYTES && !line.ends_with(b"\n")) {
            break;
        }
        let Ok(msg) = serde_json::from_slice::<Value>(&line) else {
            continue;
        };
        let Some(id) = msg.get("id").and_then(Value::as_i64) else {
            continue; // a notification
        };
        let answer = match msg.get("error") {
            Some(e) => Err(CallError {
                code: e["code"].as_i64().unwrap_or(crate::error::code::INTERNAL),
                message: e["message"].as_str().unwrap_or("error").to_owned(),
            }),
            None => Ok(msg.get("result").cloned().unwrap_or(Value::Null)),
        };
        let tx = pending.lock().as_mut().and_then(|p| p.remove(&id));
        if let Some(tx) = tx {
            let _ = tx.send(answer);
        }
    }
    // Every call waiting, and every later one, fails.
    pending.lock().take();
}
