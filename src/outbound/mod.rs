//! The bounded outbound queue of one connection, and the session attachment
//! through which process tasks reach whichever connection holds the session.
//!
//! Back-pressure policy (docs/operations.md, "Limits"): a process task awaits room in
//! its connection's queue, so a client that stops reading stalls only its
//! own session's output pumps (their children block in `write`), never
//! another connection. The transport closes a connection whose writes stall
//! longer than the configured slow-client timeout; the session then detaches
//! and its output is kept for `process/read` within the retention cap.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};

use parking_lot::Mutex;
use prometheus_client::metrics::gauge::Gauge;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;

mod queue;
pub use queue::{FrameReceiver, FrameSender};

/// Messages queued per connection before producers wait.
pub const OUTBOUND_QUEUE_MESSAGES: usize = 256;
/// Bytes queued per connection before producers wait. A single larger
/// message (an `fs/readFile` result) takes the whole budget: it waits for the
/// queue to drain, then goes alone.
pub const OUTBOUND_QUEUE_BYTES: usize = 4 * 1024 * 1024;

/// The bytes a tenant's clients may have held for them (built, not yet
/// written), shared by all its connections. Every frame reserves its size
/// here (and in its connection's budget) before it is queued; an
/// `fs/readFile` reply reserves before the file is read.
#[derive(Debug)]
pub struct ByteBudget {
    sem: Arc<Semaphore>,
    capacity: usize,
    held: AtomicI64,
    peak: AtomicI64,
    /// Bytes ever reserved (what the tenant's account counts).
    total: std::sync::atomic::AtomicU64,
    held_gauge: Gauge,
    peak_gauge: Gauge,
    waiting_gauge: Gauge,
}

impl ByteBudget {
    /// A budget of `capacity` bytes reported through the three gauges
    /// (bytes held, their high-water mark, reservations waiting).
    pub fn new(capacity: usize, held: Gauge, peak: Gauge, waiting: Gauge) -> Arc<ByteBudget> {
        Arc::new(ByteBudget {
            sem: Arc::new(Semaphore::new(capacity.min(Semaphore::MAX_PERMITS))),
            capacity,
            held: AtomicI64::new(0),
            peak: AtomicI64::new(0),
            total: std::sync::atomic::AtomicU64::new(0),
            held_gauge: held,
            peak_gauge: peak,
            waiting_gauge: waiting,
        })
    }

