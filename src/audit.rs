//! The audit trail (`[audit]`): one JSON line per security-relevant event
//! (who connected or was refused, which sessions opened and closed, which
//! command lines ran where and how they ended, which files were written,
//! removed or copied, which executors joined, who read the admin routes),
//! to a file of its own or stdout, apart from the operational log.
//!
//! Like the `tracing` subscriber it is one sink per process, installed at
//! start ([`init`]); until then, and when `[audit]` is not configured,
//! [`enabled`] is false and nothing is built.
//!
//! Bounded: an event is cut to [`MAX_EVENT_BYTES`] (long fields first), the
//! queue to the writer thread holds at most `queue_bytes`, and the file is
//! rotated at `max_file_bytes` keeping `max_files` old ones. What does not
//! fit is dropped and counted (`exec_gateway_audit_events_dropped_total`),
//! never waited for: a flood of events cannot stall a call or fill memory.
//! Tokens and environment values are never written (environment *names*
//! are); argv is written as given, so a secret on a command line is in it.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use serde_json::{Map, Value, json};

/// Where the audit trail goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AuditSink {
    Stdout,
    File(PathBuf),
}

/// Validated `[audit]` (module `config::audit`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditSettings {
    pub sink: AuditSink,
    pub max_file_bytes: u64,
    pub max_files: usize,
    pub queue_bytes: usize,
    pub queue_events: usize,
}

/// Largest event line; longer fields are cut first, then the event is
/// reduced to who, what and `"truncated": true`.
pub const MAX_EVENT_BYTES: usize = 64 * 1024;
/// Longest string field (an argv element, a path) kept whole.
pub const MAX_FIELD_BYTES: usize = 4096;
/// Most list items (argv, env names) kept.
pub const MAX_LIST_ITEMS: usize = 256;
/// How often the writer flushes what it wrote.
const FLUSH_EVERY: Duration = Duration::from_millis(200);

struct Sink {
    tx: SyncSender<String>,
    queued: std::sync::Arc<AtomicUsize>,
    max_queued: usize,
    dropped: Counter,
}

static SINK: OnceLock<Sink> = OnceLock::new();

/// Whether events are recorded (callers skip building them otherwise).
pub fn enabled() -> bool {
    SINK.get().is_some()
}

/// Open the sink and start its writer thread. A file that cannot be opened
/// is an error (the gateway does not start without the trail it was asked
/// for). Once per process; later calls are ignored.
pub fn init(s: &AuditSettings, written: Counter, dropped: Counter) -> Result<(), String> {
    if SINK.get().is_some() {
        return Ok(());
    }
    let out = Output::open(s)?;
    let (tx, rx) = std::sync::mpsc::sync_channel(s.queue_events);
    let queued = std::sync::Arc::new(AtomicUsize::new(0));
    let q = queued.clone();
    std::thread::Builder::new()
        .name("audit-writer".to_owned())
        .spawn(move || write_loop(rx, out, q, written))
        .map_err(|e| format!("audit: cannot start its writer: {e}"))?;
    let _ = SINK.set(Sink {
        tx,
        queued,
        max_queued: s.queue_bytes,
        dropped,
    });
    Ok(())
}

/// Whose processes a session's are, carried to their exits.
#[derive(Debug, Clone)]
pub struct Tag {
    pub tenant: String,
    pub subject: Option<String>,
    pub session: String,
}

impl Tag {
    pub fn who(&self) -> Who<'_> {
        Who {
            tenant: Some(&self.tenant),
            subject: self.subject.as_deref(),
            session: Some(&self.session),
        }
    }
}

/// Who ended a process, when the gateway did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum KilledBy {
    Nobody = 0,
    /// `process/terminate`, or a signal the client sent.
    Client = 1,
    /// Its session ended (closed, expired, or taken by a drain).
    SessionEnd = 2,
    /// The gateway shut down.
    Shutdown = 3,
    /// Its worker died.
    Worker = 4,
}

impl KilledBy {
    pub fn from_u8(v: u8) -> KilledBy {
        match v {
            1 => KilledBy::Client,
            2 => KilledBy::SessionEnd,
            3 => KilledBy::Shutdown,
            4 => KilledBy::Worker,
            _ => KilledBy::Nobody,
        }
    }

