//! The reliability soak's workload: loops that each hold one session at a
//! time on one door and run a mix of operations in it, checking every
//! byte they get back.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use exec_gateway::client::{Attachment, Client, ConnectOptions, Event, ProcessSpec};
use parking_lot::Mutex;

/// Operations run in one session before the loop closes it and opens a new
/// one (new sessions land on whichever replica the balancer picks).
const OPS_PER_SESSION: u64 = 24;
/// An operation that takes longer than this is recorded as failed.
const OP_TIMEOUT: Duration = Duration::from_secs(60);
/// How long the client library retries a dropped connection.
const RESUME_WITHIN: Duration = Duration::from_secs(20);
/// `seq 1 FLOOD_LINES`: 728,895 bytes, under the gateway's 1 MiB
/// per-process retention, so that no cut can lose any of it.
const FLOOD_LINES: u32 = 120_000;
/// Bytes a stdin operation pipes through `cat`, and a file operation
/// writes and reads back.
const STDIN_BYTES: usize = 256 * 1024;
const FILE_BYTES: usize = 512 * 1024;

/// What a loop does, in turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
pub enum Kind {
    /// Connect and create (or resume) a session.
    Session,
    /// `true`, to its close.
    Short,
    /// Twenty lines over two seconds.
    Long,
    /// A terminal: a line written, echoed and read back.
    Pty,
    /// 256 KiB through `cat`'s stdin.
    Stdin,
    /// `seq 1 120000` (712 KiB) as fast as it comes.
    Flood,
    /// A 512 KiB file written, read back, removed.
    Files,
    /// A process attached, the connection dropped, the session resumed on
    /// a new connection and the rest of the output read from the cursor.
    Resume,
    /// Chaos's own client that stops reading (its outcome is whether the
    /// gateway cut it loose).
    Stalled,
}

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::Session => "session",
            Kind::Short => "short",
            Kind::Long => "long",
            Kind::Pty => "pty",
            Kind::Stdin => "stdin",
            Kind::Flood => "flood",
            Kind::Files => "files",
            Kind::Resume => "resume",
            Kind::Stalled => "stalled client",
        }
    }
}

const MIX: [Kind; 8] = [
    Kind::Short,
    Kind::Flood,
    Kind::Short,
    Kind::Files,
    Kind::Pty,
    Kind::Stdin,
    Kind::Long,
    Kind::Resume,
];

/// One operation's outcome.
#[derive(Debug, Clone)]
pub struct Record {
    pub kind: Kind,
    pub tenant: &'static str,
    pub door: &'static str,
    /// The replica named by the session id (fleet mode), if any.
    pub owner: Option<String>,
    /// When the session the operation ran in was created.
    pub session_created: Instant,
    pub started: Instant,
    pub ended: Instant,
    pub error: Option<String>,
}

/// Where one loop connects, and as whom.
#[derive(Clone)]
pub struct Loop {
    pub tenant: &'static str,
    pub door: &'static str,
    pub url: String,
    pub token: String,
    pub id: usize,
}

pub type Records = Arc<Mutex<Vec<Record>>>;

/// The replica a fleet session id names (`{replica}.{boot}.{uuid}`).
fn owner_of(session: &str) -> Option<String> {
    let mut parts = session.splitn(3, '.');
    match (parts.next(), parts.next(), parts.next()) {
        (Some(r), Some(_), Some(_)) => Some(r.to_owned()),
        _ => None,
    }
}

/// A deterministic byte pattern (xorshift), different for every seed.
pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

fn flood_text() -> Vec<u8> {
    let mut s = String::new();
    for i in 1..=FLOOD_LINES {
        s.push_str(&i.to_string());
        s.push('\n');
    }
    s.into_bytes()
}

fn long_text(lines: u32, tag: &str) -> Vec<u8> {
    (1..=lines)
        .map(|i| format!("{tag}{i}\n"))
        .collect::<String>()
        .into_bytes()
}

/// A shell loop printing `{tag}1` .. `{tag}{lines}`, `pause` apart.
fn long_argv(lines: u32, tag: &str, pause: &str) -> Vec<String> {
    vec![
        "sh".into(),
        "-c".into(),
        format!("i=0; while [ $i -lt {lines} ]; do i=$((i+1)); echo {tag}$i; sleep {pause}; done"),
    ]
}

