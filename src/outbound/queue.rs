//! The frame queue under one connection's [`Outbound`](super::Outbound):
//! bounded in frames, many senders, one receiver, and nothing allocated
//! while it is empty.
//!
//! Why not `tokio::sync::mpsc`: a bounded tokio channel allocates its first
//! block of 32 slots and a cache-padded channel state when it is made (about
//! 1 KiB), which every idle connection then carries for its whole life. Here
//! the frames sit in a `VecDeque` that is given back whenever the writer
//! empties it; an idle connection keeps the queue's head only.

use std::collections::VecDeque;
use std::future::poll_fn;
use std::sync::Arc;
use std::task::{Poll, Waker};

use parking_lot::Mutex;
use tokio::sync::{Notify, Semaphore};

use super::OutFrame;

struct Shared {
    state: Mutex<State>,
    /// One permit per frame that may still be queued.
    slots: Semaphore,
    /// Woken when the receiver goes.
    receiver_gone: Notify,
}

struct State {
    frames: VecDeque<OutFrame>,
    /// The receiver, waiting for a frame.
    waiting: Option<Waker>,
    senders: usize,
    receiver: bool,
}

/// A queue of at most `capacity` frames.
pub fn queue(capacity: usize) -> (FrameSender, FrameReceiver) {
    let shared = Arc::new(Shared {
        state: Mutex::new(State {
            frames: VecDeque::new(),
            waiting: None,
            senders: 1,
            receiver: true,
        }),
        slots: Semaphore::new(capacity.clamp(1, Semaphore::MAX_PERMITS)),
        receiver_gone: Notify::new(),
    });
    (
        FrameSender {
            shared: shared.clone(),
        },
        FrameReceiver { shared },
    )
}

/// A sending half; clones count as senders, and the receiver sees the end
/// of the queue once the last is dropped and the frames are taken.
pub struct FrameSender {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for FrameSender {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FrameSender")
            .field("closed", &self.is_closed())
            .finish()
    }
}

impl Clone for FrameSender {
    fn clone(&self) -> Self {
        self.shared.state.lock().senders += 1;
        FrameSender {
            shared: self.shared.clone(),
        }
    }
}

impl Drop for FrameSender {
    fn drop(&mut self) {
        let waiting = {
            let mut s = self.shared.state.lock();
            s.senders -= 1;
            if s.senders == 0 {
                s.waiting.take()
            } else {
                None
            }
        };
        if let Some(w) = waiting {
            w.wake();
        }
    }
}

impl FrameSender {
    /// Queue `frame`, waiting for a free slot; the frame back when the
    /// receiver is gone.
    pub async fn send(&self, frame: OutFrame) -> Result<(), OutFrame> {
        // The slots are closed when the receiver goes.
        let Ok(permit) = self.shared.slots.acquire().await else {
            return Err(frame);
        };
        let waiting = {
            let mut s = self.shared.state.lock();
            if !s.receiver {
                return Err(frame);
            }
            // The slot is given back when the receiver takes the frame.
            permit.forget();
            s.frames.push_back(frame);
            s.waiting.take()
        };
        if let Some(w) = waiting {
            w.wake();
        }
        Ok(())
    }

    /// Resolves once the receiver is gone.
    pub async fn closed(&self) {
        loop {
            let notified = self.shared.receiver_gone.notified();
            let mut notified = std::pin::pin!(notified);
            // Registered before the check: a receiver dropped in between
            // still wakes this.
            notified.as_mut().enable();
            if self.is_closed() {
                return;
            }
            notified.await;
        }
    }

    pub fn is_closed(&self) -> bool {
        !self.shared.state.lock().receiver
    }
}

/// The receiving half.
pub struct FrameReceiver {
    shared: Arc<Shared>,
}

impl FrameReceiver {
    /// The next frame; `None` once every sender is gone and the queue is
    /// empty. Cancel-safe. Each frame spends the task's cooperative budget,
    /// as tokio's channels do: a queue that is never empty cannot hold a
    /// runtime thread from other tasks.
    pub async fn recv(&mut self) -> Option<OutFrame> {
        poll_fn(|cx| {
            let coop = std::task::ready!(tokio::task::coop::poll_proceed(cx));
            let mut s = self.shared.state.lock();
            if let Some(f) = self.take(&mut s) {
                coop.made_progress();
                return Poll::Ready(Some(f));
            }
            if s.senders == 0 {
                coop.made_progress();
                return Poll::Ready(None);
            }
            match &mut s.waiting {
                Some(w) if w.will_wake(cx.waker()) => {}
                w => *w = Some(cx.waker().clone()),
            }
            Poll::Pending
        })
        .await
    }

