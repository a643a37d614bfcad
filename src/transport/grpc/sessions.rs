//! The gRPC SessionService: sessions, and the snapshots of their
//! workspaces and the forks made from them (docs/snapshots.md), through
//! the same stack and backends as JSON-RPC.

use std::sync::Arc;

use tonic::{Request, Response, Status, Streaming};

use super::pb;
use super::services::{GrpcApi, caller, status, unexpected};
use crate::error::GatewayError;
use crate::protocol::snapshot::{CreateParams, IdParams, Snapshot};
use crate::rpc::{Call, NoParams, Reply};
use crate::session::Session;

#[tonic::async_trait]
impl pb::session_service_server::SessionService for GrpcApi {
    type ForwardPortStream = super::services::EventStream<pb::ForwardPortResponse>;

    /// Port forwarding's gRPC door (module `forward_port`).
    async fn forward_port(
        &self,
        req: Request<Streaming<pb::ForwardPortRequest>>,
    ) -> Result<Response<Self::ForwardPortStream>, Status> {
        super::forward_port::forward_port(&self.gw, req).await
    }

    async fn create_preview(
        &self,
        req: Request<pb::CreatePreviewRequest>,
    ) -> Result<Response<pb::CreatePreviewResponse>, Status> {
        super::previews::create(self, req).await
    }

    async fn revoke_preview(
        &self,
        req: Request<pb::RevokePreviewRequest>,
    ) -> Result<Response<pb::RevokePreviewResponse>, Status> {
        super::previews::revoke(self, req).await
    }

    async fn list_previews(
        &self,
        req: Request<pb::ListPreviewsRequest>,
    ) -> Result<Response<pb::ListPreviewsResponse>, Status> {
        super::previews::list(self, req).await
    }

    async fn get_egress(
        &self,
        req: Request<pb::GetEgressRequest>,
    ) -> Result<Response<pb::GetEgressResponse>, Status> {
        super::egress::get(self, req).await
    }

    async fn set_egress(
        &self,
        req: Request<pb::SetEgressRequest>,
    ) -> Result<Response<pb::SetEgressResponse>, Status> {
        super::egress::set(self, req).await
    }

    async fn create_session(
        &self,
        req: Request<pb::CreateSessionRequest>,
    ) -> Result<Response<pb::CreateSessionResponse>, Status> {
        let caller = caller(&req)?;
        let r = req.get_ref();
        let image = Some(r.image.as_str()).filter(|i| !i.is_empty());
        let snapshot = Some(r.snapshot.as_str()).filter(|i| !i.is_empty());
        let session = self.new_session(&caller, image, snapshot).await?;
        Ok(Response::new(pb::CreateSessionResponse {
            session_id: session.id.clone(),
        }))
    }

    async fn resume_session(
        &self,
        req: Request<pb::ResumeSessionRequest>,
    ) -> Result<Response<pb::ResumeSessionResponse>, Status> {
        let caller = caller(&req)?;
        let id = &req.get_ref().session_id;
        let session = match self.session(&caller, id) {
            Ok(s) => s,
            // Not held here: an executor session is resumed on its
            // executor (after a restart of this gateway, say).
            // (It runs no image, so a token with an `image` claim may not.)
            Err(e)
                if e.code() == tonic::Code::NotFound
                    && caller.tenant().remote.is_some()
                    && caller.principal().image.is_none() =>
            {
                self.gw
                    .sessions
                    .resume_detached(caller.tenant(), caller.principal().subject.as_deref(), id)
                    .await
                    .map_err(status)?
            }
            Err(e) => return Err(e),
        };
        Ok(Response::new(pb::ResumeSessionResponse {
            session_id: session.id.clone(),
        }))
    }

    async fn close_session(
        &self,
        req: Request<pb::CloseSessionRequest>,
    ) -> Result<Response<pb::CloseSessionResponse>, Status> {
        let caller = caller(&req)?;
        // Closing ends the session's processes: a token that may not run
        // them may not end them either.
        let exec = crate::auth::Scope::Exec;
        if !caller.principal().scopes.grants(exec) {
            return Err(status(GatewayError::MissingScope(exec.name())));
        }
        let session = self.session(&caller, &req.get_ref().session_id)?;
        self.gw.sessions.remove(&session);
        Ok(Response::new(pb::CloseSessionResponse {}))
    }

    async fn create_snapshot(
        &self,
        req: Request<pb::CreateSnapshotRequest>,
    ) -> Result<Response<pb::CreateSnapshotResponse>, Status> {
        let caller = caller(&req)?;
        let r = req.into_inner();
        let params = CreateParams {
            name: Some(r.name).filter(|n| !n.is_empty()),
            labels: r.labels.into_iter().collect(),
        };
        match self
            .session_call(&caller, &r.session_id, Call::SnapshotCreate(params))
            .await?
        {
            Reply::Snapshot(s) => Ok(Response::new(pb::CreateSnapshotResponse {
                snapshot: Some(to_pb(*s)),
            })),
            _ => Err(unexpected()),
        }
    }

