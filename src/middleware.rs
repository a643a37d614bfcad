//! The tower stack every call passes through, whatever door it came in by.
//! [`stack`] is the only place layer order is decided; read it top to bottom.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::sync::OwnedSemaphorePermit;
use tower::util::BoxCloneSyncService;
use tower::{BoxError, Layer, Service, ServiceBuilder, ServiceExt as _};
use tracing::Instrument as _;

use crate::dispatch::{Dispatch, RpcRequest};
use crate::error::GatewayError;
use crate::metrics::{Metrics, QuotaLabels, ShedLabels};
use crate::rpc::Outcome;

/// The service type every transport calls.
pub type RpcService = BoxCloneSyncService<RpcRequest, Outcome, GatewayError>;

/// Limits the stack enforces gateway-wide (per-tenant ones live on the tenant).
#[derive(Debug, Clone)]
pub struct StackSettings {
    /// Calls in flight in this gateway before new ones are shed (-32001).
    pub max_in_flight: usize,
    /// Deadline of a call; a `process/read` gets its `waitMs` on top.
    pub request_timeout: Duration,
}

/// Build the stack.
pub fn stack(settings: &StackSettings, metrics: Arc<Metrics>) -> RpcService {
    let svc = ServiceBuilder::new()
        // Outermost: one span per call covering everything below, so a call
        // refused by any layer is still traced with its method and tenant.
        .layer(TraceLayer)
        // Counts every outcome (ok, or the error kind), refusals included,
        // labelled by the (configured, hence bounded) tenant name.
        .layer(ObserveLayer {
            metrics: metrics.clone(),
            observe: count_request,
        })
        // Recover sits above every layer that fails with a BoxError and
        // turns them into typed GatewayErrors; nothing above it sees a BoxError.
        .map_err(recover)
        // Gateway-wide protection first: shed at once (-32001) rather than
        // queue when the gateway's in-flight limit is full.
        .load_shed()
        .concurrency_limit(settings.max_in_flight)
        // Authorize by scope before spending anything of the tenant's:
        // a forbidden call must not eat its rate budget.
        .layer(GuardLayer::new(authorize))
        // Per-tenant rate (governor, keyed by the tenant through its own
        // limiter): one tenant's flood cannot take another's budget.
        .layer(GuardLayer::new(rate_limit(metrics.clone())))
        // Per-tenant in-flight bound with shedding: the permit is held for
        // the call, so a tenant's slow calls only fill its own slots.
        .layer(GuardLayer::new(tenant_concurrency(metrics.clone())))
        // Quota refusals are counted where they are decided (handlers), here.
        .layer(ObserveLayer {
            metrics,
            observe: count_refusal,
        })
        // The deadline applies to the handler's own work only, so time spent
        // above is never charged against it.
        .layer(DeadlineLayer {
            timeout: settings.request_timeout,
        })
        // Innermost: the backend that runs the call's session.
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

type Permit = Option<OwnedSemaphorePermit>;

fn authorize(req: &RpcRequest) -> Result<Permit, GatewayError> {
    match req.op.scope() {
        Some(scope) if !req.ctx.principal.scopes.grants(scope) => {
            Err(GatewayError::MissingScope(scope.name()))
        }
        _ => Ok(None),
    }
}

fn rate_limit(
    metrics: Arc<Metrics>,
) -> impl Fn(&RpcRequest) -> Result<Permit, GatewayError> + Clone {
    move |req| {
        let tenant = &req.ctx.tenant;
        match tenant.limiter.check() {
            Ok(()) => Ok(None),
            Err(not_until) => {
                let wait = not_until.wait_time_from(governor::clock::Clock::now(
                    &governor::clock::DefaultClock::default(),
                ));
                metrics
                    .shed
                    .get_or_create(&ShedLabels {
                        tenant: tenant.name.to_string(),
                        reason: "rate".to_owned(),
                    })
                    .inc();
                Err(GatewayError::RateLimited {
                    retry_after_ms: u64::try_from(wait.as_millis()).unwrap_or(u64::MAX).max(1),
                })
            }
        }
    }
}

fn tenant_concurrency(
    metrics: Arc<Metrics>,
) -> impl Fn(&RpcRequest) -> Result<Permit, GatewayError> + Clone {
    move |req| {
        let tenant = &req.ctx.tenant;
        match tenant.in_flight.clone().try_acquire_owned() {
            Ok(permit) => Ok(Some(permit)),
            Err(_) => {
                metrics
                    .shed
                    .get_or_create(&ShedLabels {
                        tenant: tenant.name.to_string(),
                        reason: "tenant_concurrency".to_owned(),
                    })
                    .inc();
                Err(GatewayError::Overloaded)
            }
        }
    }
}

type BoxFut = Pin<Box<dyn Future<Output = Result<Outcome, GatewayError>> + Send>>;

// === Guard ===

/// Runs a check before the inner service; on success holds the returned
/// guard (if any) until the call completes.
#[derive(Clone)]
pub struct GuardLayer<F> {
    check: F,
}

impl<F> GuardLayer<F> {
    pub fn new(check: F) -> Self {
        Self { check }
    }
}

impl<S, F: Clone> Layer<S> for GuardLayer<F> {
    type Service = Guard<S, F>;
    fn layer(&self, inner: S) -> Guard<S, F> {
        Guard {
            inner,
            check: self.check.clone(),
        }
    }
}

#[derive(Clone)]
pub struct Guard<S, F> {
    inner: S,
    check: F,
}

impl<S, F> Service<RpcRequest> for Guard<S, F>
where
    S: Service<RpcRequest, Response = Outcome, Error = GatewayError> + Clone + Send + 'static,
    S::Future: Send + 'static,
    F: Fn(&RpcRequest) -> Result<Permit, GatewayError>,
{
    type Response = Outcome;
    type Error = GatewayError;
    type Future = BoxFut;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: RpcRequest) -> Self::Future {
        match (self.check)(&req) {
            Err(e) => Box::pin(std::future::ready(Err(e))),
            Ok(guard) => {
                let clone = self.inner.clone();
                let mut inner = std::mem::replace(&mut self.inner, clone);
                Box::pin(async move {
                    let result = inner.call(req).await;
                    drop(guard);
                    result
                })
            }
        }
    }
}

