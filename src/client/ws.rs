//! The websocket backend: exec-server JSON-RPC, one message per frame.
//!
//! One link (a websocket) at a time carries the session. Its reader task
//! answers calls by id and routes process notifications to attachments;
//! when it dies, calls in flight fail over to a resumed link
//! (`initialize {resumeSessionId}`) and attachments re-read the process's
//! retained output from their cursor. The client fixes its session to the
//! November 2026 revision (`file://` paths, 128 + n exit codes, 80 s
//! detach TTL) by asking `environment/info` first.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::time::Duration;

use futures_util::stream::FuturesOrdered;
use futures_util::{SinkExt as _, StreamExt as _};
use parking_lot::Mutex;
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{Value, json};
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _};
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore, mpsc, oneshot};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest as _;
use tokio_util::sync::CancellationToken;

use super::{
    ATTACH_BUFFER_BYTES, ATTACH_BUFFER_EVENTS, Backoff, ClientError, ConnectOptions, DirEntry,
    Event, FILE_BLOCK_BYTES, FILE_BLOCKS_IN_FLIGHT, MAX_MESSAGE_BYTES, Metadata, ProcessInfo,
    ProcessSpec, Result, Signal, Stream, WriteStatus, is_overloaded, unique_prefix,
};

/// How long one call waits for its answer.
const CALL_TIMEOUT: Duration = Duration::from_secs(180);

/// Frames queued for a link's writer.
const OUTBOUND_FRAMES: usize = 256;
/// A ping goes out after this long without a frame from the gateway…
const PING_AFTER: Duration = Duration::from_secs(15);
/// …and the link is given up after this long.
const IDLE_LIMIT: Duration = Duration::from_secs(45);

type Reply = std::result::Result<Box<RawValue>, ClientError>;

/// A process notification, decoded.
#[derive(Debug, Clone)]
enum Note {
    Output {
        seq: u64,
        stream: Stream,
        data: Vec<u8>,
    },
    Exited {
        seq: u64,
        code: i32,
    },
    Closed {
        seq: u64,
    },
}

impl Note {
    fn bytes(&self) -> usize {
        match self {
            Note::Output { data, .. } => data.len(),
            _ => 0,
        }
    }
}

/// One attachment's mailbox. A full one (in events or bytes) stops the
/// link's reader: the gateway's queue for the connection fills and the
/// process waits, as behind a local pipe. Nothing is dropped.
struct Sub {
    tx: mpsc::Sender<(Note, OwnedSemaphorePermit)>,
    /// Bytes of output held in the mailbox ([`ATTACH_BUFFER_BYTES`]).
    budget: Arc<Semaphore>,
    /// Set when the link died: the attachment must re-read.
    lagged: AtomicBool,
    wake: Notify,
}

impl Sub {
    fn lag(&self) {
        self.lagged.store(true, Ordering::Release);
        self.wake.notify_one();
    }
}

/// Attachments by process id, shared by every link of the client.
/// Mailboxes of one process, with their attachment's key.
type ProcessSubs = Vec<(u64, Arc<Sub>)>;

#[derive(Default)]
struct Subs {
    map: Mutex<HashMap<String, ProcessSubs>>,
    next: AtomicU64,
}

impl Subs {
    /// Hand `note` to each attachment of the process, waiting for room.
    async fn deliver(&self, process_id: &str, note: Note) {
        let subs: Vec<Arc<Sub>> = match self.map.lock().get(process_id) {
            Some(subs) => subs.iter().map(|(_, s)| s.clone()).collect(),
            None => return,
        };
        let want = u32::try_from(note.bytes().min(ATTACH_BUFFER_BYTES)).unwrap_or(u32::MAX);
        for s in subs {
            // Closed when the attachment is dropped.
            let Ok(permit) = s.budget.clone().acquire_many_owned(want).await else {
                continue;
            };
            let _ = s.tx.send((note.clone(), permit)).await;
        }
    }

    fn lag_all(&self) {
        for subs in self.map.lock().values() {
            for (_, s) in subs {
                s.lag();
            }
        }
    }
}

/// One websocket carrying the session.
struct Link {
    generation: u64,
    out: mpsc::Sender<Message>,
    pending: Arc<Mutex<HashMap<i64, oneshot::Sender<Reply>>>>,
    dead: CancellationToken,
    why: Arc<Mutex<String>>,
    /// The close code the gateway sent, 0 if none.
    close_code: Arc<std::sync::atomic::AtomicU16>,
}

