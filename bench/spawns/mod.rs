//! Spawn figures: `true` start→closed latency (p50, p99) and spawns per
//! second over 8 connections through the client library, each against
//! the same `true` spawned directly by this process with
//! `tokio::process::Command` (the direct baseline); then, in
//! `isolation.rs`, what the isolation layers, the workers, the namespaces
//! and the tenant's own network cost (the same figures on a gateway with
//! that part off); in `stack.rs`, the tower stack's cost per call against
//! the bare handler; and here the fairness figure: a victim tenant's p99
//! while another floods, against the victim alone. `--spawns N` is a
//! reliability count, not a figure.

use std::time::{Duration, Instant};

use tokio::process::Command;

use super::harness::{
    BenchResult, Conn, Cost, Row, Run, client, err, ms, percentile, run_to_close,
};

mod isolation;
mod stack;

pub(crate) use stack::stack_row;

/// What later families compare against: the direct spawn's p50 and p99,
/// and the gRPC `true` p50 and p99 of the gateway with no isolation layers
/// (measured with the layers-off figures, when it has a gRPC door).
pub(crate) struct Baselines {
    pub(crate) direct: (Duration, Duration),
    pub(crate) plain_grpc: Option<(Duration, Duration)>,
}

/// Figures 1 to 2d: latency and rate against direct spawns, then what
/// isolation costs (`isolation.rs`).
pub(crate) async fn figures(run: &Run<'_>, rows: &mut Vec<Row>) -> BenchResult<Baselines> {
    let Run {
        gw,
        reference,
        n,
        ref_n,
        seconds,
        ..
    } = *run;
    // 1. `true` start → closed, and what each cost the process that
    // spawned it (the gateway; this process for the direct spawns).
    let me = std::process::id();
    let before = Cost::of(me);
    let (d50, d99) = direct_spawn_latency(n).await?;
    let (d_cpu, d_switches) = before.per(Cost::of(me), n + 20);
    let gw_pid = gw.child.id().unwrap_or(0);
    let before = Cost::of(gw_pid);
    let (g50, g99) = spawn_latency(&gw.url, n).await?;
    let (g_cpu, g_switches) = before.per(Cost::of(gw_pid), n + 20);
    let r = match &reference {
        Some(r) => {
            let (a, b) = spawn_latency(&r.url, ref_n).await?;
            format!("p50 {} p99 {}", ms(a), ms(b))
        }
        None => String::new(),
    };
    let ratio50 = g50.as_secs_f64() / d50.as_secs_f64();
    rows.push(Row {
        figure: "`true` start→closed over ws, p50",
        ours: ms(g50),
        baseline: format!("{} direct", ms(d50)),
        ratio: format!("{ratio50:.2}x"),
        target: "≤ 1.2x direct",
        met: Some(ratio50 <= 1.2),
        reference: r,
    });
    rows.push(Row::reported(
        "`true` start→closed over ws, p99",
        ms(g99),
        format!("{} direct", ms(d99)),
        format!("{:.2}x", g99.as_secs_f64() / d99.as_secs_f64()),
    ));
    rows.push(Row::reported(
        "gateway CPU per sequential `true` (all its threads)",
        format!("{g_cpu:.0} µs"),
        format!("{d_cpu:.0} µs direct spawner"),
        format!("{:.2}x", g_cpu / d_cpu.max(1.0)),
    ));
    rows.push(Row::reported(
        "gateway context switches per sequential `true`",
        format!("{g_switches:.1}"),
        format!("{d_switches:.1} direct spawner"),
        format!("{:.2}x", g_switches / d_switches.max(0.1)),
    ));

    // 2. spawns per second over 8 connections.
    let direct = direct_spawns_per_second(8, seconds).await?;
    let ours = spawns_per_second(&gw.url, 8, seconds).await?;
    let r = match &reference {
        Some(r) => format!("{:.0}/s", spawns_per_second(&r.url, 8, seconds).await?),
        None => String::new(),
    };
    rows.push(Row {
        figure: "spawns/s, 8 connections",
        ours: format!("{ours:.0}/s"),
        baseline: format!("{direct:.0}/s direct"),
        ratio: format!("{:.0}%", ours / direct * 100.0),
        target: "≥ 70% of direct",
        met: Some(ours / direct >= 0.7),
        reference: r,
    });

    let plain_grpc = isolation::figures(run, (g50, g99), ours, rows).await?;
    Ok(Baselines {
        direct: (d50, d99),
        plain_grpc,
    })
}

/// Figure 7, fairness: the `victim` tenant's p99 spawn latency while the
/// `flood` tenant (the default per-tenant limits) floods, against the
/// victim alone.
pub(crate) async fn fairness_row(
    base_url: &str,
    victim_token: &str,
    flood_token: &str,
    rows: &mut Vec<Row>,
) -> BenchResult<()> {
    // 7. fairness: the victim's p99 spawn latency while another tenant floods
    // (8 connections spawning as fast as the gateway lets them).
    let victim_url = format!("{base_url}/?access_token={victim_token}");
    let flood_url = format!("{base_url}/?access_token={flood_token}");
    let alone = spawn_latency(&victim_url, 1000).await?;
    let stop = tokio_util::sync::CancellationToken::new();
    let flooders: Vec<_> = (0..8)
        .map(|i| {
            exec_gateway::task::start("bench-flood", flood(flood_url.clone(), i, stop.clone()))
        })
        .collect();
    // Steady state: let the flooder spend its burst allowance first.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let loaded = spawn_latency(&victim_url, 1000).await?;
    stop.cancel();
    let mut flood_ok = 0;
    let mut flood_shed = 0;
    for f in flooders {
        let (ok, shed) = f.await.map_err(err)??;
        flood_ok += ok;
        flood_shed += shed;
    }
    let ratio = loaded.1.as_secs_f64() / alone.1.as_secs_f64();
    rows.push(Row {
        figure: "victim p99 spawn while another tenant floods",
        ours: ms(loaded.1),
        baseline: format!("{} alone", ms(alone.1)),
        ratio: format!("{ratio:.2}x"),
        target: "≤ 1.5x alone",
        met: Some(ratio <= 1.5),
        reference: String::new(),
    });
    eprintln!(
        "(flood: {flood_ok} spawns served, {flood_shed} shed with -32001 under the default 200 req/s tenant limit)"
    );
    Ok(())
}

