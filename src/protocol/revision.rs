//! The two revisions of the exec-server protocol the gateway serves on the
//! same doors, and how a session's revision is told.
//!
//! Both clients send the same `initialize`, so the revision is learned from
//! the first request that tells: a path as a `file://` URI (Codex 0.169.0,
//! [`Revision::Nov2026`]) or as a plain absolute path (Codex 0.130.0,
//! [`Revision::May2026`]), or a method only the newer revision has. Once a
//! session's revision is known it is fixed: a request in the other form is
//! answered the way that revision's reference server answers it.
//!
//! Everything that differs between the revisions is decided here, once,
//! as a [`Policy`] value: exec, fs, sessions and the handlers read its
//! fields and never match on a revision themselves.

use std::sync::atomic::{AtomicU8, Ordering};
use std::time::Duration;

/// A revision of the exec-server protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Revision {
    /// Codex 0.130.0 (May 2026): plain absolute paths.
    May2026,
    /// Codex 0.169.0 (Nov 2026): `file://` URIs, `environmentInfo`,
    /// `sandboxType`, 128+n exit codes and the newer methods.
    Nov2026,
}

impl Revision {
    /// What this revision's answers look like.
    pub fn policy(self) -> &'static Policy {
        match self {
            Revision::May2026 => &MAY_2026,
            Revision::Nov2026 => &NOV_2026,
        }
    }
}

/// How a revision answers: every difference between the two revisions
/// the gateway serves, as data.
#[derive(Debug, PartialEq, Eq)]
pub struct Policy {
    pub revision: Revision,
    /// Paths in answers are `file://` URIs (else plain absolute paths).
    pub uri_paths: bool,
    /// How long a closed process stays readable, unless configured.
    pub retention: Duration,
    /// How long a detached session lives, unless configured.
    pub detach_ttl: Duration,
    /// `process/start` answers `sandboxType`.
    pub start_reports_sandbox_type: bool,
    /// `process/read` and `process/exited` carry `sandboxDenied`.
    pub reports_sandbox_denied: bool,
    /// The exit code of a pipe process killed by signal n: 128 + n, else -1
    /// (a PTY process reports 1 in both).
    pub signal_exit_is_128_plus: bool,
    /// `process/read` whose selection reaches the close moves `nextSeq`
    /// past the close.
    pub read_moves_past_close: bool,
    /// `process/signal` to an unknown or closed process answers `{}`
    /// (else an error that says why).
    pub lenient_signal: bool,
    /// `process/write` needs a non-empty `writeId`.
    pub write_id_required: bool,
    /// `fs/getMetadata` answers `size`.
    pub metadata_has_size: bool,
    /// A directory or special file read as a file is "not a file"
    /// (-32600); else the OS error (-32603 for a directory, -32600 for a
    /// special file).
    pub not_a_file_uniform: bool,
    /// Malformed envelopes and refused resumes are worded as 0.169.0
    /// words them.
    pub current_error_texts: bool,
}

/// Codex 0.130.0.
pub const MAY_2026: Policy = Policy {
    revision: Revision::May2026,
    uri_paths: false,
    retention: Duration::from_secs(30),
    detach_ttl: Duration::from_secs(10),
    start_reports_sandbox_type: false,
    reports_sandbox_denied: false,
    signal_exit_is_128_plus: false,
    read_moves_past_close: false,
    lenient_signal: false,
    write_id_required: false,
    metadata_has_size: false,
    not_a_file_uniform: false,
    current_error_texts: false,
};

/// Codex 0.169.0.
pub const NOV_2026: Policy = Policy {
    revision: Revision::Nov2026,
    uri_paths: true,
    retention: Duration::from_secs(80),
    detach_ttl: Duration::from_secs(80),
    start_reports_sandbox_type: true,
    reports_sandbox_denied: true,
    signal_exit_is_128_plus: true,
    read_moves_past_close: true,
    lenient_signal: true,
    write_id_required: true,
    metadata_has_size: true,
    not_a_file_uniform: true,
    current_error_texts: true,
};

/// The gRPC API's calls that belong to no session: plain paths, and every
/// field either revision has.
pub const GRPC: Policy = Policy {
    metadata_has_size: true,
    ..MAY_2026
};

impl Policy {
    /// A host path as this revision writes paths.
    pub fn wire_path(&self, path: &str) -> String {
        if self.uri_paths {
            url::Url::from_file_path(path)
                .map(|u| u.to_string())
                .unwrap_or_else(|()| format!("file://{path}"))
        } else {
            path.to_owned()
        }
    }

    /// The exit code a process reports when killed by `signal`.
    pub fn killed_exit_code(&self, tty: bool, signal: i32) -> i32 {
        match (tty, self.signal_exit_is_128_plus) {
            (true, _) => 1,
            (false, false) => -1,
            (false, true) => 128 + signal,
        }
    }
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

    /// The policy of [`RevisionCell::or_default`].
    pub fn policy(&self) -> &'static Policy {
        self.or_default().policy()
    }

    /// Whether a resume of this session while it is attached elsewhere is
    /// answered as 0.169.0 answers it (-32010): unless the session is known
    /// to be a May one. The resuming client cannot be told apart at
    /// `initialize` (both send the same bytes), and the current one is
    /// what is run today.
    pub fn attached_error_is_current(&self) -> bool {
        self.get() != Some(Revision::May2026)
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
        assert_eq!(cell.policy(), &NOV_2026);
    }

    #[test]
    fn each_revision_has_its_own_policy() {
        assert_eq!(Revision::May2026.policy().revision, Revision::May2026);
        assert_eq!(Revision::Nov2026.policy().revision, Revision::Nov2026);
        assert_ne!(MAY_2026, NOV_2026);
        // Paths: plain in May, URIs (percent-encoded) in November.
        assert_eq!(MAY_2026.wire_path("/t/a b"), "/t/a b");
        assert_eq!(NOV_2026.wire_path("/t/a b"), "file:///t/a%20b");
        // A killed process: 1 under a PTY in both, -1 or 128+n for pipes.
        assert_eq!(MAY_2026.killed_exit_code(true, 9), 1);
        assert_eq!(NOV_2026.killed_exit_code(true, 9), 1);
        assert_eq!(MAY_2026.killed_exit_code(false, 9), -1);
        assert_eq!(NOV_2026.killed_exit_code(false, 15), 143);
        // The references' defaults.
        assert_eq!(MAY_2026.detach_ttl, Duration::from_secs(10));
        assert_eq!(NOV_2026.retention, Duration::from_secs(80));
    }
}
