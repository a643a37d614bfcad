//! The innermost service: hands an operation to the backend that runs its
//! session (or, without a session, to the tenant's backend). It is the only
//! place that knows a request's session; doors and the stack above only
//! carry it.

use std::sync::Arc;
use std::task::{Context, Poll};

use tokio_util::sync::CancellationToken;

use crate::auth::Principal;
use crate::backend::{OpFuture, RunScope};
use crate::error::GatewayError;
use crate::outbound::Responder;
use crate::rpc::{Op, Outcome};
use crate::session::Session;
use crate::tenant::Tenant;

/// Everything a call carries besides the operation.
#[derive(Clone)]
pub struct RequestContext {
    /// Who is calling (from the JWT).
    pub principal: Arc<Principal>,
    /// The principal's tenant.
    pub tenant: Arc<Tenant>,
    /// The session the call runs in; process calls need one, file calls do
    /// not (gRPC file calls carry none). It belongs to `tenant`.
    pub session: Option<Arc<Session>>,
    /// Where a call without a session runs: in this session's place (its
    /// image) rather than the tenant's (gRPC file calls naming a session
    /// this gateway runs).
    pub place: Option<Arc<Session>>,
    /// Cancelled when another connection takes the session over.
    pub evicted: CancellationToken,
    /// Where the reply goes (JSON-RPC doors): see [`Responder`].
    pub reply: Option<Responder>,
}

/// An operation plus its context: what flows through the tower stack.
#[derive(Clone)]
pub struct RpcRequest {
    pub op: Op,
    pub ctx: RequestContext,
}

/// Runs operations; stateless itself (state lives in sessions and tenants).
#[derive(Debug, Clone, Copy, Default)]
pub struct Dispatch;

impl tower::Service<RpcRequest> for Dispatch {
    type Response = Outcome;
    type Error = GatewayError;
    type Future = OpFuture;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: RpcRequest) -> Self::Future {
        let RpcRequest { op, ctx } = req;
        match ctx.session {
            // Previews are the session's own state: no backend has a part.
            Some(session) if matches!(&op, Op::Call(c) if crate::preview::api::is_preview(c)) => {
                let Op::Call(call) = op else {
                    return Box::pin(async {
                        Err(GatewayError::Internal("not a call".to_owned()))
                    });
                };
                let caller = crate::preview::api::Caller {
                    tenant: &ctx.tenant.name,
                    subject: ctx.principal.subject.as_deref(),
                    session: &session.id,
                };
                let done = crate::preview::api::call(&session.ports, &caller, call);
                Box::pin(async move { done.map(Outcome::Reply) })
            }
            _ if matches!(&op, Op::Call(c) if crate::egress::api::is_egress(c)) => {
                let Op::Call(call) = op else {
                    return Box::pin(async {
                        Err(GatewayError::Internal("not a call".to_owned()))
                    });
                };
                let t = &ctx.tenant;
                let done = crate::egress::api::call(
                    &t.settings.egress,
                    t.egress.as_deref(),
                    &crate::audit::Who {
                        tenant: Some(&t.name),
                        subject: ctx.principal.subject.as_deref(),
                        session: ctx.session.as_ref().map(|s| &*s.id),
                    },
                    call,
                );
                Box::pin(async move { done.map(Outcome::Reply) })
            }
            Some(session) => {
                let audit = crate::audit::enabled().then(|| {
                    Arc::new(crate::audit::Tag {
                        tenant: ctx.tenant.name.to_string(),
                        subject: ctx.principal.subject.clone(),
                        session: session.id.to_string(),
                    })
                });
                session.backend.clone().run(
                    op,
                    RunScope {
                        evicted: ctx.evicted,
                        reply: ctx.reply,
                        audit,
                    },
                )
            }
            None => match ctx.place {
                Some(place) => place.backend.run_sessionless(op),
                None => ctx.tenant.backend.run_sessionless(op),
            },
        }
    }
}
