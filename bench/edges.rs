//! What the production edges cost, each on against off in one run: TLS on
//! both doors (spawn p50 and output throughput, websocket and gRPC), the
//! audit trail, and OTLP tracing with every call sampled (exported to a
//! collector in this process).

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use exec_gateway::client::{Client, ConnectOptions};

use super::harness::{BenchResult, Row, Server, err, ms, percentile, run_to_close};

/// Counts the spans it is sent.
#[derive(Clone, Default)]
struct Collector(Arc<AtomicU64>);

#[tonic::async_trait]
impl opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::TraceService
    for Collector
{
    async fn export(
        &self,
        req: tonic::Request<
            opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest,
        >,
    ) -> Result<
        tonic::Response<
            opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceResponse,
        >,
        tonic::Status,
    > {
        let n: usize = req
            .into_inner()
            .resource_spans
            .iter()
            .flat_map(|r| r.scope_spans.iter())
            .map(|s| s.spans.len())
            .sum();
        self.0.fetch_add(n as u64, Ordering::Relaxed);
        Ok(tonic::Response::new(
            opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceResponse {
                partial_success: None,
            },
        ))
    }
}

async fn collector() -> BenchResult<(String, Arc<AtomicU64>)> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(err)?;
    let addr = listener.local_addr().map_err(err)?.to_string();
    let c = Collector::default();
    let spans = c.0.clone();
    exec_gateway::task::start(
        "bench-otlp-collector",
        tonic::transport::Server::builder()
            .add_service(
                opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::TraceServiceServer::new(c),
            )
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
    Ok((addr, spans))
}

/// A CA and a certificate for 127.0.0.1 it signed, written to `dir`.
fn certificates(dir: &Path) -> BenchResult<()> {
    let ca_key = rcgen::KeyPair::generate().map_err(err)?;
    let mut ca = rcgen::CertificateParams::new(Vec::<String>::new()).map_err(err)?;
    ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let ca_cert = ca.self_signed(&ca_key).map_err(err)?;
    let issuer = rcgen::Issuer::new(ca, ca_key);
    let key = rcgen::KeyPair::generate().map_err(err)?;
    let leaf = rcgen::CertificateParams::new(vec!["127.0.0.1".to_owned()])
        .map_err(err)?
        .signed_by(&key, &issuer)
        .map_err(err)?;
    std::fs::write(dir.join("ca.crt"), ca_cert.pem()).map_err(err)?;
    std::fs::write(dir.join("tls.crt"), leaf.pem()).map_err(err)?;
    std::fs::write(dir.join("tls.key"), key.serialize_pem()).map_err(err)?;
    Ok(())
}

/// A gateway on `base` plus `extra` (a TOML fragment placed first).
async fn gateway(
    exe: &Path,
    dir: &Path,
    name: &str,
    base: &str,
    extra: &str,
) -> BenchResult<Server> {
    let path = dir.join(format!("edges-{name}.toml"));
    // `[server]` keys of the base go first; the extra sections after. The
    // clients' sessions sit idle while the others are measured: longer
    // than the default detach TTL at the default iteration count.
    let base = base.replacen("[server]\n", "[server]\ndetach_ttl = \"10m\"\n", 1);
    std::fs::write(&path, format!("{base}\n{extra}")).map_err(err)?;
    Server::gateway(exe, &path.display().to_string()).await
}

async fn connect(url: &str, token: &str, ca: Option<&Path>) -> BenchResult<Client> {
    let mut o = ConnectOptions::new(url, token);
    o.ca = ca.map(Path::to_path_buf);
    Client::connect_with(o).await.map_err(err)
}

/// Process ids unique across rounds on one session.
static NEXT_ID: AtomicU64 = AtomicU64::new(0);

fn next_id(prefix: &str) -> String {
    format!("{prefix}{}", NEXT_ID.fetch_add(1, Ordering::Relaxed))
}

/// `true` start→closed p50 on one connection.
async fn spawn_p50(c: &Client, n: usize) -> BenchResult<Duration> {
    let mut lat = Vec::with_capacity(n);
    for i in 0..n + 20 {
        let t = Instant::now();
        run_to_close(c, &next_id("e"), &["true"], "/tmp").await?;
        if i >= 20 {
            lat.push(t.elapsed());
        }
    }
    lat.sort();
    Ok(percentile(&lat, 0.5))
}

/// Output of `head -c bytes /dev/zero`, best of two, MB/s.
async fn output(c: &Client, bytes: u64) -> BenchResult<f64> {
    let count = bytes.to_string();
    let mut best: f64 = 0.0;
    for _ in 0..2 {
        let t = Instant::now();
        let got = run_to_close(
            c,
            &next_id("big"),
            &["head", "-c", &count, "/dev/zero"],
            "/tmp",
        )
        .await?;
        if got != bytes {
            return Err(format!("received {got} of {bytes} bytes"));
        }
        best = best.max(bytes as f64 / t.elapsed().as_secs_f64() / 1e6);
    }
    Ok(best)
}

