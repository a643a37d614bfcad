//! One executor link: the websocket an executor dialled to its rendezvous
//! URL. The executor is the JSON-RPC *server* on it (seed 001); the gateway
//! is its one client: it sends `initialize` and then a session's calls,
//! matches the answers by id, and hands the executor's notifications to
//! whichever connection holds the session.
//!
//! Reading stops while the session's client cannot take more
//! (back-pressure reaches the executor through TCP); a link that goes quiet
//! past [`LINK_IDLE_TIMEOUT`] is closed, and every call waiting on a closed
//! link fails at once.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use futures_util::{SinkExt as _, StreamExt as _};
use parking_lot::Mutex;
use serde::Deserialize;
use serde_json::value::RawValue;
use tokio::sync::{mpsc, oneshot};
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_util::sync::CancellationToken;

use crate::outbound::Attachment;
use crate::protocol::methods as m;

/// Frames queued for the executor before a caller waits.
pub const LINK_QUEUE_FRAMES: usize = 64;
/// Calls waiting for the executor's answer on one link.
pub const LINK_MAX_PENDING: usize = 1024;
/// How often the gateway pings an executor.
pub const LINK_PING_INTERVAL: Duration = Duration::from_secs(15);
/// A link that sends nothing (not even a pong) this long is closed.
pub const LINK_IDLE_TIMEOUT: Duration = Duration::from_secs(45);

/// Notifications an executor may send its session's client.
const FORWARDED: [&str; 6] = [
    m::PROCESS_OUTPUT,
    m::PROCESS_EXITED,
    m::PROCESS_CLOSED,
    m::FS_MISSING_CHANGED,
    m::COMMAND_EXEC_OUTPUT_DELTA,
    m::COMMAND_EXEC_EXITED,
];

/// How a call on a link failed.
#[derive(Debug, Clone)]
pub enum LinkError {
    /// The link closed before the answer came.
    Lost,
    /// Too many calls in flight on this link.
    Busy,
    /// The executor answered with an error.
    Remote {
        code: i64,
        message: String,
        data: Option<serde_json::Value>,
    },
}

type Answer = Result<String, LinkError>;

/// A live link to an executor.
pub struct Link {
    /// Serial number, for logs.
    pub serial: u64,
    tx: mpsc::Sender<Message>,
    pending: Mutex<HashMap<u64, oneshot::Sender<Answer>>>,
    next_id: AtomicU64,
    closed: CancellationToken,
    sink: Mutex<Option<(Arc<Attachment>, Tap)>>,
}

/// Who hears the executor's notifications besides the attached
/// connection: called with the method and the frame's text, on the link's
/// reader (it must not wait).
pub type Tap = Arc<dyn Fn(&str, &str) + Send + Sync>;

/// The longest error message kept from an executor (longer ones are cut):
/// an error's text goes on to clients, gRPC's in a header.
pub const MAX_EXECUTOR_ERROR_TEXT: usize = 4096;
/// The largest error `data` kept from an executor, as JSON text (larger is
/// dropped).
pub const MAX_EXECUTOR_ERROR_DATA: usize = 4096;

impl std::fmt::Debug for Link {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Link({})", self.serial)
    }
}

#[derive(Deserialize)]
struct Incoming {
    #[serde(default)]
    id: Option<serde_json::Value>,
    #[serde(default)]
    method: Option<String>,
    #[serde(default)]
    result: Option<Box<RawValue>>,
    #[serde(default)]
    error: Option<ErrorBody>,
}

#[derive(Deserialize)]
struct ErrorBody {
    code: i64,
    #[serde(default)]
    message: String,
    #[serde(default)]
    data: Option<serde_json::Value>,
}

static SERIAL: AtomicU64 = AtomicU64::new(1);

