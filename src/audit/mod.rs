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

mod budget;
mod refusals;
use budget::{Admit, Bucket, Budgets, SUMMARY_FIELD_BYTES, SUMMARY_LIST_ITEMS};
pub use refusals::quota_refused;
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
    /// Bytes of whole events one tenant may have written per minute
    /// (see [`Budgets`]).
    pub tenant_bytes_per_minute: u64,
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
    budgets: Budgets,
}

static SINK: OnceLock<Sink> = OnceLock::new();

/// Whether anything takes events: the trail, or webhooks (callers skip
/// building them otherwise).
pub fn enabled() -> bool {
    SINK.get().is_some() || crate::webhooks::enabled()
}

/// Whether the audit trail is configured (for events only it records).
pub fn trail_enabled() -> bool {
    SINK.get().is_some()
}

/// Whether `event` would be recorded or sent anywhere.
pub fn wanted(event: &str) -> bool {
    SINK.get().is_some() || crate::webhooks::wants(event)
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
    let (q, d) = (queued.clone(), dropped.clone());
    std::thread::Builder::new()
        .name("audit-writer".to_owned())
        .spawn(move || write_loop(rx, out, q, written, d))
        .map_err(|e| format!("audit: cannot start its writer: {e}"))?;
    let _ = SINK.set(Sink {
        tx,
        queued,
        max_queued: s.queue_bytes,
        dropped,
        budgets: Budgets::new(s.tenant_bytes_per_minute),
    });
    Ok(())
}

/// `tag` when `event` would be recorded or sent anywhere.
pub fn wanting<'a, T>(tag: Option<&'a T>, event: &str) -> Option<&'a T> {
    tag.filter(|_| wanted(event))
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
/// drops it (counted). Webhooks are offered it first, trail or not (the
/// one seam between the two).
pub fn emit(event: &str, who: &Who<'_>, mut fields: Value) {
    crate::webhooks::offer(event, who.tenant, who.subject, who.session, &fields);
    let Some(sink) = SINK.get() else { return };
    let bucket = Bucket::of(event, who.tenant, &fields);
    let omitted = match sink.budgets.admit(&bucket) {
        Admit::Omit => {
            sink.dropped.inc();
            return;
        }
        Admit::Whole { omitted } => omitted,
        Admit::Summary { omitted } => {
            shrink(&mut fields, SUMMARY_FIELD_BYTES, SUMMARY_LIST_ITEMS);
            if let Value::Object(f) = &mut fields {
                f.insert("over_budget".to_owned(), json!(true));
            }
            omitted
        }
    };
    if omitted > 0
        && let Value::Object(f) = &mut fields
    {
        f.insert("omitted_before".to_owned(), json!(omitted));
    }
    let line = render(event, who, fields);
    let len = line.len();
    sink.budgets.charge(&bucket, len);
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

/// A string cut to [`MAX_FIELD_BYTES`].
pub fn clip(s: &str) -> Value {
    Value::String(clip_to(s, MAX_FIELD_BYTES))
}

/// `s` cut to about `max` bytes by its middle: its head and its tail stay
/// (what a command ends with matters as much as how it starts), and the
/// marker says how much was left out.
fn clip_to(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_owned();
    }
    let mut head = max / 2;
    while !s.is_char_boundary(head) {
        head -= 1;
    }
    let mut tail = s.len() - max / 2;
    while !s.is_char_boundary(tail) {
        tail += 1;
    }
    format!("{}…[{} bytes]…{}", &s[..head], tail - head, &s[tail..])
}

/// A list of strings, each clipped, at most [`MAX_LIST_ITEMS`] (the last
/// item says how many more there were).
pub fn clip_list<'a>(items: impl IntoIterator<Item = &'a str>) -> Value {
    let mut out = Vec::new();
    let mut more = 0usize;
    for s in items {
        if out.len() < MAX_LIST_ITEMS {
            out.push(clip(s));
        } else {
            more += 1;
        }
    }
    if more > 0 {
        out.push(Value::String(format!("…[{more} more]")));
    }
    Value::Array(out)
}

