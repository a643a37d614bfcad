//! One JSON-RPC connection over a websocket, whoever dialled (a client
//! through the listener in `transport::ws`, or a registry this binary
//! dialled as a remote executor): messages into the connection's frames,
//! its outbound queue into batched, fragmented writes, pings bounded, and
//! the close code that says how it ended. A client's data frames are
//! written by [`direct`] (no copy into tungstenite's buffer); a link this
//! binary dialled, whose frames must be masked, is written by tungstenite.

mod direct;

use direct::DirectWriter;
pub(super) use direct::split as split_direct;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::{SinkExt as _, StreamExt as _};
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::{CloseFrame, Role, WebSocketConfig};
use tokio_tungstenite::tungstenite::{Error as WsError, Message};
use tokio_util::sync::CancellationToken;

use super::authenticate::Caller;
use super::connection::{ConnMeta, FrameSource, InFrame, OnClose, Relay, serve_connection};
use super::inbound::InboundMeter;
use crate::gateway::Gateway;
use crate::outbound::{OutFrame, Outbound, QueuedText};

/// Outbound frames written before one flush.
const WRITE_BATCH: usize = 32;

/// The server side of an upgraded connection (`io`), messages up to
/// `limit` bytes.
pub(super) async fn server_websocket<S>(
    io: S,
    limit: usize,
    max_write_buffer: usize,
) -> WebSocketStream<S>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let config = WebSocketConfig::default()
        .max_message_size(Some(limit))
        .max_frame_size(Some(limit))
        .read_buffer_size(WS_READ_BUFFER_BYTES)
        .write_buffer_size(WS_WRITE_BUFFER_BYTES)
        .max_write_buffer_size(max_write_buffer);
    WebSocketStream::from_raw_socket(io, Role::Server, Some(config)).await
}

/// Bytes read from the socket per read call when no frame is being
/// assembled. Small keeps idle sessions cheap: tungstenite keeps this much
/// per connection (at 8 KiB, a third of an idle session's 26 KiB; at 2 KiB,
/// a fifth of 11 KiB). A frame's header reserves room for its whole
/// payload, which is then read in as few calls as the socket allows.
const WS_READ_BUFFER_BYTES: usize = 512;
/// Bytes of frames gathered before tungstenite writes to the socket.
pub(super) const WS_WRITE_BUFFER_BYTES: usize = 64 * 1024;
/// Bytes queued in tungstenite beyond which a write fails and the
/// connection ends: room for one fragment and what a peer that sends
/// pings and never reads makes us queue in pongs (it is cut off here).
/// Where tungstenite writes data frames (a link this binary dialled, the
/// port-forward door); a client's connection queues its control frames in
/// [`direct`]'s smaller bound.
pub(super) const WS_MAX_WRITE_BUFFER_BYTES: usize = 4 * 1024 * 1024;

/// Ping and pong frames a client may send per second (on average over
/// [`CONTROL_WINDOW`]) before the connection is closed.
const MAX_CONTROL_FRAMES_PER_SECOND: u32 = 50;
const CONTROL_WINDOW: Duration = Duration::from_secs(10);

/// Counts control frames in fixed windows.
#[derive(Default)]
struct ControlBudget {
    window_start: Option<tokio::time::Instant>,
    count: u32,
}

impl ControlBudget {
    /// Count one; true once the window's budget is spent.
    fn note(&mut self, now: tokio::time::Instant) -> bool {
        match self.window_start {
            Some(start) if now.duration_since(start) < CONTROL_WINDOW => self.count += 1,
            _ => {
                self.window_start = Some(now);
                self.count = 1;
            }
        }
        let limit = MAX_CONTROL_FRAMES_PER_SECOND * CONTROL_WINDOW.as_secs() as u32;
        self.count > limit
    }
}

/// Feed one text message, fragmented when large (cut where the direct
/// writer cuts: at UTF-8 boundaries).
async fn feed_text<S>(sink: &mut S, text: String) -> Result<(), WsError>
where
    S: futures_util::Sink<Message, Error = WsError> + Unpin,
{
    use tokio_tungstenite::tungstenite::protocol::frame::Frame;
    use tokio_tungstenite::tungstenite::protocol::frame::coding::{Data, OpCode};
    if text.len() <= direct::FRAGMENT_BYTES {
        return sink.feed(Message::text(text)).await;
    }
    let cuts: Vec<(usize, usize)> = direct::cuts(&text).collect();
    let bytes = Bytes::from(text.into_bytes());
    for (a, b) in cuts {
        let opcode = OpCode::Data(if a == 0 { Data::Text } else { Data::Continue });
        let fin = b == bytes.len();
        sink.feed(Message::Frame(Frame::message(
            bytes.slice(a..b),
            opcode,
            fin,
        )))
        .await?;
    }
    Ok(())
}

