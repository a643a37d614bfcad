//! Key files: the embedded default's HS256 key in the state directory, the
//! list of the gateway's key files, and the refusal of keys a tenant can reach.

use std::path::{Path, PathBuf};

use super::auth::KeySettings;
use super::common::{ConfigError, state_dir};
use super::tenants::TenantSettings;

/// The embedded default's HS256 key: created (32 random bytes, hex, mode
/// 0600) on first use, then reused.
pub fn default_key_file() -> Result<PathBuf, ConfigError> {
    use std::io::Write as _;
    use std::os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _};
    let dir = state_dir()?;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&dir)
        .map_err(|e| ConfigError(format!("cannot create {}: {e}", dir.display())))?;
    let path = dir.join("hs256.key");
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).map_err(|e| ConfigError(format!("no randomness: {e}")))?;
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&path)
    {
        Ok(mut f) => {
            f.write_all(format!("{hex}\n").as_bytes())
                .map_err(|e| ConfigError(format!("cannot write {}: {e}", path.display())))?;
        }
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => {
            return Err(ConfigError(format!(
                "cannot create {}: {e}",
                path.display()
            )));
        }
    }
    Ok(path)
}

/// The gateway's key files, absolute (as written and resolved through
/// symlinks): no tenant may reach them.
pub fn key_files(keys: &[KeySettings]) -> Vec<PathBuf> {
    secret_paths(keys.iter().filter_map(|k| k.source.file()))
}

/// `files`, absolute, each as written and as resolved through symlinks
/// (a tenant must reach neither), sorted.
pub fn secret_paths<'a>(files: impl Iterator<Item = &'a Path>) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for p in files {
        {
            let abs = if p.is_absolute() {
                p.to_path_buf()
            } else {
                std::env::current_dir()
                    .map(|d| d.join(p))
                    .unwrap_or_else(|_| p.to_path_buf())
            };
            if let Ok(real) = abs.canonicalize() {
                out.push(real);
            }
            out.push(crate::fs::normalize(&abs));
        }
    }
    out.sort();
    out.dedup();
    out
}

/// A key file inside a tenant's root or its extra writable paths would let
/// that tenant read it (fs/readFile, or its processes) and mint tokens for
/// every tenant: such a configuration is refused. A root of `/` is the
/// documented "no confinement" setting and is not checked.
pub(super) fn refuse_exposed_keys(
    name: &str,
    t: &TenantSettings,
    keys: &[PathBuf],
) -> Result<(), ConfigError> {
    for dir in t.writable_dirs() {
        if let Some(key) = keys.iter().find(|k| k.starts_with(&dir)) {
            return Err(ConfigError(format!(
                "tenants.{name}: secret file {} lies inside {}, which the tenant can read; \
                 move it (for example to /run/exec-gateway) or choose another root",
                key.display(),
                dir.display()
            )));
        }
    }
    Ok(())
}