fn pct(a: f64, b: f64) -> String {
    format!("{:.0}%", a / b * 100.0)
}

fn delta(a: Duration, b: Duration) -> String {
    format!("{:+.0} µs", (a.as_secs_f64() - b.as_secs_f64()) * 1e6)
}

/// The rows: each edge on against off, alternated, the better of two
/// rounds for each (the machine's noise is larger than some of them).
pub async fn figures(
    exe: &Path,
    dir: &Path,
    config: &str,
    token: &str,
    iterations: usize,
    output_bytes: u64,
) -> BenchResult<Vec<Row>> {
    let base = std::fs::read_to_string(config).map_err(err)?;
    let tls_dir = dir.join("edges-tls");
    std::fs::create_dir_all(&tls_dir).map_err(err)?;
    certificates(&tls_dir)?;
    let ca = tls_dir.join("ca.crt");
    let d = tls_dir.display();
    // `[server]` tables: a subtable must follow the keys of [server], so
    // these go after the base (which ends in [tenants.*] tables).
    let tls = format!("[server.tls]\ncert_file = \"{d}/tls.crt\"\nkey_file = \"{d}/tls.key\"\n");
    let audit = format!("[audit]\nfile = \"{}/edges-audit.jsonl\"\n", dir.display());
    let (collector_addr, spans) = collector().await?;
    let tracing = format!("[tracing]\notlp_endpoint = \"http://{collector_addr}\"\n");
    let plain = gateway(exe, dir, "plain", &base, "").await?;
    let tls_gw = gateway(exe, dir, "tls", &base, &tls).await?;
    let audited = gateway(exe, dir, "audit", &base, &audit).await?;
    let traced = gateway(exe, dir, "tracing", &base, &tracing).await?;
    let grpc = |s: &Server| -> BenchResult<String> {
        s.grpc
            .clone()
            .ok_or_else(|| "no gRPC listener".to_owned())
            .map(|g| g.replace("http://", "grpc://"))
    };
    let tls_grpc = grpc(&tls_gw)?.replace("grpc://", "grpcs://");
    let ws_plain = connect(&plain.url, token, None).await?;
    let ws_tls = connect(&tls_gw.url, token, Some(&ca)).await?;
    let g_plain = connect(&grpc(&plain)?, token, None).await?;
    let g_tls = connect(&tls_grpc, token, Some(&ca)).await?;
    let ws_audit = connect(&audited.url, token, None).await?;
    let ws_traced = connect(&traced.url, token, None).await?;
    let mut best = [Duration::MAX; 8];
    for _ in 0..2 {
        for (i, c) in [&ws_plain, &ws_tls, &g_plain, &g_tls, &ws_audit, &ws_traced]
            .iter()
            .enumerate()
        {
            best[i] = best[i].min(spawn_p50(c, iterations).await?);
        }
    }
    let ws_mb = (
        output(&ws_plain, output_bytes).await?,
        output(&ws_tls, output_bytes).await?,
    );
    let g_mb = (
        output(&g_plain, output_bytes).await?,
        output(&g_tls, output_bytes).await?,
    );
    let exported = spans.load(Ordering::Relaxed);
    Ok(vec![
        Row::reported(
            "TLS cost: `true` p50 over wss:// vs ws://",
            ms(best[1]),
            format!("{} ws://", ms(best[0])),
            delta(best[1], best[0]),
        ),
        Row::reported(
            "TLS cost: output over wss:// vs ws://",
            format!("{:.0} MB/s", ws_mb.1),
            format!("{:.0} MB/s ws://", ws_mb.0),
            pct(ws_mb.1, ws_mb.0),
        ),
        Row::reported(
            "TLS cost: `true` p50 over gRPC+TLS vs gRPC",
            ms(best[3]),
            format!("{} gRPC", ms(best[2])),
            delta(best[3], best[2]),
        ),
        Row::reported(
            "TLS cost: output over gRPC+TLS vs gRPC",
            format!("{:.0} MB/s", g_mb.1),
            format!("{:.0} MB/s gRPC", g_mb.0),
            pct(g_mb.1, g_mb.0),
        ),
        Row::reported(
            "audit trail cost: `true` p50 (on/off)",
            ms(best[4]),
            format!("{} off", ms(best[0])),
            delta(best[4], best[0]),
        ),
        Row::reported(
            "tracing cost: `true` p50, every call exported (on/off)",
            ms(best[5]),
            format!("{} off", ms(best[0])),
            format!("{} ({exported} spans)", delta(best[5], best[0])),
        ),
    ])
}
