//! The tools: what each one calls on the gateway session, its arguments'
//! bounds, and a result that is both structured (`structuredContent`)
//! and readable (the same JSON as text).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use serde::Deserialize;
use serde_json::{Value, json};

use super::link::{CallError, Link};
use crate::protocol::methods;
use crate::protocol::path::{WirePath, to_wire};
use crate::protocol::revision::Revision;

/// Most bytes of output or file content one tool result carries. Its JSON
/// is larger (escapes; the text copy of the structured content), and
/// clients bound their messages (the official Python SDK: 1 MiB per
/// event), so this stays a quarter of that.
pub const MAX_TOOL_BYTES: usize = 256 * 1024;
/// `run_command`'s output kept per stream by default.
pub const DEFAULT_OUTPUT_BYTES: usize = 64 * 1024;
/// `run_command`'s timeout by default, and its largest.
pub const DEFAULT_RUN_TIMEOUT: Duration = Duration::from_secs(60);
pub const MAX_RUN_TIMEOUT: Duration = Duration::from_secs(600);
/// How long `run_command` waits, once its command has exited, for output a
/// process it left running may still write.
pub const EXITED_GRACE: Duration = Duration::from_secs(1);
/// Longest `process_read` wait for output.
pub const MAX_READ_WAIT: Duration = Duration::from_secs(30);
/// `read_file`'s bytes by default.
pub const DEFAULT_READ_BYTES: usize = 64 * 1024;
/// Entries `list_directory` returns at most.
pub const MAX_LIST_ENTRIES: usize = 2000;
/// `search_files`: entries walked, bytes read in all, bytes read of one
/// file (the rest of a longer file is not searched), matches returned.
pub const SEARCH_MAX_ENTRIES: u64 = 5000;
pub const SEARCH_MAX_BYTES: usize = 32 * 1024 * 1024;
pub const SEARCH_FILE_BYTES: usize = 1024 * 1024;
pub const SEARCH_MAX_RESULTS: usize = 500;
/// Longest line of a search match kept.
const MATCH_LINE_CHARS: usize = 300;

/// A tool that ran and failed: its message goes back as an error result
/// the model reads (`isError: true`).
#[derive(Debug)]
pub struct ToolError(pub String);

impl From<CallError> for ToolError {
    fn from(e: CallError) -> Self {
        ToolError(e.message)
    }
}

fn bad(msg: impl Into<String>) -> ToolError {
    ToolError(msg.into())
}

