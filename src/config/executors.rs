//! `[executors]` and `[executors.pools.NAME]`: the remote executor registry,
//! raw and validated, and executor ids.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Deserialize;

use super::common::{ConfigError, duration, positive};
use super::tenants::TenantSettings;

/// `[executors]`: the registry remote executors join (docs/executors.md).
/// Off unless a pool is configured.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExecutorsConfig {
    /// Base of the rendezvous URLs handed to executors, `ws://` or
    /// `wss://HOST[:PORT]` as executors reach the gateway (the load
    /// balancer). Default: `ws://` and the registration's `Host` header.
    pub public_url: Option<String>,
    /// How long a rendezvous URL stays valid (it is also single use).
    /// Default 30 s.
    pub ticket_ttl: Option<String>,
    /// How long the gateway waits for an executor to answer `initialize`
    /// when a session opens on it. Default 10 s.
    pub open_timeout: Option<String>,
    /// Pools by name; a tenant names the one its sessions run on.
    #[serde(default)]
    pub pools: BTreeMap<String, PoolConfig>,
}

/// `[executors.pools.NAME]`
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PoolConfig {
    /// Executors (distinct ids) in the pool at once; past it a
    /// registration gets 429. Default 64.
    pub max_executors: Option<usize>,
    /// Links (registrations) one executor may hold at once. Default 16.
    pub max_links_per_executor: Option<usize>,
    /// Links over the whole pool (each may hold up to
    /// `server.max_message_bytes` in the gateway). Default 256.
    pub max_links: Option<usize>,
}

/// Validated `[executors]`.
#[derive(Debug, Clone)]
pub struct ExecutorsSettings {
    pub public_url: Option<String>,
    pub ticket_ttl: Duration,
    pub open_timeout: Duration,
    pub pools: BTreeMap<String, PoolSettings>,
}

/// Validated `[executors.pools.NAME]`.
#[derive(Debug, Clone)]
pub struct PoolSettings {
    pub name: String,
    /// The one tenant whose sessions it serves (pools are never shared:
    /// an executor would see every tenant's files).
    pub tenant: String,
    pub max_executors: usize,
    pub max_links_per_executor: usize,
    pub max_links: usize,
}

/// Longest executor id: it is part of session ids and metric labels.
pub const MAX_EXECUTOR_ID_BYTES: usize = 64;

/// An executor id: ASCII letters, digits, `_` and `-`, at most
/// [`MAX_EXECUTOR_ID_BYTES`] (no `.`: session ids split on it).
pub fn is_executor_id(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= MAX_EXECUTOR_ID_BYTES
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

pub(super) fn validate_executors(
    e: ExecutorsConfig,
    tenants: &BTreeMap<String, TenantSettings>,
) -> Result<Option<ExecutorsSettings>, ConfigError> {
    let mut users: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (name, t) in tenants {
        if let Some(pool) = &t.pool {
            if !e.pools.contains_key(pool) {
                return Err(ConfigError(format!(
                    "tenants.{name}.pool: no [executors.pools.{pool}] is configured"
                )));
            }
            users.entry(pool).or_default().push(name);
        }
    }
    for (pool, names) in &users {
        if names.len() > 1 {
            return Err(ConfigError(format!(
                "executors.pools.{pool} is named by tenants {}: a pool serves one tenant (its executors would see every tenant's processes and files)",
                names.join(", ")
            )));
        }
    }
    if e.pools.is_empty() {
        if e.public_url.is_some() {
            return Err(ConfigError(
                "executors.public_url is set but no [executors.pools.NAME] is configured"
                    .to_owned(),
            ));
        }
        return Ok(None);
    }
    if let Some(u) = &e.public_url {
        let parsed = url::Url::parse(u)
            .map_err(|err| ConfigError(format!("executors.public_url `{u}`: {err}")))?;
        if !matches!(parsed.scheme(), "ws" | "wss")
            || parsed.host_str().is_none()
            || parsed.query().is_some()
        {
            return Err(ConfigError(format!(
                "executors.public_url `{u}`: expected ws://HOST[:PORT][/PATH] or wss://..."
            )));
        }
    }
    let mut pools = BTreeMap::new();
    for (name, p) in e.pools {
        if !is_executor_id(&name) {
            return Err(ConfigError(format!(
                "executors.pools.{name}: a pool name is letters, digits, `_` and `-`"
            )));
        }
        let Some(tenant) = users.get(name.as_str()).and_then(|v| v.first()) else {
            return Err(ConfigError(format!(
                "executors.pools.{name}: no tenant names this pool (set tenants.NAME.pool)"
            )));
        };
        pools.insert(
            name.clone(),
            PoolSettings {
                tenant: (*tenant).to_owned(),
                max_executors: positive(
                    &format!("executors.pools.{name}.max_executors"),
                    p.max_executors,
                    64,
                )?,
                max_links_per_executor: positive(
                    &format!("executors.pools.{name}.max_links_per_executor"),
                    p.max_links_per_executor,
                    16,
                )?,
                max_links: positive(
                    &format!("executors.pools.{name}.max_links"),
                    p.max_links,
                    256,
                )?,
                name,
            },
        );
    }
    Ok(Some(ExecutorsSettings {
        public_url: e.public_url.map(|u| u.trim_end_matches('/').to_owned()),
        ticket_ttl: duration(
            "executors.ticket_ttl",
            e.ticket_ttl.as_deref(),
            Duration::from_secs(30),
        )?,
        open_timeout: duration(
            "executors.open_timeout",
            e.open_timeout.as_deref(),
            Duration::from_secs(10),
        )?,
        pools,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::tests::minimal;
    use crate::config::{Config, Placement};

    #[test]
    fn executor_pools_are_checked() {
        let err = |extra: &str| {
            let c: Config = toml::from_str(&minimal(extra)).unwrap();
            c.validate().unwrap_err().0
        };
        assert!(err("pool = \"p\"").contains("no [executors.pools.p]"));
        assert!(err("placement = \"remote\"").contains("needs tenants.a.pool"));
        assert!(err("[executors.pools.p]").contains("no tenant names this pool"));
        assert!(
            err("pool = \"p\"\n[executors]\npublic_url = \"http://x\"\n[executors.pools.p]")
                .contains("public_url")
        );
        assert!(err("pool = \"bad.name\"\n[executors.pools.\"bad.name\"]").contains("pool name"));
        let c: Config = toml::from_str(&minimal("pool = \"p\"\n[executors.pools.p]")).unwrap();
        let s = c.validate().unwrap();
        assert_eq!(s.tenants["a"].placement, Placement::Remote);
        let pools = &s.executors.unwrap().pools;
        assert_eq!(pools["p"].tenant, "a");
        assert_eq!(pools["p"].max_executors, 64);
        assert!(is_executor_id("ex-1_a") && !is_executor_id("ex.1") && !is_executor_id(""));
    }
}
