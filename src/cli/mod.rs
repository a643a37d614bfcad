//! The command line: parse, load config, run; exit codes (docs/operations.md).

use std::io::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use crate::auth::Scope;
use crate::config::{Config, ConfigError, Settings, parse_listen};
use crate::gateway::Gateway;
use crate::isolation::reaper::{self, Reaper};
use crate::server::{self, ListenerTls, Listeners};
use crate::telemetry::{self, LogFormat};

mod audit;
mod executor;
mod forward;
mod reload;
pub mod remote;
mod snapshot;

pub use executor::ExecutorArgs;
mod term;

/// Exit code for bad configuration or usage (EX_USAGE).
pub const EXIT_USAGE: u8 = 64;

#[derive(Debug, Parser)]
#[command(
    name = "exec-gateway",
    version,
    about = "Multi-tenant exec-server gateway"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve the exec-server protocol over websocket (and HTTP health/metrics).
    Serve(ServeArgs),
    /// Serve one session over stdin/stdout (newline-delimited JSON); the
    /// token comes from EXEC_GATEWAY_TOKEN.
    Stdio(CommonArgs),
    /// Serve MCP (the Model Context Protocol) over stdin/stdout: one MCP
    /// session whose tools run in one sandbox session; the token comes
    /// from EXEC_GATEWAY_TOKEN (docs/mcp.md).
    Mcp(CommonArgs),
    /// Mint a token with the configuration's first HS* key (printed last on stdout).
    Token(TokenArgs),
    /// Serve as a remote executor: register with a registry (a gateway),
    /// dial the rendezvous websocket it answers and serve sessions there,
    /// in this host's tenant workers. The credential comes from
    /// CODEX_EXEC_SERVER_REMOTE_BEARER_TOKEN.
    Executor(ExecutorArgs),
    /// Run a command on a gateway, like `docker exec`: output streamed,
    /// `-i` for stdin, `-t` for a terminal; exits with the command's code.
    Exec(remote::ExecArgs),
    /// Copy files or directories to (`cp LOCAL :REMOTE`) or from
    /// (`cp :REMOTE LOCAL`) a tenant's root.
    Cp(remote::CpArgs),
    /// List a session's processes.
    Ps(remote::PsArgs),
    /// The tenant's workspace snapshots: create, list, get, delete, push
    /// (to the gateway's snapshot registry), promote (kept until deleted).
    Snapshot(snapshot::SnapshotArgs),
    /// Forward a local port to a port on a session's loopback, inside its
    /// tenant's network namespace (`[LOCAL:]REMOTE`).
    #[command(name = "port-forward")]
    PortForward(forward::PortForwardArgs),
    /// Print the audit trail's events (all its rotated files, oldest
    /// first), filtered by tenant, event and age.
    Audit(audit::AuditArgs),
    /// Internal: the sidecar that kills process groups if the gateway dies.
    #[command(hide = true)]
    Reaper,
    /// Internal: a tenant's worker process (started by the gateway).
    #[command(hide = true)]
    Worker(crate::worker::serve::WorkerArgs),
    /// Internal: the parent of a tenant PID namespace's init (its worker).
    #[command(hide = true, name = "pidns-parent")]
    PidnsParent,
}

#[derive(Debug, Clone, clap::Args)]
pub struct CommonArgs {
    /// TOML configuration file; without it the embedded default is used.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Root of the embedded default's tenant (default: the current directory).
    #[arg(long)]
    pub root: Option<PathBuf>,
    /// Log format on stderr.
    #[arg(long, value_enum, default_value = "text")]
    pub log_format: LogFormat,
}

#[derive(Debug, clap::Args)]
pub struct TokenArgs {
    #[command(flatten)]
    pub common: CommonArgs,
    /// Tenant the token is for.
    #[arg(
        long,
        required_unless_present = "executor_pool",
        conflicts_with = "executor_pool"
    )]
    pub tenant: Option<String>,
    /// Mint an executor credential for this pool instead (scope
    /// `executor`; `exec-gateway executor` and `codex exec-server --remote`
    /// register with it).
    #[arg(long)]
    pub executor_pool: Option<String>,
    /// Scopes (repeatable): exec, fs:read, fs:write, snapshot, forward, preview, egress. Default: all but egress.
    #[arg(long = "scope")]
    pub scopes: Vec<String>,
    /// Lifetime, e.g. 1h, 30m.
    #[arg(long, default_value = "1h")]
    pub ttl: String,
    /// `sub` claim.
    #[arg(long, default_value = "exec-gateway-cli")]
    pub subject: String,
}