/// The gateway's close code for "session has been resumed by another
/// connection": someone else holds the session now.
const TAKEN_OVER: u16 = 4000;

impl Link {
    fn disconnected(&self) -> ClientError {
        ClientError::Disconnected(self.why.lock().clone())
    }

    async fn call(&self, id: i64, method: &str, params: &Value) -> Reply {
        let (tx, rx) = oneshot::channel();
        self.pending.lock().insert(id, tx);
        let text = json!({"id": id, "method": method, "params": params}).to_string();
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
}

#[derive(Deserialize)]
struct Incoming<'a> {
    #[serde(default)]
    id: Option<Value>,
    #[serde(default, borrow)]
    method: Option<&'a str>,
    #[serde(default, borrow)]
    params: Option<&'a RawValue>,
    #[serde(default)]
    result: Option<Box<RawValue>>,
    #[serde(default)]
    error: Option<WireError>,
}

#[derive(Deserialize)]
struct WireError {
    code: i64,
    message: String,
    #[serde(default)]
    data: Option<Value>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct NoteParams<'a> {
    #[serde(borrow)]
    process_id: &'a str,
    seq: u64,
    #[serde(default, borrow)]
    stream: Option<&'a str>,
    #[serde(default, borrow)]
    chunk: Option<&'a str>,
    #[serde(default)]
    exit_code: Option<i32>,
}

fn stream_of(name: Option<&str>) -> Stream {
    match name {
        Some("stderr") => Stream::Stderr,
        Some("pty") => Stream::Pty,
        _ => Stream::Stdout,
    }
}

fn decode_b64(s: &str) -> Result<Vec<u8>> {
    base64_simd::STANDARD
        .decode_to_vec(s)
        .map_err(ClientError::protocol)
}

fn encode_b64(data: &[u8]) -> String {
    base64_simd::STANDARD.encode_to_string(data)
}

/// Route one frame from the gateway.
async fn dispatch(text: &str, pending: &Mutex<HashMap<i64, oneshot::Sender<Reply>>>, subs: &Subs) {
    let Ok(m) = serde_json::from_str::<Incoming<'_>>(text) else {
        tracing::debug!("unparseable frame from the gateway");
        return;
    };
    if let Some(method) = m.method {
        let Some(params) = m.params else { return };
        let Ok(p) = serde_json::from_str::<NoteParams<'_>>(params.get()) else {
            return;
        };
        let note = match method {
            "process/output" => {
                let Ok(data) = decode_b64(p.chunk.unwrap_or_default()) else {
                    return;
                };
                Note::Output {
                    seq: p.seq,
                    stream: stream_of(p.stream),
                    data,
                }
            }
            "process/exited" => Note::Exited {
                seq: p.seq,
                code: p.exit_code.unwrap_or(-1),
            },
            "process/closed" => Note::Closed { seq: p.seq },
            _ => return,
        };
        subs.deliver(p.process_id, note).await;
        return;
    }
    let Some(id) = m.id.as_ref().and_then(Value::as_i64) else {
        // Errors on id -1: a frame the gateway could not read.
        if let Some(e) = m.error {
            tracing::warn!(code = e.code, message = %e.message, "gateway refused a frame");
        }
        return;
    };
    let Some(tx) = pending.lock().remove(&id) else {
        return;
    };
    let reply = match (m.result, m.error) {
        (_, Some(e)) => Err(ClientError::Rpc {
            code: e.code,
            message: e.message,
            data: e.data,
        }),
        (Some(r), None) => Ok(r),
        (None, None) => Err(ClientError::Protocol(format!(
            "response {id} without result or error"
        ))),
    };
    let _ = tx.send(reply);
}

