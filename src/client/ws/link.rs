//! One websocket carrying the session: JSON-RPC framing (requests out,
//! responses matched to their call by id, notifications to the
//! attachments' mailboxes), pings, and what ends a link.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU16, Ordering};
use std::time::Duration;

use futures_util::{SinkExt as _, StreamExt as _};
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use tokio::sync::{mpsc, oneshot};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest as _;
use tokio_util::sync::CancellationToken;

use super::super::common::redact_url;
use super::super::error::{ClientError, Result, rpc_error};
use super::super::types::{ConnectOptions, MAX_MESSAGE_BYTES};
use super::mailbox::{Subs, decode_note};
use crate::protocol::jsonrpc::{ErrorObject, RequestId, encode_request};

/// How long one call waits for its answer.
const CALL_TIMEOUT: Duration = Duration::from_secs(180);

/// Frames queued for a link's writer.
const OUTBOUND_FRAMES: usize = 256;
/// A ping goes out after this long without a frame from the gateway…
const PING_AFTER: Duration = Duration::from_secs(15);
/// …and the link is given up after this long.
const IDLE_LIMIT: Duration = Duration::from_secs(45);

/// The gateway's close code for "session has been resumed by another
/// connection": someone else holds the session now.
pub(super) const TAKEN_OVER: u16 = 4000;

/// A call's answer: its `result`, undecoded, or the error.
pub(super) type Reply = std::result::Result<Box<RawValue>, ClientError>;

/// Calls waiting for their answer, by request id.
pub(super) type Pending = Mutex<HashMap<i64, oneshot::Sender<Reply>>>;

/// One websocket carrying the session.
pub(super) struct Link {
    pub(super) generation: u64,
    out: mpsc::Sender<Message>,
    pub(super) pending: Arc<Pending>,
    pub(super) dead: CancellationToken,
    pub(super) why: Arc<Mutex<String>>,
    /// The close code the gateway sent, 0 if none.
    pub(super) close_code: Arc<AtomicU16>,
}

impl Link {
    pub(super) fn new(generation: u64, out: mpsc::Sender<Message>) -> Link {
        Link {
            generation,
            out,
            pending: Arc::default(),
            dead: CancellationToken::new(),
            why: Arc::new(Mutex::new(String::from("connection closed"))),
            close_code: Arc::new(AtomicU16::new(0)),
        }
    }

    pub(super) fn disconnected(&self) -> ClientError {
        ClientError::Disconnected(self.why.lock().clone())
    }

    /// Send request `id` and wait for its answer.
    pub(super) async fn call<P: Serialize>(&self, id: i64, method: &str, params: &P) -> Reply {
        let text = encode_request(&RequestId::Integer(id), method, params)
            .map_err(ClientError::protocol)?;
        let (tx, rx) = oneshot::channel();
        self.pending.lock().insert(id, tx);
        if self.dead.is_cancelled() || self.out.send(Message::text(text)).await.is_err() {
            self.pending.lock().remove(&id);
            return Err(self.disconnected());
        }
        // The gateway answers within its request deadline (60 s by
        // default); a server that never does is not waited for forever.
        match tokio::time::timeout(CALL_TIMEOUT, rx).await {
            Ok(Ok(r)) => r,
            Ok(Err(_)) => Err(self.disconnected()),
            Err(_) => {
                self.pending.lock().remove(&id);
                Err(ClientError::Protocol(format!(
                    "no answer to {method} within {}s",
                    CALL_TIMEOUT.as_secs()
                )))
            }
        }
    }

    /// Send a notification without params (`initialized`).
    pub(super) async fn notify(&self, method: &str) -> Result<()> {
        #[derive(Serialize)]
        struct Bare<'a> {
            method: &'a str,
        }
        let text = serde_json::to_string(&Bare { method }).map_err(ClientError::protocol)?;
        self.out
            .send(Message::text(text))
            .await
            .map_err(|_| self.disconnected())
    }

    /// Fail the calls in flight and wake the attachments: the link is over.
    pub(super) fn fail_all(&self, subs: &Subs) {
        let reason = self.why.lock().clone();
        for (_, tx) in self.pending.lock().drain() {
            let _ = tx.send(Err(ClientError::Disconnected(reason.clone())));
        }
        subs.lag_all();
    }
}