    /// The next frame if one is queued.
    pub fn try_recv(&mut self) -> Option<OutFrame> {
        let mut s = self.shared.state.lock();
        self.take(&mut s)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Frames queued.
    pub fn len(&self) -> usize {
        self.shared.state.lock().frames.len()
    }

    fn take(&self, s: &mut State) -> Option<OutFrame> {
        let f = s.frames.pop_front()?;
        if s.frames.is_empty() {
            // An idle connection keeps no room for frames.
            s.frames = VecDeque::new();
        }
        self.shared.slots.add_permits(1);
        Some(f)
    }
}

impl Drop for FrameReceiver {
    fn drop(&mut self) {
        let frames = {
            let mut s = self.shared.state.lock();
            s.receiver = false;
            s.waiting = None;
            std::mem::take(&mut s.frames)
        };
        self.shared.slots.close();
        self.shared.receiver_gone.notify_waiters();
        // What they hold of the byte budgets goes back here, outside the
        // lock.
        drop(frames);
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::outbound::CloseRequest;

    fn frame(code: u16) -> OutFrame {
        OutFrame::Close(Box::new(CloseRequest {
            code,
            reason: String::new(),
        }))
    }

    fn code(f: OutFrame) -> u16 {
        match f {
            OutFrame::Close(c) => c.code,
            OutFrame::Text(_) => 0,
        }
    }

    #[tokio::test]
    async fn frames_come_out_in_order_and_the_end_after_the_last_sender() {
        let (tx, mut rx) = queue(4);
        let tx2 = tx.clone();
        tx.send(frame(1)).await.unwrap();
        tx2.send(frame(2)).await.unwrap();
        drop(tx);
        assert_eq!(code(rx.recv().await.unwrap()), 1);
        assert_eq!(code(rx.try_recv().unwrap()), 2);
        assert!(rx.try_recv().is_none());
        drop(tx2);
        assert!(rx.recv().await.is_none());
    }

    #[tokio::test]
    async fn a_full_queue_holds_its_sender_until_a_frame_is_taken() {
        let (tx, mut rx) = queue(2);
        tx.send(frame(1)).await.unwrap();
        tx.send(frame(2)).await.unwrap();
        let third = crate::task::start("test", async move {
            tx.send(frame(3)).await.unwrap();
            tx
        });
        tokio::task::yield_now().await;
        assert!(!third.is_finished());
        assert_eq!(code(rx.recv().await.unwrap()), 1);
        let _tx = third.await.unwrap();
        assert_eq!(code(rx.recv().await.unwrap()), 2);
        assert_eq!(code(rx.recv().await.unwrap()), 3);
        assert!(rx.is_empty());
    }

    #[tokio::test]
    async fn a_receiver_waiting_is_woken_by_a_send_and_by_the_last_sender_going() {
        let (tx, mut rx) = queue(2);
        let got = crate::task::start("test", async move {
            let first = rx.recv().await.map(code);
            let end = rx.recv().await.is_none();
            (first, end)
        });
        tokio::task::yield_now().await;
        tx.send(frame(7)).await.unwrap();
        tokio::task::yield_now().await;
        drop(tx);
        assert_eq!(got.await.unwrap(), (Some(7), true));
    }

    #[tokio::test]
    async fn a_gone_receiver_fails_sends_wakes_waiters_and_drops_what_was_queued() {
        let (tx, rx) = queue(1);
        tx.send(frame(1)).await.unwrap();
        let tx2 = tx.clone();
        // Waiting for a slot, and waiting for the end.
        let blocked = crate::task::start(
            "test",
            async move { tx2.send(frame(2)).await.map_err(code) },
        );
        let tx3 = tx.clone();
        let closed = crate::task::start("test", async move { tx3.closed().await });
        tokio::task::yield_now().await;
        assert!(!tx.is_closed());
        drop(rx);
        assert_eq!(blocked.await.unwrap(), Err(2));
        closed.await.unwrap();
        assert!(tx.is_closed());
        assert_eq!(tx.send(frame(3)).await.map_err(code), Err(3));
        // The queue's only strong holders are the senders: the dropped
        // frame went with the receiver.
        assert!(tx.shared.state.lock().frames.is_empty());
    }

    #[tokio::test]
    async fn an_emptied_queue_keeps_no_room() {
        let (tx, mut rx) = queue(64);
        for i in 0..40 {
            tx.send(frame(i)).await.unwrap();
        }
        while rx.try_recv().is_some() {}
        assert_eq!(tx.shared.state.lock().frames.capacity(), 0);
        assert_eq!(tx.shared.slots.available_permits(), 64);
    }
}
