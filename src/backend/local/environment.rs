//! `environment/info`, `environment/status`, `environmentConfig/read`,
//! `capabilities/discover` and `capabilityRoots/discover`: what the
//! tenant's commands run in, and the (empty) plugin and skill discovery of
//! a gateway.

use std::collections::BTreeMap;
use std::path::Path;

use super::Shared;
use crate::error::GatewayError;
use crate::protocol::environment::{
    ConfigLayers, ConfigReadParams, ConfigReadResponse, DiscoverParams, DiscoverResponse,
    EnvironmentInfo, RootsParams, RootsResponse, Shell, StatusResponse,
};
use crate::protocol::revision::{NOV_2026, Policy};
use crate::rpc::Reply;

/// `environment/info`, paths in the session's form (a May session learnt
/// plain paths).
pub(super) fn info(shared: &Shared, policy: &Policy) -> Reply {
    Reply::EnvironmentInfo(Box::new(describe(shared, policy)))
}

/// `environmentInfo`: the tenant's root, home, temporary directory and
/// shell, and only the capabilities the gateway really has; paths in
/// `policy`'s form.
pub(super) fn describe(shared: &Shared, policy: &Policy) -> EnvironmentInfo {
    use sha2::Digest as _;
    let uri = |p: &str| policy.wire_path(p);
    let env = &shared.env;
    let digest = sha2::Sha256::digest(format!("exec-gateway/tenant/{}", env.tenant));
    let provider: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    let shell_name = Path::new(&env.shell)
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "sh".to_owned());
    let capabilities = [
        ("fsWatchMissing", true),
        ("capabilityDiscoveryV2", true),
        ("environmentConfigRead", true),
        ("fileWriteStreaming", true),
        ("sandboxedFileStreaming", false),
        // A process proxy of the tenant's egress by name (`egress::ask`).
        ("networkProxyLaunch", shared.egress.get().is_some()),
        ("networkProxyReviewDomains", false),
        ("credentialMasking", false),
        ("credentialMaskingCustomProviders", false),
        ("capabilityDiscoverySandbox", false),
        // `valueEnvVar` from the tenant's secrets, where it has http/request.
        ("httpHeaderEnvVars", shared.http.is_some()),
        ("shellSnapshotV2", false),
        ("windowsMxc", false),
        ("linuxRootWritePreservesDevices", false),
        ("linuxApprovedRootWritePreservesRestrictions", false),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect::<BTreeMap<_, _>>();
    EnvironmentInfo {
        shell: Shell {
            name: shell_name,
            path: env.shell.clone(),
        },
        executor_version: env!("CARGO_PKG_VERSION").to_owned(),
        provider_id: format!("sha256:{provider}"),
        cwd: uri(&env.root.display().to_string()),
        user_home_dir: uri(&env.home),
        platform_os: "linux".to_owned(),
        prepend_path_dirs: Vec::new(),
        temporary_directories: Vec::new(),
        temp_dir: uri(&env.tmp),
        capabilities,
        image: env
            .image
            .as_ref()
            .map(|i| crate::protocol::environment::ImageInfo {
                reference: i.source.clone(),
                digest: i.digest.clone(),
                working_dir: i.working_dir.clone(),
            }),
    }
}

pub(super) fn status() -> Reply {
    Reply::EnvironmentStatus(StatusResponse {
        status: "ready".to_owned(),
    })
}

/// `environmentConfig/read`: no configuration layers are kept on a
/// gateway; the homes are the tenant's (a method of 0.169.0 only: URIs).
pub(super) fn config_read(shared: &Shared, p: &ConfigReadParams) -> Result<Reply, GatewayError> {
    if p.config_paths.is_empty() && p.requirements_paths.is_empty() {
        return Err(GatewayError::InvalidParams(
            "at least one config or requirements path is required".to_owned(),
        ));
    }
    shared.check_cwd(&p.cwd)?;
    let env = &shared.env;
    let none = || ConfigLayers {
        layers: Vec::new(),
        cloud_insertion_index: 0,
    };
    Ok(Reply::EnvironmentConfigRead(ConfigReadResponse {
        user_home_dir: NOV_2026.wire_path(&env.home),
        codex_home_dir: NOV_2026
            .wire_path(&Path::new(&env.home).join(".codex").display().to_string()),
        hostname: nix::unistd::gethostname()
            .map(|h| h.to_string_lossy().into_owned())
            .unwrap_or_default(),
        config: none(),
        requirements: none(),
    }))
}

/// `capabilities/discover`: no plugins or skills are installed on a gateway.
pub(super) fn discover(shared: &Shared, p: &DiscoverParams) -> Result<Reply, GatewayError> {
    // A missing cwd finds nothing, as on the reference; one outside the
    // root is refused.
    match shared.check_cwd(&p.cwd) {
        Err(e @ GatewayError::OutsideRoot(_)) => return Err(e),
        Err(e @ GatewayError::InvalidParams(_)) => return Err(e),
        _ => {}
    }
    Ok(Reply::CapabilitiesDiscover(DiscoverResponse {
        plugins: Vec::new(),
        skills: Vec::new(),
        warnings: Vec::new(),
    }))
}

/// `capabilityRoots/discover`: one empty entry per root; a gateway has no
/// plugins or skills to find (and scans nothing, inside the root or out).
pub(super) fn roots(p: RootsParams) -> Reply {
    Reply::CapabilityRootsDiscover(RootsResponse {
        roots: p
            .roots
            .into_iter()
            .map(|r| {
                serde_json::json!({
                    "id": r.id,
                    "path": r.rest.get("path").cloned().unwrap_or(serde_json::Value::Null),
                    "plugin": null,
                    "skills": [],
                    "namespaceManifests": [],
                    "warnings": [],
                    "error": null,
                })
            })
            .collect(),
    })
}
