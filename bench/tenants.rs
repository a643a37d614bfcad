//! Tenants at scale: start-up with many configured tenants, what a tenant
//! with no live session costs, a cold tenant's first command against a
//! warm one's, and many tenants each with one live session. Every layer at
//! its default (as root: own uids, cgroups, namespaces, network).

use std::path::Path;
use std::time::{Duration, Instant};

use super::harness::{BenchResult, Conn, Row, Server, all_scopes_token, err, ms, percentile};

/// The gateway's RSS and the processes under it (workers, PID-namespace
/// parents, slirp4netns), counted from `/proc`.
fn footprint(s: &Server) -> (u64, usize) {
    let Some(pid) = s.child.id() else {
        return (0, 0);
    };
    let mut parents: std::collections::HashMap<u32, u32> = Default::default();
    if let Ok(dir) = std::fs::read_dir("/proc") {
        for e in dir.flatten() {
            let Some(p) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
                continue;
            };
            let Ok(stat) = std::fs::read_to_string(format!("/proc/{p}/stat")) else {
                continue;
            };
            let ppid = stat
                .rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
                .unwrap_or(0);
            parents.insert(p, ppid);
        }
    }
    let under = |mut p: u32| {
        while p > 1 {
            p = parents.get(&p).copied().unwrap_or(0);
            if p == pid {
                return true;
            }
        }
        false
    };
    let count = parents.keys().filter(|p| under(**p)).count();
    (s.rss_kib(), count)
}

fn kib(n: f64) -> String {
    format!("{n:.2} KiB")
}

/// Write a config: `tenants` configured tenants (each its own root under
/// `dir/roots`) plus a template, with an idle timeout of `idle`.
fn config(
    dir: &Path,
    key: &Path,
    configured: usize,
    idle: &str,
    live: usize,
) -> BenchResult<String> {
    let roots = dir.join("troots");
    let mut text = format!(
        "[server]\nmax_connections = {c}\nmax_sessions = {c}\nmax_active_tenants = {a}\n\
         tenant_idle_timeout = \"{idle}\"\ndetach_ttl = \"1s\"\nmax_unauthenticated = 2048\n\
         max_unauthenticated_per_source = 2048\n\
         [exec]\nmax_processes = 1024\n\
         [[auth.keys]]\nalgorithm = \"HS256\"\nsecret_file = \"{k}\"\n\
         [tenant_template]\nroot = \"{r}/{{tenant}}\"\nworkers_max = 1\nmax_open_files = 4\n\
         max_streams = 2\nrequests_per_second = 1000000\nburst = 1000000\n",
        c = live + 1024,
        a = live + 16,
        k = key.display(),
        r = roots.display(),
    );
    let explicit = dir.join("croots");
    for i in 0..configured {
        let root = explicit.join(format!("c{i}"));
        std::fs::create_dir_all(&root).map_err(err)?;
        text.push_str(&format!(
            "[tenants.c{i}]\nroot = \"{}\"\nworkers_max = 1\nmax_open_files = 4\nmax_streams = 2\n",
            root.display()
        ));
    }
    let path = dir.join(format!("tenants-{configured}.toml"));
    std::fs::write(&path, text).map_err(err)?;
    Ok(path.display().to_string())
}

/// Connect as `tenant`, run `true`, and return (connect→closed,
/// start→closed).
async fn first_true(url: &str, cwd: &str) -> BenchResult<(Duration, Duration)> {
    let t0 = Instant::now();
    let mut c = Conn::open_in(url, cwd).await?;
    let t1 = Instant::now();
    c.run_to_close("p", &["true"]).await?;
    let done = Instant::now();
    Ok((done - t0, done - t1))
}

/// The gateway on `config`, and its settings (to mint tokens for).
async fn serving(
    exe: &Path,
    config: &str,
) -> BenchResult<(Server, exec_gateway::config::Settings)> {
    let settings = exec_gateway::config::Config::load(Path::new(config))
        .and_then(exec_gateway::config::Config::validate)
        .map_err(err)?;
    Ok((Server::gateway(exe, config).await?, settings))
}

/// The websocket URL of `gw` with a token of `tenant` in it.
fn tenant_url(
    gw: &Server,
    settings: &exec_gateway::config::Settings,
    secret: &str,
    tenant: &str,
) -> BenchResult<String> {
    let token = all_scopes_token(secret, settings, tenant, Duration::from_secs(3600), "bench")?;
    Ok(format!("{}/?access_token={token}", gw.url))
}

