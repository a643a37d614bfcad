//! What gRPC clients send, budgeted like websocket messages (module
//! `transport::inbound`): an authenticated call's headers are charged on
//! arrival, held with the request's parts (at most
//! `GRPC_MAX_HEADER_LIST_BYTES` each, 100 streams a connection; refused
//! with RESOURCE_EXHAUSTED when the budget has no room), and its request body is read
//! through [`MeteredBody`], which charges each DATA frame to the caller's
//! tenant (`max_inbound_bytes`) and to the gateway
//! (`server.max_inbound_bytes`) before handing it to tonic, and keeps the
//! charge while tonic assembles the message it belongs to. With no room
//! the frame waits: hyper does not release its flow-control window, so
//! the client is held back by HTTP/2 itself, and what the gateway holds
//! of a connection beyond its charges is at most its window.
//!
//! Message boundaries come from gRPC's framing (a flag byte and a 4-byte
//! length before each message): tonic asks for more of the body only when
//! what it has holds no complete message, so at each poll every complete
//! message already read has been decoded and handed on, and only the
//! unfinished one keeps its charge. A message unfinished for longer than
//! `server.inbound_message_timeout` (the first one counted from the
//! stream's start) fails its call (DEADLINE_EXCEEDED), which gives its
//! bytes back. What HTTP/2 holds unread is bounded by the connection's
//! window, which its tenant's budget holds (module `transport::limits`).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::{Buf as _, Bytes};
use http_body::{Body, Frame};

use crate::outbound::{ByteBudget, Reservation};
use crate::transport::inbound::Charge;

type Reserving = Pin<Box<dyn Future<Output = (Reservation, Reservation)> + Send>>;

/// Where a message stands in gRPC's length-prefixed framing.
#[derive(Debug, Default)]
struct Framing {
    header: [u8; 5],
    header_len: usize,
    /// Body bytes of the current message still to come.
    left: usize,
    /// Bytes of the current (unfinished) message seen so far.
    partial: usize,
    /// The largest message length any header declared.
    largest: usize,
}

impl Framing {
    /// Account `data`; afterwards `partial` is what belongs to a message
    /// not yet complete.
    fn feed(&mut self, mut data: &[u8]) {
        while !data.is_empty() {
            if self.left == 0 && self.header_len < 5 {
                let n = (5 - self.header_len).min(data.len());
                self.header[self.header_len..self.header_len + n].copy_from_slice(&data[..n]);
                self.header_len += n;
                self.partial += n;
                data = &data[n..];
                if self.header_len == 5 {
                    let len = u32::from_be_bytes([
                        self.header[1],
                        self.header[2],
                        self.header[3],
                        self.header[4],
                    ]) as usize;
                    self.left = len;
                    self.largest = self.largest.max(len);
                    if len == 0 {
                        self.finish();
                    }
                }
                continue;
            }
            let n = self.left.min(data.len());
            self.left -= n;
            self.partial += n;
            data = &data[n..];
            if self.left == 0 {
                self.finish();
            }
        }
    }

    fn finish(&mut self) {
        self.header_len = 0;
        self.partial = 0;
    }
}

/// A request's header list as HTTP/2 counts it (RFC 7541: each field's
/// name and value plus 32 bytes), pseudo-headers' path included: what
/// its call is charged on arrival (`transport::grpc`).
pub fn header_bytes<B>(req: &hyper::Request<B>) -> usize {
    const FIELD_OVERHEAD: usize = 32;
    req.headers()
        .iter()
        .map(|(n, v)| n.as_str().len() + v.len() + FIELD_OVERHEAD)
        .sum::<usize>()
        + ":path".len()
        + req.uri().path().len()
        + FIELD_OVERHEAD
}

/// The budgets a call's body is charged to.
#[derive(Clone)]
pub struct InboundBudgets {
    pub tenant: Arc<ByteBudget>,
    pub gateway: Arc<ByteBudget>,
    pub message_timeout: Duration,
}

