//! A process's events over websocket: live notifications, checked against
//! the seq they should carry; any gap (a dropped connection, a full
//! mailbox) is filled by `process/read` from the cursor.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::sync::mpsc;

use super::super::error::{ClientError, Result};
use super::super::types::{Event, stream};
use super::WsClient;
use super::mailbox::{Mail, Note, Sub};
use crate::protocol::methods;
use crate::protocol::process::{ReadParams, ReadResponse};

/// Where an attachment is in the process's log, and the events it has
/// ready: the seq bookkeeping, apart from any connection.
#[derive(Debug, Default)]
struct Log {
    ready: VecDeque<Event>,
    /// The last output seq yielded.
    cursor: u64,
    /// The seq the next notification should carry (0: not known yet).
    next: u64,
    /// A gap was seen: read from the cursor before going on.
    need_sync: bool,
    exited: bool,
    closed: bool,
}

impl Log {
    fn after(cursor: u64) -> Log {
        Log {
            cursor,
            need_sync: true,
            ..Log::default()
        }
    }

    /// A live notification: taken when it is the next seq, skipped when
    /// already seen, a gap otherwise.
    fn on_note(&mut self, note: Note) {
        match note {
            Note::Output { seq, stream, data } => {
                if seq < self.next || seq <= self.cursor {
                    return;
                }
                if seq > self.next {
                    self.need_sync = true;
                    return;
                }
                self.cursor = seq;
                self.next = seq + 1;
                self.ready.push_back(Event::Output {
                    seq,
                    stream,
                    data: data.into(),
                });
            }
            Note::Exited { seq, code } => {
                if seq > self.next {
                    self.need_sync = true;
                    return;
                }
                self.next = self.next.max(seq + 1);
                if !self.exited {
                    self.exited = true;
                    self.ready.push_back(Event::Exited { code, signal: None });
                }
            }
            Note::Closed { seq } => {
                if seq > self.next || !self.exited {
                    self.need_sync = true;
                    return;
                }
                self.next = self.next.max(seq + 1);
                self.closed = true;
            }
        }
    }

    /// What `process/read` after the cursor returned.
    fn on_read(&mut self, r: ReadResponse) {
        // The gateway keeps the newest 1 MiB of a process's output: after a
        // long enough absence the read starts past the cursor. Only an
        // exit may sit between two outputs.
        if let Some(first) = r.chunks.iter().find(|c| c.seq > self.cursor) {
            let slack = u64::from(r.exited || self.exited);
            let missing = first.seq.saturating_sub(self.cursor + 1 + slack);
            if missing > 0 {
                self.ready.push_back(Event::OutputLost { chunks: missing });
            }
        }
        for c in r.chunks {
            if c.seq <= self.cursor {
                continue;
            }
            self.cursor = c.seq;
            self.ready.push_back(Event::Output {
                seq: c.seq,
                stream: stream(c.stream),
                data: c.chunk.0.into(),
            });
        }
        self.next = self.next.max(r.next_seq);
        if r.exited && !self.exited {
            self.exited = true;
            self.ready.push_back(Event::Exited {
                code: r.exit_code.unwrap_or(-1),
                signal: None,
            });
        }
        if r.closed {
            self.closed = true;
        }
    }
}

pub(in super::super) struct WsAttachment<'c> {
    client: &'c WsClient,
    process_id: String,
    key: u64,
    sub: Arc<Sub>,
    rx: mpsc::Receiver<Mail>,
    log: Log,
    resyncs: u64,
}

