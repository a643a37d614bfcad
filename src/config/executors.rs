//! `[executors]` and `[executors.pools.NAME]`: the remote executor registry,
//! raw and validated, and executor ids.

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
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
    /// The SigV4 credential scope Codex 0.169.0 executors sign for
    /// (`--aws-region`, `--aws-service`). Defaults `us-east-1`,
    /// `execute-api`.
    pub sigv4_region: Option<String>,
    pub sigv4_service: Option<String>,
    /// How far a SigV4 signer's clock may be from the gateway's. Default
    /// 5 min.
    pub max_clock_skew: Option<String>,
    /// How long a direct (0.169.0) registration's URL may be dialled
    /// again; past it a dial gets 409 and the executor registers anew.
    /// Default 1 h.
    pub registration_ttl: Option<String>,
    /// Revoked executor credentials, one per line (`jti ID`, `executor
    /// ID`, `key ACCESS_KEY_ID`, `subject SUB`; `#` comments): refused at
    /// registration, and their live links closed when the file changes
    /// (re-read with the configuration).
    pub revocations_file: Option<PathBuf>,
}

/// `[[executors.pools.NAME.access_keys]]`: a SigV4 access key (Codex
/// 0.169.0's direct transport) that joins this pool.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AccessKeyConfig {
    /// The access key id (`AWS_ACCESS_KEY_ID` on the executor).
    pub id: String,
    /// The file holding its secret access key.
    pub secret_file: PathBuf,
    /// If set, the key registers only as this executor (environment) id.
    pub executor_id: Option<String>,
    /// Labels its executors carry (matched against `pool_labels`).
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
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
    #[serde(default)]
    pub access_keys: Vec<AccessKeyConfig>,
}

/// Validated `[executors]`.
#[derive(Debug, Clone)]
pub struct ExecutorsSettings {
    pub public_url: Option<String>,
    pub ticket_ttl: Duration,
    pub open_timeout: Duration,
    pub pools: BTreeMap<String, PoolSettings>,
    pub sigv4_region: String,
    pub sigv4_service: String,
    pub max_clock_skew: Duration,
    pub registration_ttl: Duration,
    pub revocations_file: Option<PathBuf>,
    /// The client listener speaks TLS (`[server.tls]`): rendezvous URLs
    /// built from `Host` are `wss://`.
    pub listener_tls: bool,
}

/// A validated access key; its secret is never printed.
#[derive(Clone, PartialEq, Eq)]
pub struct AccessKey {
    pub id: String,
    pub secret: Vec<u8>,
    pub executor_id: Option<String>,
    pub labels: BTreeMap<String, String>,
    pub secret_file: PathBuf,
}

impl std::fmt::Debug for AccessKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AccessKey")
            .field("id", &self.id)
            .field("executor_id", &self.executor_id)
            .field("labels", &self.labels)
            .field("secret_file", &self.secret_file)
            .finish_non_exhaustive()
    }
}

/// Entries a revocations file may hold.
pub const MAX_REVOCATIONS: usize = 100_000;
/// Largest revocations file.
pub const MAX_REVOCATIONS_BYTES: u64 = 8 * 1024 * 1024;

/// `line` without its comment.
fn comment_free(line: &str) -> &str {
    let mut prev_space = true;
    for (i, c) in line.char_indices() {
        if c == '#' && prev_space {
            return line[..i].trim();
        }
        prev_space = c.is_whitespace();
    }
    line.trim()
}

/// Revoked executor credentials (`executors.revocations_file`).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Revocations {
    pub jti: HashSet<String>,
    pub executors: HashSet<String>,
    pub keys: HashSet<String>,
    pub subjects: HashSet<String>,
}

impl Revocations {
    /// Parse a revocations file's text.
    pub fn parse(text: &str) -> Result<Revocations, String> {
        let mut r = Revocations::default();
        let mut n = 0usize;
        for (i, line) in text.lines().enumerate() {
            // `#` starts a comment at the start of a line or after
            // whitespace; inside a value it is part of it.
            let line = comment_free(line);
            if line.is_empty() {
                continue;
            }
            let (kind, value) = line
                .split_once(char::is_whitespace)
                .map(|(k, v)| (k, v.trim()))
                .ok_or_else(|| format!("line {}: expected `KIND VALUE`", i + 1))?;
            if value.is_empty() || value.contains(char::is_whitespace) {
                return Err(format!("line {}: one value after `{kind}`", i + 1));
            }
            let set = match kind {
                "jti" => &mut r.jti,
                "executor" => &mut r.executors,
                "key" => &mut r.keys,
                "subject" => &mut r.subjects,
                other => {
                    return Err(format!(
                        "line {}: unknown kind `{other}` (jti, executor, key, subject)",
                        i + 1
                    ));
                }
            };
            set.insert(value.to_owned());
            n += 1;
            if n > MAX_REVOCATIONS {
                return Err(format!("more than {MAX_REVOCATIONS} entries"));
            }
        }
        Ok(r)
    }