#[derive(Debug, Clone, clap::Args)]
pub struct ServeArgs {
    #[command(flatten)]
    pub common: CommonArgs,
    /// `ws://IP:PORT` (port 0 picks a free port) or `stdio`.
    #[arg(long)]
    pub listen: Option<String>,
    /// Also serve gRPC on `HOST:PORT` (its URL is the second stdout line).
    #[arg(long)]
    pub grpc_listen: Option<String>,
    /// Serve `/metrics` and the detailed `/readyz` on `HOST:PORT`, or `off`
    /// (overrides `server.admin_listen`; its URL is the last stdout line).
    #[arg(long)]
    pub admin_listen: Option<String>,
    /// This replica's id in a fleet (overrides `fleet.replica`; the
    /// environment variable EXEC_GATEWAY_REPLICA does too).
    #[arg(long)]
    pub replica: Option<String>,
    /// The fleet's peer listener, `HOST:PORT` (overrides `fleet.listen`;
    /// its URL is printed before the admin URL).
    #[arg(long)]
    pub fleet_listen: Option<String>,
}

/// `serve`'s settings: the file (or the embedded default) with the
/// command line's overrides, its caps fitted to `nofile` open files.
fn serve_settings(
    args: &ServeArgs,
    nofile: u64,
) -> Result<(Settings, Option<String>), ConfigError> {
    let replica = args.replica.clone().or_else(|| {
        std::env::var("EXEC_GATEWAY_REPLICA")
            .ok()
            .filter(|r| !r.is_empty())
    });
    let mut settings = settings(
        &args.common,
        Overrides {
            listen: args.listen.as_deref(),
            admin_listen: args.admin_listen.as_deref(),
            replica,
            fleet_listen: args.fleet_listen.as_deref(),
        },
    )?;
    if let Some(g) = &args.grpc_listen {
        settings.grpc_listen =
            Some(g.parse().map_err(|_| {
                ConfigError(format!("--grpc-listen: expected HOST:PORT, got `{g}`"))
            })?);
    }
    let lowered = settings.fit_fd_limit(nofile)?;
    Ok((settings, lowered))
}

/// Command-line values that override the configuration file.
#[derive(Debug, Default)]
struct Overrides<'a> {
    listen: Option<&'a str>,
    admin_listen: Option<&'a str>,
    replica: Option<String>,
    fleet_listen: Option<&'a str>,
}

fn settings(common: &CommonArgs, o: Overrides<'_>) -> Result<Settings, ConfigError> {
    let mut config = match (&common.config, &common.root) {
        (Some(_), Some(_)) => {
            return Err(ConfigError(
                "--root applies to the embedded default; set tenants.NAME.root in the config"
                    .to_owned(),
            ));
        }
        (Some(path), None) => Config::load(path)?,
        (None, root) => {
            let root = match root {
                Some(r) => std::path::absolute(r)
                    .map_err(|e| ConfigError(format!("--root {}: {e}", r.display())))?,
                None => std::env::current_dir()
                    .map_err(|e| ConfigError(format!("current directory: {e}")))?,
            };
            Config::embedded(&root)?
        }
    };
    if let Some(listen) = o.listen {
        config.server.listen = Some(listen.to_owned());
    }
    if let Some(admin) = o.admin_listen {
        config.server.admin_listen = Some(admin.to_owned());
    }
    if let Some(replica) = o.replica {
        config.fleet.replica = Some(replica);
    }
    if let Some(l) = o.fleet_listen {
        config.fleet.listen = Some(l.to_owned());
    }
    let mut settings = config.validate()?;
    if let Some(path) = &common.config {
        refuse_config_in_reach(path, &settings)?;
        // It names every tenant, root and key path: hidden like the keys.
        settings
            .secret_files
            .extend(crate::config::secret_paths(std::iter::once(path.as_path())));
        settings.secret_files.sort();
        settings.secret_files.dedup();
    }
    Ok(settings)
}

