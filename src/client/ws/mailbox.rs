//! Process notifications, decoded into the protocol's types, and the
//! attachments' mailboxes they are delivered to.
//!
//! A full mailbox (in events or bytes) stops the link's reader: the
//! gateway's queue for the connection fills and the process waits, as
//! behind a local pipe. Nothing is dropped.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use parking_lot::Mutex;
use serde_json::value::RawValue;
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore, mpsc};

use super::super::types::{ATTACH_BUFFER_BYTES, ATTACH_BUFFER_EVENTS, Stream, stream};
use crate::protocol::jsonrpc::decode_params;
use crate::protocol::methods;
use crate::protocol::process::{ClosedNotification, ExitedNotification, OutputNotification};

/// A process notification, decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Note {
    Output {
        seq: u64,
        stream: Stream,
        data: Vec<u8>,
    },
    Exited {
        seq: u64,
        code: i32,
    },
    Closed {
        seq: u64,
    },
}

impl Note {
    fn bytes(&self) -> usize {
        match self {
            Note::Output { data, .. } => data.len(),
            _ => 0,
        }
    }
}

/// A `process/output`, `process/exited` or `process/closed` notification:
/// its process and what it says. Other methods, and params that do not
/// decode, give `None`.
pub(super) fn decode_note(method: &str, params: Option<&RawValue>) -> Option<(String, Note)> {
    match method {
        methods::PROCESS_OUTPUT => {
            let n: OutputNotification = decode_params(params).ok()?;
            let note = Note::Output {
                seq: n.seq,
                stream: stream(n.stream),
                data: n.chunk.0,
            };
            Some((n.process_id, note))
        }
        methods::PROCESS_EXITED => {
            let n: ExitedNotification = decode_params(params).ok()?;
            let note = Note::Exited {
                seq: n.seq,
                code: n.exit_code,
            };
            Some((n.process_id, note))
        }
        methods::PROCESS_CLOSED => {
            let n: ClosedNotification = decode_params(params).ok()?;
            Some((n.process_id, Note::Closed { seq: n.seq }))
        }
        _ => None,
    }
}

/// What a mailbox holds: a note and the bytes it takes from the budget.
pub(super) type Mail = (Note, OwnedSemaphorePermit);

/// One attachment's mailbox.
pub(super) struct Sub {
    tx: mpsc::Sender<Mail>,
    /// Bytes of output held in the mailbox ([`ATTACH_BUFFER_BYTES`]).
    budget: Arc<Semaphore>,
    /// Set when the link died: the attachment must re-read.
    pub(super) lagged: AtomicBool,
    pub(super) wake: Notify,
}

impl Sub {
    /// A mailbox of [`ATTACH_BUFFER_EVENTS`] events and
    /// [`ATTACH_BUFFER_BYTES`] bytes, and its receiving end.
    pub(super) fn new() -> (Arc<Sub>, mpsc::Receiver<Mail>) {
        Sub::with_limits(ATTACH_BUFFER_EVENTS, ATTACH_BUFFER_BYTES)
    }

    fn with_limits(events: usize, bytes: usize) -> (Arc<Sub>, mpsc::Receiver<Mail>) {
        let (tx, rx) = mpsc::channel(events);
        let sub = Arc::new(Sub {
            tx,
            budget: Arc::new(Semaphore::new(bytes)),
            lagged: AtomicBool::new(false),
            wake: Notify::new(),
        });
        (sub, rx)
    }

    pub(super) fn lag(&self) {
        self.lagged.store(true, Ordering::Release);
        self.wake.notify_one();
    }

    /// The attachment is gone: a reader waiting for room gives up.
    pub(super) fn close(&self) {
        self.budget.close();
    }
}

/// Mailboxes of one process, with their attachment's key.
type ProcessSubs = Vec<(u64, Arc<Sub>)>;

/// Attachments by process id, shared by every link of the client.
#[derive(Default)]
pub(super) struct Subs {
    map: Mutex<HashMap<String, ProcessSubs>>,
    next: AtomicU64,
}

impl Subs {
    /// Register a mailbox for `process_id`; its key for [`Subs::remove`].
    pub(super) fn add(&self, process_id: &str, sub: Arc<Sub>) -> u64 {
        let key = self.next.fetch_add(1, Ordering::Relaxed);
        self.map
            .lock()
            .entry(process_id.to_owned())
            .or_default()
            .push((key, sub));
        key
    }

    pub(super) fn remove(&self, process_id: &str, key: u64) {
        let mut map = self.map.lock();
        if let Some(subs) = map.get_mut(process_id) {
            subs.retain(|(k, _)| *k != key);
            if subs.is_empty() {
                map.remove(process_id);
            }
        }
    }

