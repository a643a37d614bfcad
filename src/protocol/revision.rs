//! The two revisions of the exec-server protocol the gateway serves on the
//! same doors, and how a session's revision is told.
//!
//! Both clients send the same `initialize`, so the revision is learned from
//! the first request that tells: a path as a `file://` URI (Codex 0.169.0,
//! [`Revision::Nov2026`]) or as a plain absolute path (Codex 0.130.0,
//! [`Revision::May2026`]), or a method only the newer revision has. Once a
//! session's revision is known it is fixed: a request in the other form is
//! answered the way that revision's reference server answers it.

use std::sync::atomic::{AtomicU8, Ordering};

/// A revision of the exec-server protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Revision {
    /// Codex 0.130.0 (May 2026): plain absolute paths.
    May2026,
    /// Codex 0.169.0 (Nov 2026): `file://` URIs, `environmentInfo`,
    /// `sandboxType`, 128+n exit codes and the newer methods.
    Nov2026,
}

/// A session's revision, unknown until a request tells it.
#[derive(Debug, Default)]
pub struct RevisionCell(AtomicU8);

const UNKNOWN: u8 = 0;
const MAY: u8 = 1;
const NOV: u8 = 2;

impl RevisionCell {
    /// The revision, if a request has told it.
    pub fn get(&self) -> Option<Revision> {
        match self.0.load(Ordering::Acquire) {
            MAY => Some(Revision::May2026),
            NOV => Some(Revision::Nov2026),
            _ => None,
        }
    }

    /// The revision, or the older one while nothing has told it (its
    /// answers are what a client that has not yet sent a path expects).
    pub fn or_default(&self) -> Revision {
        self.get().unwrap_or(Revision::May2026)
    }

    /// Learn the revision from a request that tells it; returns the
    /// session's revision (the first one learned wins).
    pub fn observe(&self, told: Revision) -> Revision {
        let value = match told {
            Revision::May2026 => MAY,
            Revision::Nov2026 => NOV,
        };
        match self
            .0
            .compare_exchange(UNKNOWN, value, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => told,
            Err(_) => self.or_default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_revision_told_wins() {
        let cell = RevisionCell::default();
        assert_eq!(cell.get(), None);
        assert_eq!(cell.or_default(), Revision::May2026);
        assert_eq!(cell.observe(Revision::Nov2026), Revision::Nov2026);
        assert_eq!(cell.observe(Revision::May2026), Revision::Nov2026);
        assert_eq!(cell.get(), Some(Revision::Nov2026));
    }
}
