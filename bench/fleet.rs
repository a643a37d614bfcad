//! The relay's cost: the same session reached through its owner and
//! through another replica, side by side in one run.

use std::path::Path;
use std::time::{Duration, Instant};

use super::harness::{BenchResult, Conn, Row, Server, err, ms, percentile};

/// Two replicas (`gw-0`, `gw-1`) on loopback with `config` plus a fleet
/// section; rows for `true` p50 and output throughput, relayed vs owner.
pub async fn figures(
    exe: &Path,
    dir: &Path,
    config: &str,
    token: &str,
    iterations: usize,
    output_bytes: u64,
) -> BenchResult<Vec<Row>> {
    let key = dir.join("fleet.key");
    std::fs::write(&key, "f".repeat(64)).map_err(err)?;
    let ports: Vec<u16> = (0..2)
        .map(|_| {
            std::net::TcpListener::bind("127.0.0.1:0")
                .and_then(|l| l.local_addr())
                .map(|a| a.port())
                .map_err(err)
        })
        .collect::<BenchResult<_>>()?;
    let text = std::fs::read_to_string(config).map_err(err)?;
    let fleet_config = dir.join("fleet.toml");
    std::fs::write(
        &fleet_config,
        format!(
            "{text}\n[fleet]\nkey_file = \"{}\"\n[fleet.peers]\ngw-0 = \"127.0.0.1:{}\"\ngw-1 = \"127.0.0.1:{}\"\n",
            key.display(),
            ports[0],
            ports[1]
        ),
    )
    .map_err(err)?;
    let cfg = fleet_config.display().to_string();
    let mut replicas = Vec::new();
    for (i, port) in ports.iter().enumerate() {
        let replica = format!("gw-{i}");
        let peer = format!("127.0.0.1:{port}");
        replicas.push(
            Server::start(
                exe,
                &[
                    "serve",
                    "--listen",
                    "ws://127.0.0.1:0",
                    "--config",
                    &cfg,
                    "--admin-listen",
                    "off",
                    "--replica",
                    &replica,
                    "--fleet-listen",
                    &peer,
                ],
            )
            .await?,
        );
    }
    let url = |i: usize| format!("{}/?access_token={token}", replicas[i].url);
    // One session on gw-0, used directly and through gw-1.
    let sid = Conn::open(&url(0)).await?.session_id;
    let mut owner = Conn::resume(&url(0), &sid).await?;
    let (owner_p50, relay_p50) = {
        let a = latency(&mut owner, "owner", iterations).await?;
        drop(owner);
        let mut relayed = Conn::resume(&url(1), &sid).await?;
        let b = latency(&mut relayed, "relayed", iterations).await?;
        drop(relayed);
        // And the owner again, so drift on the host shows.
        let mut owner = Conn::resume(&url(0), &sid).await?;
        let a2 = latency(&mut owner, "owner-again", iterations).await?;
        (a.min(a2), b)
    };
    let owner_mbs = throughput(&url(0), &sid, "big-owner", output_bytes).await?;
    let cpu = |i: usize| replicas[i].child.id().map(cpu_seconds).unwrap_or(0.0);
    let (owner_before, relay_before) = (cpu(0), cpu(1));
    let relay_mbs = throughput(&url(1), &sid, "big-relayed", output_bytes).await?;
    let gib = output_bytes as f64 / (1u64 << 30) as f64;
    eprintln!(
        "(relayed output: the owner spent {:.2} CPU s per GiB, the relaying replica {:.2}; \
         client, relay and owner share this host's cores)",
        (cpu(0) - owner_before) / gib,
        (cpu(1) - relay_before) / gib
    );
    let delta = relay_p50.as_secs_f64() - owner_p50.as_secs_f64();
    let share = relay_mbs / owner_mbs;
    Ok(vec![
        Row {
            figure: "`true` p50 through a non-owner replica",
            ours: ms(relay_p50),
            baseline: format!("{} owner", ms(owner_p50)),
            ratio: format!("{:+.3}ms", delta * 1e3),
            target: "≤ +0.3 ms",
            met: Some(delta <= 0.0003),
            reference: String::new(),
        },
        Row {
            figure: "output through a non-owner replica",
            ours: format!("{relay_mbs:.0} MB/s"),
            baseline: format!("{owner_mbs:.0} MB/s owner"),
            ratio: format!("{:.0}%", share * 100.0),
            target: "≥ 80% of the owner",
            met: Some(share >= 0.8),
            reference: String::new(),
        },
    ])
}

pub(super) async fn latency(c: &mut Conn, run: &str, n: usize) -> BenchResult<Duration> {
    let mut lat = Vec::with_capacity(n);
    for i in 0..n + 20 {
        let t = Instant::now();
        c.run_to_close(&format!("{run}-{i}"), &["true"]).await?;
        if i >= 20 {
            lat.push(t.elapsed());
        }
    }
    lat.sort();
    Ok(percentile(&lat, 0.5))
}

pub(super) async fn throughput(url: &str, sid: &str, run: &str, bytes: u64) -> BenchResult<f64> {
    let mut c = Conn::resume(url, sid).await?;
    let count = bytes.to_string();
    let t = Instant::now();
    let got = c
        .run_to_close(run, &["head", "-c", &count, "/dev/zero"])
        .await?;
    let secs = t.elapsed().as_secs_f64();
    if got != bytes {
        return Err(format!("received {got} of {bytes} bytes"));
    }
    Ok(bytes as f64 / secs / 1e6)
}

/// User + system CPU seconds of process `pid` so far.
fn cpu_seconds(pid: u32) -> f64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return 0.0;
    };
    // Fields after the command name (which may hold spaces) in parentheses.
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    // utime and stime are fields 14 and 15 of the line: 11 and 12 here.
    (ticks(11) + ticks(12)) / 100.0
}
