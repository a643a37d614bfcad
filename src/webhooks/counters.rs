//! The webhooks' metrics (registered by the gateway's metrics module,
//! under `exec_gateway_webhook_…`).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct EndpointLabel {
    pub endpoint: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct GiveUpLabels {
    pub endpoint: String,
    /// `rejected` (a 4xx other than 408 and 429, a redirect), `expired`
    /// (attempts or age spent).
    pub reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DropLabel {
    /// `queue_full`, `too_large`.
    pub reason: String,
}

/// One per gateway; clones share the series.
#[derive(Clone, Debug, Default)]
pub struct WebhookMetrics {
    pub delivered: Family<EndpointLabel, Counter>,
    pub failed_attempts: Family<EndpointLabel, Counter>,
    pub given_up: Family<GiveUpLabels, Counter>,
    pub dropped: Family<DropLabel, Counter>,
    pub spool_errors: Counter,
    pub queue_depth: Gauge,
    pub queue_bytes: Gauge,
}

impl WebhookMetrics {
    pub fn register(&self, r: &mut Registry) {
        r.register(
            "webhook_delivered",
            "Webhook messages an endpoint answered with 2xx",
            self.delivered.clone(),
        );
        r.register(
            "webhook_failed_attempts",
            "Webhook delivery attempts that failed and will be retried or given up (network error, timeout, 5xx, 429, 4xx)",
            self.failed_attempts.clone(),
        );
        r.register(
            "webhook_given_up",
            "Webhook messages no longer sent: refused by the endpoint (4xx) or out of attempts or age",
            self.given_up.clone(),
        );
        r.register(
            "webhook_dropped",
            "Webhook messages never queued: the queue was full (events or bytes) or the event too large",
            self.dropped.clone(),
        );
        r.register(
            "webhook_spool_errors",
            "Webhook messages that could not be written to or removed from the spool (delivered from memory; not kept across a restart)",
            self.spool_errors.clone(),
        );
        r.register(
            "webhook_queue_depth",
            "Webhook messages waiting for delivery (each endpoint's copy counts once)",
            self.queue_depth.clone(),
        );
        r.register(
            "webhook_queue_bytes",
            "Bytes of webhook message bodies waiting for delivery",
            self.queue_bytes.clone(),
        );
    }

    pub(super) fn drop(&self, reason: &str, n: u64) {
        self.dropped
            .get_or_create(&DropLabel {
                reason: reason.to_owned(),
            })
            .inc_by(n);
    }
}
