//! Snapshots that restore anywhere (docs/snapshots.md, "Anywhere"): two
//! real gateway replicas sharing one real registry (Debian's
//! `docker-registry`); a snapshot taken and pushed on one is forked on the
//! other, read back by `skopeo` as the OCI image it is, refused there when
//! the registry's copy of its layer is corrupt or cut short, and never
//! found by another tenant.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::oci::{TestRegistry, registry_missing};
use common::{Client, Gateway, mint};
use serde_json::{Value, json};

const SCOPES: &str = "exec fs:read fs:write snapshot";

struct Two {
    replicas: Vec<Gateway>,
    secret: Vec<u8>,
    _dir: tempfile::TempDir,
    _key: tempfile::TempDir,
}

/// Two replicas; tenants `a` and `b` rooted in each one's directory;
/// snapshots pushed to `REGISTRY/snapshots`. None (the reason printed)
/// where this cannot run here.
fn start(reg: &TestRegistry, bounds: &str) -> Two {
    let r = &reg.addr;
    // The snapshot signing key every replica shares.
    let key = tempfile::tempdir().unwrap();
    let k = key.path().join("snapshots.key");
    std::fs::write(&k, common::random_secret()).unwrap();
    let started = common::fleet::launch(2, |d| {
        for t in ["a", "b"] {
            std::fs::create_dir_all(d.join(t)).unwrap();
        }
        format!(
            "[[auth.keys]]\nalgorithm = \"HS256\"\nsecret_file = \"{d}/hs256.key\"\n\
             [images]\nstore = \"{d}/store\"\nregistries = [\"{r}\"]\ninsecure_registries = [\"{r}\"]\n\
             [snapshots]\nstore = \"{d}/snapshots\"\nregistry = \"{r}/snapshots\"\nkey_file = \"{k}\"\n{bounds}\n\
             [tenants.a]\nroot = \"{d}/a\"\n\
             [tenants.b]\nroot = \"{d}/b\"\n",
            d = d.display(),
            k = k.display(),
        )
    });
    Two {
        replicas: started.replicas.into_iter().flatten().collect(),
        secret: started.secret,
        _dir: started.dir,
        _key: key,
    }
}

/// A registry and two replicas (`start`); none, the reason printed, where
/// they cannot run here.
fn setup(bounds: &str) -> Option<(TestRegistry, Two)> {
    if let Some(why) = unsupported() {
        eprintln!("skipped: {why}");
        return None;
    }
    let reg = TestRegistry::start();
    let two = start(&reg, bounds);
    Some((reg, two))
}

fn unsupported() -> Option<&'static str> {
    if !nix::unistd::geteuid().is_root() {
        return Some("forks need the namespaces layer (root)");
    }
    registry_missing()
}

impl Two {
    async fn client(&self, i: usize, tenant: &str) -> Client {
        Client::connect(&self.replicas[i].url, &mint(&self.secret, tenant, SCOPES)).await
    }

    async fn session(&self, i: usize, tenant: &str) -> Client {
        let mut c = self.client(i, tenant).await;
        c.initialize().await;
        c
    }

    fn root(&self, i: usize, tenant: &str) -> String {
        self.replicas[i]
            .dir
            .path()
            .join(tenant)
            .display()
            .to_string()
    }

    /// Files left in replica `i`'s snapshot store's work directory.
    fn scratch(&self, i: usize) -> usize {
        std::fs::read_dir(self.replicas[i].dir.path().join("snapshots/tmp"))
            .map(|d| d.count())
            .unwrap_or(0)
    }
}

/// `initialize {snapshot}` on a new connection: its result or error.
async fn fork(two: &Two, i: usize, tenant: &str, id: &str) -> (Client, Value) {
    let mut c = two.client(i, tenant).await;
    let r = c
        .call_raw("initialize", json!({"clientName": "t", "snapshot": id}))
        .await;
    if r.get("result").is_some() {
        c.send(&json!({"method": "initialized"})).await;
    }
    (c, r)
}

/// The blob file of `digest` in the registry's storage.
fn blob_file(reg: &TestRegistry, digest: &str) -> PathBuf {
    let hex = digest.strip_prefix("sha256:").unwrap();
    reg.dir
        .path()
        .join("data/docker/registry/v2/blobs/sha256")
        .join(&hex[..2])
        .join(hex)
        .join("data")
}

