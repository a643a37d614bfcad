//! The per-process output log: seq numbering, bounded retention and the
//! `process/read` selection algorithm (docs/protocol.md, "process/read").
//!
//! Invariants: seqs start at 1 and every output chunk, the exit and the close
//! take exactly one each, in that order of assignment; `closed` implies
//! `exited`; the retained chunks hold at most `cap` bytes (as the
//! reference's do, each chunk charged [`CHUNK_OVERHEAD_BYTES`] on top), or
//! the newest chunk alone when it is larger.

use std::collections::VecDeque;

use bytes::Bytes;
use prometheus_client::metrics::gauge::Gauge;

use crate::protocol::process::{ProcessEvent, StreamName};

/// Retained output per process (the reference's `RETAINED_OUTPUT_BYTES_PER_PROCESS`).
pub const RETAINED_OUTPUT_BYTES_PER_PROCESS: usize = 1024 * 1024;
/// What one retained chunk costs besides its bytes (its entry, its
/// allocation, its JSON in a `process/read` reply), charged against the
/// retention cap: a process that writes one byte at a time keeps at most
/// ~16,000 chunks, not a million.
pub const CHUNK_OVERHEAD_BYTES: usize = 64;

fn charge(data: &Bytes) -> usize {
    data.len() + CHUNK_OVERHEAD_BYTES
}

#[derive(Debug, Clone)]
pub struct RetainedChunk {
    pub seq: u64,
    pub stream: StreamName,
    pub data: Bytes,
}

/// What a read selected, before waiting is decided.
#[derive(Debug, Clone)]
pub struct ReadSelection {
    pub chunks: Vec<RetainedChunk>,
    pub next_seq: u64,
    pub exited: bool,
    pub exit_code: Option<i32>,
    pub closed: bool,
}

impl ReadSelection {
    /// The reference's "return now" rule: data, closed, or an exit the caller
    /// has not seen yet.
    pub fn is_ready(&self, after_seq: u64) -> bool {
        !self.chunks.is_empty()
            || self.closed
            || (self.exited && after_seq < self.next_seq.saturating_sub(1))
    }
}

#[derive(Debug)]
pub struct OutputLog {
    chunks: VecDeque<RetainedChunk>,
    retained_bytes: usize,
    cap_bytes: usize,
    next_seq: u64,
    exit_code: Option<i32>,
    exit_signal: Option<i32>,
    closed: bool,
    exit_seq: Option<u64>,
    close_seq: Option<u64>,
    /// The tenant's retained-bytes total, charged and credited with ours.
    tenant_retained: Gauge,
}

impl Drop for OutputLog {
    fn drop(&mut self) {
        self.tenant_retained.dec_by(self.retained_bytes as i64);
    }
}

impl OutputLog {
    pub fn new(cap_bytes: usize, tenant_retained: Gauge) -> Self {
        Self {
            chunks: VecDeque::new(),
            retained_bytes: 0,
            cap_bytes,
            next_seq: 1,
            exit_code: None,
            exit_signal: None,
            closed: false,
            exit_seq: None,
            close_seq: None,
            tenant_retained,
        }
    }

    fn take_seq(&mut self) -> u64 {
        let seq = self.next_seq;
        self.next_seq += 1;
        seq
    }

    /// Append a chunk; evicts whole chunks, oldest first, until at most the
    /// cap is held.
    pub fn push(&mut self, stream: StreamName, data: Bytes) -> u64 {
        let seq = self.take_seq();
        let cost = charge(&data);
        self.retained_bytes += cost;
        self.tenant_retained.inc_by(cost as i64);
        self.chunks.push_back(RetainedChunk { seq, stream, data });
        while let Some(front) = self.chunks.front() {
            if self.retained_bytes <= self.cap_bytes || self.chunks.len() == 1 {
                break;
            }
            let cost = charge(&front.data);
            self.retained_bytes -= cost;
            self.tenant_retained.dec_by(cost as i64);
            self.chunks.pop_front();
        }
        seq
    }

    pub fn exit(&mut self, code: i32, signal: Option<i32>) -> u64 {
        self.exit_code = Some(code);
        self.exit_signal = signal;
        let seq = self.take_seq();
        self.exit_seq = Some(seq);
        seq
    }

    pub fn close(&mut self) -> u64 {
        self.closed = true;
        let seq = self.take_seq();
        self.close_seq = Some(seq);
        seq
    }

    pub fn exit_code(&self) -> Option<i32> {
        self.exit_code
    }

    pub fn exited(&self) -> bool {
        self.exit_code.is_some()
    }

