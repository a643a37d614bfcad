//! The `gateway/snapshot/*` extension methods' types (docs/snapshots.md):
//! names under the gateway's own prefix, which no Codex namespace uses.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// One snapshot, as listed and as kept beside its tree (`meta.json`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Snapshot {
    /// `snap-` and 32 hex digits: chosen by the gateway.
    pub id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// The image the workspace ran on (none: the host's userland); a fork
    /// runs on it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// `sha256:` of the tree's tar stream: equal trees, equal digests.
    pub digest: String,
    /// What the tree takes of the tenant's snapshot bytes.
    pub bytes: u64,
    pub entries: u64,
    /// FIFOs, sockets, devices and mount points left out.
    pub skipped: u64,
    /// Milliseconds since the Unix epoch.
    pub created_at_ms: u64,
    /// When retention deletes it (milliseconds since the Unix epoch);
    /// none once promoted (kept until deleted).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at_ms: Option<u64>,
    /// Where it was pushed: `<registry>/<repository>@<manifest digest>`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pushed: Option<String>,
}

/// Params of `gateway/snapshot/create`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CreateParams {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
}

/// Params of `gateway/snapshot/get`, `delete` and `push`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct IdParams {
    pub snapshot_id: String,
}

/// Result of `gateway/snapshot/list`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ListResponse {
    pub snapshots: Vec<Snapshot>,
}
