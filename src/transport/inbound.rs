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
    /// When the first byte of the message being assembled was read.
    since: Option<Instant>,
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

    /// A message is complete: the charge of what was read for it goes with it.
    pub fn take(&self) -> Charge {
        let mut held = self.held.lock();
        held.since = None;
        std::mem::take(&mut held.charge)
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
            held.since = None;
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
        let mut held = self.held.lock();
        held.since.get_or_insert_with(Instant::now);
        held.charge.add(tenant, gateway);
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
            match (
                this.meter.tenant.try_reserve(n),
                this.meter.gateway.try_reserve(n),
            ) {
                (Some(t), Some(g)) => this.meter.read(t, g),
                // Over a budget: these bytes are owed, and the next read
                // waits until they fit.
                _ => {
                    this.owed = n;
                    this.meter
                        .held
                        .lock()
                        .since
                        .get_or_insert_with(Instant::now);
                }
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

    #[tokio::test]
    async fn reads_are_charged_until_taken_and_wait_when_over_budget() {
        let (tenant, held, waiting) = budget(1000);
        let meter = InboundMeter::new(tenant, ByteBudget::unlimited());
        let (mut client, server) = tokio::io::duplex(64);
        let mut reader = Metered::new(server, meter.clone());
        let first = crate::task::start("test-writer", async move {
            client.write_all(&[1u8; 600]).await.unwrap();
            client
        });
        let mut buf = vec![0u8; 600];
        reader.read_exact(&mut buf).await.unwrap();
        let mut client = first.await.unwrap();
        assert_eq!(held.get(), 600);
        assert!(meter.partial_since().is_some());
        // The message is handed on: its charge goes with it until dropped.
        let charge = meter.take();
        assert_eq!(charge.bytes(), 600);
        assert!(meter.partial_since().is_none());
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