/// No direct writer: tungstenite writes every frame (a link this binary
/// dialled, whose frames must be masked).
pub(in crate::transport) const TUNGSTENITE_WRITES: Option<DirectWriter<tokio::io::DuplexStream>> =
    None;

/// How long a connection whose client may still be sending (its read side
/// ended on an error) is drained after its close frame, so the close
/// reaches the client instead of a reset ([`DirectWriter::linger`]).
const CLOSE_LINGER: Duration = Duration::from_secs(2);
/// At most this many times the message limit is drained then (the rest of
/// an oversized message and what followed it), at least
/// [`CLOSE_LINGER_MIN_BYTES`]: a client that sends on past it is reset.
const CLOSE_LINGER_MESSAGES: usize = 4;
const CLOSE_LINGER_MIN_BYTES: usize = 1024 * 1024;

/// Serve one JSON-RPC connection over `ws` (the server role, whoever
/// dialled) for `caller`: data frames written by `direct` when `ws` reads
/// from the side [`split_direct`] made (a client's connection), else by
/// tungstenite ([`TUNGSTENITE_WRITES`]); `meter` charges what it reads.
pub(in crate::transport) fn run<S, W>(
    ws: WebSocketStream<S>,
    direct: Option<DirectWriter<W>>,
    gw: Arc<Gateway>,
    peer: SocketAddr,
    caller: Caller,
    relay: Option<Arc<dyn Relay>>,
    meter: Option<InboundMeter>,
) -> impl std::future::Future<Output = ()> + Send
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    W: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + 'static,
{
    // Split before the future is made: the stream's few hundred bytes would
    // otherwise keep a slot in it for the connection's whole life.
    let (sink, stream) = ws.split();
    run_halves(sink, stream, direct, gw, peer, caller, relay, meter)
}

