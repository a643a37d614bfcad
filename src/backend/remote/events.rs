//! A remote process's events for a gRPC stream (`Attach`, `Exec`).
//!
//! The executor pushes `process/output`, `process/exited` and
//! `process/closed` on the session's link; a stream hears them through the
//! link's tap ([`Taps`]) as they come. A `process/read` with `waitMs: 0`
//! catches up when the stream starts (output sent before it subscribed),
//! when its queue overflowed, and every [`SAFETY_POLL`] (notifications lost
//! while the link was re-made). No poll ever waits on the executor: the
//! official 0.169.0 executor answers one request at a time per connection,
//! so a long poll would hold the session's other calls (a `Write` to the
//! process's stdin) behind it.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use serde::Deserialize;
use tokio::sync::{Notify, mpsc};

use super::RemoteSession;
use crate::error::GatewayError;
use crate::protocol::methods as m;
use crate::protocol::process::{
    ClosedNotification, ExitedNotification, OutputNotification, ProcessEvent, ReadParams,
    ReadResponse,
};
use crate::registry::Tap;
use crate::rpc::{Call, EventSource, Reply};

/// Events queued toward a gRPC stream, and heard from the link per stream.
const REMOTE_EVENTS_QUEUE: usize = 64;
/// How often a stream asks the executor what it may have missed.
const SAFETY_POLL: Duration = Duration::from_secs(5);

/// What a stream heard from the executor.
#[derive(Debug, Clone)]
enum Heard {
    Output(OutputNotification),
    Exited(ExitedNotification),
    Closed,
}

struct Sub {
    process_id: String,
    tx: mpsc::Sender<Heard>,
    /// Woken when an event did not fit (the stream then polls).
    lagged: Arc<Notify>,
}

/// The gRPC streams following a session's processes.
#[derive(Default)]
pub struct Taps {
    next: AtomicU64,
    subs: Mutex<HashMap<u64, Sub>>,
}

#[derive(Deserialize)]
struct Frame<T> {
    params: T,
}

impl Taps {
    /// The link's tap for this session.
    pub fn tap(self: &Arc<Self>) -> Tap {
        let taps = self.clone();
        Arc::new(move |method: &str, text: &str| taps.hear(method, text))
    }

    fn hear(&self, method: &str, text: &str) {
        if self.subs.lock().is_empty() {
            return;
        }
        let parsed = match method {
            m::PROCESS_OUTPUT => serde_json::from_str::<Frame<OutputNotification>>(text)
                .map(|f| (f.params.process_id.clone(), Heard::Output(f.params))),
            m::PROCESS_EXITED => serde_json::from_str::<Frame<ExitedNotification>>(text)
                .map(|f| (f.params.process_id.clone(), Heard::Exited(f.params))),
            m::PROCESS_CLOSED => serde_json::from_str::<Frame<ClosedNotification>>(text)
                .map(|f| (f.params.process_id, Heard::Closed)),
            _ => return,
        };
        let Ok((process_id, heard)) = parsed else {
            return;
        };
        for sub in self.subs.lock().values() {
            if sub.process_id == process_id && sub.tx.try_send(heard.clone()).is_err() {
                sub.lagged.notify_one();
            }
        }
    }

    fn subscribe(self: &Arc<Self>, process_id: &str) -> (Subscription, mpsc::Receiver<Heard>) {
        let (tx, rx) = mpsc::channel(REMOTE_EVENTS_QUEUE);
        let lagged = Arc::new(Notify::new());
        let key = self.next.fetch_add(1, Ordering::Relaxed);
        self.subs.lock().insert(
            key,
            Sub {
                process_id: process_id.to_owned(),
                tx,
                lagged: lagged.clone(),
            },
        );
        let sub = Subscription {
            taps: self.clone(),
            key,
            lagged,
        };
        (sub, rx)
    }
}

/// A stream's place among the taps, left when dropped.
struct Subscription {
    taps: Arc<Taps>,
    key: u64,
    lagged: Arc<Notify>,
}

impl Drop for Subscription {
    fn drop(&mut self) {
        self.taps.subs.lock().remove(&self.key);
    }
}

/// A remote process's events.
pub struct RemoteEvents {
    pub(super) session: Arc<RemoteSession>,
    pub(super) process_id: String,
    /// Why the events ended early, for the stream's last word.
    pub(super) failure: Arc<Mutex<Option<GatewayError>>>,
}

/// What a stream has passed on: output seqs are the executor's (a client
/// attaches again with them); `exited` and `closed` get seqs past the last
/// one sent, so that they never hide output.
struct Follower {
    tx: mpsc::Sender<ProcessEvent>,
    /// The last output seq passed on (the next poll's `afterSeq`).
    after: u64,
    /// The last seq passed on.
    last: u64,
    exit_code: Option<i32>,
    exit_sent: bool,
}

/// Whether a stream goes on.
#[derive(PartialEq, Eq)]
enum Flow {
    More,
    Done,
}

impl Follower {
    async fn send(&mut self, event: ProcessEvent) -> Flow {
        self.last = self.last.max(event.seq());
        if self.tx.send(event).await.is_err() {
            Flow::Done
        } else {
            Flow::More
        }
    }

