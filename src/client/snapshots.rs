//! The tenant's snapshots (docs/snapshots.md) through either door: one
//! [`SnapshotOp`] per call, answered with the snapshots it concerns.

use std::collections::BTreeMap;

use super::error::Result;
use super::{Client, Inner};
pub use crate::protocol::snapshot::Snapshot;

/// A snapshot operation.
#[derive(Debug, Clone)]
pub enum SnapshotOp {
    /// The session's workspace now.
    Create {
        name: Option<String>,
        labels: BTreeMap<String, String>,
    },
    List,
    Get(String),
    Delete(String),
    /// To the gateway's snapshot registry.
    Push(String),
    /// Kept until deleted (and pushed, with a registry).
    Promote(String),
}

impl Client {
    /// Run `op`: the snapshot it made, read, pushed or promoted, the
    /// tenant's snapshots for a list, none for a delete.
    pub async fn snapshot(&self, op: &SnapshotOp) -> Result<Vec<Snapshot>> {
        match &self.inner {
            Inner::Ws(c) => c.snapshot(op).await,
            Inner::Grpc(c) => c.snapshot(op).await,
        }
    }
}
