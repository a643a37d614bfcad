//! `exec-gateway-bench`: starts the gateway as a separate process and
//! measures each figure of the benchmark table (docs/benchmarks.md) next to its
//! baseline, in the same run, printing the ratio. With `--reference PATH`
//! the same client also measures `codex exec-server` (the reference) side
//! by side.
//!
//! Not a test: it asserts nothing and passes on any machine; it prints.
//! A separate binary so that nothing of it ships in the gateway.
//!
//! This file holds `main`, the dispatch of the command line (the soaks,
//! each `--*-only` family, the `--spawns` count) and the order of the
//! default run; each family of figures has its own module: the shared
//! harness in `harness/`, spawns (latency, rate, isolation, the stack,
//! fairness) in `spawns/`, output in `output.rs`, gRPC in `grpc.rs`,
//! `fs/readFile` in `files.rs`, idle-session memory in `memory.rs`, then
//! `fleet.rs`, `executors.rs`, `edges.rs`, `images.rs`, `snapshots.rs`,
//! `previews.rs`, `tenants.rs`, `soak.rs` and `reliability/`.

use std::process::ExitCode;
use std::time::Duration;

mod edges;
mod executors;
mod files;
mod fleet;
mod grpc;
mod harness;
mod images;
mod memory;
mod output;
mod previews;
mod reliability;
mod snapshots;
mod soak;
mod spawns;
mod tenants;

use harness::{
    BenchArgs, BenchResult, Run, Server, all_scopes_token, err, raise_fd_limit, report,
    tempfile_dir,
};

