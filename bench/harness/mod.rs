//! The harness every figure shares: the command line (`args.rs`), a
//! server under test (`server.rs`), the raw websocket client (`conn.rs`),
//! the rows and their report (`report.rs`); here, the client library's
//! connection and a process run to its close, percentiles, tokens, the
//! scalar base64 a parsing client decodes with, and the run's scratch
//! directory and descriptor limit.

use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::io::AsyncReadExt as _;
use tokio::net::TcpStream;

mod args;
mod conn;
mod cost;
mod report;
mod server;

pub(crate) use args::BenchArgs;
pub(crate) use conn::Conn;
pub(crate) use cost::Cost;
pub(crate) use report::{Row, report};
pub(crate) use server::{Server, readyz};

pub(crate) type BenchResult<T> = Result<T, String>;

pub(crate) fn err(e: impl std::fmt::Display) -> String {
    e.to_string()
}

/// What the figures of the default run share: the measured gateway (every
/// door on loopback, the `bench` tenant's token in its URL), the reference
/// when one was given, the configuration the variants are written from,
/// and the sizes from the command line.
pub(crate) struct Run<'a> {
    pub(crate) exe: &'a Path,
    pub(crate) dir: &'a Path,
    /// The measured gateway's configuration; each variant (no layers, no
    /// workers, namespaces off...) appends an `[isolation]` table to it.
    pub(crate) config: &'a Path,
    pub(crate) gw: &'a Server,
    pub(crate) reference: Option<&'a Server>,
    pub(crate) bench_token: &'a str,
    /// The confined tenant's root and token.
    pub(crate) jail: &'a Path,
    pub(crate) jail_token: &'a str,
    /// Iterations for latency figures, and for the reference's.
    pub(crate) n: usize,
    pub(crate) ref_n: usize,
    /// Seconds per spawns-per-second run.
    pub(crate) seconds: u64,
    /// Bytes of output per throughput run.
    pub(crate) output_bytes: u64,
}

pub(crate) fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let idx = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[idx.min(sorted.len() - 1)]
}

pub(crate) fn ms(d: Duration) -> String {
    format!("{:.3} ms", d.as_secs_f64() * 1e3)
}

/// A client of the gateway (or a reference server) at `url`, as users
/// connect: the crate's client library. The token rides in the URL.
pub(crate) async fn client(url: &str) -> BenchResult<exec_gateway::client::Client> {
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
pub(crate) async fn run_to_close(
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

/// Decode with the scalar `base64` crate, as Codex's client does.
pub(crate) fn scalar_b64(s: &str) -> BenchResult<Vec<u8>> {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD
        .decode(s)
        .map_err(err)
}

/// An HS256 token for `tenant` with every scope, as the gateway's own
/// `token` command mints it.
pub(crate) fn all_scopes_token(
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

pub(crate) fn raise_fd_limit() {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    if let Ok((_, hard)) = getrlimit(Resource::RLIMIT_NOFILE) {
        let want = hard.min(1 << 20);
        let _ = setrlimit(Resource::RLIMIT_NOFILE, want, want);
    }
}

/// The body of `GET path` from `addr` (`HOST:PORT`).
pub(crate) async fn http_get(addr: &str, path: &str) -> BenchResult<String> {
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

pub(crate) fn tempfile_dir() -> BenchResult<PathBuf> {
    let dir = std::env::temp_dir().join(format!("exec-gateway-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(err)?;
    Ok(dir)
}
