//! The tower stack every call passes through, whatever door it came in by.
//! [`stack`] is the only place layer order is decided; read it top to bottom.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tower::util::BoxCloneSyncService;
use tower::{BoxError, Layer, Service, ServiceBuilder, ServiceExt as _};
use tracing::Instrument as _;

use crate::dispatch::Dispatch;
use crate::error::GatewayError;
use crate::rpc::{Call, Reply, RpcRequest};

/// The service type every transport calls.
pub type RpcService = BoxCloneSyncService<RpcRequest, Reply, GatewayError>;

/// Limits the stack enforces.
#[derive(Debug, Clone)]
pub struct StackSettings {
    /// Calls in flight in this gateway before new ones are shed (-32001).
    pub max_in_flight: usize,
    /// Deadline of a call; a `process/read` gets its `waitMs` on top.
    pub request_timeout: Duration,
}

/// Build the stack.
pub fn stack(settings: &StackSettings) -> RpcService {
    let svc = ServiceBuilder::new()
        // Outermost: the span covers everything below, including shedding,
        // so a shed or timed-out call is still traced with its method.
        .layer(TraceLayer)
        // Recover sits above every layer that fails with a BoxError and
        // turns them into typed GatewayErrors; nothing below it needs to know
        // wire codes, nothing above it sees a BoxError.
        .map_err(recover)
        // Shed instead of queueing: when the in-flight limit below is full,
        // answer -32001 at once so a client retries elsewhere (no unbounded queue).
        .load_shed()
        // Bound the gateway's in-flight calls (fs work and long-polls included).
        .concurrency_limit(settings.max_in_flight)
        // Innermost: the deadline applies to the handler's own work only, so
        // time spent shedding is never charged against it.
        .layer(DeadlineLayer {
            timeout: settings.request_timeout,
        })
        .service(Dispatch);
    BoxCloneSyncService::new(svc)
}

fn recover(e: BoxError) -> GatewayError {
    match e.downcast::<GatewayError>() {
        Ok(g) => *g,
        Err(e) if e.is::<tower::load_shed::error::Overloaded>() => GatewayError::Overloaded,
        Err(e) => {
            tracing::error!(error = %e, "unexpected error in the stack");
            GatewayError::Internal("internal error".to_owned())
        }
    }
}

// === Trace ===

/// One span per call; the outcome logged once, never with params.
#[derive(Debug, Clone, Copy)]
pub struct TraceLayer;

impl<S> Layer<S> for TraceLayer {
    type Service = Trace<S>;
    fn layer(&self, inner: S) -> Trace<S> {
        Trace { inner }
    }
}

#[derive(Debug, Clone)]
pub struct Trace<S> {
    inner: S,
}

impl<S> Service<RpcRequest> for Trace<S>
where
    S: Service<RpcRequest, Response = Reply, Error = GatewayError> + Clone + Send + 'static,
    S::Future: Send + 'static,
{
    type Response = Reply;
    type Error = GatewayError;
    type Future = Pin<Box<dyn Future<Output = Result<Reply, GatewayError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: RpcRequest) -> Self::Future {
        let method = req.call.method();
        let span =
            tracing::debug_span!("rpc", rpc.method = method, session.id = %req.ctx.session.id);
        // Clone-and-swap: the ready service handles this call.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        Box::pin(
            async move {
                let result = inner.call(req).await;
                // Handler errors are mostly the caller's (a missing binary, a
                // bad path): debug. Our own failures are logged where they
                // arise, with their source chain (see `recover`).
                if let Err(e) = &result {
                    tracing::debug!(error = %e, "call failed");
                }
                result
            }
            .instrument(span),
        )
    }
}

// === Deadline ===

/// Fails a call with -32005 once its deadline passes.
#[derive(Debug, Clone, Copy)]
pub struct DeadlineLayer {
    timeout: Duration,
}

impl<S> Layer<S> for DeadlineLayer {
    type Service = Deadline<S>;
    fn layer(&self, inner: S) -> Deadline<S> {
        Deadline {
            inner,
            timeout: self.timeout,
        }
    }
}

#[derive(Debug, Clone)]
pub struct Deadline<S> {
    inner: S,
    timeout: Duration,
}

impl<S> Service<RpcRequest> for Deadline<S>
where
    S: Service<RpcRequest, Response = Reply, Error = GatewayError> + Clone + Send + 'static,
    S::Future: Send + 'static,
{
    type Response = Reply;
    type Error = GatewayError;
    type Future = Pin<Box<dyn Future<Output = Result<Reply, GatewayError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: RpcRequest) -> Self::Future {
        // A long-poll's own wait is part of its contract, not lateness.
        let extra = match &req.call {
            Call::ProcessRead(p) => {
                Duration::from_millis(p.wait_ms.unwrap_or(0)).min(crate::exec::MAX_READ_WAIT)
            }
            _ => Duration::ZERO,
        };
        let fut = self.inner.clone().oneshot(req);
        let timeout = self.timeout + extra;
        Box::pin(async move {
            match tokio::time::timeout(timeout, fut).await {
                Ok(r) => r,
                Err(_) => Err(GatewayError::DeadlineExceeded),
            }
        })
    }
}
