//! Spans a single gateway exports for gRPC calls (docs/operations.md,
//! "Tracing"), received by an OTLP collector the test runs: a unary call
//! and a streaming `Exec` carrying `traceparent` each export their
//! `grpc.call` span, while the session and its processes live on, a
//! stream's span ends with the stream, and no exported span points at a
//! parent that was never exported.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::grpc::{authed, spec};
use common::{Gateway, event_timeout};
use exec_gateway::transport::grpc::pb;
use opentelemetry_proto::tonic::collector::trace::v1 as otlp;
use pb::process_service_client::ProcessServiceClient;
use pb::session_service_client::SessionServiceClient;
use tokio_stream::StreamExt as _;
use tonic::Request;

/// One exported span: name, trace id, span id, parent span id (empty for a root).
#[derive(Clone, Debug)]
struct Span {
    name: String,
    trace: Vec<u8>,
    id: Vec<u8>,
    parent: Vec<u8>,
    /// When it ended, in ns since the epoch (the gateway's clock, the test's host).
    end: u64,
}

type Received = std::sync::Arc<parking_lot::Mutex<Vec<Span>>>;

#[derive(Clone, Default)]
struct Collector(Received);

#[tonic::async_trait]
impl otlp::trace_service_server::TraceService for Collector {
    async fn export(
        &self,
        req: Request<otlp::ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<otlp::ExportTraceServiceResponse>, tonic::Status> {
        for rs in req.into_inner().resource_spans {
            for ss in rs.scope_spans {
                for sp in ss.spans {
                    self.0.lock().push(Span {
                        name: sp.name,
                        trace: sp.trace_id,
                        id: sp.span_id,
                        parent: sp.parent_span_id,
                        end: sp.end_time_unix_nano,
                    });
                }
            }
        }
        Ok(tonic::Response::new(otlp::ExportTraceServiceResponse {
            partial_success: None,
        }))
    }
}

/// An OTLP/gRPC collector on loopback: its address and what it received.
async fn collector() -> (String, Received) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let c = Collector::default();
    let received = c.0.clone();
    exec_gateway::task::start(
        "otlp-collector",
        tonic::transport::Server::builder()
            .add_service(otlp::trace_service_server::TraceServiceServer::new(c))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
    (addr, received)
}

fn hex(s: &str) -> Vec<u8> {
    (0..s.len() / 2)
        .map(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).unwrap())
        .collect()
}

/// `msg` authorised by `token`, continuing trace `trace` from the client's span `parent`.
fn traced<T>(msg: T, token: &str, trace: &str, parent: &str) -> Request<T> {
    let mut req = authed(msg, token);
    req.metadata_mut().insert(
        "traceparent",
        format!("00-{trace}-{parent}-01").parse().unwrap(),
    );
    req
}

/// Trace `trace` has its `grpc.call` span, a child of the client's span
/// `client`, and every span of it has an exported parent.
fn whole(got: &[Span], trace: &str, client: &str) -> bool {
    let (trace, client) = (hex(trace), hex(client));
    let spans: Vec<&Span> = got.iter().filter(|s| s.trace == trace).collect();
    let call = spans
        .iter()
        .any(|s| s.name == "grpc.call" && s.parent == client);
    call && spans
        .iter()
        .all(|s| s.parent == client || spans.iter().any(|p| p.id == s.parent))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_calls_export_their_span_while_the_session_lives() {
    let (addr, received) = collector().await;
    // Sessions outlive the test (a detached one is kept an hour).
    let gw = Gateway::start(&format!(
        "[server]\ndetach_ttl = \"1h\"\n\
         [tracing]\notlp_endpoint = \"http://{addr}\"\nexport_timeout = \"2s\"\n"
    ));
    let token = gw.token("t1");
    let ch = common::grpc::channel(&gw.grpc).await;
    let client = "00f067aa0ba902b7";

    // Unary: the session it opens stays (its detach timer, its tasks).
    let created = "4bf92f3577b34da6a3ce929d0e0e4736";
    let sid = SessionServiceClient::new(ch.clone())
        .create_session(traced(
            pb::CreateSessionRequest::default(),
            &token,
            created,
            client,
        ))
        .await
        .unwrap()
        .into_inner()
        .session_id;
    common::eventually("CreateSession's grpc.call exported", || {
        whole(&received.lock(), created, client)
    })
    .await;

    // Streaming, in that session and in one of its own: the process
    // runs until the test has its first event, then is terminated (its
    // stream read to the end) or its stream dropped (the call cancelled,
    // its own session removed).
    for (trace, session_id) in [
        ("5bf92f3577b34da6a3ce929d0e0e4736", sid.clone()),
        ("6bf92f3577b34da6a3ce929d0e0e4736", String::new()),
    ] {
        let process_id = format!("e{}", &trace[..1]);
        let mut stream = ProcessServiceClient::new(ch.clone())
            .exec(traced(
                pb::ExecRequest {
                    session_id: session_id.clone(),
                    spec: Some(spec(&process_id, &["sh", "-c", "echo a; exec sleep 600"])),
                },
                &token,
                trace,
                client,
            ))
            .await
            .unwrap()
            .into_inner();
        let next = async |s: &mut tonic::Streaming<pb::ExecResponse>| {
            tokio::time::timeout(event_timeout(), s.next())
                .await
                .expect("event timeout")
        };
        assert!(next(&mut stream).await.is_some(), "a first event");
        // The call is still being served: its span has not ended.
        let first = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64;
        if session_id.is_empty() {
            drop(stream);
        } else {
            ProcessServiceClient::new(ch.clone())
                .terminate(authed(
                    pb::TerminateRequest {
                        session_id,
                        process_id,
                    },
                    &token,
                ))
                .await
                .unwrap();
            while next(&mut stream).await.is_some() {}
        }
        common::eventually("Exec's grpc.call exported, every span's parent too", || {
            whole(&received.lock(), trace, client)
        })
        .await;
        let got = received.lock();
        let call = got
            .iter()
            .find(|s| s.name == "grpc.call" && s.trace == hex(trace))
            .unwrap();
        assert!(
            call.end >= first,
            "{trace}: grpc.call ended with its stream, not before: {} < {first}",
            call.end
        );
    }
}
