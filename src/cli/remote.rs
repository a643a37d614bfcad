//! The client commands: `exec`, `cp` and `ps`, on [`crate::client`].

use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;

use tokio::io::AsyncReadExt as _;
use tokio::signal::unix::{SignalKind, signal};

use super::term::RawMode;
use crate::client::{self, Client, ClientError, ConnectOptions, Event, ProcessSpec, Stream};

/// The gateway `serve` listens on by default.
pub const DEFAULT_URL: &str = "ws://127.0.0.1:8765";
/// Where `--grpc` connects by default (`serve --grpc-listen 127.0.0.1:8766`).
pub const DEFAULT_GRPC_URL: &str = "grpc://127.0.0.1:8766";

/// Exit codes of the client's own failures, as `docker exec` has them:
/// the gateway or the connection failed; the command cannot be run; the
/// command was not found.
pub const EXIT_CLIENT: u8 = 125;
pub const EXIT_CANNOT_RUN: u8 = 126;
pub const EXIT_NOT_FOUND: u8 = 127;

#[derive(Debug, clap::Args)]
pub struct ClientArgs {
    /// The gateway: `ws://HOST:PORT` (exec-server JSON-RPC) or
    /// `grpc://HOST:PORT`; `wss://` and `grpcs://` over TLS. Default:
    /// EXEC_GATEWAY_URL, else
    /// ws://127.0.0.1:8765 (grpc://127.0.0.1:8766 with --grpc).
    #[arg(long)]
    pub url: Option<String>,
    /// The JWT. Default: EXEC_GATEWAY_TOKEN; else, for a gateway on this
    /// machine, one minted with the embedded default's key for tenant
    /// `default`.
    #[arg(long)]
    pub token: Option<String>,
    /// Speak gRPC instead of websocket JSON-RPC.
    #[arg(long)]
    pub grpc: bool,
    /// CA bundle (PEM) the gateway's certificate must chain to (`wss://`,
    /// `grpcs://`). Default: EXEC_GATEWAY_CA, else the public web roots.
    #[arg(long)]
    pub ca: Option<PathBuf>,
    /// A client certificate (PEM chain) to authenticate with instead of a
    /// token, on a gateway that accepts them; needs --key.
    #[arg(long, requires = "key")]
    pub cert: Option<PathBuf>,
    /// The client certificate's private key (PEM).
    #[arg(long, requires = "cert")]
    pub key: Option<PathBuf>,
}

#[derive(Debug, clap::Args)]
#[command(trailing_var_arg = true)]
pub struct ExecArgs {
    #[command(flatten)]
    pub client: ClientArgs,
    /// Stream stdin to the process; its EOF closes the process's stdin.
    #[arg(short = 'i', long = "stdin")]
    pub stdin: bool,
    /// Give the process a terminal the size of this one, and put this one
    /// in raw mode (keys, Ctrl-C included, go to the process).
    #[arg(short = 't', long = "tty")]
    pub tty: bool,
    /// Working directory (relative: to the tenant's root). Default: the root.
    #[arg(long)]
    pub cwd: Option<String>,
    /// `KEY=VALUE` set in the process's environment (repeatable).
    #[arg(short = 'e', long = "env")]
    pub env: Vec<String>,
    /// Run the command on this image (a reference the tenant may use)
    /// instead of the tenant's own.
    #[arg(long, value_name = "REF")]
    pub image: Option<String>,
    /// The command and its arguments.
    #[arg(required = true, num_args = 1.., value_name = "CMD")]
    pub command: Vec<String>,
}

#[derive(Debug, clap::Args)]
pub struct CpArgs {
    #[command(flatten)]
    pub client: ClientArgs,
    /// `LOCAL` or `:REMOTE` (a path in the tenant's root; relative paths
    /// start at the root).
    pub source: String,
    /// `:REMOTE` or `LOCAL`; exactly one of the two is remote.
    pub destination: String,
    /// Copy in a session on this image (a reference the tenant may use):
    /// what it reads outside the tenant's root is the image's.
    #[arg(long, value_name = "REF")]
    pub image: Option<String>,
}

#[derive(Debug, clap::Args)]
pub struct PsArgs {
    #[command(flatten)]
    pub client: ClientArgs,
    /// The session whose processes to list.
    /// Default: EXEC_GATEWAY_SESSION.
    #[arg(long)]
    pub session: Option<String>,
    /// One JSON object per process instead of a table.
    #[arg(long)]
    pub json: bool,
}

