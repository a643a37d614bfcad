//! A client's websocket written without tungstenite's write buffer: each
//! data frame's header and its payload go to the socket together in one
//! vectored write, so a reply or a chunk of output is never copied on its
//! way out (tungstenite copies every payload into its buffer, and keeps
//! that buffer's largest capacity for the connection's life).
//!
//! tungstenite still reads the connection and writes its own control
//! frames: the pongs it answers pings with and the close handshake. It
//! writes them into a small [`Control`] queue instead of the socket, and
//! the connection's one writer sends that queue between its data frames,
//! so a control frame never lands inside a data frame on the wire.

use std::io::{self, IoSlice};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt as _, ReadBuf, ReadHalf, WriteHalf};

/// Bytes of control frames tungstenite may queue before its next write
/// fails and the read side ends: a client within its ping budget (500 per
/// ten seconds, 127 bytes a pong at most) stays under it while the writer
/// is busy; one that pings and never reads is cut off here.
pub(super) const CONTROL_QUEUE_BYTES: usize = 64 * 1024;
/// Payload bytes per data frame; a larger message goes out as fragments
/// of about this size (RFC 6455 §5.4), cut at UTF-8 boundaries.
pub(super) const FRAGMENT_BYTES: usize = 1024 * 1024;
/// Buffers handed to one `writev` (headers and payloads); the kernel takes
/// at most 1,024.
const SLICES_PER_WRITE: usize = 64;

/// Control frames tungstenite wrote, waiting for the writer.
#[derive(Default)]
pub(super) struct Control {
    state: parking_lot::Mutex<ControlState>,
    ready: tokio::sync::Notify,
}

#[derive(Default)]
struct ControlState {
    bytes: Vec<u8>,
    /// A close frame is among what was queued: no data frame may follow.
    closed: bool,
}

impl Control {
    /// Wait until tungstenite queued something.
    pub(super) async fn queued(&self) {
        self.ready.notified().await;
    }
}

/// What tungstenite reads from and writes to: the socket's read half, and
/// the control queue for everything it writes.
pub(in crate::transport) struct TungsteniteSide<S> {
    read: ReadHalf<S>,
    control: Arc<Control>,
}

/// The connection's writer: the socket's write half and the control queue
/// it sends between data frames.
pub(in crate::transport) struct DirectWriter<S> {
    write: WriteHalf<S>,
    control: Arc<Control>,
}

/// Split `io` into the side tungstenite reads (and writes control frames
/// to) and the writer of data frames.
pub(in crate::transport) fn split<S>(io: S) -> (TungsteniteSide<S>, DirectWriter<S>)
where
    S: AsyncRead + AsyncWrite,
{
    let (read, write) = tokio::io::split(io);
    let control = Arc::new(Control::default());
    (
        TungsteniteSide {
            read,
            control: control.clone(),
        },
        DirectWriter { write, control },
    )
}

impl<S: AsyncRead> AsyncRead for TungsteniteSide<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().read).poll_read(cx, buf)
    }
}

impl<S> AsyncWrite for TungsteniteSide<S> {
    /// Takes all of `buf` or fails: tungstenite hands over its whole
    /// buffer, whole frames, so what is queued ends at a frame's end.
    fn poll_write(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let mut state = self.control.state.lock();
        if state.bytes.len() + buf.len() > CONTROL_QUEUE_BYTES {
            return Poll::Ready(Err(io::Error::other(
                "control frames queued past their bound (a client that does not read)",
            )));
        }
        state.closed |= holds_close(buf);
        state.bytes.extend_from_slice(buf);
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if !self.control.state.lock().bytes.is_empty() {
            self.control.ready.notify_one();
        }
        Poll::Ready(Ok(()))
    }

    /// The writer owns the socket's end.
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.poll_flush(cx)
    }
}

/// Whether `bytes` (whole unmasked frames, as a server writes them) hold a
/// close frame. Bytes that do not parse as frames count as one: after
/// them nothing more is safe to write.
fn holds_close(mut bytes: &[u8]) -> bool {
    while !bytes.is_empty() {
        let [b0, b1, rest @ ..] = bytes else {
            return true;
        };
        if b0 & 0x0F == 0x8 {
            return true;
        }
        let masked = b1 & 0x80 != 0;
        let (len, rest) = match b1 & 0x7F {
            126 => match rest {
                [a, b, rest @ ..] => (u16::from_be_bytes([*a, *b]) as usize, rest),
                _ => return true,
            },
            127 => match rest.split_first_chunk::<8>() {
                Some((n, rest)) => match usize::try_from(u64::from_be_bytes(*n)) {
                    Ok(n) => (n, rest),
                    Err(_) => return true,
                },
                None => return true,
            },
            n => (usize::from(n), rest),
        };
        let skip = len + if masked { 4 } else { 0 };
        let Some(after) = rest.get(skip..) else {
            return true;
        };
        bytes = after;
    }
    false
}

