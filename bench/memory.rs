//! The gateway's resident memory per idle session: `VmRSS` after opening
//! `--sessions` initialized websocket sessions, less `VmRSS` before, per
//! session (the reference's the same way, with `--reference`). No direct
//! baseline: the target is absolute.

use std::time::Duration;

use serde_json::json;

use super::harness::{BenchResult, Conn, Row, Server};

async fn idle_session_rss(server: &Server, n: usize) -> BenchResult<f64> {
    // Warm up allocator and runtime with a few sessions first.
    let warm: Vec<Conn> =
        futures_util::future::try_join_all((0..16).map(|_| Conn::open(&server.url))).await?;
    drop(warm);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let before = server.rss_kib();
    let mut conns = Vec::with_capacity(n);
    let batch = 200;
    let mut opened = 0;
    // Up to 20,000 connections per loopback source address.
    let source = |i: usize| -> Option<std::net::IpAddr> {
        (n > 20_000).then(|| std::net::Ipv4Addr::new(127, 0, 0, 1 + (i / 20_000) as u8).into())
    };
    while opened < n {
        let k = batch.min(n - opened);
        let more = futures_util::future::try_join_all((opened..opened + k).map(|i| {
            Conn::open_from(
                &server.url,
                "/tmp",
                json!({"clientName": "bench"}),
                source(i),
            )
        }))
        .await?;
        conns.extend(more);
        opened += k;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let after = server.rss_kib();
    drop(conns);
    Ok(after.saturating_sub(before) as f64 / n as f64)
}

/// The gateway's (and the reference's) resident memory per idle session.
pub(crate) async fn memory_row(
    gw: &Server,
    reference: Option<&Server>,
    sessions: usize,
) -> BenchResult<Row> {
    let ours = idle_session_rss(gw, sessions).await?;
    let r = match reference {
        Some(r) => format!("{:.1} KiB", idle_session_rss(r, sessions).await?),
        None => String::new(),
    };
    Ok(Row {
        figure: "gateway RSS per idle session",
        ours: format!("{ours:.1} KiB"),
        baseline: format!("{sessions} sessions"),
        ratio: String::new(),
        target: "≤ 6 KiB",
        met: Some(ours <= 6.0),
        reference: r,
    })
}
