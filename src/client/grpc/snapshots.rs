//! The snapshot calls of `SessionService`.

use super::GrpcClient;
use crate::client::error::{ClientError, Result};
use crate::client::snapshots::SnapshotOp;
use crate::protocol::snapshot::Snapshot;
use crate::transport::grpc::pb;

fn from_pb(s: Option<pb::Snapshot>) -> Result<Vec<Snapshot>> {
    let s = s.ok_or_else(|| ClientError::Protocol("an answer without its snapshot".into()))?;
    Ok(vec![Snapshot {
        id: s.id,
        name: (!s.name.is_empty()).then_some(s.name),
        labels: s.labels.into_iter().collect(),
        image: (!s.image.is_empty()).then_some(s.image),
        digest: s.digest,
        bytes: s.bytes,
        entries: s.entries,
        skipped: s.skipped,
        created_at_ms: s.created_at_ms,
        expires_at_ms: (s.expires_at_ms != 0).then_some(s.expires_at_ms),
        pushed: (!s.pushed.is_empty()).then_some(s.pushed),
    }])
}

impl GrpcClient {
    pub(in super::super) async fn snapshot(&self, op: &SnapshotOp) -> Result<Vec<Snapshot>> {
        match op {
            SnapshotOp::Create { name, labels } => {
                let req = pb::CreateSnapshotRequest {
                    session_id: self.session_id.clone(),
                    name: name.clone().unwrap_or_default(),
                    labels: labels.clone().into_iter().collect(),
                };
                // Not retried: a second capture would be a second snapshot.
                let r = self
                    .sessions()
                    .create_snapshot(req)
                    .await
                    .map_err(crate::client::error::status_error)?;
                from_pb(r.into_inner().snapshot)
            }
            SnapshotOp::List => {
                let r = self
                    .retrying(|| {
                        let mut c = self.sessions();
                        async move { c.list_snapshots(pb::ListSnapshotsRequest {}).await }
                    })
                    .await?;
                r.snapshots
                    .into_iter()
                    .map(|s| from_pb(Some(s)).map(|mut v| v.remove(0)))
                    .collect()
            }
            SnapshotOp::Get(id) => {
                let r = self
                    .retrying(|| {
                        let mut c = self.sessions();
                        let snapshot_id = id.clone();
                        async move { c.get_snapshot(pb::GetSnapshotRequest { snapshot_id }).await }
                    })
                    .await?;
                from_pb(r.snapshot)
            }
            SnapshotOp::Delete(id) => {
                self.retrying(|| {
                    let mut c = self.sessions();
                    let snapshot_id = id.clone();
                    async move {
                        c.delete_snapshot(pb::DeleteSnapshotRequest { snapshot_id })
                            .await
                    }
                })
                .await?;
                Ok(Vec::new())
            }
            SnapshotOp::Push(id) => {
                let r = self
                    .retrying(|| {
                        let mut c = self.sessions();
                        let snapshot_id = id.clone();
                        async move {
                            c.push_snapshot(pb::PushSnapshotRequest { snapshot_id })
                                .await
                        }
                    })
                    .await?;
                from_pb(r.snapshot)
            }
            SnapshotOp::Promote(id) => {
                let r = self
                    .retrying(|| {
                        let mut c = self.sessions();
                        let snapshot_id = id.clone();
                        async move {
                            c.promote_snapshot(pb::PromoteSnapshotRequest { snapshot_id })
                                .await
                        }
                    })
                    .await?;
                from_pb(r.snapshot)
            }
        }
    }
}
