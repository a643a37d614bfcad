//! The deployment's files stay true to the gateway: its configuration parses
//! with the gateway's own types (unknown keys are refused), asks for the
//! isolation layers the deployment README promises, and the manifests name
//! the files and ports the gateway uses.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::Path;

use exec_gateway::config::{Config, LayerPolicy};

fn read(rel: &str) -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(rel))
        .unwrap_or_else(|e| panic!("{rel}: {e}"))
}

#[test]
fn deploy_config_parses_and_requires_the_promised_layers() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/gateway.toml");
    let config = Config::load(&path).expect("deploy/gateway.toml must parse");
    for (name, policy) in [
        ("workers", config.isolation.workers),
        ("landlock", config.isolation.landlock),
        ("seccomp", config.isolation.seccomp),
        ("uid", config.isolation.uid),
    ] {
        assert_eq!(policy, Some(LayerPolicy::Required), "{name}");
    }
    // Every tenant has a uid, and the init container prepares each root.
    let deployment = read("deploy/kubernetes/deployment.yaml");
    for (name, t) in &config.tenants {
        let uid = t.uid.unwrap_or_else(|| panic!("tenant {name} has no uid"));
        assert!(
            deployment.contains(&format!("{name}:{uid}")),
            "the init container does not prepare {name}'s root for uid {uid}"
        );
    }
}

#[test]
fn manifests_use_the_gateways_ports_paths_and_probes() {
    let deployment = read("deploy/kubernetes/deployment.yaml");
    let config = read("deploy/gateway.toml");
    assert!(config.contains("ws://0.0.0.0:8765") && config.contains("0.0.0.0:50051"));
    for needle in [
        "containerPort: 8765",
        "containerPort: 50051",
        "path: /readyz",
        "path: /healthz",
        "/run/exec-gateway/config/gateway.toml",
    ] {
        assert!(deployment.contains(needle), "deployment lacks {needle}");
    }
    assert!(read("deploy/kubernetes/kustomization.yaml").contains("gateway.toml=../gateway.toml"));
    assert!(read("deploy/Dockerfile").contains("/run/exec-gateway/config/gateway.toml"));
}
