//! `gateway/snapshot/*`: a session's workspace captured (its tenant's
//! processes frozen for the walk), and the tenant's snapshots listed,
//! inspected and deleted; forks made for new sessions (docs/snapshots.md).

use std::sync::Arc;

use super::{LocalSession, blocking};
use crate::error::GatewayError;
use crate::fs::FsError;
use crate::protocol::snapshot::{CreateParams, ListResponse};
use crate::rpc::{Call, Reply};
use crate::snapshot::{Snapshot, SnapshotError, TenantSnapshots, Workspace};

/// A tenant's snapshots, and what its forks are made with.
pub struct Snapshots {
    pub store: Arc<TenantSnapshots>,
    /// Who the tenant's processes run as: a snapshot's tree, and a fork's
    /// upper layer, are theirs.
    pub owner: Option<(u32, u32)>,
    /// A fork's upper layer (what it may write): the tenant's disk bound.
    pub fork_bytes: u64,
    /// Held for writing while a capture holds the tenant still; every
    /// call to the tenant's workers holds it for reading.
    pub gate: crate::worker::Gate,
}

impl Snapshots {
    /// A workspace that starts as snapshot `id`.
    pub fn fork(&self, id: &str) -> Result<(Arc<Workspace>, Snapshot), GatewayError> {
        let (w, meta) = self
            .store
            .fork(id, self.owner.unwrap_or((0, 0)), self.fork_bytes)
            .map_err(|e| {
                if let SnapshotError::Io(why) = &e {
                    tracing::error!(snapshot = id, error = %why, "fork");
                }
                GatewayError::from(e)
            })?;
        Ok((Arc::new(w), meta))
    }
}

fn unavailable() -> GatewayError {
    GatewayError::InvalidParams(
        "this tenant's sessions cannot take snapshots: they need a root of their own and the namespaces and workers layers".to_owned(),
    )
}

fn of(s: &LocalSession) -> Result<&Arc<Snapshots>, GatewayError> {
    s.snapshots.as_ref().ok_or_else(unavailable)
}

/// `gateway/snapshot/list`, `get`, `delete` and `push`, in a session or
/// without one (gRPC, whose door audits its own deletes and pushes:
/// `audit` is then none).
pub(super) async fn on_store(
    snaps: Option<&Arc<Snapshots>>,
    call: Call,
    audit: Option<&crate::audit::Tag>,
) -> Result<Reply, GatewayError> {
    let snaps = snaps.ok_or_else(unavailable)?;
    match call {
        Call::SnapshotList(_) => Ok(Reply::SnapshotList(ListResponse {
            snapshots: snaps.store.list(),
        })),
        Call::SnapshotGet(p) => Ok(Reply::Snapshot(Box::new(snaps.store.get(&p.snapshot_id)?))),
        Call::SnapshotDelete(p) => {
            snaps.store.delete(&p.snapshot_id)?;
            if let Some(tag) = audit {
                crate::audit::emit(
                    "snapshot.deleted",
                    &tag.who(),
                    serde_json::json!({ "snapshot_id": p.snapshot_id }),
                );
            }
            Ok(super::empty())
        }
        Call::SnapshotPush(ref p) | Call::SnapshotPromote(ref p) => {
            let (event, done) = match &call {
                Call::SnapshotPush(_) => {
                    ("snapshot.pushed", snaps.store.push(&p.snapshot_id).await)
                }
                _ => (
                    "snapshot.promoted",
                    snaps.store.promote(&p.snapshot_id).await,
                ),
            };
            let meta = done.map_err(|e| {
                if let SnapshotError::Io(why) | SnapshotError::Remote(why) = &e {
                    tracing::error!(snapshot = p.snapshot_id, error = %why, "{event}");
                }
                GatewayError::from(e)
            })?;
            if let Some(tag) = audit {
                crate::audit::emit(
                    event,
                    &tag.who(),
                    serde_json::json!({ "snapshot_id": meta.id, "to": meta.pushed }),
                );
            }
            Ok(Reply::Snapshot(Box::new(meta)))
        }
        _ => Err(super::needs_session()),
    }
}

/// `gateway/snapshot/create`: the session's workspace (the tenant's root,
/// or its fork's) as it is at one instant.
pub(super) async fn create(
    s: &LocalSession,
    p: CreateParams,
    audit: Option<Arc<crate::audit::Tag>>,
) -> Result<Reply, GatewayError> {
    let snaps = of(s)?.clone();
    let root = s.shared.root.dir_fd().ok_or_else(unavailable)?;
    let source = crate::snapshot::Source {
        root,
        ids: s.shared.root.creds(),
    };
    let cgroup = s.shared.exec.cgroup.clone();
    let image = s.shared.image.clone();
    let _one = snaps
        .store
        .capture_permit()
        .await
        .ok_or(GatewayError::Draining)?;
    // No call reaches the tenant's workers while they are held still (a
    // spawn waiting on a frozen worker would be taken for a dead one).
    let gate = snaps.gate.clone().write_owned().await;
    let taken = blocking(move || {
        let taken =
            snaps.store.take(
                source,
                image,
                (p.name, p.labels),
                snaps.owner,
                || match &cgroup {
                    Some(cg) => cg.freeze().map(Some),
                    None => Ok(None),
                },
            );
        drop(gate);
        Ok(taken)
    })
    .await
    .map_err(|e: FsError| GatewayError::Internal(e.to_string()))?;
    match taken {
        Ok(meta) => {
            if let Some(tag) = &audit {
                crate::audit::emit(
                    "snapshot.created",
                    &tag.who(),
                    serde_json::json!({
                        "snapshot_id": meta.id,
                        "name": meta.name,
                        "digest": meta.digest,
                        "bytes": meta.bytes,
                        "entries": meta.entries,
                        "image": meta.image,
                    }),
                );
            }
            Ok(Reply::Snapshot(Box::new(meta)))
        }
        Err(e) => {
            if let SnapshotError::Io(why) = &e {
                tracing::error!(tenant = %s.shared.env.tenant, error = %why, "snapshot");
            }
            Err(e.into())
        }
    }
}
