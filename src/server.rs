//! Running a gateway: serve the doors until a shutdown signal, then stop in
//! one fixed order, each step bounded in time:
//!
//! 1. draining: `/readyz` turns 503, gRPC health NOT_SERVING, new sessions
//!    get the draining error; live sessions (direct or relayed through
//!    this replica) are served as before;
//! 2. running processes and relays get up to `shutdown_grace` to finish,
//!    and attached clients to have their processes' ends (a client that
//!    follows notifications is closed, 1012, once everything is queued
//!    for it: its close reply ends the wait);
//! 3. listeners stop accepting and connections close (1012, "service
//!    restart"; gRPC connections get GOAWAY);
//! 4. every remaining process is killed, backends (workers) retired, the
//!    reaper sidecar told to finish;
//! 5. `run` returns (the binary exits 0).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;

use crate::gateway::Gateway;
use crate::tls::{ALPN_H2, ALPN_HTTP1, Tls};
use crate::transport;
use crate::transport::limits::{ConnectionLimits, LimitSettings};

/// How long accept loops get to finish after the stop.
const LISTENER_STOP_TIMEOUT: Duration = Duration::from_secs(2);
/// How long connections get to send their close frames.
const CLOSE_FRAMES_GRACE: Duration = Duration::from_millis(50);

/// The bound listeners a gateway serves.
pub struct Listeners {
    /// Websocket (and HTTP health/metrics).
    pub ws: TcpListener,
    pub grpc: Option<TcpListener>,
    /// `/metrics` and the detailed `/readyz`.
    pub admin: Option<TcpListener>,
    /// The fleet's peer listener.
    pub peer: Option<TcpListener>,
    pub tls: ListenerTls,
}

/// TLS on each listener that has it.
#[derive(Default)]
pub struct ListenerTls {
    /// `[server.tls]` on the websocket and gRPC listeners.
    pub ws: Option<Arc<Tls>>,
    pub grpc: Option<Arc<Tls>>,
    /// `[server.admin_tls]`.
    pub admin: Option<Arc<Tls>>,
    /// `[fleet.tls]` on the peer listener (mutual).
    pub peer: Option<Arc<Tls>>,
}

impl ListenerTls {
    /// Read every listener's files now: files that cannot be read stop
    /// the start, like any bad configuration.
    pub fn load(s: &crate::config::Settings) -> Result<ListenerTls, String> {
        let load = |files: Option<&crate::config::TlsFiles>, alpn, what| {
            files
                .map(|f| Tls::load(f, alpn, what).map_err(|e| format!("{what}: {e}")))
                .transpose()
        };
        Ok(ListenerTls {
            ws: load(s.tls.as_ref(), ALPN_HTTP1, "server.tls")?,
            grpc: load(s.tls.as_ref(), ALPN_H2, "server.tls")?,
            admin: load(s.admin_tls.as_ref(), ALPN_HTTP1, "server.admin_tls")?,
            peer: load(
                s.fleet
                    .as_ref()
                    .and_then(|f| f.tls.as_ref())
                    .map(|t| &t.listener),
                ALPN_H2,
                "fleet.tls",
            )?,
        })
    }
}

/// Serve `listeners` until `shutdown` completes, then shut down.
pub async fn run(gw: Arc<Gateway>, listeners: Listeners, shutdown: impl Future<Output = ()>) {
    let s = &gw.settings;
    let limits = ConnectionLimits::new(
        LimitSettings {
            max_unauthenticated: s.max_unauthenticated,
            max_unauthenticated_per_source: s.max_unauthenticated_per_source,
            websocket: s.max_connections,
            grpc: s.grpc_max_connections,
            handshake_timeout: s.handshake_timeout,
        },
        gw.metrics.clone(),
    );
    let ws = crate::task::start(
        "ws-accept",
        transport::ws::serve(listeners.ws, gw.clone(), limits.clone(), listeners.tls.ws),
    );
    let grpc = listeners.grpc.map(|l| {
        crate::task::start(
            "grpc",
            transport::grpc::serve(l, gw.clone(), limits.clone(), listeners.tls.grpc),
        )
    });
    let admin_tls = listeners.tls.admin;
    let admin = listeners.admin.map(|l| {
        crate::task::start(
            "admin",
            transport::http::serve_admin(l, gw.clone(), admin_tls),
        )
    });
    let peer_tls = listeners.tls.peer;
    let peer = listeners.peer.map(|l| {
        crate::task::start(
            "peer",
            transport::fleet::peer::serve(l, gw.clone(), peer_tls),
        )
    });
    shutdown.await;
    tracing::info!("shutting down");
    shut_down(&gw, gw.settings.shutdown_grace).await;
    let _ = tokio::time::timeout(LISTENER_STOP_TIMEOUT, ws).await;
    if let Some(g) = grpc {
        let _ = tokio::time::timeout(LISTENER_STOP_TIMEOUT, g).await;
    }
    if let Some(a) = admin {
        let _ = tokio::time::timeout(LISTENER_STOP_TIMEOUT, a).await;
    }
    if let Some(p) = peer {
        let _ = tokio::time::timeout(LISTENER_STOP_TIMEOUT, p).await;
    }
    tokio::time::sleep(CLOSE_FRAMES_GRACE).await;
}

