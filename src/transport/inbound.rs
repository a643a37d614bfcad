//! What clients send, budgeted like what they are sent: every byte read
//! from a websocket is charged to the connection's tenant
//! (`tenants.*.max_inbound_bytes`) and to the gateway
//! (`server.max_inbound_bytes`) as it is read, while the websocket layer
//! assembles a message out of it, and the charge goes with the message
//! into the connection (its state machine keeps it with the call the
//! message became, until the call is answered). With no room the read
//! waits: TCP's flow control holds the client back, and nothing more of
//! it is buffered. A message that stays incomplete longer than
//! `server.inbound_message_timeout` (a client trickling, or one the
//! budget holds back because its tenant's other connections hold it all)
//! ends its connection with 1008, which gives its bytes back.
//!
//! Accounting is per read: a charge may cover up to one read (a few KiB)
//! of the next message besides the one it goes with, and a read may take
//! one read's worth past the budget before the next one waits.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use parking_lot::Mutex;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Instant;

use crate::outbound::{ByteBudget, Reservation};

/// Inbound bytes held for one message (or one connection's unfinished
/// one), in its tenant's and the gateway's budgets; given back when
/// dropped.
#[derive(Debug, Default)]
pub struct Charge {
    tenant: Option<Reservation>,
    gateway: Option<Reservation>,
}

impl Charge {
    /// A charge of these reservations (of a tenant's and the gateway's budgets).
    pub fn new(tenant: Reservation, gateway: Reservation) -> Charge {
        Charge {
            tenant: Some(tenant),
            gateway: Some(gateway),
        }
    }

    /// Bytes charged.
    pub fn bytes(&self) -> usize {
        self.tenant.as_ref().map_or(0, Reservation::bytes)
    }

    /// Give back all but `n` bytes.
    pub fn keep(&mut self, n: usize) {
        if n == 0 {
            *self = Charge::default();
            return;
        }
        for r in [&mut self.tenant, &mut self.gateway].into_iter().flatten() {
            let excess = r.bytes().saturating_sub(n);
            drop(r.split(excess));
        }
    }

    pub(crate) fn add(&mut self, tenant: Reservation, gateway: Reservation) {
        merge(&mut self.tenant, tenant);
        merge(&mut self.gateway, gateway);
    }
}

fn merge(slot: &mut Option<Reservation>, r: Reservation) {
    match slot {
        Some(held) => held.merge(r),
        None => *slot = Some(r),
    }
}

#[derive(Debug, Default)]
struct Held {
    charge: Charge,
    /// Since when a message has been unfinished in what was read.
    since: Option<Instant>,
    framing: Framing,
}

/// Where the client's bytes stand in websocket framing (RFC 6455 §5.2),
/// read from the bytes themselves: one read can hold the end of one message
/// and the start of the next, so "a message was handed on" does not mean
/// "nothing is unfinished" (a partial frame read together with a whole
/// message escaped its deadline).
#[derive(Debug, Default)]
struct Framing {
    head: [u8; 14],
    /// Header bytes read of the frame coming (0 between frames).
    have: usize,
    /// Payload bytes still to come of the current frame.
    left: u64,
    /// The current frame is a data frame with FIN: its end ends a message.
    ends_message: bool,
    /// A data frame without FIN was seen: a message is being assembled.
    in_message: bool,
}

impl Framing {
    fn feed(&mut self, mut bytes: &[u8]) {
        while let Some((&first, rest)) = bytes.split_first() {
            if self.left > 0 {
                let n = usize::try_from(self.left)
                    .unwrap_or(usize::MAX)
                    .min(bytes.len());
                self.left -= n as u64;
                bytes = &bytes[n..];
                if self.left == 0 {
                    self.frame_done();
                }
                continue;
            }
            self.head[self.have] = first;
            self.have += 1;
            bytes = rest;
            if self.header_len() == Some(self.have) {
                let fin = self.head[0] & 0x80 != 0;
                // Opcodes 0-7 are data (continuation, text, binary); 8-15 control.
                let data = self.head[0] & 0x08 == 0;
                self.ends_message = data && fin;
                self.in_message |= data && !fin;
                self.left = self.payload_len();
                self.have = 0;
                if self.left == 0 {
                    self.frame_done();
                }
            }
        }
    }

    /// The header's length, once its first two bytes are in.
    fn header_len(&self) -> Option<usize> {
        if self.have < 2 {
            return None;
        }
        let extended = match self.head[1] & 0x7F {
            126 => 2,
            127 => 8,
            _ => 0,
        };
        let mask = if self.head[1] & 0x80 != 0 { 4 } else { 0 };
        Some(2 + extended + mask)
    }

    fn payload_len(&self) -> u64 {
        let h = &self.head;
        match h[1] & 0x7F {
            126 => u64::from(u16::from_be_bytes([h[2], h[3]])),
            127 => u64::from_be_bytes([h[2], h[3], h[4], h[5], h[6], h[7], h[8], h[9]]),
            n => u64::from(n),
        }
    }