/// A data frame's header: FIN, opcode, unmasked length (the server's side).
fn header(fin: bool, opcode: u8, len: usize) -> ([u8; 10], usize) {
    let mut h = [0u8; 10];
    h[0] = if fin { 0x80 } else { 0 } | opcode;
    let n = if len < 126 {
        h[1] = len as u8;
        2
    } else if let Ok(short) = u16::try_from(len) {
        h[1] = 126;
        h[2..4].copy_from_slice(&short.to_be_bytes());
        4
    } else {
        h[1] = 127;
        h[2..10].copy_from_slice(&(len as u64).to_be_bytes());
        10
    };
    (h, n)
}

/// One data frame of a message: its header, and its payload's range in
/// the message.
struct Fragment {
    header: ([u8; 10], usize),
    payload: (usize, usize),
}

/// `text` cut into fragments of about [`FRAGMENT_BYTES`] at UTF-8
/// boundaries.
fn fragments(text: &str, out: &mut Vec<Fragment>) {
    const TEXT: u8 = 0x1;
    const CONTINUATION: u8 = 0x0;
    let mut start = 0;
    loop {
        let mut end = (start + FRAGMENT_BYTES).min(text.len());
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        let opcode = if start == 0 { TEXT } else { CONTINUATION };
        let fin = end == text.len();
        out.push(Fragment {
            header: header(fin, opcode, end - start),
            payload: (start, end),
        });
        if fin {
            return;
        }
        start = end;
    }
}

impl<S> DirectWriter<S> {
    /// The queue tungstenite writes its control frames to.
    pub(super) fn control(&self) -> Arc<Control> {
        self.control.clone()
    }
}

impl<S: AsyncWrite> DirectWriter<S> {
    /// Send what tungstenite queued; true once a close frame went out.
    pub(super) async fn send_control(&mut self) -> io::Result<bool> {
        let (bytes, closed) = {
            let mut state = self.control.state.lock();
            (std::mem::take(&mut state.bytes), state.closed)
        };
        if !bytes.is_empty() {
            self.write.write_all(&bytes).await?;
            self.write.flush().await?;
        }
        Ok(closed)
    }