#[allow(clippy::too_many_arguments)]
async fn run_halves<S, W>(
    mut sink: futures_util::stream::SplitSink<WebSocketStream<S>, Message>,
    stream: futures_util::stream::SplitStream<WebSocketStream<S>>,
    mut direct: Option<DirectWriter<W>>,
    gw: Arc<Gateway>,
    peer: SocketAddr,
    caller: Caller,
    relay: Option<Arc<dyn Relay>>,
    meter: Option<InboundMeter>,
) where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    W: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + 'static,
{
    let (out, mut rx) = Outbound::channel(caller.tenant().outbound.clone());
    let done = CancellationToken::new();
    // Cancelled once the read side is gone (the client's close reply read,
    // or the connection loop ended).
    let read_ended = CancellationToken::new();
    let slow_client_timeout = gw.settings.slow_client_timeout;
    let writer_gw = gw.clone();
    let writer_read_ended = read_ended.clone();
    // How the read side ended, when it says more than "closed".
    let ended_by = Arc::new(std::sync::OnceLock::<(u16, &'static str)>::new());
    let writer_ended_by = ended_by.clone();
    let writer_meter = meter.clone();
    let max_message_bytes = gw.settings.max_message_bytes;

    // Writer: batches whatever is queued, flushes once, and gives up on a
    // client that stalls a write past the slow-client timeout.
    let writer_done = done.clone();
    let control = direct.as_ref().map(DirectWriter::control);
    let writer = crate::task::start("ws-writer", async move {
        loop {
            let first = tokio::select! {
                f = rx.recv() => f,
                () = writer_done.cancelled() => None,
                // A pong (or the close reply) tungstenite wrote while
                // reading: sent within the slow-client bound.
                () = control_queued(control.as_deref()) => {
                    let Some(d) = direct.as_mut() else { continue };
                    match d.send_control(slow_client_timeout).await {
                        Ok(_) => continue,
                        Err(e) => ended(peer, &e),
                    }
                    break;
                }
            };
            let Some(first) = first else { break };
            // Made per batch: an idle connection's writer keeps no room.
            let mut batch = Vec::with_capacity(WRITE_BATCH.min(1 + rx.len()));
            batch.push(first);
            while batch.len() < WRITE_BATCH {
                match rx.try_recv() {
                    Some(f) => batch.push(f),
                    None => break,
                }
            }
            let write = async {
                let mut close = None;
                // Reservations are released once their frames are flushed
                // to the socket (not when copied into the write buffer).
                let mut texts = Vec::with_capacity(batch.len());
                for frame in batch.drain(..) {
                    match frame {
                        OutFrame::Text(queued) => texts.push(*queued),
                        OutFrame::Close(c) => {
                            close = Some(CloseFrame {
                                code: CloseCode::from(c.code),
                                reason: c.reason.into(),
                            });
                            break;
                        }
                    }
                }
                match direct.as_mut() {
                    // Bounded by the client's progress, not the whole.
                    Some(d) => d.write_texts(&texts, slow_client_timeout).await?,
                    None => {
                        let tungstenite = async {
                            let mut written = Vec::with_capacity(texts.len());
                            for QueuedText { text, held } in texts.drain(..) {
                                feed_text(&mut sink, text).await?;
                                written.push(held);
                            }
                            sink.flush().await
                        };
                        match tokio::time::timeout(slow_client_timeout, tungstenite).await {
                            Ok(r) => r?,
                            Err(_) => return Err(stopped_reading().into()),
                        }
                    }
                }
                drop(texts);
                Ok::<_, WsError>(close)
            };
            // Boxed: a batch's write state only exists while it is
            // written, not in every idle connection's writer.
            match Box::pin(write).await {
                Ok(None) => {}
                Ok(Some(close)) => {
                    // Boxed for the same reason.
                    Box::pin(async {
                        let sent = tokio::time::timeout(Duration::from_secs(1), async {
                            sink.send(Message::Close(Some(close))).await?;
                            if let Some(d) = direct.as_mut() {
                                d.send_control(slow_client_timeout).await?;
                            }
                            Ok::<_, WsError>(())
                        })
                        .await;
                        // The queue stays open until the client answers: its
                        // reply proves it read every frame before the close
                        // (a draining gateway waits for that, not for its
                        // grace), within the slow-client bound, and never
                        // past the stop.
                        if matches!(sent, Ok(Ok(()))) {
                            tokio::select! {
                                () = writer_read_ended.cancelled() => {}
                                () = writer_gw.stopped() => {}
                                () = tokio::time::sleep(slow_client_timeout) => {}
                            }
                        }
                    })
                    .await;
                    break;
                }
                Err(WsError::Io(e)) => {
                    ended(peer, &e);
                    break;
                }
                Err(e) => {
                    tracing::debug!(%peer, error = %e, "websocket write failed");
                    break;
                }
            }
        }
        writer_done.cancel();
        let _ = Box::pin(tokio::time::timeout(Duration::from_secs(1), async {
            sink.close().await?;
            if let Some(d) = direct.as_mut() {
                d.send_control(slow_client_timeout).await?;
            }
            Ok::<_, WsError>(())
        }))
        .await;
        // A client cut off mid-message may still be sending it. The read
        // half is parked once tungstenite's stream is gone: its sink half
        // goes here, its stream half went with the connection's loop.
        drop(sink);
        if let (Some(_), Some(d)) = (writer_ended_by.get(), direct.as_mut()) {
            let release = || {
                if let Some(m) = &writer_meter {
                    drop(m.take());
                }
            };
            let most = max_message_bytes
                .saturating_mul(CLOSE_LINGER_MESSAGES)
                .max(CLOSE_LINGER_MIN_BYTES);
            Box::pin(d.linger(CLOSE_LINGER, most, release)).await;
        }
    });

    // Reader: frames → InFrame, read as the connection asks for them (a
    // stream, not a task and a channel: those were a third of an idle
    // session's memory); ping/pong are answered by tungstenite.
    let reader = Reader {
        stream,
        meter,
        pings: ControlBudget::default(),
        done: done.clone(),
        ended_by: ended_by.clone(),
        message_timeout: gw.settings.inbound_message_timeout,
        peer,
        finished: false,
    };
    let inbound = futures_util::stream::unfold(reader, |mut r| async move {
        let frame = r.next_frame().await?;
        Some((frame, r))
    })
    .boxed();

    let meta = ConnMeta {
        source: FrameSource::Websocket(peer),
        on_close: OnClose::Detach,
        caller: Ok(caller),
        relay,
    };
    serve_connection(inbound, out.clone(), gw, meta).await;
    read_ended.cancel();
    // A too-large or unfinished message, a broken protocol or a ping flood
    // ended the read side: say so (1009, 1008, 1002, 1007) before closing.
    match ended_by.get() {
        Some(&(code, reason)) => out.close(code, reason).await,
        None => out.close(1000, "").await,
    }
    drop(out);
    // Give queued responses a moment to drain (and a client cut off
    // mid-message its linger), then stop both halves.
    let _ = tokio::time::timeout(Duration::from_secs(2) + CLOSE_LINGER, writer).await;
    done.cancel();
}

/// The error of a write the client did not take in time.
fn stopped_reading() -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::TimedOut, "the client stopped reading")
}