    /// An unlimited, unreported budget (tests, internal connections).
    pub fn unlimited() -> Arc<ByteBudget> {
        Self::new(
            Semaphore::MAX_PERMITS,
            Gauge::default(),
            Gauge::default(),
            Gauge::default(),
        )
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Reserve `bytes` here alone (streams that have no outbound queue of
    /// their own: gRPC), waiting for room.
    pub async fn reserve(self: &Arc<Self>, bytes: usize) -> Reservation {
        let want = u32::try_from(bytes.clamp(1, self.capacity.max(1))).unwrap_or(u32::MAX);
        let waiting = WaitingGuard::new(&self.waiting_gauge);
        let permit = self.sem.clone().acquire_many_owned(want).await.ok();
        drop(waiting);
        let tenant = permit.map(|p| {
            self.account(i64::from(want));
            (p, self.clone())
        });
        Reservation {
            bytes,
            _conn: None,
            tenant,
        }
    }

    /// Reserve `bytes` here alone if there is room now (never waits).
    pub fn try_reserve(self: &Arc<Self>, bytes: usize) -> Option<Reservation> {
        let want = u32::try_from(bytes.clamp(1, self.capacity.max(1))).unwrap_or(u32::MAX);
        let permit = self.sem.clone().try_acquire_many_owned(want).ok()?;
        self.account(i64::from(want));
        Some(Reservation {
            bytes,
            _conn: None,
            tenant: Some((permit, self.clone())),
        })
    }

    /// Bytes held now.
    pub fn held(&self) -> i64 {
        self.held.load(Ordering::Relaxed)
    }

    /// Bytes ever reserved here.
    pub fn total(&self) -> u64 {
        self.total.load(Ordering::Relaxed)
    }

    fn account(&self, delta: i64) {
        let now = self.held.fetch_add(delta, Ordering::AcqRel) + delta;
        self.held_gauge.set(now);
        if delta > 0 {
            self.total
                .fetch_add(delta.unsigned_abs(), Ordering::Relaxed);
            let peak = self.peak.fetch_max(now, Ordering::AcqRel).max(now);
            self.peak_gauge.set(peak);
        }
    }
}

/// Bytes reserved in a connection's and its tenant's budgets; released
/// when dropped (once the frame holding it is written).
#[derive(Debug)]
pub struct Reservation {
    bytes: usize,
    _conn: Option<OwnedSemaphorePermit>,
    tenant: Option<(OwnedSemaphorePermit, Arc<ByteBudget>)>,
}

impl Reservation {
    /// Bytes this reservation covers.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Split `n` bytes off into a reservation of their own (given back
    /// when it is dropped); `None` if this one holds no more than `n`.
    pub fn split(&mut self, n: usize) -> Option<Reservation> {
        if n == 0 || n >= self.bytes {
            return None;
        }
        let part = match &mut self.tenant {
            Some((permit, budget)) => {
                let p = permit.split(n)?;
                Some((p, budget.clone()))
            }
            None => None,
        };
        self.bytes -= n;
        Some(Reservation {
            bytes: n,
            _conn: None,
            tenant: part,
        })
    }

    /// Hold `other`'s bytes here too (reservations of one budget alone, as
    /// [`ByteBudget::reserve`] and [`ByteBudget::try_reserve`] make them).
    pub fn merge(&mut self, mut other: Reservation) {
        match (&mut self.tenant, other.tenant.take()) {
            (Some((mine, _)), Some((theirs, _))) => {
                self.bytes += other.bytes;
                mine.merge(theirs);
            }
            (None, theirs) => {
                self.bytes += other.bytes;
                self.tenant = theirs;
            }
            (Some(_), None) => self.bytes += other.bytes,
        }
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        if let Some((permit, budget)) = &self.tenant {
            budget.account(-(permit.num_permits() as i64));
        }
    }
}

/// One frame to write (two words: queued frames are boxed).
#[derive(Debug)]
pub enum OutFrame {
    /// A serialised JSON message, holding its share of the byte budgets
    /// until the writer has written it.
    Text(Box<QueuedText>),
    /// Close the connection with a websocket close code and reason.
    Close(Box<CloseRequest>),
}

/// A queued JSON message and what it holds of the byte budgets.
#[derive(Debug)]
pub struct QueuedText {
    pub text: String,
    pub held: Option<Reservation>,
}

impl AsRef<str> for QueuedText {
    fn as_ref(&self) -> &str {
        &self.text
    }
}

/// A websocket close code and reason.
#[derive(Debug)]
pub struct CloseRequest {
    pub code: u16,
    pub reason: String,
}

/// Sending half of a connection's outbound queue.
#[derive(Debug, Clone)]
pub struct Outbound {
    tx: FrameSender,
    budget: Arc<Semaphore>,
    tenant: Arc<ByteBudget>,
}

/// The connection is gone: nothing can be queued for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Closed;

impl Outbound {
    /// A queue whose frames also count against `tenant`.
    pub fn channel(tenant: Arc<ByteBudget>) -> (Outbound, FrameReceiver) {
        let (tx, rx) = queue::queue(OUTBOUND_QUEUE_MESSAGES);
        let budget = Arc::new(Semaphore::new(OUTBOUND_QUEUE_BYTES));
        (Outbound { tx, budget, tenant }, rx)
    }

    /// Reserve room for `bytes` of output, waiting until both the
    /// connection's queue and the tenant's budget have it. A message larger
    /// than the connection queue takes all of it (it goes alone); one larger
    /// than the tenant's budget takes all of that.
    pub async fn reserve(&self, bytes: usize) -> Result<Reservation, Closed> {
        self.reserve_parts(bytes, self.conn_share(bytes), self.tenant_share(bytes))
            .await
    }

    /// What `bytes` take of the connection's queue (all of it at most).
    fn conn_share(&self, bytes: usize) -> u32 {
        u32::try_from(bytes.clamp(1, OUTBOUND_QUEUE_BYTES)).unwrap_or(u32::MAX)
    }

    /// What `bytes` take of the tenant's budget (all of it at most).
    fn tenant_share(&self, bytes: usize) -> u32 {
        u32::try_from(bytes.clamp(1, self.tenant.capacity.max(1))).unwrap_or(u32::MAX)
    }

    /// Reserve `conn_want` of the connection's queue and `tenant_want` of
    /// the tenant's budget (either may be 0), covering `bytes`.
    async fn reserve_parts(
        &self,
        bytes: usize,
        conn_want: u32,
        tenant_want: u32,
    ) -> Result<Reservation, Closed> {
        let waiting = WaitingGuard::new(&self.tenant.waiting_gauge);
        let acquire = async {
            let conn = match conn_want {
                0 => None,
                n => self.budget.clone().acquire_many_owned(n).await.ok(),
            };
            let tenant = match tenant_want {
                0 => None,
                n => self.tenant.sem.clone().acquire_many_owned(n).await.ok(),
            };
            (conn, tenant)
        };
        let (conn, tenant) = tokio::select! {
            p = acquire => p,
            () = self.tx.closed() => return Err(Closed),
        };
        drop(waiting);
        let tenant = tenant.map(|p| {
            self.tenant.account(i64::from(tenant_want));
            (p, self.tenant.clone())
        });
        Ok(Reservation {
            bytes,
            _conn: conn,
            tenant,
        })
    }

    /// Queue a message, waiting for room (bytes and slots). False when the
    /// connection is gone.
    pub async fn send(&self, text: String) -> bool {
        match self.reserve(text.len()).await {
            Ok(r) => self.send_reserved(text, r).await,
            Err(Closed) => false,
        }
    }

    /// Queue a message whose bytes were reserved before it was built,
    /// reserving whatever it outgrew.
    pub async fn send_reserved(&self, text: String, mut reserved: Reservation) -> bool {
        if text.len() > reserved.bytes {
            // It outgrew its reservation (a long request id in the head):
            // give the reservation back and wait for the whole size, never
            // holding part of a budget while waiting for more of it. Replies
            // that each held a share and waited for a little more would
            // otherwise wait on one another until their deadline.
            drop(reserved);
            reserved = match self.reserve(text.len()).await {
                Ok(r) => r,
                Err(Closed) => return false,
            };
        }
        self.tx
            .send(OutFrame::Text(Box::new(QueuedText {
                text,
                held: Some(reserved),
            })))
            .await
            .is_ok()
    }

    /// Ask the writer to close the connection.
    pub async fn close(&self, code: u16, reason: impl Into<String>) {
        let _ = self
            .tx
            .send(OutFrame::Close(Box::new(CloseRequest {
                code,
                reason: reason.into(),
            })))
            .await;
    }

    pub fn is_closed(&self) -> bool {
        self.tx.is_closed()
    }
}

/// Where one request's reply goes on a JSON-RPC connection, handed to the
/// handler (not returned by it): a large reply reserves its bytes here
/// before it is built, is encoded straight into the frame, and is sent by
/// the handler, which then answers `Outcome::Sent`.
#[derive(Debug, Clone)]
pub struct Responder {
    out: Outbound,
    id: crate::protocol::jsonrpc::RequestId,
}

impl Responder {
    pub fn new(out: Outbound, id: crate::protocol::jsonrpc::RequestId) -> Responder {
        Responder { out, id }
    }

    /// The connection's queue (to reserve a reply's bytes).
    pub fn outbound(&self) -> &Outbound {
        &self.out
    }

    /// Send an encoded `result` (after `gap` leading spaces) as the
    /// response, in the bytes `held` reserved for it.
    pub async fn send_encoded(&self, result: String, gap: usize, held: Reservation) -> bool {
        let text = crate::protocol::jsonrpc::encode_response_around(&self.id, result, gap);
        self.out.send_reserved(text, held).await
    }
}

/// Counts a reservation waiting for room while it lives.
struct WaitingGuard<'a>(&'a Gauge);

impl<'a> WaitingGuard<'a> {
    fn new(g: &'a Gauge) -> Self {
        g.inc();
        WaitingGuard(g)
    }
}

impl Drop for WaitingGuard<'_> {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// Which connection currently holds a session (if any).
#[derive(Debug, Default)]
pub struct Attachment {
    current: Mutex<Option<Attached>>,
    /// Requests sent to the client, waiting for its answer.
    asked: Mutex<Asked>,
}

/// Requests the gateway sent to its client (`network/policyRequest`) and
/// not yet answered: ids from 1, as the reference numbers them.
#[derive(Debug, Default)]
struct Asked {
    next: u64,
    pending: std::collections::HashMap<u64, tokio::sync::oneshot::Sender<Option<String>>>,
}

/// Requests one session may have waiting on its client at once (the
/// reference's `MAX_IN_FLIGHT_SERVER_CALLS`); past it one fails at once.
pub const MAX_PENDING_CLIENT_REQUESTS: usize = 256;

/// How a request to the client ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClientAnswer {
    /// Its `result`, as sent.
    Result(String),
    /// An error response.
    Error,
    /// No client attached, it left, or it did not answer in time.
    NoAnswer,
    /// Too many requests waiting already.
    Busy,
}

