//! `exec-gateway-bench --soak DURATION --reliability`: a mixed workload
//! over both doors, in several tenants, on one gateway or a fleet of three
//! behind HAProxy, while chaos runs on a schedule. Every operation's
//! outcome is classified: succeeded; failed as the docs promise for the
//! chaos that caused it (the killed worker's tenant's processes, the
//! killed or drained replica's own sessions, the stalled client itself);
//! or unexpected. Everything else must lose nothing: each operation checks
//! its output byte for byte, in seq order.
//!
//! The first phase (`--soak-baseline`) runs without chaos: the victims'
//! unloaded latencies. Exits non-zero when anything was unexpected.

mod chaos;
mod cluster;
mod report;
mod workload;

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::harness::{BenchResult, err};
pub use chaos::Chaos;
use chaos::{Cutter, Event, Log};
use cluster::Cluster;
use workload::{Loop, Records};

/// Tenants, each with a websocket loop and a gRPC loop. The workers of
/// [`WORKER_VICTIM`] are the ones killed; [`STALLER`] also runs the stalled
/// client. The others are the untouched victims whose latencies are
/// compared with the baseline.
const TENANTS: [&str; 3] = ["t-a", "t-b", "t-c"];
const WORKER_VICTIM: &str = "t-c";
const STALLER: &str = "t-a";
/// How long the stalled client reads nothing (past the slow-client
/// timeout below).
const STALL_FOR: Duration = Duration::from_secs(8);
const SLOW_CLIENT_TIMEOUT: &str = "4s";
const SHUTDOWN_GRACE: Duration = Duration::from_secs(6);
/// How long a replica stays dead before it is restarted.
const REPLICA_DOWN: Duration = Duration::from_secs(3);
/// After a worker is killed, the tenant's operations that overlap this
/// window may fail (the processes it had spawned were killed with it).
const WORKER_WINDOW: Duration = Duration::from_secs(2);

/// Settings of one reliability soak.
pub struct ReliabilityArgs {
    pub duration: Duration,
    pub baseline: Duration,
    /// 1: one gateway; 3: a fleet behind HAProxy.
    pub replicas: usize,
    pub chaos: Vec<Chaos>,
    /// Time between two acts of chaos.
    pub interval: Duration,
    pub json: bool,
}

/// One sample of a replica's resources.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Sample {
    pub second: u64,
    pub replica: String,
    pub rss_kib: u64,
    pub fds: u64,
}

