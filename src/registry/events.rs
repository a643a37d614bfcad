//! `executor.joined` and `executor.left` in the audit trail (and to
//! webhooks): an executor id a pool did not have gets its first link; an
//! executor's last link and session are gone. An executor that serves
//! one session per registration (the official one) leaves and joins again
//! around each session when it holds a single link.

use std::collections::BTreeMap;

fn who(tenant: &str) -> crate::audit::Who<'_> {
    crate::audit::Who {
        tenant: Some(tenant),
        ..Default::default()
    }
}

pub(super) fn joined(
    pool: &str,
    tenant: &str,
    executor: &str,
    name: &str,
    labels: &BTreeMap<String, String>,
) {
    crate::audit::emit(
        "executor.joined",
        &who(tenant),
        serde_json::json!({
            "pool": pool,
            "executor_id": crate::audit::clip(executor),
            "name": crate::audit::clip(name),
            "labels": labels,
        }),
    );
}

pub(super) fn left(pool: &str, tenant: &str, executor: &str) {
    crate::audit::emit(
        "executor.left",
        &who(tenant),
        serde_json::json!({ "pool": pool, "executor_id": crate::audit::clip(executor) }),
    );
}
