//! Logging setup: `tracing` to stderr (stdout is the protocol or the bound
//! URL), filtered by `RUST_LOG` with a crate default, text or JSON.

use tracing_subscriber::EnvFilter;

/// Log output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

/// Install the global subscriber (once per process).
/// Logging for the client commands: warnings only, unless `RUST_LOG`
/// says otherwise; stderr is the command's too.
pub fn init_client() {
    let mut filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("warn"));
    // Their traces print the handshake's headers, the token among them.
    for quiet in [
        "tungstenite=info",
        "tokio_tungstenite=info",
        "h2=info",
        "hyper=info",
    ] {
        if let Ok(d) = quiet.parse() {
            filter = filter.add_directive(d);
        }
    }
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}

pub fn init(format: LogFormat) {
    let filter = EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| EnvFilter::new("exec_gateway=info,warn"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let result = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
    if let Err(e) = result {
        eprintln!("exec-gateway: logging already initialised: {e}");
    }
}

// === Distributed tracing (OpenTelemetry, OTLP) ===

use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use opentelemetry::propagation::TextMapPropagator as _;
use opentelemetry::trace::TracerProvider as _;
use tracing_opentelemetry::OpenTelemetrySpanExt as _;
use tracing_subscriber::Layer as _;
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;

/// `[tracing]`: spans exported over OTLP (module `config::tracing`).
#[derive(Debug, Clone, PartialEq)]
pub struct TracingSettings {
    /// The collector's OTLP/gRPC endpoint, e.g. `http://otel-collector:4317`.
    pub otlp_endpoint: String,
    /// Share of traces started here that are sampled (0 to 1); a trace a
    /// client started follows the client's sampled flag.
    pub sample_ratio: f64,
    pub service_name: String,
    /// `service.instance.id`: the fleet replica, when in a fleet.
    pub instance: Option<String>,
    /// Spans waiting for export; past it they are dropped (the SDK counts
    /// them in its own log).
    pub max_queue: usize,
    /// Spans per export call.
    pub max_batch: usize,
    pub export_timeout: Duration,
}

static PROVIDER: OnceLock<opentelemetry_sdk::trace::SdkTracerProvider> = OnceLock::new();
static EXPORTING: AtomicBool = AtomicBool::new(false);

/// Whether spans are exported (callers skip trace-context work otherwise).
pub fn exporting() -> bool {
    EXPORTING.load(Ordering::Relaxed)
}

/// [`init`], with spans exported over OTLP when `tracing` is set. Needs a
/// tokio runtime (the exporter's gRPC channel runs on it).
pub fn init_with(format: LogFormat, tracing: Option<&TracingSettings>) -> Result<(), String> {
    let Some(t) = tracing else {
        init(format);
        return Ok(());
    };
    use opentelemetry_otlp::WithExportConfig as _;
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_tonic()
        .with_endpoint(t.otlp_endpoint.clone())
        .with_timeout(t.export_timeout)
        .build()
        .map_err(|e| format!("tracing: OTLP exporter: {e}"))?;
    let batch = opentelemetry_sdk::trace::BatchConfigBuilder::default()
        .with_max_queue_size(t.max_queue)
        .with_max_export_batch_size(t.max_batch.min(t.max_queue))
        .with_scheduled_delay(Duration::from_millis(500))
        .build();
    let processor = opentelemetry_sdk::trace::BatchSpanProcessor::builder(exporter)
        .with_batch_config(batch)
        .build();
    use opentelemetry_sdk::trace::Sampler;
    let provider = opentelemetry_sdk::trace::SdkTracerProvider::builder()
        .with_span_processor(processor)
        .with_sampler(Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(
            t.sample_ratio,
        ))))
        .with_resource(
            opentelemetry_sdk::Resource::builder()
                .with_service_name(t.service_name.clone())
                .with_attributes(
                    t.instance
                        .iter()
                        .map(|i| opentelemetry::KeyValue::new("service.instance.id", i.clone())),
                )
                .build(),
        )
        .build();
    let tracer = provider.tracer("exec-gateway");
    // Only the gateway's own spans go out, never events (logs stay logs).
    let otel = tracing_opentelemetry::layer()
        .with_tracer(tracer)
        .with_filter(tracing_subscriber::filter::filter_fn(|m| {
            m.is_span() && m.target().starts_with("exec_gateway")
        }));
    let filter = EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| EnvFilter::new("exec_gateway=info,warn"));
    let fmt = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    let fmt = match format {
        LogFormat::Text => fmt.with_filter(filter).boxed(),
        LogFormat::Json => fmt.json().with_filter(filter).boxed(),
    };
    tracing_subscriber::registry()
        .with(otel)
        .with(fmt)
        .try_init()
        .map_err(|e| format!("tracing: logging already initialised: {e}"))?;
    let _ = PROVIDER.set(provider);
    EXPORTING.store(true, Ordering::Relaxed);
    Ok(())
}