/// A frame from the gateway, as far as the client reads it.
#[derive(Deserialize)]
struct Incoming<'a> {
    /// Kept raw: an id that is not an integer matches no call.
    #[serde(default, borrow)]
    id: Option<&'a RawValue>,
    #[serde(default, borrow)]
    method: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    params: Option<&'a RawValue>,
    /// `Some` whenever the key is present (`null` included).
    #[serde(default, deserialize_with = "present")]
    result: Option<Box<RawValue>>,
    #[serde(default)]
    error: Option<ErrorObject>,
}

fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Box<RawValue>>, D::Error> {
    Box::<RawValue>::deserialize(d).map(Some)
}

/// What one frame is.
#[derive(Debug)]
enum Frame<'a> {
    /// A notification (or a request, which the client does not serve).
    Notification {
        method: Cow<'a, str>,
        params: Option<&'a RawValue>,
    },
    /// The answer to call `id`.
    Answer { id: i64, reply: Reply },
    /// An error for no call of ours (id -1: a frame the gateway could not
    /// read).
    Refused(ErrorObject),
    /// Anything else (an answer without an integer id).
    Other,
}

fn decode_frame(text: &str) -> Option<Frame<'_>> {
    let m = serde_json::from_str::<Incoming<'_>>(text).ok()?;
    if let Some(method) = m.method {
        return Some(Frame::Notification {
            method,
            params: m.params,
        });
    }
    let id =
        m.id.and_then(|raw| serde_json::from_str::<RequestId>(raw.get()).ok());
    let Some(RequestId::Integer(id)) = id.filter(|id| *id != RequestId::UNKNOWN) else {
        return Some(match m.error {
            Some(e) => Frame::Refused(e),
            None => Frame::Other,
        });
    };
    let reply = match (m.result, m.error) {
        (_, Some(e)) => Err(rpc_error(e)),
        (Some(r), None) => Ok(r),
        (None, None) => Err(ClientError::Protocol(format!(
            "response {id} without result or error"
        ))),
    };
    Some(Frame::Answer { id, reply })
}

/// Route one frame from the gateway: an answer to its call, a process
/// notification to the process's attachments.
pub(super) async fn dispatch(text: &str, pending: &Pending, subs: &Subs) {
    match decode_frame(text) {
        Some(Frame::Notification { method, params }) => {
            if let Some((process_id, note)) = decode_note(&method, params) {
                subs.deliver(&process_id, note).await;
            }
        }
        Some(Frame::Answer { id, reply }) => {
            if let Some(tx) = pending.lock().remove(&id) {
                let _ = tx.send(reply);
            }
        }
        Some(Frame::Refused(e)) => {
            tracing::warn!(code = e.code, message = %e.message, "gateway refused a frame");
        }
        Some(Frame::Other) => {}
        None => tracing::debug!("unparseable frame from the gateway"),
    }
}

/// A websocket connected to `url` with `opts`' token, TLS and client
/// certificate; messages up to `max_message` bytes.
pub(in crate::client) async fn dial(
    opts: &ConnectOptions,
    url: &str,
    max_message: usize,
) -> Result<
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>,
> {
    let connect_err = |detail: String| ClientError::Connect {
        url: redact_url(url),
        detail,
    };
    let mut request = url
        .into_client_request()
        .map_err(|e| connect_err(e.to_string()))?;
    if let Some(bearer) = opts.bearer() {
        let bearer = bearer
            .parse()
            .map_err(|_| connect_err("the token is not a valid header value".to_owned()))?;
        request.headers_mut().insert("authorization", bearer);
    }
    let config = tokio_tungstenite::tungstenite::protocol::WebSocketConfig::default()
        .max_message_size(Some(max_message))
        .max_frame_size(Some(max_message));
    // `wss://` verifies the gateway against the given CA bundle (or the
    // public web roots) and shows the client certificate, if any.
    let connector = if opts.url.starts_with("wss://") {
        let tls = opts
            .tls(crate::tls::ALPN_HTTP1)
            .map_err(|e| connect_err(format!("TLS: {e}")))?;
        Some(tokio_tungstenite::Connector::Rustls(tls.config()))
    } else {
        None
    };
    let (ws, _) =
        tokio_tungstenite::connect_async_tls_with_config(request, Some(config), true, connector)
            .await
            .map_err(|e| match e {
                tokio_tungstenite::tungstenite::Error::Http(resp) => {
                    let body = resp
                        .body()
                        .as_deref()
                        .map(|b| String::from_utf8_lossy(b).trim().to_owned())
                        .unwrap_or_default();
                    connect_err(format!("{} {body}", resp.status()))
                }
                e => connect_err(e.to_string()),
            })?;
    Ok(ws)
}

