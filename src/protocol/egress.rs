//! The `gateway/egress/*` extension methods' types (docs/isolation.md,
//! "Egress by name").

use serde::{Deserialize, Serialize};

/// Params of `gateway/egress/set`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SetParams {
    /// The tenant's new names (they replace the list in force): host
    /// names, `*.` wildcards, an optional `:PORT`.
    pub names: Vec<String>,
}

/// What `gateway/egress/get` and `set` answer: the tenant's egress now.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Policy {
    /// The names in force; absent for a tenant whose egress is decided by
    /// addresses alone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub names: Option<Vec<String>>,
    /// The addresses `egress` allows directly (CIDRs).
    pub cidrs: Vec<String>,
    /// Every public address (`egress = "internet"`).
    pub internet: bool,
    /// For `set`: the open connections the new names closed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub closed: Option<usize>,
}
