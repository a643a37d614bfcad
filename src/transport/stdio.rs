//! The stdio door: newline-delimited JSON on stdin/stdout, one session.
//! Blank lines are skipped; an over-long line is answered with -32600 and
//! discarded up to its newline; EOF ends the session and kills its processes.

use std::sync::Arc;

use bytes::BytesMut;
use futures_util::StreamExt as _;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt as _};
use tokio_util::codec::{Decoder, FramedRead, LinesCodec, LinesCodecError};

use super::authenticate::Caller;
use super::connection::{ConnMeta, FrameSource, InFrame, OnClose, serve_connection};
use crate::error::GatewayError;
use crate::gateway::Gateway;
use crate::outbound::{OutFrame, Outbound};

/// One line of input, or the news that a line was too long.
enum Line {
    Text(String),
    TooLong,
}

/// `LinesCodec` whose over-long lines are items, not errors: `FramedRead`
/// ends the stream after a decoder error, and one bad line must not end
/// the session. `LinesCodec` itself discards the rest of such a line.
struct Lines(LinesCodec);

impl Lines {
    fn map(r: Result<Option<String>, LinesCodecError>) -> std::io::Result<Option<Line>> {
        match r {
            Ok(line) => Ok(line.map(Line::Text)),
            Err(LinesCodecError::MaxLineLengthExceeded) => Ok(Some(Line::TooLong)),
            Err(LinesCodecError::Io(e)) => Err(e),
        }
    }
}

impl Decoder for Lines {
    type Item = Line;
    type Error = std::io::Error;

    fn decode(&mut self, buf: &mut BytesMut) -> std::io::Result<Option<Line>> {
        Self::map(self.0.decode(buf))
    }

    fn decode_eof(&mut self, buf: &mut BytesMut) -> std::io::Result<Option<Line>> {
        Self::map(self.0.decode_eof(buf))
    }
}

/// Serve one session over a reader/writer pair (stdin/stdout in production,
/// a duplex pipe in tests).
pub async fn serve<R, W>(
    reader: R,
    mut writer: W,
    gw: Arc<Gateway>,
    caller: Result<Caller, GatewayError>,
) where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let max = gw.settings.max_message_bytes;
    let lines = FramedRead::new(reader, Lines(LinesCodec::new_with_max_length(max)));
    let inbound = lines
        .filter_map(move |line| async move {
            match line {
                Ok(Line::Text(l)) if l.trim().is_empty() => None,
                Ok(Line::Text(l)) => Some(InFrame::Text(l, Default::default())),
                Ok(Line::TooLong) => Some(InFrame::TooLarge(format!(
                    "line exceeds the {max}-byte message limit"
                ))),
                Err(e) => {
                    tracing::debug!(error = %e, "stdin read failed");
                    None
                }
            }
        })
        .boxed();
    let budget = match &caller {
        Ok(c) => c.tenant().outbound.clone(),
        Err(_) => crate::outbound::ByteBudget::unlimited(),
    };
    let (out, mut rx) = Outbound::channel(budget);
    let writer_task = crate::task::start("stdio-writer", async move {
        while let Some(frame) = rx.recv().await {
            let OutFrame::Text(queued) = frame else {
                break;
            };
            let t = &queued.text;
            if writer.write_all(t.as_bytes()).await.is_err()
                || writer.write_all(b"\n").await.is_err()
            {
                break;
            }
            // Flush when the queue is momentarily empty: one flush per burst.
            if rx.is_empty() && writer.flush().await.is_err() {
                break;
            }
        }
        let _ = writer.flush().await;
    });
    let meta = ConnMeta {
        source: FrameSource::Stdio,
        on_close: OnClose::Kill,
        caller,
        relay: None,
    };
    serve_connection(inbound, out.clone(), gw, meta).await;
    out.close(1000, "").await;
    drop(out);
    let _ = writer_task.await;
}