/// The config file decides what every tenant may do: one a tenant could
/// write (inside its root or extra writable paths) would let it grant
/// itself more at the next start. Refused, like a key there.
fn refuse_config_in_reach(path: &std::path::Path, s: &Settings) -> Result<(), ConfigError> {
    let real = path
        .canonicalize()
        .unwrap_or_else(|_| crate::fs::normalize(&std::path::absolute(path).unwrap_or_default()));
    for (name, t) in &s.tenants {
        for dir in t.writable_dirs() {
            if real.starts_with(&dir) {
                return Err(ConfigError(format!(
                    "tenants.{name}: the config file {} lies inside {}, which the tenant can write; move it",
                    real.display(),
                    dir.display()
                )));
            }
        }
    }
    Ok(())
}

fn usage_error(e: &ConfigError) -> ExitCode {
    eprintln!("exec-gateway: {e}");
    ExitCode::from(EXIT_USAGE)
}

/// Buffers of 1 MiB and more are mapped and unmapped on their own.
/// glibc otherwise raises this threshold each time such a buffer is freed
/// (up to 32 MiB), after which the many large, short-lived buffers of a
/// gateway (`fs/readFile` replies, websocket frames) are carved from its
/// arenas and fragment them. A 20 s soak of victims alone (a few MiB held
/// for clients): 2.3-2.6 GB RSS left alone, 624 MB at 1 MiB, 280 MB at
/// 128 KiB. 128 KiB also maps every 256 KiB output read buffer, which cut
/// output over websocket from 600 to 244 MB/s; 1 MiB keeps 639 MB/s.
pub const MMAP_THRESHOLD_BYTES: i32 = 1024 * 1024;

/// Free memory at the top of a heap is returned to the kernel only past
/// this much. glibc's 128 KiB default (kept once the mmap threshold is
/// set) gave back the space of every freed output frame and read buffer,
/// so the next one faulted in zeroed pages again: 20% of the gateway's
/// CPU while streaming output (page faults and `clear_page` under
/// `base64_into` and pipe reads in `perf`). At most this much stays
/// mapped per arena.
pub const TRIM_THRESHOLD_BYTES: i32 = 32 * 1024 * 1024;

/// Give the heap's free memory back to the kernel (`malloc_trim`).
#[allow(unsafe_code)]
pub(crate) fn release_freed_memory() {
    // SAFETY: malloc_trim only returns free pages; any thread may call it.
    unsafe {
        libc::malloc_trim(0);
    }
}

#[allow(unsafe_code)]
fn tune_allocator() {
    // SAFETY: mallopt only changes allocator parameters; called first
    // thing, before any other thread exists.
    let ok = unsafe { libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES) };
    if ok == 0 {
        tracing::debug!("mallopt(M_MMAP_THRESHOLD) refused");
    }
    // SAFETY: as above.
    let ok = unsafe { libc::mallopt(libc::M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES) };
    if ok == 0 {
        tracing::debug!("mallopt(M_TRIM_THRESHOLD) refused");
    }
}

