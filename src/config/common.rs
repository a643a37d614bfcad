//! Shared by every section: [`ConfigError`], the duration and count
//! parsers, and the gateway's state directory. Imports no sibling file.

use std::path::PathBuf;
use std::time::Duration;

/// A configuration problem: printed as one line, exit code 64.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ConfigError(pub String);

/// The secret key in `path` (`field` names it in errors), trailing
/// whitespace dropped, at least `min` bytes: what a fleet, snapshot or
/// preview key file holds.
pub(super) fn key_file(
    field: &str,
    path: &std::path::Path,
    min: usize,
) -> Result<Vec<u8>, ConfigError> {
    let mut key = std::fs::read(path)
        .map_err(|e| ConfigError(format!("{field}: cannot read {}: {e}", path.display())))?;
    while key.last().is_some_and(|b| b.is_ascii_whitespace()) {
        key.pop();
    }
    if key.len() < min {
        return Err(ConfigError(format!(
            "{field}: a key needs at least {min} bytes"
        )));
    }
    Ok(key)
}

pub(super) fn duration(
    name: &str,
    value: Option<&str>,
    default: Duration,
) -> Result<Duration, ConfigError> {
    match value {
        None => Ok(default),
        Some(v) => humantime::parse_duration(v)
            .map_err(|e| ConfigError(format!("{name}: invalid duration `{v}`: {e}"))),
    }
}

pub(super) fn optional_duration(
    name: &str,
    value: Option<&str>,
) -> Result<Option<Duration>, ConfigError> {
    value
        .map(|v| duration(name, Some(v), Duration::ZERO))
        .transpose()
}

pub(super) fn positive(
    name: &str,
    value: Option<usize>,
    default: usize,
) -> Result<usize, ConfigError> {
    match value.unwrap_or(default) {
        0 => Err(ConfigError(format!("{name} must be at least 1"))),
        n => Ok(n),
    }
}

/// The gateway's state directory (the embedded default's key, tenants'
/// private `/tmp`, their network files), kept out of the home directory
/// where another place is at hand, so that a tenant rooted at home (the
/// embedded default started there) does not hold it:
/// `$XDG_STATE_HOME/exec-gateway` when set, else
/// `$XDG_RUNTIME_DIR/exec-gateway` (a login session's private runtime
/// directory), else `/var/lib/exec-gateway` for root, else
/// `~/.local/state/exec-gateway`.
pub fn state_dir() -> Result<PathBuf, ConfigError> {
    let var = |k: &str| {
        std::env::var_os(k)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    if let Some(x) = var("XDG_STATE_HOME") {
        return Ok(x.join("exec-gateway"));
    }
    if let Some(x) = var("XDG_RUNTIME_DIR").filter(|p| p.is_absolute()) {
        return Ok(x.join("exec-gateway"));
    }
    if nix::unistd::geteuid().is_root() {
        return Ok(PathBuf::from("/var/lib/exec-gateway"));
    }
    let home = var("HOME").ok_or_else(|| {
        ConfigError("none of XDG_STATE_HOME, XDG_RUNTIME_DIR and HOME is set".to_owned())
    })?;
    Ok(home.join(".local/state/exec-gateway"))
}
