//! `exec-gateway-bench`: starts the gateway as a separate process and
//! measures each figure of the benchmark table (docs/benchmarks.md) next to its
//! baseline, in the same run, printing the ratio. With `--reference PATH`
//! the same client also measures `codex exec-server` (the reference) side
//! by side.
//!
//! Not a test: it asserts nothing and passes on any machine; it prints.
//! A separate binary so that nothing of it ships in the gateway.

use std::path::PathBuf;
use std::process::{ExitCode, Stdio};
use std::time::{Duration, Instant};

use futures_util::{SinkExt as _, StreamExt as _};
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt as _, AsyncReadExt as _, BufReader};
use tokio::net::TcpStream;
use tokio::process::{Child, Command};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

mod edges;
mod executors;
mod fleet;
mod images;
mod previews;
mod reliability;
mod snapshots;
mod soak;
mod tenants;

#[derive(Debug, clap::Parser)]
#[command(
    name = "exec-gateway-bench",
    about = "Measure exec-gateway against direct baselines"
)]
pub struct BenchArgs {
    /// The gateway binary (default: `exec-gateway` next to this one).
    #[arg(long)]
    pub gateway: Option<PathBuf>,
    /// Also measure the reference: path to the `codex` binary
    /// (run as `codex exec-server --listen ws://127.0.0.1:0`).
    #[arg(long)]
    pub reference: Option<PathBuf>,
    /// Iterations for latency figures.
    #[arg(long, default_value_t = 1000)]
    pub iterations: usize,
    /// Idle sessions for the memory figure.
    #[arg(long, default_value_t = 10_000)]
    pub sessions: usize,
    /// Bytes of output for the throughput figure.
    #[arg(long, default_value_t = 1 << 30)]
    pub output_bytes: u64,
    /// Seconds per spawns-per-second run.
    #[arg(long, default_value_t = 3)]
    pub seconds: u64,
    /// Run the soak instead of the figures: victims next to an abusive
    /// tenant and idle unauthenticated sockets for this long (e.g. `10m`).
    #[arg(long, value_parser = humantime::parse_duration)]
    pub soak: Option<Duration>,
    /// The soak's first phase, victims alone (their baseline).
    #[arg(long, value_parser = humantime::parse_duration, default_value = "2m")]
    pub soak_baseline: Duration,
    /// With `--soak`: the reliability soak instead (a mixed workload on both
    /// doors in several tenants, chaos on a schedule, every outcome
    /// classified; exits non-zero on any unexpected failure).
    #[arg(long)]
    pub reliability: bool,
    /// Reliability soak: 1 gateway, or 3 replicas behind HAProxy.
    #[arg(long, default_value_t = 1)]
    pub soak_replicas: usize,
    /// Reliability soak: the chaos to run, in turn (worker, cut, stall,
    /// replica, drain; default: all that apply).
    #[arg(long, value_delimiter = ',')]
    pub soak_chaos: Option<Vec<String>>,
    /// Reliability soak: time between two acts of chaos.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "15s")]
    pub soak_interval: Duration,
    /// Only the fleet figures (relayed vs owner).
    #[arg(long)]
    pub fleet_only: bool,
    /// Only the remote-executor figures (executor vs local worker).
    #[arg(long)]
    pub executors_only: bool,
    /// Only the production edges' cost: TLS, the audit trail, tracing,
    /// each on against off.
    #[arg(long)]
    pub edges_only: bool,
    /// Only the memory figure (RSS per idle session).
    #[arg(long)]
    pub memory_only: bool,
    /// Only the image figures (cold tenants with a cached image, the
    /// 100 MiB pull against skopeo, the store's size).
    #[arg(long)]
    pub images_only: bool,
    /// Only the snapshot figures (a 1 GiB workspace snapshotted against
    /// `tar | sha256sum`, forked into 8 sessions against `cp -a`, pushed
    /// to a local registry and restored on a second gateway against
    /// `skopeo copy`).
    #[arg(long)]
    pub snapshots_only: bool,
    /// Only the preview and port-forward figures (nginx inside a tenant
    /// through a path preview and `port-forward`, against the same nginx
    /// reached directly).
    #[arg(long)]
    pub previews_only: bool,
    /// Only the tenant-scale figures (start-up with many tenants, idle
    /// and cold tenants, many tenants with a live session).
    #[arg(long)]
    pub tenants_only: bool,
    /// Configured tenants for the start-up and idle-memory figures.
    #[arg(long, default_value_t = 10_000)]
    pub tenant_count: usize,
    /// Tenants holding one live session each.
    #[arg(long, default_value_t = 1000)]
    pub live_tenants: usize,
    /// Only a reliability count: this many `true` spawns over 8
    /// connections in a tenant with every isolation layer at its default
    /// (a root of its own), every failure counted by its error.
    #[arg(long)]
    pub spawns: Option<u64>,
    /// Print the figures as one JSON array (figure, ours, baseline, ratio,
    /// target, met, reference, and the leading numbers as `ours_value` and
    /// `baseline_value`) instead of the table, to compare commits.
    #[arg(long)]
    pub json: bool,
    /// Internal: the soak's abuser process.
    #[arg(long, hide = true)]
    pub soak_abuser: Option<String>,
}

type Ws = WebSocketStream<MaybeTlsStream<TcpStream>>;
type BenchResult<T> = Result<T, String>;

fn err(e: impl std::fmt::Display) -> String {
    e.to_string()
}

/// A server under test, started as a child process.
struct Server {
    child: Child,
    url: String,
    /// `http://HOST:PORT` when the server printed a `grpc://` second line.
    grpc: Option<String>,
    /// `HOST:PORT` of the admin listener, when started with one.
    admin: Option<String>,
}

impl Server {
    /// The gateway with every door on loopback (ws, gRPC, admin) and `config`.
    async fn gateway(exe: &std::path::Path, config: &str) -> BenchResult<Server> {
        Self::start(
            exe,
            &[
                "serve",
                "--admin-listen",
                "127.0.0.1:0",
                "--listen",
                "ws://127.0.0.1:0",
                "--grpc-listen",
                "127.0.0.1:0",
                "--config",
                config,
            ],
        )
        .await
    }

    async fn start(program: &std::path::Path, args: &[&str]) -> BenchResult<Server> {
        Self::start_logged(program, args, Stdio::null()).await
    }

    /// [`Server::start`] with the server's log (stderr) sent to `log`.
    async fn start_logged(
        program: &std::path::Path,
        args: &[&str],
        log: Stdio,
    ) -> BenchResult<Server> {
        let mut child = Command::new(program)
            .args(args)
            .stdout(Stdio::piped())
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", program.display()))?;
        let stdout = child.stdout.take().ok_or("no stdout")?;
        let mut reader = BufReader::new(stdout);
        let mut line = String::new();
        tokio::time::timeout(Duration::from_secs(20), reader.read_line(&mut line))
            .await
            .map_err(|_| format!("{} printed no URL", program.display()))?
            .map_err(err)?;
        if line.trim().is_empty() {
            return Err(format!(
                "{} exited without printing its URL (a refused configuration? run it by hand)",
                program.display()
            ));
        }
        let mut grpc = None;
        if args.contains(&"--grpc-listen") {
            let mut second = String::new();
            tokio::time::timeout(Duration::from_secs(20), reader.read_line(&mut second))
                .await
                .map_err(|_| "no gRPC URL printed".to_owned())?
                .map_err(err)?;
            grpc = Some(
                second
                    .trim()
                    .replace("grpcs://", "https://")
                    .replace("grpc://", "http://"),
            );
        }
        let mut admin = None;
        if args.contains(&"--admin-listen") {
            let mut third = String::new();
            tokio::time::timeout(Duration::from_secs(20), reader.read_line(&mut third))
                .await
                .map_err(|_| "no admin URL printed".to_owned())?
                .map_err(err)?;
            admin = Some(third.trim().trim_start_matches("admin http://").to_owned());
        }
        Ok(Server {
            child,
            url: line.trim().to_owned(),
            grpc,
            admin,
        })
    }

    fn rss_kib(&self) -> u64 {
        let Some(pid) = self.child.id() else { return 0 };
        std::fs::read_to_string(format!("/proc/{pid}/status"))
            .ok()
            .and_then(|s| {
                s.lines()
                    .find(|l| l.starts_with("VmRSS:"))
                    .and_then(|l| l.split_whitespace().nth(1))
                    .and_then(|v| v.parse().ok())
            })
            .unwrap_or(0)
    }
}