/// Run the parsed command.
pub fn run(cli: Cli) -> ExitCode {
    tune_allocator();
    crate::isolation::fds::close_inherited_on_exec();
    match cli.command {
        Command::Serve(args) => {
            if args
                .listen
                .as_deref()
                .is_some_and(|l| l == "stdio" || l == "stdio://")
            {
                telemetry::init(args.common.log_format);
                return run_one_session(&args.common, false);
            }
            // Logging starts in `serve`, on the runtime: the OTLP
            // exporter, when configured, runs on it.
            let format = args.common.log_format;
            if let Some(l) = &args.listen
                && let Err(e) = parse_listen(l)
            {
                return usage_error(&e);
            }
            // Every connection and process pipe is a descriptor: take all
            // the hard limit allows, then make the caps fit in it.
            let nofile = raise_nofile_limit();
            let (settings, lowered) = match serve_settings(&args, nofile) {
                Ok(s) => s,
                Err(e) => return usage_error(&e),
            };
            // Before the runtime's threads exist, so none of them has it:
            // file operations for tenants stay under their disk quotas.
            if let Err(e) = crate::isolation::caps::drop_sys_resource() {
                return usage_error(&ConfigError(format!("cannot drop CAP_SYS_RESOURCE: {e}")));
            }
            let config = args.common.config.clone();
            let reread = Box::new(move || serve_settings(&args, nofile).map(|(s, _)| s));
            block_on(serve(settings, lowered, reread, config, format))
        }
        Command::Stdio(common) => {
            telemetry::init(common.log_format);
            run_one_session(&common, false)
        }
        Command::Mcp(common) => {
            // stdout carries the protocol: logs go to stderr.
            telemetry::init_client();
            run_one_session(&common, true)
        }
        Command::Reaper => reaper::run(),
        Command::Worker(args) => crate::worker::serve::serve(args),
        Command::PidnsParent => crate::isolation::namespace::pid_parent_main(),
        Command::Token(args) => token(&args),
        Command::Executor(args) => {
            telemetry::init(args.common.log_format);
            executor::executor(&args)
        }
        Command::Exec(args) => client_runtime(remote::exec(args)),
        Command::Cp(args) => client_runtime(remote::cp(args)),
        Command::Ps(args) => client_runtime(remote::ps(args)),
        Command::Snapshot(args) => client_runtime(snapshot::snapshot(args)),
        Command::PortForward(args) => client_runtime(forward::port_forward(args)),
        Command::Audit(args) => audit::audit(&args),
    }
}

/// The client commands: a small runtime, logs to stderr at `warn` unless
/// `RUST_LOG` says otherwise; the process exits as soon as the command is
/// done (a read of stdin may still be pending).
fn client_runtime<F: std::future::Future<Output = ExitCode>>(fut: F) -> ExitCode {
    telemetry::init_client();
    let code = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => {
            let code = rt.block_on(fut);
            // A read of stdin may be blocked in a thread: do not wait for it.
            rt.shutdown_background();
            code
        }
        Err(e) => {
            eprintln!("exec-gateway: cannot start the runtime: {e}");
            ExitCode::FAILURE
        }
    };
    let _ = std::io::stdout().flush();
    code
}

