//! Port forwarding, the client's side (docs/forward.md): a websocket to
//! `/forward/{session}/{port}` on the gateway carries one TCP stream to a
//! port on the session's own loopback. `exec-gateway port-forward` splices
//! each connection it accepts locally onto one.

use futures_util::{SinkExt as _, StreamExt as _};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio_tungstenite::tungstenite::Message;

use super::error::{ClientError, Result};
use super::types::ConnectOptions;

/// Most bytes of one message either way (the gateway's bound).
pub const FORWARD_CHUNK_BYTES: usize = 64 << 10;

/// One forwarded stream.
pub struct Forward {
    ws: tokio_tungstenite::WebSocketStream<
        tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>,
    >,
}

/// The websocket URL of a forward to `port` of `session`, on the gateway
/// `url` names (`ws://` or `wss://`; its query, such as a token, kept).
pub fn forward_url(url: &str, session: &str, port: u16) -> Result<String> {
    let mut u = url::Url::parse(url).map_err(|e| ClientError::Usage(format!("`{url}`: {e}")))?;
    if !matches!(u.scheme(), "ws" | "wss") {
        return Err(ClientError::Usage(
            "port forwarding needs a ws:// or wss:// gateway URL".to_owned(),
        ));
    }
    u.path_segments_mut()
        .map_err(|()| ClientError::Usage(format!("`{url}` cannot take a path")))?
        .clear()
        .extend(["forward", session, &port.to_string()]);
    Ok(u.to_string())
}

impl Forward {
    /// Open a forward to `port` on `session`'s loopback. The gateway's
    /// refusal (an unknown session, nothing listening there, the scope) is
    /// the error's text.
    pub async fn open(opts: &ConnectOptions, session: &str, port: u16) -> Result<Forward> {
        let url = forward_url(&opts.url, session, port)?;
        let ws = super::ws::dial(opts, &url, FORWARD_CHUNK_BYTES).await?;
        Ok(Forward { ws })
    }

    /// Carry bytes between this forward and `local` until the server's
    /// side ends (or `local` stops reading): (bytes sent, bytes received).
    /// A websocket has no half-close: when `local` shuts its sending side,
    /// nothing more is sent and what the server still says is delivered.
    pub async fn splice(self, local: tokio::net::TcpStream) -> Result<(u64, u64)> {
        let (mut sink, mut stream) = self.ws.split();
        let (mut from_local, mut to_local) = local.into_split();
        let (mut sent, mut received) = (0u64, 0u64);
        {
            let upward = async {
                let mut buf = vec![0u8; FORWARD_CHUNK_BYTES];
                while let Ok(n @ 1..) = from_local.read(&mut buf).await {
                    let chunk = bytes::Bytes::copy_from_slice(&buf[..n]);
                    if sink.send(Message::Binary(chunk)).await.is_err() {
                        break;
                    }
                    sent += n as u64;
                }
                // Nothing more to send; the other way goes on.
                std::future::pending::<()>().await;
            };
            let downward = async {
                while let Some(Ok(m)) = stream.next().await {
                    match m {
                        Message::Binary(b) => {
                            if to_local.write_all(&b).await.is_err() {
                                break;
                            }
                            received += b.len() as u64;
                        }
                        Message::Close(_) => break,
                        _ => {}
                    }
                }
            };
            tokio::select! {
                () = upward => {}
                () = downward => {}
            }
        }
        let _ = to_local.shutdown().await;
        let _ = sink.send(Message::Close(None)).await;
        let _ = sink.close().await;
        Ok((sent, received))
    }
}

#[cfg(test)]
mod tests {
    use super::forward_url;

    #[test]
    fn a_forward_url_keeps_the_gateway_and_its_query() {
        assert_eq!(
            forward_url("ws://127.0.0.1:8765", "s-1", 80)
                .ok()
                .as_deref(),
            Some("ws://127.0.0.1:8765/forward/s-1/80")
        );
        assert_eq!(
            forward_url("wss://gw.example/base?access_token=t", "a b", 5432)
                .ok()
                .as_deref(),
            Some("wss://gw.example/forward/a%20b/5432?access_token=t")
        );
        assert!(forward_url("grpc://127.0.0.1:8766", "s", 80).is_err());
    }
}