    pub fn closed(&self) -> bool {
        self.closed
    }

    pub fn next_seq(&self) -> u64 {
        self.next_seq
    }

    pub fn retained_bytes(&self) -> usize {
        self.retained_bytes
    }

    pub fn first_retained_seq(&self) -> Option<u64> {
        self.chunks.front().map(|c| c.seq)
    }

    /// Select chunks with `seq > after_seq` under the `max_bytes` budget: the
    /// first chunk always goes in; stop before a chunk that would pass the
    /// budget, or once the budget is reached. `nextSeq` follows the last
    /// chunk; with `past_close` (0.169.0), a read that reaches the end of a
    /// closed process moves it past `exited` and `closed`.
    pub fn select(
        &self,
        after_seq: u64,
        max_bytes: Option<usize>,
        past_close: bool,
    ) -> ReadSelection {
        let budget = max_bytes.unwrap_or(usize::MAX);
        let start = self.chunks.partition_point(|c| c.seq <= after_seq);
        let mut chunks = Vec::new();
        let mut total = 0usize;
        let mut truncated = false;
        for c in self.chunks.iter().skip(start) {
            if !chunks.is_empty() && (total >= budget || total + c.data.len() > budget) {
                truncated = true;
                break;
            }
            total += c.data.len();
            chunks.push(c.clone());
        }
        let next_seq = match chunks.last() {
            // 0.169.0 moves past the close only on a read without
            // `maxBytes` (with one, even unused, it follows the last chunk:
            // the differential run found it).
            Some(_) if past_close && self.closed && !truncated && max_bytes.is_none() => {
                self.next_seq
            }
            Some(c) => c.seq + 1,
            None => self.next_seq,
        };
        ReadSelection {
            chunks,
            next_seq,
            exited: self.exited(),
            exit_code: self.exit_code,
            closed: self.closed,
        }
    }

    /// The seq of the last output chunk retained (0: none).
    pub fn last_output_seq(&self) -> u64 {
        self.chunks.back().map_or(0, |c| c.seq)
    }

