//! The gateways under soak: one, or a fleet of three behind HAProxy with
//! the shipped configuration (`deploy/lb/haproxy.cfg`, its addresses
//! rewritten to loopback). Replicas keep their ports across restarts, so
//! the balancer finds them again.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use tokio::process::{Child, Command};

use super::super::harness::{BenchResult, Server, err};

/// Ports below the ephemeral range (so no outgoing connection takes one
/// while its replica is down), free when chosen.
pub fn free_port() -> BenchResult<u16> {
    let start = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32768);
    let (low, high) = (10_000u16, start.max(10_001));
    for _ in 0..1000 {
        let mut b = [0u8; 2];
        getrandom::fill(&mut b).map_err(err)?;
        let port = low + u16::from_le_bytes(b) % (high - low);
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return Ok(port);
        }
    }
    Err("no free port".to_owned())
}

pub struct Replica {
    pub id: String,
    pub ws: u16,
    pub grpc: u16,
    args: Vec<String>,
    log: PathBuf,
    child: tokio::sync::Mutex<Option<Child>>,
    pid: AtomicU32,
}

pub struct Cluster {
    exe: PathBuf,
    pub replicas: Vec<Replica>,
    balancer: Option<Child>,
    /// `HOST:PORT` clients connect to: the balancer's, or the gateway's.
    pub ws_entry: String,
    pub grpc_entry: String,
}

impl Cluster {
    /// `n` replicas with `config` (fleet mode when `n > 1`, behind HAProxy).
    pub async fn start(exe: &Path, dir: &Path, config: &str, n: usize) -> BenchResult<Cluster> {
        let mut replicas = Vec::new();
        let mut peers = String::new();
        let mut fleet_ports = Vec::new();
        for i in 0..n {
            let p = free_port()?;
            fleet_ports.push(p);
            peers.push_str(&format!("gw-{i} = \"127.0.0.1:{p}\"\n"));
        }
        let config_path = dir.join("soak-cluster.toml");
        let mut text = config.to_owned();
        if n > 1 {
            let key = dir.join("soak-fleet.key");
            std::fs::write(&key, pattern_key()).map_err(err)?;
            text.push_str(&format!(
                "\n[fleet]\nkey_file = \"{}\"\n[fleet.peers]\n{peers}",
                key.display()
            ));
        }
        std::fs::write(&config_path, text).map_err(err)?;
        let config_s = config_path.display().to_string();
        for (i, fleet_port) in fleet_ports.iter().enumerate() {
            let (ws, grpc, admin) = (free_port()?, free_port()?, free_port()?);
            let mut args: Vec<String> = [
                "serve",
                "--listen",
                &format!("ws://127.0.0.1:{ws}"),
                "--grpc-listen",
                &format!("127.0.0.1:{grpc}"),
                "--admin-listen",
                &format!("127.0.0.1:{admin}"),
                "--config",
                &config_s,
            ]
            .iter()
            .map(|s| s.to_string())
            .collect();
            if n > 1 {
                args.extend([
                    "--replica".to_owned(),
                    format!("gw-{i}"),
                    "--fleet-listen".to_owned(),
                    format!("127.0.0.1:{fleet_port}"),
                ]);
            }
            replicas.push(Replica {
                id: format!("gw-{i}"),
                ws,
                grpc,
                args,
                log: dir.join(format!("gw-{i}.log")),
                child: tokio::sync::Mutex::new(None),
                pid: AtomicU32::new(0),
            });
        }
        let mut cluster = Cluster {
            exe: exe.to_owned(),
            ws_entry: format!("127.0.0.1:{}", replicas[0].ws),
            grpc_entry: format!("127.0.0.1:{}", replicas[0].grpc),
            replicas,
            balancer: None,
        };
        for i in 0..n {
            cluster.respawn(i).await?;
        }
        if n > 1 {
            cluster.start_haproxy(dir).await?;
        }
        Ok(cluster)
    }