pub(super) fn fail(e: impl std::fmt::Display) -> ExitCode {
    eprintln!("exec-gateway: {e}");
    ExitCode::from(EXIT_CLIENT)
}

pub(super) fn env_nonempty(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

/// Whether a websocket or gRPC URL names this machine.
fn is_loopback(url: &str) -> bool {
    url::Url::parse(url)
        .ok()
        .and_then(|u| u.host_str().map(str::to_owned))
        .is_some_and(|h| {
            h == "localhost"
                || h.trim_matches(['[', ']'])
                    .parse::<std::net::IpAddr>()
                    .is_ok_and(|ip| ip.is_loopback())
        })
}

/// The URL and token to connect with.
pub(super) fn options(args: &ClientArgs) -> Result<ConnectOptions, String> {
    let url = match (args.url.clone(), env_nonempty("EXEC_GATEWAY_URL")) {
        (Some(u), _) | (None, Some(u)) => u,
        (None, None) if args.grpc => DEFAULT_GRPC_URL.to_owned(),
        (None, None) => DEFAULT_URL.to_owned(),
    };
    let url = if args.grpc {
        match url.split_once("://") {
            Some(("ws" | "wss", _)) => {
                return Err(format!("--grpc with the websocket URL `{url}`"));
            }
            Some(_) => url,
            None => format!("grpc://{url}"),
        }
    } else {
        url
    };
    let token = match (args.token.clone(), env_nonempty("EXEC_GATEWAY_TOKEN")) {
        (Some(t), _) | (None, Some(t)) => t.trim().to_owned(),
        // The client certificate is the credential.
        (None, None) if args.cert.is_some() => String::new(),
        // A URL that carries its token (`?access_token=`) is used as given.
        (None, None) if let Some(t) = url_token(&url) => t,
        (None, None) if is_loopback(&url) => {
            check_listener_owner(&url)?;
            embedded_token()?
        }
        (None, None) => {
            return Err(format!(
                "no token for {url}: pass --token or set EXEC_GATEWAY_TOKEN"
            ));
        }
    };
    let mut options = ConnectOptions::new(&url, &token);
    options.ca = args
        .ca
        .clone()
        .or_else(|| env_nonempty("EXEC_GATEWAY_CA").map(PathBuf::from));
    options.identity = args.cert.clone().zip(args.key.clone());
    Ok(options)
}

/// The `access_token` a URL carries in its query, if any.
fn url_token(url: &str) -> Option<String> {
    url::Url::parse(url)
        .ok()?
        .query_pairs()
        .find(|(k, v)| k == "access_token" && !v.is_empty())
        .map(|(_, v)| v.into_owned())
}

/// The minted token goes only to a listener of this user or root: another
/// local user listening on the port (the gateway down, a typo) must not
/// collect a token for the embedded default's tenant.
fn check_listener_owner(url: &str) -> Result<(), String> {
    let port = url::Url::parse(url)
        .ok()
        .and_then(|u| u.port_or_known_default())
        .ok_or_else(|| format!("{url}: no port"))?;
    let me = nix::unistd::geteuid().as_raw();
    match listener_uid(port) {
        Some(uid) if uid == me || uid == 0 => Ok(()),
        Some(uid) => Err(format!(
            "port {port} is listened on by uid {uid}, not by you or root: not sending it a \
             token minted with the embedded key; pass --token or EXEC_GATEWAY_TOKEN"
        )),
        None => Err(format!(
            "nothing listens on port {port} here (is `exec-gateway serve` running?); for a \
             gateway elsewhere pass --token or EXEC_GATEWAY_TOKEN"
        )),
    }
}

/// The owner of the TCP socket listening on `port` on this host
/// (`/proc/net/tcp` and `tcp6`), if any.
fn listener_uid(port: u16) -> Option<u32> {
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let Ok(text) = std::fs::read_to_string(table) else {
            continue;
        };
        for line in text.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            // sl local rem st tx:rx tr:when retrnsmt uid …; 0A is LISTEN.
            if f.len() < 8 || f[3] != "0A" {
                continue;
            }
            let local_port = f[1]
                .rsplit(':')
                .next()
                .and_then(|p| u16::from_str_radix(p, 16).ok());
            if local_port == Some(port) {
                return f[7].parse().ok();
            }
        }
    }
    None
}

