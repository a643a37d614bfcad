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
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt as _, ReadBuf, ReadHalf, WriteHalf};

/// Bytes of control frames tungstenite may queue before its next write
/// fails and the read side ends: a client within its ping budget (500 per
/// ten seconds, 127 bytes a pong at most) stays under it while the writer
/// is busy; one that pings and never reads is cut off here.
pub(super) const CONTROL_QUEUE_BYTES: usize = 64 * 1024;
/// Payload bytes per data frame; a larger message goes out as fragments
/// of about this size (RFC 6455 §5.4), cut at UTF-8 boundaries: pongs wait
/// for one fragment at most, and where tungstenite writes, a large reply
/// is never copied whole into its buffer (whose bound stays small).
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
    /// Taken only when dropped, into `parked`.
    read: Option<ReadHalf<S>>,
    control: Arc<Control>,
    parked: Parked<S>,
}

/// The read half, left by tungstenite's side when it is dropped, for the
/// writer to drain ([`DirectWriter::linger`]).
type Parked<S> = Arc<parking_lot::Mutex<Option<ReadHalf<S>>>>;

/// The connection's writer: the socket's write half and the control queue
/// it sends between data frames.
pub(in crate::transport) struct DirectWriter<S> {
    write: WriteHalf<S>,
    control: Arc<Control>,
    parked: Parked<S>,
}

/// Bytes read per call while a closed connection is drained.
const LINGER_READ_BYTES: usize = 16 * 1024;

/// Split `io` into the side tungstenite reads (and writes control frames
/// to) and the writer of data frames.
pub(in crate::transport) fn split<S>(io: S) -> (TungsteniteSide<S>, DirectWriter<S>)
where
    S: AsyncRead + AsyncWrite,
{
    let (read, write) = tokio::io::split(io);
    let control = Arc::new(Control::default());
    let parked = Parked::default();
    (
        TungsteniteSide {
            read: Some(read),
            control: control.clone(),
            parked: parked.clone(),
        },
        DirectWriter {
            write,
            control,
            parked,
        },
    )
}

impl<S: AsyncRead> AsyncRead for TungsteniteSide<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut().read.as_mut() {
            Some(read) => Pin::new(read).poll_read(cx, buf),
            None => Poll::Ready(Ok(())),
        }
    }
}

impl<S> Drop for TungsteniteSide<S> {
    fn drop(&mut self) {
        *self.parked.lock() = self.read.take();
    }
}