fn args<T: for<'de> Deserialize<'de>>(v: Value) -> Result<T, ToolError> {
    serde_json::from_value(v).map_err(|e| bad(format!("invalid arguments: {e}")))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Command {
    command: Option<String>,
    argv: Option<Vec<String>>,
    cwd: Option<String>,
    #[serde(default)]
    env: BTreeMap<String, String>,
    stdin: Option<String>,
    timeout_ms: Option<u64>,
    max_output_bytes: Option<usize>,
    process_id: Option<String>,
    #[serde(default)]
    tty: bool,
}

impl Command {
    fn argv(&self) -> Result<Vec<String>, ToolError> {
        match (&self.command, &self.argv) {
            (Some(c), None) => Ok(vec!["sh".into(), "-c".into(), c.clone()]),
            (None, Some(a)) if !a.is_empty() => Ok(a.clone()),
            (None, Some(_)) => Err(bad("argv is empty")),
            (Some(_), Some(_)) => Err(bad("give either command or argv, not both")),
            (None, None) => Err(bad("give command (a shell line) or argv")),
        }
    }
}

/// `path` against the session's directory when relative.
fn absolute(link: &Link, path: &str) -> String {
    if path.starts_with('/') {
        return path.to_owned();
    }
    let root = link.cwd.trim_end_matches('/');
    match path.trim_start_matches("./") {
        "" | "." => link.cwd.clone(),
        p => format!("{root}/{p}"),
    }
}

/// A host path as the session (November 2026 revision: `file://` URIs,
/// fixed by the link's `environment/info`) writes it.
fn wire(path: &str) -> String {
    to_wire(path, Revision::Nov2026)
}

/// A path the session wrote (a URI or a plain path) as a host path.
pub fn host(path: &str) -> String {
    WirePath::parse(path.to_owned()).as_str().to_owned()
}

fn new_id(prefix: &str) -> String {
    format!("{prefix}-{}", uuid::Uuid::new_v4().simple())
}

async fn start(link: &Link, c: &Command, id: &str, stdin: bool) -> Result<(), ToolError> {
    let argv = c.argv()?;
    let cwd = absolute(link, c.cwd.as_deref().unwrap_or("."));
    link.call(
        methods::PROCESS_START,
        json!({"processId": id, "argv": argv, "cwd": wire(&cwd), "env": c.env, "tty": c.tty, "pipeStdin": stdin,
               // The tenant's base environment under the given variables,
               // as Codex's default shell-environment policy builds it.
               "envPolicy": {"inherit": "all", "ignoreDefaultExcludes": false, "exclude": [],
                             "set": {}, "includeOnly": []}}),
    )
    .await?;
    Ok(())
}

/// Output of one stream, kept up to a bound with what was cut counted.
struct Kept {
    bytes: Vec<u8>,
    cut: u64,
    max: usize,
    /// Chunks (either stream) no longer retained when read.
    lost: u64,
}

impl Kept {
    fn new(max: usize) -> Kept {
        Kept {
            bytes: Vec::new(),
            cut: 0,
            max,
            lost: 0,
        }
    }
    fn push(&mut self, b: &[u8]) {
        let room = self.max.saturating_sub(self.bytes.len());
        let take = room.min(b.len());
        self.bytes.extend_from_slice(&b[..take]);
        self.cut += (b.len() - take) as u64;
    }
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.bytes).into_owned()
    }
}

/// One `process/read` of the chunks after `after`: chunks into the two
/// streams; the response and the last chunk's seq (the next read's
/// `afterSeq`: `nextSeq` is one past it).
async fn read_once(
    link: &Link,
    id: &str,
    after: u64,
    max: usize,
    wait: Duration,
    out: &mut Kept,
    err: &mut Kept,
) -> Result<(Value, Option<u64>), ToolError> {
    let r = link
        .call(
            methods::PROCESS_READ,
            json!({"processId": id, "afterSeq": after, "maxBytes": max.max(1), "waitMs": wait.as_millis() as u64}),
        )
        .await?;
    // In seq order, each once; a seq skipped is output the gateway no
    // longer retained (the process wrote faster than it was read): counted.
    let mut chunks: Vec<&Value> = r["chunks"].as_array().into_iter().flatten().collect();
    chunks.sort_by_key(|c| c["seq"].as_u64().unwrap_or(0));
    let mut last = None;
    let mut prev = after;
    for c in chunks {
        let Some(seq) = c["seq"].as_u64().filter(|s| *s > prev) else {
            continue;
        };
        out.lost += seq - prev - 1;
        prev = seq;
        last = Some(seq);
        let data = B64
            .decode(c["chunk"].as_str().unwrap_or_default())
            .unwrap_or_default();
        match c["stream"].as_str() {
            Some("stderr") => err.push(&data),
            _ => out.push(&data),
        }
    }
    Ok((r, last))
}

