//! What isolation costs, each as `true` p50 (and spawns/s) on the measured
//! gateway against the same gateway with one part off, in one run: every
//! isolation layer off; the workers off (processes spawned by the gateway
//! itself); namespaces on and off for a confined tenant, with and without
//! workers; the tenant's own network namespace against the host network
//! (with output throughput too). All are reported, without targets.

use std::time::Duration;

use super::{spawn_latency, spawn_latency_in, spawns_per_second};
use crate::grpc::grpc_spawn_latency;
use crate::harness::{BenchResult, Row, Run, Server, err, ms, readyz};
use crate::output::throughput;

/// Figures 2b to 2d; `g50`/`g99` and `ours` are the measured gateway's
/// `true` latency and spawn rate (figures 1 and 2). Returns the gRPC `true`
/// p50 and p99 of the gateway with no layers, when it has a gRPC door.
pub(super) async fn figures(
    run: &Run<'_>,
    (g50, g99): (Duration, Duration),
    ours: f64,
    rows: &mut Vec<Row>,
) -> BenchResult<Option<(Duration, Duration)>> {
    let Run {
        exe,
        dir,
        config,
        gw,
        bench_token,
        jail,
        jail_token,
        n,
        seconds,
        output_bytes,
        ..
    } = *run;
    // 2b. what isolation costs: the same two figures on a gateway with the
    // isolation layers off, next to the default (layers as probed).
    let plain_config = dir.join("bench-plain.toml");
    let plain_toml = std::fs::read_to_string(config).map_err(err)?
        + if nix::unistd::geteuid().is_root() {
            // As root the uid layer cannot be off (tenants would run as root).
            "[isolation]\ncgroups = \"off\"\nlandlock = \"off\"\nseccomp = \"off\"\nnamespaces = \"off\"\nnetwork = \"off\"\n"
        } else {
            "[isolation]\ncgroups = \"off\"\nlandlock = \"off\"\nseccomp = \"off\"\nnamespaces = \"off\"\nnetwork = \"off\"\nuid = \"off\"\n"
        };
    std::fs::write(&plain_config, plain_toml).map_err(err)?;
    let plain_config_s = plain_config.display().to_string();
    let mut plain = Server::gateway(exe, &plain_config_s).await?;
    let plain_grpc = match &plain.grpc {
        Some(g) => Some(grpc_spawn_latency(g, bench_token, n).await?),
        None => None,
    };
    // The same layers with the processes spawned by the gateway itself
    // (no workers): what the worker design buys.
    let inproc_config = dir.join("bench-inproc.toml");
    std::fs::write(
        &inproc_config,
        std::fs::read_to_string(config).map_err(err)? + "[isolation]\nworkers = \"off\"\n",
    )
    .map_err(err)?;
    let inproc_config_s = inproc_config.display().to_string();
    let mut inproc = Server::start(
        exe,
        &[
            "serve",
            "--admin-listen",
            "127.0.0.1:0",
            "--listen",
            "ws://127.0.0.1:0",
            "--config",
            &inproc_config_s,
        ],
    )
    .await?;
    inproc.url = format!("{}/?access_token={bench_token}", inproc.url);
    let (i50, _) = spawn_latency(&inproc.url, n).await?;
    let inproc_rate = spawns_per_second(&inproc.url, 8, seconds).await?;
    drop(inproc);
    plain.url = format!("{}/?access_token={bench_token}", plain.url);
    let (p50, p99) = spawn_latency(&plain.url, n).await?;
    let plain_rate = spawns_per_second(&plain.url, 8, seconds).await?;
    drop(plain);
    // 2c. what namespaces cost a confined tenant: entered once per worker,
    // or (workers off) by every child.
    let mut ns_p50 = Vec::new();
    for (workers, namespaces) in [("on", "on"), ("on", "off"), ("off", "on"), ("off", "off")] {
        let path = dir.join(format!("bench-ns-{workers}-{namespaces}.toml"));
        let policy = |on: &str| if on == "on" { "optional" } else { "off" };
        std::fs::write(
            &path,
            std::fs::read_to_string(config).map_err(err)?
                + &format!(
                    "[isolation]\nworkers = \"{}\"\nnamespaces = \"{}\"\nnetwork = \"{}\"\n",
                    policy(workers),
                    policy(namespaces),
                    policy(namespaces)
                ),
        )
        .map_err(err)?;
        let path_s = path.display().to_string();
        let mut s = Server::start(
            exe,
            &["serve", "--listen", "ws://127.0.0.1:0", "--config", &path_s],
        )
        .await?;
        s.url = format!("{}/?access_token={jail_token}", s.url);
        let (p50, _) = spawn_latency_in(&s.url, n, &jail.display().to_string()).await?;
        ns_p50.push(p50);
        drop(s);
    }
    let layers = readyz(gw).await.unwrap_or_default();
    eprintln!(
        "isolation of the measured gateway: {}",
        layers.trim().replace('\n', "; ")
    );
    rows.push(Row::reported(
        "isolation cost: `true` p50 (layers on/off)",
        ms(g50),
        format!("{} no layers", ms(p50)),
        format!("{:+.0} µs", (g50.as_secs_f64() - p50.as_secs_f64()) * 1e6),
    ));
    rows.push(Row::reported(
        "isolation cost: `true` p99 (layers on/off)",
        ms(g99),
        format!("{} no layers", ms(p99)),
        format!("{:.2}x", g99.as_secs_f64() / p99.as_secs_f64()),
    ));
    rows.push(Row::reported(
        "through a worker vs in the gateway: p50",
        ms(g50),
        format!("{} in gateway", ms(i50)),
        format!("{:+.0} µs", (g50.as_secs_f64() - i50.as_secs_f64()) * 1e6),
    ));
    rows.push(Row::reported(
        "through a worker vs in the gateway: spawns/s",
        format!("{ours:.0}/s"),
        format!("{inproc_rate:.0}/s in gateway"),
        format!("{:.0}%", ours / inproc_rate * 100.0),
    ));
    rows.push(Row::reported(
        "isolation cost: spawns/s (layers on/off)",
        format!("{ours:.0}/s"),
        format!("{plain_rate:.0}/s no layers"),
        format!("{:.0}%", ours / plain_rate * 100.0),
    ));
    let delta =
        |a: Duration, b: Duration| format!("{:+.0} µs", (a.as_secs_f64() - b.as_secs_f64()) * 1e6);
    rows.push(Row::reported(
        "namespaces cost: confined `true` p50, workers",
        ms(ns_p50[0]),
        format!("{} without", ms(ns_p50[1])),
        delta(ns_p50[0], ns_p50[1]),
    ));
    rows.push(Row::reported(
        "namespaces cost: confined `true` p50, no workers",
        ms(ns_p50[2]),
        format!("{} without", ms(ns_p50[3])),
        delta(ns_p50[2], ns_p50[3]),
    ));

    // 2d. what the tenant's own network costs: the same tenant with its
    // namespace and pasta (the default) and with the layer off, back to
    // back (spawns join the namespace the worker entered once).
    {
        let path = dir.join("bench-net-off.toml");
        std::fs::write(
            &path,
            std::fs::read_to_string(config).map_err(err)? + "[isolation]\nnetwork = \"off\"\n",
        )
        .map_err(err)?;
        let path_s = path.display().to_string();
        let mut off = Server::start(
            exe,
            &["serve", "--listen", "ws://127.0.0.1:0", "--config", &path_s],
        )
        .await?;
        off.url = format!("{}/?access_token={bench_token}", off.url);
        let (on50, _) = spawn_latency(&gw.url, n).await?;
        let (off50, _) = spawn_latency(&off.url, n).await?;
        let on_rate = spawns_per_second(&gw.url, 8, seconds).await?;
        let off_rate = spawns_per_second(&off.url, 8, seconds).await?;
        let (mut on_tp, mut off_tp) = (0f64, 0f64);
        for _ in 0..2 {
            on_tp = on_tp.max(throughput(&gw.url, output_bytes).await?);
            off_tp = off_tp.max(throughput(&off.url, output_bytes).await?);
        }
        drop(off);
        rows.push(Row::reported(
            "network namespace cost: `true` p50 (own/host)",
            ms(on50),
            format!("{} host network", ms(off50)),
            delta(on50, off50),
        ));
        rows.push(Row::reported(
            "network namespace cost: spawns/s (own/host)",
            format!("{on_rate:.0}/s"),
            format!("{off_rate:.0}/s host network"),
            format!("{:.0}%", on_rate / off_rate * 100.0),
        ));
        rows.push(Row::reported(
            "network namespace cost: output, best of 2",
            format!("{on_tp:.0} MB/s"),
            format!("{off_tp:.0} MB/s host network"),
            format!("{:.0}%", on_tp / off_tp * 100.0),
        ));
    }
    Ok(plain_grpc)
}