fn spec(id: &str, argv: Vec<String>) -> ProcessSpec {
    let mut s = ProcessSpec::new(id, argv);
    s.env.insert("PATH".into(), "/usr/bin:/bin".into());
    s
}

/// Output and exit code of an attachment read to the close; output must
/// come in rising seq order and none may be lost.
async fn collect(a: &mut Attachment<'_>) -> Result<(Vec<u8>, Option<i32>), String> {
    let mut out = Vec::new();
    let mut code = None;
    let mut last = 0u64;
    while let Some(e) = a.next().await.map_err(|e| e.to_string())? {
        match e {
            Event::Output { seq, data, .. } => {
                if seq <= last {
                    return Err(format!("seq {seq} after {last}"));
                }
                last = seq;
                out.extend_from_slice(&data);
            }
            Event::Exited { code: c, signal } => code = Some(signal.map_or(c, |s| 128 + s)),
            Event::OutputLost { chunks } => return Err(format!("{chunks} output chunks lost")),
        }
    }
    Ok((out, code))
}

fn expect(what: &str, got: &[u8], code: Option<i32>, want: &[u8]) -> Result<(), String> {
    if code != Some(0) {
        return Err(format!("{what}: exit code {code:?}"));
    }
    if got != want {
        let at = got.iter().zip(want).take_while(|(a, b)| a == b).count();
        return Err(format!(
            "{what}: {} bytes, wanted {} (first difference at byte {at})",
            got.len(),
            want.len()
        ));
    }
    Ok(())
}

async fn connect(l: &Loop, resume: Option<String>) -> Result<Client, String> {
    let mut o = ConnectOptions::new(&l.url, &l.token);
    o.client_name = format!("soak-{}", l.id);
    o.resume_session = resume;
    o.resume_within = RESUME_WITHIN;
    Client::connect_with(o).await.map_err(|e| e.to_string())
}

/// Run `l` until `stop`, recording every operation.
pub async fn run(l: Loop, stop: Arc<AtomicBool>, records: Records) {
    let flood = Arc::new(flood_text());
    let mut n = l.id as u64 * 1_000_000;
    while !stop.load(Ordering::Relaxed) {
        let started = Instant::now();
        let connected = tokio::time::timeout(OP_TIMEOUT, connect(&l, None))
            .await
            .unwrap_or_else(|_| Err("timed out".into()));
        let mut record = Record {
            kind: Kind::Session,
            tenant: l.tenant,
            door: l.door,
            owner: None,
            session_created: started,
            started,
            ended: Instant::now(),
            error: None,
        };
        let client = match connected {
            Ok(c) => c,
            Err(e) => {
                record.error = Some(e);
                records.lock().push(record);
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            }
        };
        record.owner = owner_of(client.session_id());
        records.lock().push(record.clone());
        let mut client = Some(client);
        for _ in 0..OPS_PER_SESSION {
            let Some(c) = client.as_ref() else { break };
            if stop.load(Ordering::Relaxed) {
                break;
            }
            n += 1;
            let kind = MIX[(n % MIX.len() as u64) as usize];
            let started = Instant::now();
            let result = if kind == Kind::Resume {
                let taken = client.take();
                match tokio::time::timeout(OP_TIMEOUT, resume(&l, taken, n)).await {
                    Ok((r, next)) => {
                        client = next;
                        r
                    }
                    Err(_) => Err(format!("no answer in {}s", OP_TIMEOUT.as_secs())),
                }
            } else {
                tokio::time::timeout(OP_TIMEOUT, op(&l, c, kind, n, &flood))
                    .await
                    .unwrap_or_else(|_| Err(format!("no answer in {}s", OP_TIMEOUT.as_secs())))
            };
            let failed = result.is_err();
            records.lock().push(Record {
                kind,
                started,
                ended: Instant::now(),
                error: result.err(),
                ..record.clone()
            });
            if failed {
                client = None;
            }
        }
        if let Some(c) = client {
            let _ = tokio::time::timeout(Duration::from_secs(10), c.close()).await;
        }
    }
}