/// A snapshot of tenant `a` on replica 0 with a small tree, pushed.
async fn pushed(two: &Two) -> Value {
    let r = two.root(0, "a");
    let mut a = two.session(0, "a").await;
    let (out, code) = a.sh(
        "mk",
        &r,
        "mkdir -p src/deep/er && echo 'print(1)' > src/main.py && printf '#!/bin/sh\\necho ran\\n' > run.sh \
         && chmod 755 run.sh && ln -s src/main.py link && touch -d @1000000000 src/deep",
    )
    .await;
    assert_eq!(code, 0, "{out}");
    a.write_text(&format!("{r}/notes.txt"), "before the push")
        .await;
    let snap = a
        .call(
            "gateway/snapshot/create",
            json!({"name": "good point", "labels": {"step": "3"}}),
        )
        .await;
    let id = snap["id"].as_str().unwrap();
    let p = a
        .call("gateway/snapshot/push", json!({"snapshotId": id}))
        .await;
    assert_eq!(p["id"], snap["id"]);
    assert_eq!(p["digest"], snap["digest"]);
    p
}

#[tokio::test]
async fn a_snapshot_pushed_on_one_replica_forks_on_another() {
    let Some((reg, two)) = setup("") else {
        return;
    };
    let snap = pushed(&two).await;
    let id = snap["id"].as_str().unwrap().to_owned();
    let at = snap["pushed"].as_str().unwrap();
    let repo = format!("{}/snapshots/", reg.addr);
    assert!(at.starts_with(&repo) && at.contains("@sha256:"), "{at}");

    // What the registry holds is an OCI image any tool reads: one
    // uncompressed layer whose digest is the snapshot's, its record in
    // the annotations.
    let tagged = format!("docker://{}:{id}", at.split('@').next().unwrap());
    let out = Command::new("/usr/bin/skopeo")
        .args(["inspect", "--raw", "--tls-verify=false", &tagged])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let manifest: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(manifest["layers"][0]["digest"], snap["digest"]);
    assert_eq!(
        manifest["layers"][0]["mediaType"],
        "application/vnd.oci.image.layer.v1.tar"
    );
    let record: Value = serde_json::from_str(
        manifest["annotations"]["dev.exec-gateway.snapshot"]
            .as_str()
            .unwrap(),
    )
    .unwrap();
    assert_eq!(record["name"], "good point");

    // Replica 1 has never seen it: the fork pulls it.
    let r1 = two.root(1, "a");
    let (mut f, init) = fork(&two, 1, "a", &id).await;
    assert!(init.get("result").is_some(), "{init}");
    let (out, code) = f.sh(
        "check",
        &r1,
        "cat notes.txt src/main.py && ./run.sh && readlink link && stat -c %Y src/deep && echo hi > new",
    )
    .await;
    assert_eq!(code, 0, "{out}");
    assert_eq!(
        out, "before the pushprint(1)\nran\nsrc/main.py\n1000000000\n",
        "{out}"
    );
    // The fork's writes are its own: not in replica 1's tenant root.
    assert!(!Path::new(&r1).join("new").exists());
    let mut a1 = two.session(1, "a").await;
    let got = a1
        .call("gateway/snapshot/get", json!({"snapshotId": id}))
        .await;
    assert_eq!(got["digest"], snap["digest"]);
    assert_eq!(got["name"], "good point");
    assert_eq!(got["labels"], json!({"step": "3"}));
    assert_eq!(got["pushed"], at);
    // A second fork there uses the copy it now has.
    let (_g, init) = fork(&two, 1, "a", &id).await;
    assert!(init.get("result").is_some(), "{init}");
    // Promoted on replica 0, then pushed again from replica 1's copy
    // (restored before the promotion): the push keeps it promoted.
    assert!(got["expiresAtMs"].as_u64().is_some());
    let mut a0 = two.session(0, "a").await;
    a0.call("gateway/snapshot/promote", json!({"snapshotId": id}))
        .await;
    let again = a1
        .call("gateway/snapshot/push", json!({"snapshotId": id}))
        .await;
    assert!(again.get("expiresAtMs").is_none(), "{again}");
    let out = Command::new("/usr/bin/skopeo")
        .args(["inspect", "--raw", "--tls-verify=false", &tagged])
        .output()
        .unwrap();
    let manifest: Value = serde_json::from_slice(&out.stdout).unwrap();
    let record: Value = serde_json::from_str(
        manifest["annotations"]["dev.exec-gateway.snapshot"]
            .as_str()
            .unwrap(),
    )
    .unwrap();
    assert!(record.get("expiresAtMs").is_none(), "{record}");

    // Tenant b's id space is its own, on both replicas, registry or not.
    for i in [0, 1] {
        let (_, r) = fork(&two, i, "b", &id).await;
        assert_eq!(
            r["error"]["message"],
            format!("unknown snapshot id {id}"),
            "{r}"
        );
    }
    let mut b = two.session(1, "b").await;
    let (code, msg) = b
        .call_err("gateway/snapshot/push", json!({"snapshotId": id}))
        .await;
    assert_eq!((code, msg), (-32600, format!("unknown snapshot id {id}")));
    assert_eq!(two.scratch(0) + two.scratch(1), 0);
}

