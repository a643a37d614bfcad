//! Wires settings, sessions, the stack and the listeners; orders shutdown.
//!
//! Shutdown (STYLE.md §B9), each step bounded in time:
//! 1. the shutdown future fires: `/readyz` turns 503, new sessions and new
//!    requests get the draining error;
//! 2. running processes get up to `shutdown_grace` to finish;
//! 3. listeners stop accepting, connections are closed with 1001;
//! 4. every remaining process group is killed;
//! 5. `run` returns and the binary exits 0.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::config::{ConfigError, Settings};
use crate::exec::ExecSettings;
use crate::exec::reaper::Reaper;
use crate::fs::FsRoot;
use crate::middleware::{self, RpcService, StackSettings};
use crate::session::SessionRegistry;

/// Shared state of one gateway process.
pub struct Gateway {
    pub settings: Arc<Settings>,
    pub sessions: Arc<SessionRegistry>,
    pub stack: RpcService,
    /// Cancelled when listeners must stop and connections close.
    pub stopped: CancellationToken,
    draining: AtomicBool,
    reaper: Option<Arc<Reaper>>,
}

impl Gateway {
    pub fn new(
        settings: Settings,
        reaper: Option<Arc<Reaper>>,
    ) -> Result<Arc<Gateway>, ConfigError> {
        let fs = match &settings.root {
            None => FsRoot::Host,
            Some(root) => FsRoot::confined(root)
                .map_err(|e| ConfigError(format!("cannot open root {}: {e}", root.display())))?,
        };
        let mut exec = ExecSettings::new(settings.max_processes, settings.base_env.clone());
        exec.reaper = reaper.clone();
        exec.exited_retention = settings.exited_retention;
        let exec = Arc::new(exec);
        let sessions = SessionRegistry::new(
            settings.detach_ttl,
            settings.max_sessions,
            exec,
            Arc::new(fs),
        );
        let stack = middleware::stack(&StackSettings {
            max_in_flight: settings.max_in_flight,
            request_timeout: settings.request_timeout,
        });
        Ok(Arc::new(Gateway {
            settings: Arc::new(settings),
            sessions,
            stack,
            stopped: CancellationToken::new(),
            draining: AtomicBool::new(false),
            reaper,
        }))
    }

    pub fn draining(&self) -> bool {
        self.draining.load(Ordering::Relaxed)
    }

    /// Prometheus text exposition.
    pub fn metrics_text(&self) -> String {
        format!(
            "# HELP exec_gateway_sessions Sessions in the registry.\n\
             # TYPE exec_gateway_sessions gauge\n\
             exec_gateway_sessions {}\n\
             # HELP exec_gateway_processes_running Processes not yet closed.\n\
             # TYPE exec_gateway_processes_running gauge\n\
             exec_gateway_processes_running {}\n\
             # HELP exec_gateway_draining 1 while shutting down.\n\
             # TYPE exec_gateway_draining gauge\n\
             exec_gateway_draining {}\n",
            self.sessions.len(),
            self.sessions.live_processes(),
            u8::from(self.draining()),
        )
    }

    /// Steps 1–4 of the shutdown order.
    pub async fn shut_down(&self) {
        self.draining.store(true, Ordering::Relaxed);
        let grace = self.settings.shutdown_grace;
        let deadline = tokio::time::Instant::now() + grace;
        while self.sessions.live_processes() > 0 && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        self.stopped.cancel();
        self.sessions.kill_all();
        self.stop_reaper();
    }

    /// Close the reaper's pipe: it kills whatever is still registered.
    fn stop_reaper(&self) {
        if let Some(r) = &self.reaper {
            r.stop();
        }
    }
}

/// Serve websocket/HTTP on `listener` until `shutdown` completes, then shut down.
pub async fn run_ws(gw: Arc<Gateway>, listener: TcpListener, shutdown: impl Future<Output = ()>) {
    let server = crate::task::spawn(
        "ws-accept",
        crate::transport::ws::serve(listener, gw.clone()),
    );
    shutdown.await;
    tracing::info!("shutting down");
    gw.shut_down().await;
    let _ = tokio::time::timeout(Duration::from_secs(2), server).await;
    // Let connection tasks send their close frames.
    tokio::time::sleep(Duration::from_millis(50)).await;
}

/// Serve one stdio session, then kill what it left.
pub async fn run_stdio(gw: Arc<Gateway>, shutdown: impl Future<Output = ()>) {
    let session =
        crate::transport::stdio::serve(tokio::io::stdin(), tokio::io::stdout(), gw.clone());
    tokio::select! {
        () = session => {}
        () = shutdown => {}
    }
    gw.draining.store(true, Ordering::Relaxed);
    gw.stopped.cancel();
    gw.sessions.kill_all();
    gw.stop_reaper();
}

/// Completes on SIGTERM or SIGINT.
pub async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        tracing::error!("cannot install signal handlers; only EOF/kill will stop the gateway");
        return std::future::pending().await;
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
}
