//! Shared by every section: [`ConfigError`], the duration and count
//! parsers, and the gateway's state directory. Imports no sibling file.

use std::path::PathBuf;
use std::time::Duration;

/// A configuration problem: printed as one line, exit code 64.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ConfigError(pub String);

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

/// `$XDG_STATE_HOME/exec-gateway`, else `~/.local/state/exec-gateway`.
pub fn state_dir() -> Result<PathBuf, ConfigError> {
    if let Some(x) = std::env::var_os("XDG_STATE_HOME").filter(|v| !v.is_empty()) {
        return Ok(PathBuf::from(x).join("exec-gateway"));
    }
    let home = std::env::var_os("HOME")
        .filter(|v| !v.is_empty())
        .ok_or_else(|| ConfigError("neither XDG_STATE_HOME nor HOME is set".to_owned()))?;
    Ok(PathBuf::from(home).join(".local/state/exec-gateway"))
}