    /// Hand `note` to each attachment of the process, waiting for room.
    pub(super) async fn deliver(&self, process_id: &str, note: Note) {
        let subs: Vec<Arc<Sub>> = match self.map.lock().get(process_id) {
            Some(subs) => subs.iter().map(|(_, s)| s.clone()).collect(),
            None => return,
        };
        let want = u32::try_from(note.bytes().min(ATTACH_BUFFER_BYTES)).unwrap_or(u32::MAX);
        for s in subs {
            // Closed when the attachment is dropped.
            let Ok(permit) = s.budget.clone().acquire_many_owned(want).await else {
                continue;
            };
            let _ = s.tx.send((note.clone(), permit)).await;
        }
    }

    /// How many attachments the process has.
    #[cfg(test)]
    pub(super) fn watching(&self, process_id: &str) -> usize {
        self.map.lock().get(process_id).map_or(0, Vec::len)
    }

    pub(super) fn lag_all(&self) {
        for subs in self.map.lock().values() {
            for (_, s) in subs {
                s.lag();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::time::Duration;

    use super::*;

    fn note(method: &str, params: &str) -> Option<(String, Note)> {
        let raw: Box<RawValue> = serde_json::from_str(params).unwrap();
        decode_note(method, Some(&raw))
    }

    #[test]
    fn notifications_decode_from_the_wire() {
        assert_eq!(
            note(
                "process/output",
                r#"{"processId":"p","seq":4,"stream":"stderr","chunk":"aGkK"}"#
            ),
            Some((
                "p".into(),
                Note::Output {
                    seq: 4,
                    stream: Stream::Stderr,
                    data: b"hi\n".to_vec()
                }
            ))
        );
        assert_eq!(
            note(
                "process/exited",
                r#"{"processId":"p","seq":5,"exitCode":137,"sandboxDenied":false}"#
            ),
            Some(("p".into(), Note::Exited { seq: 5, code: 137 }))
        );
        assert_eq!(
            note("process/closed", r#"{"processId":"p","seq":6}"#),
            Some(("p".into(), Note::Closed { seq: 6 }))
        );
    }

    #[test]
    fn other_or_broken_notifications_are_ignored() {
        assert_eq!(note("fs/missingChanged", r#"{"watchId":1}"#), None);
        // Not base64, an unknown stream, no seq.
        let bad = [
            r#"{"processId":"p","seq":1,"stream":"stdout","chunk":"***"}"#,
            r#"{"processId":"p","seq":1,"stream":"tty","chunk":"aGkK"}"#,
            r#"{"processId":"p","stream":"stdout","chunk":"aGkK"}"#,
        ];
        for params in bad {
            assert_eq!(note("process/output", params), None, "{params}");
        }
        assert_eq!(decode_note("process/closed", None), None);
    }

    fn output(seq: u64, n: usize) -> Note {
        Note::Output {
            seq,
            stream: Stream::Stdout,
            data: vec![b'x'; n],
        }
    }

    #[tokio::test]
    async fn a_full_mailbox_holds_the_reader_back_until_read() {
        let subs = Arc::new(Subs::default());
        let (sub, mut rx) = Sub::with_limits(16, 10);
        subs.add("p", sub);
        subs.deliver("p", output(1, 8)).await;
        // 8 of 10 bytes held: the next 8 wait for room.
        let pending = crate::task::start("client-test", {
            let subs = subs.clone();
            async move { subs.deliver("p", output(2, 8)).await }
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!pending.is_finished(), "delivered past the byte budget");
        let (first, permit) = rx.recv().await.unwrap();
        assert_eq!(first, output(1, 8));
        assert!(
            rx.try_recv().is_err(),
            "nothing is delivered while the note is held"
        );
        drop(permit);
        tokio::time::timeout(Duration::from_secs(5), pending)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(rx.recv().await.unwrap().0, output(2, 8));
    }

    #[tokio::test]
    async fn every_attachment_of_the_process_gets_each_note() {
        let subs = Subs::default();
        let (a, mut ra) = Sub::new();
        let (b, mut rb) = Sub::new();
        let (c, mut rc) = Sub::new();
        subs.add("p", a);
        let kb = subs.add("p", b);
        subs.add("q", c);
        subs.deliver("p", Note::Closed { seq: 1 }).await;
        assert_eq!(ra.try_recv().unwrap().0, Note::Closed { seq: 1 });
        assert_eq!(rb.try_recv().unwrap().0, Note::Closed { seq: 1 });
        assert!(rc.try_recv().is_err());
        subs.remove("p", kb);
        subs.deliver("p", Note::Closed { seq: 2 }).await;
        assert!(rb.try_recv().is_err(), "a removed mailbox gets nothing");
        assert_eq!(ra.try_recv().unwrap().0, Note::Closed { seq: 2 });
    }

    #[tokio::test]
    async fn a_closed_mailbox_does_not_block_delivery() {
        let subs = Subs::default();
        let (sub, _rx) = Sub::with_limits(16, 4);
        subs.add("p", sub.clone());
        subs.deliver("p", output(1, 4)).await;
        sub.close();
        // The budget is spent, but the attachment is gone: no wait.
        tokio::time::timeout(Duration::from_secs(5), subs.deliver("p", output(2, 4)))
            .await
            .unwrap();
        subs.lag_all();
        assert!(sub.lagged.load(Ordering::Acquire));
    }
}