struct Conn {
    ws: Ws,
    next_id: i64,
    /// The session `initialize` returned.
    session_id: String,
    /// Working directory of the processes it starts.
    cwd: String,
}

impl Conn {
    async fn open(url: &str) -> BenchResult<Conn> {
        Self::open_in(url, "/tmp").await
    }

    async fn open_in(url: &str, cwd: &str) -> BenchResult<Conn> {
        Self::open_with(url, cwd, json!({"clientName": "bench"})).await
    }

    /// Resume session `sid` (retrying while its previous connection is
    /// still being closed).
    async fn resume(url: &str, sid: &str) -> BenchResult<Conn> {
        let mut last = String::new();
        for _ in 0..100 {
            match Self::open_with(
                url,
                "/tmp",
                json!({"clientName": "bench", "resumeSessionId": sid}),
            )
            .await
            {
                Ok(c) => return Ok(c),
                Err(e) if e.contains("already attached") => {
                    last = e;
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                Err(e) => return Err(e),
            }
        }
        Err(last)
    }

    async fn open_with(url: &str, cwd: &str, init: Value) -> BenchResult<Conn> {
        Self::open_from(url, cwd, init, None).await
    }

    /// [`Conn::open_with`] from the loopback address `source` (one address
    /// has about 28,000 ephemeral ports: more sessions need more sources).
    async fn open_from(
        url: &str,
        cwd: &str,
        init: Value,
        source: Option<std::net::IpAddr>,
    ) -> BenchResult<Conn> {
        let (ws, _) = match source {
            None => tokio_tungstenite::connect_async(url).await.map_err(err)?,
            Some(ip) => {
                let req =
                    tokio_tungstenite::tungstenite::client::IntoClientRequest::into_client_request(
                        url,
                    )
                    .map_err(err)?;
                let host = req.uri().host().ok_or("no host")?.to_owned();
                let port = req.uri().port_u16().ok_or("no port")?;
                let addr: std::net::SocketAddr = format!("{host}:{port}").parse().map_err(err)?;
                let socket = tokio::net::TcpSocket::new_v4().map_err(err)?;
                socket.bind((ip, 0).into()).map_err(err)?;
                let tcp = socket.connect(addr).await.map_err(err)?;
                // A small read buffer: tungstenite's default 128 KiB, zero
                // filled, would take 12.5 GiB for 100,000 connections.
                let config = tokio_tungstenite::tungstenite::protocol::WebSocketConfig::default()
                    .read_buffer_size(4096);
                tokio_tungstenite::client_async_with_config(
                    req,
                    MaybeTlsStream::Plain(tcp),
                    Some(config),
                )
                .await
                .map_err(err)?
            }
        };
        if let MaybeTlsStream::Plain(s) = ws.get_ref() {
            let _ = s.set_nodelay(true);
        }
        let mut c = Conn {
            ws,
            next_id: 1,
            session_id: String::new(),
            cwd: cwd.to_owned(),
        };
        let r = c.call("initialize", init).await?;
        c.session_id = r["sessionId"].as_str().unwrap_or_default().to_owned();
        c.ws.send(Message::text(r#"{"method":"initialized"}"#))
            .await
            .map_err(err)?;
        Ok(c)
    }

    async fn send(&mut self, method: &str, params: Value) -> BenchResult<i64> {
        let id = self.next_id;
        self.next_id += 1;
        let text = json!({"id": id, "method": method, "params": params}).to_string();
        self.ws.send(Message::text(text)).await.map_err(err)?;
        Ok(id)
    }

    async fn next_text(&mut self) -> BenchResult<String> {
        loop {
            match self.ws.next().await {
                Some(Ok(Message::Text(t))) => return Ok(t.as_str().to_owned()),
                Some(Ok(_)) => continue,
                Some(Err(e)) => return Err(err(e)),
                None => return Err("connection closed".to_owned()),
            }
        }
    }

    async fn call(&mut self, method: &str, params: Value) -> BenchResult<Value> {
        let id = self.send(method, params).await?;
        loop {
            let v: Value = serde_json::from_str(&self.next_text().await?).map_err(err)?;
            if v.get("id") == Some(&json!(id)) {
                return match v.get("result") {
                    Some(r) => Ok(r.clone()),
                    None => Err(format!("{method} failed: {v}")),
                };
            }
        }
    }

    /// Start `argv` and wait for its `process/closed`; returns output bytes.
    async fn run_to_close(&mut self, pid: &str, argv: &[&str]) -> BenchResult<u64> {
        let id = self
            .send(
                "process/start",
                json!({"processId": pid, "argv": argv, "cwd": self.cwd,
                       "env": {"PATH": "/usr/bin:/bin"}, "tty": false}),
            )
            .await?;
        #[derive(Deserialize)]
        struct Msg<'a> {
            #[serde(default)]
            id: Option<i64>,
            #[serde(default, borrow)]
            method: Option<&'a str>,
            #[serde(default, borrow)]
            params: Option<Params<'a>>,
            #[serde(default)]
            error: Option<Value>,
        }
        #[derive(Deserialize)]
        struct Params<'a> {
            #[serde(default, borrow, rename = "processId")]
            process_id: Option<&'a str>,
            #[serde(default, borrow)]
            chunk: Option<&'a str>,
        }
        let mut bytes = 0u64;
        let mut buf = Vec::new();
        loop {
            let text = self.next_text().await?;
            let m: Msg<'_> = serde_json::from_str(&text).map_err(err)?;
            if m.id == Some(id)
                && let Some(e) = m.error
            {
                return Err(format!("start failed: {e}"));
            }
            let Some(p) = m.params else { continue };
            if p.process_id != Some(pid) {
                continue;
            }
            match m.method {
                Some("process/output") => {
                    if let Some(chunk) = p.chunk {
                        buf.clear();
                        base64_simd::STANDARD
                            .decode_append(chunk, &mut buf)
                            .map_err(err)?;
                        bytes += buf.len() as u64;
                    }
                }
                Some("process/closed") => return Ok(bytes),
                _ => {}
            }
        }
    }
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let idx = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[idx.min(sorted.len() - 1)]
}

fn ms(d: Duration) -> String {
    format!("{:.3} ms", d.as_secs_f64() * 1e3)
}

async fn spawn_latency(url: &str, n: usize) -> BenchResult<(Duration, Duration)> {
    spawn_latency_in(url, n, "/tmp").await
}

async fn spawn_latency_in(url: &str, n: usize, cwd: &str) -> BenchResult<(Duration, Duration)> {
    let c = client(url).await?;
    let mut lat = Vec::with_capacity(n);
    for i in 0..n + 20 {
        let t = Instant::now();
        run_to_close(&c, &format!("t{i}"), &["true"], cwd).await?;
        if i >= 20 {
            lat.push(t.elapsed());
        }
    }
    lat.sort();
    Ok((percentile(&lat, 0.5), percentile(&lat, 0.99)))
}

/// A client of the gateway (or a reference server) at `url`, as users
/// connect: the crate's client library. The token rides in the URL.
async fn client(url: &str) -> BenchResult<exec_gateway::client::Client> {
    let token = url::Url::parse(url)
        .ok()
        .and_then(|u| {
            u.query_pairs()
                .find(|(k, _)| k == "access_token")
                .map(|(_, v)| v.into_owned())
        })
        .unwrap_or_default();
    exec_gateway::client::Client::connect(url, &token)
        .await
        .map_err(err)
}

/// Start `argv` in `cwd` and read its events to the close; output bytes.
async fn run_to_close(
    c: &exec_gateway::client::Client,
    pid: &str,
    argv: &[&str],
    cwd: &str,
) -> BenchResult<u64> {
    use exec_gateway::client::{Event, ProcessSpec};
    let mut spec = ProcessSpec::new(pid, argv.iter().copied());
    spec.cwd = cwd.to_owned();
    spec.env.insert("PATH".into(), "/usr/bin:/bin".into());
    let mut events = c.exec(&spec).await.map_err(err)?;
    let mut bytes = 0u64;
    while let Some(e) = events.next().await.map_err(err)? {
        if let Event::Output { data, .. } = e {
            bytes += data.len() as u64;
        }
    }
    Ok(bytes)
}

async fn direct_spawn_latency(n: usize) -> BenchResult<(Duration, Duration)> {
    let mut lat = Vec::with_capacity(n);
    for i in 0..n + 20 {
        let t = Instant::now();
        Command::new("true").status().await.map_err(err)?;
        if i >= 20 {
            lat.push(t.elapsed());
        }
    }
    lat.sort();
    Ok((percentile(&lat, 0.5), percentile(&lat, 0.99)))
}

async fn spawns_per_second(url: &str, conns: usize, secs: u64) -> BenchResult<f64> {
    let deadline = Instant::now() + Duration::from_secs(secs);
    let mut tasks = Vec::new();
    for c in 0..conns {
        let url = url.to_owned();
        tasks.push(exec_gateway::task::start("bench-spawner", async move {
            let conn = client(&url).await?;
            let mut n = 0u64;
            while Instant::now() < deadline {
                run_to_close(&conn, &format!("c{c}-{n}"), &["true"], "/tmp").await?;
                n += 1;
            }
            Ok::<u64, String>(n)
        }));
    }
    let start = Instant::now();
    let mut total = 0;
    for t in tasks {
        total += t.await.map_err(err)??;
    }
    Ok(total as f64 / start.elapsed().as_secs_f64())
}

/// `total` `true` spawns over `conns` connections, none stopping at a
/// failure: prints how many succeeded, and each failure by its error.
async fn spawn_reliability(url: &str, cwd: &str, conns: u64, total: u64) -> BenchResult<()> {
    let start = Instant::now();
    let mut tasks = Vec::new();
    for c in 0..conns {
        let (url, cwd) = (url.to_owned(), cwd.to_owned());
        let share = total / conns + u64::from(c < total % conns);
        tasks.push(exec_gateway::task::start("bench-reliability", async move {
            let conn = client(&url).await?;
            let mut failures = std::collections::BTreeMap::<String, u64>::new();
            for n in 0..share {
                if let Err(e) = run_to_close(&conn, &format!("r{c}-{n}"), &["true"], &cwd).await {
                    *failures.entry(e).or_default() += 1;
                }
            }
            Ok::<_, String>((share, failures))
        }));
    }
    let (mut ran, mut failures) = (0u64, std::collections::BTreeMap::<String, u64>::new());
    for t in tasks {
        let (n, f) = t.await.map_err(err)??;
        ran += n;
        for (e, k) in f {
            *failures.entry(e).or_default() += k;
        }
    }
    let failed: u64 = failures.values().sum();
    println!(
        "{ran} `true` spawns over {conns} connections in {:.1} s: {} succeeded, {failed} failed",
        start.elapsed().as_secs_f64(),
        ran - failed
    );
    for (e, k) in &failures {
        println!("  {k} × {e}");
    }
    if failed > 0 {
        return Err(format!("{failed} spawns failed"));
    }
    Ok(())
}

async fn direct_spawns_per_second(conns: usize, secs: u64) -> BenchResult<f64> {
    let deadline = Instant::now() + Duration::from_secs(secs);
    let start = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..conns {
        tasks.push(exec_gateway::task::start(
            "bench-direct-spawner",
            async move {
                let mut n = 0u64;
                while Instant::now() < deadline {
                    Command::new("true").status().await.map_err(err)?;
                    n += 1;
                }
                Ok::<u64, String>(n)
            },
        ));
    }
    let mut total = 0;
    for t in tasks {
        total += t.await.map_err(err)??;
    }
    Ok(total as f64 / start.elapsed().as_secs_f64())
}

async fn throughput(url: &str, bytes: u64) -> BenchResult<f64> {
    let c = client(url).await?;
    let count = bytes.to_string();
    let t = Instant::now();
    let got = run_to_close(&c, "big", &["head", "-c", &count, "/dev/zero"], "/tmp").await?;
    let secs = t.elapsed().as_secs_f64();
    if got != bytes {
        return Err(format!("received {got} of {bytes} bytes"));
    }
    Ok(bytes as f64 / secs / 1e6)
}

/// Output of `head -c bytes /dev/zero` read by a client that parses every
/// frame into a `Value` and decodes every chunk (as Codex's client does).
async fn parsing_throughput(url: &str, bytes: u64) -> BenchResult<f64> {
    let mut c = Conn::open(url).await?;
    let t = Instant::now();
    let cwd = c.cwd.clone();
    c.send(
        "process/start",
        json!({"processId": "bigp", "argv": ["head", "-c", bytes.to_string(), "/dev/zero"],
               "cwd": cwd, "env": {"PATH": "/usr/bin:/bin"}, "tty": false}),
    )
    .await?;
    let mut got = 0u64;
    loop {
        let v: Value = serde_json::from_str(&c.next_text().await?).map_err(err)?;
        match v["method"].as_str() {
            Some("process/output") => {
                got += scalar_b64(v["params"]["chunk"].as_str().unwrap_or_default())?.len() as u64;
            }
            Some("process/closed") => break,
            _ if v.get("error").is_some() => return Err(format!("start failed: {v}")),
            _ => {}
        }
    }
    let secs = t.elapsed().as_secs_f64();
    if got != bytes {
        return Err(format!("received {got} of {bytes} bytes"));
    }
    Ok(bytes as f64 / secs / 1e6)
}

/// The parsing client's own ceiling: `process/output` frames as the gateway
/// encodes them (256 KiB chunks), parsed into `serde_json::Value` and
/// decoded with the scalar `base64` crate, from memory, on this thread.
fn parsing_client_ceiling(bytes: u64) -> BenchResult<f64> {
    use exec_gateway::protocol::notify::{json_string, process_output};
    use exec_gateway::protocol::process::StreamName;
    let chunk = vec![0u8; exec_gateway::process::OUTPUT_READ_CHUNK_BYTES];
    let id = json_string("bigp");
    let frames: Vec<String> = (1..=8)
        .map(|seq| process_output(&id, seq, StreamName::Stdout, &chunk))
        .collect();
    let t = Instant::now();
    let mut got = 0u64;
    let mut i = 0;
    while got < bytes {
        let v: Value = serde_json::from_str(&frames[i % frames.len()]).map_err(err)?;
        got += scalar_b64(v["params"]["chunk"].as_str().unwrap_or_default())?.len() as u64;
        i += 1;
    }
    Ok(got as f64 / t.elapsed().as_secs_f64() / 1e6)
}

/// The parsing client's own share of `fs/readFile` 1 MiB: the reply's
/// JSON parsed into a `Value` and its data decoded, from memory.
fn parsing_reply_p50(n: usize) -> BenchResult<Duration> {
    let data: Vec<u8> = (0..1024 * 1024u32).map(|i| (i % 251) as u8).collect();
    let reply = json!({"id": 1, "result": {
        "dataBase64": base64_simd::STANDARD.encode_to_string(&data)}})
    .to_string();
    let mut lat = Vec::with_capacity(n);
    for i in 0..n + 10 {
        let t = Instant::now();
        let v: Value = serde_json::from_str(&reply).map_err(err)?;
        let back = scalar_b64(v["result"]["dataBase64"].as_str().unwrap_or_default())?;
        if back.len() != data.len() {
            return Err("readFile reply did not round-trip".to_owned());
        }
        if i >= 10 {
            lat.push(t.elapsed());
        }
    }
    lat.sort();
    Ok(percentile(&lat, 0.5))
}

async fn direct_throughput(bytes: u64) -> BenchResult<f64> {
    let t = Instant::now();
    let mut child = Command::new("head")
        .args(["-c", &bytes.to_string(), "/dev/zero"])
        .stdout(Stdio::piped())
        .spawn()
        .map_err(err)?;
    let mut out = child.stdout.take().ok_or("no stdout")?;
    // As strong as we can make it: the same pipe size and read size the gateway uses.
    exec_gateway::spawn::grow_pipe(&out);
    let mut buf = vec![0u8; exec_gateway::process::OUTPUT_READ_CHUNK_BYTES];
    let mut got = 0u64;
    loop {
        let n = out.read(&mut buf).await.map_err(err)?;
        if n == 0 {
            break;
        }
        got += n as u64;
    }
    child.wait().await.map_err(err)?;
    if got != bytes {
        return Err(format!("read {got} of {bytes}"));
    }
    Ok(bytes as f64 / t.elapsed().as_secs_f64() / 1e6)
}

async fn idle_session_rss(server: &Server, n: usize) -> BenchResult<f64> {
    // Warm up allocator and runtime with a few sessions first.
    let warm: Vec<Conn> =
        futures_util::future::try_join_all((0..16).map(|_| Conn::open(&server.url))).await?;
    drop(warm);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let before = server.rss_kib();
    let mut conns = Vec::with_capacity(n);
    let batch = 200;
    let mut opened = 0;
    // Up to 20,000 connections per loopback source address.
    let source = |i: usize| -> Option<std::net::IpAddr> {
        (n > 20_000).then(|| std::net::Ipv4Addr::new(127, 0, 0, 1 + (i / 20_000) as u8).into())
    };
    while opened < n {
        let k = batch.min(n - opened);
        let more = futures_util::future::try_join_all((opened..opened + k).map(|i| {
            Conn::open_from(
                &server.url,
                "/tmp",
                json!({"clientName": "bench"}),
                source(i),
            )
        }))
        .await?;
        conns.extend(more);
        opened += k;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let after = server.rss_kib();
    drop(conns);
    Ok(after.saturating_sub(before) as f64 / n as f64)
}

/// The gateway's (and the reference's) resident memory per idle session.
async fn memory_row(gw: &Server, reference: Option<&Server>, sessions: usize) -> BenchResult<Row> {
    let ours = idle_session_rss(gw, sessions).await?;
    let r = match reference {
        Some(r) => format!("{:.1} KiB", idle_session_rss(r, sessions).await?),
        None => String::new(),
    };
    Ok(Row {
        figure: "gateway RSS per idle session",
        ours: format!("{ours:.1} KiB"),
        baseline: format!("{sessions} sessions"),
        ratio: String::new(),
        target: "≤ 8 KiB",
        met: Some(ours <= 8.0),
        reference: r,
    })
}

/// How a benchmark client consumes what the gateway sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Consume {
    /// Borrowed fields only, base64 left undecoded (or SIMD-decoded).
    Lean,
    /// As Codex's client does: every frame parsed into a
    /// `serde_json::Value`, every chunk decoded with the `base64` crate.
    Parsing,
}

/// Decode with the scalar `base64` crate, as Codex's client does.
fn scalar_b64(s: &str) -> BenchResult<Vec<u8>> {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD
        .decode(s)
        .map_err(err)
}

async fn read_file_p50(url: &str, path: &str, n: usize, consume: Consume) -> BenchResult<Duration> {
    let mut c = Conn::open(url).await?;
    let mut lat = Vec::with_capacity(n);
    for i in 0..n + 10 {
        let t = Instant::now();
        let id = c.send("fs/readFile", json!({"path": path})).await?;
        let text = c.next_text().await?;
        if consume == Consume::Parsing {
            let v: Value = serde_json::from_str(&text).map_err(err)?;
            let data = scalar_b64(v["result"]["dataBase64"].as_str().unwrap_or_default())?;
            if v["id"] != json!(id) || data.len() != 1024 * 1024 {
                return Err("unexpected readFile response".to_owned());
            }
            if i >= 10 {
                lat.push(t.elapsed());
            }
            continue;
        }
        #[derive(Deserialize)]
        struct Resp<'a> {
            id: i64,
            #[serde(borrow)]
            result: ReadFile<'a>,
        }
        #[derive(Deserialize)]
        struct ReadFile<'a> {
            #[serde(borrow, rename = "dataBase64")]
            data_base64: &'a str,
        }
        let r: Resp<'_> = serde_json::from_str(&text).map_err(err)?;
        if r.id != id || r.result.data_base64.len() < 1024 * 1024 {
            return Err("unexpected readFile response".to_owned());
        }
        if i >= 10 {
            lat.push(t.elapsed());
        }
    }
    lat.sort();
    Ok(percentile(&lat, 0.5))
}

