//! The gRPC door (`ProcessService/Exec`, raw bytes: no base64, no JSON):
//! output throughput against the direct pipe, `true` latency against the
//! direct spawn, and what the isolation layers cost it (against the same
//! call on a gateway with no layers).

use std::time::{Duration, Instant};

use futures_util::StreamExt as _;

use super::harness::{BenchResult, Row, Run, err, ms, percentile};
use super::spawns::Baselines;

/// Figure 3b, when the gateway has a gRPC door; `direct` is the pipe's
/// MB/s (figure 3).
pub(crate) async fn figures(
    run: &Run<'_>,
    base: &Baselines,
    direct: f64,
    rows: &mut Vec<Row>,
) -> BenchResult<()> {
    let Run {
        gw,
        bench_token,
        n,
        output_bytes,
        ..
    } = *run;
    let ((d50, d99), plain_grpc) = (base.direct, base.plain_grpc);
    // 3b. the same over gRPC (raw bytes: no base64, no JSON).
    if let Some(grpc) = &gw.grpc {
        let mut ours = 0f64;
        for _ in 0..3 {
            ours = ours.max(grpc_throughput(grpc, bench_token, output_bytes).await?);
        }
        rows.push(Row {
            figure: "output over gRPC Exec, best of 3",
            ours: format!("{ours:.0} MB/s"),
            baseline: format!("{direct:.0} MB/s pipe"),
            ratio: format!("{:.0}%", ours / direct * 100.0),
            target: "≥ 70% of the direct pipe",
            met: Some(ours / direct >= 0.7),
            reference: String::new(),
        });
        let (p50, p99) = grpc_spawn_latency(grpc, bench_token, n).await?;
        rows.push(Row::reported(
            "`true` start→closed over gRPC Exec, p50",
            ms(p50),
            format!("{} direct", ms(d50)),
            format!("{:.2}x", p50.as_secs_f64() / d50.as_secs_f64()),
        ));
        if let Some((q50, _)) = plain_grpc {
            rows.push(Row::reported(
                "isolation cost: gRPC Exec `true` p50",
                ms(p50),
                format!("{} no layers", ms(q50)),
                format!("{:+.0} µs", (p50.as_secs_f64() - q50.as_secs_f64()) * 1e6),
            ));
        }
        rows.push(Row::reported(
            "`true` start→closed over gRPC Exec, p99",
            ms(p99),
            format!("{} direct", ms(d99)),
            format!("{:.2}x", p99.as_secs_f64() / d99.as_secs_f64()),
        ));
    }
    Ok(())
}

fn grpc_spec(id: String, argv: Vec<String>) -> exec_gateway::transport::grpc::pb::ProcessSpec {
    exec_gateway::transport::grpc::pb::ProcessSpec {
        process_id: id,
        argv,
        cwd: "/tmp".into(),
        env: [("PATH".to_owned(), "/usr/bin:/bin".to_owned())].into(),
        tty: false,
        pipe_stdin: false,
        arg0: None,
        env_policy: None,
    }
}

async fn grpc_exec(
    client: &mut exec_gateway::transport::grpc::pb::process_service_client::ProcessServiceClient<
        tonic::transport::Channel,
    >,
    token: &str,
    session: &str,
    spec: exec_gateway::transport::grpc::pb::ProcessSpec,
) -> BenchResult<u64> {
    use exec_gateway::transport::grpc::pb;
    let mut req = tonic::Request::new(pb::ExecRequest {
        session_id: session.to_owned(),
        spec: Some(spec),
    });
    req.metadata_mut().insert(
        "authorization",
        format!("Bearer {token}").parse().map_err(err)?,
    );
    let mut stream = client.exec(req).await.map_err(err)?.into_inner();
    let mut bytes = 0u64;
    while let Some(msg) = stream.next().await {
        let ev = msg.map_err(err)?.event.ok_or("empty event")?;
        match ev.event {
            Some(pb::process_event::Event::Output(o)) => bytes += o.data.len() as u64,
            Some(pb::process_event::Event::Closed(_)) => return Ok(bytes),
            _ => {}
        }
    }
    Err("stream ended before closed".to_owned())
}

async fn grpc_session(channel: tonic::transport::Channel, token: &str) -> BenchResult<String> {
    use exec_gateway::transport::grpc::pb;
    let mut req = tonic::Request::new(pb::CreateSessionRequest {
        snapshot: String::new(),
        image: String::new(),
        client_name: "bench".into(),
    });
    req.metadata_mut().insert(
        "authorization",
        format!("Bearer {token}").parse().map_err(err)?,
    );
    Ok(
        pb::session_service_client::SessionServiceClient::new(channel)
            .create_session(req)
            .await
            .map_err(err)?
            .into_inner()
            .session_id,
    )
}

async fn grpc_throughput(url: &str, token: &str, bytes: u64) -> BenchResult<f64> {
    use exec_gateway::transport::grpc::pb::process_service_client::ProcessServiceClient;
    // A bulk client sizes its HTTP/2 windows (as any gRPC bulk client should).
    let channel = tonic::transport::Channel::from_shared(url.to_owned())
        .map_err(err)?
        .initial_stream_window_size(exec_gateway::transport::grpc::HTTP2_STREAM_WINDOW_BYTES)
        .initial_connection_window_size(
            exec_gateway::transport::grpc::HTTP2_CONNECTION_WINDOW_BYTES,
        )
        .http2_adaptive_window(true)
        .max_frame_size(exec_gateway::transport::grpc::HTTP2_MAX_FRAME_BYTES)
        .connect()
        .await
        .map_err(err)?;
    let session = grpc_session(channel.clone(), token).await?;
    let mut client = ProcessServiceClient::new(channel)
        .max_decoding_message_size(exec_gateway::transport::grpc::MAX_GRPC_MESSAGE_BYTES);
    let t = Instant::now();
    let spec = grpc_spec(
        format!("big-{}", t.elapsed().as_nanos()),
        vec![
            "head".into(),
            "-c".into(),
            bytes.to_string(),
            "/dev/zero".into(),
        ],
    );
    let got = grpc_exec(&mut client, token, &session, spec).await?;
    if got != bytes {
        return Err(format!("received {got} of {bytes} bytes over gRPC"));
    }
    Ok(bytes as f64 / t.elapsed().as_secs_f64() / 1e6)
}

pub(crate) async fn grpc_spawn_latency(
    url: &str,
    token: &str,
    n: usize,
) -> BenchResult<(Duration, Duration)> {
    use exec_gateway::transport::grpc::pb::process_service_client::ProcessServiceClient;
    let channel = tonic::transport::Channel::from_shared(url.to_owned())
        .map_err(err)?
        .connect()
        .await
        .map_err(err)?;
    let session = grpc_session(channel.clone(), token).await?;
    let mut client = ProcessServiceClient::new(channel);
    let mut lat = Vec::with_capacity(n);
    for i in 0..n + 20 {
        let t = Instant::now();
        grpc_exec(
            &mut client,
            token,
            &session,
            grpc_spec(format!("g{i}"), vec!["true".into()]),
        )
        .await?;
        if i >= 20 {
            lat.push(t.elapsed());
        }
    }
    lat.sort();
    Ok((percentile(&lat, 0.5), percentile(&lat, 0.99)))
}
