//! The one place tasks are started: every task is named and carries the
//! current tracing span, so a stuck task can be found by name.

use std::future::Future;

use tokio::task::JoinHandle;
use tracing::Instrument as _;

/// Start a named task in the current span ("spawn" is for processes).
#[expect(
    clippy::disallowed_methods,
    reason = "the single chokepoint for tokio::spawn"
)]
pub fn start<F>(name: &'static str, fut: F) -> JoinHandle<F::Output>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    let span = tracing::debug_span!("task", task.name = name);
    tokio::spawn(fut.instrument(span))
}