fn block_on<F: std::future::Future<Output = ExitCode>>(fut: F) -> ExitCode {
    match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt.block_on(fut),
        Err(e) => {
            eprintln!("exec-gateway: cannot start the runtime: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Raise the soft `RLIMIT_NOFILE` to the hard limit; the limit in force.
/// A failure is said on stderr directly: `serve` starts its logging later,
/// on its runtime.
fn raise_nofile_limit() -> u64 {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    match getrlimit(Resource::RLIMIT_NOFILE) {
        Ok((soft, hard)) if soft < hard => match setrlimit(Resource::RLIMIT_NOFILE, hard, hard) {
            Ok(()) => hard,
            Err(e) => {
                eprintln!(
                    "exec-gateway: warning: cannot raise RLIMIT_NOFILE from {soft} to {hard}: {e}"
                );
                soft
            }
        },
        Ok((soft, _)) => soft,
        Err(e) => {
            eprintln!("exec-gateway: warning: cannot read RLIMIT_NOFILE: {e}");
            1024
        }
    }
}

async fn serve(
    settings: Settings,
    lowered: Option<String>,
    reread: reload::Reread,
    config: Option<PathBuf>,
    format: telemetry::LogFormat,
) -> ExitCode {
    if let Err(e) = telemetry::init_with(format, settings.tracing.as_ref()) {
        eprintln!("exec-gateway: {e}");
        return ExitCode::FAILURE;
    }
    let settings_grpc = settings.grpc_listen;
    let settings_admin = settings.admin_listen;
    let settings_peer = settings.fleet.as_ref().map(|f| f.listen);
    let listener = match tokio::net::TcpListener::bind(settings.listen).await {
        Ok(l) => l,
        Err(e) => {
            eprintln!("exec-gateway: cannot listen on {}: {e}", settings.listen);
            return ExitCode::FAILURE;
        }
    };
    let addr = match listener.local_addr() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("exec-gateway: {e}");
            return ExitCode::FAILURE;
        }
    };
    // TLS files that cannot be read stop the start, like any bad config.
    let tls = match ListenerTls::load(&settings) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("exec-gateway: {e}");
            return ExitCode::FAILURE;
        }
    };
    let gw = match Gateway::new(settings, start_reaper()) {
        Ok(g) => g,
        Err(e) => return usage_error(&e),
    };
    if let Some(a) = &gw.settings.audit
        && let Err(e) = crate::audit::init(
            a,
            gw.metrics.audit_events.clone(),
            gw.metrics.audit_dropped.clone(),
        )
    {
        eprintln!("exec-gateway: {e}");
        return ExitCode::FAILURE;
    }
    if let Some(w) = &gw.settings.webhooks
        && let Err(e) = crate::webhooks::init(w, gw.metrics.webhooks.clone())
    {
        eprintln!("exec-gateway: {e}");
        return ExitCode::FAILURE;
    }
    // Said once the configuration is known good (a refusal stays one line).
    if let Some(l) = lowered {
        tracing::warn!("{l}");
    }
    // What parsing and checking a large configuration left freed (10,000
    // tenants: ~20 MB) goes back to the kernel now, not at the next trim.
    release_freed_memory();
    if let Some(reload) = reload::reload_on_change(gw.clone(), reread, config) {
        crate::task::start("config-reload", reload);
    }
    let grpc = match bind_optional(settings_grpc, "gRPC").await {
        Ok(l) => l,
        Err(code) => return code,
    };
    let admin = match bind_optional(settings_admin, "admin").await {
        Ok(l) => l,
        Err(code) => return code,
    };
    let peer = match bind_optional(settings_peer, "fleet peers").await {
        Ok(l) => l,
        Err(code) => return code,
    };
    // Before anything says the gateway is up: SIGTERM/SIGINT from then on
    // shut it down gracefully.
    let stop = server::shutdown_signal();
    // The first stdout line is the bound URL (harnesses read it); the gRPC
    // address, when served, is the second; the fleet's peer listener next;
    // the admin URL, when served, last.
    let mut stdout = std::io::stdout();
    let (ws_scheme, grpc_scheme) = if tls.ws.is_some() {
        ("wss", "grpcs")
    } else {
        ("ws", "grpc")
    };
    let peer_scheme = if tls.peer.is_some() { "https" } else { "http" };
    let admin_scheme = if tls.admin.is_some() { "https" } else { "http" };
    let _ = writeln!(stdout, "{ws_scheme}://{addr}");
    if let Some(g) = grpc.as_ref().and_then(|l| l.local_addr().ok()) {
        let _ = writeln!(stdout, "{grpc_scheme}://{g}");
    }
    if let Some(p) = peer.as_ref().and_then(|l| l.local_addr().ok()) {
        let _ = writeln!(stdout, "fleet {peer_scheme}://{p}");
    }
    if let Some(a) = admin.as_ref().and_then(|l| l.local_addr().ok()) {
        let _ = writeln!(stdout, "admin {admin_scheme}://{a}");
    }
    let _ = stdout.flush();
    tracing::info!(%addr, tenants = gw.tenants.set().configured.len(), template = gw.settings.template.is_some(), "listening");
    let listeners = Listeners {
        ws: listener,
        grpc,
        admin,
        peer,
        tls,
    };
    server::run(gw, listeners, stop).await;
    // What the shutdown itself emitted (sessions closed, processes
    // killed, tenants retired) reaches the spool, to be sent next start.
    crate::webhooks::drain(std::time::Duration::from_secs(2));
    crate::audit::drain(std::time::Duration::from_secs(2));
    // The exporter's flush waits for its thread: not on a runtime thread.
    let _ = tokio::task::spawn_blocking(telemetry::shutdown_tracing).await;
    ExitCode::SUCCESS
}

/// Bind an optional listener; a failure is said on stderr.
async fn bind_optional(
    addr: Option<std::net::SocketAddr>,
    what: &str,
) -> Result<Option<tokio::net::TcpListener>, ExitCode> {
    let Some(a) = addr else { return Ok(None) };
    match tokio::net::TcpListener::bind(a).await {
        Ok(l) => Ok(Some(l)),
        Err(e) => {
            eprintln!("exec-gateway: cannot listen on {a} ({what}): {e}");
            Err(ExitCode::FAILURE)
        }
    }
}