/// Direct read + base64, with the scalar `base64` crate (the baseline the
/// target was set against) or with the SIMD codec the gateway uses.
fn direct_read_file_p50(path: &str, n: usize, simd: bool) -> BenchResult<Duration> {
    use base64::Engine as _;
    let mut lat = Vec::with_capacity(n);
    for i in 0..n + 10 {
        let t = Instant::now();
        let data = std::fs::read(path).map_err(err)?;
        let s = if simd {
            base64_simd::STANDARD.encode_to_string(&data)
        } else {
            base64::engine::general_purpose::STANDARD.encode(&data)
        };
        std::hint::black_box(s);
        if i >= 10 {
            lat.push(t.elapsed());
        }
    }
    lat.sort();
    Ok(percentile(&lat, 0.5))
}

/// An HS256 token for `tenant` with every scope, as the gateway's own
/// `token` command mints it.
fn all_scopes_token(
    secret: &str,
    settings: &exec_gateway::config::Settings,
    tenant: &str,
    ttl: Duration,
    subject: &str,
) -> BenchResult<String> {
    exec_gateway::auth::mint(
        jsonwebtoken::Algorithm::HS256,
        secret.as_bytes(),
        &settings.auth,
        tenant,
        &[
            "exec".to_owned(),
            "fs:read".to_owned(),
            "fs:write".to_owned(),
        ],
        ttl,
        subject,
    )
}

