//! A remote executor's cost: the same work in a session on the tenant's
//! local worker and in a session on an `exec-gateway executor` on this
//! host, through one gateway, side by side in one run.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use tokio::process::Command;

use super::fleet::{latency, throughput};
use super::harness::{BenchResult, Conn, Row, Server, err, ms};

/// Rows for `true` p50 and output throughput, executor vs local worker.
pub async fn figures(
    exe: &Path,
    dir: &Path,
    config: &str,
    secret: &str,
    token: &str,
    iterations: usize,
    output_bytes: u64,
) -> BenchResult<Vec<Row>> {
    let text = std::fs::read_to_string(config).map_err(err)?;
    let gw_config = dir.join("executors.toml");
    std::fs::write(
        &gw_config,
        format!(
            "{text}\n[tenants.remote]\nroot = \"/\"\npool = \"bench\"\n\
             requests_per_second = 1000000\nburst = 1000000\nmax_in_flight = 4096\n\
             [executors]\n[executors.pools.bench]\n"
        ),
    )
    .map_err(err)?;
    let gw_config = gw_config.display().to_string();
    let gw = Server::gateway(exe, &gw_config).await?;
    let settings = exec_gateway::config::Config::load(Path::new(&gw_config))
        .and_then(exec_gateway::config::Config::validate)
        .map_err(err)?;
    let credential = exec_gateway::auth::mint_executor(
        jsonwebtoken::Algorithm::HS256,
        secret.as_bytes(),
        &settings.auth,
        "bench",
        Duration::from_secs(3600),
        "bench",
    )?;
    let remote_token = super::harness::all_scopes_token(
        secret,
        &settings,
        "remote",
        Duration::from_secs(3600),
        "bench",
    )?;
    let addr = gw.url.trim_start_matches("ws://").to_owned();
    // The executor's own configuration: one unthrottled tenant on this
    // host (with its isolation), holding two links.
    let key = settings
        .auth
        .keys
        .first()
        .and_then(|k| k.source.file())
        .ok_or("the bench key has no file")?;
    let ex_config = dir.join("executor.toml");
    std::fs::write(
        &ex_config,
        format!(
            "[exec]\nmax_processes = 1024\n[[auth.keys]]\nalgorithm = \"HS256\"\nsecret_file = \"{}\"\n\
             [tenants.exbench]\nroot = \"/\"\nmax_processes = 1024\n\
             requests_per_second = 1000000\nburst = 1000000\nmax_in_flight = 4096\n",
            key.display()
        ),
    )
    .map_err(err)?;
    let ex_config = ex_config.display().to_string();
    let _executor = Command::new(exe)
        .args(["executor", "--config", &ex_config, "--slots", "2"])
        .args([
            "--remote",
            &format!("http://{addr}"),
            "--executor-id",
            "bench-1",
        ])
        .env("CODEX_EXEC_SERVER_REMOTE_BEARER_TOKEN", &credential)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .map_err(err)?;
    let local_url = format!("{}/?access_token={token}", gw.url);
    let remote_url = format!("{}/?access_token={remote_token}", gw.url);
    // The local session stays attached while the remote one waits (up to the
    // open timeout) for the executor's first link: a detached one would
    // expire after the detach TTL on a slow start.
    let local = Conn::open(&local_url).await?;
    let local_sid = local.session_id.clone();
    let remote_sid = Conn::open(&remote_url).await?.session_id;
    drop(local);
    if !remote_sid.starts_with("x-bench-1@") && !remote_sid.starts_with("x-bench-1.") {
        return Err(format!(
            "the session did not land on the executor: {remote_sid}"
        ));
    }
    let (local_p50, remote_p50) = {
        let mut local = Conn::resume(&local_url, &local_sid).await?;
        let a = latency(&mut local, "local", iterations).await?;
        drop(local);
        let mut remote = Conn::resume(&remote_url, &remote_sid).await?;
        let b = latency(&mut remote, "remote", iterations).await?;
        drop(remote);
        let mut local = Conn::resume(&local_url, &local_sid).await?;
        let a2 = latency(&mut local, "local-again", iterations).await?;
        (a.min(a2), b)
    };
    let local_mbs = throughput(&local_url, &local_sid, "big-local", output_bytes).await?;
    let remote_mbs = throughput(&remote_url, &remote_sid, "big-remote", output_bytes).await?;
    let delta = remote_p50.as_secs_f64() - local_p50.as_secs_f64();
    Ok(vec![
        Row::reported(
            "`true` p50 on a remote executor (same host)",
            ms(remote_p50),
            format!("{} local worker", ms(local_p50)),
            format!("{:+.3}ms", delta * 1e3),
        ),
        Row::reported(
            "output through a remote executor (same host)",
            format!("{remote_mbs:.0} MB/s"),
            format!("{local_mbs:.0} MB/s local worker"),
            format!("{:.0}%", remote_mbs / local_mbs * 100.0),
        ),
    ])
}