/// Connect a websocket and start its reader and writer.
async fn open_link(opts: &ConnectOptions, generation: u64, subs: Arc<Subs>) -> Result<Arc<Link>> {
    let connect_err = |detail: String| ClientError::Connect {
        url: super::redact_url(&opts.url),
        detail,
    };
    let mut request = opts
        .url
        .as_str()
        .into_client_request()
        .map_err(|e| connect_err(e.to_string()))?;
    let bearer = format!("Bearer {}", opts.token)
        .parse()
        .map_err(|_| connect_err("the token is not a valid header value".to_owned()))?;
    request.headers_mut().insert("authorization", bearer);
    let config = tokio_tungstenite::tungstenite::protocol::WebSocketConfig::default()
        .max_message_size(Some(MAX_MESSAGE_BYTES))
        .max_frame_size(Some(MAX_MESSAGE_BYTES));
    let (ws, _) = tokio_tungstenite::connect_async_with_config(request, Some(config), true)
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
    let (mut sink, mut stream) = ws.split();
    let (out, mut out_rx) = mpsc::channel::<Message>(OUTBOUND_FRAMES);
    let dead = CancellationToken::new();
    let why = Arc::new(Mutex::new(String::from("connection closed")));
    let close_code = Arc::new(std::sync::atomic::AtomicU16::new(0));
    let pending: Arc<Mutex<HashMap<i64, oneshot::Sender<Reply>>>> = Arc::default();
    {
        let (dead, why) = (dead.clone(), why.clone());
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
        let (dead, why, pending, out, close_code) = (
            dead.clone(),
            why.clone(),
            pending.clone(),
            out.clone(),
            close_code.clone(),
        );
        crate::task::start("client-ws-reader", async move {
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
                            Some(Ok(Message::Text(t))) => dispatch(t.as_str(), &pending, &subs).await,
                            Some(Ok(Message::Binary(b))) => {
                                if let Ok(t) = std::str::from_utf8(&b) {
                                    dispatch(t, &pending, &subs).await;
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
            let reason = why.lock().clone();
            for (_, tx) in pending.lock().drain() {
                let _ = tx.send(Err(ClientError::Disconnected(reason.clone())));
            }
            subs.lag_all();
        });
    }
    Ok(Arc::new(Link {
        generation,
        out,
        pending,
        dead,
        why,
        close_code,
    }))
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct InitializeResult {
    session_id: String,
    #[serde(default)]
    environment_info: Option<EnvInfo>,
}

#[derive(Deserialize)]
struct EnvInfo {
    #[serde(default)]
    cwd: Option<String>,
}

/// `file:///x` → `/x`; a plain path as is.
fn uri_to_path(uri: &str) -> String {
    match url::Url::parse(uri) {
        Ok(u) if u.scheme() == "file" => u
            .to_file_path()
            .map(|p| p.to_string_lossy().into_owned())
            .unwrap_or_else(|_| uri.to_owned()),
        _ => uri.to_owned(),
    }
}

fn path_to_uri(path: &str) -> Result<String> {
    url::Url::from_file_path(path)
        .map(String::from)
        .map_err(|_| ClientError::Usage(format!("`{path}` is not an absolute path")))
}

pub(super) struct WsClient {
    opts: ConnectOptions,
    session_id: String,
    root: String,
    link: Mutex<Arc<Link>>,
    reconnecting: tokio::sync::Mutex<()>,
    subs: Arc<Subs>,
    next_id: AtomicI64,
    prefix: String,
    counter: AtomicU64,
    /// The server has only the May 2026 revision: plain paths.
    plain_paths: bool,
    /// When a call was last answered.
    last_answer: Mutex<tokio::time::Instant>,
}

impl WsClient {
    pub(super) async fn connect(opts: ConnectOptions) -> Result<WsClient> {
        let subs = Arc::new(Subs::default());
        let next_id = AtomicI64::new(1);
        // A gateway over its limits (-32001) is asked again, a while later.
        let mut backoff = Backoff::new(opts.resume_within);
        let (link, init) = loop {
            let link = open_link(&opts, 0, subs.clone()).await?;
            match handshake(&link, &next_id, &opts, opts.resume_session.as_deref()).await {
                Ok(init) => break (link, init),
                Err(e) if is_overloaded(&e) && backoff.wait().await => link.dead.cancel(),
                Err(e) => return Err(e),
            }
        };
        // The client speaks the November 2026 revision: `file://` paths
        // (the first one fixes the session's revision), 128 + n exit
        // codes, the 80 s detach TTL. A server whose `initialize` carries
        // no environment is asked with a method only that revision has;
        // one without it (Codex 0.130.0's exec-server) gets plain paths.
        let (cwd, plain_paths) = match init.environment_info.and_then(|e| e.cwd) {
            Some(cwd) => (Some(cwd), false),
            None => {
                let info = link
                    .call(
                        next_id.fetch_add(1, Ordering::Relaxed),
                        "environment/info",
                        &Value::Null,
                    )
                    .await;
                match info {
                    Ok(raw) => (
                        serde_json::from_str::<EnvInfo>(raw.get())
                            .map_err(ClientError::protocol)?
                            .cwd,
                        false,
                    ),
                    Err(ClientError::Rpc { code: -32601, .. }) => (None, true),
                    Err(e) => return Err(e),
                }
            }
        };
        let root = cwd
            .map(|c| uri_to_path(&c))
            .unwrap_or_else(|| "/".to_owned());
        let mut opts = opts;
        opts.resume_session = Some(init.session_id.clone());
        Ok(WsClient {
            opts,
            session_id: init.session_id,
            root,
            link: Mutex::new(link),
            reconnecting: tokio::sync::Mutex::new(()),
            subs,
            next_id,
            prefix: unique_prefix(),
            counter: AtomicU64::new(0),
            plain_paths,
            last_answer: Mutex::new(tokio::time::Instant::now()),
        })
    }

    /// A path as the session's revision writes it.
    fn wire_path(&self, path: &str) -> Result<String> {
        if self.plain_paths {
            Ok(path.to_owned())
        } else {
            path_to_uri(path)
        }
    }

    pub(super) fn session_id(&self) -> &str {
        &self.session_id
    }

    pub(super) fn root(&self) -> &str {
        &self.root
    }

    fn unique(&self, kind: &str) -> String {
        format!(
            "{kind}-{}-{}",
            self.prefix,
            self.counter.fetch_add(1, Ordering::Relaxed)
        )
    }

    /// Replace a dead link with a resumed one (once, whoever asks first).
    async fn reconnect(&self, dead_generation: u64) -> Result<()> {
        let _one = self.reconnecting.lock().await;
        let dead = self.link.lock().clone();
        if dead.generation != dead_generation {
            return Ok(());
        }
        if dead.close_code.load(Ordering::Relaxed) == TAKEN_OVER {
            return Err(dead.disconnected());
        }
        // Measured from the last answer, so a link that keeps dying
        // right after each resume does not retry forever.
        let since = self.last_answer.lock().elapsed();
        let mut backoff = Backoff::new(self.opts.resume_within.saturating_sub(since));
        loop {
            let last = match self.resume_once(dead_generation + 1).await {
                Ok(link) => {
                    tracing::info!(session = %self.session_id, why = %dead.why.lock(), "connection lost; session resumed");
                    *self.link.lock() = link;
                    // Attachments re-read what they missed.
                    self.subs.lag_all();
                    return Ok(());
                }
                // The session is gone or someone else holds it: retrying
                // cannot help.
                Err(e) if !is_transient(&e) => return Err(e),
                Err(e) => e.to_string(),
            };
            if !backoff.wait().await {
                return Err(ClientError::Disconnected(format!(
                    "could not resume session {} within {}s: {last}",
                    self.session_id,
                    self.opts.resume_within.as_secs()
                )));
            }
        }
    }

    async fn resume_once(&self, generation: u64) -> Result<Arc<Link>> {
        let link = open_link(&self.opts, generation, self.subs.clone()).await?;
        handshake(&link, &self.next_id, &self.opts, Some(&self.session_id)).await?;
        Ok(link)
    }

    /// A call, retried on a resumed link when the connection drops; also
    /// says whether it was retried.
    async fn call_retrying(&self, method: &str, params: &Value) -> Result<(Box<RawValue>, bool)> {
        let mut retried = false;
        loop {
            let link = self.link.lock().clone();
            let id = self.next_id.fetch_add(1, Ordering::Relaxed);
            match link.call(id, method, params).await {
                Err(ClientError::Disconnected(_)) => {
                    self.reconnect(link.generation).await?;
                    retried = true;
                }
                Err(e) if is_overloaded(&e) => {
                    tokio::time::sleep(retry_after(&e)).await;
                }
                Ok(r) => {
                    *self.last_answer.lock() = tokio::time::Instant::now();
                    return Ok((r, retried));
                }
                // A start retried after a drop may find the first one done.
                Err(e) if retried && method == "process/start" && e.is_already_exists() => {
                    return Ok((
                        RawValue::from_string("{}".to_owned()).map_err(ClientError::protocol)?,
                        retried,
                    ));
                }
                Err(e) => return Err(e),
            }
        }
    }

    async fn call<T: serde::de::DeserializeOwned>(&self, method: &str, params: Value) -> Result<T> {
        let (raw, _) = self.call_retrying(method, &params).await?;
        serde_json::from_str(raw.get()).map_err(ClientError::protocol)
    }

    async fn call_unit(&self, method: &str, params: Value) -> Result<()> {
        self.call_retrying(method, &params).await.map(|_| ())
    }

    pub(super) async fn start(&self, spec: &ProcessSpec) -> Result<()> {
        let params = json!({
            "processId": spec.process_id,
            "argv": spec.argv,
            "cwd": self.wire_path(&spec.cwd)?,
            "env": spec.env,
            "tty": spec.tty,
            "pipeStdin": spec.pipe_stdin && !spec.tty,
            "envPolicy": {"inherit": "all", "ignoreDefaultExcludes": false,
                          "exclude": [], "set": {}, "includeOnly": []},
        });
        self.call_unit("process/start", params).await
    }

    /// Start a process with its attachment already listening: every
    /// notification is caught from seq 1, with no read to catch up.
    pub(super) async fn exec(&self, spec: &ProcessSpec) -> Result<WsAttachment<'_>> {
        let mut a = self.attach(&spec.process_id, 0)?;
        a.need_sync = false;
        a.next = 1;
        self.start(spec).await?;
        Ok(a)
    }

    pub(super) fn attach(&self, process_id: &str, after_seq: u64) -> Result<WsAttachment<'_>> {
        let (tx, rx) = mpsc::channel(ATTACH_BUFFER_EVENTS);
        let sub = Arc::new(Sub {
            tx,
            budget: Arc::new(Semaphore::new(ATTACH_BUFFER_BYTES)),
            lagged: AtomicBool::new(false),
            wake: Notify::new(),
        });
        let key = self.subs.next.fetch_add(1, Ordering::Relaxed);
        self.subs
            .map
            .lock()
            .entry(process_id.to_owned())
            .or_default()
            .push((key, sub.clone()));
        Ok(WsAttachment {
            client: self,
            process_id: process_id.to_owned(),
            key,
            sub,
            rx,
            ready: VecDeque::new(),
            cursor: after_seq,
            next: 0,
            need_sync: true,
            exited: false,
            closed: false,
            resyncs: 0,
        })
    }

    pub(super) async fn close(&self) -> Result<()> {
        let r = self
            .call_retrying(crate::protocol::methods::SESSION_CLOSE, &Value::Null)
            .await;
        self.link.lock().dead.cancel();
        r.map(|_| ())
    }

    pub(super) async fn write(&self, process_id: &str, data: &[u8]) -> Result<WriteStatus> {
        #[derive(Deserialize)]
        struct R {
            status: String,
        }
        let params = json!({"processId": process_id, "chunk": encode_b64(data),
                            "writeId": self.unique("w")});
        let r: R = self.call("process/write", params).await?;
        Ok(match r.status.as_str() {
            "accepted" => WriteStatus::Accepted,
            "unknownProcess" => WriteStatus::UnknownProcess,
            "stdinClosed" => WriteStatus::StdinClosed,
            "starting" => WriteStatus::Starting,
            s => return Err(ClientError::Protocol(format!("write status `{s}`"))),
        })
    }

    pub(super) async fn close_stdin(&self, process_id: &str) -> Result<()> {
        self.call_unit("process/closeStdin", json!({"processId": process_id}))
            .await
    }

    pub(super) async fn signal(&self, process_id: &str, signal: Signal) -> Result<()> {
        self.call_unit(
            "process/signal",
            json!({"processId": process_id, "signal": signal.name()}),
        )
        .await
    }

    pub(super) async fn resize(&self, process_id: &str, rows: u16, cols: u16) -> Result<()> {
        self.call_unit(
            "process/resize",
            json!({"processId": process_id, "rows": rows, "cols": cols}),
        )
        .await
    }

    pub(super) async fn terminate(&self, process_id: &str) -> Result<bool> {
        #[derive(Deserialize)]
        struct R {
            running: bool,
        }
        let r: R = self
            .call("process/terminate", json!({"processId": process_id}))
            .await?;
        Ok(r.running)
    }

    pub(super) async fn list(&self) -> Result<Vec<ProcessInfo>> {
        #[derive(Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct P {
            process_id: String,
            state: String,
            tty: bool,
            exit_code: Option<i32>,
            next_seq: u64,
        }
        #[derive(Deserialize)]
        struct R {
            processes: Vec<P>,
        }
        let r: R = self.call("process/list", Value::Null).await?;
        Ok(r.processes
            .into_iter()
            .map(|p| ProcessInfo {
                process_id: p.process_id,
                state: p.state,
                tty: p.tty,
                exit_code: p.exit_code,
                next_seq: p.next_seq,
            })
            .collect())
    }

    pub(super) async fn read_file_to<W: AsyncWrite + Unpin + Send>(
        &self,
        path: &str,
        sink: &mut W,
    ) -> Result<u64> {
        let handle = self.open_handle(path, "read").await?;
        let result = self.read_blocks(&handle, sink).await;
        self.close_handle(&handle, result).await
    }

    /// `fs/open` under a fresh handle id.
    async fn open_handle(&self, path: &str, mode: &str) -> Result<String> {
        let handle = self.unique("h");
        self.call_unit(
            "fs/open",
            json!({"handleId": handle, "path": self.wire_path(path)?, "mode": mode}),
        )
        .await?;
        Ok(handle)
    }

    /// `fs/close` whatever `result` is; `result`'s error first.
    async fn close_handle(&self, handle: &str, result: Result<u64>) -> Result<u64> {
        let closed = self
            .call_unit("fs/close", json!({"handleId": handle}))
            .await;
        let n = result?;
        closed?;
        Ok(n)
    }

    async fn read_blocks<W: AsyncWrite + Unpin + Send>(
        &self,
        handle: &str,
        sink: &mut W,
    ) -> Result<u64> {
        #[derive(Deserialize)]
        struct Block {
            chunk: String,
            eof: bool,
        }
        let read = |offset: u64| async move {
            let b: Block = self
                .call(
                    "fs/readBlock",
                    json!({"handleId": handle, "offset": offset, "len": FILE_BLOCK_BYTES}),
                )
                .await?;
            Ok::<_, ClientError>((decode_b64(&b.chunk)?, b.eof))
        };
        let mut inflight = FuturesOrdered::new();
        let mut offset = 0u64;
        let mut total = 0u64;
        let mut eof = false;
        loop {
            while !eof && inflight.len() < FILE_BLOCKS_IN_FLIGHT {
                inflight.push_back(read(offset));
                offset += FILE_BLOCK_BYTES as u64;
            }
            let Some(r) = inflight.next().await else {
                break;
            };
            let (data, at_end) = r?;
            if data.len() > FILE_BLOCK_BYTES {
                return Err(ClientError::Protocol(format!(
                    "a block of {} bytes where at most {FILE_BLOCK_BYTES} were asked",
                    data.len()
                )));
            }
            if eof {
                continue;
            }
            sink.write_all(&data).await?;
            total += data.len() as u64;
            // A short block is the end too (the file shrank meanwhile).
            if at_end || data.len() < FILE_BLOCK_BYTES {
                eof = true;
            }
        }
        sink.flush().await?;
        Ok(total)
    }

    pub(super) async fn write_file_from<R: AsyncRead + Unpin + Send>(
        &self,
        path: &str,
        source: &mut R,
    ) -> Result<u64> {
        let handle = self.open_handle(path, "replace").await?;
        let result = self.write_blocks(&handle, source).await;
        self.close_handle(&handle, result).await
    }

    async fn write_blocks<R: AsyncRead + Unpin + Send>(
        &self,
        handle: &str,
        source: &mut R,
    ) -> Result<u64> {
        let write = |offset: u64, chunk: String| async move {
            self.call_unit(
                "fs/writeBlock",
                json!({"handleId": handle, "offset": offset, "chunk": chunk}),
            )
            .await
        };
        let mut inflight = FuturesOrdered::new();
        let mut offset = 0u64;
        let mut buf = vec![0u8; FILE_BLOCK_BYTES];
        let mut done = false;
        loop {
            while !done && inflight.len() < FILE_BLOCKS_IN_FLIGHT {
                let n = read_full(source, &mut buf).await?;
                if n == 0 {
                    done = true;
                    break;
                }
                inflight.push_back(write(offset, encode_b64(&buf[..n])));
                offset += n as u64;
                if n < buf.len() {
                    done = true;
                }
            }
            match inflight.next().await {
                Some(r) => r?,
                None => break,
            }
        }
        Ok(offset)
    }

    pub(super) async fn create_directory(&self, path: &str, recursive: bool) -> Result<()> {
        self.call_unit(
            "fs/createDirectory",
            json!({"path": self.wire_path(path)?, "recursive": recursive}),
        )
        .await
    }

    pub(super) async fn metadata(&self, path: &str) -> Result<Metadata> {
        #[derive(Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct M {
            is_directory: bool,
            is_file: bool,
            is_symlink: bool,
            #[serde(default)]
            size: u64,
            #[serde(default)]
            modified_at_ms: i64,
        }
        let m: M = self
            .call("fs/getMetadata", json!({"path": self.wire_path(path)?}))
            .await?;
        Ok(Metadata {
            is_directory: m.is_directory,
            is_file: m.is_file,
            is_symlink: m.is_symlink,
            size: m.size,
            modified_at_ms: m.modified_at_ms,
        })
    }

    pub(super) async fn read_directory(&self, path: &str) -> Result<Vec<DirEntry>> {
        #[derive(Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct E {
            file_name: String,
            is_directory: bool,
            is_file: bool,
        }
        #[derive(Deserialize)]
        struct R {
            entries: Vec<E>,
        }
        let r: R = self
            .call("fs/readDirectory", json!({"path": self.wire_path(path)?}))
            .await?;
        Ok(r.entries
            .into_iter()
            .map(|e| DirEntry {
                file_name: e.file_name,
                is_directory: e.is_directory,
                is_file: e.is_file,
            })
            .collect())
    }

    pub(super) async fn remove(&self, path: &str, recursive: bool, force: bool) -> Result<()> {
        self.call_unit(
            "fs/remove",
            json!({"path": self.wire_path(path)?, "recursive": recursive, "force": force}),
        )
        .await
    }
}