/// A cold tenant's first `true` against a warm one's, `samples` of each.
async fn cold_and_warm(
    url: &impl Fn(&str) -> BenchResult<String>,
    roots: &Path,
    samples: usize,
) -> BenchResult<Vec<Row>> {
    let (mut cold, mut cold_start, mut warm, mut warm_start) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    // A warm tenant, kept active by a connection.
    let warm_url = url("warm")?;
    let _keep = Conn::open_in(&warm_url, &roots.join("warm").display().to_string()).await?;
    for i in 0..samples {
        let name = format!("cold{i}");
        let cwd = roots.join(&name).display().to_string();
        let (a, b) = first_true(&url(&name)?, &cwd).await?;
        cold.push(a);
        cold_start.push(b);
        let (a, b) = first_true(&warm_url, &roots.join("warm").display().to_string()).await?;
        warm.push(a);
        warm_start.push(b);
    }
    for v in [&mut cold, &mut cold_start, &mut warm, &mut warm_start] {
        v.sort();
    }
    let (c50, cs50, w50, ws50) = (
        percentile(&cold, 0.5),
        percentile(&cold_start, 0.5),
        percentile(&warm, 0.5),
        percentile(&warm_start, 0.5),
    );
    Ok(vec![
        Row {
            figure: "cold tenant: connect to first `true` closed p50",
            ours: ms(c50),
            baseline: format!("{} (warm tenant)", ms(w50)),
            ratio: format!("{:.2}x", c50.as_secs_f64() / w50.as_secs_f64()),
            target: "<= 15 ms",
            met: Some(c50 <= Duration::from_millis(15)),
            reference: String::new(),
        },
        Row::reported(
            "cold tenant: `true` start to closed p50",
            ms(cs50),
            format!("{} (warm tenant)", ms(ws50)),
            format!("{:.2}x", cs50.as_secs_f64() / ws50.as_secs_f64()),
        ),
    ])
}

/// A warm tenant's `true` once the host has spawned nothing for a while
/// (an agent's pace, one command every few seconds), against back to back:
/// where each process joins its cgroup by a `cgroup.procs` write, the
/// first write after a quiet spell waits for an RCU grace period.
async fn sporadic(url: &str, cwd: &str, samples: usize) -> BenchResult<Row> {
    let mut c = Conn::open_in(url, cwd).await?;
    c.run_to_close("w", &["true"]).await?;
    let mut run = async |id: String| -> BenchResult<Duration> {
        let t = Instant::now();
        c.run_to_close(&id, &["true"]).await?;
        Ok(t.elapsed())
    };
    let (mut quiet, mut busy) = (Vec::new(), Vec::new());
    for i in 0..samples {
        tokio::time::sleep(SPORADIC_PAUSE).await;
        quiet.push(run(format!("q{i}")).await?);
        busy.push(run(format!("b{i}")).await?);
    }
    quiet.sort();
    busy.sort();
    let (q, b) = (percentile(&quiet, 0.5), percentile(&busy, 0.5));
    Ok(Row::reported(
        "warm tenant: `true` after 300 ms without a spawn, p50",
        ms(q),
        format!("{} (right after another)", ms(b)),
        format!("{:.2}x", q.as_secs_f64() / b.as_secs_f64()),
    ))
}

/// The quiet spell before each sporadic spawn (a grace period is a few
/// milliseconds to tens of them).
const SPORADIC_PAUSE: Duration = Duration::from_millis(300);

/// Only the start figures: cold tenants against a warm one, and a warm
/// tenant's sporadic spawns (`--cold-only`, small enough for the VM lane).
pub async fn cold_figures(
    exe: &Path,
    dir: &Path,
    secret: &str,
    samples: usize,
) -> BenchResult<Vec<Row>> {
    let key = dir.join("hs256.key");
    // Room for every cold tenant active at once.
    let none = config(dir, &key, 0, "1s", samples)?;
    let (gw, settings) = serving(exe, &none).await?;
    let url = |t: &str| tenant_url(&gw, &settings, secret, t);
    let roots = dir.join("troots");
    let mut rows = cold_and_warm(&url, &roots, samples).await?;
    let cwd = roots.join("paced").display().to_string();
    rows.push(sporadic(&url("paced")?, &cwd, samples).await?);
    Ok(rows)
}