async fn run_command(link: &Link, a: Value) -> Result<Value, ToolError> {
    let c: Command = args(a)?;
    if c.process_id.is_some() || c.tty {
        return Err(bad(
            "run_command takes no process_id or tty (see process_start)",
        ));
    }
    let timeout = Duration::from_millis(
        c.timeout_ms
            .unwrap_or(DEFAULT_RUN_TIMEOUT.as_millis() as u64),
    )
    .min(MAX_RUN_TIMEOUT);
    let max = c
        .max_output_bytes
        .unwrap_or(DEFAULT_OUTPUT_BYTES)
        .min(MAX_TOOL_BYTES);
    let id = new_id("mcp-run");
    start(link, &c, &id, c.stdin.is_some()).await?;
    if let Some(input) = &c.stdin {
        link.call(
            methods::PROCESS_WRITE,
            json!({"processId": id, "chunk": B64.encode(input), "writeId": new_id("mcp-w")}),
        )
        .await?;
        link.call(methods::PROCESS_CLOSE_STDIN, json!({"processId": id}))
            .await?;
    }
    let deadline = Instant::now() + timeout;
    let (mut out, mut err) = (Kept::new(max), Kept::new(max));
    let mut after = 0u64;
    let mut exited_at: Option<Instant> = None;
    loop {
        let wait = deadline
            .saturating_duration_since(Instant::now())
            .min(Duration::from_secs(5));
        let (r, last) =
            read_once(link, &id, after, MAX_TOOL_BYTES, wait, &mut out, &mut err).await?;
        after = last.unwrap_or(after).max(after);
        // Closed, and this read took everything (one cut short by its
        // byte bound is followed by another).
        let drained = last.is_none();
        // Exited, but a process it left behind (`server &`) holds its
        // output open: a read answers at once then, so it is not asked
        // again in a loop; after a grace the command's own exit is the
        // answer, and what it left keeps running in the session.
        if r["exited"].as_bool() == Some(true) && r["closed"].as_bool() != Some(true) && drained {
            let since = *exited_at.get_or_insert_with(Instant::now);
            if since.elapsed() >= EXITED_GRACE {
                return Ok(json!({
                    "exit_code": r["exitCode"],
                    "timed_out": false,
                    "stdout": out.text(), "stderr": err.text(),
                    "stdout_cut_bytes": out.cut, "stderr_cut_bytes": err.cut,
                    "output_lost_chunks": out.lost,
                    "still_running_in_background": true,
                }));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        }
        if (r["closed"].as_bool() == Some(true) && drained) || r["failure"].is_string() {
            return Ok(json!({
                "exit_code": r["exitCode"],
                "timed_out": false,
                "stdout": out.text(), "stderr": err.text(),
                "stdout_cut_bytes": out.cut, "stderr_cut_bytes": err.cut,
                    "output_lost_chunks": out.lost,
                "failure": r["failure"],
            }));
        }
        if Instant::now() >= deadline {
            let _ = link
                .call(methods::PROCESS_TERMINATE, json!({"processId": id}))
                .await;
            return Ok(json!({
                "exit_code": null,
                "timed_out": true,
                "stdout": out.text(), "stderr": err.text(),
                "stdout_cut_bytes": out.cut, "stderr_cut_bytes": err.cut,
                    "output_lost_chunks": out.lost,
            }));
        }
    }
}

async fn process_start(link: &Link, a: Value) -> Result<Value, ToolError> {
    let c: Command = args(a)?;
    if c.stdin.is_some() || c.timeout_ms.is_some() || c.max_output_bytes.is_some() {
        return Err(bad(
            "process_start takes no stdin, timeout_ms or max_output_bytes (see process_write, process_read)",
        ));
    }
    let id = c.process_id.clone().unwrap_or_else(|| new_id("mcp"));
    start(link, &c, &id, true).await?;
    Ok(json!({"process_id": id}))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ReadArgs {
    process_id: String,
    #[serde(default)]
    after_seq: u64,
    max_bytes: Option<usize>,
    #[serde(default)]
    wait_ms: u64,
}

async fn process_read(link: &Link, a: Value) -> Result<Value, ToolError> {
    let r: ReadArgs = args(a)?;
    let max = r
        .max_bytes
        .unwrap_or(DEFAULT_OUTPUT_BYTES)
        .clamp(1, MAX_TOOL_BYTES);
    let wait = Duration::from_millis(r.wait_ms).min(MAX_READ_WAIT);
    let (mut out, mut err) = (Kept::new(max), Kept::new(max));
    let (v, last) = read_once(
        link,
        &r.process_id,
        r.after_seq,
        max,
        wait,
        &mut out,
        &mut err,
    )
    .await?;
    Ok(json!({
        "stdout": out.text(), "stderr": err.text(), "output_lost_chunks": out.lost,
        "next_after_seq": last.unwrap_or(r.after_seq).max(r.after_seq),
        "exited": v["exited"], "exit_code": v["exitCode"],
        "closed": v["closed"], "failure": v["failure"],
    }))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct WriteArgs {
    process_id: String,
    #[serde(default)]
    data: String,
    #[serde(default)]
    close_stdin: bool,
}

async fn process_write(link: &Link, a: Value) -> Result<Value, ToolError> {
    let w: WriteArgs = args(a)?;
    let mut status = Value::Null;
    if !w.data.is_empty() {
        let r = link
            .call(
                methods::PROCESS_WRITE,
                json!({"processId": w.process_id, "chunk": B64.encode(&w.data), "writeId": new_id("mcp-w")}),
            )
            .await?;
        status = r["status"].clone();
    }
    if w.close_stdin {
        link.call(
            methods::PROCESS_CLOSE_STDIN,
            json!({"processId": w.process_id}),
        )
        .await?;
    }
    Ok(json!({"written_bytes": w.data.len(), "status": status, "stdin_closed": w.close_stdin}))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct IdArgs {
    process_id: String,
}

async fn process_terminate(link: &Link, a: Value) -> Result<Value, ToolError> {
    let i: IdArgs = args(a)?;
    let r = link
        .call(
            methods::PROCESS_TERMINATE,
            json!({"processId": i.process_id}),
        )
        .await?;
    Ok(json!({"was_running": r["running"]}))
}

async fn process_list(link: &Link) -> Result<Value, ToolError> {
    let r = link.call(methods::PROCESS_LIST, json!({})).await?;
    let list: Vec<Value> = r["processes"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|p| json!({"process_id": p["processId"], "state": p["state"], "exit_code": p["exitCode"], "tty": p["tty"]}))
        .collect();
    Ok(json!({"processes": list}))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ReadFileArgs {
    path: String,
    #[serde(default)]
    offset: u64,
    max_bytes: Option<usize>,
}

/// Up to `len` bytes of `path` from `offset` (a handle opened and closed
/// around one block, so a file of any size costs only what is asked).
async fn read_block(
    link: &Link,
    path: &str,
    offset: u64,
    len: usize,
) -> Result<(Vec<u8>, bool), ToolError> {
    let handle = new_id("mcp-read");
    link.call(
        methods::FS_OPEN,
        json!({"handleId": handle, "path": wire(path), "mode": "read"}),
    )
    .await?;
    let r = link
        .call(
            methods::FS_READ_BLOCK,
            json!({"handleId": handle, "offset": offset, "len": len}),
        )
        .await;
    close(link, &handle).await;
    let r = r?;
    let data = B64
        .decode(r["chunk"].as_str().unwrap_or_default())
        .map_err(|e| bad(format!("undecodable block: {e}")))?;
    Ok((data, r["eof"].as_bool().unwrap_or(true)))
}

/// Close `handle`; a close refused for load (the tenant's rate or
/// in-flight limit) is tried again after a pause, a few times: a handle
/// left open counts against the session's handles until it ends.
async fn close(link: &Link, handle: &str) {
    for pause_ms in [0u64, 50, 200, 500, 1000] {
        tokio::time::sleep(Duration::from_millis(pause_ms)).await;
        match link
            .call(methods::FS_CLOSE, json!({"handleId": handle}))
            .await
        {
            Err(e) if e.code == crate::error::code::OVERLOADED => continue,
            _ => return,
        }
    }
}

async fn read_file(link: &Link, a: Value) -> Result<Value, ToolError> {
    let r: ReadFileArgs = args(a)?;
    let path = absolute(link, &r.path);
    let len = r
        .max_bytes
        .unwrap_or(DEFAULT_READ_BYTES)
        .clamp(1, MAX_TOOL_BYTES);
    let (data, eof) = read_block(link, &path, r.offset, len).await?;
    let (content, encoding) = match String::from_utf8(data) {
        Ok(s) => (s, "utf8"),
        Err(e) => (B64.encode(e.as_bytes()), "base64"),
    };
    Ok(
        json!({"path": path, "offset": r.offset, "content": content, "encoding": encoding, "eof": eof}),
    )
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct WriteFileArgs {
    path: String,
    content: String,
    #[serde(default)]
    encoding: Option<String>,
    #[serde(default)]
    create_parents: bool,
}

async fn write_file(link: &Link, a: Value) -> Result<Value, ToolError> {
    let w: WriteFileArgs = args(a)?;
    let path = absolute(link, &w.path);
    let data = match w.encoding.as_deref() {
        None | Some("utf8") => B64.encode(w.content.as_bytes()),
        Some("base64") => {
            let bytes = B64
                .decode(&w.content)
                .map_err(|e| bad(format!("content is not base64: {e}")))?;
            B64.encode(bytes)
        }
        Some(other) => return Err(bad(format!("unknown encoding `{other}`"))),
    };
    if w.create_parents
        && let Some((parent, _)) = path.rsplit_once('/')
        && !parent.is_empty()
    {
        link.call(
            methods::FS_CREATE_DIRECTORY,
            json!({"path": wire(parent), "recursive": true}),
        )
        .await?;
    }
    link.call(
        methods::FS_WRITE_FILE,
        json!({"path": wire(&path), "dataBase64": data}),
    )
    .await?;
    Ok(json!({"path": path, "written": true}))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ListArgs {
    path: Option<String>,
}

async fn list_directory(link: &Link, a: Value) -> Result<Value, ToolError> {
    let l: ListArgs = args(a)?;
    let path = absolute(link, l.path.as_deref().unwrap_or("."));
    // A walk one level deep, bounded by its entries: a directory of any
    // size answers (`fs/readDirectory` would answer all of it or fail).
    let r = link
        .call(
            methods::FS_WALK,
            json!({"path": wire(&path), "options": {"maxDepth": 0, "maxDirectories": 1,
                   "maxEntries": MAX_LIST_ENTRIES, "followDirectorySymlinks": false,
                   "pruneHiddenDirectories": false}}),
        )
        .await?;
    let mut entries: Vec<Value> = r["entries"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|e| {
            let p = host(e["path"].as_str().unwrap_or_default());
            let name = p.rsplit('/').next().unwrap_or_default().to_owned();
            let kind = match e["kind"].as_str() {
                Some("directory") => "directory",
                Some("file") => "file",
                _ => "other",
            };
            json!({"name": name, "kind": kind})
        })
        .collect();
    entries.sort_by(|a, b| a["name"].as_str().cmp(&b["name"].as_str()));
    let truncated = r["truncated"].as_bool().unwrap_or(false);
    Ok(json!({"path": path, "entries": entries, "truncated": truncated}))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SearchArgs {
    path: Option<String>,
    pattern: String,
    #[serde(default)]
    regex: bool,
    name_suffix: Option<String>,
    max_results: Option<usize>,
}

async fn search_files(link: &Link, a: Value) -> Result<Value, ToolError> {
    let s: SearchArgs = args(a)?;
    if s.pattern.is_empty() {
        return Err(bad("pattern is empty"));
    }
    let re = if s.regex {
        Some(regex_lite::Regex::new(&s.pattern).map_err(|e| bad(format!("bad regex: {e}")))?)
    } else {
        None
    };
    let max_results = s.max_results.unwrap_or(100).clamp(1, SEARCH_MAX_RESULTS);
    let root = absolute(link, s.path.as_deref().unwrap_or("."));
    let walk = link
        .call(
            methods::FS_WALK,
            json!({"path": wire(&root), "options": {"maxDepth": 32, "maxDirectories": SEARCH_MAX_ENTRIES,
                   "maxEntries": SEARCH_MAX_ENTRIES, "followDirectorySymlinks": false,
                   "pruneHiddenDirectories": true}}),
        )
        .await?;
    let mut matches = Vec::new();
    let (mut read, mut files, mut skipped) = (0usize, 0u64, 0u64);
    let mut stopped: Option<String> = None;
    let mut truncated = walk["truncated"].as_bool().unwrap_or(false);
    for e in walk["entries"].as_array().into_iter().flatten() {
        if e["kind"].as_str() != Some("file") {
            continue;
        }
        let Some(p) = e["path"].as_str() else {
            continue;
        };
        if s.name_suffix.as_deref().is_some_and(|x| !p.ends_with(x)) {
            continue;
        }
        if read >= SEARCH_MAX_BYTES || matches.len() >= max_results {
            truncated = true;
            break;
        }
        let p = host(p);
        let path = if p.starts_with('/') {
            p
        } else {
            format!("{}/{p}", root.trim_end_matches('/'))
        };
        let want = SEARCH_FILE_BYTES.min(SEARCH_MAX_BYTES - read);
        let data = match read_block(link, &path, 0, want).await {
            Ok((data, _)) => data,
            Err(ToolError(e)) if e.contains("overloaded") || e.contains("rate") => {
                // The tenant's limits say stop: what was searched is
                // answered, marked as cut short.
                truncated = true;
                stopped = Some(e);
                break;
            }
            Err(_) => {
                skipped += 1;
                continue;
            }
        };
        read += data.len();
        files += 1;
        if data.contains(&0) {
            continue; // binary
        }
        // Matching is CPU work: on the blocking pool, not the threads that
        // serve every tenant's calls.
        let (pattern, re2, room) = (s.pattern.clone(), re.clone(), max_results - matches.len());
        let found = tokio::task::spawn_blocking(move || {
            let text = String::from_utf8_lossy(&data);
            let mut found = Vec::new();
            for (n, line) in text.lines().enumerate() {
                let hit = match &re2 {
                    Some(re) => re.is_match(line),
                    None => line.contains(&pattern),
                };
                if hit {
                    found.push((
                        n + 1,
                        line.chars().take(MATCH_LINE_CHARS).collect::<String>(),
                    ));
                    if found.len() >= room {
                        break;
                    }
                }
            }
            found
        })
        .await
        .unwrap_or_default();
        for (line_no, text) in found {
            matches.push(json!({"path": path, "line": line_no, "text": text}));
        }
        if matches.len() >= max_results {
            truncated = true;
            break;
        }
    }
    Ok(
        json!({"matches": matches, "files_searched": files, "files_unreadable": skipped,
              "truncated": truncated, "stopped_by": stopped}),
    )
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SnapshotArgs {
    name: Option<String>,
    #[serde(default)]
    labels: BTreeMap<String, String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PreviewArgs {
    port: u16,
    #[serde(default)]
    public: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PortArgs {
    port: u16,
}

/// Run tool `name` (not `fork_snapshot`, which replaces the link: the
/// handler's) on `link`.
pub async fn call(link: &Link, name: &str, a: Value) -> Result<Value, ToolError> {
    match name {
        "run_command" => run_command(link, a).await,
        "process_start" => process_start(link, a).await,
        "process_read" => process_read(link, a).await,
        "process_write" => process_write(link, a).await,
        "process_terminate" => process_terminate(link, a).await,
        "process_list" => process_list(link).await,
        "read_file" => read_file(link, a).await,
        "write_file" => write_file(link, a).await,
        "list_directory" => list_directory(link, a).await,
        "search_files" => search_files(link, a).await,
        "snapshot_create" => {
            let s: SnapshotArgs = args(a)?;
            Ok(link
                .call(
                    methods::SNAPSHOT_CREATE,
                    json!({"name": s.name, "labels": s.labels}),
                )
                .await?)
        }
        "snapshot_list" => Ok(link.call(methods::SNAPSHOT_LIST, json!({})).await?),
        "preview_create" => {
            let p: PreviewArgs = args(a)?;
            Ok(link
                .call(
                    methods::PREVIEW_CREATE,
                    json!({"port": p.port, "public": p.public}),
                )
                .await?)
        }
        "preview_revoke" => {
            let p: PortArgs = args(a)?;
            link.call(methods::PREVIEW_REVOKE, json!({"port": p.port}))
                .await?;
            Ok(json!({"port": p.port, "revoked": true}))
        }
        other => Err(bad(format!("unknown tool `{other}`"))),
    }
}

/// `fork_snapshot`'s argument.
pub fn fork_target(a: Value) -> Result<String, ToolError> {
    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Fork {
        snapshot_id: String,
    }
    Ok(args::<Fork>(a)?.snapshot_id)
}