fn main() -> ExitCode {
    use clap::Parser as _;
    let args = BenchArgs::parse();
    exec_gateway::telemetry::init(exec_gateway::telemetry::LogFormat::Text);
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("bench failed: no runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(bench(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bench failed: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn bench(args: BenchArgs) -> BenchResult<()> {
    raise_fd_limit();
    if let Some(spec) = &args.soak_abuser {
        return soak::abuser_main(spec).await;
    }
    let exe = match &args.gateway {
        Some(p) => p.clone(),
        None => std::env::current_exe()
            .map_err(err)?
            .with_file_name("exec-gateway"),
    };
    let dir = tempfile_dir()?;
    if let (Some(duration), true) = (args.soak, args.reliability) {
        let chaos = match &args.soak_chaos {
            Some(list) => list
                .iter()
                .filter(|s| !s.is_empty())
                .map(|s| reliability::Chaos::parse(s))
                .collect::<BenchResult<Vec<_>>>()?,
            None if args.soak_replicas > 1 => ["worker", "cut", "stall", "replica", "drain"]
                .iter()
                .map(|s| reliability::Chaos::parse(s))
                .collect::<BenchResult<Vec<_>>>()?,
            None => ["worker", "cut", "stall"]
                .iter()
                .map(|s| reliability::Chaos::parse(s))
                .collect::<BenchResult<Vec<_>>>()?,
        };
        let result = reliability::run(
            &exe,
            &dir,
            reliability::ReliabilityArgs {
                duration,
                baseline: args.soak_baseline,
                replicas: args.soak_replicas,
                chaos,
                interval: args.soak_interval,
                json: args.json,
            },
        )
        .await;
        let _ = std::fs::remove_dir_all(&dir);
        return result;
    }
    if let Some(duration) = args.soak {
        return soak::soak(
            &exe,
            &dir,
            soak::SoakArgs {
                duration,
                baseline: args.soak_baseline,
            },
        )
        .await;
    }
    let config = dir.join("bench.toml");
    // A confined tenant (root under /tmp): what namespaces cost.
    let jail = dir.join("jail");
    std::fs::create_dir_all(&jail).map_err(err)?;
    let key = dir.join("hs256.key");
    let secret: String = (0..64)
        .map(|i| char::from(b'a' + (i * 7 % 26) as u8))
        .collect();
    std::fs::write(&key, &secret).map_err(err)?;
    // `bench` is unthrottled (the figures measure the gateway, not a quota);
    // `flood` keeps the default per-tenant limits (the protection measured
    // by the fairness figure); `victim` is unthrottled like `bench`.
    std::fs::write(
        &config,
        format!(
            "[server]\nmax_connections = {0}\nmax_sessions = {0}\n\
             max_unauthenticated = 2048\nmax_unauthenticated_per_source = 2048\n\
             [exec]\nmax_processes = 1024\n\
             [[auth.keys]]\nalgorithm = \"HS256\"\nsecret_file = \"{1}\"\n\
             [tenants.bench]\nroot = \"/\"\nmax_sessions = {0}\nmax_connections = {0}\nmax_processes = 1024\n\
             requests_per_second = 1000000\nburst = 1000000\nmax_in_flight = 4096\n\
             [tenants.flood]\nroot = \"/\"\n\
             [tenants.victim]\nroot = \"/\"\nrequests_per_second = 1000000\nburst = 1000000\n\
             [tenants.jail]\nroot = \"{2}\"\nrequests_per_second = 1000000\nburst = 1000000\n",
            args.sessions + 1024,
            key.display(),
            jail.display()
        ),
    )
    .map_err(err)?;
    let file = files::one_mib_file(&dir)?;
    let config_s = config.display().to_string();
    let settings = exec_gateway::config::Config::load(&config)
        .and_then(exec_gateway::config::Config::validate)
        .map_err(err)?;
    let token = |tenant: &str| {
        all_scopes_token(
            &secret,
            &settings,
            tenant,
            Duration::from_secs(3600),
            "bench",
        )
    };
    let (bench_token, flood_token, victim_token, jail_token) = (
        token("bench")?,
        token("flood")?,
        token("victim")?,
        token("jail")?,
    );

    let fleet_rows = || {
        fleet::figures(
            &exe,
            &dir,
            &config_s,
            &bench_token,
            args.iterations,
            args.output_bytes,
        )
    };
    let executor_rows = || {
        executors::figures(
            &exe,
            &dir,
            &config_s,
            &secret,
            &bench_token,
            args.iterations,
            args.output_bytes,
        )
    };
    let edge_rows = || {
        edges::figures(
            &exe,
            &dir,
            &config_s,
            &bench_token,
            args.iterations,
            args.output_bytes,
        )
    };
    if args.edges_only {
        let rows = edge_rows().await?;
        report(&rows, false, args.json);
        let _ = std::fs::remove_dir_all(&dir);
        return Ok(());
    }
    if args.executors_only {
        let rows = executor_rows().await?;
        report(&rows, false, args.json);
        let _ = std::fs::remove_dir_all(&dir);
        return Ok(());
    }
    if args.snapshots_only {
        let rows = snapshots::figures(&exe, &dir, &secret).await?;
        report(&rows, false, args.json);
        let _ = std::fs::remove_dir_all(&dir);
        return Ok(());
    }
    if args.previews_only {
        let rows = previews::figures(&exe, &dir, &secret).await?;
        report(&rows, false, args.json);
        let _ = std::fs::remove_dir_all(&dir);
        return Ok(());
    }
    if args.images_only {
        let rows = images::figures(&exe, &dir, &secret).await?;
        report(&rows, false, args.json);
        let _ = std::fs::remove_dir_all(&dir);
        return Ok(());
    }
    if args.cold_only {
        let rows = tenants::cold_figures(&exe, &dir, &secret, args.cold_samples).await?;
        report(&rows, false, args.json);
        let _ = std::fs::remove_dir_all(&dir);
        return Ok(());
    }
    if args.tenants_only {
        let rows =
            tenants::figures(&exe, &dir, &secret, args.tenant_count, args.live_tenants).await?;
        report(&rows, false, args.json);
        let _ = std::fs::remove_dir_all(&dir);
        return Ok(());
    }
    if args.fleet_only {
        let rows = fleet_rows().await?;
        report(&rows, false, args.json);
        let _ = std::fs::remove_dir_all(&dir);
        return Ok(());
    }
    let mut gw = Server::gateway(&exe, &config_s).await?;
    // The reference client can only be given a URL: the token rides in the
    // query, which the reference ignores.
    let base_url = gw.url.clone();
    gw.url = format!("{base_url}/?access_token={bench_token}");
    let reference = match &args.reference {
        Some(p) => Some(Server::start(p, &["exec-server", "--listen", "ws://127.0.0.1:0"]).await?),
        None => None,
    };
    if let Some(total) = args.spawns {
        let jail_url = format!("{base_url}/?access_token={jail_token}");
        let cwd = jail.display().to_string();
        return spawns::spawn_reliability(&jail_url, &cwd, 8, total).await;
    }
    if args.memory_only {
        let rows = [memory::memory_row(&gw, reference.as_ref(), args.sessions).await?];
        report(&rows, reference.is_some(), args.json);
        let _ = std::fs::remove_dir_all(&dir);
        return Ok(());
    }
    let host = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_owned())
        })
        .unwrap_or_default();
    eprintln!(
        "exec-gateway bench: {} cores, {host}, iterations {}, sessions {}, output {} bytes",
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1),
        args.iterations,
        args.sessions,
        args.output_bytes
    );
    let n = args.iterations;
    let run = Run {
        exe: &exe,
        dir: &dir,
        config: &config,
        gw: &gw,
        reference: reference.as_ref(),
        bench_token: &bench_token,
        jail: &jail,
        jail_token: &jail_token,
        n,
        ref_n: (n / 5).max(20),
        seconds: args.seconds,
        output_bytes: args.output_bytes,
    };
    let mut rows = Vec::new();
    if args.output_only {
        output::figures(&run, &mut rows).await?;
        report(&rows, reference.is_some(), args.json);
        let _ = std::fs::remove_dir_all(&dir);
        return Ok(());
    }
    if args.files_only {
        files::figures(&run, &file, &mut rows).await?;
        report(&rows, reference.is_some(), args.json);
        let _ = std::fs::remove_dir_all(&dir);
        return Ok(());
    }

    // 1–2d. `true` start→closed, spawns/s, and what isolation costs.
    let baselines = spawns::figures(&run, &mut rows).await?;
    // 3. output over the websocket, lean and parsing clients.
    let pipe = output::figures(&run, &mut rows).await?;
    // 3b. the same over gRPC.
    grpc::figures(&run, &baselines, pipe, &mut rows).await?;
    // 4. fs/readFile 1 MiB.
    files::figures(&run, &file, &mut rows).await?;
    // 5. memory per idle session.
    rows.push(memory::memory_row(&gw, reference.as_ref(), args.sessions).await?);
    // 6. the cost of the tower stack, in process.
    spawns::stack_row(&settings, &mut rows).await;
    // 7. fairness: a victim tenant's p99 while another floods.
    spawns::fairness_row(&base_url, &victim_token, &flood_token, &mut rows).await?;

    rows.extend(fleet_rows().await.map_err(|e| format!("fleet: {e}"))?);
    rows.extend(
        executor_rows()
            .await
            .map_err(|e| format!("executors: {e}"))?,
    );
    rows.extend(edge_rows().await.map_err(|e| format!("edges: {e}"))?);
    report(&rows, reference.is_some(), args.json);
    let _ = std::fs::remove_dir_all(&dir);
    drop(gw);
    drop(reference);
    Ok(())
}