pub async fn run(exe: &Path, dir: &Path, args: ReliabilityArgs) -> BenchResult<()> {
    if args.replicas > 1 && !has_haproxy() {
        return Err("fleet mode needs haproxy (apt-get install haproxy)".to_owned());
    }
    if args.replicas == 1
        && args
            .chaos
            .iter()
            .any(|c| matches!(c, Chaos::Replica | Chaos::Drain))
    {
        return Err("replica and drain chaos need a fleet (--soak-replicas 3)".to_owned());
    }
    let key = dir.join("reliability.key");
    let secret: String = (0..64)
        .map(|i| char::from(b'a' + (i * 13 % 26) as u8))
        .collect();
    std::fs::write(&key, &secret).map_err(err)?;
    let mut config = format!(
        "[server]\nslow_client_timeout = \"{SLOW_CLIENT_TIMEOUT}\"\nshutdown_grace = \"{}s\"\n\
         [[auth.keys]]\nalgorithm = \"HS256\"\nsecret_file = \"{}\"\n",
        SHUTDOWN_GRACE.as_secs(),
        key.display()
    );
    for t in TENANTS {
        // Every isolation layer at its default (a root of its own); no
        // request-rate quota, which would only measure the quota.
        let root = dir.join(t);
        std::fs::create_dir_all(&root).map_err(err)?;
        config.push_str(&format!(
            "[tenants.{t}]\nroot = \"{}\"\nrequests_per_second = 100000\nburst = 100000\n",
            root.display()
        ));
    }
    let base = dir.join("reliability.toml");
    std::fs::write(&base, &config).map_err(err)?;
    let settings = exec_gateway::config::Config::load(&base)
        .and_then(exec_gateway::config::Config::validate)
        .map_err(err)?;
    let cluster = Arc::new(Cluster::start(exe, dir, &config, args.replicas).await?);
    let ws_cut = Cutter::start(cluster.ws_entry.clone()).await?;
    let grpc_cut = Cutter::start(cluster.grpc_entry.clone()).await?;
    let mut tokens = Vec::new();
    for t in TENANTS {
        let token = super::harness::all_scopes_token(
            &secret,
            &settings,
            t,
            Duration::from_secs(24 * 3600),
            "reliability",
        )?;
        tokens.push((t, token));
    }
    let records: Records = Arc::default();
    let log: Log = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let mut loops = Vec::new();
    for (t, token) in &tokens {
        for (door, url) in [
            ("ws", format!("ws://{}", ws_cut.addr)),
            ("grpc", format!("grpc://{}", grpc_cut.addr)),
        ] {
            let l = Loop {
                tenant: t,
                door,
                url,
                token: token.clone(),
                id: loops.len(),
            };
            loops.push(exec_gateway::task::start(
                "soak-loop",
                workload::run(l, stop.clone(), records.clone()),
            ));
        }
    }
    let samples: Arc<Mutex<Vec<Sample>>> = Arc::default();
    let begun = Instant::now();
    let sampler = {
        let (cluster, samples, stop) = (cluster.clone(), samples.clone(), stop.clone());
        exec_gateway::task::start("soak-sampler", async move {
            while !stop.load(Ordering::Relaxed) {
                for (i, r) in cluster.replicas.iter().enumerate() {
                    if let Some(pid) = cluster.pid(i) {
                        samples.lock().push(Sample {
                            second: begun.elapsed().as_secs(),
                            replica: r.id.clone(),
                            rss_kib: super::soak::proc_status_kib(pid, "VmRSS:"),
                            fds: super::soak::fd_count(pid),
                        });
                    }
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        })
    };
    eprintln!(
        "reliability soak: {} replica(s), tenants {TENANTS:?}, {} loops; baseline {}s, then {}s with chaos {:?} every {}s",
        args.replicas,
        loops.len(),
        args.baseline.as_secs(),
        args.duration.as_secs(),
        args.chaos.iter().map(|c| c.name()).collect::<Vec<_>>(),
        args.interval.as_secs()
    );
    tokio::time::sleep(args.baseline).await;
    let chaos_start = Instant::now();
    let chaos_end = chaos_start + args.duration;
    let staller_token = tokens
        .iter()
        .find(|(t, _)| *t == STALLER)
        .map(|(_, k)| k.clone())
        .unwrap_or_default();
    let mut turn = 0usize;
    let mut stalls = Vec::new();
    while !args.chaos.is_empty() {
        let next = Instant::now() + args.interval;
        // No new chaos in the last interval: its effects get time to end.
        if next + args.interval > chaos_end {
            break;
        }
        tokio::time::sleep_until(next.into()).await;
        let chaos = args.chaos[turn % args.chaos.len()];
        let i = (turn / args.chaos.len()) % args.replicas;
        turn += 1;
        let at = Instant::now();
        let (target, detail) = match chaos {
            Chaos::Worker => {
                let n = cluster
                    .pid(i)
                    .map_or(0, |pid| chaos::kill_workers(pid, WORKER_VICTIM));
                (
                    WORKER_VICTIM.to_owned(),
                    format!("{n} worker(s) killed on gw-{i}"),
                )
            }
            Chaos::Cut => (
                "every client".to_owned(),
                format!("{} connections reset", ws_cut.cut() + grpc_cut.cut()),
            ),
            Chaos::Stall => {
                let url = format!(
                    "ws://127.0.0.1:{}/?access_token={staller_token}",
                    cluster.replicas[i].ws
                );
                stalls.push(exec_gateway::task::start(
                    "soak-stall",
                    chaos::stall(
                        url,
                        STALLER,
                        dir.join(STALLER).display().to_string(),
                        STALL_FOR,
                        records.clone(),
                    ),
                ));
                (
                    STALLER.to_owned(),
                    format!("a client on gw-{i} stopped reading"),
                )
            }
            Chaos::Replica => (
                cluster.replicas[i].id.clone(),
                chaos::kill_replica(&cluster, i, REPLICA_DOWN).await,
            ),
            Chaos::Drain => (
                cluster.replicas[i].id.clone(),
                chaos::drain_replica(&cluster, i, SHUTDOWN_GRACE + Duration::from_secs(20)).await,
            ),
        };
        let until = Instant::now()
            + match chaos {
                Chaos::Worker => WORKER_WINDOW,
                _ => Duration::ZERO,
            };
        eprintln!(
            "[{:>5}s] {}: {target}: {detail}",
            (at - begun).as_secs(),
            chaos.name()
        );
        log.lock().push(Event {
            chaos,
            target,
            at,
            until,
            detail,
        });
    }
    tokio::time::sleep_until(chaos_end.into()).await;
    stop.store(true, Ordering::Relaxed);
    for l in loops {
        let _ = tokio::time::timeout(Duration::from_secs(90), l).await;
    }
    for s in stalls {
        let _ = tokio::time::timeout(Duration::from_secs(60), s).await;
    }
    let _ = sampler.await;
    let records = std::mem::take(&mut *records.lock());
    let log = std::mem::take(&mut *log.lock());
    let samples = std::mem::take(&mut *samples.lock());
    let summary = report::Summary::new(
        &records,
        &log,
        &samples,
        report::Setting {
            begun,
            chaos_start,
            replicas: args.replicas,
            untouched: TENANTS
                .iter()
                .copied()
                .filter(|t| *t != WORKER_VICTIM)
                .collect(),
        },
    );
    summary.print();
    if args.json {
        println!("{}", serde_json::to_string(&summary).map_err(err)?);
    }
    drop(cluster);
    if summary.unexpected > 0 {
        return Err(format!("{} unexpected failures", summary.unexpected));
    }
    Ok(())
}

fn has_haproxy() -> bool {
    ["/usr/sbin/haproxy", "/usr/bin/haproxy"]
        .iter()
        .any(|p| Path::new(p).exists())
}