#[derive(Debug, Clone)]
struct Attached {
    generation: u64,
    outbound: Outbound,
    /// Cancelled when another connection takes the session over.
    evicted: CancellationToken,
    /// A draining gateway queued a close on it.
    closing: bool,
}

/// What a connection keeps to know whether it still holds its session.
#[derive(Debug, Clone)]
pub struct AttachToken {
    pub generation: u64,
    pub evicted: CancellationToken,
}

impl Attachment {
    /// Attach `outbound`, replacing (and evicting) any previous holder.
    pub fn attach(&self, generation: u64, outbound: Outbound) -> AttachToken {
        let evicted = CancellationToken::new();
        let previous = self.current.lock().replace(Attached {
            generation,
            outbound,
            evicted: evicted.clone(),
            closing: false,
        });
        if let Some(p) = previous {
            p.evicted.cancel();
        }
        AttachToken {
            generation,
            evicted,
        }
    }

    /// Detach if `generation` still holds the session. True if it did.
    pub fn detach(&self, generation: u64) -> bool {
        let mut cur = self.current.lock();
        if cur.as_ref().is_some_and(|a| a.generation == generation) {
            *cur = None;
            drop(cur);
            // Its client will not answer: what it was asked gets no answer.
            self.asked.lock().pending.clear();
            true
        } else {
            false
        }
    }

