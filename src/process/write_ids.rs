//! `writeId` de-duplication: a repeated id is acknowledged, not written twice.
//!
//! Bounded in bytes: ids longer than [`MAX_WRITE_ID_BYTES`] are refused
//! before they get here, and each remembered id is stored once, so a
//! process's table holds at most [`WRITE_IDS_PER_PROCESS`] ×
//! [`MAX_WRITE_ID_BYTES`] bytes of ids (1 MiB).

use std::collections::{HashSet, VecDeque};
use std::sync::Arc;

/// `writeId`s remembered per process (oldest forgotten first).
pub const WRITE_IDS_PER_PROCESS: usize = 4096;
/// Longest `writeId` accepted (Codex sends UUIDs: 36 bytes).
pub const MAX_WRITE_ID_BYTES: usize = 256;

#[derive(Debug, Default)]
pub struct WriteIds {
    order: VecDeque<Arc<str>>,
    seen: HashSet<Arc<str>>,
    bytes: usize,
}

impl WriteIds {
    /// True if `id` is new (and remembers it).
    pub fn insert(&mut self, id: &str) -> bool {
        if self.seen.contains(id) {
            return false;
        }
        if self.order.len() >= WRITE_IDS_PER_PROCESS
            && let Some(old) = self.order.pop_front()
        {
            self.bytes -= old.len();
            self.seen.remove(&old);
        }
        let id: Arc<str> = Arc::from(id);
        self.bytes += id.len();
        self.order.push_back(id.clone());
        self.seen.insert(id);
        true
    }

    /// Bytes of ids held.
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repeats_are_seen_and_the_oldest_is_forgotten() {
        let mut ids = WriteIds::default();
        assert!(ids.insert("a"));
        assert!(!ids.insert("a"));
        for i in 0..WRITE_IDS_PER_PROCESS {
            assert!(ids.insert(&i.to_string()));
        }
        // "a" was the oldest: forgotten, so new again.
        assert!(ids.insert("a"));
        assert!(!ids.insert(&(WRITE_IDS_PER_PROCESS - 1).to_string()));
    }

    #[test]
    fn the_table_is_bounded_in_bytes() {
        let mut ids = WriteIds::default();
        for i in 0..3 * WRITE_IDS_PER_PROCESS {
            let id = format!("{i:0>MAX_WRITE_ID_BYTES$}");
            assert!(ids.insert(&id));
        }
        assert_eq!(ids.bytes(), WRITE_IDS_PER_PROCESS * MAX_WRITE_ID_BYTES);
    }
}