    async fn output(&mut self, n: OutputNotification) -> Flow {
        if n.seq <= self.after {
            return Flow::More;
        }
        self.after = n.seq;
        let event = ProcessEvent::Output {
            seq: n.seq,
            stream: n.stream,
            data: bytes::Bytes::from(n.chunk.0),
        };
        self.send(event).await
    }

    async fn exited(&mut self, code: i32, seq: Option<u64>) -> Flow {
        self.exit_code.get_or_insert(code);
        match seq {
            // Told with a seq past everything sent: pass it on now.
            Some(seq) if !self.exit_sent && seq > self.last => {
                self.exit_sent = true;
                self.send(ProcessEvent::Exited {
                    seq,
                    code,
                    signal: None,
                })
                .await
            }
            // Otherwise it goes just before `closed`.
            _ => Flow::More,
        }
    }

    async fn closed(&mut self) -> Flow {
        if !self.exit_sent {
            self.exit_sent = true;
            let event = ProcessEvent::Exited {
                seq: self.last.saturating_add(1),
                code: self.exit_code.unwrap_or(-1),
                signal: None,
            };
            if self.send(event).await == Flow::Done {
                return Flow::Done;
            }
        }
        let seq = self.last.saturating_add(1);
        let _ = self.send(ProcessEvent::Closed { seq }).await;
        Flow::Done
    }

    async fn read(&mut self, process_id: &str, r: ReadResponse) -> Flow {
        for c in r.chunks {
            let n = OutputNotification {
                process_id: process_id.to_owned(),
                seq: c.seq,
                stream: c.stream,
                chunk: c.chunk,
            };
            if self.output(n).await == Flow::Done {
                return Flow::Done;
            }
        }
        if r.exited && self.exited(r.exit_code.unwrap_or(-1), None).await == Flow::Done {
            return Flow::Done;
        }
        if r.closed {
            return self.closed().await;
        }
        Flow::More
    }
}

impl RemoteEvents {
    /// What the executor holds past `after`, without waiting.
    async fn poll(&self, after: u64) -> Result<ReadResponse, GatewayError> {
        let call = Call::ProcessRead(ReadParams {
            process_id: self.process_id.clone(),
            after_seq: Some(after),
            max_bytes: None,
            wait_ms: Some(0),
        });
        let scope = super::RunScope::default();
        let answer = tokio::time::timeout(
            self.session.open_timeout,
            self.session.call_typed(&call, &scope),
        )
        .await
        .map_err(|_| {
            self.session
                .unavailable("it did not answer process/read in time")
        })??;
        match answer {
            Reply::ProcessRead(r) => Ok(r),
            _ => Err(GatewayError::Internal("unexpected reply".to_owned())),
        }
    }
}

impl EventSource for RemoteEvents {
    fn subscribe(&self, after_seq: u64) -> (Vec<ProcessEvent>, mpsc::Receiver<ProcessEvent>) {
        let (tx, rx) = mpsc::channel(REMOTE_EVENTS_QUEUE);
        // Subscribed before the first poll: nothing falls between.
        let (sub, mut heard) = self.session.taps.subscribe(&self.process_id);
        let source = RemoteEvents {
            session: self.session.clone(),
            process_id: self.process_id.clone(),
            failure: self.failure.clone(),
        };
        crate::task::start("remote-events", async move {
            let mut f = Follower {
                tx,
                after: after_seq,
                last: after_seq,
                exit_code: None,
                exit_sent: false,
            };
            let (mut poll_now, mut closing) = (true, false);
            loop {
                if poll_now {
                    poll_now = false;
                    let polled = tokio::select! {
                        r = source.poll(f.after) => r,
                        () = f.tx.closed() => return,
                    };
                    let flow = match polled {
                        Ok(r) => f.read(&source.process_id, r).await,
                        // Told it closed, and nothing more to fetch.
                        Err(_) if closing => f.closed().await,
                        Err(e) => {
                            // The process or the link is gone: the door
                            // ends the stream with this error.
                            *source.failure.lock() = Some(e);
                            Flow::Done
                        }
                    };
                    if flow == Flow::Done {
                        return;
                    }
                }
                let flow = tokio::select! {
                    h = heard.recv() => match h {
                        Some(Heard::Output(n)) => f.output(n).await,
                        Some(Heard::Exited(n)) => f.exited(n.exit_code, Some(n.seq)).await,
                        // A last poll first: output that did not fit in
                        // the queue is fetched before the stream ends.
                        Some(Heard::Closed) => {
                            (poll_now, closing) = (true, true);
                            Flow::More
                        }
                        None => Flow::Done,
                    },
                    () = sub.lagged.notified() => {
                        poll_now = true;
                        Flow::More
                    }
                    () = tokio::time::sleep(SAFETY_POLL) => {
                        poll_now = true;
                        Flow::More
                    }
                    () = f.tx.closed() => Flow::Done,
                };
                if flow == Flow::Done {
                    return;
                }
            }
        });
        (Vec::new(), rx)
    }

    fn failure(&self) -> Option<GatewayError> {
        self.failure.lock().take()
    }
}
