//! SessionService's preview calls (docs/preview.md): `gateway/preview/*`
//! through the same stack, answered from the session's own ports.

use tonic::{Request, Response, Status};

use super::pb;
use super::services::{GrpcApi, caller, unexpected};
use crate::protocol::preview::{CreateParams, PortParams};
use crate::rpc::{Call, NoParams, Reply};

fn port(p: u32) -> Result<u16, Status> {
    u16::try_from(p)
        .ok()
        .filter(|p| *p > 0)
        .ok_or_else(|| Status::invalid_argument("port must be 1 to 65535"))
}

pub(super) async fn create(
    api: &GrpcApi,
    req: Request<pb::CreatePreviewRequest>,
) -> Result<Response<pb::CreatePreviewResponse>, Status> {
    let caller = caller(&req)?;
    let r = req.into_inner();
    let params = CreateParams {
        port: port(r.port)?,
        public: r.public,
        expires_in_secs: Some(r.expires_in_secs).filter(|s| *s > 0),
    };
    match api
        .session_call(&caller, &r.session_id, Call::PreviewCreate(params))
        .await?
    {
        Reply::Preview(p) => Ok(Response::new(pb::CreatePreviewResponse {
            preview: Some(pb::Preview {
                port: u32::from(p.port),
                url: p.url.unwrap_or_default(),
                path: p.path,
                public: p.public,
                expires_at_ms: p.expires_at_ms.unwrap_or(0),
            }),
        })),
        _ => Err(unexpected()),
    }
}

pub(super) async fn revoke(
    api: &GrpcApi,
    req: Request<pb::RevokePreviewRequest>,
) -> Result<Response<pb::RevokePreviewResponse>, Status> {
    let caller = caller(&req)?;
    let r = req.into_inner();
    let params = PortParams {
        port: port(r.port)?,
    };
    api.session_call(&caller, &r.session_id, Call::PreviewRevoke(params))
        .await?;
    Ok(Response::new(pb::RevokePreviewResponse {}))
}

pub(super) async fn list(
    api: &GrpcApi,
    req: Request<pb::ListPreviewsRequest>,
) -> Result<Response<pb::ListPreviewsResponse>, Status> {
    let caller = caller(&req)?;
    let r = req.into_inner();
    match api
        .session_call(&caller, &r.session_id, Call::PreviewList(NoParams))
        .await?
    {
        Reply::PreviewList(l) => Ok(Response::new(pb::ListPreviewsResponse {
            ports: l
                .ports
                .into_iter()
                .map(|p| pb::PreviewPort {
                    port: u32::from(p.port),
                    public: p.public,
                })
                .collect(),
            open_connections: l.open_connections,
        })),
        _ => Err(unexpected()),
    }
}