/// The fields of `process.started`: what ran, where, on which terminal;
/// `argv_sha256` names the whole command line even where it is cut.
pub fn process_started<'a>(
    id: &str,
    argv: &[String],
    cwd: &str,
    env_names: impl Iterator<Item = &'a str>,
    tty: bool,
    pipe_stdin: bool,
) -> Value {
    use sha2::Digest as _;
    let mut h = sha2::Sha256::new();
    for a in argv {
        h.update(a.as_bytes());
        h.update([0u8]);
    }
    let digest: String = h.finalize().iter().map(|b| format!("{b:02x}")).collect();
    json!({
        "process_id": clip(id),
        "argv": clip_list(argv.iter().map(String::as_str)),
        "argv_sha256": digest,
        "cwd": clip(cwd),
        "env_names": clip_list(env_names),
        "tty": tty,
        "pipe_stdin": pipe_stdin,
    })
}

/// Every string of `v` cut to `max` bytes and every list to `items`.
fn shrink(v: &mut Value, max: usize, items: usize) {
    match v {
        Value::String(s) if s.len() > max => *s = clip_to(s, max),
        Value::Array(a) => {
            if a.len() > items {
                let more = a.len() - items;
                a.truncate(items);
                a.push(Value::String(format!("…[{more} more]")));
            }
            a.iter_mut().for_each(|x| shrink(x, max, items));
        }
        Value::Object(o) => o.values_mut().for_each(|x| shrink(x, max, items)),
        _ => {}
    }
}

fn render(event: &str, who: &Who<'_>, fields: Value) -> String {
    // Who and what are written last: no field of an event can stand in
    // for them.
    let mut m = match fields {
        Value::Object(f) => f,
        _ => Map::new(),
    };
    let mut core = Map::new();
    core.insert(
        "ts".to_owned(),
        Value::String(humantime::format_rfc3339_millis(std::time::SystemTime::now()).to_string()),
    );
    core.insert("event".to_owned(), clip(event));
    for (k, v) in [
        ("tenant", who.tenant),
        ("subject", who.subject),
        ("session", who.session),
    ] {
        match v {
            Some(v) => core.insert(k.to_owned(), clip(v)),
            None => m.remove(k),
        };
    }
    m.extend(core.clone());
    let mut v = Value::Object(m);
    let line = to_line(&v);
    if line.len() <= MAX_EVENT_BYTES {
        return line;
    }
    // Too long (many long fields, or escapes that grew it): every field
    // cut shorter, so what ran is still there, marked as cut.
    for (max, items) in [(256, 64), (64, 16)] {
        shrink(&mut v, max, items);
        if let Value::Object(o) = &mut v {
            o.extend(core.clone());
            o.insert("truncated".to_owned(), json!(true));
        }
        let line = to_line(&v);
        if line.len() <= MAX_EVENT_BYTES {
            return line;
        }
    }
    core.insert("truncated".to_owned(), json!(true));
    to_line(&Value::Object(core))
}

/// Line breaks JSON leaves raw, each six bytes escaped.
const RAW_BREAKS: [(char, &str); 3] = [
    ('\u{2028}', "\\u2028"),
    ('\u{2029}', "\\u2029"),
    ('\u{0085}', "\\u0085"),
];