impl<S> AsyncWrite for TungsteniteSide<S> {
    /// Takes all of `buf` or fails: tungstenite hands over its whole
    /// buffer, whole frames, so what is queued ends at a frame's end.
    /// Nothing after a close frame is kept (tungstenite sends a pending
    /// pong after its close): the close is the last frame on the wire.
    fn poll_write(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let mut state = self.control.state.lock();
        if state.closed {
            return Poll::Ready(Ok(buf.len()));
        }
        if state.bytes.len() + buf.len() > CONTROL_QUEUE_BYTES {
            return Poll::Ready(Err(io::Error::other(
                "control frames queued past their bound (a client that does not read)",
            )));
        }
        let (keep, closed) = scan(buf);
        state.closed = closed;
        state.bytes.extend_from_slice(&buf[..keep]);
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

/// How much of `bytes` (whole unmasked frames, as a server writes them) to
/// send, and whether a close frame is among it: everything up to the end
/// of the first close frame. Bytes that do not parse as frames are kept
/// and count as a close: after them nothing more is safe to write.
fn scan(bytes: &[u8]) -> (usize, bool) {
    let mut at = 0;
    while at < bytes.len() {
        let Some(end) = frame_end(&bytes[at..]) else {
            return (bytes.len(), true);
        };
        let close = bytes[at] & 0x0F == 0x8;
        at += end;
        if close {
            return (at, true);
        }
    }
    (at, false)
}

/// Where the frame at the start of `bytes` ends, if it is whole.
fn frame_end(bytes: &[u8]) -> Option<usize> {
    let [_, b1, rest @ ..] = bytes else {
        return None;
    };
    let masked = b1 & 0x80 != 0;
    let (len, header): (usize, usize) = match b1 & 0x7F {
        126 => {
            let (n, _) = rest.split_first_chunk::<2>()?;
            (usize::from(u16::from_be_bytes(*n)), 4)
        }
        127 => {
            let (n, _) = rest.split_first_chunk::<8>()?;
            (usize::try_from(u64::from_be_bytes(*n)).ok()?, 10)
        }
        n => (usize::from(n), 2),
    };
    let end = header
        .checked_add(if masked { 4 } else { 0 })?
        .checked_add(len)?;
    (end <= bytes.len()).then_some(end)
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

/// One data frame: its header, which text it is of, and its payload's
/// range in that text.
struct Fragment {
    header: ([u8; 10], usize),
    text: usize,
    payload: (usize, usize),
}

impl Fragment {
    /// Bytes on the wire.
    fn len(&self) -> usize {
        self.header.1 + self.payload.1 - self.payload.0
    }
}

/// Where `text` is cut into fragments of about [`FRAGMENT_BYTES`], at
/// UTF-8 boundaries: each fragment's (start, end); one for an empty text.
/// Both writers cut messages here.
pub(super) fn cuts(text: &str) -> impl Iterator<Item = (usize, usize)> + '_ {
    let mut start = Some(0);
    std::iter::from_fn(move || {
        let from = start?;
        let mut end = (from + FRAGMENT_BYTES).min(text.len());
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        start = (end < text.len()).then_some(end);
        Some((from, end))
    })
}

/// The data frames of `texts[index]`, appended to `out`.
fn fragments(index: usize, text: &str, out: &mut Vec<Fragment>) {
    const TEXT: u8 = 0x1;
    const CONTINUATION: u8 = 0x0;
    for (start, end) in cuts(text) {
        let opcode = if start == 0 { TEXT } else { CONTINUATION };
        out.push(Fragment {
            header: header(end == text.len(), opcode, end - start),
            text: index,
            payload: (start, end),
        });
    }
}

impl<S> DirectWriter<S> {
    /// The queue tungstenite writes its control frames to.
    pub(super) fn control(&self) -> Arc<Control> {
        self.control.clone()
    }
}

impl<S: AsyncRead + AsyncWrite> DirectWriter<S> {
    /// Close a connection whose client may still be sending (its read side
    /// ended on an error: a message too large, a broken frame): shut the
    /// write side (the client gets every frame sent, the close last, then
    /// the end of the stream), then read and drop what it still sends until
    /// it closes its side, `within` passes or `max_bytes` were read. A
    /// socket closed with unread bytes is answered with a reset, which
    /// throws away what is still in its send buffer: the error and the
    /// close frame the client was owed. `drained` is told of each read
    /// (to give back what it was charged).
    pub(super) async fn linger(
        &mut self,
        within: Duration,
        max_bytes: usize,
        mut drained: impl FnMut(),
    ) {
        // tungstenite's side is gone once the connection's loop ended.
        let Some(mut read) = self.parked.lock().take() else {
            return;
        };
        let write = &mut self.write;
        let _ = tokio::time::timeout(within, async move {
            write.shutdown().await?;
            let mut buf = vec![0u8; LINGER_READ_BYTES];
            let mut total = 0;
            while total < max_bytes {
                match tokio::io::AsyncReadExt::read(&mut read, &mut buf).await? {
                    0 => break,
                    n => total += n,
                }
                drained();
            }
            Ok::<_, io::Error>(())
        })
        .await;
    }
}

/// Data frames written in one `writev` at most: small frames go out
/// together; a large fragment goes alone, so tungstenite's pongs wait for
/// one fragment at most, not a whole message.
const GROUP_BYTES: usize = 256 * 1024;

impl<S: AsyncWrite> DirectWriter<S> {
    /// Send what tungstenite queued; true once a close frame went out.
    /// A write that makes no progress for `stall` fails (TimedOut).
    pub(super) async fn send_control(&mut self, stall: Duration) -> io::Result<bool> {
        let (bytes, closed) = {
            let mut state = self.control.state.lock();
            (std::mem::take(&mut state.bytes), state.closed)
        };
        if !bytes.is_empty() {
            let mut at = 0;
            while at < bytes.len() {
                match progress(stall, self.write.write(&bytes[at..])).await? {
                    0 => return Err(io::ErrorKind::WriteZero.into()),
                    n => at += n,
                }
            }
            progress(stall, self.write.flush()).await?;
        }
        Ok(closed)
    }

    /// Whether tungstenite queued something since the last send.
    fn control_pending(&self) -> bool {
        !self.control.state.lock().bytes.is_empty()
    }

    /// Write `texts` as text messages and flush: what tungstenite queued
    /// first, then each frame's header and payload from where they lie,
    /// what tungstenite queues meanwhile between frames. The client is
    /// given up only when a write makes no progress for `stall`, however
    /// long the whole takes.
    pub(super) async fn write_texts<T: AsRef<str>>(
        &mut self,
        texts: &[T],
        stall: Duration,
    ) -> io::Result<()> {
        if self.send_control(stall).await? {
            return Err(io::Error::other("data frame after the close frame"));
        }
        let mut frames = Vec::with_capacity(texts.len());
        for (i, text) in texts.iter().enumerate() {
            fragments(i, text.as_ref(), &mut frames);
        }
        let mut next = 0;
        while next < frames.len() {
            let start = next;
            let mut bytes = 0;
            while next < frames.len()
                && (next == start
                    || (bytes + frames[next].len() <= GROUP_BYTES
                        && 2 * (next - start) < SLICES_PER_WRITE))
            {
                bytes += frames[next].len();
                next += 1;
            }
            let mut slices = Vec::with_capacity(2 * (next - start));
            for frame in &frames[start..next] {
                let (h, n) = &frame.header;
                let (a, b) = frame.payload;
                slices.push(IoSlice::new(&h[..*n]));
                let payload = &texts[frame.text].as_ref().as_bytes()[a..b];
                if !payload.is_empty() {
                    slices.push(IoSlice::new(payload));
                }
            }
            let mut rest: &mut [IoSlice<'_>] = &mut slices;
            while !rest.is_empty() {
                let n = progress(stall, self.write.write_vectored(rest)).await?;
                if n == 0 {
                    return Err(io::ErrorKind::WriteZero.into());
                }
                IoSlice::advance_slices(&mut rest, n);
            }
            if self.control_pending() && self.send_control(stall).await? && next < frames.len() {
                return Err(io::Error::other("data frame after the close frame"));
            }
        }
        progress(stall, self.write.flush()).await
    }
}

/// `op`, failed with TimedOut when it takes longer than `stall`.
async fn progress<T>(
    stall: Duration,
    op: impl std::future::Future<Output = io::Result<T>>,
) -> io::Result<T> {
    tokio::time::timeout(stall, op).await.unwrap_or_else(|_| {
        Err(io::Error::new(
            io::ErrorKind::TimedOut,
            "the client stopped reading",
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt as _;

    const STALL: Duration = Duration::from_secs(30);

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
        fragments(0, &text, &mut frames);
        assert!(frames.len() > 1);
        let mut joined = String::new();
        for (
            i,
            Fragment {
                header: (h, _),
                payload: (a, b),
                ..
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
        fragments(0, "", &mut frames);
        assert_eq!(frames.len(), 1);
        assert_eq!(frames[0].header.0[..2], [0x81, 0]);
    }

    #[test]
    fn control_bytes_end_at_the_first_close_frame() {
        let pong = [0x8A, 3, b'a', b'b', b'c'];
        let close = [0x88, 2, 0x03, 0xE8];
        assert_eq!(scan(&pong), (5, false));
        assert_eq!(scan(&[pong, pong].concat()), (10, false));
        assert_eq!(scan(&[&pong[..], &close[..]].concat()), (9, true));
        // A pong tungstenite sends after its close is dropped.
        assert_eq!(scan(&[&close[..], &pong[..]].concat()), (4, true));
        // Cut or unparseable bytes are kept and count as a close.
        assert_eq!(scan(&pong[..3]), (3, true));
        assert_eq!(scan(&[0x8A]), (1, true));
        let huge = [0x8A, 127, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF];
        assert_eq!(scan(&huge), (10, true));
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
            writer
                .write_texts(&["hi", big.as_str()], STALL)
                .await
                .unwrap();
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

    /// Frames of a server's stream: (opcode, fin, payload length).
    fn parse(mut bytes: &[u8]) -> Vec<(u8, bool, usize)> {
        let mut out = Vec::new();
        while !bytes.is_empty() {
            let end = frame_end(bytes).unwrap();
            let header = end
                - match bytes[1] & 0x7F {
                    126 => end - 4,
                    127 => end - 10,
                    n => usize::from(n),
                };
            out.push((bytes[0] & 0x0F, bytes[0] & 0x80 != 0, end - header));
            bytes = &bytes[end..];
        }
        out
    }

    #[tokio::test]
    async fn a_pong_queued_during_a_message_goes_between_its_fragments() {
        let (ours, mut theirs) = tokio::io::duplex(64 * 1024);
        let (mut side, mut writer) = split(ours);
        let big = "y".repeat(3 * FRAGMENT_BYTES);
        let read = async move {
            let mut all = vec![0u8; 100_000];
            theirs.read_exact(&mut all).await.unwrap();
            // The writer is inside the first fragment: tungstenite answers
            // a ping now.
            side.write_all(&[0x8A, 1, b'p']).await.unwrap();
            side.flush().await.unwrap();
            // Both halves gone: the end of the stream once written.
            drop(side);
            theirs.read_to_end(&mut all).await.unwrap();
            all
        };
        let write = async {
            writer.write_texts(&[big.as_str()], STALL).await.unwrap();
            drop(writer);
        };
        let (all, ()) = tokio::join!(read, write);
        let frames = parse(&all);
        assert_eq!(
            frames,
            vec![
                (0x1, false, FRAGMENT_BYTES),
                (0xA, true, 1),
                (0x0, false, FRAGMENT_BYTES),
                (0x0, true, FRAGMENT_BYTES),
            ]
        );
    }

    #[tokio::test]
    async fn a_slow_reader_is_kept_while_it_reads_and_cut_when_it_stops() {
        let stall = Duration::from_secs(1);
        let (ours, mut theirs) = tokio::io::duplex(64 * 1024);
        let (side, mut writer) = split(ours);
        // 24 reads 100 ms apart: longer than the stall bound in all.
        let big = "z".repeat(24 * 64 * 1024);
        let read = async {
            let mut buf = vec![0u8; 64 * 1024];
            let mut total = 0;
            loop {
                tokio::time::sleep(Duration::from_millis(100)).await;
                match theirs.read(&mut buf).await.unwrap() {
                    0 => return total,
                    n => total += n,
                }
            }
        };
        let write = async {
            writer.write_texts(&[big.as_str()], stall).await.unwrap();
            drop((writer, side));
        };
        let (total, ()) = tokio::join!(read, write);
        // Two fragments, each with a 10-byte header.
        assert_eq!(total, big.len() + 20);

        let (ours, _theirs) = tokio::io::duplex(64 * 1024);
        let (_side, mut writer) = split(ours);
        let e = writer
            .write_texts(&[big.as_str()], stall)
            .await
            .unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut, "{e}");
    }

    #[tokio::test]
    async fn nothing_is_written_after_a_close_frame() {
        let (ours, _theirs) = tokio::io::duplex(1024);
        let (mut side, mut writer) = split(ours);
        side.write_all(&[0x88, 2, 0x03, 0xE8]).await.unwrap();
        side.flush().await.unwrap();
        let e = writer.write_texts(&["late"], STALL).await.unwrap_err();
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