    /// Send the attached client the request `method` with `params` and
    /// wait at most `wait` for its answer.
    pub async fn request(
        &self,
        method: &str,
        params: serde_json::Value,
        wait: std::time::Duration,
    ) -> ClientAnswer {
        let Some(out) = self.current.lock().as_ref().map(|a| a.outbound.clone()) else {
            return ClientAnswer::NoAnswer;
        };
        let (id, rx) = {
            let mut asked = self.asked.lock();
            if asked.pending.len() >= MAX_PENDING_CLIENT_REQUESTS {
                return ClientAnswer::Busy;
            }
            asked.next += 1;
            let id = asked.next;
            let (tx, rx) = tokio::sync::oneshot::channel();
            asked.pending.insert(id, tx);
            (id, rx)
        };
        let text = serde_json::json!({ "id": id, "method": method, "params": params }).to_string();
        // The wait covers the send too: a client that reads nothing fills
        // its queue and is not waited for past it.
        let asked = async move {
            out.send(text).await;
            rx.await
        };
        let answer = match tokio::time::timeout(wait, asked).await {
            Ok(Ok(Some(result))) => ClientAnswer::Result(result),
            Ok(Ok(None)) => ClientAnswer::Error,
            Ok(Err(_)) | Err(_) => ClientAnswer::NoAnswer,
        };
        self.asked.lock().pending.remove(&id);
        answer
    }