#[tokio::test]
async fn a_corrupt_or_cut_layer_is_refused_at_restore() {
    let Some((reg, two)) = setup("") else {
        return;
    };
    let snap = pushed(&two).await;
    let id = snap["id"].as_str().unwrap().to_owned();
    let blob = blob_file(&reg, snap["digest"].as_str().unwrap());
    let good = std::fs::read(&blob).unwrap();

    let mut flipped = good.clone();
    let mid = flipped.len() / 3;
    flipped[mid] ^= 0x20;
    for (what, bytes) in [
        ("corrupt", flipped),
        ("cut short", good[..good.len() / 2].to_vec()),
    ] {
        std::fs::write(&blob, &bytes).unwrap();
        let (_, r) = fork(&two, 1, "a", &id).await;
        let msg = r["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        assert_eq!(r["error"]["code"], -32602, "{what}: {r}");
        assert!(msg.contains("refused"), "{what}: {msg}");
        // Nothing kept, nothing left over, nothing charged.
        let mut a1 = two.session(1, "a").await;
        let list = a1.call("gateway/snapshot/list", json!({})).await;
        assert_eq!(list["snapshots"], json!([]), "{what}");
        assert_eq!(two.scratch(1), 0, "{what}");
    }
    // The good layer back: the same replica restores it.
    std::fs::write(&blob, &good).unwrap();
    let (_f, r) = fork(&two, 1, "a", &id).await;
    assert!(r.get("result").is_some(), "{r}");
}

#[tokio::test]
async fn a_restore_counts_against_the_tenants_snapshots() {
    let Some((_reg, two)) = setup("max_per_tenant = 1") else {
        return;
    };
    let snap = pushed(&two).await;
    let id = snap["id"].as_str().unwrap();
    // Replica 1's tenant a already keeps one: the restore is refused with
    // the quota error, and nothing is pulled.
    let mut a1 = two.session(1, "a").await;
    a1.call("gateway/snapshot/create", json!({})).await;
    let (_, r) = fork(&two, 1, "a", id).await;
    assert_eq!(r["error"]["code"], -32006, "{r}");
    assert_eq!(two.scratch(1), 0);
}

/// gRPC: PromoteSnapshot keeps a snapshot until it is deleted and pushes
/// it; the other replica's ForkSessions restores it, still kept, and its
/// PushSnapshot of an id it does not know is refused like any unknown id.
#[tokio::test]
async fn a_promoted_snapshot_is_kept_and_forks_anywhere_over_grpc() {
    use common::grpc::authed;
    use exec_gateway::transport::grpc::pb;
    use pb::session_service_client::SessionServiceClient;
    let Some((_reg, two)) = setup("") else {
        return;
    };
    let token = mint(&two.secret, "a", SCOPES);
    let mut a = two.session(0, "a").await;
    a.write_text(&format!("{}/kept", two.root(0, "a")), "kept")
        .await;
    let snap = a.call("gateway/snapshot/create", json!({})).await;
    assert!(snap["expiresAtMs"].as_u64().is_some(), "{snap}");
    let id = snap["id"].as_str().unwrap().to_owned();
    let mut s0 = SessionServiceClient::new(common::grpc::channel(&two.replicas[0].grpc).await);
    let promoted = s0
        .promote_snapshot(authed(
            pb::PromoteSnapshotRequest {
                snapshot_id: id.clone(),
            },
            &token,
        ))
        .await
        .unwrap()
        .into_inner()
        .snapshot
        .unwrap();
    assert_eq!(promoted.expires_at_ms, 0);
    assert!(promoted.pushed.contains("@sha256:"), "{promoted:?}");
    let listed = a
        .call("gateway/snapshot/get", json!({"snapshotId": id}))
        .await;
    assert!(listed.get("expiresAtMs").is_none(), "{listed}");

    let mut s1 = SessionServiceClient::new(common::grpc::channel(&two.replicas[1].grpc).await);
    let e = s1
        .push_snapshot(authed(
            pb::PushSnapshotRequest {
                snapshot_id: "snap-0123456789abcdef0123456789abcdef".into(),
            },
            &token,
        ))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::NotFound, "{e:?}");
    let ids = s1
        .fork_sessions(authed(
            pb::ForkSessionsRequest {
                snapshot_id: id.clone(),
                count: 2,
            },
            &token,
        ))
        .await
        .unwrap()
        .into_inner()
        .session_ids;
    assert_eq!(ids.len(), 2);
    let got = s1
        .get_snapshot(authed(
            pb::GetSnapshotRequest {
                snapshot_id: id.clone(),
            },
            &token,
        ))
        .await
        .unwrap()
        .into_inner()
        .snapshot
        .unwrap();
    assert_eq!((got.expires_at_ms, got.pushed), (0, promoted.pushed));
}