fn raise_fd_limit() {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    if let Ok((_, hard)) = getrlimit(Resource::RLIMIT_NOFILE) {
        let want = hard.min(1 << 20);
        let _ = setrlimit(Resource::RLIMIT_NOFILE, want, want);
    }
}

struct Row {
    figure: &'static str,
    ours: String,
    baseline: String,
    ratio: String,
    target: &'static str,
    met: Option<bool>,
    reference: String,
}

impl Row {
    /// A figure printed next to its baseline, with no target.
    fn reported(figure: &'static str, ours: String, baseline: String, ratio: String) -> Row {
        Row {
            figure,
            ours,
            baseline,
            ratio,
            target: "(reported)",
            met: None,
            reference: String::new(),
        }
    }
}

/// The leading number of a figure ("1.743 ms" → 1.743, "1,219 MB/s" →
/// 1219).
fn leading_number(s: &str) -> Option<f64> {
    let n: String = s
        .trim_start_matches(['+', ' '])
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == '.' || *c == ',' || *c == '-')
        .filter(|c| *c != ',')
        .collect();
    n.parse().ok()
}

/// The figures, as a table or (`--json`) one JSON array.
fn report(rows: &[Row], with_ref: bool, as_json: bool) {
    if !as_json {
        print_rows(rows, with_ref);
        return;
    }
    let out: Vec<Value> = rows
        .iter()
        .map(|r| {
            json!({
                "figure": r.figure, "ours": r.ours, "baseline": r.baseline,
                "ratio": r.ratio, "target": r.target, "met": r.met,
                "reference": (!r.reference.is_empty()).then_some(&r.reference),
                "ours_value": leading_number(&r.ours),
                "baseline_value": leading_number(&r.baseline),
            })
        })
        .collect();
    println!("{}", Value::Array(out));
}

fn print_rows(rows: &[Row], with_ref: bool) {
    println!(
        "{:<44} {:>16} {:>22} {:>8} {:<28} {:>4}{}",
        "figure",
        "exec-gateway",
        "baseline",
        "ratio",
        "target",
        "met",
        if with_ref {
            "   reference (codex 0.130.0)"
        } else {
            ""
        }
    );
    for r in rows {
        let met = match r.met {
            Some(true) => "yes",
            Some(false) => "NO",
            None => "-",
        };
        println!(
            "{:<44} {:>16} {:>22} {:>8} {:<28} {:>4}{}",
            r.figure,
            r.ours,
            r.baseline,
            r.ratio,
            r.target,
            met,
            if with_ref {
                format!("   {}", r.reference)
            } else {
                String::new()
            }
        );
    }
}

