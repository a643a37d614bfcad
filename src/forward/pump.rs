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

/// Carry bytes between `ws` (binary messages) and `tcp` until either side
/// ends or nothing moves for [`IDLE_TIMEOUT`]. Each direction runs on its
/// own, so a side that stops reading holds back only what is sent to it
/// (TCP's flow control, then the websocket's); `ended` (the session's end)
/// ends it too. The websocket is closed with 1000 when the upstream server
/// closes, 1001 when idle or when the session ended, 1003 for a text
/// message.
pub async fn serve<S>(
    ws: WebSocketStream<S>,
    tcp: tokio::net::TcpStream,
    ended: tokio_util::sync::CancellationToken,
) -> Moved
where
    S: AsyncRead + AsyncWrite + Unpin + Send,
{
    let (sink, mut stream) = ws.split();
    let sink = tokio::sync::Mutex::new(sink);
    let (mut from_server, mut to_server) = tcp.into_split();
    let start = tokio::time::Instant::now();
    let last = AtomicU64::new(0);
    let touch = || {
        let ms = u64::try_from(start.elapsed().as_millis()).unwrap_or(u64::MAX);
        last.store(ms, Ordering::Relaxed);
    };
    let up = Arc::new(AtomicU64::new(0));
    let down = Arc::new(AtomicU64::new(0));
    let upward = async {
        while let Some(m) = stream.next().await {
            match m {
                Ok(Message::Binary(b)) => {
                    if to_server.write_all(&b).await.is_err() {
                        return "the server stopped reading";
                    }
                    up.fetch_add(b.len() as u64, Ordering::Relaxed);
                    touch();
                }
                Ok(Message::Text(_)) => return "text",
                Ok(Message::Close(_)) => return "the client closed",
                Ok(_) => {}
                Err(_) => return "the client's connection failed",
            }
        }
        "the client's connection ended"
    };
    let downward = async {
        let mut buf = vec![0u8; MAX_CHUNK_BYTES];
        loop {
            match from_server.read(&mut buf).await {
                Ok(0) => return "the server closed",
                Ok(n) => {
                    let chunk = Bytes::copy_from_slice(&buf[..n]);
                    if sink
                        .lock()
                        .await
                        .send(Message::Binary(chunk))
                        .await
                        .is_err()
                    {
                        return "the client stopped reading";
                    }
                    down.fetch_add(n as u64, Ordering::Relaxed);
                    touch();
                }
                Err(_) => return "the server's connection failed",
            }
        }
    };
    let idle = async {
        loop {
            let since = u64::try_from(start.elapsed().as_millis())
                .unwrap_or(u64::MAX)
                .saturating_sub(last.load(Ordering::Relaxed));
            let limit = u64::try_from(IDLE_TIMEOUT.as_millis()).unwrap_or(u64::MAX);
            if since >= limit {
                return "idle";
            }
            tokio::time::sleep(std::time::Duration::from_millis(limit - since)).await;
        }
    };
    let ended = tokio::select! {
        why = upward => why,
        why = downward => why,
        why = idle => why,
        () = ended.cancelled() => "the session ended",
    };
    let (code, reason) = match ended {
        "the server closed" => (CloseCode::Normal, "the server closed the connection"),
        "idle" => (CloseCode::Away, "idle"),
        "the session ended" => (CloseCode::Away, "the session ended"),
        "text" => (CloseCode::Unsupported, "binary messages only"),
        _ => (CloseCode::Normal, ""),
    };
    let mut sink = sink.lock().await;
    let _ = sink
        .send(Message::Close(Some(CloseFrame {
            code,
            reason: reason.into(),
        })))
        .await;
    let _ = sink.close().await;
    let _ = to_server.shutdown().await;
    Moved {
        up: up.load(Ordering::Relaxed),
        down: down.load(Ordering::Relaxed),
        ended,
    }
}
