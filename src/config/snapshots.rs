//! `[snapshots]`: where workspace snapshots are kept and what a tenant's
//! snapshots and forks may hold (docs/snapshots.md). Imports only `common`.

use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use super::common::{ConfigError, duration, positive, state_dir};

/// Default `[snapshots] max_per_tenant`: snapshots one tenant keeps.
pub const DEFAULT_MAX_PER_TENANT: usize = 32;
/// Default `[snapshots] max_tenant_bytes`: what one tenant's snapshots
/// hold on disk together (each snapshot's unpacked bytes).
pub const DEFAULT_MAX_TENANT_BYTES: u64 = 4 << 30;
/// Default `[snapshots] max_entries`: files, directories and links of one
/// snapshot.
pub const DEFAULT_MAX_ENTRIES: u64 = 1_000_000;
/// Default `[snapshots] max_forks_per_tenant`: sessions of one tenant
/// working in a snapshot's copy at once (each has workers of its own).
pub const DEFAULT_MAX_FORKS_PER_TENANT: usize = 16;
/// The most forks `max_forks_per_tenant` may allow, whatever it says.
pub const MAX_FORKS_PER_TENANT: usize = 256;
/// Default `[snapshots] retention`: a snapshot is deleted this long after
/// it was taken (a fork working in it keeps its copy until it ends).
pub const DEFAULT_RETENTION: Duration = Duration::from_secs(30 * 24 * 3600);

/// `[snapshots]`
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SnapshotsConfig {
    /// Directory of the snapshots and the forks' copies. Default:
    /// `snapshots` in the state directory.
    pub store: Option<PathBuf>,
    pub max_per_tenant: Option<usize>,
    pub max_tenant_bytes: Option<u64>,
    pub max_entries: Option<u64>,
    pub max_forks_per_tenant: Option<usize>,
    pub retention: Option<String>,
    /// Registry repository snapshots are pushed to and restored from:
    /// `host[:port]/path` (credentials, CA and plain-HTTP registries as in
    /// `[images]`). None: snapshots stay on the replica that took them.
    pub registry: Option<String>,
    /// The key (at least 32 bytes, the same on every replica) that signs
    /// what is pushed; required with `registry`: a restore takes only what
    /// a gateway with this key pushed for the same tenant.
    pub key_file: Option<PathBuf>,
}

/// Shortest accepted snapshot signing key.
pub const MIN_SNAPSHOT_KEY_BYTES: usize = 32;

/// The key that signs pushed snapshots (never printed).
#[derive(Clone, PartialEq, Eq)]
pub struct SnapshotKey(pub Vec<u8>);

impl std::fmt::Debug for SnapshotKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SnapshotKey(..)")
    }
}

/// Validated `[snapshots]`.
#[derive(Debug, Clone)]
pub struct SnapshotsSettings {
    pub store: PathBuf,
    pub max_per_tenant: usize,
    pub max_tenant_bytes: u64,
    pub max_entries: u64,
    pub max_forks_per_tenant: usize,
    pub retention: Duration,
    /// The snapshot registry and the key that signs what goes there.
    pub registry: Option<(String, SnapshotKey)>,
}

impl SnapshotsConfig {
    pub fn validate(&self) -> Result<SnapshotsSettings, ConfigError> {
        let store = match &self.store {
            Some(p) if p.is_absolute() => p.clone(),
            Some(p) => {
                return Err(ConfigError(format!(
                    "snapshots.store: `{}` is not absolute",
                    p.display()
                )));
            }
            None => state_dir()?.join("snapshots"),
        };
        let max_forks_per_tenant = positive(
            "snapshots.max_forks_per_tenant",
            self.max_forks_per_tenant,
            DEFAULT_MAX_FORKS_PER_TENANT,
        )?;
        if max_forks_per_tenant > MAX_FORKS_PER_TENANT {
            return Err(ConfigError(format!(
                "snapshots.max_forks_per_tenant: at most {MAX_FORKS_PER_TENANT}"
            )));
        }
        let max_tenant_bytes = self.max_tenant_bytes.unwrap_or(DEFAULT_MAX_TENANT_BYTES);
        if max_tenant_bytes < 1 << 20 {
            return Err(ConfigError(
                "snapshots.max_tenant_bytes: at least 1 MiB".to_owned(),
            ));
        }
        let max_entries = self.max_entries.unwrap_or(DEFAULT_MAX_ENTRIES);
        if max_entries < 16 {
            return Err(ConfigError("snapshots.max_entries: at least 16".to_owned()));
        }
        let retention = duration(
            "snapshots.retention",
            self.retention.as_deref(),
            DEFAULT_RETENTION,
        )?;
        if retention < Duration::from_secs(60) {
            return Err(ConfigError("snapshots.retention: at least 1m".to_owned()));
        }
        let registry = match (&self.registry, &self.key_file) {
            (Some(r), Some(k)) => Some((registry(r)?, key(k)?)),
            (Some(_), None) => {
                return Err(ConfigError(
                    "snapshots.key_file is required with snapshots.registry: a restore must tell what a gateway of this fleet pushed from what anyone who can write to the registry put there".to_owned(),
                ));
            }
            (None, Some(_)) => {
                return Err(ConfigError(
                    "snapshots.key_file without snapshots.registry signs nothing".to_owned(),
                ));
            }
            (None, None) => None,
        };
        Ok(SnapshotsSettings {
            registry,
            store,
            max_per_tenant: positive(
                "snapshots.max_per_tenant",
                self.max_per_tenant,
                DEFAULT_MAX_PER_TENANT,
            )?,
            max_tenant_bytes,
            max_entries,
            max_forks_per_tenant,
            retention,
        })
    }
}