/// A short-lived token for tenant `default`, signed with the embedded
/// default's key: what a local `exec-gateway serve` accepts.
fn embedded_token() -> Result<String, String> {
    let common = super::CommonArgs {
        config: None,
        root: None,
        log_format: crate::telemetry::LogFormat::Text,
    };
    let settings = super::settings(
        &common,
        super::Overrides {
            admin_listen: Some("off"),
            ..super::Overrides::default()
        },
    )
    .map_err(|e| e.to_string())?;
    let (alg, secret) = crate::auth::Authenticator::signing_secret(&settings.auth)
        .ok_or_else(|| "the embedded default has no signing key".to_owned())?;
    let scopes: Vec<String> = crate::auth::Scope::ALL
        .iter()
        .map(|s| s.name().to_owned())
        .collect();
    crate::auth::mint(
        alg,
        &secret,
        &settings.auth,
        crate::config::DEFAULT_TENANT,
        &scopes,
        std::time::Duration::from_secs(3600),
        "exec-gateway-cli",
    )
}

/// Connect, resuming `session` or opening one on `image`.
pub(super) async fn connect(
    args: &ClientArgs,
    session: Option<String>,
    image: Option<String>,
) -> Result<Client, String> {
    let mut opts = options(args)?;
    opts.resume_session = session;
    opts.image = image;
    Client::connect_with(opts).await.map_err(|e| e.to_string())
}

/// `exec-gateway exec`.
pub async fn exec(args: ExecArgs) -> ExitCode {
    let mut env = BTreeMap::new();
    for kv in &args.env {
        match kv.split_once('=') {
            Some((k, v)) if !k.is_empty() => {
                env.insert(k.to_owned(), v.to_owned());
            }
            _ => return fail(format!("--env `{kv}`: expected KEY=VALUE")),
        }
    }
    if args.tty && !env.contains_key("TERM") {
        let term = env_nonempty("TERM").unwrap_or_else(|| "xterm-256color".to_owned());
        env.insert("TERM".to_owned(), term);
    }
    let client = match connect(&args.client, None, args.image.clone()).await {
        Ok(c) => c,
        Err(e) => return fail(e),
    };
    // A missing --cwd would read as a missing command (both are ENOENT).
    if let Some(cwd) = &args.cwd {
        match client.metadata(cwd).await {
            Ok(m) if m.is_directory => {}
            Ok(_) => {
                let _ = client.close().await;
                return fail(format!("--cwd {cwd}: not a directory"));
            }
            // Without fs:read, the start will tell.
            Err(ClientError::Rpc { code: -32003, .. }) => {}
            Err(e) => {
                let _ = client.close().await;
                return fail(format!("--cwd {cwd}: {e}"));
            }
        }
    }
    let pid = format!("exec-{}", &uuid::Uuid::new_v4().simple().to_string()[..12]);
    let mut spec = ProcessSpec::new(&pid, args.command.clone());
    spec.cwd = args.cwd.clone().unwrap_or_default();
    spec.env = env;
    spec.tty = args.tty;
    spec.pipe_stdin = args.stdin && !args.tty;
    // Started with its attachment already listening: no read to catch up.
    let events = match client.exec(&spec).await {
        Ok(events) => events,
        Err(e) => {
            eprintln!("exec-gateway: {}: {e}", args.command.join(" "));
            let code = match &e {
                ClientError::Rpc { message, .. } if message.contains("os error 2") => {
                    EXIT_NOT_FOUND
                }
                ClientError::Rpc { message, .. } if message.contains("os error 13") => {
                    EXIT_CANNOT_RUN
                }
                _ => EXIT_CLIENT,
            };
            let _ = client.close().await;
            return ExitCode::from(code);
        }
    };
    // Raw mode only once the process runs (a refused start leaves the
    // terminal as it was), and only with -i: without it the keys would go
    // nowhere, so Ctrl-C stays a signal the client passes on.
    let raw = if args.tty && args.stdin {
        match RawMode::enter() {
            Ok(r) => r,
            Err(e) => {
                drop(events);
                let _ = client.close().await;
                return fail(format!("cannot put the terminal in raw mode: {e}"));
            }
        }
    } else {
        None
    };
    if args.tty
        && let Some((rows, cols)) = super::term::window_size()
    {
        let _ = client.resize(&pid, rows, cols).await;
    }
    let code = run_attached(&client, events, &pid, args.stdin, args.tty).await;
    drop(raw);
    // Done: the session need not wait for a resume.
    let _ = client.close().await;
    match code {
        // A code no process can exit with (a server's 256, -1) is a failure.
        Ok(c) => ExitCode::from(u8::try_from(c).unwrap_or(255)),
        Err(e) => fail(e),
    }
}