fn main() -> ExitCode {
    use clap::Parser as _;
    let args = BenchArgs::parse();
    exec_gateway::telemetry::init(exec_gateway::telemetry::LogFormat::Text);
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("bench failed: no runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(bench(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bench failed: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn bench(args: BenchArgs) -> BenchResult<()> {
    raise_fd_limit();
    if let Some(spec) = &args.soak_abuser {
        return soak::abuser_main(spec).await;
    }
    let exe = match &args.gateway {
        Some(p) => p.clone(),
        None => std::env::current_exe()
            .map_err(err)?
            .with_file_name("exec-gateway"),
    };
    let dir = tempfile_dir()?;
    if let (Some(duration), true) = (args.soak, args.reliability) {
        let chaos = match &args.soak_chaos {
            Some(list) => list
                .iter()
                .filter(|s| !s.is_empty())
                .map(|s| reliability::Chaos::parse(s))
                .collect::<BenchResult<Vec<_>>>()?,
            None if args.soak_replicas > 1 => ["worker", "cut", "stall", "replica", "drain"]
                .iter()
                .map(|s| reliability::Chaos::parse(s))
                .collect::<BenchResult<Vec<_>>>()?,
            None => ["worker", "cut", "stall"]
                .iter()
                .map(|s| reliability::Chaos::parse(s))
                .collect::<BenchResult<Vec<_>>>()?,
        };
        let result = reliability::run(
            &exe,
            &dir,
            reliability::ReliabilityArgs {
                duration,
                baseline: args.soak_baseline,
                replicas: args.soak_replicas,
                chaos,
                interval: args.soak_interval,
                json: args.json,
            },
        )
        .await;
        let _ = std::fs::remove_dir_all(&dir);
        return result;
    }
    if let Some(duration) = args.soak {
        return soak::soak(
            &exe,
            &dir,
            soak::SoakArgs {
                duration,
                baseline: args.soak_baseline,
            },
        )
        .await;
    }
    let config = dir.join("bench.toml");
    // A confined tenant (root under /tmp): what namespaces cost.
    let jail = dir.join("jail");
    std::fs::create_dir_all(&jail).map_err(err)?;
    let key = dir.join("hs256.key");
    let secret: String = (0..64)
        .map(|i| char::from(b'a' + (i * 7 % 26) as u8))
        .collect();
    std::fs::write(&key, &secret).map_err(err)?;
    // `bench` is unthrottled (the figures measure the gateway, not a quota);
    // `flood` keeps the default per-tenant limits (the protection measured
    // by the fairness figure); `victim` is unthrottled like `bench`.
    std::fs::write(
        &config,
        format!(
            "[server]\nmax_connections = {0}\nmax_sessions = {0}\n\
             max_unauthenticated = 2048\nmax_unauthenticated_per_source = 2048\n\
             [exec]\nmax_processes = 1024\n\
             [[auth.keys]]\nalgorithm = \"HS256\"\nsecret_file = \"{1}\"\n\
             [tenants.bench]\nroot = \"/\"\nmax_sessions = {0}\nmax_connections = {0}\nmax_processes = 1024\n\
             requests_per_second = 1000000\nburst = 1000000\nmax_in_flight = 4096\n\
             [tenants.flood]\nroot = \"/\"\n\
             [tenants.victim]\nroot = \"/\"\nrequests_per_second = 1000000\nburst = 1000000\n\
             [tenants.jail]\nroot = \"{2}\"\nrequests_per_second = 1000000\nburst = 1000000\n",
            args.sessions + 1024,
            key.display(),
            jail.display()
        ),
    )
    .map_err(err)?;
    let file = dir.join("1mib.bin");
    let data: Vec<u8> = (0..1024 * 1024u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    std::fs::write(&file, &data).map_err(err)?;
    let file = file.display().to_string();
    let config_s = config.display().to_string();
    let settings = exec_gateway::config::Config::load(&config)
        .and_then(exec_gateway::config::Config::validate)
        .map_err(err)?;
    let token = |tenant: &str| {
        all_scopes_token(
            &secret,
            &settings,
            tenant,
            Duration::from_secs(3600),
            "bench",
        )
    };
    let (bench_token, flood_token, victim_token, jail_token) = (
        token("bench")?,
        token("flood")?,
        token("victim")?,
        token("jail")?,
    );

    let fleet_rows = || {
        fleet::figures(
            &exe,
            &dir,
            &config_s,
            &bench_token,
            args.iterations,
            args.output_bytes,
        )
    };
    let executor_rows = || {
        executors::figures(
            &exe,
            &dir,
            &config_s,
            &secret,
            &bench_token,
            args.iterations,
            args.output_bytes,
        )
    };
    let edge_rows = || {
        edges::figures(
            &exe,
            &dir,
            &config_s,
            &bench_token,
            args.iterations,
            args.output_bytes,
        )
    };
    if args.edges_only {
        let rows = edge_rows().await?;
        report(&rows, false, args.json);
        let _ = std::fs::remove_dir_all(&dir);
        return Ok(());
    }
    if args.executors_only {
        let rows = executor_rows().await?;
        report(&rows, false, args.json);
        let _ = std::fs::remove_dir_all(&dir);
        return Ok(());
    }
    if args.snapshots_only {
        let rows = snapshots::figures(&exe, &dir, &secret).await?;
        report(&rows, false, args.json);
        let _ = std::fs::remove_dir_all(&dir);
        return Ok(());
    }
    if args.previews_only {
        let rows = previews::figures(&exe, &dir, &secret).await?;
        report(&rows, false, args.json);
        let _ = std::fs::remove_dir_all(&dir);
        return Ok(());
    }
    if args.images_only {
        let rows = images::figures(&exe, &dir, &secret).await?;
        report(&rows, false, args.json);
        let _ = std::fs::remove_dir_all(&dir);
        return Ok(());
    }
    if args.tenants_only {
        let rows =
            tenants::figures(&exe, &dir, &secret, args.tenant_count, args.live_tenants).await?;
        report(&rows, false, args.json);
        let _ = std::fs::remove_dir_all(&dir);
        return Ok(());
    }
    if args.fleet_only {
        let rows = fleet_rows().await?;
        report(&rows, false, args.json);
        let _ = std::fs::remove_dir_all(&dir);
        return Ok(());
    }
    let mut gw = Server::gateway(&exe, &config_s).await?;
    // The reference client can only be given a URL: the token rides in the
    // query, which the reference ignores.
    let base_url = gw.url.clone();
    gw.url = format!("{base_url}/?access_token={bench_token}");
    let reference = match &args.reference {
        Some(p) => Some(Server::start(p, &["exec-server", "--listen", "ws://127.0.0.1:0"]).await?),
        None => None,
    };
    if let Some(total) = args.spawns {
        let jail_url = format!("{base_url}/?access_token={jail_token}");
        let cwd = jail.display().to_string();
        return spawn_reliability(&jail_url, &cwd, 8, total).await;
    }
    if args.memory_only {
        let rows = [memory_row(&gw, reference.as_ref(), args.sessions).await?];
        report(&rows, reference.is_some(), args.json);
        let _ = std::fs::remove_dir_all(&dir);
        return Ok(());
    }
    let host = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_owned())
        })
        .unwrap_or_default();
    eprintln!(
        "exec-gateway bench: {} cores, {host}, iterations {}, sessions {}, output {} bytes",
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1),
        args.iterations,
        args.sessions,
        args.output_bytes
    );
    let n = args.iterations;
    let ref_n = (n / 5).max(20);
    let mut rows = Vec::new();

    // 1. `true` start → closed.
    let (d50, d99) = direct_spawn_latency(n).await?;
    let (g50, g99) = spawn_latency(&gw.url, n).await?;
    let r = match &reference {
        Some(r) => {
            let (a, b) = spawn_latency(&r.url, ref_n).await?;
            format!("p50 {} p99 {}", ms(a), ms(b))
        }
        None => String::new(),
    };
    let ratio50 = g50.as_secs_f64() / d50.as_secs_f64();
    rows.push(Row {
        figure: "`true` start→closed over ws, p50",
        ours: ms(g50),
        baseline: format!("{} direct", ms(d50)),
        ratio: format!("{ratio50:.2}x"),
        target: "≤ 1.2x direct",
        met: Some(ratio50 <= 1.2),
        reference: r,
    });
    rows.push(Row::reported(
        "`true` start→closed over ws, p99",
        ms(g99),
        format!("{} direct", ms(d99)),
        format!("{:.2}x", g99.as_secs_f64() / d99.as_secs_f64()),
    ));

    // 2. spawns per second over 8 connections.
    let direct = direct_spawns_per_second(8, args.seconds).await?;
    let ours = spawns_per_second(&gw.url, 8, args.seconds).await?;
    let r = match &reference {
        Some(r) => format!("{:.0}/s", spawns_per_second(&r.url, 8, args.seconds).await?),
        None => String::new(),
    };
    rows.push(Row {
        figure: "spawns/s, 8 connections",
        ours: format!("{ours:.0}/s"),
        baseline: format!("{direct:.0}/s direct"),
        ratio: format!("{:.0}%", ours / direct * 100.0),
        target: "≥ 70% of direct",
        met: Some(ours / direct >= 0.7),
        reference: r,
    });

    // 2b. what isolation costs: the same two figures on a gateway with the
    // isolation layers off, next to the default (layers as probed).
    let plain_config = dir.join("bench-plain.toml");
    let plain_toml = std::fs::read_to_string(&config).map_err(err)?
        + if nix::unistd::geteuid().is_root() {
            // As root the uid layer cannot be off (tenants would run as root).
            "[isolation]\ncgroups = \"off\"\nlandlock = \"off\"\nseccomp = \"off\"\nnamespaces = \"off\"\nnetwork = \"off\"\n"
        } else {
            "[isolation]\ncgroups = \"off\"\nlandlock = \"off\"\nseccomp = \"off\"\nnamespaces = \"off\"\nnetwork = \"off\"\nuid = \"off\"\n"
        };
    std::fs::write(&plain_config, plain_toml).map_err(err)?;
    let plain_config_s = plain_config.display().to_string();
    let mut plain = Server::gateway(&exe, &plain_config_s).await?;
    let plain_grpc = match &plain.grpc {
        Some(g) => Some(grpc_spawn_latency(g, &bench_token, n).await?),
        None => None,
    };
    // The same layers with the processes spawned by the gateway itself
    // (no workers): what the worker design buys.
    let inproc_config = dir.join("bench-inproc.toml");
    std::fs::write(
        &inproc_config,
        std::fs::read_to_string(&config).map_err(err)? + "[isolation]\nworkers = \"off\"\n",
    )
    .map_err(err)?;
    let inproc_config_s = inproc_config.display().to_string();
    let mut inproc = Server::start(
        &exe,
        &[
            "serve",
            "--admin-listen",
            "127.0.0.1:0",
            "--listen",
            "ws://127.0.0.1:0",
            "--config",
            &inproc_config_s,
        ],
    )
    .await?;
    inproc.url = format!("{}/?access_token={bench_token}", inproc.url);
    let (i50, _) = spawn_latency(&inproc.url, n).await?;
    let inproc_rate = spawns_per_second(&inproc.url, 8, args.seconds).await?;
    drop(inproc);
    plain.url = format!("{}/?access_token={bench_token}", plain.url);
    let (p50, p99) = spawn_latency(&plain.url, n).await?;
    let plain_rate = spawns_per_second(&plain.url, 8, args.seconds).await?;
    drop(plain);
    // 2c. what namespaces cost a confined tenant: entered once per worker,
    // or (workers off) by every child.
    let mut ns_p50 = Vec::new();
    for (workers, namespaces) in [("on", "on"), ("on", "off"), ("off", "on"), ("off", "off")] {
        let path = dir.join(format!("bench-ns-{workers}-{namespaces}.toml"));
        let policy = |on: &str| if on == "on" { "optional" } else { "off" };
        std::fs::write(
            &path,
            std::fs::read_to_string(&config).map_err(err)?
                + &format!(
                    "[isolation]\nworkers = \"{}\"\nnamespaces = \"{}\"\nnetwork = \"{}\"\n",
                    policy(workers),
                    policy(namespaces),
                    policy(namespaces)
                ),
        )
        .map_err(err)?;
        let path_s = path.display().to_string();
        let mut s = Server::start(
            &exe,
            &["serve", "--listen", "ws://127.0.0.1:0", "--config", &path_s],
        )
        .await?;
        s.url = format!("{}/?access_token={jail_token}", s.url);
        let (p50, _) = spawn_latency_in(&s.url, n, &jail.display().to_string()).await?;
        ns_p50.push(p50);
        drop(s);
    }
    let layers = readyz(&gw).await.unwrap_or_default();
    eprintln!(
        "isolation of the measured gateway: {}",
        layers.trim().replace('\n', "; ")
    );
    rows.push(Row::reported(
        "isolation cost: `true` p50 (layers on/off)",
        ms(g50),
        format!("{} no layers", ms(p50)),
        format!("+{:.0} µs", (g50.as_secs_f64() - p50.as_secs_f64()) * 1e6),
    ));
    rows.push(Row::reported(
        "isolation cost: `true` p99 (layers on/off)",
        ms(g99),
        format!("{} no layers", ms(p99)),
        format!("{:.2}x", g99.as_secs_f64() / p99.as_secs_f64()),
    ));
    rows.push(Row::reported(
        "through a worker vs in the gateway: p50",
        ms(g50),
        format!("{} in gateway", ms(i50)),
        format!("{:+.0} µs", (g50.as_secs_f64() - i50.as_secs_f64()) * 1e6),
    ));
    rows.push(Row::reported(
        "through a worker vs in the gateway: spawns/s",
        format!("{ours:.0}/s"),
        format!("{inproc_rate:.0}/s in gateway"),
        format!("{:.0}%", ours / inproc_rate * 100.0),
    ));
    rows.push(Row::reported(
        "isolation cost: spawns/s (layers on/off)",
        format!("{ours:.0}/s"),
        format!("{plain_rate:.0}/s no layers"),
        format!("{:.0}%", ours / plain_rate * 100.0),
    ));
    let delta =
        |a: Duration, b: Duration| format!("{:+.0} µs", (a.as_secs_f64() - b.as_secs_f64()) * 1e6);
    rows.push(Row::reported(
        "namespaces cost: confined `true` p50, workers",
        ms(ns_p50[0]),
        format!("{} without", ms(ns_p50[1])),
        delta(ns_p50[0], ns_p50[1]),
    ));
    rows.push(Row::reported(
        "namespaces cost: confined `true` p50, no workers",
        ms(ns_p50[2]),
        format!("{} without", ms(ns_p50[3])),
        delta(ns_p50[2], ns_p50[3]),
    ));

    // 2d. what the tenant's own network costs: the same tenant with its
    // namespace and pasta (the default) and with the layer off, back to
    // back (spawns join the namespace the worker entered once).
    {
        let path = dir.join("bench-net-off.toml");
        std::fs::write(
            &path,
            std::fs::read_to_string(&config).map_err(err)? + "[isolation]\nnetwork = \"off\"\n",
        )
        .map_err(err)?;
        let path_s = path.display().to_string();
        let mut off = Server::start(
            &exe,
            &["serve", "--listen", "ws://127.0.0.1:0", "--config", &path_s],
        )
        .await?;
        off.url = format!("{}/?access_token={bench_token}", off.url);
        let (on50, _) = spawn_latency(&gw.url, n).await?;
        let (off50, _) = spawn_latency(&off.url, n).await?;
        let on_rate = spawns_per_second(&gw.url, 8, args.seconds).await?;
        let off_rate = spawns_per_second(&off.url, 8, args.seconds).await?;
        let (mut on_tp, mut off_tp) = (0f64, 0f64);
        for _ in 0..2 {
            on_tp = on_tp.max(throughput(&gw.url, args.output_bytes).await?);
            off_tp = off_tp.max(throughput(&off.url, args.output_bytes).await?);
        }
        drop(off);
        rows.push(Row::reported(
            "network namespace cost: `true` p50 (own/host)",
            ms(on50),
            format!("{} host network", ms(off50)),
            delta(on50, off50),
        ));
        rows.push(Row::reported(
            "network namespace cost: spawns/s (own/host)",
            format!("{on_rate:.0}/s"),
            format!("{off_rate:.0}/s host network"),
            format!("{:.0}%", on_rate / off_rate * 100.0),
        ));
        rows.push(Row::reported(
            "network namespace cost: output, best of 2",
            format!("{on_tp:.0} MB/s"),
            format!("{off_tp:.0} MB/s host network"),
            format!("{:.0}%", on_tp / off_tp * 100.0),
        ));
    }

    // 3. output throughput: best of 3 for each side, since one run on a
    // shared 2-core VM varies by ±30%.
    let mut direct = 0f64;
    let mut ours = 0f64;
    for _ in 0..3 {
        direct = direct.max(direct_throughput(args.output_bytes).await?);
        ours = ours.max(throughput(&gw.url, args.output_bytes).await?);
    }
    let r = match &reference {
        Some(r) => format!("{:.0} MB/s", throughput(&r.url, args.output_bytes).await?),
        None => String::new(),
    };
    rows.push(Row {
        figure: "output over ws, best of 3",
        ours: format!("{ours:.0} MB/s"),
        baseline: format!("{direct:.0} MB/s pipe"),
        ratio: format!("{:.0}%", ours / direct * 100.0),
        target: "(reported)",
        met: None,
        reference: r,
    });
    let mut parsing = 0f64;
    for _ in 0..3 {
        parsing = parsing.max(parsing_throughput(&gw.url, args.output_bytes).await?);
    }
    let r = match &reference {
        Some(r) => format!(
            "{:.0} MB/s",
            parsing_throughput(&r.url, args.output_bytes).await?
        ),
        None => String::new(),
    };
    rows.push(Row {
        figure: "output over ws, parsing client, best of 3",
        ours: format!("{parsing:.0} MB/s"),
        baseline: format!("{direct:.0} MB/s pipe"),
        ratio: format!("{:.0}%", parsing / direct * 100.0),
        target: "≥ 50% of the direct pipe",
        met: Some(parsing / direct >= 0.5),
        reference: r,
    });
    // What bounds the row above: the parsing client alone, on one core,
    // consuming frames the gateway would send (256 KiB chunks) from memory:
    // no gateway, no socket, no child process.
    let ceiling = parsing_client_ceiling(1 << 30)?;
    rows.push(Row::reported(
        "parsing client alone: output frames from memory",
        format!("{ceiling:.0} MB/s"),
        format!("{direct:.0} MB/s pipe"),
        format!("{:.0}%", ceiling / direct * 100.0),
    ));

    // 3b. the same over gRPC (raw bytes: no base64, no JSON).
    if let Some(grpc) = &gw.grpc {
        let mut ours = 0f64;
        for _ in 0..3 {
            ours = ours.max(grpc_throughput(grpc, &bench_token, args.output_bytes).await?);
        }
        rows.push(Row {
            figure: "output over gRPC Exec, best of 3",
            ours: format!("{ours:.0} MB/s"),
            baseline: format!("{direct:.0} MB/s pipe"),
            ratio: format!("{:.0}%", ours / direct * 100.0),
            target: "≥ 70% of the direct pipe",
            met: Some(ours / direct >= 0.7),
            reference: String::new(),
        });
        let (p50, p99) = grpc_spawn_latency(grpc, &bench_token, n).await?;
        rows.push(Row::reported(
            "`true` start→closed over gRPC Exec, p50",
            ms(p50),
            format!("{} direct", ms(d50)),
            format!("{:.2}x", p50.as_secs_f64() / d50.as_secs_f64()),
        ));
        if let Some((q50, _)) = plain_grpc {
            rows.push(Row::reported(
                "isolation cost: gRPC Exec `true` p50",
                ms(p50),
                format!("{} no layers", ms(q50)),
                format!("+{:.0} µs", (p50.as_secs_f64() - q50.as_secs_f64()) * 1e6),
            ));
        }
        rows.push(Row::reported(
            "`true` start→closed over gRPC Exec, p99",
            ms(p99),
            format!("{} direct", ms(d99)),
            format!("{:.2}x", p99.as_secs_f64() / d99.as_secs_f64()),
        ));
    }

    // 4. fs/readFile 1 MiB.
    let direct = direct_read_file_p50(&file, n.min(500), false)?;
    let direct_simd = direct_read_file_p50(&file, n.min(500), true)?;
    let ours = read_file_p50(&gw.url, &file, n.min(500), Consume::Lean).await?;
    let r = match &reference {
        Some(r) => ms(read_file_p50(&r.url, &file, ref_n, Consume::Lean).await?),
        None => String::new(),
    };
    let ratio = ours.as_secs_f64() / direct.as_secs_f64();
    rows.push(Row {
        figure: "fs/readFile 1 MiB, p50",
        ours: ms(ours),
        baseline: format!("{} read+b64", ms(direct)),
        ratio: format!("{ratio:.2}x"),
        target: "(reported)",
        met: None,
        reference: r,
    });
    let parsing = read_file_p50(&gw.url, &file, n.min(500), Consume::Parsing).await?;
    let r = match &reference {
        Some(r) => ms(read_file_p50(&r.url, &file, ref_n, Consume::Parsing).await?),
        None => String::new(),
    };
    let ratio = parsing.as_secs_f64() / direct.as_secs_f64();
    rows.push(Row {
        figure: "fs/readFile 1 MiB, p50, parsing client",
        ours: ms(parsing),
        baseline: format!("{} read+b64", ms(direct)),
        ratio: format!("{ratio:.2}x"),
        target: "≤ 2x direct",
        met: Some(ratio <= 2.0),
        reference: r,
    });
    // What bounds the row above: the parsing client alone taking the 1 MiB
    // reply apart (parse + scalar base64), no gateway and no file.
    let floor = parsing_reply_p50(n.min(500))?;
    rows.push(Row::reported(
        "parsing client alone: a 1 MiB readFile reply, p50",
        ms(floor),
        format!("{} read+b64", ms(direct)),
        format!("{:.2}x", floor.as_secs_f64() / direct.as_secs_f64()),
    ));
    rows.push(Row::reported(
        "fs/readFile 1 MiB, p50 (vs SIMD base64)",
        ms(ours),
        format!("{} read+simd", ms(direct_simd)),
        format!("{:.2}x", ours.as_secs_f64() / direct_simd.as_secs_f64()),
    ));

    // 5. memory per idle session.
    rows.push(memory_row(&gw, reference.as_ref(), args.sessions).await?);

    // 6. the cost of the stack, in process: the whole tower stack vs the
    // bare handler, for a call that does nothing (process/list).
    // As root the in-process gateway cannot turn the uid layer off, and its
    // uid probe needs the gateway binary: the figure is skipped there.
    match stack_cost(&settings, 200_000).await {
        Ok((with_stack, bare)) => rows.push(Row::reported(
            "tower stack cost per call (in process)",
            format!("{:.2} µs", with_stack.as_secs_f64() * 1e6),
            format!("{:.2} µs bare handler", bare.as_secs_f64() * 1e6),
            format!(
                "+{:.2} µs",
                (with_stack.as_secs_f64() - bare.as_secs_f64()) * 1e6
            ),
        )),
        Err(e) => eprintln!("tower stack cost skipped: {e}"),
    }

    // 7. fairness: the victim's p99 spawn latency while another tenant floods
    // (8 connections spawning as fast as the gateway lets them).
    let victim_url = format!("{base_url}/?access_token={victim_token}");
    let flood_url = format!("{base_url}/?access_token={flood_token}");
    let alone = spawn_latency(&victim_url, 1000).await?;
    let stop = tokio_util::sync::CancellationToken::new();
    let flooders: Vec<_> = (0..8)
        .map(|i| {
            exec_gateway::task::start("bench-flood", flood(flood_url.clone(), i, stop.clone()))
        })
        .collect();
    // Steady state: let the flooder spend its burst allowance first.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let loaded = spawn_latency(&victim_url, 1000).await?;
    stop.cancel();
    let mut flood_ok = 0;
    let mut flood_shed = 0;
    for f in flooders {
        let (ok, shed) = f.await.map_err(err)??;
        flood_ok += ok;
        flood_shed += shed;
    }
    let ratio = loaded.1.as_secs_f64() / alone.1.as_secs_f64();
    rows.push(Row {
        figure: "victim p99 spawn while another tenant floods",
        ours: ms(loaded.1),
        baseline: format!("{} alone", ms(alone.1)),
        ratio: format!("{ratio:.2}x"),
        target: "≤ 1.5x alone",
        met: Some(ratio <= 1.5),
        reference: String::new(),
    });
    eprintln!(
        "(flood: {flood_ok} spawns served, {flood_shed} shed with -32001 under the default 200 req/s tenant limit)"
    );

    rows.extend(fleet_rows().await.map_err(|e| format!("fleet: {e}"))?);
    rows.extend(
        executor_rows()
            .await
            .map_err(|e| format!("executors: {e}"))?,
    );
    rows.extend(edge_rows().await.map_err(|e| format!("edges: {e}"))?);
    report(&rows, reference.is_some(), args.json);
    let _ = std::fs::remove_dir_all(&dir);
    drop(gw);
    drop(reference);
    Ok(())
}