impl<'c> WsAttachment<'c> {
    /// Listen for the process's notifications; the first [`next`] reads
    /// what came after `after_seq`.
    ///
    /// [`next`]: WsAttachment::next
    pub(super) fn new(client: &'c WsClient, process_id: &str, after_seq: u64) -> WsAttachment<'c> {
        let (sub, rx) = Sub::new();
        let key = client.subs.add(process_id, sub.clone());
        WsAttachment {
            client,
            process_id: process_id.to_owned(),
            key,
            sub,
            rx,
            log: Log::after(after_seq),
            resyncs: 0,
        }
    }

    /// For a process not started yet: its first notification is seq 1,
    /// and there is nothing to read before it.
    pub(super) fn listening_from_seq_one(mut self) -> Self {
        self.log.need_sync = false;
        self.log.next = 1;
        self
    }

    pub(in super::super) fn cursor(&self) -> u64 {
        self.log.cursor
    }

    pub(in super::super) fn resyncs(&self) -> u64 {
        self.resyncs
    }

    pub(in super::super) async fn next(&mut self) -> Result<Option<Event>> {
        loop {
            if let Some(e) = self.log.ready.pop_front() {
                return Ok(Some(e));
            }
            if self.log.closed {
                return Ok(None);
            }
            if self.sub.lagged.swap(false, Ordering::AcqRel) {
                // The link died: what reached the mailbox first is taken
                // before re-reading, so none of it counts as lost.
                while let Ok((n, _permit)) = self.rx.try_recv() {
                    self.log.on_note(n);
                }
                self.log.need_sync = true;
                continue;
            }
            if self.log.need_sync {
                self.log.need_sync = false;
                self.sync().await?;
                continue;
            }
            tokio::select! {
                note = self.rx.recv() => match note {
                    Some((n, _permit)) => self.log.on_note(n),
                    None => self.log.need_sync = true,
                },
                () = self.sub.wake.notified() => {}
            }
        }
    }

    /// Read what the process retains after the cursor.
    async fn sync(&mut self) -> Result<()> {
        self.resyncs += 1;
        // The mailbox is drained while the read is in flight: its reply
        // comes through the same link reader that waits for room in the
        // mailbox, so a full mailbox left alone would hold the reply back
        // for good. What arrives meanwhile is sorted out after the read.
        let mut meanwhile = Vec::new();
        let params = ReadParams {
            process_id: self.process_id.clone(),
            after_seq: Some(self.log.cursor),
            max_bytes: None,
            wait_ms: None,
        };
        let r: ReadResponse = loop {
            let call = self.client.call(methods::PROCESS_READ, &params);
            tokio::pin!(call);
            let reply = loop {
                tokio::select! {
                    r = &mut call => break r,
                    Some((n, _permit)) = self.rx.recv() => meanwhile.push(n),
                }
            };
            match reply {
                Err(ClientError::Rpc { message, .. }) if message.ends_with("is starting") => {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                r => break r?,
            }
        };
        self.log.on_read(r);
        // Notifications that came during the read: those it covered are
        // skipped by seq, a gap after it asks for another read.
        for n in meanwhile {
            self.log.on_note(n);
        }
        Ok(())
    }
}

impl Drop for WsAttachment<'_> {
    fn drop(&mut self) {
        // A reader waiting for room here gives up.
        self.sub.close();
        self.client.subs.remove(&self.process_id, self.key);
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::sync::atomic::AtomicU32;

    use serde_json::{Value, json};

    use super::super::super::types::Stream;
    use super::super::testing::{error, fake};
    use super::*;
    use crate::protocol::ByteChunk;
    use crate::protocol::process::{ProcessOutputChunk, StreamName};
    use crate::protocol::revision::Revision;

    fn out(seq: u64, text: &str) -> Note {
        Note::Output {
            seq,
            stream: Stream::Stdout,
            data: text.as_bytes().to_vec(),
        }
    }

    fn output(seq: u64, text: &str) -> Event {
        Event::Output {
            seq,
            stream: Stream::Stdout,
            data: bytes::Bytes::copy_from_slice(text.as_bytes()),
        }
    }

    fn live() -> Log {
        Log {
            next: 1,
            ..Log::default()
        }
    }

    #[test]
    fn notes_in_order_become_events_and_repeats_are_skipped() {
        let mut log = live();
        log.on_note(out(1, "a"));
        log.on_note(out(2, "b"));
        log.on_note(out(2, "b"));
        log.on_note(out(1, "a"));
        log.on_note(Note::Exited { seq: 3, code: 7 });
        log.on_note(Note::Exited { seq: 3, code: 7 });
        log.on_note(Note::Closed { seq: 4 });
        assert!(!log.need_sync);
        assert!(log.closed);
        assert_eq!((log.cursor, log.next), (2, 5));
        assert_eq!(
            Vec::from(log.ready),
            [
                output(1, "a"),
                output(2, "b"),
                Event::Exited {
                    code: 7,
                    signal: None
                }
            ]
        );
    }

    #[test]
    fn a_gap_asks_for_a_read_and_yields_nothing() {
        let mut log = live();
        log.on_note(out(1, "a"));
        log.on_note(out(3, "c"));
        assert!(log.need_sync);
        assert_eq!(log.cursor, 1, "the cursor stays before the gap");
        assert_eq!(log.ready.len(), 1);

        let mut log = live();
        log.on_note(Note::Exited { seq: 2, code: 0 });
        assert!(log.need_sync && !log.exited);

        // Closed before any exit: the exit was missed.
        let mut log = live();
        log.on_note(Note::Closed { seq: 1 });
        assert!(log.need_sync && !log.closed);
    }

    #[test]
    fn an_attachment_after_a_seq_ignores_what_came_before() {
        let mut log = Log::after(5);
        log.next = 3;
        log.on_note(out(4, "old"));
        log.on_note(out(5, "old"));
        assert!(log.ready.is_empty());
    }

    fn chunk(seq: u64, text: &str) -> ProcessOutputChunk {
        ProcessOutputChunk {
            seq,
            stream: StreamName::Stderr,
            chunk: ByteChunk(text.as_bytes().to_vec()),
        }
    }

    fn read(chunks: Vec<ProcessOutputChunk>, next_seq: u64, exited: bool) -> ReadResponse {
        ReadResponse {
            chunks,
            next_seq,
            exited,
            exit_code: exited.then_some(3),
            closed: exited,
            failure: None,
            sandbox_denied: None,
        }
    }

    #[test]
    fn a_read_past_the_cursor_counts_the_lost_chunks() {
        let mut log = Log::after(2);
        log.on_read(read(vec![chunk(10, "j"), chunk(11, "k")], 12, false));
        assert_eq!(log.ready[0], Event::OutputLost { chunks: 7 });
        assert_eq!(log.cursor, 11);
        assert_eq!(log.next, 12);
        assert!(matches!(
            &log.ready[1],
            Event::Output {
                seq: 10,
                stream: Stream::Stderr,
                ..
            }
        ));

        // Once the process has exited, one seq of the gap is the exit.
        let mut log = Log::after(2);
        log.on_read(read(vec![chunk(10, "j")], 12, true));
        assert_eq!(log.ready[0], Event::OutputLost { chunks: 6 });
        assert_eq!(
            log.ready.back(),
            Some(&Event::Exited {
                code: 3,
                signal: None
            })
        );
        assert!(log.closed);
    }

    #[test]
    fn a_read_that_follows_the_cursor_loses_nothing() {
        let mut log = Log::after(2);
        log.on_read(read(
            vec![chunk(1, "a"), chunk(2, "b"), chunk(3, "c")],
            4,
            false,
        ));
        assert_eq!(log.ready.len(), 1, "{:?}", log.ready);
        assert!(matches!(&log.ready[0], Event::Output { seq: 3, data, .. } if data == "c"));
        // An exit between the cursor and the next output is not a loss.
        let mut log = Log::after(2);
        log.exited = true;
        log.on_read(read(vec![chunk(4, "d")], 5, false));
        assert!(matches!(log.ready[0], Event::Output { seq: 4, .. }));
        assert!(
            !log.ready
                .iter()
                .any(|e| matches!(e, Event::OutputLost { .. }))
        );
    }

    #[tokio::test]
    async fn attach_reads_from_its_seq_then_follows_notifications() {
        let f = fake(Revision::Nov2026, |_, p| {
            assert_eq!(p["afterSeq"], 1);
            Ok(
                json!({"chunks": [{"seq": 1, "stream": "stdout", "chunk": "YQ=="},
                                  {"seq": 2, "stream": "pty", "chunk": "Yg=="}],
                      "nextSeq": 3, "exited": false, "exitCode": null, "closed": false,
                      "failure": null}),
            )
        });
        let mut a = f.client.attach("p1", 1).unwrap();
        let first = a.next().await.unwrap();
        assert_eq!(
            first,
            Some(Event::Output {
                seq: 2,
                stream: Stream::Pty,
                data: "b".into()
            })
        );
        assert_eq!(f.methods(), ["process/read"]);
        assert_eq!(
            f.params(0),
            json!({"processId": "p1", "afterSeq": 1, "maxBytes": null, "waitMs": null})
        );
        f.notify(
            "process/output",
            json!({"processId": "p1", "seq": 3, "stream": "stdout", "chunk": "Yw=="}),
        )
        .await;
        f.notify(
            "process/output",
            json!({"processId": "other", "seq": 4, "stream": "stdout", "chunk": "eA=="}),
        )
        .await;
        f.notify(
            "process/exited",
            json!({"processId": "p1", "seq": 4, "exitCode": 0}),
        )
        .await;
        f.notify("process/closed", json!({"processId": "p1", "seq": 5}))
            .await;
        assert_eq!(a.next().await.unwrap(), Some(output(3, "c")));
        assert_eq!(
            a.next().await.unwrap(),
            Some(Event::Exited {
                code: 0,
                signal: None
            })
        );
        assert_eq!(a.next().await.unwrap(), None);
        assert_eq!((a.cursor(), a.resyncs()), (3, 1));
        assert_eq!(f.methods().len(), 1, "no read after the first");
    }

    #[tokio::test]
    async fn a_starting_process_is_read_again() {
        let calls = AtomicU32::new(0);
        let f = fake(Revision::Nov2026, move |_, _| {
            if calls.fetch_add(1, Ordering::Relaxed) < 2 {
                return Err(error(-32600, "process p1 is starting"));
            }
            Ok(
                json!({"chunks": [], "nextSeq": 1, "exited": true, "exitCode": 9,
                      "closed": true, "failure": null}),
            )
        });
        let mut a = f.client.attach("p1", 0).unwrap();
        assert_eq!(
            a.next().await.unwrap(),
            Some(Event::Exited {
                code: 9,
                signal: None
            })
        );
        assert_eq!(a.next().await.unwrap(), None);
        assert_eq!(f.methods(), ["process/read"; 3]);
    }

    #[tokio::test]
    async fn a_gap_in_notifications_is_filled_by_a_read() {
        let f = fake(Revision::Nov2026, |_, p| {
            Ok(match p["afterSeq"].as_u64() {
                Some(1) => json!({"chunks": [{"seq": 2, "stream": "stdout", "chunk": "Yg=="},
                                             {"seq": 3, "stream": "stdout", "chunk": "Yw=="}],
                                  "nextSeq": 4, "exited": false, "exitCode": null,
                                  "closed": false, "failure": null}),
                _ => Value::Null,
            })
        });
        let mut a = WsAttachment::new(&f.client, "p1", 0).listening_from_seq_one();
        f.notify(
            "process/output",
            json!({"processId": "p1", "seq": 1, "stream": "stdout", "chunk": "YQ=="}),
        )
        .await;
        // Seq 2 never came.
        f.notify(
            "process/output",
            json!({"processId": "p1", "seq": 3, "stream": "stdout", "chunk": "Yw=="}),
        )
        .await;
        assert_eq!(a.next().await.unwrap(), Some(output(1, "a")));
        assert_eq!(a.next().await.unwrap(), Some(output(2, "b")));
        assert_eq!(a.next().await.unwrap(), Some(output(3, "c")));
        assert_eq!(f.params(0)["afterSeq"], 1);
        assert_eq!(a.resyncs(), 1);
    }

    #[tokio::test]
    async fn a_dropped_attachment_leaves_the_process_unwatched() {
        let f = fake(Revision::Nov2026, |_, _| Ok(Value::Null));
        let a = WsAttachment::new(&f.client, "p1", 0);
        let b = WsAttachment::new(&f.client, "p1", 0);
        assert_eq!(f.subs.watching("p1"), 2);
        drop(a);
        assert_eq!(f.subs.watching("p1"), 1);
        drop(b);
        assert_eq!(f.subs.watching("p1"), 0);
    }
}
