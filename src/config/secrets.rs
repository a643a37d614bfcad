//! `[tenants.NAME.secrets.VAR]`: values the gateway puts into the
//! tenant's `http/request` headers (`valueEnvVar`) for the hosts each is
//! bound to, read from files the tenant cannot see (docs/isolation.md,
//! "Secrets").

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::Deserialize;

use super::common::ConfigError;
use super::egress::EgressNames;

/// Secrets one tenant may have.
pub const MAX_SECRETS_PER_TENANT: usize = 64;
/// The largest secret file read.
pub const MAX_SECRET_BYTES: u64 = 64 << 10;

/// `[tenants.NAME.secrets.VAR]` as written.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SecretConfig {
    /// The file holding the value (read at each use; a trailing newline
    /// is dropped). Outside every tenant's view (refused otherwise).
    pub file: PathBuf,
    /// The hosts the value may be sent to (names, `*.` wildcards, an
    /// optional `:PORT`, as in `egress_names`). Required.
    pub hosts: Vec<String>,
    /// Also for the tenant's own processes: they see a placeholder in
    /// this variable, and the egress proxy puts the value in its place in
    /// the headers of HTTPS requests to `hosts`, which it intercepts with
    /// the tenant's own CA (docs/isolation.md, "Secrets for the tenant's
    /// processes"). Needs `egress_names`. Off: only `http/request` uses it.
    #[serde(default)]
    pub substitute: bool,
}

/// One validated secret.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TenantSecret {
    pub name: String,
    pub file: PathBuf,
    pub hosts: EgressNames,
    /// Substituted in the tenant's processes' requests too.
    pub substitute: bool,
}

/// Validate a tenant's `secrets`.
pub(super) fn validate_secrets(
    tenant: &str,
    raw: BTreeMap<String, SecretConfig>,
) -> Result<Vec<TenantSecret>, ConfigError> {
    if raw.len() > MAX_SECRETS_PER_TENANT {
        return Err(ConfigError(format!(
            "tenants.{tenant}.secrets: {} secrets; at most {MAX_SECRETS_PER_TENANT}",
            raw.len()
        )));
    }
    raw.into_iter()
        .map(|(name, c)| {
            let at = format!("tenants.{tenant}.secrets.{name}");
            let well_formed = name
                .bytes()
                .next()
                .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_')
                && name.len() <= 128
                && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
            if !well_formed {
                return Err(ConfigError(format!(
                    "{at}: a secret's name is letters, digits and '_' (an environment variable's)"
                )));
            }
            if !c.file.is_absolute() {
                return Err(ConfigError(format!("{at}.file must be an absolute path")));
            }
            if c.hosts.is_empty() {
                return Err(ConfigError(format!(
                    "{at}.hosts is empty: a secret is sent only to the hosts it names"
                )));
            }
            let hosts = EgressNames::parse(&c.hosts)
                .map_err(|e| ConfigError(format!("{at}.hosts: {e}")))?;
            Ok(TenantSecret {
                name,
                file: c.file,
                hosts,
                substitute: c.substitute,
            })
        })
        .collect()
}

impl TenantSecret {
    /// The value now, from its file.
    pub fn read(&self) -> std::io::Result<String> {
        use std::io::Read as _;
        let f = std::fs::File::open(&self.file)?;
        let mut s = String::new();
        f.take(MAX_SECRET_BYTES + 1).read_to_string(&mut s)?;
        if s.len() as u64 > MAX_SECRET_BYTES {
            return Err(std::io::Error::other(format!(
                "{} is over {MAX_SECRET_BYTES} bytes",
                self.file.display()
            )));
        }
        let trimmed = s.strip_suffix('\n').unwrap_or(&s);
        Ok(trimmed.strip_suffix('\r').unwrap_or(trimmed).to_owned())
    }
}