/// What the registry holds is restored only if a gateway with the fleet's
/// snapshot key pushed it for the same tenant: tenant a's image copied to
/// tenant b's tag (by anyone who can write to the registry) is refused
/// there, and nothing is kept.
#[tokio::test]
async fn an_image_copied_to_another_tenants_tag_is_refused() {
    let Some((reg, two)) = setup("") else {
        return;
    };
    let snap = pushed(&two).await;
    let id = snap["id"].as_str().unwrap();
    let at = snap["pushed"]
        .as_str()
        .unwrap()
        .split('@')
        .next()
        .unwrap()
        .to_owned();
    let key_b = exec_gateway::image::fetch::sha256_hex(b"b");
    let theirs = format!("{}/snapshots/{key_b}", reg.addr);
    let out = Command::new("/usr/bin/skopeo")
        .args([
            "copy",
            "--quiet",
            "--preserve-digests",
            "--src-tls-verify=false",
            "--dest-tls-verify=false",
        ])
        .arg(format!("docker://{at}:{id}"))
        .arg(format!("docker://{theirs}:{id}"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (_, r) = fork(&two, 1, "b", id).await;
    assert_eq!(r["error"]["code"], -32602, "{r}");
    let msg = r["error"]["message"].as_str().unwrap();
    assert!(msg.contains("signature does not verify"), "{msg}");
    let mut b = two.session(1, "b").await;
    let list = b.call("gateway/snapshot/list", json!({})).await;
    assert_eq!(list["snapshots"], json!([]));
    assert_eq!(two.scratch(1), 0);
}

/// A snapshot deleted while a fork works in it can be restored again at
/// once (the deleted tree is moved out of the id's way); a restore that
/// is then refused (the token's image claim) keeps nothing; the restored
/// workspace's root has the original's mode.
#[tokio::test]
async fn restores_after_a_delete_and_refusals_keep_nothing() {
    let Some((_reg, two)) = setup("") else {
        return;
    };
    std::fs::set_permissions(
        two.root(0, "a"),
        std::os::unix::fs::PermissionsExt::from_mode(0o751),
    )
    .unwrap();
    let snap = pushed(&two).await;
    let id = snap["id"].as_str().unwrap();
    // A fork on the origin, then the snapshot deleted under it.
    let (mut live, r) = fork(&two, 0, "a", id).await;
    assert!(r.get("result").is_some(), "{r}");
    let mut a = two.session(0, "a").await;
    a.call("gateway/snapshot/delete", json!({"snapshotId": id}))
        .await;
    let (mut again, r) = fork(&two, 0, "a", id).await;
    assert!(r.get("result").is_some(), "restored again: {r}");
    let r0 = two.root(0, "a");
    for c in [&mut live, &mut again] {
        let (out, code) = c.sh("m", &r0, "stat -c %a . && cat notes.txt").await;
        assert_eq!((out.as_str(), code), ("751\nbefore the push", 0));
    }
    // On replica 1, a token whose image claim names an image: refused
    // (a snapshot of the host's userland), and not kept.
    let mut c = Client::connect(
        &two.replicas[1].url,
        &jsonwebtoken::encode(
            &jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256),
            &json!({"sub": "t", "tenant": "a", "scope": SCOPES, "image": "busybox:1",
                    "exp": common::now() + 3600}),
            &jsonwebtoken::EncodingKey::from_secret(&two.secret),
        )
        .unwrap(),
    )
    .await;
    let r = c
        .call_raw("initialize", json!({"clientName": "t", "snapshot": id}))
        .await;
    assert_eq!(r["error"]["code"], -32003, "{r}");
    let mut a1 = two.session(1, "a").await;
    let list = a1.call("gateway/snapshot/list", json!({})).await;
    assert_eq!(
        list["snapshots"],
        json!([]),
        "a refused restore is not kept"
    );
}