/// Stream output, stdin and signals until the process closes; its exit code.
async fn run_attached(
    client: &Client,
    events: client::Attachment<'_>,
    pid: &str,
    stdin: bool,
    tty: bool,
) -> client::Result<i32> {
    let mut signals = Signals::new()?;
    let output = pump_output(events);
    tokio::pin!(output);
    let input = pump_stdin(client, pid);
    tokio::pin!(input);
    let mut input_done = !stdin;
    loop {
        tokio::select! {
            code = &mut output => {
                // Our stdout's reader is gone (`exec … | head`): end the
                // process, and exit as a local writer would, by SIGPIPE's
                // code, without a message.
                if let Err(ClientError::Io(e)) = &code
                    && e.kind() == std::io::ErrorKind::BrokenPipe
                {
                    let _ = client.terminate(pid).await;
                    return Ok(128 + libc::SIGPIPE);
                }
                return code;
            }
            r = &mut input, if !input_done => {
                input_done = true;
                if let Err(e) = r {
                    tracing::debug!(error = %e, "stdin ended");
                }
            }
            s = signals.next() => match s {
                Forward::Resize => {
                    if tty && let Some((rows, cols)) = super::term::window_size() {
                        let _ = client.resize(pid, rows, cols).await;
                    }
                }
                Forward::Signal(sig) => {
                    let _ = client.signal(pid, sig).await;
                }
            },
        }
    }
}

/// Write output to stdout and stderr until the process closes.
async fn pump_output(mut events: client::Attachment<'_>) -> client::Result<i32> {
    let mut code = None;
    let mut lost = 0u64;
    while let Some(e) = events.next().await? {
        match e {
            Event::Output {
                stream: Stream::Stderr,
                data,
                ..
            } => write_out(&mut std::io::stderr(), &data)?,
            Event::Output { data, .. } => write_out(&mut std::io::stdout(), &data)?,
            Event::Exited { code: c, signal } => code = Some(signal.map_or(c, |s| 128 + s)),
            Event::OutputLost { chunks } => lost += chunks,
        }
    }
    if lost > 0 {
        return Err(ClientError::Disconnected(format!(
            "{lost} chunks of the process's output were lost while the connection was away \
             (the gateway keeps a process's last 1 MiB of output); the process {}",
            match code {
                Some(c) => format!("exited with {c}"),
                None => "ended".to_owned(),
            }
        )));
    }
    code.ok_or_else(|| ClientError::Protocol("the process closed without an exit code".into()))
}

/// Write a chunk out and flush it, blocking this worker thread (the
/// other keeps stdin and signals moving): a slow reader of our stdout
/// slows the process, as in a local pipe, with no extra copy.
fn write_out(out: &mut impl std::io::Write, data: &[u8]) -> std::io::Result<()> {
    tokio::task::block_in_place(|| {
        out.write_all(data)?;
        out.flush()
    })
}

/// Bytes read from stdin per write.
const STDIN_CHUNK_BYTES: usize = 64 * 1024;

/// Copy stdin to the process; at EOF, close its stdin.
async fn pump_stdin(client: &Client, pid: &str) -> client::Result<()> {
    let mut stdin = tokio::io::stdin();
    let mut buf = vec![0u8; STDIN_CHUNK_BYTES];
    loop {
        let n = stdin.read(&mut buf).await?;
        if n == 0 {
            return client.close_stdin(pid).await;
        }
        loop {
            match client.write(pid, &buf[..n]).await? {
                client::WriteStatus::Accepted => break,
                client::WriteStatus::Starting => {
                    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
                }
                client::WriteStatus::StdinClosed | client::WriteStatus::UnknownProcess => {
                    return Ok(());
                }
            }
        }
    }
}

enum Forward {
    Resize,
    Signal(client::Signal),
}