/// A request body charged as it is read (see the module docs).
pub struct MeteredBody<B> {
    inner: B,
    budgets: InboundBudgets,
    framing: Framing,
    charge: Charge,
    /// A frame read past the budget, handed on once it is charged.
    held: Option<(Frame<Bytes>, Reserving)>,
    /// The unfinished message's deadline.
    deadline: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl<B> MeteredBody<B> {
    /// The first message must be complete within the message timeout
    /// too: a stream that sends its headers and then nothing is cut like
    /// one that stops halfway.
    pub fn new(inner: B, budgets: InboundBudgets) -> MeteredBody<B> {
        let first = tokio::time::sleep(budgets.message_timeout);
        MeteredBody {
            inner,
            budgets,
            framing: Framing::default(),
            charge: Charge::default(),
            held: None,
            deadline: Some(Box::pin(first)),
        }
    }

    /// Account a frame that is being handed on; a message that could
    /// never fit the tenant's budget fails the call at its header.
    fn pass(&mut self, frame: &Frame<Bytes>) -> Result<(), tonic::Status> {
        if let Some(data) = frame.data_ref() {
            self.framing.feed(data.chunk());
        }
        let limit = self
            .budgets
            .tenant
            .capacity()
            .min(self.budgets.gateway.capacity());
        if self.framing.largest.saturating_add(5) > limit {
            self.charge = Charge::default();
            return Err(tonic::Status::resource_exhausted(format!(
                "a message of {} bytes cannot fit the tenant's inbound budget of {limit} bytes (max_inbound_bytes)",
                self.framing.largest
            )));
        }
        self.charge.keep(self.framing.partial);
        if self.framing.partial == 0 {
            self.deadline = None;
        } else if self.deadline.is_none() {
            self.deadline = Some(Box::pin(tokio::time::sleep(self.budgets.message_timeout)));
        }
        Ok(())
    }

    /// Hand `frame` on, or the error accounting it raised.
    fn hand_on(&mut self, frame: Frame<Bytes>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match self.pass(&frame) {
            Ok(()) => Poll::Ready(Some(Ok(frame))),
            Err(status) => Poll::Ready(Some(Err(Box::new(status)))),
        }
    }
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

impl<B> Body for MeteredBody<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        if let Some(d) = &mut this.deadline
            && d.as_mut().poll(cx).is_ready()
        {
            this.held = None;
            this.charge = Charge::default();
            return Poll::Ready(Some(Err(Box::new(tonic::Status::deadline_exceeded(
                "message not completed in time (server.inbound_message_timeout)",
            )))));
        }
        // Everything tonic read before this poll is decoded but for the
        // unfinished message: give the rest back.
        this.charge.keep(this.framing.partial);
        if let Some((_, waiting)) = &mut this.held {
            let (t, g) = ready!(waiting.as_mut().poll(cx));
            this.charge.add(t, g);
            let Some((frame, _)) = this.held.take() else {
                return Poll::Pending;
            };
            return this.hand_on(frame);
        }
        let frame = match ready!(Pin::new(&mut this.inner).poll_frame(cx)) {
            None => return Poll::Ready(None),
            Some(Err(e)) => return Poll::Ready(Some(Err(e.into()))),
            Some(Ok(f)) => f,
        };
        let n = frame.data_ref().map_or(0, |d| d.remaining());
        if n == 0 {
            return this.hand_on(frame);
        }
        match (
            this.budgets.tenant.try_reserve(n),
            this.budgets.gateway.try_reserve(n),
        ) {
            (Some(t), Some(g)) => {
                this.charge.add(t, g);
                this.hand_on(frame)
            }
            (t, g) => {
                // Over a budget: wait for room (whatever part was
                // reserved is given back first, so two waiters cannot
                // hold each other's halves).
                drop((t, g));
                let (tenant, gateway) = (this.budgets.tenant.clone(), this.budgets.gateway.clone());
                let mut waiting: Reserving =
                    Box::pin(async move { (tenant.reserve(n).await, gateway.reserve(n).await) });
                if this.deadline.is_none() {
                    this.deadline =
                        Some(Box::pin(tokio::time::sleep(this.budgets.message_timeout)));
                    if let Some(d) = &mut this.deadline {
                        let _ = d.as_mut().poll(cx);
                    }
                }
                match waiting.as_mut().poll(cx) {
                    Poll::Ready((t, g)) => {
                        this.charge.add(t, g);
                        this.hand_on(frame)
                    }
                    Poll::Pending => {
                        this.held = Some((frame, waiting));
                        Poll::Pending
                    }
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.held.is_none() && self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(len: usize) -> Vec<u8> {
        let mut m = vec![0u8];
        m.extend_from_slice(&(len as u32).to_be_bytes());
        m.extend(std::iter::repeat_n(7u8, len));
        m
    }

    #[test]
    fn framing_counts_only_the_unfinished_message() {
        let mut f = Framing::default();
        let mut data = message(10);
        data.extend(message(0));
        data.extend(&message(100)[..42]);
        // Split everywhere, headers included.
        for chunk in data.chunks(3) {
            f.feed(chunk);
        }
        assert_eq!(f.partial, 42);
        f.feed(&message(100)[42..]);
        assert_eq!(f.partial, 0);
    }
}
