//! The one place tasks are started: every task is named and continues the
//! current trace, so a stuck task can be found by name.

use std::future::Future;

use tokio::task::JoinHandle;
use tracing::Instrument as _;
use tracing_opentelemetry::OpenTelemetrySpanExt as _;

/// Start a named task in the current trace ("spawn" is for processes).
///
/// The task's span is a root for the subscriber (`parent: None`); when
/// spans are exported it continues the current span's trace, that span
/// its OpenTelemetry parent. A span is exported only once it and every
/// span inside it have closed: a long-lived task (a detached session's timer, a process's pumps, a
/// stream's forwarding) inside the call's span would keep `grpc.call` or
/// `jsonrpc.call` open for the task's life, and it never reached the
/// collector while the session lived (issue 42, item 13).
#[expect(
    clippy::disallowed_methods,
    reason = "the single chokepoint for tokio::spawn"
)]
pub fn start<F>(name: &'static str, fut: F) -> JoinHandle<F::Output>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    let span = tracing::debug_span!(parent: None, "task", task.name = name);
    let current = tracing::Span::current();
    // Without the exporter (no OpenTelemetry layer) both are no-ops.
    let _ = span.set_parent(current.context());
    tokio::spawn(fut.instrument(span))
}