    /// Every retained event with `seq > after_seq`, in seq order: output
    /// chunks, the exit and the close (for stream subscribers).
    pub fn events_since(&self, after_seq: u64) -> Vec<ProcessEvent> {
        let start = self.chunks.partition_point(|c| c.seq <= after_seq);
        let mut events: Vec<ProcessEvent> = self
            .chunks
            .iter()
            .skip(start)
            .map(|c| ProcessEvent::Output {
                seq: c.seq,
                stream: c.stream,
                data: c.data.clone(),
            })
            .collect();
        if let (Some(seq), Some(code)) = (self.exit_seq, self.exit_code)
            && seq > after_seq
        {
            events.push(ProcessEvent::Exited {
                seq,
                code,
                signal: self.exit_signal,
            });
        }
        if let Some(seq) = self.close_seq
            && seq > after_seq
        {
            events.push(ProcessEvent::Closed { seq });
        }
        events.sort_by_key(ProcessEvent::seq);
        events
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn one_byte_chunks_are_charged_their_overhead() {
        let tenant = Gauge::default();
        let mut log = OutputLog::new(RETAINED_OUTPUT_BYTES_PER_PROCESS, tenant.clone());
        for _ in 0..200_000 {
            log.push(StreamName::Stdout, Bytes::from_static(b"x"));
        }
        let kept = log.chunks.len();
        assert!(kept <= RETAINED_OUTPUT_BYTES_PER_PROCESS / (1 + CHUNK_OVERHEAD_BYTES));
        assert!(kept > 10_000, "{kept}");
        assert_eq!(tenant.get(), log.retained_bytes() as i64);
        drop(log);
        assert_eq!(tenant.get(), 0);
    }

    use super::*;

    fn chunk(n: usize) -> Bytes {
        Bytes::from(vec![b'x'; n])
    }

    #[test]
    fn seqs_count_output_exit_and_close() {
        let mut log = OutputLog::new(RETAINED_OUTPUT_BYTES_PER_PROCESS, Gauge::default());
        assert_eq!(log.push(StreamName::Stdout, chunk(3)), 1);
        assert_eq!(log.exit(0, None), 2);
        assert_eq!(log.close(), 3);
        // After `echo hi` closed, afterSeq:1 gives nextSeq 4 (reference).
        let s = log.select(1, None, false);
        assert!(s.chunks.is_empty());
        assert_eq!(s.next_seq, 4);
        // A read past the end is not clamped.
        assert_eq!(log.select(99, None, false).next_seq, 4);
    }

    #[test]
    fn the_current_revision_moves_next_seq_past_the_close() {
        let mut log = OutputLog::new(RETAINED_OUTPUT_BYTES_PER_PROCESS, Gauge::default());
        log.push(StreamName::Stdout, chunk(3));
        log.push(StreamName::Stderr, chunk(3));
        log.exit(0, None);
        // Not closed yet: the last chunk decides.
        assert_eq!(log.select(0, None, true).next_seq, 3);
        log.close();
        assert_eq!(log.select(0, None, false).next_seq, 3);
        assert_eq!(log.select(0, None, true).next_seq, 5);
        assert_eq!(log.select(0, Some(100), true).next_seq, 3);
        assert_eq!(log.select(1, None, true).next_seq, 5);
        // Truncated by maxBytes: still the last chunk + 1.
        assert_eq!(log.select(0, Some(1), true).next_seq, 2);
    }

    #[test]
    fn first_chunk_always_included_and_budget_respected() {
        let mut log = OutputLog::new(RETAINED_OUTPUT_BYTES_PER_PROCESS, Gauge::default());
        for _ in 0..4 {
            log.push(StreamName::Stdout, chunk(4096));
        }
        let s = log.select(0, Some(1), false);
        assert_eq!(s.chunks.len(), 1);
        assert_eq!(s.next_seq, 2);
        let s = log.select(0, Some(8192), false);
        assert_eq!(s.chunks.len(), 2);
        let s = log.select(0, Some(8191), false);
        assert_eq!(s.chunks.len(), 1);
        let s = log.select(2, None, false);
        assert_eq!(
            s.chunks.iter().map(|c| c.seq).collect::<Vec<_>>(),
            vec![3, 4]
        );
    }

    #[test]
    fn retention_evicts_whole_chunks_oldest_first() {
        let mut log = OutputLog::new(1024 * 1024, Gauge::default());
        for _ in 0..733 {
            log.push(StreamName::Stdout, chunk(4096));
        }
        // 252 chunks of 4 KiB (+ overhead each) fit in 1 MiB: the oldest
        // kept is seq 733 - 252 + 1.
        let each = 4096 + CHUNK_OVERHEAD_BYTES;
        let kept = 1024 * 1024 / each;
        assert_eq!(kept, 252);
        assert_eq!(log.first_retained_seq(), Some(482));
        assert_eq!(log.retained_bytes(), kept * each);
        let s = log.select(0, None, false);
        assert_eq!(s.chunks[0].seq, 482);
    }

    #[test]
    fn readiness_rule() {
        let mut log = OutputLog::new(1024, Gauge::default());
        log.push(StreamName::Stdout, chunk(1));
        log.exit(0, None);
        // exited and caller has not seen the exit (seq 2) yet.
        assert!(log.select(1, None, false).is_ready(1));
        // caller has seen everything up to the exit: wait for close.
        assert!(!log.select(2, None, false).is_ready(2));
        log.close();
        assert!(log.select(3, None, false).is_ready(3));
    }

    #[test]
    fn events_since_interleave_exit_and_close_by_seq() {
        let mut log = OutputLog::new(1024, Gauge::default());
        log.push(StreamName::Stdout, chunk(1));
        log.exit(3, None);
        log.push(StreamName::Stderr, chunk(1));
        log.close();
        let seqs: Vec<u64> = log.events_since(0).iter().map(ProcessEvent::seq).collect();
        assert_eq!(seqs, vec![1, 2, 3, 4]);
        assert!(matches!(
            log.events_since(0)[1],
            ProcessEvent::Exited { code: 3, .. }
        ));
        assert!(matches!(
            log.events_since(3)[..],
            [ProcessEvent::Closed { seq: 4 }]
        ));
    }

    #[test]
    fn tenant_budget_is_charged_and_credited() {
        let o = CHUNK_OVERHEAD_BYTES;
        let total = Gauge::default();
        let mut log = OutputLog::new(8 + 2 * o, total.clone());
        log.push(StreamName::Stdout, chunk(5));
        log.push(StreamName::Stdout, chunk(2));
        assert_eq!(total.get(), (7 + 2 * o) as i64);
        log.push(StreamName::Stdout, chunk(5));
        // The oldest chunk is evicted: 7 of the cap of 8 stay.
        assert_eq!(total.get(), (7 + 2 * o) as i64);
        // A chunk larger than the cap stays alone.
        log.push(StreamName::Stdout, chunk(9 + 2 * o));
        assert_eq!(total.get(), (9 + 3 * o) as i64);
        drop(log);
        assert_eq!(total.get(), 0);
    }
}