/// Start a process, read its first lines, drop the connection, resume the
/// session on a new one and read the rest from the cursor; the client to
/// go on with.
async fn resume(l: &Loop, client: Option<Client>, n: u64) -> (Result<(), String>, Option<Client>) {
    let Some(c) = client else {
        return (Err("no client".into()), None);
    };
    let id = format!("p{n}");
    let first = async {
        c.start(&spec(&id, long_argv(30, "r", "0.05")))
            .await
            .map_err(s)?;
        let mut got = Vec::new();
        let mut a = c.attach(&id, 0).await.map_err(s)?;
        while got.len() < 12 {
            match a.next().await.map_err(s)? {
                Some(Event::Output { data, .. }) => got.extend_from_slice(&data),
                Some(e) => return Err(format!("{e:?} before the cut")),
                None => return Err("closed before the cut".to_owned()),
            }
        }
        Ok((got, a.cursor()))
    }
    .await;
    let (mut got, cursor) = match first {
        Ok(v) => v,
        Err(e) => return (Err(e), Some(c)),
    };
    let sid = c.session_id().to_owned();
    // The connection goes without session/close: the session stays.
    drop(c);
    // The library resumes (waiting out the old connection's going).
    let c = match connect(l, Some(sid)).await {
        Ok(c) => c,
        Err(e) => return (Err(format!("resuming: {e}")), None),
    };
    let rest = async {
        let mut a = c.attach(&id, cursor).await.map_err(s)?;
        collect(&mut a).await
    }
    .await;
    let r = rest.and_then(|(rest, code)| {
        got.extend_from_slice(&rest);
        expect("resume", &got, code, &long_text(30, "r"))
    });
    (r, Some(c))
}

async fn op(l: &Loop, c: &Client, kind: Kind, n: u64, flood: &[u8]) -> Result<(), String> {
    let id = format!("p{n}");
    match kind {
        Kind::Short => {
            let mut a = c.exec(&spec(&id, vec!["true".into()])).await.map_err(s)?;
            let (out, code) = collect(&mut a).await?;
            expect("true", &out, code, b"")
        }
        Kind::Long => {
            let mut a = c
                .exec(&spec(&id, long_argv(20, "line", "0.1")))
                .await
                .map_err(s)?;
            let (out, code) = collect(&mut a).await?;
            expect("long", &out, code, &long_text(20, "line"))
        }
        Kind::Flood => {
            let argv = vec!["seq".into(), "1".into(), FLOOD_LINES.to_string()];
            let mut a = c.exec(&spec(&id, argv)).await.map_err(s)?;
            let (out, code) = collect(&mut a).await?;
            expect("flood", &out, code, flood)
        }
        Kind::Pty => {
            let mut p = spec(&id, vec!["head".into(), "-n".into(), "1".into()]);
            p.tty = true;
            c.start(&p).await.map_err(s)?;
            let line = format!("pty-{n}");
            c.write(&id, format!("{line}\n").as_bytes())
                .await
                .map_err(s)?;
            let mut a = c.attach(&id, 0).await.map_err(s)?;
            let (out, code) = collect(&mut a).await?;
            // The terminal echoes the line, then head prints it.
            expect(
                "pty",
                &out,
                code,
                format!("{line}\r\n{line}\r\n").as_bytes(),
            )
        }
        Kind::Stdin => {
            let mut p = spec(&id, vec!["cat".into()]);
            p.pipe_stdin = true;
            c.start(&p).await.map_err(s)?;
            let data = pattern(n, STDIN_BYTES);
            for chunk in data.chunks(64 * 1024) {
                c.write(&id, chunk).await.map_err(s)?;
            }
            c.close_stdin(&id).await.map_err(s)?;
            let mut a = c.attach(&id, 0).await.map_err(s)?;
            let (out, code) = collect(&mut a).await?;
            expect("stdin", &out, code, &data)
        }
        Kind::Files => {
            let path = c.absolute(&format!("soak-{}-{n}.bin", l.id));
            let data = pattern(n, FILE_BYTES);
            c.write_file(&path, data.clone()).await.map_err(s)?;
            let back = c.read_file(&path).await.map_err(s)?;
            c.remove(&path, false, false).await.map_err(s)?;
            expect("file", &back, Some(0), &data)
        }
        Kind::Session | Kind::Resume | Kind::Stalled => Ok(()),
    }
}

fn s(e: impl std::fmt::Display) -> String {
    e.to_string()
}
