//! Output throughput: `head -c BYTES /dev/zero` read to its close over the
//! websocket by the lean client (the client library) and by a parsing
//! client (every frame a `serde_json::Value`, every chunk decoded by the
//! scalar `base64` crate, as Codex's client does), each against the same
//! `head` read directly through a pipe by this process (the same pipe size
//! and read size the gateway uses); and the parsing client's own ceiling,
//! from memory. Best of 3 for each side.

use std::process::Stdio;
use std::time::Instant;

use serde_json::{Value, json};
use tokio::io::AsyncReadExt as _;
use tokio::process::Command;

use super::harness::{BenchResult, Conn, Row, Run, client, err, run_to_close, scalar_b64};

/// Figure 3. Returns the direct pipe's best MB/s (the gRPC figures'
/// baseline).
pub(crate) async fn figures(run: &Run<'_>, rows: &mut Vec<Row>) -> BenchResult<f64> {
    let Run {
        gw,
        reference,
        output_bytes,
        ..
    } = *run;
    // 3. output throughput: best of 3 for each side, since one run on a
    // shared 2-core VM varies by ±30%.
    let mut direct = 0f64;
    let mut ours = 0f64;
    for _ in 0..3 {
        direct = direct.max(direct_throughput(output_bytes).await?);
        ours = ours.max(throughput(&gw.url, output_bytes).await?);
    }
    let r = match &reference {
        Some(r) => format!("{:.0} MB/s", throughput(&r.url, output_bytes).await?),
        None => String::new(),
    };
    rows.push(Row {
        figure: "output over ws, best of 3",
        ours: format!("{ours:.0} MB/s"),
        baseline: format!("{direct:.0} MB/s pipe"),
        ratio: format!("{:.0}%", ours / direct * 100.0),
        target: "≥ 60% of the direct pipe",
        met: Some(ours / direct >= 0.6),
        reference: r,
    });
    let mut parsing = 0f64;
    for _ in 0..3 {
        parsing = parsing.max(parsing_throughput(&gw.url, output_bytes).await?);
    }
    let r = match &reference {
        Some(r) => format!(
            "{:.0} MB/s",
            parsing_throughput(&r.url, output_bytes).await?
        ),
        None => String::new(),
    };
    rows.push(Row {
        figure: "output over ws, parsing client, best of 3",
        ours: format!("{parsing:.0} MB/s"),
        baseline: format!("{direct:.0} MB/s pipe"),
        ratio: format!("{:.0}%", parsing / direct * 100.0),
        target: "≥ 60% of the direct pipe",
        met: Some(parsing / direct >= 0.6),
        reference: r,
    });
    // What bounds the row above: the parsing client alone, on one core,
    // consuming frames the gateway would send (256 KiB chunks) from memory:
    // no gateway, no socket, no child process.
    let ceiling = parsing_client_ceiling(1 << 30)?;
    rows.push(Row::reported(
        "parsing client alone: output frames from memory",
        format!("{ceiling:.0} MB/s"),
        format!("{direct:.0} MB/s pipe"),
        format!("{:.0}%", ceiling / direct * 100.0),
    ));
    Ok(direct)
}

pub(crate) async fn throughput(url: &str, bytes: u64) -> BenchResult<f64> {
    let c = client(url).await?;
    let count = bytes.to_string();
    let t = Instant::now();
    let got = run_to_close(&c, "big", &["head", "-c", &count, "/dev/zero"], "/tmp").await?;
    let secs = t.elapsed().as_secs_f64();
    if got != bytes {
        return Err(format!("received {got} of {bytes} bytes"));
    }
    Ok(bytes as f64 / secs / 1e6)
}

/// Output of `head -c bytes /dev/zero` read by a client that parses every
/// frame into a `Value` and decodes every chunk (as Codex's client does).
async fn parsing_throughput(url: &str, bytes: u64) -> BenchResult<f64> {
    let mut c = Conn::open(url).await?;
    let t = Instant::now();
    let cwd = c.cwd.clone();
    c.send(
        "process/start",
        json!({"processId": "bigp", "argv": ["head", "-c", bytes.to_string(), "/dev/zero"],
               "cwd": cwd, "env": {"PATH": "/usr/bin:/bin"}, "tty": false}),
    )
    .await?;
    let mut got = 0u64;
    loop {
        let v: Value = serde_json::from_str(&c.next_text().await?).map_err(err)?;
        match v["method"].as_str() {
            Some("process/output") => {
                got += scalar_b64(v["params"]["chunk"].as_str().unwrap_or_default())?.len() as u64;
            }
            Some("process/closed") => break,
            _ if v.get("error").is_some() => return Err(format!("start failed: {v}")),
            _ => {}
        }
    }
    let secs = t.elapsed().as_secs_f64();
    if got != bytes {
        return Err(format!("received {got} of {bytes} bytes"));
    }
    Ok(bytes as f64 / secs / 1e6)
}

/// The parsing client's own ceiling: `process/output` frames as the gateway
/// encodes them (256 KiB chunks), parsed into `serde_json::Value` and
/// decoded with the scalar `base64` crate, from memory, on this thread.
fn parsing_client_ceiling(bytes: u64) -> BenchResult<f64> {
    use exec_gateway::protocol::notify::{json_string, process_output};
    use exec_gateway::protocol::process::StreamName;
    let chunk = vec![0u8; exec_gateway::process::OUTPUT_READ_CHUNK_BYTES];
    let id = json_string("bigp");
    let frames: Vec<String> = (1..=8)
        .map(|seq| process_output(&id, seq, StreamName::Stdout, &chunk))
        .collect();
    let t = Instant::now();
    let mut got = 0u64;
    let mut i = 0;
    while got < bytes {
        let v: Value = serde_json::from_str(&frames[i % frames.len()]).map_err(err)?;
        got += scalar_b64(v["params"]["chunk"].as_str().unwrap_or_default())?.len() as u64;
        i += 1;
    }
    Ok(got as f64 / t.elapsed().as_secs_f64() / 1e6)
}

async fn direct_throughput(bytes: u64) -> BenchResult<f64> {
    let t = Instant::now();
    let mut child = Command::new("head")
        .args(["-c", &bytes.to_string(), "/dev/zero"])
        .stdout(Stdio::piped())
        .spawn()
        .map_err(err)?;
    let mut out = child.stdout.take().ok_or("no stdout")?;
    // As strong as we can make it: the same pipe size and read size the gateway uses.
    exec_gateway::spawn::grow_pipe(&out);
    let mut buf = vec![0u8; exec_gateway::process::OUTPUT_READ_CHUNK_BYTES];
    let mut got = 0u64;
    loop {
        let n = out.read(&mut buf).await.map_err(err)?;
        if n == 0 {
            break;
        }
        got += n as u64;
    }
    child.wait().await.map_err(err)?;
    if got != bytes {
        return Err(format!("read {got} of {bytes}"));
    }
    Ok(bytes as f64 / t.elapsed().as_secs_f64() / 1e6)
}
