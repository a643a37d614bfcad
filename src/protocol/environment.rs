//! 0.169.0's environment description (`initialize`'s `environmentInfo`,
//! `environment/info`) and the environment methods' params and results.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::path::WirePath;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Shell {
    pub name: String,
    pub path: String,
}

/// What runs commands here: paths are written in the session's form.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EnvironmentInfo {
    pub shell: Shell,
    pub executor_version: String,
    /// Identifies the environment (stable per tenant).
    pub provider_id: String,
    pub cwd: String,
    pub user_home_dir: String,
    pub platform_os: String,
    pub prepend_path_dirs: Vec<String>,
    pub temporary_directories: Vec<String>,
    pub temp_dir: String,
    /// Feature flags: only what the gateway really does is `true`.
    pub capabilities: BTreeMap<String, bool>,
    /// The image the session's processes see as `/` (an extension; absent
    /// without one, so a session without an image answers as Codex does).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<ImageInfo>,
}

/// `environmentInfo.image`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ImageInfo {
    /// As configured or chosen.
    pub reference: String,
    /// The manifest's digest: what the session really runs.
    pub digest: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub working_dir: Option<String>,
}

/// Result of `environment/status`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatusResponse {
    pub status: String,
}

/// Params of `environmentConfig/read`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ConfigReadParams {
    pub cwd: WirePath,
    pub config_paths: Vec<Vec<String>>,
    pub requirements_paths: Vec<Vec<String>>,
}

/// Configuration layers found on the executor (none on a gateway).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ConfigLayers {
    pub layers: Vec<serde_json::Value>,
    pub cloud_insertion_index: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ConfigReadResponse {
    pub user_home_dir: String,
    pub codex_home_dir: String,
    pub hostname: String,
    pub config: ConfigLayers,
    pub requirements: ConfigLayers,
}

/// Params of `capabilities/discoverV2`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DiscoverParams {
    pub cwd: WirePath,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DiscoverResponse {
    pub plugins: Vec<serde_json::Value>,
    pub skills: Vec<serde_json::Value>,
    pub warnings: Vec<serde_json::Value>,
}

/// One root of `capabilityRoots/discoverV1`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CapabilityRoot {
    pub id: String,
    #[serde(flatten)]
    pub rest: BTreeMap<String, serde_json::Value>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RootsParams {
    pub roots: Vec<CapabilityRoot>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RootsResponse {
    pub roots: Vec<serde_json::Value>,
}