    pub fn name(self) -> Option<&'static str> {
        match self {
            KilledBy::Nobody => None,
            KilledBy::Client => Some("client"),
            KilledBy::SessionEnd => Some("session_end"),
            KilledBy::Shutdown => Some("shutdown"),
            KilledBy::Worker => Some("worker_died"),
        }
    }
}

/// Who an event is about.
#[derive(Debug, Default, Clone)]
pub struct Who<'a> {
    pub tenant: Option<&'a str>,
    pub subject: Option<&'a str>,
    pub session: Option<&'a str>,
}

/// Record `event` with `fields` (an object). Never blocks: a full queue
/// drops it (counted).
pub fn emit(event: &str, who: &Who<'_>, fields: Value) {
    let Some(sink) = SINK.get() else { return };
    let line = render(event, who, fields);
    let len = line.len();
    if sink.queued.fetch_add(len, Ordering::Relaxed) + len > sink.max_queued {
        sink.queued.fetch_sub(len, Ordering::Relaxed);
        sink.dropped.inc();
        return;
    }
    match sink.tx.try_send(line) {
        Ok(()) => {}
        Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => {
            sink.queued.fetch_sub(len, Ordering::Relaxed);
            sink.dropped.inc();
        }
    }
}

/// A string cut to [`MAX_FIELD_BYTES`] (on a character boundary).
pub fn clip(s: &str) -> Value {
    if s.len() <= MAX_FIELD_BYTES {
        return Value::String(s.to_owned());
    }
    let mut end = MAX_FIELD_BYTES;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    Value::String(format!("{}…", &s[..end]))
}

/// A list of strings, each clipped, at most [`MAX_LIST_ITEMS`].
pub fn clip_list<'a>(items: impl IntoIterator<Item = &'a str>) -> Value {
    Value::Array(items.into_iter().take(MAX_LIST_ITEMS).map(clip).collect())
}

fn render(event: &str, who: &Who<'_>, fields: Value) -> String {
    let mut m = Map::new();
    m.insert(
        "ts".to_owned(),
        Value::String(humantime::format_rfc3339_millis(std::time::SystemTime::now()).to_string()),
    );
    m.insert("event".to_owned(), clip(event));
    for (k, v) in [
        ("tenant", who.tenant),
        ("subject", who.subject),
        ("session", who.session),
    ] {
        if let Some(v) = v {
            m.insert(k.to_owned(), clip(v));
        }
    }
    let core = m.clone();
    if let Value::Object(f) = fields {
        m.extend(f);
    }
    let line = Value::Object(m).to_string();
    if line.len() <= MAX_EVENT_BYTES {
        return line;
    }
    let mut core = core;
    core.insert("truncated".to_owned(), json!(true));
    Value::Object(core).to_string()
}

/// Where lines go.
enum Output {
    Stdout,
    File {
        path: PathBuf,
        file: std::io::BufWriter<std::fs::File>,
        size: u64,
        max_bytes: u64,
        keep: usize,
    },
}

fn open_append(path: &Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt as _;
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
}

impl Output {
    fn open(s: &AuditSettings) -> Result<Output, String> {
        match &s.sink {
            AuditSink::Stdout => Ok(Output::Stdout),
            AuditSink::File(path) => {
                let file = open_append(path)
                    .map_err(|e| format!("audit.file: cannot open {}: {e}", path.display()))?;
                let size = file.metadata().map(|m| m.len()).unwrap_or(0);
                Ok(Output::File {
                    path: path.clone(),
                    file: std::io::BufWriter::new(file),
                    size,
                    max_bytes: s.max_file_bytes,
                    keep: s.max_files,
                })
            }
        }
    }

