//! The reliability soak's chaos: what it breaks, and the log of when.
//!
//! - `worker`: a tenant's workers killed (-9) on one replica;
//! - `cut`: every client connection through the soak's TCP proxy reset at
//!   once (the clients resume);
//! - `stall`: a client that starts a large output and stops reading;
//! - `replica` (fleet): a replica killed (-9), restarted 3 s later;
//! - `drain` (fleet): a replica sent SIGTERM, restarted once it exits.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

use super::super::harness::{BenchResult, Conn, err};
use super::cluster::Cluster;
use super::workload::{Kind, Record, Records};

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
pub enum Chaos {
    Worker,
    Cut,
    Stall,
    Replica,
    Drain,
}

impl Chaos {
    pub fn name(self) -> &'static str {
        match self {
            Chaos::Worker => "worker killed",
            Chaos::Cut => "connections cut",
            Chaos::Stall => "client stalled",
            Chaos::Replica => "replica killed",
            Chaos::Drain => "replica drained",
        }
    }

    pub fn parse(s: &str) -> BenchResult<Chaos> {
        Ok(match s {
            "worker" => Chaos::Worker,
            "cut" => Chaos::Cut,
            "stall" => Chaos::Stall,
            "replica" => Chaos::Replica,
            "drain" => Chaos::Drain,
            other => {
                return Err(format!(
                    "unknown chaos `{other}` (worker, cut, stall, replica, drain)"
                ));
            }
        })
    }
}

/// One act of chaos: what, on whom (a tenant or a replica), and the time
/// its effects are allowed to show (from `at` to `until`).
#[derive(Debug, Clone)]
pub struct Event {
    pub chaos: Chaos,
    pub target: String,
    pub at: Instant,
    pub until: Instant,
    /// What it did ("killed 1 worker", "reset 12 connections", ...).
    pub detail: String,
}

pub type Log = Arc<Mutex<Vec<Event>>>;

/// A TCP proxy in front of the gateway (or the balancer) that can reset
/// every connection it carries at once.
pub struct Cutter {
    pub addr: SocketAddr,
    cut: watch::Sender<u64>,
    live: Arc<std::sync::atomic::AtomicU64>,
}

impl Cutter {
    pub async fn start(upstream: String) -> BenchResult<Cutter> {
        let listener = TcpListener::bind("127.0.0.1:0").await.map_err(err)?;
        let addr = listener.local_addr().map_err(err)?;
        let (cut, _) = watch::channel(0u64);
        let live = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let (tx, l) = (cut.clone(), live.clone());
        exec_gateway::task::start("soak-cutter", async move {
            while let Ok((client, _)) = listener.accept().await {
                let mut rx = tx.subscribe();
                let up = upstream.clone();
                let live = l.clone();
                exec_gateway::task::start("soak-cutter-conn", async move {
                    let Ok(server) = TcpStream::connect(&up).await else {
                        return;
                    };
                    let (mut client, mut server) = (client, server);
                    let _ = client.set_nodelay(true);
                    let _ = server.set_nodelay(true);
                    live.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut client, &mut server) => {}
                        _ = rx.changed() => {
                            // A reset, as a lost network path looks to both ends.
                            reset_on_close(&client);
                            reset_on_close(&server);
                        }
                    }
                    live.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
                });
            }
        });
        Ok(Cutter { addr, cut, live })
    }

    /// Reset every connection; how many there were.
    pub fn cut(&self) -> u64 {
        let n = self.live.load(std::sync::atomic::Ordering::Relaxed);
        self.cut.send_modify(|g| *g += 1);
        n
    }
}

/// Linger 0: closing the socket sends a reset, not a FIN (and does not
/// block: nothing is waited for).
fn reset_on_close(s: &TcpStream) {
    let linger = nix::libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    let _ = nix::sys::socket::setsockopt(s, nix::sys::socket::sockopt::Linger, &linger);
}

fn parent_of(pid: i32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, rest) = stat.rsplit_once(')')?;
    rest.split_whitespace().nth(1)?.parse().ok()
}

/// Kill (-9) the workers of `tenant` that `gateway` started; how many.
pub fn kill_workers(gateway: u32, tenant: &str) -> usize {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return 0;
    };
    let mut killed = 0;
    for entry in dir.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<i32>().ok())
        else {
            continue;
        };
        // The worker is the gateway's child, or its grandchild under a
        // pid namespace's init.
        let parent = parent_of(pid);
        if parent != Some(gateway) && parent.and_then(|p| parent_of(p as i32)) != Some(gateway) {
            continue;
        }
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
        let is_worker = args.windows(3).any(|w| {
            w[0] == b"worker".as_slice()
                && w[1] == b"--tenant".as_slice()
                && w[2] == tenant.as_bytes()
        });
        if is_worker
            && nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            )
            .is_ok()
        {
            killed += 1;
        }
    }
    killed
}

/// A client of `tenant` that starts 256 MiB of output and never reads it:
/// the gateway must cut it loose (`server.slow_client_timeout`) and go on
/// serving everyone else. Recorded as a [`Kind::Stalled`] operation that
/// fails only when the gateway kept it.
pub async fn stall(
    url: String,
    tenant: &'static str,
    cwd: String,
    hold: Duration,
    records: Records,
) {
    let started = Instant::now();
    let result = async {
        let mut c = Conn::open(&url).await?;
        c.call(
            "process/start",
            serde_json::json!({"processId": "stalled", "argv": ["head", "-c", "268435456", "/dev/zero"],
                   "cwd": cwd, "env": {"PATH": "/usr/bin:/bin"}, "tty": false}),
        )
        .await?;
        tokio::time::sleep(hold).await;
        // Now read: a connection the gateway cut ends; one it kept goes on.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        let mut frames = 0u64;
        loop {
            match tokio::time::timeout_at(deadline, c.next_text()).await {
                Ok(Ok(_)) => frames += 1,
                Ok(Err(_)) => return Ok(()),
                Err(_) => break,
            }
        }
        Err(format!(
            "the gateway kept a client that read nothing for {}s ({frames} frames were still coming)",
            hold.as_secs()
        ))
    }
    .await;
    records.lock().push(Record {
        kind: Kind::Stalled,
        tenant,
        door: "ws",
        owner: None,
        session_created: started,
        started,
        ended: Instant::now(),
        error: result.err(),
    });
}

/// Kill a replica (-9) and start it again after `down`.
pub async fn kill_replica(cluster: &Cluster, i: usize, down: Duration) -> String {
    let killed = cluster.kill(i).await;
    tokio::time::sleep(down).await;
    match cluster.respawn(i).await {
        Ok(()) => format!("killed (was running: {killed}), restarted"),
        Err(e) => format!("killed (was running: {killed}), restart failed: {e}"),
    }
}

/// SIGTERM a replica, wait for it to exit, start it again.
pub async fn drain_replica(cluster: &Cluster, i: usize, within: Duration) -> String {
    let outcome = cluster.drain(i, within).await;
    match cluster.respawn(i).await {
        Ok(()) => format!("{outcome}, restarted"),
        Err(e) => format!("{outcome}, restart failed: {e}"),
    }
}