impl Link {
    /// Start serving `ws` (an upgraded rendezvous connection).
    pub fn start<S>(ws: WebSocketStream<S>) -> Arc<Link>
    where
        S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        let (tx, mut rx) = mpsc::channel::<Message>(LINK_QUEUE_FRAMES);
        let link = Arc::new(Link {
            serial: SERIAL.fetch_add(1, Ordering::Relaxed),
            tx,
            pending: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(1),
            closed: CancellationToken::new(),
            sink: Mutex::new(None),
        });
        let (mut write, mut read) = ws.split();
        let closed = link.closed.clone();
        crate::task::start("executor-link-writer", async move {
            let mut ping = tokio::time::interval(LINK_PING_INTERVAL);
            ping.tick().await;
            loop {
                let msg = tokio::select! {
                    () = closed.cancelled() => break,
                    m = rx.recv() => match m { Some(m) => m, None => break },
                    _ = ping.tick() => Message::Ping(Default::default()),
                };
                if write.send(msg).await.is_err() {
                    break;
                }
            }
            closed.cancel();
            let _ = tokio::time::timeout(Duration::from_secs(1), write.close()).await;
        });
        let reader = link.clone();
        crate::task::start("executor-link-reader", async move {
            loop {
                let msg = tokio::select! {
                    () = reader.closed.cancelled() => break,
                    m = tokio::time::timeout(LINK_IDLE_TIMEOUT, read.next()) => m,
                };
                let text = match msg {
                    Err(_) => {
                        tracing::info!(
                            link = reader.serial,
                            "executor link went quiet; closing it"
                        );
                        break;
                    }
                    Ok(None | Some(Err(_)) | Some(Ok(Message::Close(_)))) => break,
                    Ok(Some(Ok(Message::Text(t)))) => t.as_str().to_owned(),
                    Ok(Some(Ok(Message::Binary(b)))) => match String::from_utf8(b.to_vec()) {
                        Ok(t) => t,
                        Err(_) => continue,
                    },
                    Ok(Some(Ok(_))) => continue,
                };
                reader.incoming(text).await;
            }
            reader.close();
        });
        link
    }

    async fn incoming(&self, text: String) {
        let Ok(msg) = serde_json::from_str::<Incoming>(&text) else {
            tracing::debug!(link = self.serial, "executor sent a malformed frame");
            return;
        };
        if let Some(method) = msg.method {
            if msg.id.is_none() && FORWARDED.contains(&method.as_str()) {
                let sink = self.sink.lock().clone();
                if let Some((attachment, tap)) = sink {
                    tap(&method, &text);
                    attachment.notify(text).await;
                }
            }
            // Requests from the executor (it has none to make) are ignored.
            return;
        }
        let Some(id) = msg.id.as_ref().and_then(serde_json::Value::as_u64) else {
            return;
        };
        let Some(waiter) = self.pending.lock().remove(&id) else {
            return;
        };
        let answer = match (msg.result, msg.error) {
            (_, Some(e)) => Err(LinkError::Remote {
                code: e.code,
                message: crate::protocol::truncate_text(e.message, MAX_EXECUTOR_ERROR_TEXT),
                data: e
                    .data
                    .filter(|d| d.to_string().len() <= MAX_EXECUTOR_ERROR_DATA),
            }),
            (Some(r), None) => Ok(r.get().to_owned()),
            (None, None) => Ok("null".to_owned()),
        };
        let _ = waiter.send(answer);
    }

    /// Send a request and wait for its answer: the raw JSON `result`.
    pub async fn call(&self, method: &str, params: &str) -> Result<String, LinkError> {
        if self.is_closed() {
            return Err(LinkError::Lost);
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        {
            let mut pending = self.pending.lock();
            if pending.len() >= LINK_MAX_PENDING {
                return Err(LinkError::Busy);
            }
            pending.insert(id, tx);
        }
        let mut frame = String::with_capacity(params.len() + method.len() + 40);
        frame.push_str(r#"{"id":"#);
        frame.push_str(&id.to_string());
        frame.push_str(r#","method":"#);
        frame.push_str(&crate::protocol::notify::json_string(method));
        frame.push_str(r#","params":"#);
        frame.push_str(params);
        // The executor hop of the call's trace: the envelope's `trace`, as
        // Codex's own client sends it.
        let span = crate::telemetry::exporting()
            .then(|| tracing::info_span!("executor.call", rpc.method = method));
        if let Some(t) = span.as_ref().and_then(crate::telemetry::context_of) {
            frame.push_str(r#","trace":{"traceparent":"#);
            frame.push_str(&crate::protocol::notify::json_string(&t.traceparent));
            if let Some(s) = &t.tracestate {
                frame.push_str(r#","tracestate":"#);
                frame.push_str(&crate::protocol::notify::json_string(s));
            }
            frame.push('}');
        }
        frame.push('}');
        // Lives until the answer (its duration is the executor's).
        let _span = span;
        let sent = tokio::select! {
            r = self.tx.send(Message::text(frame)) => r.is_ok(),
            () = self.closed.cancelled() => false,
        };
        if !sent {
            self.pending.lock().remove(&id);
            return Err(LinkError::Lost);
        }
        tokio::select! {
            r = rx => r.unwrap_or(Err(LinkError::Lost)),
            () = self.closed.cancelled() => {
                self.pending.lock().remove(&id);
                Err(LinkError::Lost)
            }
        }
    }

    /// Send a notification (`initialized`).
    pub async fn notify(&self, method: &str) -> Result<(), LinkError> {
        let frame = format!(
            r#"{{"method":{},"params":{{}}}}"#,
            crate::protocol::notify::json_string(method)
        );
        tokio::select! {
            r = self.tx.send(Message::text(frame)) => r.map_err(|_| LinkError::Lost),
            () = self.closed.cancelled() => Err(LinkError::Lost),
        }
    }

    /// Deliver the executor's notifications to `attachment`'s connection,
    /// and to `tap`.
    pub fn bind(&self, attachment: Arc<Attachment>, tap: Tap) {
        *self.sink.lock() = Some((attachment, tap));
    }

    /// Close the link (the executor then re-registers); calls waiting on
    /// it fail.
    pub fn close(&self) {
        self.closed.cancel();
        self.sink.lock().take();
        self.pending.lock().clear();
    }

    pub fn is_closed(&self) -> bool {
        self.closed.is_cancelled()
    }

    /// Completes once the link is closed.
    pub async fn closed(&self) {
        self.closed.cancelled().await;
    }
}
