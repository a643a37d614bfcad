//! `[exec]`: gateway-wide process settings (validated into
//! `Settings::max_processes` and `Settings::exited_retention` by `mod.rs`).

use serde::Deserialize;

/// `[exec]`: gateway-wide process settings.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExecConfig {
    /// Running processes over all tenants; past it, starts are shed (-32001). Default: 4096.
    pub max_processes: Option<usize>,
    /// How long a closed process stays readable (and its id taken).
    /// Default: each revision's reference (`30s` for 0.130.0, `80s` for 0.169.0).
    pub exited_retention: Option<String>,
}