// === Metrics ===

/// What an [`Observe`] layer records of a finished call: the metrics, the
/// tenant, the method and the result.
type Observer = fn(&Metrics, &str, &'static str, &Result<Outcome, GatewayError>);

/// Records each call's outcome with an [`Observer`] (the request counter
/// near the top of the stack, quota and slot refusals near the handler).
#[derive(Clone)]
pub struct ObserveLayer {
    metrics: Arc<Metrics>,
    observe: Observer,
}

impl<S> Layer<S> for ObserveLayer {
    type Service = Observe<S>;
    fn layer(&self, inner: S) -> Observe<S> {
        Observe {
            inner,
            metrics: self.metrics.clone(),
            observe: self.observe,
        }
    }
}

#[derive(Clone)]
pub struct Observe<S> {
    inner: S,
    metrics: Arc<Metrics>,
    observe: Observer,
}

impl<S> Service<RpcRequest> for Observe<S>
where
    S: Service<RpcRequest, Response = Outcome, Error = GatewayError> + Clone + Send + 'static,
    S::Future: Send + 'static,
{
    type Response = Outcome;
    type Error = GatewayError;
    type Future = BoxFut;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: RpcRequest) -> Self::Future {
        let method = req.op.method();
        let tenant = req.ctx.tenant.name.clone();
        let (metrics, observe) = (self.metrics.clone(), self.observe);
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        Box::pin(async move {
            let result = inner.call(req).await;
            observe(&metrics, &tenant, method, &result);
            result
        })
    }
}

/// Every outcome (ok, or the error kind) by tenant and method.
fn count_request(
    metrics: &Metrics,
    tenant: &str,
    method: &'static str,
    result: &Result<Outcome, GatewayError>,
) {
    let outcome = match result {
        Ok(_) => "ok",
        Err(e) => e.outcome(),
    };
    metrics.count_request(tenant, method, outcome);
}

/// -32006 refusals by tenant and quota name, and refusals for want of a
/// gateway-wide process slot (decided by the handlers, counted here).
fn count_refusal(
    metrics: &Metrics,
    tenant: &str,
    _method: &'static str,
    result: &Result<Outcome, GatewayError>,
) {
    match result {
        Err(GatewayError::QuotaExceeded { quota, .. }) => {
            metrics
                .quota_refused
                .get_or_create(&QuotaLabels {
                    tenant: tenant.to_owned(),
                    quota: (*quota).to_owned(),
                })
                .inc();
        }
        Err(GatewayError::Overloaded) => {
            metrics
                .shed
                .get_or_create(&ShedLabels {
                    tenant: tenant.to_owned(),
                    reason: "gateway_processes".to_owned(),
                })
                .inc();
        }
        _ => {}
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
    S: Service<RpcRequest, Response = Outcome, Error = GatewayError> + Clone + Send + 'static,
    S::Future: Send + 'static,
{
    type Response = Outcome;
    type Error = GatewayError;
    type Future = BoxFut;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: RpcRequest) -> Self::Future {
        let method = req.op.method();
        let span = tracing::debug_span!(
            "rpc",
            rpc.method = method,
            tenant = %req.ctx.tenant.name,
            session.id = req.ctx.session.as_ref().map(|s| s.id.as_str())
        );
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
    S: Service<RpcRequest, Response = Outcome, Error = GatewayError> + Clone + Send + 'static,
    S::Future: Send + 'static,
{
    type Response = Outcome;
    type Error = GatewayError;
    type Future = BoxFut;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: RpcRequest) -> Self::Future {
        // A long-poll's own wait is part of its contract, not lateness.
        let extra = req.op.contracted_wait();
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