/// Serve one stdio session (token from the caller, e.g.
/// `EXEC_GATEWAY_TOKEN`; a missing or bad one fails `initialize` with
/// -32002), then stop: the session's processes end with it.
pub async fn run_stdio(
    gw: Arc<Gateway>,
    token: Option<String>,
    shutdown: impl Future<Output = ()>,
) {
    let caller = transport::authenticate::authenticate(&gw, token.as_deref()).await;
    transport::authenticate::audit_handshake(
        "stdio",
        None,
        transport::authenticate::credential_kind(token.as_deref(), None),
        &caller,
    );
    if let Err(e) = &caller {
        tracing::warn!(reason = e.outcome(), "stdio token refused");
    }
    let session =
        transport::stdio::serve(tokio::io::stdin(), tokio::io::stdout(), gw.clone(), caller);
    tokio::select! {
        () = session => {}
        () = shutdown => {}
    }
    shut_down(&gw, Duration::ZERO).await;
}

/// Serve one MCP session over stdin/stdout (`exec-gateway mcp`): the
/// token is checked first (a refused one ends the command with its
/// reason), then the session runs until its client closes it.
pub async fn run_mcp(
    gw: Arc<Gateway>,
    token: Option<String>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), String> {
    let caller = transport::authenticate::authenticate(&gw, token.as_deref()).await;
    transport::authenticate::audit_handshake(
        "mcp-stdio",
        None,
        transport::authenticate::credential_kind(token.as_deref(), None),
        &caller,
    );
    let result = match caller {
        Err(e) => Err(format!("token refused: {e}")),
        Ok(caller) => {
            let door = Arc::new(transport::mcp::door(&gw, caller));
            tokio::select! {
                r = crate::mcp::serve_stdio(door) => r,
                () = shutdown => Ok(()),
            }
        }
    };
    shut_down(&gw, Duration::ZERO).await;
    result
}

/// Serve as a remote executor until SIGTERM (then the shutdown order, as
/// for `serve`) or a registration refused for good (its error).
pub async fn run_executor(
    gw: Arc<Gateway>,
    options: transport::remote::dial::ExecutorOptions,
    token: String,
    admin: Option<(TcpListener, Option<Arc<Tls>>)>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), transport::remote::dial::Fatal> {
    let admin = admin.map(|(l, tls)| {
        crate::task::start("admin", transport::http::serve_admin(l, gw.clone(), tls))
    });
    let result = tokio::select! {
        r = transport::remote::dial::run(gw.clone(), options, token) => r,
        () = shutdown => Ok(()),
    };
    tracing::info!("shutting down");
    shut_down(&gw, gw.settings.shutdown_grace).await;
    if let Some(a) = admin {
        let _ = tokio::time::timeout(LISTENER_STOP_TIMEOUT, a).await;
    }
    result
}

/// Steps 1–4 of the shutdown order.
async fn shut_down(gw: &Gateway, grace: Duration) {
    gw.start_draining();
    let deadline = tokio::time::Instant::now() + grace;
    // Live work: processes here (and closes no attached client has had
    // yet), sessions served through relays from here (their processes run
    // on other replicas), and calls being answered (a long-poll read that
    // the last output woke): none of it is cut off by the stop.
    while (gw.sessions.live_processes() > 0
        || gw.live_relays() > 0
        || gw.metrics.calls_in_flight.get() > 0)
        && tokio::time::Instant::now() < deadline
    {
        // A client that follows notifications is told to reconnect once
        // it has been sent everything of its session (no call being
        // answered could then be cut off): its close reply proves it read
        // it all, and the drain need not wait the grace for it.
        if gw.metrics.calls_in_flight.get() == 0 {
            gw.sessions.close_delivered_clients(
                transport::connection::SHUTDOWN_CLOSE_CODE,
                "server shutting down",
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    gw.stop();
}

/// Completes on SIGTERM or SIGINT. The handlers are installed when this is
/// called, not when the future is first polled: a signal that arrives
/// after the gateway printed its URL must stop it gracefully, never kill it
/// with the default action.
pub fn shutdown_signal() -> impl std::future::Future<Output = ()> {
    use tokio::signal::unix::{SignalKind, signal};
    let handlers = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    );
    async move {
        let (Ok(mut term), Ok(mut int)) = handlers else {
            tracing::error!("cannot install signal handlers; only EOF/kill will stop the gateway");
            return std::future::pending().await;
        };
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
    }
}