impl Drop for WsClient {
    fn drop(&mut self) {
        self.link.lock().dead.cancel();
    }
}

/// Read until `buf` is full or the source ends; the bytes read.
async fn read_full<R: AsyncRead + Unpin>(source: &mut R, buf: &mut [u8]) -> Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        let got = source.read(&mut buf[n..]).await?;
        if got == 0 {
            break;
        }
        n += got;
    }
    Ok(n)
}

/// `initialize` (resuming `resume`), then `initialized`.
async fn handshake(
    link: &Link,
    next_id: &AtomicI64,
    opts: &ConnectOptions,
    resume: Option<&str>,
) -> Result<InitializeResult> {
    let mut params = json!({"clientName": opts.client_name});
    if let Some(s) = resume {
        params["resumeSessionId"] = json!(s);
    }
    let r = link
        .call(
            next_id.fetch_add(1, Ordering::Relaxed),
            "initialize",
            &params,
        )
        .await?;
    let init: InitializeResult = serde_json::from_str(r.get()).map_err(ClientError::protocol)?;
    link.out
        .send(Message::text(r#"{"method":"initialized"}"#))
        .await
        .map_err(|_| link.disconnected())?;
    Ok(init)
}

/// A resume refused because the old connection has not let go yet.
fn is_transient(e: &ClientError) -> bool {
    match e {
        ClientError::Rpc { message, .. } => {
            message.contains("already attached to another connection") || is_overloaded(e)
        }
        // A refused token will be refused again.
        ClientError::Connect { detail, .. } => {
            !(detail.starts_with("401") || detail.starts_with("403"))
        }
        _ => true,
    }
}

fn retry_after(e: &ClientError) -> Duration {
    let ms = match e {
        ClientError::Rpc { data: Some(d), .. } => d.get("retryAfterMs").and_then(Value::as_u64),
        _ => None,
    };
    Duration::from_millis(ms.unwrap_or(100).clamp(10, 5_000))
}

/// A process's events over websocket: live notifications, checked against
/// the seq they should carry; any gap (a dropped connection, a full
/// mailbox) is filled by `process/read` from the cursor.
pub(super) struct WsAttachment<'c> {
    client: &'c WsClient,
    process_id: String,
    key: u64,
    sub: Arc<Sub>,
    rx: mpsc::Receiver<(Note, OwnedSemaphorePermit)>,
    ready: VecDeque<Event>,
    /// The last output seq yielded.
    cursor: u64,
    /// The seq the next notification should carry.
    next: u64,
    need_sync: bool,
    exited: bool,
    closed: bool,
    resyncs: u64,
}

impl WsAttachment<'_> {
    pub(super) fn cursor(&self) -> u64 {
        self.cursor
    }

    pub(super) fn resyncs(&self) -> u64 {
        self.resyncs
    }

    pub(super) async fn next(&mut self) -> Result<Option<Event>> {
        loop {
            if let Some(e) = self.ready.pop_front() {
                return Ok(Some(e));
            }
            if self.closed {
                return Ok(None);
            }
            if self.sub.lagged.swap(false, Ordering::AcqRel) {
                // The link died: what reached the mailbox first is taken
                // before re-reading, so none of it counts as lost.
                while let Ok((n, _permit)) = self.rx.try_recv() {
                    self.on_note(n);
                }
                self.need_sync = true;
                continue;
            }
            if self.need_sync {
                self.need_sync = false;
                self.sync().await?;
                continue;
            }
            tokio::select! {
                note = self.rx.recv() => match note {
                    Some((n, _permit)) => self.on_note(n),
                    None => self.need_sync = true,
                },
                () = self.sub.wake.notified() => {}
            }
        }
    }

    fn on_note(&mut self, note: Note) {
        match note {
            Note::Output { seq, stream, data } => {
                if seq < self.next || seq <= self.cursor {
                    return;
                }
                if seq > self.next {
                    self.need_sync = true;
                    return;
                }
                self.cursor = seq;
                self.next = seq + 1;
                self.ready.push_back(Event::Output {
                    seq,
                    stream,
                    data: data.into(),
                });
            }
            Note::Exited { seq, code } => {
                if seq > self.next {
                    self.need_sync = true;
                    return;
                }
                self.next = self.next.max(seq + 1);
                if !self.exited {
                    self.exited = true;
                    self.ready.push_back(Event::Exited { code, signal: None });
                }
            }
            Note::Closed { seq } => {
                if seq > self.next || !self.exited {
                    self.need_sync = true;
                    return;
                }
                self.next = self.next.max(seq + 1);
                self.closed = true;
            }
        }
    }

    /// Read what the process retains after the cursor.
    async fn sync(&mut self) -> Result<()> {
        #[derive(Deserialize)]
        struct Chunk {
            seq: u64,
            stream: String,
            chunk: String,
        }
        #[derive(Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct Read {
            chunks: Vec<Chunk>,
            next_seq: u64,
            exited: bool,
            exit_code: Option<i32>,
            closed: bool,
        }
        self.resyncs += 1;
        // The mailbox is drained while the read is in flight: its reply
        // comes through the same link reader that waits for room in the
        // mailbox, so a full mailbox left alone would hold the reply back
        // for good. What arrives meanwhile is sorted out after the read.
        let mut meanwhile = Vec::new();
        let r: Read = loop {
            let call = self.client.call(
                "process/read",
                json!({"processId": self.process_id, "afterSeq": self.cursor}),
            );
            tokio::pin!(call);
            let reply = loop {
                tokio::select! {
                    r = &mut call => break r,
                    Some((n, _permit)) = self.rx.recv() => meanwhile.push(n),
                }
            };
            match reply {
                Err(ClientError::Rpc { message, .. }) if message.ends_with("is starting") => {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                r => break r?,
            }
        };
        // The gateway keeps the newest 1 MiB of a process's output: after a
        // long enough absence the read starts past the cursor. Only an
        // exit may sit between two outputs.
        if let Some(first) = r.chunks.iter().find(|c| c.seq > self.cursor) {
            let slack = u64::from(r.exited || self.exited);
            let missing = first.seq.saturating_sub(self.cursor + 1 + slack);
            if missing > 0 {
                self.ready.push_back(Event::OutputLost { chunks: missing });
            }
        }
        for c in r.chunks {
            if c.seq <= self.cursor {
                continue;
            }
            self.cursor = c.seq;
            self.ready.push_back(Event::Output {
                seq: c.seq,
                stream: stream_of(Some(&c.stream)),
                data: decode_b64(&c.chunk)?.into(),
            });
        }
        self.next = self.next.max(r.next_seq);
        if r.exited && !self.exited {
            self.exited = true;
            self.ready.push_back(Event::Exited {
                code: r.exit_code.unwrap_or(-1),
                signal: None,
            });
        }
        if r.closed {
            self.closed = true;
        }
        // Notifications that came during the read: those it covered are
        // skipped by seq, a gap after it asks for another read.
        for n in meanwhile {
            self.on_note(n);
        }
        Ok(())
    }
}

impl Drop for WsAttachment<'_> {
    fn drop(&mut self) {
        // A reader waiting for room here gives up.
        self.sub.budget.close();
        let mut map = self.client.subs.map.lock();
        if let Some(subs) = map.get_mut(&self.process_id) {
            subs.retain(|(k, _)| *k != self.key);
            if subs.is_empty() {
                map.remove(&self.process_id);
            }
        }
    }
}