    async fn list_snapshots(
        &self,
        req: Request<pb::ListSnapshotsRequest>,
    ) -> Result<Response<pb::ListSnapshotsResponse>, Status> {
        let caller = caller(&req)?;
        match self
            .call(&caller, None, Call::SnapshotList(NoParams))
            .await?
        {
            Reply::SnapshotList(l) => Ok(Response::new(pb::ListSnapshotsResponse {
                snapshots: l.snapshots.into_iter().map(to_pb).collect(),
            })),
            _ => Err(unexpected()),
        }
    }

    async fn get_snapshot(
        &self,
        req: Request<pb::GetSnapshotRequest>,
    ) -> Result<Response<pb::GetSnapshotResponse>, Status> {
        let caller = caller(&req)?;
        let snapshot_id = req.into_inner().snapshot_id;
        match self
            .call(&caller, None, Call::SnapshotGet(IdParams { snapshot_id }))
            .await?
        {
            Reply::Snapshot(s) => Ok(Response::new(pb::GetSnapshotResponse {
                snapshot: Some(to_pb(*s)),
            })),
            _ => Err(unexpected()),
        }
    }

    async fn delete_snapshot(
        &self,
        req: Request<pb::DeleteSnapshotRequest>,
    ) -> Result<Response<pb::DeleteSnapshotResponse>, Status> {
        let caller = caller(&req)?;
        let snapshot_id = req.into_inner().snapshot_id;
        self.call(
            &caller,
            None,
            Call::SnapshotDelete(IdParams {
                snapshot_id: snapshot_id.clone(),
            }),
        )
        .await?;
        crate::audit::emit(
            "snapshot.deleted",
            &crate::audit::Who {
                tenant: Some(&caller.tenant().name),
                subject: caller.principal().subject.as_deref(),
                session: None,
            },
            serde_json::json!({ "snapshot_id": snapshot_id }),
        );
        Ok(Response::new(pb::DeleteSnapshotResponse {}))
    }

    async fn push_snapshot(
        &self,
        req: Request<pb::PushSnapshotRequest>,
    ) -> Result<Response<pb::PushSnapshotResponse>, Status> {
        let caller = caller(&req)?;
        let snapshot_id = req.into_inner().snapshot_id;
        let s = self
            .sent_on(
                &caller,
                "snapshot.pushed",
                Call::SnapshotPush(IdParams { snapshot_id }),
            )
            .await?;
        Ok(Response::new(pb::PushSnapshotResponse {
            snapshot: Some(s),
        }))
    }

    async fn promote_snapshot(
        &self,
        req: Request<pb::PromoteSnapshotRequest>,
    ) -> Result<Response<pb::PromoteSnapshotResponse>, Status> {
        let caller = caller(&req)?;
        let snapshot_id = req.into_inner().snapshot_id;
        let s = self
            .sent_on(
                &caller,
                "snapshot.promoted",
                Call::SnapshotPromote(IdParams { snapshot_id }),
            )
            .await?;
        Ok(Response::new(pb::PromoteSnapshotResponse {
            snapshot: Some(s),
        }))
    }

    async fn fork_sessions(
        &self,
        req: Request<pb::ForkSessionsRequest>,
    ) -> Result<Response<pb::ForkSessionsResponse>, Status> {
        let caller = caller(&req)?;
        let r = req.into_inner();
        if r.count == 0 || r.count as usize > crate::config::MAX_FORKS_PER_TENANT {
            return Err(status(GatewayError::InvalidParams(format!(
                "count: 1 to {}",
                crate::config::MAX_FORKS_PER_TENANT
            ))));
        }
        let mut made: Vec<Arc<Session>> = Vec::new();
        for _ in 0..r.count {
            match self.new_session(&caller, None, Some(&r.snapshot_id)).await {
                Ok(s) => made.push(s),
                Err(e) => {
                    // All or none.
                    for s in &made {
                        self.gw.sessions.remove(s);
                    }
                    return Err(e);
                }
            }
        }
        Ok(Response::new(pb::ForkSessionsResponse {
            session_ids: made.iter().map(|s| s.id.clone()).collect(),
        }))
    }
}

fn to_pb(s: Snapshot) -> pb::Snapshot {
    pb::Snapshot {
        id: s.id,
        name: s.name.unwrap_or_default(),
        labels: s.labels.into_iter().collect(),
        image: s.image.unwrap_or_default(),
        digest: s.digest,
        bytes: s.bytes,
        entries: s.entries,
        skipped: s.skipped,
        created_at_ms: s.created_at_ms,
        expires_at_ms: s.expires_at_ms.unwrap_or(0),
        pushed: s.pushed.unwrap_or_default(),
    }
}

impl GrpcApi {
    /// A session-less snapshot call that answers a snapshot (push,
    /// promote), audited as `event`.
    async fn sent_on(
        &self,
        caller: &crate::transport::authenticate::Caller,
        event: &'static str,
        call: Call,
    ) -> Result<pb::Snapshot, Status> {
        match self.call(caller, None, call).await? {
            Reply::Snapshot(s) => {
                crate::audit::emit(
                    event,
                    &crate::audit::Who {
                        tenant: Some(&caller.tenant().name),
                        subject: caller.principal().subject.as_deref(),
                        session: None,
                    },
                    serde_json::json!({ "snapshot_id": s.id, "to": s.pushed }),
                );
                Ok(to_pb(*s))
            }
            _ => Err(unexpected()),
        }
    }
}