/// Export what is queued and stop the exporter (at shutdown).
pub fn shutdown_tracing() {
    if let Some(p) = PROVIDER.get() {
        let _ = p.force_flush();
        let _ = p.shutdown();
    }
}

/// A W3C trace context as a client sends it (JSON-RPC `trace`, gRPC
/// `traceparent`/`tracestate` metadata).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TraceContext {
    pub traceparent: String,
    pub tracestate: Option<String>,
}

/// Longest `tracestate` taken (W3C allows 32 members of ~256 bytes).
const MAX_TRACESTATE_BYTES: usize = 512;

impl TraceContext {
    /// A well-formed `traceparent` (`00-<32 hex>-<16 hex>-<2 hex>`), or
    /// nothing: a malformed one is ignored, never an error.
    pub fn parse(traceparent: &str, tracestate: Option<&str>) -> Option<TraceContext> {
        let b = traceparent.as_bytes();
        let hex = |r: std::ops::Range<usize>| b[r].iter().all(u8::is_ascii_hexdigit);
        let ok = b.len() == 55
            && b[2] == b'-'
            && b[35] == b'-'
            && b[52] == b'-'
            && hex(0..2)
            && hex(3..35)
            && hex(36..52)
            && hex(53..55);
        ok.then(|| TraceContext {
            traceparent: traceparent.to_owned(),
            tracestate: tracestate
                .filter(|s| s.len() <= MAX_TRACESTATE_BYTES)
                .map(str::to_owned),
        })
    }
}

/// Make `span` continue the caller's trace.
pub fn set_remote_parent(span: &tracing::Span, cx: &TraceContext) {
    let mut carrier = std::collections::HashMap::new();
    carrier.insert("traceparent".to_owned(), cx.traceparent.clone());
    if let Some(s) = &cx.tracestate {
        carrier.insert("tracestate".to_owned(), s.clone());
    }
    let parent = opentelemetry_sdk::propagation::TraceContextPropagator::new().extract(&carrier);
    let _ = span.set_parent(parent);
}

/// The trace context of `span`, to send to the next hop.
pub fn context_of(span: &tracing::Span) -> Option<TraceContext> {
    if !exporting() {
        return None;
    }
    let mut carrier = std::collections::HashMap::<String, String>::new();
    opentelemetry_sdk::propagation::TraceContextPropagator::new()
        .inject_context(&span.context(), &mut carrier);
    let traceparent = carrier.remove("traceparent")?;
    Some(TraceContext {
        traceparent,
        tracestate: carrier.remove("tracestate").filter(|s| !s.is_empty()),
    })
}

#[cfg(test)]
mod tests {
    use super::TraceContext;

    #[test]
    fn only_well_formed_traceparents_are_taken() {
        let good = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        assert!(TraceContext::parse(good, Some("k=v")).is_some());
        for bad in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-4bf92f3577b34da6a3ce929d0e0e473z-00f067aa0ba902b7-01",
            "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
        ] {
            assert!(TraceContext::parse(bad, None).is_none(), "{bad}");
        }
        let long = "x".repeat(600);
        let t = TraceContext::parse(good, Some(&long)).map(|t| t.tracestate);
        assert_eq!(t, Some(None));
    }

    #[test]
    fn the_envelope_trace_is_read_and_a_bad_one_ignored() {
        let t = crate::protocol::jsonrpc::trace_of(
            r#"{"id":1,"method":"x","trace":{"traceparent":"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}}"#,
        );
        assert!(t.is_some());
        for bad in [
            r#"{"id":1,"method":"x","trace":"00-4bf9"}"#,
            r#"{"id":1,"method":"x","trace":{"traceparent":7}}"#,
            r#"{"id":1,"method":"x"}"#,
        ] {
            assert!(crate::protocol::jsonrpc::trace_of(bad).is_none(), "{bad}");
        }
    }
}