/// The `/readyz` body of the gateway at `ws_url` (its isolation report).
/// The body of `GET path` from `addr` (`HOST:PORT`).
async fn http_get(addr: &str, path: &str) -> BenchResult<String> {
    use tokio::io::AsyncWriteExt as _;
    let mut s = TcpStream::connect(addr).await.map_err(err)?;
    s.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .await
    .map_err(err)?;
    let mut body = String::new();
    s.read_to_string(&mut body).await.map_err(err)?;
    Ok(body
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default())
}

/// The isolation report of a gateway started with an admin listener.
async fn readyz(server: &Server) -> BenchResult<String> {
    let admin = server.admin.as_deref().ok_or("no admin listener")?;
    http_get(admin, "/readyz").await
}

fn grpc_spec(id: String, argv: Vec<String>) -> exec_gateway::transport::grpc::pb::ProcessSpec {
    exec_gateway::transport::grpc::pb::ProcessSpec {
        process_id: id,
        argv,
        cwd: "/tmp".into(),
        env: [("PATH".to_owned(), "/usr/bin:/bin".to_owned())].into(),
        tty: false,
        pipe_stdin: false,
        arg0: None,
        env_policy: None,
    }
}

async fn grpc_exec(
    client: &mut exec_gateway::transport::grpc::pb::process_service_client::ProcessServiceClient<
        tonic::transport::Channel,
    >,
    token: &str,
    session: &str,
    spec: exec_gateway::transport::grpc::pb::ProcessSpec,
) -> BenchResult<u64> {
    use exec_gateway::transport::grpc::pb;
    let mut req = tonic::Request::new(pb::ExecRequest {
        session_id: session.to_owned(),
        spec: Some(spec),
    });
    req.metadata_mut().insert(
        "authorization",
        format!("Bearer {token}").parse().map_err(err)?,
    );
    let mut stream = client.exec(req).await.map_err(err)?.into_inner();
    let mut bytes = 0u64;
    while let Some(msg) = stream.next().await {
        let ev = msg.map_err(err)?.event.ok_or("empty event")?;
        match ev.event {
            Some(pb::process_event::Event::Output(o)) => bytes += o.data.len() as u64,
            Some(pb::process_event::Event::Closed(_)) => return Ok(bytes),
            _ => {}
        }
    }
    Err("stream ended before closed".to_owned())
}

