//! `exec-gateway-bench --soak DURATION`: victims against an abuser.
//!
//! Two victim tenants run a steady mix (spawn to close, a 1 MiB stream,
//! `fs/readFile` of 1 MiB, `process/list`, a reconnect every 50 operations)
//! first alone for `--soak-baseline`, then for `--soak` next to one abusive
//! tenant and a crowd of unauthenticated sockets:
//!
//! - a client that asks for large files and never reads (reconnecting when
//!   the gateway drops it);
//! - pid churn (shells forking `true` as fast as they can);
//! - oversized frames, oversized `writeId`s and files over the read limit;
//! - 24 connections holding all but the last byte of a 4 MiB message each
//!   (the inbound budget holds them back; each is cut at the message
//!   timeout and comes back);
//! - idle unauthenticated sockets from four source addresses on both doors,
//!   reopened as the gateway closes them.
//!
//! It samples the gateway process's RSS and open descriptors every second
//! and prints, per phase, the victims' p50/p99 per operation and the errors
//! seen, and the gateway's peak RSS, peak descriptors and held outbound and
//! inbound bytes.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use futures_util::SinkExt as _;
use parking_lot::Mutex;
use serde_json::json;
use tokio::io::AsyncWriteExt as _;
use tokio::net::{TcpSocket, TcpStream};
use tokio_tungstenite::tungstenite::Message;

use super::harness::{BenchResult, Conn, Server, err, ms, percentile};

/// Victim tenants and concurrent loops per victim tenant.
const VICTIMS: &[&str] = &["victim-a", "victim-b"];
const LOOPS_PER_VICTIM: usize = 2;
/// Victim operations between reconnects.
const OPS_PER_SESSION: usize = 50;
/// Idle unauthenticated sockets the crowd keeps open (per door).
const IDLE_SOCKETS: usize = 1000;

#[derive(Default)]
struct Stats {
    latencies: BTreeMap<&'static str, Vec<Duration>>,
    errors: BTreeMap<String, u64>,
}

impl Stats {
    fn record(&mut self, op: &'static str, d: Duration) {
        self.latencies.entry(op).or_default().push(d);
    }

    fn error(&mut self, what: String) {
        // Keep the message short: ids and numbers vary.
        let key: String = what.chars().take(90).collect();
        *self.errors.entry(key).or_default() += 1;
    }
}

#[derive(Default, Clone, Copy)]
struct Peaks {
    rss_kib: u64,
    fds: u64,
    outbound_bytes: f64,
    inbound_bytes: f64,
}

struct Phase {
    name: &'static str,
    stats: Stats,
    peaks: Peaks,
    abuse: BTreeMap<&'static str, u64>,
    elapsed: Duration,
}

pub(super) fn proc_status_kib(pid: u32, key: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(key))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

pub(super) fn fd_count(pid: u32) -> u64 {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| d.count() as u64)
        .unwrap_or(0)
}

/// The sum of a metric's samples (all label sets) from the admin listener.
async fn admin_metric(admin: &str, name: &str) -> f64 {
    let Ok(body) = super::harness::http_get(admin, "/metrics").await else {
        return 0.0;
    };
    body.lines()
        .filter(|l| l.starts_with(name) && l[name.len()..].starts_with(['{', ' ']))
        .filter_map(|l| l.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()))
        .sum()
}

/// Settings of one soak run.
pub struct SoakArgs {
    pub duration: Duration,
    pub baseline: Duration,
}

