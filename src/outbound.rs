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

use parking_lot::Mutex;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use tokio_util::sync::CancellationToken;

/// Messages queued per connection before producers wait.
pub const OUTBOUND_QUEUE_MESSAGES: usize = 256;
/// Bytes queued per connection before producers wait. A single larger
/// message (an `fs/readFile` result) takes the whole budget: it waits for the
/// queue to drain, then goes alone.
pub const OUTBOUND_QUEUE_BYTES: usize = 4 * 1024 * 1024;

/// One frame to write.
#[derive(Debug)]
pub enum OutFrame {
    /// A serialised JSON message, holding its share of the byte budget until
    /// the writer has written it.
    Text(String, Option<OwnedSemaphorePermit>),
    /// Close the connection with a websocket close code and reason.
    Close { code: u16, reason: String },
}

/// Sending half of a connection's outbound queue.
#[derive(Debug, Clone)]
pub struct Outbound {
    tx: mpsc::Sender<OutFrame>,
    budget: Arc<Semaphore>,
}

impl Outbound {
    pub fn channel() -> (Outbound, mpsc::Receiver<OutFrame>) {
        let (tx, rx) = mpsc::channel(OUTBOUND_QUEUE_MESSAGES);
        let budget = Arc::new(Semaphore::new(OUTBOUND_QUEUE_BYTES));
        (Outbound { tx, budget }, rx)
    }

    /// Queue a message, waiting for room (bytes and slots). False when the
    /// connection is gone.
    pub async fn send(&self, text: String) -> bool {
        let want = u32::try_from(text.len().clamp(1, OUTBOUND_QUEUE_BYTES)).unwrap_or(u32::MAX);
        let permit = tokio::select! {
            p = self.budget.clone().acquire_many_owned(want) => p.ok(),
            () = self.tx.closed() => return false,
        };
        self.tx.send(OutFrame::Text(text, permit)).await.is_ok()
    }

    /// Ask the writer to close the connection.
    pub async fn close(&self, code: u16, reason: impl Into<String>) {
        let _ = self
            .tx
            .send(OutFrame::Close {
                code,
                reason: reason.into(),
            })
            .await;
    }

    pub fn is_closed(&self) -> bool {
        self.tx.is_closed()
    }
}

/// Which connection currently holds a session (if any).
#[derive(Debug, Default)]
pub struct Attachment {
    current: Mutex<Option<Attached>>,
}

#[derive(Debug, Clone)]
struct Attached {
    generation: u64,
    outbound: Outbound,
    /// Cancelled when another connection takes the session over.
    evicted: CancellationToken,
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
            true
        } else {
            false
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
        let out = self.current.lock().as_ref().map(|a| a.outbound.clone());
        if let Some(out) = out {
            out.send(text).await;
        }
    }

    /// Evict the current holder (session killed or taken over).
    pub fn evict_all(&self) {
        if let Some(a) = self.current.lock().take() {
            a.evicted.cancel();
        }
    }
}