/// Connect a websocket and start its reader and writer.
pub(super) async fn open_link(
    opts: &ConnectOptions,
    generation: u64,
    subs: Arc<Subs>,
) -> Result<Arc<Link>> {
    let ws = dial(opts, &opts.url, MAX_MESSAGE_BYTES).await?;
    let (mut sink, mut stream) = ws.split();
    let (out, mut out_rx) = mpsc::channel::<Message>(OUTBOUND_FRAMES);
    let link = Arc::new(Link::new(generation, out));
    {
        let (dead, why) = (link.dead.clone(), link.why.clone());
        crate::task::start("client-ws-writer", async move {
            loop {
                tokio::select! {
                    _ = dead.cancelled() => break,
                    m = out_rx.recv() => match m {
                        Some(m) => {
                            if let Err(e) = sink.send(m).await {
                                *why.lock() = format!("send failed: {e}");
                                break;
                            }
                        }
                        None => break,
                    },
                }
            }
            let _ = sink.close().await;
            dead.cancel();
        });
    }
    {
        let reader = link.clone();
        crate::task::start("client-ws-reader", async move {
            let Link {
                out,
                pending,
                dead,
                why,
                close_code,
                ..
            } = &*reader;
            let mut last = tokio::time::Instant::now();
            let mut tick = tokio::time::interval(PING_AFTER);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = dead.cancelled() => break,
                    _ = tick.tick() => {
                        if last.elapsed() >= IDLE_LIMIT {
                            *why.lock() = format!("no frame from the gateway for {}s", IDLE_LIMIT.as_secs());
                            break;
                        }
                        if last.elapsed() >= PING_AFTER {
                            let _ = out.try_send(Message::Ping(Default::default()));
                        }
                    }
                    frame = stream.next() => {
                        last = tokio::time::Instant::now();
                        match frame {
                            Some(Ok(Message::Text(t))) => dispatch(t.as_str(), pending, &subs).await,
                            Some(Ok(Message::Binary(b))) => {
                                if let Ok(t) = std::str::from_utf8(&b) {
                                    dispatch(t, pending, &subs).await;
                                }
                            }
                            Some(Ok(Message::Close(frame))) => {
                                *why.lock() = match frame {
                                    Some(f) => {
                                        close_code.store(u16::from(f.code), Ordering::Relaxed);
                                        format!("closed by the gateway: {} {}", u16::from(f.code), f.reason)
                                    }
                                    None => "closed by the gateway".to_owned(),
                                };
                                break;
                            }
                            Some(Ok(_)) => {}
                            Some(Err(e)) => {
                                *why.lock() = e.to_string();
                                break;
                            }
                            None => break,
                        }
                    }
                }
            }
            dead.cancel();
            reader.fail_all(&subs);
        });
    }
    Ok(link)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use serde_json::json;

    use super::*;

    fn answer(text: &str) -> (i64, Reply) {
        match decode_frame(text).unwrap() {
            Frame::Answer { id, reply } => (id, reply),
            other => panic!("not an answer: {other:?}"),
        }
    }

    #[test]
    fn answers_decode_to_their_call_id() {
        let (id, r) = answer(r#"{"id":7,"result":{"running":true}}"#);
        assert_eq!(id, 7);
        assert_eq!(r.unwrap().get(), r#"{"running":true}"#);
        // `null` is a result, not a missing one.
        let (_, r) = answer(r#"{"id":8,"result":null,"jsonrpc":"2.0"}"#);
        assert_eq!(r.unwrap().get(), "null");
        let (id, r) = answer(r#"{"error":{"code":-32602,"message":"bad","data":{"x":1}},"id":9}"#);
        assert_eq!(id, 9);
        assert!(
            matches!(r, Err(ClientError::Rpc { code: -32602, message, data: Some(d) }) if message == "bad" && d == json!({"x": 1}))
        );
        let (_, r) = answer(r#"{"id":10}"#);
        assert!(matches!(r, Err(ClientError::Protocol(m)) if m.contains("without result")));
    }

    #[test]
    fn frames_for_no_call_are_told_apart() {
        assert!(matches!(
            decode_frame(r#"{"error":{"code":-32700,"message":"Parse error"},"id":-1}"#),
            Some(Frame::Refused(e)) if e.code == -32700
        ));
        assert!(matches!(
            decode_frame(r#"{"id":"7","result":{}}"#),
            Some(Frame::Other)
        ));
        assert!(matches!(
            decode_frame(r#"{"method":"process/closed","params":{"processId":"p","seq":1}}"#),
            Some(Frame::Notification { method, params: Some(_) }) if method == "process/closed"
        ));
        assert!(decode_frame("not json").is_none());
    }

    fn link() -> (Arc<Link>, mpsc::Receiver<Message>) {
        let (tx, rx) = mpsc::channel(8);
        (Arc::new(Link::new(0, tx)), rx)
    }

    async fn sent(rx: &mut mpsc::Receiver<Message>) -> String {
        match rx.recv().await.unwrap() {
            Message::Text(t) => t.as_str().to_owned(),
            m => panic!("{m:?}"),
        }
    }

    #[tokio::test]
    async fn calls_are_matched_by_id_whatever_the_order_of_answers() {
        let (link, mut rx) = link();
        let subs = Subs::default();
        let a = crate::task::start("client-test", {
            let link = link.clone();
            async move {
                link.call(1, "process/terminate", &json!({"processId": "a"}))
                    .await
            }
        });
        assert_eq!(
            sent(&mut rx).await,
            r#"{"id":1,"method":"process/terminate","params":{"processId":"a"}}"#
        );
        let b = crate::task::start("client-test", {
            let link = link.clone();
            async move { link.call(2, "process/list", &()).await }
        });
        assert_eq!(
            sent(&mut rx).await,
            r#"{"id":2,"method":"process/list","params":null}"#
        );
        dispatch(
            r#"{"id":2,"result":{"processes":[]}}"#,
            &link.pending,
            &subs,
        )
        .await;
        dispatch(r#"{"id":99,"result":{}}"#, &link.pending, &subs).await;
        dispatch(
            r#"{"id":1,"result":{"running":false}}"#,
            &link.pending,
            &subs,
        )
        .await;
        assert_eq!(b.await.unwrap().unwrap().get(), r#"{"processes":[]}"#);
        assert_eq!(a.await.unwrap().unwrap().get(), r#"{"running":false}"#);
        assert!(link.pending.lock().is_empty());
    }

    #[tokio::test]
    async fn a_dead_link_fails_its_calls_as_disconnected() {
        let (link, mut rx) = link();
        let subs = Subs::default();
        let call = crate::task::start("client-test", {
            let link = link.clone();
            async move { link.call(1, "process/list", &()).await }
        });
        sent(&mut rx).await;
        *link.why.lock() = "closed by the gateway: 1001 going away".into();
        link.fail_all(&subs);
        assert!(matches!(
            call.await.unwrap(),
            Err(ClientError::Disconnected(why)) if why.contains("going away")
        ));
        // Once cancelled, nothing more is sent.
        link.dead.cancel();
        assert!(matches!(
            link.call(2, "process/list", &()).await,
            Err(ClientError::Disconnected(_))
        ));
        assert!(rx.try_recv().is_err());
        assert!(link.pending.lock().is_empty());
    }

    #[tokio::test]
    async fn initialized_goes_without_params() {
        let (link, mut rx) = link();
        link.notify("initialized").await.unwrap();
        assert_eq!(sent(&mut rx).await, r#"{"method":"initialized"}"#);
    }
}