async fn grpc_session(channel: tonic::transport::Channel, token: &str) -> BenchResult<String> {
    use exec_gateway::transport::grpc::pb;
    let mut req = tonic::Request::new(pb::CreateSessionRequest {
        snapshot: String::new(),
        image: String::new(),
        client_name: "bench".into(),
    });
    req.metadata_mut().insert(
        "authorization",
        format!("Bearer {token}").parse().map_err(err)?,
    );
    Ok(
        pb::session_service_client::SessionServiceClient::new(channel)
            .create_session(req)
            .await
            .map_err(err)?
            .into_inner()
            .session_id,
    )
}

async fn grpc_throughput(url: &str, token: &str, bytes: u64) -> BenchResult<f64> {
    use exec_gateway::transport::grpc::pb::process_service_client::ProcessServiceClient;
    // A bulk client sizes its HTTP/2 windows (as any gRPC bulk client should).
    let channel = tonic::transport::Channel::from_shared(url.to_owned())
        .map_err(err)?
        .initial_stream_window_size(exec_gateway::transport::grpc::HTTP2_STREAM_WINDOW_BYTES)
        .initial_connection_window_size(
            exec_gateway::transport::grpc::HTTP2_CONNECTION_WINDOW_BYTES,
        )
        .http2_adaptive_window(true)
        .max_frame_size(exec_gateway::transport::grpc::HTTP2_MAX_FRAME_BYTES)
        .connect()
        .await
        .map_err(err)?;
    let session = grpc_session(channel.clone(), token).await?;
    let mut client = ProcessServiceClient::new(channel)
        .max_decoding_message_size(exec_gateway::transport::grpc::MAX_GRPC_MESSAGE_BYTES);
    let t = Instant::now();
    let spec = grpc_spec(
        format!("big-{}", t.elapsed().as_nanos()),
        vec![
            "head".into(),
            "-c".into(),
            bytes.to_string(),
            "/dev/zero".into(),
        ],
    );
    let got = grpc_exec(&mut client, token, &session, spec).await?;
    if got != bytes {
        return Err(format!("received {got} of {bytes} bytes over gRPC"));
    }
    Ok(bytes as f64 / t.elapsed().as_secs_f64() / 1e6)
}