    /// Read and parse `path`.
    pub fn load(path: &Path) -> Result<Revocations, String> {
        use std::io::Read as _;
        let f = std::fs::File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let mut text = String::new();
        f.take(MAX_REVOCATIONS_BYTES + 1)
            .read_to_string(&mut text)
            .map_err(|e| format!("{}: {e}", path.display()))?;
        if text.len() as u64 > MAX_REVOCATIONS_BYTES {
            return Err(format!(
                "{}: larger than {MAX_REVOCATIONS_BYTES} bytes",
                path.display()
            ));
        }
        Revocations::parse(&text).map_err(|e| format!("{}: {e}", path.display()))
    }

    /// Which entry revokes a credential, if one does.
    pub fn revokes(
        &self,
        jti: Option<&str>,
        executor: &str,
        key: Option<&str>,
        subject: Option<&str>,
    ) -> Option<String> {
        if let Some(j) = jti.filter(|j| self.jti.contains(*j)) {
            return Some(format!("jti {j}"));
        }
        if self.executors.contains(executor) {
            return Some(format!("executor {executor}"));
        }
        if let Some(k) = key.filter(|k| self.keys.contains(*k)) {
            return Some(format!("key {k}"));
        }
        subject
            .filter(|s| self.subjects.contains(*s))
            .map(|s| format!("subject {s}"))
    }
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
    pub access_keys: Vec<AccessKey>,
}

/// Longest access key id, and its secret.
const MAX_ACCESS_KEY_ID_BYTES: usize = 128;
const MAX_SECRET_BYTES: usize = 4096;
/// A secret access key shorter than this is refused (AWS's are 40).
const MIN_SECRET_BYTES: usize = 16;

/// The secret files `[executors]` names (kept from tenants like every
/// other key file, and watched for reload).
pub fn executor_secret_files(e: &ExecutorsConfig) -> Vec<&Path> {
    e.pools
        .values()
        .flat_map(|p| p.access_keys.iter().map(|k| k.secret_file.as_path()))
        .chain(e.revocations_file.as_deref())
        .collect()
}

fn access_key(
    pool: &str,
    k: AccessKeyConfig,
    seen: &mut HashSet<String>,
) -> Result<AccessKey, ConfigError> {
    let name = format!("executors.pools.{pool}.access_keys `{}`", k.id);
    if k.id.is_empty()
        || k.id.len() > MAX_ACCESS_KEY_ID_BYTES
        || !k.id.bytes().all(|b| b.is_ascii_alphanumeric())
    {
        return Err(ConfigError(format!(
            "{name}: an access key id is 1 to {MAX_ACCESS_KEY_ID_BYTES} letters and digits"
        )));
    }
    if !seen.insert(k.id.clone()) {
        return Err(ConfigError(format!(
            "{name}: the same access key id is configured twice (a key joins one pool)"
        )));
    }
    if let Some(e) = &k.executor_id
        && !is_executor_id(e)
    {
        return Err(ConfigError(format!(
            "{name}: executor_id `{e}` is not an executor id (letters, digits, `_`, `-`)"
        )));
    }
    let mut secret = std::fs::read(&k.secret_file).map_err(|e| {
        ConfigError(format!(
            "{name}: cannot read {}: {e}",
            k.secret_file.display()
        ))
    })?;
    while secret.last().is_some_and(|b| b.is_ascii_whitespace()) {
        secret.pop();
    }
    if secret.len() < MIN_SECRET_BYTES || secret.len() > MAX_SECRET_BYTES {
        return Err(ConfigError(format!(
            "{name}: a secret access key is {MIN_SECRET_BYTES} to {MAX_SECRET_BYTES} bytes"
        )));
    }
    Ok(AccessKey {
        id: k.id,
        secret,
        executor_id: k.executor_id,
        labels: k.labels,
        secret_file: k.secret_file,
    })
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
    let mut seen_keys = HashSet::new();
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
        let access_keys = p
            .access_keys
            .into_iter()
            .map(|k| access_key(&name, k, &mut seen_keys))
            .collect::<Result<Vec<_>, _>>()?;
        pools.insert(
            name.clone(),
            PoolSettings {
                access_keys,
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
        listener_tls: false,
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
        sigv4_region: e.sigv4_region.unwrap_or_else(|| "us-east-1".to_owned()),
        sigv4_service: e.sigv4_service.unwrap_or_else(|| "execute-api".to_owned()),
        max_clock_skew: duration(
            "executors.max_clock_skew",
            e.max_clock_skew.as_deref(),
            Duration::from_secs(300),
        )?,
        registration_ttl: duration(
            "executors.registration_ttl",
            e.registration_ttl.as_deref(),
            Duration::from_secs(3600),
        )?,
        revocations_file: e.revocations_file,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::tests::minimal;
    use crate::config::{Config, Placement};

    #[test]
    fn revocations_parse_with_comments_only_where_they_start() {
        let r = Revocations::parse(
            "# a comment\njti j1 # why\nsubject ci#x\nexecutor e-1\n\tkey AK1\n",
        )
        .unwrap();
        assert!(r.jti.contains("j1"));
        assert!(r.subjects.contains("ci#x") && !r.subjects.contains("ci"));
        assert!(r.executors.contains("e-1") && r.keys.contains("AK1"));
        assert!(Revocations::parse("jti a b").is_err());
        assert!(Revocations::parse("token x").is_err());
        assert!(Revocations::parse("jti").is_err());
    }

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
