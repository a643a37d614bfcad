//! A server under test (the gateway, or the reference) as a child process,
//! its URLs read from what it prints, and its resident memory.

use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt as _, BufReader};
use tokio::process::{Child, Command};

use super::{BenchResult, err, http_get};

/// A server under test, started as a child process.
pub(crate) struct Server {
    pub(crate) child: Child,
    pub(crate) url: String,
    /// `http://HOST:PORT` when the server printed a `grpc://` second line.
    pub(crate) grpc: Option<String>,
    /// `HOST:PORT` of the admin listener, when started with one.
    pub(crate) admin: Option<String>,
}

impl Server {
    /// The gateway with every door on loopback (ws, gRPC, admin) and `config`.
    pub(crate) async fn gateway(exe: &std::path::Path, config: &str) -> BenchResult<Server> {
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

    /// Its log is dropped unless `EXEC_GATEWAY_BENCH_LOG` is set (then it
    /// goes to the bench's stderr: the VM lane sets it, where a refused
    /// configuration cannot be rerun by hand).
    pub(crate) async fn start(program: &std::path::Path, args: &[&str]) -> BenchResult<Server> {
        let log = if std::env::var_os("EXEC_GATEWAY_BENCH_LOG").is_some() {
            Stdio::inherit()
        } else {
            Stdio::null()
        };
        Self::start_logged(program, args, log).await
    }

    /// [`Server::start`] with the server's log (stderr) sent to `log`.
    pub(crate) async fn start_logged(
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

    pub(crate) fn rss_kib(&self) -> u64 {
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

/// The isolation report of a gateway started with an admin listener.
pub(crate) async fn readyz(server: &Server) -> BenchResult<String> {
    let admin = server.admin.as_deref().ok_or("no admin listener")?;
    http_get(admin, "/readyz").await
}
