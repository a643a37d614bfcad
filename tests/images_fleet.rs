//! Images in a fleet (issue #43): replicas pulling the same image from one
//! registry. Two real gateway replicas (each with its own image store)
//! configured as a fleet as tests/fleet.rs does it, one real registry
//! (Debian's `docker-registry`, the image pushed with `skopeo`), a tenant
//! whose sessions run that image.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::fleet::relays_started;
use common::grpc::{authed, channel};
use common::oci::{self, RegistryConfig, StoreState, TestRegistry};
use common::{Client, Gateway};
use exec_gateway::transport::grpc::pb;
use pb::process_service_client::ProcessServiceClient;
use serde_json::{Value, json};

/// Replicas `gw-0`, `gw-1`, … sharing a client key and a fleet key, each
/// with its own directory: tenant `a` rooted at `DIR/a`, its image store
/// at `DIR/store`. Tenant `a` runs `image` and may choose `REGISTRY/team/*`.
struct Fleet {
    replicas: Vec<Gateway>,
    secret: Vec<u8>,
    _dir: tempfile::TempDir,
}

impl Fleet {
    fn start(n: usize, reg: &TestRegistry, image: &str) -> Fleet {
        let r = &reg.addr;
        let started = common::fleet::launch(n, |d| {
            std::fs::create_dir_all(d.join("a")).unwrap();
            // A tenant's first pull happens inside the handshake that
            // activates it: the scaled timeout (the emulated VM lane is
            // slower than 10 s).
            format!(
                "[server]\nhandshake_timeout = \"{t}s\"\n\
                 [[auth.keys]]\nalgorithm = \"HS256\"\nsecret_file = \"{d}/hs256.key\"\n\
                 [images]\nstore = \"{d}/store\"\nregistries = [\"{r}\"]\ninsecure_registries = [\"{r}\"]\n\
                 [tenants.a]\nroot = \"{d}/a\"\nimage = \"{image}\"\nimages = [\"{r}/team/*\"]\n",
                t = common::event_timeout().as_secs().max(10),
                d = d.display(),
            )
        });
        Fleet {
            replicas: started.replicas.into_iter().flatten().collect(),
            secret: started.secret,
            _dir: started.dir,
        }
    }

    fn gw(&self, i: usize) -> &Gateway {
        &self.replicas[i]
    }

    /// Tenant `a`'s workspace on replica `i`.
    fn root(&self, i: usize) -> String {
        self.gw(i).dir.path().join("a").display().to_string()
    }

    /// Replica `i`'s image store.
    fn store(&self, i: usize) -> PathBuf {
        self.gw(i).dir.path().join("store")
    }

    /// A token of tenant `a` with every scope and, if given, an `image`
    /// claim.
    fn token(&self, image: Option<&str>) -> String {
        let mut claims = json!({"sub": "test", "tenant": "a", "scope": common::ALL_SCOPES,
                                "exp": common::now() + 3600});
        if let Some(i) = image {
            claims["image"] = json!(i);
        }
        jsonwebtoken::encode(
            &jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256),
            &claims,
            &jsonwebtoken::EncodingKey::from_secret(&self.secret),
        )
        .unwrap()
    }

    async fn client(&self, i: usize, token: &str) -> Client {
        Client::connect(&self.gw(i).url, token).await
    }
}

/// Sessions of tenant `a` in replica `gw`'s registry (its `/metrics`).
async fn sessions(gw: &Gateway) -> f64 {
    gw.metric("exec_gateway_sessions", "tenant=\"a\"")
        .await
        .unwrap_or(0.0)
}

/// All output of process `id` (pipes) via `process/read` from the first
/// seq, until it is closed.
async fn read_all(c: &mut Client, id: &str) -> String {
    let mut text = String::new();
    let mut after = 0u64;
    loop {
        let r = c
            .call(
                "process/read",
                json!({"processId": id, "afterSeq": after, "waitMs": 2000}),
            )
            .await;
        for ch in r["chunks"].as_array().unwrap() {
            text.push_str(&String::from_utf8_lossy(&common::unb64(
                ch["chunk"].as_str().unwrap(),
            )));
        }
        after = r["nextSeq"].as_u64().unwrap().saturating_sub(1).max(after);
        if r["closed"] == true {
            return text;
        }
    }
}