    /// Write `texts` as text messages and flush: what tungstenite queued
    /// first, then each frame's header and payload from where they lie.
    pub(super) async fn write_texts<T: AsRef<str>>(&mut self, texts: &[T]) -> io::Result<()> {
        if self.send_control().await? {
            return Err(io::Error::other("data frame after the close frame"));
        }
        let mut frames = Vec::with_capacity(texts.len());
        let mut owners = Vec::with_capacity(texts.len());
        for (i, text) in texts.iter().enumerate() {
            fragments(text.as_ref(), &mut frames);
            owners.resize(frames.len(), i);
        }
        let mut slices = Vec::with_capacity(2 * frames.len());
        for (frame, owner) in frames.iter().zip(&owners) {
            let (h, n) = &frame.header;
            let (a, b) = frame.payload;
            slices.push(IoSlice::new(&h[..*n]));
            let payload = &texts[*owner].as_ref().as_bytes()[a..b];
            if !payload.is_empty() {
                slices.push(IoSlice::new(payload));
            }
        }
        let mut rest: &mut [IoSlice<'_>] = &mut slices;
        while !rest.is_empty() {
            let take = rest.len().min(SLICES_PER_WRITE);
            let n = self.write.write_vectored(&rest[..take]).await?;
            if n == 0 {
                return Err(io::ErrorKind::WriteZero.into());
            }
            IoSlice::advance_slices(&mut rest, n);
        }
        self.write.flush().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_use_the_shortest_length() {
        assert_eq!(header(true, 1, 5).1, 2);
        assert_eq!(header(true, 1, 5).0[..2], [0x81, 5]);
        assert_eq!(header(true, 1, 125).0[..2], [0x81, 125]);
        assert_eq!(header(false, 0, 126).0[..4], [0x00, 126, 0, 126]);
        assert_eq!(header(true, 1, 65_535).0[..4], [0x81, 126, 0xFF, 0xFF]);
        let (h, n) = header(true, 1, 65_536);
        assert_eq!(n, 10);
        assert_eq!(h[..10], [0x81, 127, 0, 0, 0, 0, 0, 1, 0, 0]);
    }

    #[test]
    fn a_large_text_is_cut_at_character_boundaries() {
        // A 3-byte character straddles every fragment boundary.
        let text = "€".repeat(FRAGMENT_BYTES / 3 * 2 + 7);
        let mut frames = Vec::new();
        fragments(&text, &mut frames);
        assert!(frames.len() > 1);
        let mut joined = String::new();
        for (
            i,
            Fragment {
                header: (h, _),
                payload: (a, b),
            },
        ) in frames.iter().enumerate()
        {
            assert!(text.is_char_boundary(*a) && text.is_char_boundary(*b));
            assert_eq!(h[0] & 0x0F, if i == 0 { 1 } else { 0 });
            assert_eq!(h[0] & 0x80 != 0, i == frames.len() - 1);
            joined.push_str(&text[*a..*b]);
        }
        assert_eq!(joined, text);
    }

    #[test]
    fn an_empty_text_is_one_frame() {
        let mut frames = Vec::new();
        fragments("", &mut frames);
        assert_eq!(frames.len(), 1);
        assert_eq!(frames[0].header.0[..2], [0x81, 0]);
    }

    #[test]
    fn close_frames_are_found_among_control_frames() {
        let pong = [0x8A, 3, b'a', b'b', b'c'];
        let close = [0x88, 2, 0x03, 0xE8];
        assert!(!holds_close(&pong));
        assert!(!holds_close(&[pong, pong].concat()));
        assert!(holds_close(&[&pong[..], &close[..]].concat()));
        // Cut or unparseable bytes count as a close.
        assert!(holds_close(&pong[..3]));
        assert!(holds_close(&[0x8A]));
        assert!(holds_close(&[
            0x8A, 127, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF
        ]));
    }

    #[tokio::test]
    async fn frames_reach_the_socket_whole_with_control_frames_between() {
        let (ours, mut theirs) = tokio::io::duplex(64);
        let (side, mut writer) = split(ours);
        let mut side = side;
        // tungstenite answering a ping.
        side.write_all(&[0x8A, 1, b'p']).await.unwrap();
        side.flush().await.unwrap();
        writer.control.queued().await;
        let big = "x".repeat(70_000);
        let read = async {
            let mut all = Vec::new();
            tokio::io::AsyncReadExt::read_to_end(&mut theirs, &mut all)
                .await
                .unwrap();
            all
        };
        let write = async {
            writer.write_texts(&["hi", big.as_str()]).await.unwrap();
            drop(writer);
            drop(side);
        };
        let (all, ()) = tokio::join!(read, write);
        let mut expect = vec![
            0x8A, 1, b'p', 0x81, 2, b'h', b'i', 0x81, 127, 0, 0, 0, 0, 0, 1, 0x11, 0x70,
        ];
        expect.extend_from_slice(big.as_bytes());
        assert_eq!(all, expect);
    }

    #[tokio::test]
    async fn nothing_is_written_after_a_close_frame() {
        let (ours, _theirs) = tokio::io::duplex(1024);
        let (mut side, mut writer) = split(ours);
        side.write_all(&[0x88, 2, 0x03, 0xE8]).await.unwrap();
        side.flush().await.unwrap();
        let e = writer.write_texts(&["late"]).await.unwrap_err();
        assert!(e.to_string().contains("after the close"), "{e}");
    }

    #[tokio::test]
    async fn a_client_that_never_reads_bounds_the_control_queue() {
        let (ours, _theirs) = tokio::io::duplex(16);
        let (mut side, _writer) = split(ours);
        let pong = [0x8A, 125];
        let mut frame = pong.to_vec();
        frame.extend_from_slice(&[0u8; 125]);
        let mut queued = 0;
        let err = loop {
            match side.write_all(&frame).await {
                Ok(()) => queued += frame.len(),
                Err(e) => break e,
            }
        };
        assert!(queued <= CONTROL_QUEUE_BYTES && queued + frame.len() > CONTROL_QUEUE_BYTES);
        assert!(err.to_string().contains("bound"), "{err}");
    }
}