/// `v` as one line: serde_json escapes the control characters but leaves
/// U+2028, U+2029 and U+0085 raw, which line-oriented readers (and
/// JavaScript before ES2019) take as line ends. Outside strings JSON has
/// none of them, so each is escaped where it stands.
fn to_line(v: &Value) -> String {
    let line = v.to_string();
    if !line.contains(|c| RAW_BREAKS.iter().any(|(b, _)| *b == c)) {
        return line;
    }
    let mut out = String::with_capacity(line.len() + 16);
    for c in line.chars() {
        match RAW_BREAKS.iter().find(|(b, _)| *b == c) {
            Some((_, esc)) => out.push_str(esc),
            None => out.push(c),
        }
    }
    out
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

/// Open (or create) the trail: never through a symlink, never waiting
/// (a FIFO in its place), and only a regular file.
fn open_append(path: &Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt as _;
    let f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)?;
    if !f.metadata()?.is_file() {
        return Err(std::io::Error::other("not a regular file"));
    }
    Ok(f)
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
                    // A trail moved or removed meanwhile (a logrotate of
                    // its own) is not a reason to stop: the file is opened
                    // anew either way.
                    if let Err(e) = rotate(path, *keep) {
                        tracing::warn!(error = %e, "audit: rotation failed; starting a new file");
                    }
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

    /// The file at the trail's path is no longer the one written (removed
    /// or renamed by hand): open it anew.
    fn reopen_if_moved(&mut self) -> std::io::Result<()> {
        use std::os::unix::fs::MetadataExt as _;
        let Output::File {
            path, file, size, ..
        } = self
        else {
            return Ok(());
        };
        let ours = file.get_ref().metadata()?;
        let moved = match std::fs::symlink_metadata(&*path) {
            Ok(m) => m.ino() != ours.ino() || m.dev() != ours.dev(),
            Err(_) => true,
        };
        if moved {
            file.flush()?;
            *file = std::io::BufWriter::new(open_append(path)?);
            *size = 0;
        }
        Ok(())
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
    dropped: Counter,
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
                    Err(e) => {
                        dropped.inc();
                        tracing::error!(error = %e, "audit: write failed; event lost");
                        let _ = out.reopen_if_moved();
                    }
                }
            }
            Err(RecvTimeoutError::Timeout) => {
                if dirty {
                    if let Err(e) = out.flush() {
                        tracing::error!(error = %e, "audit: flush failed");
                    }
                    dirty = false;
                }
                if let Err(e) = out.reopen_if_moved() {
                    tracing::error!(error = %e, "audit: cannot open the trail anew");
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
    fn a_cut_command_line_keeps_its_head_its_tail_and_its_digest() {
        let who = Who {
            tenant: Some("t1"),
            ..Who::default()
        };
        let mut argv: Vec<String> = vec!["sh".into(), "-c".into()];
        argv.push(format!(":{}; echo RAN-EVIL", " ".repeat(5000)));
        argv.extend((0..40).map(|_| "#".repeat(4096)));
        let fields = process_started("p", &argv, "/tmp", std::iter::empty(), false, false);
        let line = render("process.started", &who, fields);
        assert!(line.len() <= MAX_EVENT_BYTES);
        let v: Value = serde_json::from_str(&line).unwrap();
        assert_eq!(v["truncated"], true);
        assert_eq!(v["process_id"], "p");
        assert_eq!(v["argv"][0], "sh");
        assert!(v["argv"][2].as_str().unwrap().ends_with("echo RAN-EVIL"));
        assert_eq!(v["argv_sha256"].as_str().unwrap().len(), 64);
    }

    #[test]
    fn no_field_stands_in_for_who_or_what() {
        let who = Who {
            tenant: Some("t2"),
            subject: None,
            session: None,
        };
        let line = render(
            "file.written",
            &who,
            json!({"tenant": "t1", "event": "x", "subject": "root", "ts": "0"}),
        );
        let v: Value = serde_json::from_str(&line).unwrap();
        assert_eq!(v["tenant"], "t2");
        assert_eq!(v["event"], "file.written");
        assert!(v.get("subject").is_none());
        assert_ne!(v["ts"], "0");
    }

    #[test]
    fn unicode_line_breaks_are_escaped() {
        let who = Who {
            tenant: Some("t\u{2029}1"),
            ..Who::default()
        };
        let line = render(
            "process.started",
            &who,
            json!({"argv": ["a\u{2028}b", "c\u{0085}d"]}),
        );
        for raw in ['\u{2028}', '\u{2029}', '\u{0085}'] {
            assert!(!line.contains(raw), "{line}");
        }
        assert!(
            line.contains(r"a\u2028b") && line.contains(r"c\u0085d"),
            "{line}"
        );
        let v: Value = serde_json::from_str(&line).unwrap();
        assert_eq!(v["argv"][0], "a\u{2028}b");
        assert_eq!(v["argv"][1], "c\u{0085}d");
        assert_eq!(v["tenant"], "t\u{2029}1");
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
            tenant_bytes_per_minute: 1 << 20,
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
