//! `[tracing]`: spans exported over OTLP (module `telemetry`). Off unless
//! `otlp_endpoint` is set.

use serde::Deserialize;

use super::common::{ConfigError, duration};
pub use crate::telemetry::TracingSettings;

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TracingConfig {
    /// The collector's OTLP/gRPC endpoint (`http://HOST:4317`).
    pub otlp_endpoint: Option<String>,
    /// Share of traces started here that are kept, 0 to 1. Default 1; a
    /// client's sampled flag decides for the traces it starts.
    pub sample_ratio: Option<f64>,
    /// `service.name` of the spans. Default `exec-gateway`.
    pub service_name: Option<String>,
    /// Spans waiting for export, at most (then dropped). Default 2048.
    pub max_queue: Option<usize>,
    /// How long one export may take. Default `10s`.
    pub export_timeout: Option<String>,
}

pub const DEFAULT_TRACING_QUEUE: usize = 2048;
pub const MAX_TRACING_QUEUE: usize = 1 << 20;

pub(super) fn validate_tracing(
    t: &TracingConfig,
    replica: Option<&str>,
) -> Result<Option<TracingSettings>, ConfigError> {
    let Some(endpoint) = &t.otlp_endpoint else {
        return Ok(None);
    };
    if !(endpoint.starts_with("http://") || endpoint.starts_with("https://")) {
        return Err(ConfigError(format!(
            "tracing.otlp_endpoint `{endpoint}`: expected http://HOST:PORT (OTLP over gRPC)"
        )));
    }
    let sample_ratio = t.sample_ratio.unwrap_or(1.0);
    if !(0.0..=1.0).contains(&sample_ratio) {
        return Err(ConfigError(
            "tracing.sample_ratio must be between 0 and 1".to_owned(),
        ));
    }
    let max_queue = t.max_queue.unwrap_or(DEFAULT_TRACING_QUEUE);
    if max_queue == 0 || max_queue > MAX_TRACING_QUEUE {
        return Err(ConfigError(format!(
            "tracing.max_queue must be between 1 and {MAX_TRACING_QUEUE}"
        )));
    }
    Ok(Some(TracingSettings {
        otlp_endpoint: endpoint.clone(),
        sample_ratio,
        service_name: t
            .service_name
            .clone()
            .unwrap_or_else(|| "exec-gateway".to_owned()),
        instance: replica.map(str::to_owned),
        max_queue,
        max_batch: 512,
        export_timeout: duration(
            "tracing.export_timeout",
            t.export_timeout.as_deref(),
            std::time::Duration::from_secs(10),
        )?,
    }))
}