pub async fn soak(exe: &Path, dir: &Path, args: SoakArgs) -> BenchResult<()> {
    let key = dir.join("soak.key");
    let secret: String = (0..64)
        .map(|i| char::from(b'a' + (i * 11 % 26) as u8))
        .collect();
    std::fs::write(&key, &secret).map_err(err)?;
    let small = dir.join("soak-1mib.bin");
    std::fs::write(&small, vec![7u8; 1024 * 1024]).map_err(err)?;
    let big = dir.join("soak-16mib.bin");
    std::fs::File::create(&big)
        .and_then(|f| f.set_len(16 * 1024 * 1024))
        .map_err(err)?;
    let huge = dir.join("soak-64mib.bin");
    std::fs::File::create(&huge)
        .and_then(|f| f.set_len(64 * 1024 * 1024))
        .map_err(err)?;
    let config = dir.join("soak.toml");
    let mut toml = format!(
        "[server]\nhandshake_timeout = \"5s\"\nslow_client_timeout = \"10s\"\ndetach_ttl = \"2s\"\n\
         [exec]\nexited_retention = \"2s\"\n\
         [[auth.keys]]\nalgorithm = \"HS256\"\nsecret_file = \"{}\"\n\
         [tenants.abuser]\nroot = \"/\"\nmax_outbound_bytes = 67108864\nmax_read_file_bytes = 16777216\n\
         max_processes = 32\npids_max = 256\n",
        key.display()
    );
    for v in VICTIMS {
        toml.push_str(&format!(
            "[tenants.{v}]\nroot = \"/\"\nrequests_per_second = 100000\nburst = 100000\nmax_sessions = 1024\n"
        ));
    }
    std::fs::write(&config, toml).map_err(err)?;
    let settings = exec_gateway::config::Config::load(&config)
        .and_then(exec_gateway::config::Config::validate)
        .map_err(err)?;
    let token = |tenant: &str| {
        super::harness::all_scopes_token(
            &secret,
            &settings,
            tenant,
            Duration::from_secs(24 * 3600),
            "soak",
        )
    };
    let config_s = config.display().to_string();
    let server = Server::gateway(exe, &config_s).await?;
    let pid = server.child.id().ok_or("gateway has no pid")?;
    let admin = server.admin.clone().ok_or("no admin address printed")?;
    let ws_addr = server.url.trim_start_matches("ws://").to_owned();
    let grpc_addr = server
        .grpc
        .clone()
        .ok_or("no gRPC address")?
        .trim_start_matches("http://")
        .to_owned();
    let victim_urls: Vec<String> = VICTIMS
        .iter()
        .map(|v| token(v).map(|t| format!("{}/?access_token={t}", server.url)))
        .collect::<Result<_, _>>()?;
    let abuser_url = format!("{}/?access_token={}", server.url, token("abuser")?);
    let small_s = small.display().to_string();

    let mut phases = Vec::new();
    for (name, length, abuse) in [
        ("baseline (victims alone)", args.baseline, false),
        ("with the abuser", args.duration, true),
    ] {
        eprintln!("soak: {name} for {}s", length.as_secs());
        let stop = Arc::new(AtomicBool::new(false));
        let stats = Arc::new(Mutex::new(Stats::default()));
        let mut tasks = Vec::new();
        for url in &victim_urls {
            for _ in 0..LOOPS_PER_VICTIM {
                tasks.push(exec_gateway::task::start(
                    "soak-victim",
                    victim(url.clone(), small_s.clone(), stop.clone(), stats.clone()),
                ));
            }
        }
        // The abuser runs in its own process: its client-side work (20 MiB
        // frames, connect storms) must not slow the victims' client down.
        let abuser = if abuse {
            let spec = json!({
                "url": abuser_url, "big": big.display().to_string(),
                "huge": huge.display().to_string(), "ws": ws_addr, "grpc": grpc_addr,
                "seconds": length.as_secs(),
                "picked": std::env::var("SOAK_ABUSE").unwrap_or_default(),
            });
            let exe = std::env::current_exe().map_err(err)?;
            Some(
                tokio::process::Command::new(exe)
                    .arg("--soak-abuser")
                    .arg(spec.to_string())
                    .stdout(std::process::Stdio::piped())
                    .kill_on_drop(true)
                    .spawn()
                    .map_err(err)?,
            )
        } else {
            None
        };
        let started = Instant::now();
        let mut peaks = Peaks::default();
        while started.elapsed() < length {
            tokio::time::sleep(Duration::from_secs(1)).await;
            peaks.rss_kib = peaks.rss_kib.max(proc_status_kib(pid, "VmRSS:"));
            peaks.fds = peaks.fds.max(fd_count(pid));
            peaks.outbound_bytes = peaks
                .outbound_bytes
                .max(admin_metric(&admin, "exec_gateway_outbound_bytes").await);
            peaks.inbound_bytes = peaks
                .inbound_bytes
                .max(admin_metric(&admin, "exec_gateway_inbound_bytes").await);
        }
        stop.store(true, Ordering::Relaxed);
        for t in tasks {
            let _ = tokio::time::timeout(Duration::from_secs(30), t).await;
        }
        let mut abuse_counts: BTreeMap<&'static str, u64> = BTreeMap::new();
        if let Some(child) = abuser {
            let out = tokio::time::timeout(Duration::from_secs(60), child.wait_with_output())
                .await
                .map_err(|_| "the abuser did not stop".to_owned())?
                .map_err(err)?;
            let counts: BTreeMap<String, u64> =
                serde_json::from_slice(&out.stdout).unwrap_or_default();
            for (k, v) in counts {
                abuse_counts.insert(Box::leak(k.into_boxed_str()), v);
            }
        }
        let refused = admin_metric(&admin, "exec_gateway_connections_refused_total").await;
        abuse_counts.insert("connections refused (gateway total)", refused as u64);
        phases.push(Phase {
            name,
            stats: std::mem::take(&mut *stats.lock()),
            peaks,
            abuse: abuse_counts,
            elapsed: started.elapsed(),
        });
        // Let the abuser's leftovers drain before the next phase.
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    let hwm = proc_status_kib(pid, "VmHWM:");
    report(&phases, hwm);
    drop(server);
    Ok(())
}

fn report(phases: &[Phase], hwm_kib: u64) {
    println!(
        "\nsoak: victims {VICTIMS:?} x {LOOPS_PER_VICTIM} loops; abuser: non-reading client, pid churn, oversized requests, {IDLE_SOCKETS} idle sockets per door"
    );
    let base = phases.first();
    for p in phases {
        println!("\n== {} ({}s)", p.name, p.elapsed.as_secs());
        println!(
            "{:<22} {:>8} {:>10} {:>10} {:>16}",
            "victim operation", "count", "p50", "p99", "p99 vs baseline"
        );
        for (op, lat) in &p.stats.latencies {
            let mut lat = lat.clone();
            lat.sort();
            let p99 = percentile(&lat, 0.99);
            let vs = base
                .and_then(|b| b.stats.latencies.get(op))
                .map(|b| {
                    let mut b = b.clone();
                    b.sort();
                    let bp = percentile(&b, 0.99).as_secs_f64();
                    if bp > 0.0 {
                        format!("{:.2}x", p99.as_secs_f64() / bp)
                    } else {
                        "-".to_owned()
                    }
                })
                .unwrap_or_default();
            println!(
                "{:<22} {:>8} {:>10} {:>10} {:>16}",
                op,
                lat.len(),
                ms(percentile(&lat, 0.5)),
                ms(p99),
                vs
            );
        }
        if p.stats.errors.is_empty() {
            println!("victim errors: none");
        } else {
            for (e, n) in &p.stats.errors {
                println!("victim error x{n}: {e}");
            }
        }
        for (what, n) in &p.abuse {
            println!("abuse: {what}: {n}");
        }
        println!(
            "gateway peak RSS {:.1} MiB, peak open fds {}, peak outbound bytes held {:.1} MiB, peak inbound bytes held {:.1} MiB",
            p.peaks.rss_kib as f64 / 1024.0,
            p.peaks.fds,
            p.peaks.outbound_bytes / (1024.0 * 1024.0),
            p.peaks.inbound_bytes / (1024.0 * 1024.0)
        );
    }
    println!(
        "\ngateway VmHWM over the whole run: {:.1} MiB",
        hwm_kib as f64 / 1024.0
    );
}

/// One victim loop: a steady mix of operations, reconnecting every
/// [`OPS_PER_SESSION`].
async fn victim(url: String, file: String, stop: Arc<AtomicBool>, stats: Arc<Mutex<Stats>>) {
    let mut n: u64 = 0;
    while !stop.load(Ordering::Relaxed) {
        let t = Instant::now();
        let mut conn = match Conn::open(&url).await {
            Ok(c) => c,
            Err(e) => {
                stats.lock().error(format!("connect: {e}"));
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        stats.lock().record("connect+initialize", t.elapsed());
        for _ in 0..OPS_PER_SESSION {
            if stop.load(Ordering::Relaxed) {
                break;
            }
            n += 1;
            let pid = format!("v{n}");
            let t = Instant::now();
            let (op, result): (&'static str, BenchResult<()>) = match n % 4 {
                0 => (
                    "spawn true to close",
                    conn.run_to_close(&pid, &["true"]).await.map(|_| ()),
                ),
                1 => (
                    "stream 1 MiB",
                    conn.run_to_close(&pid, &["head", "-c", "1048576", "/dev/zero"])
                        .await
                        .and_then(|b| {
                            if b == 1024 * 1024 {
                                Ok(())
                            } else {
                                Err(format!("streamed {b} bytes"))
                            }
                        }),
                ),
                2 => (
                    "fs/readFile 1 MiB",
                    conn.call("fs/readFile", json!({"path": file}))
                        .await
                        .map(|_| ()),
                ),
                _ => (
                    "process/list",
                    conn.call("process/list", json!({})).await.map(|_| ()),
                ),
            };
            match result {
                Ok(()) => stats.lock().record(op, t.elapsed()),
                Err(e) => {
                    stats.lock().error(format!("{op}: {e}"));
                    break;
                }
            }
        }
    }
}

/// `--soak-abuser SPEC`: the abusive tenant and the idle crowd, for
/// `seconds`; prints its counters as one JSON object.
pub async fn abuser_main(spec: &str) -> BenchResult<()> {
    let v: serde_json::Value = serde_json::from_str(spec).map_err(err)?;
    let text = |k: &str| v[k].as_str().unwrap_or_default().to_owned();
    let picked = text("picked");
    let on = |what: &str| picked.is_empty() || picked.split(',').any(|p| p == what);
    let stop = Arc::new(AtomicBool::new(false));
    let counters: Arc<Mutex<BTreeMap<&'static str, u64>>> = Arc::default();
    let mut tasks = Vec::new();
    if on("non-reader") {
        tasks.push(exec_gateway::task::start(
            "soak-non-reader",
            non_reader(text("url"), text("big"), stop.clone(), counters.clone()),
        ));
    }
    if on("churn") {
        tasks.push(exec_gateway::task::start(
            "soak-churn",
            pid_churn(text("url"), stop.clone(), counters.clone()),
        ));
    }
    if on("oversized") {
        tasks.push(exec_gateway::task::start(
            "soak-oversized",
            oversized(text("url"), text("huge"), stop.clone(), counters.clone()),
        ));
    }
    if on("unfinished") {
        tasks.push(exec_gateway::task::start(
            "soak-unfinished",
            unfinished(text("url"), stop.clone(), counters.clone()),
        ));
    }
    if on("idle") {
        for door in [text("ws"), text("grpc")] {
            tasks.push(exec_gateway::task::start(
                "soak-idle",
                idle_crowd(door, stop.clone(), counters.clone()),
            ));
        }
    }
    tokio::time::sleep(Duration::from_secs(v["seconds"].as_u64().unwrap_or(60))).await;
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        let _ = tokio::time::timeout(Duration::from_secs(30), t).await;
    }
    let counts = counters.lock().clone();
    println!("{}", serde_json::to_string(&counts).map_err(err)?);
    Ok(())
}

/// Connections that each send all but the last byte of a 4 MiB websocket
/// message and hold it (the inbound attack of issue 27): the gateway
/// charges them to the tenant's inbound budget, stops reading past it,
/// and cuts each at the message timeout; they come back.
async fn unfinished(
    url: String,
    stop: Arc<AtomicBool>,
    c: Arc<Mutex<BTreeMap<&'static str, u64>>>,
) {
    const CONNS: usize = 24;
    const LEN: usize = 4 << 20;
    let Ok(parsed) = url::Url::parse(&url) else {
        return;
    };
    let addr = format!(
        "{}:{}",
        parsed.host_str().unwrap_or("127.0.0.1"),
        parsed.port().unwrap_or(80)
    );
    let token = parsed
        .query_pairs()
        .find(|(k, _)| k == "access_token")
        .map(|(_, v)| v.into_owned())
        .unwrap_or_default();
    let mut frame = vec![0x81u8, 0x80 | 127];
    frame.extend_from_slice(&(LEN as u64).to_be_bytes());
    frame.extend_from_slice(&[0, 0, 0, 0]);
    frame.resize(frame.len() + LEN - 1, b'x');
    let frame = Arc::new(frame);
    let mut held = tokio::task::JoinSet::new();
    while !stop.load(Ordering::Relaxed) {
        while held.len() < CONNS && !stop.load(Ordering::Relaxed) {
            let (addr, token, frame, c, stop) = (
                addr.clone(),
                token.clone(),
                frame.clone(),
                c.clone(),
                stop.clone(),
            );
            held.spawn(async move {
                use tokio::io::AsyncReadExt as _;
                let Ok(mut s) = TcpStream::connect(&addr).await else {
                    bump(&c, "unfinished: connect failed");
                    return;
                };
                let req = format!(
                    "GET / HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
                     Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\
                     Authorization: Bearer {token}\r\n\r\n"
                );
                if s.write_all(req.as_bytes()).await.is_err() {
                    return;
                }
                let mut head = Vec::new();
                let mut b = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") {
                    if s.read_exact(&mut b).await.is_err() {
                        bump(&c, "unfinished: refused at the handshake");
                        return;
                    }
                    head.push(b[0]);
                }
                bump(&c, "unfinished: messages started");
                // Blocks once the gateway stops reading; fails once it cuts.
                let _ = s.write_all(&frame).await;
                let mut rest = Vec::new();
                let _ =
                    tokio::time::timeout(Duration::from_secs(90), s.read_to_end(&mut rest)).await;
                if !stop.load(Ordering::Relaxed) {
                    bump(&c, "unfinished: cut by the gateway");
                }
            });
        }
        tokio::select! {
            _ = held.join_next() => {}
            () = tokio::time::sleep(Duration::from_secs(1)) => {}
        }
    }
    held.abort_all();
}

fn bump(c: &Mutex<BTreeMap<&'static str, u64>>, what: &'static str) {
    *c.lock().entry(what).or_default() += 1;
}

/// Asks for 64 large files per connection and never reads; the gateway
/// drops it at the slow-client timeout and it comes back.
async fn non_reader(
    url: String,
    file: String,
    stop: Arc<AtomicBool>,
    c: Arc<Mutex<BTreeMap<&'static str, u64>>>,
) {
    let mut held = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        match Conn::open(&url).await {
            Ok(mut conn) => {
                for _ in 0..64 {
                    if conn
                        .send("fs/readFile", json!({"path": file}))
                        .await
                        .is_err()
                    {
                        break;
                    }
                }
                bump(&c, "non-reading connections opened");
                held.push(conn);
                // A few at once; the oldest go when the gateway drops them.
                if held.len() > 4 {
                    held.remove(0);
                }
            }
            Err(_) => bump(&c, "non-reading connection refused"),
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}

/// Shells forking `true` as fast as they can, restarted when they end.
async fn pid_churn(url: String, stop: Arc<AtomicBool>, c: Arc<Mutex<BTreeMap<&'static str, u64>>>) {
    let mut n = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let Ok(mut conn) = Conn::open(&url).await else {
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        };
        for _ in 0..4 {
            n += 1;
            let started = conn
                .call(
                    "process/start",
                    json!({"processId": format!("churn{n}"), "argv": ["sh", "-c", "while :; do /bin/true; done"],
                           "cwd": "/tmp", "env": {"PATH": "/usr/bin:/bin"}, "tty": false}),
                )
                .await;
            bump(
                &c,
                if started.is_ok() {
                    "churn shells started"
                } else {
                    "churn shells refused"
                },
            );
        }
        // Hold them until the phase ends (their output is discarded).
        while !stop.load(Ordering::Relaxed) {
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        let _ = conn.ws.close(None).await;
    }
}

/// Oversized frames, `writeId`s and files, over and over.
async fn oversized(
    url: String,
    huge: String,
    stop: Arc<AtomicBool>,
    c: Arc<Mutex<BTreeMap<&'static str, u64>>>,
) {
    let frame = format!(
        r#"{{"id":1,"method":"process/list","params":{{"pad":"{}"}}}}"#,
        "x".repeat(20 * 1024 * 1024)
    );
    while !stop.load(Ordering::Relaxed) {
        let Ok(mut conn) = Conn::open(&url).await else {
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        };
        for _ in 0..20 {
            if conn
                .call("fs/readFile", json!({"path": huge}))
                .await
                .is_err()
            {
                bump(&c, "readFile over the limit refused");
            }
            let r = conn
                .call(
                    "process/write",
                    json!({"processId": "none", "chunk": "", "writeId": "w".repeat(1 << 20)}),
                )
                .await;
            if r.is_err() {
                bump(&c, "oversized writeId refused");
            }
        }
        if conn.ws.send(Message::text(frame.clone())).await.is_ok() {
            bump(&c, "20 MiB frames sent");
        }
        let _ = conn.next_text().await;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Idle sockets from four source addresses, reopened when closed.
async fn idle_crowd(
    addr: String,
    stop: Arc<AtomicBool>,
    c: Arc<Mutex<BTreeMap<&'static str, u64>>>,
) {
    let Ok(to) = addr.parse::<std::net::SocketAddr>() else {
        return;
    };
    let opened = Arc::new(AtomicU64::new(0));
    let mut socks: Vec<TcpStream> = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        // Drop the ones the gateway closed.
        socks.retain(|s| {
            let mut b = [0u8; 256];
            match s.try_read(&mut b) {
                Ok(0) => false,
                // An HTTP/2 server preface: still open.
                Ok(_) => true,
                Err(e) => e.kind() == std::io::ErrorKind::WouldBlock,
            }
        });
        while socks.len() < IDLE_SOCKETS {
            let i = opened.fetch_add(1, Ordering::Relaxed);
            let source = std::net::SocketAddr::from(([127, 0, 0, 2 + (i % 4) as u8], 0));
            let Ok(sock) = TcpSocket::new_v4() else { break };
            if sock.bind(source).is_err() {
                break;
            }
            let Ok(Ok(mut s)) =
                tokio::time::timeout(Duration::from_secs(1), sock.connect(to)).await
            else {
                break;
            };
            // Half of them trickle a request head that never ends.
            if i.is_multiple_of(2) {
                let _ = s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n").await;
            }
            socks.push(s);
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    *c.lock().entry("idle sockets opened").or_default() += opened.load(Ordering::Relaxed);
}
