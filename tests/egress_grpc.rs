//! Egress by name over gRPC (`SessionService/GetEgress`, `SetEgress`;
//! docs/isolation.md, "Egress by name"): the JSON-RPC door's
//! `gateway/egress/get` and `set` through the same stack, with no session.
//! The names read and changed, what is refused with which status, and that
//! both doors see one policy. What the names let a tenant's processes reach
//! is tests/egress_names.rs's.
//!
//! Needs tenants with network namespaces of their own (root, slirp4netns,
//! nft); skipped with the reason otherwise.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::grpc::{authed, channel};
use common::{Client, Gateway, mint};
use exec_gateway::transport::grpc::pb;
use pb::session_service_client::SessionServiceClient;
use serde_json::json;
use tonic::transport::Channel;

const SCOPES: &str = "exec egress";

/// Why this host cannot run the test, if it cannot.
fn missing() -> Option<String> {
    if !nix::unistd::geteuid().is_root() {
        return Some("egress by name needs network namespaces (root)".to_owned());
    }
    for (tool, package) in [("slirp4netns", "slirp4netns"), ("nft", "nftables")] {
        if !["/usr/sbin", "/usr/bin", "/sbin", "/bin"]
            .iter()
            .any(|d| std::path::Path::new(d).join(tool).is_file())
        {
            return Some(format!(
                "`{tool}` is not installed (Debian package {package})"
            ));
        }
    }
    None
}

/// Tenant `a` with `egress_names = ["a.test"]` and `cidrs` allowed,
/// tenant `b` with its egress decided by addresses alone; both `isolated`
/// (the default) under `[isolation] network = "required"`.
fn launch() -> Gateway {
    Gateway::start_with(|d| {
        for t in ["a", "b"] {
            std::fs::create_dir_all(d.join(t)).unwrap();
        }
        format!(
            "[isolation]\nnetwork = \"required\"\n\
             [[auth.keys]]\nalgorithm = \"HS256\"\nsecret_file = \"{d}/hs256.key\"\n\
             [tenants.a]\nroot = \"{d}/a\"\negress = [\"192.0.2.0/24\"]\n\
             egress_names = [\"a.test\"]\n\
             [tenants.b]\nroot = \"{d}/b\"\n",
            d = d.display(),
        )
    })
}

async fn get(s: &mut SessionServiceClient<Channel>, token: &str) -> pb::EgressPolicy {
    s.get_egress(authed(pb::GetEgressRequest {}, token))
        .await
        .unwrap()
        .into_inner()
        .policy
        .unwrap()
}

async fn set(
    s: &mut SessionServiceClient<Channel>,
    token: &str,
    names: &[&str],
) -> Result<pb::EgressPolicy, tonic::Status> {
    let names = names.iter().map(|n| (*n).to_owned()).collect();
    s.set_egress(authed(pb::SetEgressRequest { names }, token))
        .await
        .map(|r| r.into_inner().policy.unwrap_or_default())
}

fn sorted(p: &pb::EgressPolicy) -> Vec<&str> {
    let mut n: Vec<&str> = p.names.iter().map(String::as_str).collect();
    n.sort_unstable();
    n
}

#[tokio::test]
async fn egress_names_are_read_and_changed_over_grpc() {
    if let Some(reason) = missing() {
        eprintln!("SKIPPED: {reason}");
        return;
    }
    let gw = launch();
    let mut s = SessionServiceClient::new(channel(&gw.grpc).await);
    let a = mint(&gw.secret, "a", SCOPES);

    let p = get(&mut s, &a).await;
    assert!(p.names_set, "{p:?}");
    assert_eq!(sorted(&p), ["a.test"], "{p:?}");
    assert_eq!(p.cidrs, ["192.0.2.0/24"], "{p:?}");
    assert!(!p.internet, "{p:?}");
    assert_eq!(p.closed, None, "{p:?}");

    // A change answers the new policy and what it closed (nothing was open).
    let p = set(&mut s, &a, &["a.test", "*.b.test", "c.test:443"])
        .await
        .unwrap();
    assert_eq!(sorted(&p), ["*.b.test", "a.test", "c.test:443"], "{p:?}");
    assert_eq!(p.closed, Some(0), "{p:?}");
    let p = get(&mut s, &a).await;
    assert_eq!(sorted(&p), ["*.b.test", "a.test", "c.test:443"], "{p:?}");
    assert_eq!(p.closed, None, "{p:?}");

    // The JSON-RPC door sees the same policy.
    let mut ws = Client::connect(&gw.url, &a).await;
    ws.initialize().await;
    let got = ws.call("gateway/egress/get", json!({})).await;
    assert_eq!(got["names"].as_array().map(Vec::len), Some(3), "{got}");

    // A name that is not one: INVALID_ARGUMENT, and nothing changes.
    for bad in [&["a.test", "not a name!"][..], &["192.0.2.7"], &["*.test"]] {
        let e = set(&mut s, &a, bad).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument, "{bad:?}: {e}");
    }
    let p = get(&mut s, &a).await;
    assert_eq!(sorted(&p), ["*.b.test", "a.test", "c.test:443"], "{p:?}");

    // Without the `egress` scope: PERMISSION_DENIED for both, nothing
    // changes.
    let unscoped = gw.token("a");
    let e = s
        .get_egress(authed(pb::GetEgressRequest {}, &unscoped))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e}");
    let e = set(&mut s, &unscoped, &["x.test"]).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e}");
    let p = get(&mut s, &a).await;
    assert_eq!(sorted(&p), ["*.b.test", "a.test", "c.test:443"], "{p:?}");

    // An empty list is a list: nothing by name.
    let p = set(&mut s, &a, &[]).await.unwrap();
    assert!(p.names_set && p.names.is_empty(), "{p:?}");

    // A tenant without egress_names: no names to read, none to set
    // (INVALID_ARGUMENT, the table's code for an invalid request).
    let b = mint(&gw.secret, "b", SCOPES);
    let p = get(&mut s, &b).await;
    assert!(!p.names_set && p.names.is_empty(), "{p:?}");
    let e = set(&mut s, &b, &["a.test"]).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e}");
    assert!(e.message().contains("egress_names"), "{e}");
    let p = get(&mut s, &b).await;
    assert!(!p.names_set, "{p:?}");
}