/// The signing key in `path`, trailing whitespace dropped.
fn key(path: &std::path::Path) -> Result<SnapshotKey, ConfigError> {
    super::common::key_file("snapshots.key_file", path, MIN_SNAPSHOT_KEY_BYTES).map(SnapshotKey)
}

/// `[snapshots] registry`: a repository on a named registry host, without
/// a scheme, tag or digest (a tenant's snapshots go below it).
fn registry(r: &str) -> Result<String, ConfigError> {
    let bad = |why: &str| ConfigError(format!("snapshots.registry `{r}`: {why}"));
    let r = r.trim_end_matches('/');
    if r.contains("://") || r.contains('@') {
        return Err(bad(
            "a repository (`host[:port]/path`), without a scheme or digest",
        ));
    }
    let (host, path) = r
        .split_once('/')
        .ok_or_else(|| bad("the registry's host and a path (`host[:port]/path`)"))?;
    if !(host.contains('.') || host.contains(':') || host == "localhost") {
        return Err(bad(
            "the first part must be a registry host (with a `.` or a port, or `localhost`)",
        ));
    }
    let ok = |part: &str| {
        !part.is_empty()
            && part
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-".contains(&b))
            && part
                .bytes()
                .next()
                .is_some_and(|b| b.is_ascii_alphanumeric())
    };
    if !path.split('/').all(ok) || path.len() > 128 {
        return Err(bad(
            "path components of lowercase letters, digits and `._-`, at most 128 bytes",
        ));
    }
    Ok(r.to_owned())
}

#[cfg(test)]
mod tests {
    use super::registry;

    #[test]
    fn a_snapshot_registry_needs_a_signing_key_of_its_own() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let short = dir.path().join("short");
        let good = dir.path().join("good");
        std::fs::write(&short, "too short\n").unwrap_or_else(|e| panic!("{e}"));
        std::fs::write(&good, [7u8; 32]).unwrap_or_else(|e| panic!("{e}"));
        let with = |registry: Option<&str>, key: Option<&std::path::Path>| {
            super::SnapshotsConfig {
                store: Some(dir.path().join("store")),
                registry: registry.map(str::to_owned),
                key_file: key.map(|k| k.to_path_buf()),
                ..Default::default()
            }
            .validate()
            .map_err(|e| e.0)
        };
        let reg = Some("localhost:5000/snaps");
        assert!(with(reg, None).is_err_and(|e| e.contains("key_file is required")));
        assert!(with(None, Some(&good)).is_err_and(|e| e.contains("signs nothing")));
        assert!(with(reg, Some(&short)).is_err_and(|e| e.contains("at least 32 bytes")));
        let ok = with(reg, Some(&good)).unwrap_or_else(|e| panic!("{e}"));
        let (r, key) = ok.registry.unwrap_or_else(|| panic!("no registry"));
        assert_eq!((r.as_str(), key.0.len()), ("localhost:5000/snaps", 32));
        assert_eq!(format!("{key:?}"), "SnapshotKey(..)");
    }

    #[test]
    fn a_snapshot_registry_is_a_repository_on_a_named_host() {
        assert_eq!(
            registry("localhost:5000/exec-gateway/snapshots/")
                .ok()
                .as_deref(),
            Some("localhost:5000/exec-gateway/snapshots")
        );
        assert!(registry("registry.example.com/snaps").is_ok());
        for bad in [
            "snapshots",
            "exec/snapshots",
            "https://registry.example.com/snaps",
            "registry.example.com/Snaps",
            "registry.example.com/snaps:latest",
            "registry.example.com/snaps@sha256:00",
            "registry.example.com",
        ] {
            assert!(registry(bad).is_err(), "{bad}");
        }
    }
}