    fn frame_done(&mut self) {
        if self.ends_message {
            self.in_message = false;
        }
        self.ends_message = false;
    }

    fn unfinished(&self) -> bool {
        self.have > 0 || self.left > 0 || self.in_message
    }
}

/// One connection's inbound accounting, shared by its socket's reads
/// ([`Metered`]) and the task that turns them into messages.
#[derive(Debug, Clone)]
pub struct InboundMeter {
    tenant: Arc<ByteBudget>,
    gateway: Arc<ByteBudget>,
    held: Arc<Mutex<Held>>,
}

impl InboundMeter {
    pub fn new(tenant: Arc<ByteBudget>, gateway: Arc<ByteBudget>) -> InboundMeter {
        InboundMeter {
            tenant,
            gateway,
            held: Arc::default(),
        }
    }

    /// A message is complete: the charge of what was read for it goes with
    /// it. Its deadline is the framing's to end: what was read with it may
    /// have begun the next message.
    pub fn take(&self) -> Charge {
        std::mem::take(&mut self.held.lock().charge)
    }

    /// A control frame (ping, pong) of `payload` bytes came between the
    /// fragments of a message, or between messages: give back its own
    /// bytes only (a client's control frames are masked and unfragmented:
    /// 6 bytes of header and mask), so that the message being assembled
    /// keeps its charge and its deadline.
    pub fn control_frame(&self, payload: usize) {
        let n = payload + 6;
        let mut held = self.held.lock();
        if held.charge.bytes() <= n {
            held.charge = Charge::default();
            return;
        }
        let charge = &mut held.charge;
        for r in [&mut charge.tenant, &mut charge.gateway]
            .into_iter()
            .flatten()
        {
            drop(r.split(n));
        }
    }

    /// Since when the message being assembled has been coming in (`None`
    /// between messages).
    pub fn partial_since(&self) -> Option<Instant> {
        self.held.lock().since
    }

    fn read(&self, tenant: Reservation, gateway: Reservation) {
        self.held.lock().charge.add(tenant, gateway);
    }

    /// `bytes` were read: where do they leave the framing?
    fn scan(&self, bytes: &[u8]) {
        let mut held = self.held.lock();
        held.framing.feed(bytes);
        if held.framing.unfinished() {
            held.since.get_or_insert_with(Instant::now);
        } else {
            held.since = None;
        }
    }
}

type Reserving = Pin<Box<dyn Future<Output = (Reservation, Reservation)> + Send>>;

/// A socket whose reads are charged to an [`InboundMeter`] as they are made.
pub struct Metered<S> {
    inner: S,
    meter: InboundMeter,
    /// Bytes read past the budget, to be charged before the next read.
    owed: usize,
    waiting: Option<Reserving>,
}