    fn write(&mut self, line: &str) -> std::io::Result<()> {
        match self {
            Output::Stdout => {
                let mut out = std::io::stdout().lock();
                out.write_all(line.as_bytes())?;
                out.write_all(b"\n")
            }
            Output::File {
                path,
                file,
                size,
                max_bytes,
                keep,
            } => {
                let len = line.len() as u64 + 1;
                if *size > 0 && *size + len > *max_bytes {
                    file.flush()?;
                    rotate(path, *keep)?;
                    *file = std::io::BufWriter::new(open_append(path)?);
                    *size = 0;
                }
                file.write_all(line.as_bytes())?;
                file.write_all(b"\n")?;
                *size += len;
                Ok(())
            }
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        match self {
            Output::Stdout => std::io::stdout().lock().flush(),
            Output::File { file, .. } => file.flush(),
        }
    }
}

/// `path.{keep-1}` → `path.{keep}` … `path` → `path.1`; the oldest goes.
fn rotate(path: &Path, keep: usize) -> std::io::Result<()> {
    let numbered = |n: usize| {
        let mut p = path.as_os_str().to_owned();
        p.push(format!(".{n}"));
        PathBuf::from(p)
    };
    if keep == 0 {
        return std::fs::remove_file(path);
    }
    for n in (1..keep).rev() {
        let from = numbered(n);
        if from.exists() {
            std::fs::rename(&from, numbered(n + 1))?;
        }
    }
    std::fs::rename(path, numbered(1))
}

/// The files of a trail, oldest first: `path.{n}` … `path.1`, `path`.
pub fn files_oldest_first(path: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for n in (1..=1000).rev() {
        let mut p = path.as_os_str().to_owned();
        p.push(format!(".{n}"));
        let p = PathBuf::from(p);
        if p.exists() {
            out.push(p);
        }
    }
    out.push(path.to_path_buf());
    out
}

fn write_loop(
    rx: Receiver<String>,
    mut out: Output,
    queued: std::sync::Arc<AtomicUsize>,
    written: Counter,
) {
    let mut dirty = false;
    loop {
        match rx.recv_timeout(FLUSH_EVERY) {
            Ok(line) => {
                queued.fetch_sub(line.len(), Ordering::Relaxed);
                match out.write(&line) {
                    Ok(()) => {
                        written.inc();
                        dirty = true;
                    }
                    Err(e) => tracing::error!(error = %e, "audit: write failed; event lost"),
                }
            }
            Err(RecvTimeoutError::Timeout) => {
                if dirty {
                    if let Err(e) = out.flush() {
                        tracing::error!(error = %e, "audit: flush failed");
                    }
                    dirty = false;
                }
            }
            Err(RecvTimeoutError::Disconnected) => {
                let _ = out.flush();
                return;
            }
        }
    }
}

/// Flush what is queued (at shutdown): waits until the queue is empty,
/// at most `within`.
pub fn drain(within: Duration) {
    let Some(sink) = SINK.get() else { return };
    let deadline = std::time::Instant::now() + within;
    while sink.queued.load(Ordering::Relaxed) > 0 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    // The writer flushes within FLUSH_EVERY of its last line.
    std::thread::sleep(FLUSH_EVERY + Duration::from_millis(50));
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn an_oversized_event_keeps_who_and_says_it_was_cut() {
        let who = Who {
            tenant: Some("t1"),
            subject: Some("alice"),
            session: Some("s"),
        };
        let big: Vec<String> = (0..100).map(|_| "x".repeat(10_000)).collect();
        let line = render(
            "process.started",
            &who,
            json!({"argv": clip_list(big.iter().map(String::as_str))}),
        );
        assert!(line.len() <= MAX_EVENT_BYTES);
        let v: Value = serde_json::from_str(&line).unwrap();
        assert_eq!(v["tenant"], "t1");
        assert_eq!(v["event"], "process.started");
        assert_eq!(v["truncated"], true);
        let small = render(
            "x",
            &who,
            json!({"argv": clip_list(["a", &"y".repeat(9000)])}),
        );
        let v: Value = serde_json::from_str(&small).unwrap();
        assert!(v["argv"][1].as_str().unwrap().len() < 4200);
    }

    #[test]
    fn rotation_keeps_that_many_files() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.jsonl");
        let s = AuditSettings {
            sink: AuditSink::File(path.clone()),
            max_file_bytes: 100,
            max_files: 2,
            queue_bytes: 1 << 20,
            queue_events: 1024,
        };
        let mut out = Output::open(&s).unwrap();
        for i in 0..20 {
            out.write(&format!("{{\"n\":{i},\"pad\":\"{}\"}}", "p".repeat(30)))
                .unwrap();
        }
        out.flush().unwrap();
        let files = files_oldest_first(&path);
        assert_eq!(files.len(), 3, "{files:?}");
        let last = std::fs::read_to_string(&path).unwrap();
        assert!(last.contains("\"n\":19"), "{last}");
        for f in &files {
            assert!(std::fs::metadata(f).unwrap().len() <= 100);
        }
    }
}
