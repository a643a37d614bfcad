//! `gateway/snapshot/*` over JSON-RPC.

use super::WsClient;
use crate::client::error::Result;
use crate::client::snapshots::SnapshotOp;
use crate::protocol::methods as m;
use crate::protocol::snapshot::{CreateParams, IdParams, ListResponse, Snapshot};

impl WsClient {
    pub(in super::super) async fn snapshot(&self, op: &SnapshotOp) -> Result<Vec<Snapshot>> {
        let id = |s: &String| IdParams {
            snapshot_id: s.clone(),
        };
        let one = match op {
            SnapshotOp::Create { name, labels } => {
                let p = CreateParams {
                    name: name.clone(),
                    labels: labels.clone(),
                };
                self.call(m::SNAPSHOT_CREATE, &p).await?
            }
            SnapshotOp::List => {
                let l: ListResponse = self.call(m::SNAPSHOT_LIST, &serde_json::json!({})).await?;
                return Ok(l.snapshots);
            }
            SnapshotOp::Get(s) => self.call(m::SNAPSHOT_GET, &id(s)).await?,
            SnapshotOp::Delete(s) => {
                self.call_unit(m::SNAPSHOT_DELETE, &id(s)).await?;
                return Ok(Vec::new());
            }
            SnapshotOp::Push(s) => self.call(m::SNAPSHOT_PUSH, &id(s)).await?,
            SnapshotOp::Promote(s) => self.call(m::SNAPSHOT_PROMOTE, &id(s)).await?,
        };
        Ok(vec![one])
    }
}