async fn grpc_spawn_latency(url: &str, token: &str, n: usize) -> BenchResult<(Duration, Duration)> {
    use exec_gateway::transport::grpc::pb::process_service_client::ProcessServiceClient;
    let channel = tonic::transport::Channel::from_shared(url.to_owned())
        .map_err(err)?
        .connect()
        .await
        .map_err(err)?;
    let session = grpc_session(channel.clone(), token).await?;
    let mut client = ProcessServiceClient::new(channel);
    let mut lat = Vec::with_capacity(n);
    for i in 0..n + 20 {
        let t = Instant::now();
        grpc_exec(
            &mut client,
            token,
            &session,
            grpc_spec(format!("g{i}"), vec!["true".into()]),
        )
        .await?;
        if i >= 20 {
            lat.push(t.elapsed());
        }
    }
    lat.sort();
    Ok((percentile(&lat, 0.5), percentile(&lat, 0.99)))
}

/// One flooding connection: start `true` as fast as possible, counting
/// served and shed starts, until `stop`.
async fn flood(
    url: String,
    i: usize,
    stop: tokio_util::sync::CancellationToken,
) -> BenchResult<(u64, u64)> {
    let mut c = Conn::open(&url).await?;
    let (mut ok, mut shed) = (0u64, 0u64);
    let mut n = 0u64;
    while !stop.is_cancelled() {
        n += 1;
        match c.run_to_close(&format!("f{i}-{n}"), &["true"]).await {
            Ok(_) => ok += 1,
            Err(_) => shed += 1,
        }
    }
    Ok((ok, shed))
}

/// Mean time per call through the full stack and through the bare handler.
async fn stack_cost(
    settings: &exec_gateway::config::Settings,
    n: u32,
) -> BenchResult<(Duration, Duration)> {
    use exec_gateway::config::LayerPolicy;
    use tower::ServiceExt as _;
    // In process, the stack alone is measured: no isolation layer (a worker
    // would be this binary re-executed, which is not the gateway).
    let mut settings = settings.clone();
    let iso = &mut settings.isolation;
    (
        iso.workers,
        iso.cgroups,
        iso.landlock,
        iso.seccomp,
        iso.uid,
        iso.namespaces,
    ) = (
        LayerPolicy::Off,
        LayerPolicy::Off,
        LayerPolicy::Off,
        LayerPolicy::Off,
        LayerPolicy::Off,
        LayerPolicy::Off,
    );
    let gw = exec_gateway::gateway::Gateway::new(settings, None).map_err(err)?;
    let tenant = gw.tenants.get("bench").await.map_err(|e| e.to_string())?;
    let (out, mut rx) =
        exec_gateway::outbound::Outbound::channel(exec_gateway::outbound::ByteBudget::unlimited());
    exec_gateway::task::start(
        "bench-drain",
        async move { while rx.recv().await.is_some() {} },
    );
    let (session, token) = gw
        .sessions
        .initialize(&tenant, None, out, None)
        .map_err(err)?;
    let req = exec_gateway::dispatch::RpcRequest {
        op: exec_gateway::rpc::Op::Call(exec_gateway::rpc::Call::ProcessList(
            exec_gateway::rpc::NoParams,
        )),
        ctx: exec_gateway::dispatch::RequestContext {
            principal: std::sync::Arc::new(exec_gateway::auth::Principal {
                tenant: tenant.name.clone(),
                subject: None,
                scopes: exec_gateway::auth::Scopes::ALL,
                expires_at: None,
                key: exec_gateway::auth::KeyLife::default(),
                image: None,
            }),
            tenant: tenant.clone(),
            session: Some(session),
            place: None,
            evicted: token.evicted,
            reply: None,
        },
    };
    let t = Instant::now();
    for _ in 0..n {
        gw.stack.clone().oneshot(req.clone()).await.map_err(err)?;
    }
    let with_stack = t.elapsed() / n;
    let t = Instant::now();
    for _ in 0..n {
        exec_gateway::dispatch::Dispatch
            .oneshot(req.clone())
            .await
            .map_err(err)?;
    }
    let bare = t.elapsed() / n;
    Ok((with_stack, bare))
}

fn tempfile_dir() -> BenchResult<PathBuf> {
    let dir = std::env::temp_dir().join(format!("exec-gateway-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(err)?;
    Ok(dir)
}