/// `stdio` and `mcp`: one session on stdin/stdout, of a gateway built
/// from the configuration in this process, for the token in
/// EXEC_GATEWAY_TOKEN; `mcp` speaks MCP instead of exec-server JSON-RPC.
fn run_one_session(common: &CommonArgs, mcp: bool) -> ExitCode {
    let settings = match settings(
        common,
        Overrides {
            admin_listen: Some("off"),
            ..Overrides::default()
        },
    ) {
        Ok(s) => s,
        Err(e) => return usage_error(&e),
    };
    // Read, never logged; children never inherit it (their env is built).
    let token = std::env::var("EXEC_GATEWAY_TOKEN").ok();
    block_on(async move {
        // Inside the runtime: remote key sets are fetched in the background.
        let gw = match Gateway::new(settings, start_reaper()) {
            Ok(g) => g,
            Err(e) => return usage_error(&e),
        };
        if !mcp {
            server::run_stdio(gw, token, server::shutdown_signal()).await;
            return ExitCode::SUCCESS;
        }
        match server::run_mcp(gw, token, server::shutdown_signal()).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                let _ = writeln!(std::io::stderr(), "exec-gateway mcp: {e}");
                ExitCode::FAILURE
            }
        }
    })
}

fn start_reaper() -> Option<std::sync::Arc<Reaper>> {
    match Reaper::start() {
        Ok(r) => Some(std::sync::Arc::new(r)),
        Err(e) => {
            tracing::error!(error = %e, "cannot start the reaper sidecar; processes will outlive a crashed gateway");
            None
        }
    }
}

fn token(args: &TokenArgs) -> ExitCode {
    let settings = match settings(
        &args.common,
        Overrides {
            admin_listen: Some("off"),
            ..Overrides::default()
        },
    ) {
        Ok(s) => s,
        Err(e) => return usage_error(&e),
    };
    if let Some(pool) = &args.executor_pool {
        let pools = settings.executors.as_ref().map(|e| &e.pools);
        if !pools.is_some_and(|p| p.contains_key(pool)) {
            return usage_error(&ConfigError(format!(
                "unknown executor pool `{pool}`; configured: {}",
                pools
                    .map(|p| p.keys().cloned().collect::<Vec<_>>().join(", "))
                    .unwrap_or_default()
            )));
        }
    }
    if let Some(tenant) = &args.tenant
        && !settings.knows_tenant(tenant)
    {
        return usage_error(&ConfigError(format!(
            "unknown tenant `{tenant}` (and no [tenant_template] admits it); configured: {}",
            settings
                .tenants
                .keys()
                .cloned()
                .collect::<Vec<_>>()
                .join(", ")
        )));
    }
    let ttl = match humantime::parse_duration(&args.ttl) {
        Ok(t) => t,
        Err(e) => return usage_error(&ConfigError(format!("--ttl: {e}"))),
    };
    let Some((alg, secret)) = crate::auth::Authenticator::signing_secret(&settings.auth) else {
        return usage_error(&ConfigError(
            "no HS* key in the configuration to sign with; mint tokens with your identity provider"
                .to_owned(),
        ));
    };
    let scopes = if args.scopes.is_empty() {
        Scope::ALL
            .iter()
            .filter(|s| crate::auth::Scopes::DEFAULT.grants(**s))
            .map(|s| s.name().to_owned())
            .collect()
    } else {
        args.scopes.clone()
    };
    let minted = match (&args.executor_pool, &args.tenant) {
        (Some(pool), _) => {
            crate::auth::mint_executor(alg, &secret, &settings.auth, pool, ttl, &args.subject)
        }
        (None, Some(tenant)) => crate::auth::mint(
            alg,
            &secret,
            &settings.auth,
            tenant,
            &scopes,
            ttl,
            &args.subject,
        ),
        (None, None) => return usage_error(&ConfigError("--tenant is required".to_owned())),
    };
    match minted {
        Ok(t) => {
            println!("{t}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("exec-gateway: cannot mint a token: {e}");
            ExitCode::FAILURE
        }
    }
}