    /// The client's answer to request `id` (`None`: an error). False if no
    /// such request waits (answered late, or never asked).
    pub fn answer(&self, id: u64, result: Option<String>) -> bool {
        match self.asked.lock().pending.remove(&id) {
            Some(tx) => tx.send(result).is_ok(),
            None => false,
        }
    }

    pub fn is_attached(&self) -> bool {
        self.current
            .lock()
            .as_ref()
            .is_some_and(|a| !a.outbound.is_closed())
    }

    /// Deliver a notification to the attached connection, if any; dropped
    /// while detached (the reference does not replay notifications).
    pub async fn notify(&self, text: String) {
        self.notify_with(|| text).await;
    }

    /// As [`Attachment::notify`], building the text only when a connection
    /// is attached: a gRPC session's output is never base64-encoded into
    /// JSON no one reads (9% of the gateway's CPU streaming over gRPC).
    pub async fn notify_with(&self, build: impl FnOnce() -> String) {
        let out = self.current.lock().as_ref().map(|a| a.outbound.clone());
        if let Some(out) = out {
            out.send(build()).await;
        }
    }

    /// Evict the current holder (session killed or taken over).
    /// The attached connection's queue, once per attachment, for a
    /// draining gateway to queue its close behind everything sent so far.
    pub fn take_for_close(&self) -> Option<Outbound> {
        let mut cur = self.current.lock();
        let a = cur.as_mut()?;
        if a.closing || a.outbound.is_closed() {
            return None;
        }
        a.closing = true;
        Some(a.outbound.clone())
    }

    pub fn evict_all(&self) {
        if let Some(a) = self.current.lock().take() {
            a.evicted.cancel();
        }
        self.asked.lock().pending.clear();
    }
}