/// Resume `sid` on this connection: the whole response. A session whose
/// previous connection has not yet been seen to close is retried, as a
/// client would; any other answer is returned as it is.
async fn resume(c: &mut Client, sid: &str) -> Value {
    let deadline = tokio::time::Instant::now() + common::event_timeout();
    loop {
        let r = c
            .call_raw(
                "initialize",
                json!({"clientName": "test", "resumeSessionId": sid}),
            )
            .await;
        let attached = r["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("already attached"));
        if !attached {
            if r.get("result").is_some() {
                c.send(&json!({"method": "initialized"})).await;
            }
            return r;
        }
        assert!(tokio::time::Instant::now() < deadline, "never resumed: {r}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `/etc/os-release` as a process of the session reads it (cwd `cwd`):
/// the output, or the failure.
async fn os_release(c: &mut Client, id: &str, cwd: &str) -> Result<String, String> {
    c.call(
        "process/start",
        json!({"processId": id, "argv": ["/bin/cat", "/etc/os-release"], "cwd": cwd,
               "env": {"PATH": "/bin:/usr/bin"}, "tty": false}),
    )
    .await;
    let out = c.collect(id).await;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    match out.exit_code {
        Some(0) => Ok(text),
        code => Err(format!(
            "exit {code:?}: {text}{}",
            String::from_utf8_lossy(&out.stderr)
        )),
    }
}

/// The manifest digest of the (only) image in the layout at `layout`.
fn manifest_digest(layout: &Path) -> String {
    let index: Value =
        serde_json::from_slice(&std::fs::read(layout.join("index.json")).unwrap()).unwrap();
    index["manifests"][0]["digest"].as_str().unwrap().to_owned()
}

/// The image digest an `initialize` result or `environment/info` names.
fn digest_of(info: &Value) -> String {
    info["image"]["digest"]
        .as_str()
        .unwrap_or_else(|| panic!("no image digest in {info}"))
        .to_owned()
}

/// Guards, for a tenant whose sessions run an image, in a fleet of two
/// replicas pulling from one registry:
/// - a session opened on gw-0 runs the image (its `/etc/os-release`, not
///   the host's), and resumed through gw-1 it is relayed to gw-0 (gw-1's
///   relay count rises, the id and the image stay gw-0's);
/// - a new session of the tenant on gw-1 runs the image from gw-1's own
///   store: the same manifest digest as the one pushed and as gw-0's; each
///   replica's store (its directory and `/readyz`) holds that one image;
/// - the registry served the layer blob exactly twice (once per replica);
/// - a token whose `image` claim names another image the tenant may use is
///   refused when it resumes the session through gw-1 (the owner checks),
///   over the websocket and over gRPC, and pulls nothing; the session
///   stays usable by a token whose claim names its image.
#[tokio::test]
async fn replicas_pull_one_image_and_relay_its_sessions() {
    if let Some(why) = oci::registry_missing() {
        eprintln!("skipped: {why}");
        return;
    }
    // At `info`, the registry logs every request: its blob GETs are counted.
    let reg = TestRegistry::start_configured(&RegistryConfig {
        log_level: Some("info"),
        ..RegistryConfig::default()
    });
    let work = tempfile::tempdir().unwrap();
    let base = oci::busybox_layout(work.path(), "fleetbase");
    let other = oci::busybox_layout(work.path(), "fleetother");
    reg.push(&base, "v1", "team/base");
    reg.push(&other, "v1", "team/other");
    let pushed = reg.log().len();
    let layer = oci::layer_digests(&base, "v1").remove(0);
    let other_layer = oci::layer_digests(&other, "v1").remove(0);
    let gets = |digest: &str| {
        let log = reg.log();
        oci::blob_gets(&log[pushed.min(log.len())..], digest)
    };
    let want_digest = manifest_digest(&base);
    let base_ref = reg.reference("team/base", "v1");
    let other_ref = reg.reference("team/other", "v1");
    const IMAGE: &str = "ID=fleetbase\n";
    // The host's own file is not the image's (else the marker proves nothing).
    assert_ne!(
        std::fs::read_to_string("/etc/os-release").unwrap_or_default(),
        IMAGE
    );

    let fleet = Fleet::start(2, &reg, &base_ref);
    let plain = fleet.token(None);
    // Nothing is pulled before a tenant is used.
    assert_eq!(gets(&layer), 0);

    // A session on gw-0 runs the image.
    let mut c = fleet.client(0, &plain).await;
    let r = c.call("initialize", json!({"clientName": "test"})).await;
    c.send(&json!({"method": "initialized"})).await;
    let sid = r["sessionId"].as_str().unwrap().to_owned();
    assert!(sid.starts_with("gw-0."), "{sid}");
    let on_a = digest_of(&r["environmentInfo"]);
    assert_eq!(on_a, want_digest, "{r}");
    assert_eq!(
        os_release(&mut c, "p1", &fleet.root(0)).await.as_deref(),
        Ok(IMAGE)
    );
    assert_eq!(gets(&layer), 1, "gw-0 pulled the layer other than once");
    // A process that outlives the connection: found again through gw-1.
    c.call(
        "process/start",
        json!({"processId": "held", "argv": ["/bin/sh", "-c", "cat /etc/os-release; read x"],
               "cwd": fleet.root(0), "env": {"PATH": "/bin"}, "tty": false, "pipeStdin": true}),
    )
    .await;
    drop(c);

    // Resumed through gw-1: relayed to gw-0, which runs it on the image.
    let before = relays_started(fleet.gw(1)).await;
    let mut via = fleet.client(1, &plain).await;
    let r = resume(&mut via, &sid).await;
    assert_eq!(r["result"]["sessionId"], sid.as_str(), "{r}");
    assert_eq!(digest_of(&r["result"]["environmentInfo"]), on_a, "{r}");
    assert_eq!(relays_started(fleet.gw(1)).await, before + 1);
    let listed = via.call("process/list", json!({})).await;
    assert!(
        listed["processes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["processId"] == "held"),
        "{listed}"
    );
    // In gw-0's workspace (gw-1's is another directory).
    assert_eq!(
        os_release(&mut via, "p2", &fleet.root(0)).await.as_deref(),
        Ok(IMAGE)
    );
    // The session stays gw-0's: gw-1 holds none of the tenant's.
    assert_eq!(sessions(fleet.gw(0)).await, 1.0);
    assert_eq!(sessions(fleet.gw(1)).await, 0.0);
    drop(via);

    // A new session on gw-1 runs the image from gw-1's own store.
    let mut b = fleet.client(1, &plain).await;
    let r = b.call("initialize", json!({"clientName": "test"})).await;
    b.send(&json!({"method": "initialized"})).await;
    let sid_b = r["sessionId"].as_str().unwrap().to_owned();
    assert!(sid_b.starts_with("gw-1."), "{sid_b}");
    assert_eq!(digest_of(&r["environmentInfo"]), on_a, "{r}");
    assert_eq!(
        os_release(&mut b, "p3", &fleet.root(1)).await.as_deref(),
        Ok(IMAGE)
    );
    // After the process: `environment/info` tells the newer revision,
    // whose paths are URIs.
    let info = b.call("environment/info", json!({})).await;
    assert_eq!(digest_of(&info), on_a, "{info}");
    // Each replica pulled once: two GETs of the layer in all.
    assert_eq!(
        gets(&layer),
        2,
        "the layer was not fetched once per replica:\n{}",
        reg.log()
    );
    for i in 0..2 {
        let state = StoreState::of(&fleet.store(i));
        assert_eq!(state.images.len(), 1, "gw-{i}'s store: {state:?}");
        assert_eq!(state.layer_dirs().len(), 1, "gw-{i}'s store: {state:?}");
        let (status, ready) = fleet.gw(i).admin_get("/readyz").await;
        assert_eq!(status, 200, "gw-{i}: {ready}");
        let images: Vec<&str> = ready.lines().filter(|l| l.starts_with("image: ")).collect();
        assert_eq!(images.len(), 1, "gw-{i}'s /readyz: {ready}");
        assert!(
            images[0].starts_with(&format!("image: {on_a} {base_ref} ")),
            "gw-{i}'s /readyz: {ready}"
        );
    }
    drop(b);

    // A token claiming another image (one the tenant may use) cannot
    // resume the session through gw-1: gw-0 checks the claim.
    let wrong = fleet.token(Some(&other_ref));
    let before = relays_started(fleet.gw(1)).await;
    let mut bad = fleet.client(1, &wrong).await;
    let r = resume(&mut bad, &sid).await;
    assert_eq!(r["error"]["code"], -32003, "{r}");
    assert!(
        r["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("image claim names another image"),
        "{r}"
    );
    // It went through the relay (the owner refused, not gw-1 locally).
    assert_eq!(relays_started(fleet.gw(1)).await, before + 1);
    drop(bad);
    // Over gRPC: a call naming the session through gw-1, forwarded.
    let ch = channel(&fleet.gw(1).grpc).await;
    let e = ProcessServiceClient::new(ch.clone())
        .list(authed(
            pb::ListRequest {
                session_id: sid.clone(),
            },
            &wrong,
        ))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e:?}");
    assert!(e.message().contains("image claim"), "{e:?}");
    // The refusals pulled nothing of the other image.
    assert_eq!(gets(&other_layer), 0);

    // The session is still there for a token claiming its own image.
    let right = fleet.token(Some(&base_ref));
    let listed = ProcessServiceClient::new(ch)
        .list(authed(
            pb::ListRequest {
                session_id: sid.clone(),
            },
            &right,
        ))
        .await
        .unwrap()
        .into_inner();
    assert!(
        listed.processes.iter().any(|p| p.process_id == "held"),
        "{listed:?}"
    );
    let mut good = fleet.client(1, &right).await;
    let r = resume(&mut good, &sid).await;
    assert_eq!(r["result"]["sessionId"], sid.as_str(), "{r}");
    good.call(
        "process/write",
        json!({"processId": "held", "chunk": common::b64(b"\n"), "writeId": "w1"}),
    )
    .await;
    assert_eq!(read_all(&mut good, "held").await, IMAGE);
    // Still two pulls in all.
    assert_eq!(gets(&layer), 2);
}