/// The signals the client passes on: a window change becomes a resize;
/// interrupt, terminate, hangup and quit go to the process (under `-t`,
/// Ctrl-C is a byte the remote terminal turns into SIGINT).
struct Signals {
    winch: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
    term: tokio::signal::unix::Signal,
    hup: tokio::signal::unix::Signal,
    quit: tokio::signal::unix::Signal,
}

impl Signals {
    fn new() -> std::io::Result<Signals> {
        Ok(Signals {
            winch: signal(SignalKind::window_change())?,
            int: signal(SignalKind::interrupt())?,
            term: signal(SignalKind::terminate())?,
            hup: signal(SignalKind::hangup())?,
            quit: signal(SignalKind::quit())?,
        })
    }

    async fn next(&mut self) -> Forward {
        use client::Signal as S;
        tokio::select! {
            _ = self.winch.recv() => Forward::Resize,
            _ = self.int.recv() => Forward::Signal(S::Interrupt),
            _ = self.term.recv() => Forward::Signal(S::Terminate),
            _ = self.hup.recv() => Forward::Signal(S::Hangup),
            _ = self.quit.recv() => Forward::Signal(S::Quit),
        }
    }
}

/// `exec-gateway cp`.
pub async fn cp(args: CpArgs) -> ExitCode {
    let (upload, local, remote) = match (
        args.source.strip_prefix(':'),
        args.destination.strip_prefix(':'),
    ) {
        (None, Some(r)) => (true, args.source.as_str(), r),
        (Some(r), None) => (false, args.destination.as_str(), r),
        _ => {
            return fail(
                "cp: exactly one of SOURCE and DESTINATION is remote (`:PATH`), e.g. \
                 `cp ./build :out` or `cp :out/log.txt .`",
            );
        }
    };
    let client = match connect(&args.client, None, args.image.clone()).await {
        Ok(c) => c,
        Err(e) => return fail(e),
    };
    let local = PathBuf::from(local);
    let stats = if upload {
        client::copy::upload(&client, &local, remote).await
    } else {
        client::copy::download(&client, remote, &local).await
    };
    let _ = client.close().await;
    match stats {
        Ok(s) => {
            if s.skipped > 0 {
                eprintln!(
                    "exec-gateway: cp: skipped {} symbolic links or special files",
                    s.skipped
                );
            }
            ExitCode::SUCCESS
        }
        Err(e) => fail(format!("cp: {e}")),
    }
}

/// `exec-gateway ps`.
pub async fn ps(args: PsArgs) -> ExitCode {
    let Some(session) = args
        .session
        .clone()
        .or_else(|| env_nonempty("EXEC_GATEWAY_SESSION"))
    else {
        return fail("ps: name a session with --session or EXEC_GATEWAY_SESSION");
    };
    let client = match connect(&args.client, Some(session), None).await {
        Ok(c) => c,
        Err(e) => return fail(e),
    };
    let processes = match client.list().await {
        Ok(p) => p,
        Err(e) => return fail(format!("ps: {e}")),
    };
    let mut out = std::io::stdout().lock();
    if args.json {
        for p in processes {
            let line = serde_json::json!({
                "processId": p.process_id, "state": p.state, "tty": p.tty,
                "exitCode": p.exit_code, "nextSeq": p.next_seq,
            });
            let _ = writeln!(out, "{line}");
        }
    } else {
        let _ = writeln!(
            out,
            "{:<24} {:<9} {:<4} {:>5} {:>8}",
            "PROCESS", "STATE", "TTY", "EXIT", "NEXTSEQ"
        );
        for p in processes {
            let _ = writeln!(
                out,
                "{:<24} {:<9} {:<4} {:>5} {:>8}",
                p.process_id,
                p.state,
                if p.tty { "yes" } else { "no" },
                p.exit_code
                    .map(|c| c.to_string())
                    .unwrap_or_else(|| "-".into()),
                p.next_seq
            );
        }
    }
    ExitCode::SUCCESS
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_in_the_url_is_found() {
        assert_eq!(
            url_token("ws://127.0.0.1:8765/?access_token=abc.def&x=1"),
            Some("abc.def".to_owned())
        );
        assert_eq!(url_token("ws://127.0.0.1:8765/?access_token="), None);
        assert_eq!(url_token("ws://127.0.0.1:8765/"), None);
        assert_eq!(url_token("not a url"), None);
    }
}