#[cfg(test)]
mod budget_tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// A request to the client: answered by its id, or nothing past the
    /// wait, when detached, or past the bound.
    #[tokio::test]
    async fn requests_to_the_client_are_answered_by_id_and_bounded() {
        let tenant = ByteBudget::new(
            1 << 30,
            Gauge::default(),
            Gauge::default(),
            Gauge::default(),
        );
        let a = Arc::new(Attachment::default());
        let wait = std::time::Duration::from_secs(30);
        assert_eq!(
            a.request("m", serde_json::json!({}), wait).await,
            ClientAnswer::NoAnswer,
            "no client attached"
        );
        let (out, mut rx) = Outbound::channel(tenant);
        let token = a.attach(1, out);
        let asked = crate::task::start("test", {
            let a = a.clone();
            async move { a.request("m", serde_json::json!({"x": 1}), wait).await }
        });
        let OutFrame::Text(frame) = rx.recv().await.unwrap() else {
            panic!("not a message")
        };
        let sent: serde_json::Value = serde_json::from_str(&frame.text).unwrap();
        assert_eq!(sent["id"], 1);
        assert_eq!(sent["params"]["x"], 1);
        assert!(!a.answer(2, Some("{}".into())), "never asked");
        assert!(a.answer(1, Some("{\"ok\":true}".into())));
        assert_eq!(
            asked.await.unwrap(),
            ClientAnswer::Result("{\"ok\":true}".into())
        );
        // Unanswered: nothing once the wait is over.
        let short = std::time::Duration::from_millis(10);
        assert_eq!(
            a.request("m", serde_json::json!({}), short).await,
            ClientAnswer::NoAnswer
        );
        // Past the bound, at once.
        let mut waiting = Vec::new();
        for _ in 0..MAX_PENDING_CLIENT_REQUESTS {
            let a = a.clone();
            waiting.push(crate::task::start("test", async move {
                a.request("m", serde_json::json!({}), wait).await
            }));
        }
        while a.asked.lock().pending.len() < MAX_PENDING_CLIENT_REQUESTS {
            tokio::task::yield_now().await;
        }
        assert_eq!(
            a.request("m", serde_json::json!({}), wait).await,
            ClientAnswer::Busy
        );
        // The client leaves (its connection's queue goes with it): every
        // waiting request ends with no answer.
        drop(rx);
        a.detach(token.generation);
        for w in waiting {
            assert_eq!(w.await.unwrap(), ClientAnswer::NoAnswer);
        }
    }

    #[tokio::test]
    async fn frames_hold_their_bytes_until_written_and_big_ones_go_alone() {
        let tenant = ByteBudget::new(
            10 * 1024 * 1024,
            Gauge::default(),
            Gauge::default(),
            Gauge::default(),
        );
        let (out, mut rx) = Outbound::channel(tenant.clone());
        assert!(out.send("x".repeat(6 * 1024 * 1024)).await);
        assert_eq!(tenant.held(), 6 * 1024 * 1024);
        // The connection queue is full (a big frame takes all of it): the
        // next reservation waits.
        let pending = crate::task::start("test", {
            let out = out.clone();
            async move { out.reserve(10).await.map(|r| r.bytes()) }
        });
        tokio::task::yield_now().await;
        assert!(!pending.is_finished());
        let frame = rx.recv().await.unwrap();
        drop(frame);
        assert_eq!(pending.await.unwrap(), Ok(10));
        // Dropped reservations give the bytes back.
        assert_eq!(tenant.held(), 0);
    }

    #[tokio::test]
    async fn a_tenant_budget_is_shared_by_its_connections() {
        let tenant = ByteBudget::new(100, Gauge::default(), Gauge::default(), Gauge::default());
        let (a, _ra) = Outbound::channel(tenant.clone());
        let (b, _rb) = Outbound::channel(tenant.clone());
        let held = a.reserve(80).await.unwrap();
        let waiting = crate::task::start(
            "test",
            async move { b.reserve(30).await.map(|r| r.bytes()) },
        );
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished());
        drop(held);
        assert_eq!(waiting.await.unwrap(), Ok(30));
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[tokio::test]
    async fn replies_outgrowing_their_reservations_do_not_wait_on_each_other() {
        // Three reservations fill the connection's queue exactly; then each
        // reply outgrows its own by a few bytes. None may hold its share
        // while waiting for more, or all three wait forever.
        let (out, mut rx) = Outbound::channel(ByteBudget::unlimited());
        let part = OUTBOUND_QUEUE_BYTES / 3;
        let sizes = [part, part, OUTBOUND_QUEUE_BYTES - 2 * part];
        let mut held = Vec::new();
        for n in sizes {
            held.push((n, out.reserve(n).await.unwrap()));
        }
        let sends: Vec<_> = held
            .into_iter()
            .map(|(n, r)| {
                let out = out.clone();
                crate::task::start("test", async move {
                    out.send_reserved("x".repeat(n + 100), r).await
                })
            })
            .collect();
        for _ in 0..3 {
            let frame = tokio::time::timeout(std::time::Duration::from_secs(10), rx.recv())
                .await
                .expect("every reply is written");
            assert!(frame.is_some());
        }
        for s in sends {
            assert!(s.await.unwrap());
        }
    }

    #[tokio::test]
    async fn a_message_outgrowing_a_whole_budget_reservation_is_queued() {
        let (out, mut rx) = Outbound::channel(ByteBudget::unlimited());
        let held = out.reserve(OUTBOUND_QUEUE_BYTES + 10).await.unwrap();
        let text = "x".repeat(OUTBOUND_QUEUE_BYTES + 40);
        let sent = tokio::time::timeout(
            std::time::Duration::from_secs(5),
            out.send_reserved(text, held),
        )
        .await
        .expect("queued without waiting on its own reservation");
        assert!(sent);
        assert!(rx.recv().await.is_some());
        // Released once written: the whole queue is free again.
        let again = tokio::time::timeout(
            std::time::Duration::from_secs(5),
            out.reserve(OUTBOUND_QUEUE_BYTES),
        )
        .await
        .expect("budget released");
        assert!(again.is_ok());
    }
}