    async fn start_haproxy(&mut self, dir: &Path) -> BenchResult<()> {
        let bin = ["/usr/sbin/haproxy", "/usr/bin/haproxy"]
            .into_iter()
            .find(|p| Path::new(p).exists())
            .ok_or("fleet mode needs haproxy (apt-get install haproxy)")?;
        let shipped = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/lb/haproxy.cfg");
        let mut text = std::fs::read_to_string(&shipped).map_err(err)?;
        let (ws, grpc) = (free_port()?, free_port()?);
        for r in &self.replicas {
            let host = format!("{}.example.internal", r.id);
            text = text
                .replace(&format!("{host}:8765"), &format!("127.0.0.1:{}", r.ws))
                .replace(&format!("{host}:50051"), &format!("127.0.0.1:{}", r.grpc));
        }
        text = text
            .replace("bind :8080", &format!("bind 127.0.0.1:{ws}"))
            .replace("bind :8081", &format!("bind 127.0.0.1:{grpc}"));
        let conf = dir.join("haproxy.cfg");
        std::fs::write(&conf, text).map_err(err)?;
        let log = std::fs::File::create(dir.join("haproxy.log")).map_err(err)?;
        self.balancer = Some(
            Command::new(bin)
                .args(["-db", "-f"])
                .arg(&conf)
                .stdout(log)
                .stderr(Stdio::null())
                .kill_on_drop(true)
                .spawn()
                .map_err(err)?,
        );
        self.ws_entry = format!("127.0.0.1:{ws}");
        self.grpc_entry = format!("127.0.0.1:{grpc}");
        for _ in 0..100 {
            if tokio::net::TcpStream::connect(&self.ws_entry).await.is_ok() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        // Health checks mark every replica up (rise 2, inter 1s).
        tokio::time::sleep(Duration::from_millis(2500)).await;
        Ok(())
    }

    /// The running process of replica `i`, if any.
    pub fn pid(&self, i: usize) -> Option<u32> {
        match self.replicas[i].pid.load(Ordering::Relaxed) {
            0 => None,
            p => Some(p),
        }
    }

    /// Start replica `i` (again) on its ports.
    pub async fn respawn(&self, i: usize) -> BenchResult<()> {
        let r = &self.replicas[i];
        let args: Vec<&str> = r.args.iter().map(String::as_str).collect();
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&r.log)
            .map_err(err)?;
        // The ports were just released by the previous run: retry a while.
        let mut last = String::new();
        for _ in 0..50 {
            match Server::start_logged(&self.exe, &args, Stdio::from(log.try_clone().map_err(err)?))
                .await
            {
                Ok(server) => {
                    r.pid
                        .store(server.child.id().unwrap_or(0), Ordering::Relaxed);
                    *r.child.lock().await = Some(server.child);
                    return Ok(());
                }
                Err(e) => {
                    last = e;
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
        Err(format!("{}: {last}", r.id))
    }

    /// SIGKILL replica `i` and reap it; whether it was running.
    pub async fn kill(&self, i: usize) -> bool {
        let r = &self.replicas[i];
        let mut child = r.child.lock().await;
        r.pid.store(0, Ordering::Relaxed);
        match child.take() {
            Some(mut c) => {
                let _ = c.start_kill();
                let _ = c.wait().await;
                true
            }
            None => false,
        }
    }

    /// SIGTERM replica `i` and wait up to `within` for it to exit; its exit
    /// status, or what happened instead.
    pub async fn drain(&self, i: usize, within: Duration) -> String {
        let r = &self.replicas[i];
        let mut guard = r.child.lock().await;
        let Some(mut c) = guard.take() else {
            return "was not running".to_owned();
        };
        if let Some(pid) = c.id() {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid as i32),
                nix::sys::signal::Signal::SIGTERM,
            );
        }
        let outcome = match tokio::time::timeout(within, c.wait()).await {
            Ok(Ok(status)) => format!("exited {status}"),
            Ok(Err(e)) => format!("wait failed: {e}"),
            Err(_) => {
                let _ = c.start_kill();
                let _ = c.wait().await;
                format!("still running after {}s: killed", within.as_secs())
            }
        };
        r.pid.store(0, Ordering::Relaxed);
        outcome
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if let Some(b) = self.balancer.as_mut() {
            let _ = b.start_kill();
        }
    }
}

/// The shared fleet key (64 bytes; the soak's own).
fn pattern_key() -> String {
    (0..64)
        .map(|i| char::from(b'a' + (i * 5 % 26) as u8))
        .collect()
}
