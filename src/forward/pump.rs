//! A forward's bytes, both ways, between a websocket and the TCP
//! connection inside the tenant's namespace.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use futures_util::{SinkExt as _, StreamExt as _};
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _};
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;

use super::{IDLE_TIMEOUT, MAX_CHUNK_BYTES};

/// What a forward moved: bytes to the upstream server, bytes from it,
/// and why it ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Moved {
    pub up: u64,
    pub down: u64,
    pub ended: &'static str,
}

/// When a forward last moved a byte either way, to end it after
/// [`IDLE_TIMEOUT`] without one.
pub struct Activity {
    start: tokio::time::Instant,
    /// Milliseconds from `start` to the last byte moved.
    last: AtomicU64,
}

impl Activity {
    pub fn new() -> Activity {
        Activity {
            start: tokio::time::Instant::now(),
            last: AtomicU64::new(0),
        }
    }

    /// A byte moved now.
    pub fn touch(&self) {
        let ms = u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last.store(ms, Ordering::Relaxed);
    }

    /// Resolves once nothing has moved for [`IDLE_TIMEOUT`].
    pub async fn idle(&self) {
        loop {
            let since = u64::try_from(self.start.elapsed().as_millis())
                .unwrap_or(u64::MAX)
                .saturating_sub(self.last.load(Ordering::Relaxed));
            let limit = u64::try_from(IDLE_TIMEOUT.as_millis()).unwrap_or(u64::MAX);
            if since >= limit {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(limit - since)).await;
        }
    }
}

impl Default for Activity {
    fn default() -> Activity {
        Activity::new()
    }
}

/// Carry bytes between `ws` (binary messages) and `tcp` until either side
/// ends, nothing moves for [`IDLE_TIMEOUT`], a side holds a write back for
/// `stall` (it stopped reading), or `stop` resolves (the session ended, the
/// token expired: its close code and reason). Each direction runs on its
/// own, so a side that stops reading holds back only what is sent to it.
/// The close code says how it ended: 1000 the server closed, 1001 idle,
/// 1002 a protocol error, 1003 a text message, 1008 a side stopped reading,
/// 1009 a message over [`MAX_CHUNK_BYTES`], 1011 the server's connection
/// failed (a reset: what was cut off is not complete), or `stop`'s.
pub async fn serve<S, T>(
    ws: WebSocketStream<S>,
    tcp: T,
    stall: std::time::Duration,
    stop: impl std::future::Future<Output = (u16, &'static str)>,
) -> Moved
where
    S: AsyncRead + AsyncWrite + Unpin + Send,
    T: AsyncRead + AsyncWrite + Send,
{
    use tokio_tungstenite::tungstenite::Error as WsError;
    let (sink, mut stream) = ws.split();
    let sink = tokio::sync::Mutex::new(sink);
    let (mut from_server, mut to_server) = tokio::io::split(tcp);
    let activity = Activity::new();
    let touch = || activity.touch();
    let up = Arc::new(AtomicU64::new(0));
    let down = Arc::new(AtomicU64::new(0));
    let upward = async {
        while let Some(m) = stream.next().await {
            match m {
                Ok(Message::Binary(b)) => {
                    match tokio::time::timeout(stall, to_server.write_all(&b)).await {
                        Ok(Ok(())) => {}
                        Ok(Err(_)) => return (1011, "the server's connection failed"),
                        Err(_) => return (1008, "the server stopped reading"),
                    }
                    up.fetch_add(b.len() as u64, Ordering::Relaxed);
                    touch();
                }
                Ok(Message::Text(_)) => return (1003, "binary messages only"),
                Ok(Message::Close(_)) => return (1000, "the client closed"),
                Ok(_) => {}
                Err(WsError::Capacity(_)) => {
                    return (1009, "a message over 64 KiB");
                }
                Err(WsError::Protocol(_)) => return (1002, "a websocket protocol error"),
                Err(_) => return (1000, "the client's connection failed"),
            }
        }
        (1000, "the client's connection ended")
    };
    let downward = async {
        let mut buf = vec![0u8; MAX_CHUNK_BYTES];
        loop {
            match from_server.read(&mut buf).await {
                Ok(0) => return (1000, "the server closed the connection"),
                Ok(n) => {
                    let chunk = Bytes::copy_from_slice(&buf[..n]);
                    let sent = async { sink.lock().await.send(Message::Binary(chunk)).await };
                    match tokio::time::timeout(stall, sent).await {
                        Ok(Ok(())) => {}
                        Ok(Err(_)) => return (1000, "the client's connection failed"),
                        Err(_) => return (1008, "the client stopped reading"),
                    }
                    down.fetch_add(n as u64, Ordering::Relaxed);
                    touch();
                }
                Err(_) => return (1011, "the server's connection failed"),
            }
        }
    };
    let idle = async {
        activity.idle().await;
        (1001, "idle")
    };
    // `stop` first: a session's end is signalled before its processes are
    // killed, so it, not the server's close it causes, says how this ended.
    let (code, ended) = tokio::select! {
        biased;
        why = stop => why,
        why = upward => why,
        why = downward => why,
        why = idle => why,
    };
    // The client learns why, but for the close it began itself.
    if ended != "the client closed" {
        // A stalled client may never take the close: not waited for past
        // `stall`.
        let close = async {
            let mut sink = sink.lock().await;
            let _ = sink
                .send(Message::Close(Some(CloseFrame {
                    code: CloseCode::from(code),
                    reason: ended.into(),
                })))
                .await;
            let _ = sink.close().await;
        };
        let _ = tokio::time::timeout(stall, close).await;
    }
    let _ = to_server.shutdown().await;
    Moved {
        up: up.load(Ordering::Relaxed),
        down: down.load(Ordering::Relaxed),
        ended,
    }
}
