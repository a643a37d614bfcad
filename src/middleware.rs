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

mod audit;

use crate::dispatch::{Dispatch, RpcRequest};
use crate::error::GatewayError;
use crate::metrics::Metrics;
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

/// Build the stack over the dispatcher.
pub fn stack(settings: &StackSettings, metrics: Arc<Metrics>) -> RpcService {
    stack_over(settings, metrics, Dispatch)
}

/// Build the stack over any innermost service (its unit tests run it over
/// a fake handler).
pub fn stack_over<S>(settings: &StackSettings, metrics: Arc<Metrics>, inner: S) -> RpcService
where
    S: Service<RpcRequest, Response = Outcome, Error = GatewayError>
        + Clone
        + Send
        + Sync
        + 'static,
    S::Future: Send + 'static,
{
    let svc = ServiceBuilder::new()
        // Outermost: one span per call covering everything below, so a call
        // refused by any layer is still traced with its method and tenant.
        .layer(TraceLayer)
        // The audit trail (when on): successes it records and refusals by
        // any layer below.
        .layer(audit::AuditLayer)
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
        .service(inner);
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
        match tenant.check_rate() {
            Ok(()) => Ok(None),
            Err(not_until) => {
                let wait = not_until.wait_time_from(governor::clock::Clock::now(
                    &governor::clock::DefaultClock::default(),
                ));
                metrics.count_shed(&tenant.name, "rate");
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
                metrics.count_shed(&tenant.name, "tenant_concurrency");
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
/// What an [`ObserveLayer`] records of a call: its tenant, method, result
/// and how long it took.
type Observer = fn(&Metrics, &str, &'static str, &Result<Outcome, GatewayError>, Duration);

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
        // Lowered however the call ends (its future dropped unpolled too).
        metrics.calls_in_flight.inc();
        let in_flight = InFlight(metrics.clone());
        Box::pin(async move {
            let _in_flight = in_flight;
            let started = std::time::Instant::now();
            let result = inner.call(req).await;
            observe(&metrics, &tenant, method, &result, started.elapsed());
            result
        })
    }
}

/// One call counted in `calls_in_flight` until dropped.
struct InFlight(Arc<Metrics>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.calls_in_flight.dec();
    }
}

/// Every outcome (ok, or the error kind) by tenant and method.
fn count_request(
    metrics: &Metrics,
    tenant: &str,
    method: &'static str,
    result: &Result<Outcome, GatewayError>,
    took: Duration,
) {
    let outcome = match result {
        Ok(_) => "ok",
        Err(e) => e.outcome(),
    };
    metrics.count_request(tenant, method, outcome);
    metrics
        .request_seconds
        .get_or_create(&crate::metrics::MethodLabel {
            method: method.to_owned(),
        })
        .observe(took.as_secs_f64());
}

/// -32006 refusals by tenant and quota name, and refusals for want of a
/// gateway-wide process slot (decided by the handlers, counted here).
fn count_refusal(
    metrics: &Metrics,
    tenant: &str,
    _method: &'static str,
    result: &Result<Outcome, GatewayError>,
    _took: Duration,
) {
    match result {
        Err(GatewayError::QuotaExceeded { quota, .. }) => {
            metrics.count_quota(tenant, quota);
        }
        Err(GatewayError::Overloaded) => {
            metrics.count_shed(tenant, "gateway_processes");
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use std::sync::atomic::{AtomicUsize, Ordering};

    use tokio::sync::Semaphore;
    use tokio_util::sync::CancellationToken;

    use super::*;
    use crate::auth::{Principal, Scope, Scopes};
    use crate::backend::{Backend, OpFuture, SessionBackend};
    use crate::dispatch::RequestContext;
    use crate::outbound::Attachment;
    use crate::protocol::Empty;
    use crate::protocol::revision::RevisionCell;
    use crate::rpc::{Call, NoParams, Op, Reply};
    use crate::tenant::Tenant;

    /// A tenant's backend that is never reached: the fake handler stands
    /// in for the dispatcher.
    struct Unreached;

    impl Backend for Unreached {
        fn open_session(
            &self,
            _: Arc<Attachment>,
            _: Arc<RevisionCell>,
            _: crate::backend::Place,
        ) -> Result<Arc<dyn SessionBackend>, GatewayError> {
            unreachable!()
        }
        fn run_sessionless(&self, _: Op) -> OpFuture {
            unreachable!()
        }
        fn retire(&self) {}
    }

    /// Tenant `name` with `rate` requests per second (burst the same) and
    /// `in_flight` calls at once.
    fn tenant(metrics: &Metrics, name: &str, rate: u32, in_flight: usize) -> Arc<Tenant> {
        let key = std::env::temp_dir().join("exec-gateway-middleware-test.key");
        std::fs::write(&key, "k".repeat(40)).unwrap();
        let config: crate::config::Config = toml::from_str(&format!(
            "[[auth.keys]]\nalgorithm = \"HS256\"\nsecret_file = \"{}\"\n[tenants.{name}]\nroot = \"/\"\n",
            key.display()
        ))
        .unwrap();
        let mut settings = config.validate().unwrap().tenants.remove(name).unwrap();
        settings.requests_per_second = rate;
        settings.burst = rate;
        settings.max_in_flight = in_flight;
        settings.max_connections = 1;
        settings.max_streams = 1;
        Arc::new(Tenant::assemble(
            name,
            settings,
            Arc::new(Unreached),
            metrics.tenant(name),
        ))
    }

    fn request(tenant: &Arc<Tenant>, scopes: &[Scope]) -> RpcRequest {
        RpcRequest {
            op: Op::Call(Call::ProcessList(NoParams)),
            ctx: RequestContext {
                principal: Arc::new(Principal {
                    tenant: tenant.name.clone(),
                    subject: None,
                    scopes: Scopes::of(scopes),
                    expires_at: None,
                    key: crate::auth::KeyLife::default(),
                    image: None,
                }),
                tenant: tenant.clone(),
                session: None,
                place: None,
                evicted: CancellationToken::new(),
                reply: None,
            },
        }
    }

    /// A handler that counts its calls and, while `gate` is closed, waits.
    #[derive(Clone)]
    struct Fake {
        calls: Arc<AtomicUsize>,
        gate: Arc<Semaphore>,
    }

    impl Fake {
        fn open() -> Fake {
            Fake {
                calls: Arc::default(),
                gate: Arc::new(Semaphore::new(Semaphore::MAX_PERMITS)),
            }
        }
    }

    impl Service<RpcRequest> for Fake {
        type Response = Outcome;
        type Error = GatewayError;
        type Future = Pin<Box<dyn Future<Output = Result<Outcome, GatewayError>> + Send>>;

        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), GatewayError>> {
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, _: RpcRequest) -> Self::Future {
            self.calls.fetch_add(1, Ordering::SeqCst);
            let gate = self.gate.clone();
            Box::pin(async move {
                let _pass = gate.acquire().await;
                Ok(Outcome::Reply(Reply::Empty(Empty {})))
            })
        }
    }

    fn settings() -> StackSettings {
        StackSettings {
            max_in_flight: 64,
            request_timeout: Duration::from_secs(5),
        }
    }

    fn counted(metrics: &Metrics, tenant: &str, outcome: &str) -> u64 {
        metrics
            .requests
            .get_or_create(&crate::metrics::RequestLabels {
                tenant: tenant.to_owned(),
                method: "process/list".to_owned(),
                outcome: outcome.to_owned(),
            })
            .get()
    }

    #[tokio::test]
    async fn a_call_without_its_scope_is_refused_before_the_handler_and_the_rate() {
        let metrics = Arc::new(Metrics::new());
        let t = tenant(&metrics, "a", 1, 8);
        let fake = Fake::open();
        let svc = stack_over(&settings(), metrics.clone(), fake.clone());
        for _ in 0..3 {
            let e = svc
                .clone()
                .oneshot(request(&t, &[Scope::FsRead]))
                .await
                .unwrap_err();
            assert!(matches!(e, GatewayError::MissingScope(_)), "{e:?}");
        }
        assert_eq!(fake.calls.load(Ordering::SeqCst), 0);
        // Refusals spent none of the tenant's rate (one per second).
        svc.clone()
            .oneshot(request(&t, &[Scope::Exec]))
            .await
            .unwrap();
        assert_eq!(fake.calls.load(Ordering::SeqCst), 1);
        assert_eq!(counted(&metrics, "a", "ok"), 1);
        assert!(counted(&metrics, "a", GatewayError::MissingScope("exec").outcome()) >= 3);
    }

    #[tokio::test]
    async fn one_tenants_rate_does_not_spend_anothers() {
        let metrics = Arc::new(Metrics::new());
        let (a, b) = (tenant(&metrics, "a", 2, 8), tenant(&metrics, "b", 2, 8));
        let svc = stack_over(&settings(), metrics.clone(), Fake::open());
        let call = |t: &Arc<Tenant>| svc.clone().oneshot(request(t, &[Scope::Exec]));
        call(&a).await.unwrap();
        call(&a).await.unwrap();
        let e = call(&a).await.unwrap_err();
        let GatewayError::RateLimited { retry_after_ms } = e else {
            panic!("{e:?}")
        };
        assert!((1..=1000).contains(&retry_after_ms), "{retry_after_ms}");
        // b's budget is its own.
        call(&b).await.unwrap();
        call(&b).await.unwrap();
    }

    #[tokio::test]
    async fn a_tenants_slow_calls_fill_only_its_own_slots() {
        let metrics = Arc::new(Metrics::new());
        let (a, b) = (tenant(&metrics, "a", 100, 1), tenant(&metrics, "b", 100, 1));
        let fake = Fake {
            calls: Arc::default(),
            gate: Arc::new(Semaphore::new(0)),
        };
        let svc = stack_over(&settings(), metrics.clone(), fake.clone());
        let held = crate::task::start(
            "test-call",
            svc.clone().oneshot(request(&a, &[Scope::Exec])),
        );
        while fake.calls.load(Ordering::SeqCst) == 0 {
            tokio::task::yield_now().await;
        }
        // a's one slot is taken: shed at once, not queued.
        let e = svc
            .clone()
            .oneshot(request(&a, &[Scope::Exec]))
            .await
            .unwrap_err();
        assert!(matches!(e, GatewayError::Overloaded), "{e:?}");
        // b is not held up by a: its call reaches the handler.
        let b_call = crate::task::start(
            "test-call",
            svc.clone().oneshot(request(&b, &[Scope::Exec])),
        );
        while fake.calls.load(Ordering::SeqCst) < 2 {
            tokio::task::yield_now().await;
        }
        fake.gate.add_permits(2);
        held.await.unwrap().unwrap();
        b_call.await.unwrap().unwrap();
        // The slot came back with the call.
        svc.oneshot(request(&a, &[Scope::Exec])).await.unwrap();
    }

    #[tokio::test]
    async fn a_call_past_its_deadline_fails_and_frees_its_slot() {
        let metrics = Arc::new(Metrics::new());
        let t = tenant(&metrics, "a", 100, 1);
        let fake = Fake {
            calls: Arc::default(),
            gate: Arc::new(Semaphore::new(0)),
        };
        // The handler never finishes: only the deadline ends the call.
        let short = StackSettings {
            request_timeout: Duration::from_millis(20),
            ..settings()
        };
        let svc = stack_over(&short, metrics.clone(), fake.clone());
        let e = svc
            .clone()
            .oneshot(request(&t, &[Scope::Exec]))
            .await
            .unwrap_err();
        assert!(matches!(e, GatewayError::DeadlineExceeded), "{e:?}");
        assert_eq!(counted(&metrics, "a", e.outcome()), 1);
        // The tenant's only slot was given back: the next call reaches the
        // handler (and times out too, as the gate stays shut).
        let e = svc.oneshot(request(&t, &[Scope::Exec])).await.unwrap_err();
        assert!(matches!(e, GatewayError::DeadlineExceeded), "{e:?}");
        assert_eq!(fake.calls.load(Ordering::SeqCst), 2);
    }
}
