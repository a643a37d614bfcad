//! SessionService's egress calls (docs/isolation.md, "Egress by name"):
//! `gateway/egress/get` and `set` through the same stack, with no
//! session (the tenant's egress, answered by `dispatch`).

use tonic::{Request, Response, Status};

use super::pb;
use super::services::{GrpcApi, caller, unexpected};
use crate::protocol::egress::{Policy, SetParams};
use crate::rpc::{Call, NoParams, Reply};

pub(super) async fn get(
    api: &GrpcApi,
    req: Request<pb::GetEgressRequest>,
) -> Result<Response<pb::GetEgressResponse>, Status> {
    let caller = caller(&req)?;
    let policy = answer(api.call(&caller, None, Call::EgressGet(NoParams)).await?)?;
    Ok(Response::new(pb::GetEgressResponse {
        policy: Some(policy),
    }))
}

pub(super) async fn set(
    api: &GrpcApi,
    req: Request<pb::SetEgressRequest>,
) -> Result<Response<pb::SetEgressResponse>, Status> {
    let caller = caller(&req)?;
    let names = req.into_inner().names;
    let reply = api
        .call(&caller, None, Call::EgressSet(SetParams { names }))
        .await?;
    Ok(Response::new(pb::SetEgressResponse {
        policy: Some(answer(reply)?),
    }))
}

fn answer(reply: Reply) -> Result<pb::EgressPolicy, Status> {
    match reply {
        Reply::Egress(p) => Ok(to_pb(p)),
        _ => Err(unexpected()),
    }
}

fn to_pb(p: Policy) -> pb::EgressPolicy {
    pb::EgressPolicy {
        names_set: p.names.is_some(),
        names: p.names.unwrap_or_default(),
        cidrs: p.cidrs,
        internet: p.internet,
        // At most the tenant's connection cap (a u32); saturated, never
        // wrapped.
        closed: p.closed.map(|n| u32::try_from(n).unwrap_or(u32::MAX)),
    }
}