async fn spawn_latency(url: &str, n: usize) -> BenchResult<(Duration, Duration)> {
    spawn_latency_in(url, n, "/tmp").await
}

async fn spawn_latency_in(url: &str, n: usize, cwd: &str) -> BenchResult<(Duration, Duration)> {
    let c = client(url).await?;
    let mut lat = Vec::with_capacity(n);
    for i in 0..n + 20 {
        let t = Instant::now();
        run_to_close(&c, &format!("t{i}"), &["true"], cwd).await?;
        if i >= 20 {
            lat.push(t.elapsed());
        }
    }
    lat.sort();
    Ok((percentile(&lat, 0.5), percentile(&lat, 0.99)))
}

async fn direct_spawn_latency(n: usize) -> BenchResult<(Duration, Duration)> {
    let mut lat = Vec::with_capacity(n);
    for i in 0..n + 20 {
        let t = Instant::now();
        Command::new("true").status().await.map_err(err)?;
        if i >= 20 {
            lat.push(t.elapsed());
        }
    }
    lat.sort();
    Ok((percentile(&lat, 0.5), percentile(&lat, 0.99)))
}

async fn spawns_per_second(url: &str, conns: usize, secs: u64) -> BenchResult<f64> {
    let deadline = Instant::now() + Duration::from_secs(secs);
    let mut tasks = Vec::new();
    for c in 0..conns {
        let url = url.to_owned();
        tasks.push(exec_gateway::task::start("bench-spawner", async move {
            let conn = client(&url).await?;
            let mut n = 0u64;
            while Instant::now() < deadline {
                run_to_close(&conn, &format!("c{c}-{n}"), &["true"], "/tmp").await?;
                n += 1;
            }
            Ok::<u64, String>(n)
        }));
    }
    let start = Instant::now();
    let mut total = 0;
    for t in tasks {
        total += t.await.map_err(err)??;
    }
    Ok(total as f64 / start.elapsed().as_secs_f64())
}

/// `total` `true` spawns over `conns` connections, none stopping at a
/// failure: prints how many succeeded, and each failure by its error.
pub(crate) async fn spawn_reliability(
    url: &str,
    cwd: &str,
    conns: u64,
    total: u64,
) -> BenchResult<()> {
    let start = Instant::now();
    let mut tasks = Vec::new();
    for c in 0..conns {
        let (url, cwd) = (url.to_owned(), cwd.to_owned());
        let share = total / conns + u64::from(c < total % conns);
        tasks.push(exec_gateway::task::start("bench-reliability", async move {
            let conn = client(&url).await?;
            let mut failures = std::collections::BTreeMap::<String, u64>::new();
            for n in 0..share {
                if let Err(e) = run_to_close(&conn, &format!("r{c}-{n}"), &["true"], &cwd).await {
                    *failures.entry(e).or_default() += 1;
                }
            }
            Ok::<_, String>((share, failures))
        }));
    }
    let (mut ran, mut failures) = (0u64, std::collections::BTreeMap::<String, u64>::new());
    for t in tasks {
        let (n, f) = t.await.map_err(err)??;
        ran += n;
        for (e, k) in f {
            *failures.entry(e).or_default() += k;
        }
    }
    let failed: u64 = failures.values().sum();
    println!(
        "{ran} `true` spawns over {conns} connections in {:.1} s: {} succeeded, {failed} failed",
        start.elapsed().as_secs_f64(),
        ran - failed
    );
    for (e, k) in &failures {
        println!("  {k} × {e}");
    }
    if failed > 0 {
        return Err(format!("{failed} spawns failed"));
    }
    Ok(())
}

async fn direct_spawns_per_second(conns: usize, secs: u64) -> BenchResult<f64> {
    let deadline = Instant::now() + Duration::from_secs(secs);
    let start = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..conns {
        tasks.push(exec_gateway::task::start(
            "bench-direct-spawner",
            async move {
                let mut n = 0u64;
                while Instant::now() < deadline {
                    Command::new("true").status().await.map_err(err)?;
                    n += 1;
                }
                Ok::<u64, String>(n)
            },
        ));
    }
    let mut total = 0;
    for t in tasks {
        total += t.await.map_err(err)??;
    }
    Ok(total as f64 / start.elapsed().as_secs_f64())
}

/// One flooding connection: start `true` as fast as possible, counting
/// served and shed starts, until `stop`.
async fn flood(
    url: String,
    i: usize,
    stop: tokio_util::sync::CancellationToken,
) -> BenchResult<(u64, u64)> {
    let mut c = Conn::open(&url).await?;
    let (mut ok, mut shed) = (0u64, 0u64);
    let mut n = 0u64;
    while !stop.is_cancelled() {
        n += 1;
        match c.run_to_close(&format!("f{i}-{n}"), &["true"]).await {
            Ok(_) => ok += 1,
            Err(_) => shed += 1,
        }
    }
    Ok((ok, shed))
}
