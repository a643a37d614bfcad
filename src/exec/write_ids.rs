//! `writeId` de-duplication: a repeated id is acknowledged, not written twice.

use std::collections::{HashSet, VecDeque};

/// `writeId`s remembered per process (oldest forgotten first).
pub const WRITE_IDS_PER_PROCESS: usize = 4096;

#[derive(Debug, Default)]
pub struct WriteIds {
    order: VecDeque<String>,
    seen: HashSet<String>,
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
            self.seen.remove(&old);
        }
        self.order.push_back(id.to_owned());
        self.seen.insert(id.to_owned());
        true
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
}