/// Log why the writer gave up on a client.
fn ended(peer: SocketAddr, e: &std::io::Error) {
    if e.kind() == std::io::ErrorKind::TimedOut {
        tracing::info!(%peer, "closing a client that stopped reading");
    } else {
        tracing::debug!(%peer, error = %e, "websocket write failed");
    }
}

/// Until tungstenite queued a control frame (never without the queue).
async fn control_queued(control: Option<&direct::Control>) {
    match control {
        Some(c) => c.queued().await,
        None => std::future::pending().await,
    }
}

/// The read half of a connection, frame by frame.
struct Reader<S> {
    stream: S,
    meter: Option<InboundMeter>,
    pings: ControlBudget,
    /// Cancelled when the writer ends: nothing more is read.
    done: CancellationToken,
    /// How the read side ended, when it says more than "closed".
    ended_by: Arc<std::sync::OnceLock<(u16, &'static str)>>,
    message_timeout: Duration,
    peer: SocketAddr,
    finished: bool,
}

impl<S> Reader<S>
where
    S: futures_util::Stream<Item = Result<Message, WsError>> + Unpin,
{
    /// The next frame for the connection; `None` once the read side ended.
    async fn next_frame(&mut self) -> Option<InFrame> {
        let peer = self.peer;
        while !self.finished {
            // A message being assembled must complete in time; between
            // messages the check only comes round once per timeout.
            let check_at = self
                .meter
                .as_ref()
                .and_then(InboundMeter::partial_since)
                .unwrap_or_else(tokio::time::Instant::now)
                + self.message_timeout;
            let msg = tokio::select! {
                m = self.stream.next() => m,
                () = self.done.cancelled() => break,
                () = tokio::time::sleep_until(check_at) => {
                    let late = self
                        .meter
                        .as_ref()
                        .and_then(InboundMeter::partial_since)
                        .is_some_and(|since| since.elapsed() >= self.message_timeout);
                    if late {
                        tracing::info!(%peer, "closing a client whose message did not complete in time");
                        let _ = self.ended_by.set((1008, "message not completed in time"));
                        break;
                    }
                    continue;
                }
            };
            let charge = || {
                self.meter
                    .as_ref()
                    .map(InboundMeter::take)
                    .unwrap_or_default()
            };
            return Some(match msg {
                None | Some(Ok(Message::Close(_))) => break,
                Some(Ok(Message::Text(t))) => InFrame::Text(t.as_str().to_owned(), charge()),
                Some(Ok(Message::Binary(b))) => match String::from_utf8(b.to_vec()) {
                    Ok(t) => InFrame::Text(t, charge()),
                    // Not JSON: let the decoder produce the malformed answer.
                    Err(_) => InFrame::Text(String::from_utf8_lossy(&b).into_owned(), charge()),
                },
                Some(Ok(Message::Ping(p) | Message::Pong(p))) => {
                    // Only the frame's own bytes: a message whose fragments
                    // it came between keeps its charge and its deadline.
                    if let Some(m) = &self.meter {
                        m.control_frame(p.len());
                    }
                    // Each ping costs a pong; a client may keep a
                    // connection alive with a few, not flood with them.
                    if self.pings.note(tokio::time::Instant::now()) {
                        tracing::info!(%peer, "closing a client that floods pings");
                        let _ = self.ended_by.set((1008, "too many control frames"));
                        break;
                    }
                    continue;
                }
                Some(Ok(_)) => continue,
                Some(Err(WsError::Capacity(e))) => {
                    let _ = self.ended_by.set((1009, "message too big"));
                    self.finished = true;
                    InFrame::TooLarge(e.to_string())
                }
                Some(Err(e)) => {
                    tracing::debug!(%peer, error = %e, "websocket read failed");
                    // Say why where the client broke the protocol (RFC 6455
                    // §7.4.1), not a normal close.
                    match e {
                        WsError::Protocol(_) => {
                            let _ = self.ended_by.set((1002, "protocol error"));
                        }
                        WsError::Utf8(_) => {
                            let _ = self.ended_by.set((1007, "invalid UTF-8"));
                        }
                        _ => {}
                    }
                    break;
                }
            });
        }
        self.finished = true;
        None
    }
}