impl<S> Metered<S> {
    pub fn new(inner: S, meter: InboundMeter) -> Metered<S> {
        Metered {
            inner,
            meter,
            owed: 0,
            waiting: None,
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Metered<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.owed > 0 {
            let waiting = this.waiting.get_or_insert_with(|| {
                let (tenant, gateway, n) = (
                    this.meter.tenant.clone(),
                    this.meter.gateway.clone(),
                    this.owed,
                );
                Box::pin(async move { (tenant.reserve(n).await, gateway.reserve(n).await) })
            });
            let (t, g) = ready!(waiting.as_mut().poll(cx));
            this.waiting = None;
            this.owed = 0;
            this.meter.read(t, g);
        }
        let before = buf.filled().len();
        ready!(Pin::new(&mut this.inner).poll_read(cx, buf))?;
        let n = buf.filled().len() - before;
        if n > 0 {
            this.meter.scan(&buf.filled()[before..]);
            match (
                this.meter.tenant.try_reserve(n),
                this.meter.gateway.try_reserve(n),
            ) {
                (Some(t), Some(g)) => this.meter.read(t, g),
                // Over a budget: these bytes are owed, and the next read
                // waits until they fit.
                _ => this.owed = n,
            }
        }
        Poll::Ready(Ok(()))
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Metered<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use prometheus_client::metrics::gauge::Gauge;
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    /// A budget of `n` bytes, its bytes held and its reservations waiting.
    fn budget(n: usize) -> (Arc<ByteBudget>, Gauge, Gauge) {
        let (held, waiting) = (Gauge::default(), Gauge::default());
        (
            ByteBudget::new(n, held.clone(), Gauge::default(), waiting.clone()),
            held,
            waiting,
        )
    }

    /// A client frame's header: text, masked with key 0.
    fn header(fin: bool, len: usize) -> Vec<u8> {
        let mut h = vec![if fin { 0x81 } else { 0x01 }];
        match len {
            0..126 => h.push(0x80 | len as u8),
            126..65536 => {
                h.push(0x80 | 126);
                h.extend_from_slice(&(len as u16).to_be_bytes());
            }
            _ => {
                h.push(0x80 | 127);
                h.extend_from_slice(&(len as u64).to_be_bytes());
            }
        }
        h.extend_from_slice(&[0; 4]);
        h
    }

    /// Read `bytes` through a meter: is a message left unfinished?
    async fn unfinished_after(
        meter: &InboundMeter,
        reader: &mut Metered<tokio::io::DuplexStream>,
        client: &mut tokio::io::DuplexStream,
        bytes: &[u8],
    ) -> bool {
        client.write_all(bytes).await.unwrap();
        let mut buf = vec![0u8; bytes.len()];
        reader.read_exact(&mut buf).await.unwrap();
        drop(meter.take());
        meter.partial_since().is_some()
    }

    /// The deadline follows the framing, not the messages handed on: the
    /// start of a message read together with a whole one keeps its
    /// deadline (the attack review's stall: a complete message and a
    /// partial frame in one write were never cut), and a message ends it
    /// only with its last fragment; control frames never start one.
    #[tokio::test]
    async fn a_message_is_unfinished_until_its_last_frame_is_read() {
        let meter = InboundMeter::new(ByteBudget::unlimited(), ByteBudget::unlimited());
        let (mut client, server) = tokio::io::duplex(1 << 20);
        let mut reader = Metered::new(server, meter.clone());
        let whole = |len: usize| {
            let mut f = header(true, len);
            f.resize(f.len() + len, b'x');
            f
        };
        macro_rules! unfinished {
            ($bytes:expr) => {
                unfinished_after(&meter, &mut reader, &mut client, &$bytes[..]).await
            };
        }
        assert!(!unfinished!(whole(20)));
        // A whole message and 3 bytes of the next header, in one read.
        let mut both = whole(24);
        both.extend_from_slice(&header(true, 500_000)[..3]);
        assert!(unfinished!(both));
        // The rest of that header and all but one payload byte: unfinished;
        // the last byte ends it.
        let mut rest = header(true, 500_000)[3..].to_vec();
        rest.resize(rest.len() + 499_999, b'x');
        assert!(unfinished!(rest));
        assert!(!unfinished!([b'x']));
        // Fragments: unfinished until the FIN continuation.
        let mut first = header(false, 5);
        first.extend_from_slice(b"hello");
        assert!(unfinished!(first));
        // A ping between fragments (opcode 9, FIN) does not end it.
        assert!(unfinished!([0x89, 0x80, 0, 0, 0, 0]));
        let mut last = vec![0x80, 0x82, 0, 0, 0, 0];
        last.extend_from_slice(b"!!");
        assert!(!unfinished!(last));
        // A ping alone starts nothing; a 16-bit length split after its first byte does.
        assert!(!unfinished!([0x89, 0x80, 0, 0, 0, 0]));
        assert!(unfinished!([0x81, 0xFE, 0x01]));
    }

    #[tokio::test]
    async fn reads_are_charged_until_taken_and_wait_when_over_budget() {
        let (tenant, held, waiting) = budget(1000);
        let meter = InboundMeter::new(tenant, ByteBudget::unlimited());
        let (mut client, server) = tokio::io::duplex(64);
        let mut reader = Metered::new(server, meter.clone());
        // The first 600 bytes of a text frame of 10,000.
        let first = crate::task::start("test-writer", async move {
            let mut start = header(true, 10_000);
            start.resize(600, b'x');
            client.write_all(&start).await.unwrap();
            client
        });
        let mut buf = vec![0u8; 600];
        reader.read_exact(&mut buf).await.unwrap();
        let mut client = first.await.unwrap();
        assert_eq!(held.get(), 600);
        assert!(meter.partial_since().is_some());
        // What was read is handed on: its charge goes with it until dropped.
        let charge = meter.take();
        assert_eq!(charge.bytes(), 600);
        assert_eq!(held.get(), 600);
        drop(charge);
        assert_eq!(held.get(), 0);
        // 1,200 bytes into a budget of 1,000: reading stops at the budget
        // (plus the one read that crossed it) until the charge is given back.
        let writer = crate::task::start("test-writer", async move {
            client.write_all(&[2u8; 1200]).await.unwrap();
            client
        });
        let read = crate::task::start("test-reader", async move {
            let mut more = vec![0u8; 1200];
            reader.read_exact(&mut more).await.unwrap();
            reader
        });
        while waiting.get() == 0 {
            tokio::task::yield_now().await;
        }
        // The reader waits for room, read_exact unfinished: what it read
        // fills the budget but for less than one read, and one more read
        // (at most 64 bytes) is owed.
        assert!(!read.is_finished());
        assert!((1000 - 64..=1000).contains(&held.get()), "{}", held.get());
        drop(meter.take());
        let _reader = read.await.unwrap();
        let _client = writer.await.unwrap();
        let rest = meter.take();
        assert!(rest.bytes() <= 1200 - (1000 - 64), "{}", rest.bytes());
        drop(rest);
        assert_eq!(held.get(), 0);
    }
}