pub async fn figures(
    exe: &Path,
    dir: &Path,
    secret: &str,
    configured: usize,
    live: usize,
) -> BenchResult<Vec<Row>> {
    let key = dir.join("hs256.key");
    let mut rows = Vec::new();
    // 1. Start with `configured` tenants, and with none (the template alone).
    let none = config(dir, &key, 0, "1s", live)?;
    let many = config(dir, &key, configured, "1s", live)?;
    let started = Instant::now();
    let base = Server::gateway(exe, &none).await?;
    let base_start = started.elapsed();
    let (base_rss, base_procs) = footprint(&base);
    drop(base);
    let started = Instant::now();
    let gw = Server::gateway(exe, &many).await?;
    let many_start = started.elapsed();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (many_rss, many_procs) = footprint(&gw);
    drop(gw);
    rows.push(Row {
        figure: "start to listening, 10,000 tenants",
        ours: ms(many_start),
        baseline: format!("{} (no tenant configured)", ms(base_start)),
        ratio: format!(
            "{:.2}x",
            many_start.as_secs_f64() / base_start.as_secs_f64()
        ),
        target: "<= 1 s",
        met: Some(many_start <= Duration::from_secs(1)),
        reference: String::new(),
    });
    let per = (many_rss.saturating_sub(base_rss)) as f64 / configured.max(1) as f64;
    rows.push(Row {
        figure: "gateway memory per configured idle tenant",
        ours: kib(per),
        baseline: format!("{base_rss} KiB gateway with none"),
        ratio: format!("{many_procs} processes (none: {base_procs})"),
        target: "<= 2 KiB, 0 processes",
        met: Some(per <= 2.0 && many_procs == base_procs),
        reference: String::new(),
    });

    // 2. Cold and warm first `true`, then `live` tenants with one session.
    let (gw, settings) = serving(exe, &none).await?;
    let url = |t: &str| tenant_url(&gw, &settings, secret, t);
    let roots = dir.join("troots");
    rows.extend(cold_and_warm(&url, &roots, 50).await?);
    // Wait for the cold ones to retire, then hold `live` tenants open.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (idle_rss, idle_procs) = footprint(&gw);
    let mut held = Vec::with_capacity(live);
    let t0 = Instant::now();
    for i in 0..live {
        let name = format!("live{i}");
        let cwd = roots.join(&name).display().to_string();
        let mut c = Conn::open_in(&url(&name)?, &cwd).await?;
        c.run_to_close("p", &["true"]).await?;
        held.push(c);
    }
    let activation = t0.elapsed() / live.max(1) as u32;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (live_rss, live_procs) = footprint(&gw);
    rows.push(Row::reported(
        "tenants with one live session each",
        format!("{live}: {live_rss} KiB gateway RSS, {live_procs} processes"),
        format!("{idle_rss} KiB, {idle_procs} processes with none active"),
        format!(
            "{:.1} KiB and {:.2} processes per tenant; {} per activation",
            (live_rss.saturating_sub(idle_rss)) as f64 / live.max(1) as f64,
            (live_procs.saturating_sub(idle_procs)) as f64 / live.max(1) as f64,
            ms(activation)
        ),
    ));
    // Close them all and wait for their retirement; then a second round
    // of as many new tenants that come once and go: the gateway's growth
    // over that round is what a tenant that came and went keeps (memory
    // freed by the first round is reused, as it is not given back).
    drop(held);
    let settle = |floor: usize| {
        let gw = &gw;
        async move {
            let deadline = Instant::now() + Duration::from_secs(180);
            loop {
                tokio::time::sleep(Duration::from_secs(2)).await;
                let (_, procs) = footprint(gw);
                if procs <= floor || Instant::now() > deadline {
                    return;
                }
            }
        }
    };
    settle(idle_procs).await;
    let (round1_rss, _) = footprint(&gw);
    for i in 0..live {
        let name = format!("again{i}");
        let cwd = roots.join(&name).display().to_string();
        let mut c = Conn::open_in(&url(&name)?, &cwd).await?;
        c.run_to_close("p", &["true"]).await?;
    }
    settle(idle_procs).await;
    let (after_rss, after_procs) = footprint(&gw);
    let per = (after_rss.saturating_sub(round1_rss)) as f64 / live.max(1) as f64;
    rows.push(Row {
        figure: "memory per tenant retired (came once, now idle)",
        ours: kib(per),
        baseline: format!("{round1_rss} KiB after a first round of {live}"),
        ratio: format!("{after_procs} processes (warm tenant only: {idle_procs})"),
        target: "<= 2 KiB, 0 processes",
        met: Some(per <= 2.0 && after_procs <= idle_procs),
        reference: String::new(),
    });
    Ok(rows)
}
