//! Images chosen per session (docs/environments.md): `initialize`'s
//! `image`, a token's `image` claim and gRPC `CreateSession`'s `image`,
//! each within what the tenant's `images` allow; the CLI's `--image` over
//! both doors; registries over TLS with a CA of their own and basic
//! authentication; one pull however many tenants want an image at once.
//! Real gateway processes, a real registry (Debian's `docker-registry`),
//! images pushed with `skopeo`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::path::Path;
use std::process::Command;

use common::grpc::{authed, spec};
use common::oci::{self, RegistryConfig, TestRegistry};
use common::{Client, Gateway};
use exec_gateway::transport::grpc::pb;
use pb::process_service_client::ProcessServiceClient;
use pb::session_service_client::SessionServiceClient;
use serde_json::{Value, json};
use tokio_stream::StreamExt as _;

/// The registry and the tools, or why this test cannot run here.
fn registry() -> Option<TestRegistry> {
    if let Some(why) = oci::registry_missing() {
        eprintln!("skipped: {why}");
        return None;
    }
    Some(TestRegistry::start())
}

/// A registry holding `team/py:v1` (marker `py`), `team/js:v1` (`js`)
/// and `other/x:v1` (`other`).
struct Images {
    reg: TestRegistry,
    _work: tempfile::TempDir,
    py: String,
    js: String,
    other: String,
}

fn images() -> Option<Images> {
    let reg = registry()?;
    let work = tempfile::tempdir().unwrap();
    for (marker, repo) in [("py", "team/py"), ("js", "team/js"), ("other", "other/x")] {
        reg.push(&oci::busybox_layout(work.path(), marker), "v1", repo);
    }
    Some(Images {
        py: reg.reference("team/py", "v1"),
        js: reg.reference("team/js", "v1"),
        other: reg.reference("other/x", "v1"),
        reg,
        _work: work,
    })
}

/// A gateway whose tenant `a` (root `DIR/a`) has no image of its own and
/// may choose `REGISTRY/team/*` for its sessions.
fn choosing_gateway(reg: &TestRegistry) -> Gateway {
    let r = reg.addr.clone();
    Gateway::start_with(|d| {
        std::fs::create_dir_all(d.join("a")).unwrap();
        format!(
            "[[auth.keys]]\nalgorithm = \"HS256\"\nsecret_file = \"{d}/hs256.key\"\n\
             [images]\nstore = \"{d}/store\"\nregistries = [\"{r}\"]\ninsecure_registries = [\"{r}\"]\n\
             [tenants.a]\nroot = \"{d}/a\"\nimages = [\"{r}/team/*\"]\n",
            d = d.display()
        )
    })
}

/// A token of `tenant` with every scope and an `image` claim.
fn token_with_image(gw: &Gateway, tenant: &str, image: &str) -> String {
    let claims = json!({"sub": "test", "tenant": tenant, "scope": common::ALL_SCOPES,
                        "exp": common::now() + 3600, "image": image});
    jsonwebtoken::encode(
        &jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256),
        &claims,
        &jsonwebtoken::EncodingKey::from_secret(&gw.secret),
    )
    .unwrap()
}

/// `initialize` (with `image`, if given): the whole response; a session
/// opened is `initialized`.
async fn initialize(c: &mut Client, image: Option<&str>) -> Value {
    let mut params = json!({"clientName": "x"});
    if let Some(i) = image {
        params["image"] = json!(i);
    }
    let r = c.call_raw("initialize", params).await;
    if r.get("result").is_some() {
        c.send(&json!({"method": "initialized"})).await;
    }
    r
}

/// The code and message of a refused response.
fn refusal(r: &Value) -> (i64, String) {
    let e = r.get("error").unwrap_or_else(|| panic!("not refused: {r}"));
    (
        e["code"].as_i64().unwrap(),
        e["message"].as_str().unwrap().to_owned(),
    )
}

/// Run `argv` in the tenant's root: (stdout and stderr, exit code).
async fn run(c: &mut Client, id: &str, cwd: &str, argv: &[&str]) -> (String, i64) {
    c.call(
        "process/start",
        json!({"processId": id, "argv": argv, "cwd": cwd, "env": {"PATH": "/bin:/usr/bin"}, "tty": false}),
    )
    .await;
    let out = c.collect(id).await;
    (
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr),
        out.exit_code.unwrap_or(-1),
    )
}

/// What `/usr/share/marker` holds in the session (exit code 0), or the
/// failure.
async fn marker(c: &mut Client, id: &str, root: &Path) -> Result<String, String> {
    let root = root.display().to_string();
    match run(c, id, &root, &["/bin/cat", "/usr/share/marker"]).await {
        (out, 0) => Ok(out),
        (out, code) => Err(format!("exit {code}: {out}")),
    }
}

/// Guards: `initialize`'s `image` runs the session on that image (a
/// marker file only the image has, `environment/info`'s digest); a
/// session without one on the same tenant still sees the host; images
/// outside the tenant's `images` and malformed references are refused
/// with their own code.
#[tokio::test]
async fn initialize_chooses_an_image_the_tenant_allows() {
    let Some(im) = images() else { return };
    let gw = choosing_gateway(&im.reg);
    let root = gw.dir.path().join("a");

    let mut c = gw.connect_as(&gw.token("a")).await;
    // Refusals leave the connection uninitialised: the next try may succeed.
    let (code, message) = refusal(&initialize(&mut c, Some(&im.other)).await);
    assert_eq!(code, -32003, "{message}");
    assert!(
        message.contains("not among the images tenant `a` may use"),
        "{message}"
    );
    // Under `team/` as text, but no reference (upper case in its path).
    let bad = format!("{}/team/Py:v1", im.reg.addr);
    let (code, message) = refusal(&initialize(&mut c, Some(&bad)).await);
    assert_eq!(code, -32602, "{message}");
    assert!(message.starts_with("image:"), "{message}");
    let (code, message) = refusal(&initialize(&mut c, Some("")).await);
    assert_eq!(code, -32602, "{message}");

    let r = initialize(&mut c, Some(&im.py)).await;
    assert!(r.get("result").is_some(), "{r}");
    assert_eq!(marker(&mut c, "m", &root).await.as_deref(), Ok("py"));
    let info = c.call("environment/info", json!({})).await;
    let digest = info["image"]["digest"].as_str().unwrap_or_default();
    assert!(digest.starts_with("sha256:"), "{info}");
    // The image's Env is the session's base environment.
    c.call(
        "process/start",
        json!({"processId": "env", "argv": ["/bin/sh", "-c", "echo $IMAGE_MARKER"],
               "cwd": root, "env": {}, "tty": false,
               "envPolicy": {"inherit": "all", "ignoreDefaultExcludes": false, "exclude": [],
                             "set": {}, "includeOnly": []}}),
    )
    .await;
    let out = c.collect("env").await;
    assert_eq!(
        (String::from_utf8_lossy(&out.stdout).as_ref(), out.exit_code),
        ("py\n", Some(0)),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // The tenant has no image: a session that asks for none sees the host.
    let (mut host, _) = gw.session_of("a").await;
    assert!(marker(&mut host, "m", &root).await.is_err());
    let info = host.call("environment/info", json!({})).await;
    assert!(info.get("image").is_none(), "{info}");

    // Another image the tenant allows, on a session of its own beside.
    let mut js = gw.connect_as(&gw.token("a")).await;
    let r = initialize(&mut js, Some(&im.js)).await;
    assert!(r.get("result").is_some(), "{r}");
    assert_eq!(marker(&mut js, "m", &root).await.as_deref(), Ok("js"));
    let info = js.call("environment/info", json!({})).await;
    assert_ne!(info["image"]["digest"].as_str(), Some(digest), "{info}");
    // The first session is still on its own.
    assert_eq!(marker(&mut c, "m2", &root).await.as_deref(), Ok("py"));
}

/// Guards: a tenant's session images are bounded by those in use at once,
/// not by those used since its activation: with four held, a fifth is
/// refused (-32006); once the sessions of one have ended, its pool makes
/// room, and the other sessions go on on theirs.
#[tokio::test]
async fn session_images_are_bounded_while_in_use_not_for_ever() {
    let Some(reg) = registry() else { return };
    let work = tempfile::tempdir().unwrap();
    let refs: Vec<String> = (0..5)
        .map(|i| {
            let repo = format!("team/i{i}");
            reg.push(
                &oci::busybox_layout(work.path(), &format!("i{i}")),
                "v1",
                &repo,
            );
            reg.reference(&repo, "v1")
        })
        .collect();
    let gw = choosing_gateway(&reg);
    let root = gw.dir.path().join("a");
    let mut held = Vec::new();
    for r in &refs[..4] {
        let mut c = gw.connect_as(&gw.token("a")).await;
        let resp = initialize(&mut c, Some(r)).await;
        assert!(resp.get("result").is_some(), "{resp}");
        held.push(c);
    }
    let mut fifth = gw.connect_as(&gw.token("a")).await;
    let (code, message) = refusal(&initialize(&mut fifth, Some(&refs[4])).await);
    assert_eq!(code, -32006, "{message}");
    assert!(
        message.contains("images in use by the tenant's sessions at once"),
        "{message}"
    );
    // The first image's only session ends.
    let mut first = held.remove(0);
    first.call("session/close", json!({})).await;
    drop(first);
    let deadline = tokio::time::Instant::now() + common::event_timeout();
    loop {
        let r = initialize(&mut fifth, Some(&refs[4])).await;
        if r.get("result").is_some() {
            break;
        }
        let (code, message) = refusal(&r);
        assert_eq!(code, -32006, "{message}");
        assert!(
            tokio::time::Instant::now() < deadline,
            "the fifth image never got room: {message}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert_eq!(marker(&mut fifth, "m", &root).await.as_deref(), Ok("i4"));
    for (i, c) in held.iter_mut().enumerate() {
        let want = format!("i{}", i + 1);
        assert_eq!(marker(c, "m", &root).await, Ok(want));
    }
}

/// Guards: a token's `image` claim opens its sessions on that image
/// without their asking; asking for another is refused; a claim naming an
/// image the tenant may not use opens nothing.
#[tokio::test]
async fn a_tokens_image_claim_is_the_only_image_it_opens() {
    let Some(im) = images() else { return };
    let gw = choosing_gateway(&im.reg);
    let root = gw.dir.path().join("a");

    let token = token_with_image(&gw, "a", &im.py);
    let mut c = gw.connect_as(&token).await;
    let (code, message) = refusal(&initialize(&mut c, Some(&im.js)).await);
    assert_eq!(code, -32003, "{message}");
    assert!(
        message.contains("image claim names another image"),
        "{message}"
    );
    let r = initialize(&mut c, None).await;
    assert!(r.get("result").is_some(), "{r}");
    assert_eq!(marker(&mut c, "m", &root).await.as_deref(), Ok("py"));
    // Asking for the claimed image itself is no conflict.
    let mut again = gw.connect_as(&token).await;
    let r = initialize(&mut again, Some(&im.py)).await;
    assert!(r.get("result").is_some(), "{r}");
    assert_eq!(marker(&mut again, "m", &root).await.as_deref(), Ok("py"));

    // A claim outside the tenant's images: no session at all.
    let outside = token_with_image(&gw, "a", &im.other);
    let mut c = gw.connect_as(&outside).await;
    let (code, message) = refusal(&initialize(&mut c, None).await);
    assert_eq!(code, -32003, "{message}");
    assert!(message.contains("not among the images"), "{message}");
}

/// Drain an `Exec` stream: (stdout, exit code).
async fn drain(mut s: tonic::Streaming<pb::ExecResponse>) -> (String, Option<i32>) {
    use pb::process_event::Event;
    let (mut out, mut code) = (Vec::new(), None);
    loop {
        let item = tokio::time::timeout(common::event_timeout(), s.next())
            .await
            .expect("event timeout")
            .expect("stream ended before closed")
            .expect("stream error");
        match item.event.and_then(|e| e.event).expect("event") {
            Event::Output(o) => out.extend(o.data),
            Event::Exited(e) => code = Some(e.exit_code),
            Event::Closed(_) => return (String::from_utf8_lossy(&out).into_owned(), code),
        }
    }
}

/// Guards: gRPC `CreateSession`'s `image` runs the session's `Exec`s on
/// that image; an image the tenant may not use is `PermissionDenied`; an
/// `Exec` without a session (its own, ephemeral one) honours the token's
/// `image` claim.
#[tokio::test]
async fn grpc_create_session_chooses_an_image() {
    let Some(im) = images() else { return };
    let gw = choosing_gateway(&im.reg);
    let token = gw.token("a");
    let ch = common::grpc::channel(&gw.grpc).await;
    let mut sessions = SessionServiceClient::new(ch.clone());
    let mut procs = ProcessServiceClient::new(ch);
    let create = |image: &str| {
        authed(
            pb::CreateSessionRequest {
                snapshot: String::new(),
                image: image.to_owned(),
                client_name: "t".into(),
            },
            &token,
        )
    };
    let sid = sessions
        .create_session(create(&im.py))
        .await
        .unwrap()
        .into_inner()
        .session_id;
    let root = gw.dir.path().join("a").display().to_string();
    let exec = |session: &str, token: &str| {
        let mut spec = spec("m", &["/bin/cat", "/usr/share/marker"]);
        spec.cwd = root.clone();
        authed(
            pb::ExecRequest {
                session_id: session.to_owned(),
                spec: Some(spec),
            },
            token,
        )
    };
    let s = procs.exec(exec(&sid, &token)).await.unwrap().into_inner();
    assert_eq!(drain(s).await, ("py".to_owned(), Some(0)));
    // Without `image`: the host.
    let host = sessions
        .create_session(create(""))
        .await
        .unwrap()
        .into_inner()
        .session_id;
    let s = procs.exec(exec(&host, &token)).await.unwrap().into_inner();
    assert_ne!(drain(s).await.1, Some(0));

    let e = sessions
        .create_session(create(&im.other))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e:?}");
    assert!(e.message().contains("not among the images"), "{e:?}");

    let claimed = token_with_image(&gw, "a", &im.js);
    let s = procs.exec(exec("", &claimed)).await.unwrap().into_inner();
    assert_eq!(drain(s).await, ("js".to_owned(), Some(0)));
}

/// Guards: `exec-gateway exec --image REF` opens its session on the image,
/// over the websocket and the gRPC door alike; an image the tenant may
/// not use fails the command with the gateway's reason.
#[tokio::test]
async fn the_cli_runs_a_command_on_an_image() {
    let Some(im) = images() else { return };
    let gw = choosing_gateway(&im.reg);
    let token = gw.token("a");
    let grpc_url = gw.grpc.replace("http://", "grpc://");
    let cli = |url: &str, image: &str| {
        let mut c = tokio::process::Command::new(env!("CARGO_BIN_EXE_exec-gateway"));
        c.args(["exec", "--url", url, "--token", &token, "--image", image])
            .args(["--", "/bin/cat", "/usr/share/marker"])
            .kill_on_drop(true);
        c
    };
    for url in [gw.url.as_str(), grpc_url.as_str()] {
        for (image, want) in [(&im.py, "py"), (&im.js, "js")] {
            let out = tokio::time::timeout(common::event_timeout(), cli(url, image).output())
                .await
                .expect("exec --image timed out")
                .unwrap();
            assert_eq!(
                (
                    String::from_utf8_lossy(&out.stdout).as_ref(),
                    out.status.code()
                ),
                (want, Some(0)),
                "{url} {image}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let out = tokio::time::timeout(common::event_timeout(), cli(url, &im.other).output())
            .await
            .expect("exec --image timed out")
            .unwrap();
        assert_eq!(out.status.code(), Some(125), "{url}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains("not among the images"), "{url}: {stderr}");
    }
    // `cp --image` reads the image's files (outside the tenant's root).
    let local = gw.dir.path().join("copied-marker");
    let mut cp = tokio::process::Command::new(env!("CARGO_BIN_EXE_exec-gateway"));
    cp.args(["cp", "--url", &gw.url, "--token", &token, "--image", &im.js])
        .arg(":/usr/share/marker")
        .arg(&local)
        .kill_on_drop(true);
    let out = tokio::time::timeout(common::event_timeout(), cp.output())
        .await
        .expect("cp --image timed out")
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(std::fs::read_to_string(&local).unwrap(), "js");
}

/// A bcrypt htpasswd line for `user:password`: `htpasswd -B`, else
/// Python's `bcrypt` or (libxcrypt's blowfish) `crypt`; or why neither is
/// here.
fn htpasswd(user: &str, password: &str) -> Result<String, String> {
    if let Ok(out) = Command::new("htpasswd")
        .args(["-Bbn", user, password])
        .output()
        && out.status.success()
    {
        return Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned());
    }
    let script = "import sys\n\
                  try:\n    import bcrypt\n    h = bcrypt.hashpw(sys.argv[1].encode(), bcrypt.gensalt(rounds=5)).decode()\n\
                  except ImportError:\n    import crypt\n    h = crypt.crypt(sys.argv[1], crypt.mksalt(crypt.METHOD_BLOWFISH, rounds=32))\n\
                  print(h or '')\n";
    let out = Command::new("python3")
        .args(["-W", "ignore", "-c", script, password])
        .output()
        .map_err(|e| format!("no htpasswd (apache2-utils) and no python3: {e}"))?;
    let hash = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    if !out.status.success() || !hash.starts_with("$2") {
        return Err(format!(
            "no htpasswd (apache2-utils), and python3 has neither bcrypt nor a blowfish crypt: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(format!("{user}:{hash}"))
}

/// Guards: a registry over HTTPS with a CA of its own and basic
/// authentication is pulled from with `[images] ca_file` and
/// `[images.credentials."HOST:PORT"]`; without the credentials the pull
/// fails with the registry's 401; without the CA, with a TLS failure; a
/// tenant naming a registry outside `[images] registries` is refused at
/// start.
#[tokio::test]
async fn a_registry_over_tls_with_basic_auth() {
    if let Some(why) = oci::registry_missing() {
        eprintln!("skipped: {why}");
        return;
    }
    let line = match htpasswd("puller", "s3cret-pw") {
        Ok(l) => l,
        Err(why) => {
            eprintln!("skipped: {why}");
            return;
        }
    };
    let pki = tempfile::tempdir().unwrap();
    let ca = common::pki::Ca::new("registry");
    let ca_file = ca.write(pki.path(), "ca.pem");
    let (cert, key) = ca.server().install(pki.path(), "registry");
    let users = common::write_file(pki.path(), "htpasswd", &format!("{line}\n"));
    let password_file = common::write_file(pki.path(), "password", "s3cret-pw\n");
    let reg = TestRegistry::start_configured(&RegistryConfig {
        tls: Some((&cert, &key)),
        htpasswd: Some(&users),
        ..RegistryConfig::default()
    });
    let work = tempfile::tempdir().unwrap();
    reg.push_with_creds(
        &oci::busybox_layout(work.path(), "secure"),
        "v1",
        "team/secure",
        "puller:s3cret-pw",
    );
    let reference = reg.reference("team/secure", "v1");
    let r = reg.addr.clone();
    // `[images]` beyond the store and the registry.
    let gateway = |images: String| {
        let r = r.clone();
        Gateway::start_with(move |d| {
            std::fs::create_dir_all(d.join("a")).unwrap();
            format!(
                "[[auth.keys]]\nalgorithm = \"HS256\"\nsecret_file = \"{d}/hs256.key\"\n\
                 [images]\nstore = \"{d}/store\"\nregistries = [\"{r}\"]\n{images}\n\
                 [tenants.a]\nroot = \"{d}/a\"\nimages = [\"{r}/team/*\"]\n",
                d = d.display()
            )
        })
    };
    let credentials = format!(
        "[images.credentials.\"{r}\"]\nusername = \"puller\"\npassword_file = \"{}\"\n",
        password_file.display()
    );
    let ca_line = format!("ca_file = \"{}\"", ca_file.display());

    let gw = gateway(format!("{ca_line}\n{credentials}"));
    let mut c = gw.connect_as(&gw.token("a")).await;
    let resp = initialize(&mut c, Some(&reference)).await;
    assert!(resp.get("result").is_some(), "{resp}");
    let root = gw.dir.path().join("a");
    assert_eq!(marker(&mut c, "m", &root).await.as_deref(), Ok("secure"));
    drop(c);
    drop(gw);

    // The CA, no credentials: the registry's 401.
    let gw = gateway(ca_line.clone());
    let mut c = gw.connect_as(&gw.token("a")).await;
    let (code, message) = refusal(&initialize(&mut c, Some(&reference)).await);
    assert_eq!(code, -32603, "{message}");
    assert!(message.contains("401"), "{message}");
    drop(c);
    drop(gw);

    // Credentials, but the registry's CA unknown: no TLS, nothing sent.
    let gw = gateway(credentials.clone());
    let mut c = gw.connect_as(&gw.token("a")).await;
    let (code, message) = refusal(&initialize(&mut c, Some(&reference)).await);
    assert_eq!(code, -32603, "{message}");
    assert!(!message.contains("401"), "{message}");
    drop(c);
    drop(gw);

    // A tenant whose images come from a registry not in `[images]
    // registries`: the configuration is refused.
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("a")).unwrap();
    let config = common::write_file(
        dir.path(),
        "gateway.toml",
        &format!(
            "[[auth.keys]]\nalgorithm = \"HS256\"\nsecret_file = \"{d}/hs256.key\"\n\
             [images]\nstore = \"{d}/store\"\nregistries = [\"{r}\"]\n{ca_line}\n\
             [tenants.a]\nroot = \"{d}/a\"\nimages = [\"127.0.0.1:1/team/*\"]\n",
            d = dir.path().display()
        ),
    );
    std::fs::write(dir.path().join("hs256.key"), common::random_secret()).unwrap();
    let out = common::serve_refused(&config);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("images from `127.0.0.1:1` need it in [images] registries"),
        "{stderr}"
    );
}

/// Guards the single-flight pull: five tenants on one image, activated
/// at once, fetch its layer from the registry once and unpack it once;
/// each sees the image.
#[tokio::test]
async fn tenants_activated_at_once_pull_an_image_once() {
    if let Some(why) = oci::registry_missing() {
        eprintln!("skipped: {why}");
        return;
    }
    let reg = TestRegistry::start_configured(&RegistryConfig {
        log_level: Some("info"),
        ..RegistryConfig::default()
    });
    let work = tempfile::tempdir().unwrap();
    let layout = oci::busybox_layout(work.path(), "shared");
    reg.push(&layout, "v1", "team/shared");
    let layers = oci::layer_digests(&layout, "v1");
    assert_eq!(layers.len(), 1);
    let pushed = reg.log().len();
    let reference = reg.reference("team/shared", "v1");
    let r = reg.addr.clone();
    const TENANTS: [&str; 5] = ["t0", "t1", "t2", "t3", "t4"];
    let gw = Gateway::start_with(|d| {
        let mut config = format!(
            "[[auth.keys]]\nalgorithm = \"HS256\"\nsecret_file = \"{d}/hs256.key\"\n\
             [images]\nstore = \"{d}/store\"\nregistries = [\"{r}\"]\ninsecure_registries = [\"{r}\"]\n",
            d = d.display()
        );
        for t in TENANTS {
            std::fs::create_dir_all(d.join(t)).unwrap();
            config.push_str(&format!(
                "[tenants.{t}]\nroot = \"{d}/{t}\"\nimage = \"{reference}\"\n",
                d = d.display()
            ));
        }
        config
    });
    // Each tenant's first session activates it, and its activation pulls.
    let sessions = futures_util::future::join_all(TENANTS.iter().map(|t| gw.session_of(t))).await;
    for ((mut c, _), t) in sessions.into_iter().zip(TENANTS) {
        let root = gw.dir.path().join(t);
        assert_eq!(
            marker(&mut c, "m", &root).await.as_deref(),
            Ok("shared"),
            "tenant {t}"
        );
    }
    let log = reg.log();
    let pulled = &log[pushed.min(log.len())..];
    assert_eq!(
        oci::blob_gets(pulled, &layers[0]),
        1,
        "the layer was fetched other than once:\n{pulled}"
    );
    let unpacked: Vec<_> = std::fs::read_dir(gw.dir.path().join("store/layers"))
        .unwrap()
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .collect();
    assert_eq!(unpacked.len(), 1, "{unpacked:?}");
}

/// The `session_id` of a new gRPC session on `image` ("" for none).
async fn grpc_session(ch: &tonic::transport::Channel, token: &str, image: &str) -> String {
    SessionServiceClient::new(ch.clone())
        .create_session(authed(
            pb::CreateSessionRequest {
                snapshot: String::new(),
                image: image.to_owned(),
                client_name: "t".into(),
            },
            token,
        ))
        .await
        .unwrap()
        .into_inner()
        .session_id
}

/// A gRPC `ReadFile` of `path` named by `session`: the bytes, or the status.
async fn grpc_read(
    ch: &tonic::transport::Channel,
    token: &str,
    session: &str,
    path: &str,
) -> Result<String, tonic::Status> {
    let mut files = pb::file_service_client::FileServiceClient::new(ch.clone());
    let req = pb::ReadFileRequest {
        path: path.to_owned(),
        session_id: session.to_owned(),
        ..Default::default()
    };
    let mut s = files.read_file(authed(req, token)).await?.into_inner();
    let mut out = Vec::new();
    while let Some(chunk) = s.next().await {
        out.extend(chunk?.data);
    }
    Ok(String::from_utf8_lossy(&out).into_owned())
}

/// Guards: gRPC file and environment calls naming a session run in that
/// session's image, as its processes do (they used to run on the tenant's
/// default: the host here); without a session they run on the tenant's
/// default; writes still land in the workspace.
#[tokio::test]
async fn grpc_file_calls_naming_a_session_see_its_image() {
    let Some(im) = images() else { return };
    let gw = choosing_gateway(&im.reg);
    let token = gw.token("a");
    let ch = common::grpc::channel(&gw.grpc).await;
    let sid = grpc_session(&ch, &token, &im.py).await;

    assert_eq!(
        grpc_read(&ch, &token, &sid, "/usr/share/marker")
            .await
            .map_err(|e| e.to_string()),
        Ok("py".to_owned())
    );
    // Without a session: the tenant's default, which has no image.
    let e = grpc_read(&ch, &token, "", "/usr/share/marker")
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::NotFound, "{e:?}");

    let mut env = pb::environment_service_client::EnvironmentServiceClient::new(ch.clone());
    let info = |session: &str| {
        authed(
            pb::GetInfoRequest {
                session_id: session.to_owned(),
            },
            &token,
        )
    };
    let on_image = env.get_info(info(&sid)).await.unwrap().into_inner();
    let image = on_image.image.expect("GetInfo names the session's image");
    assert!(image.digest.starts_with("sha256:"), "{image:?}");
    let default = env.get_info(info("")).await.unwrap().into_inner();
    assert_eq!(default.image, None);

    // A write naming the session lands in the workspace on the host.
    let root = gw.dir.path().join("a");
    let mut files = pb::file_service_client::FileServiceClient::new(ch.clone());
    let path = root.join("written").display().to_string();
    let first = pb::WriteFileRequest {
        path,
        data: b"hello".to_vec().into(),
        session_id: sid.clone(),
    };
    files
        .write_file(authed(tokio_stream::iter(vec![first]), &token))
        .await
        .unwrap();
    assert_eq!(std::fs::read(root.join("written")).unwrap(), b"hello");
}

/// Guards: a token's `image` claim holds for sessions it did not open: it
/// cannot resume, or use by id over gRPC, a session that runs another
/// image (nor one on the host); a token claiming the session's own image
/// can; its session-less gRPC file calls run in the claimed image.
#[tokio::test]
async fn a_tokens_image_claim_holds_on_resume_and_on_calls_by_id() {
    let Some(im) = images() else { return };
    let gw = choosing_gateway(&im.reg);
    let root = gw.dir.path().join("a");
    let plain = gw.token("a");
    let claims_js = token_with_image(&gw, "a", &im.js);
    let claims_py = token_with_image(&gw, "a", &im.py);

    // A websocket session on `py`, opened without a claim, then left.
    let sid = {
        let mut c = gw.connect_as(&plain).await;
        let r = initialize(&mut c, Some(&im.py)).await;
        r["result"]["sessionId"].as_str().unwrap().to_owned()
    };
    let params = json!({"clientName": "x", "resumeSessionId": sid});
    let mut c = gw.connect_as(&claims_js).await;
    let (code, message) = refusal(&c.call_raw("initialize", params.clone()).await);
    assert_eq!(code, -32003, "{message}");
    assert!(message.contains("image claim"), "{message}");
    let mut c = gw.connect_as(&claims_py).await;
    let r = c.call_raw("initialize", params).await;
    assert!(r.get("result").is_some(), "{r}");
    c.send(&json!({"method": "initialized"})).await;
    assert_eq!(marker(&mut c, "m", &root).await.as_deref(), Ok("py"));

    // gRPC by id: a session on `py`, and one on the host.
    let ch = common::grpc::channel(&gw.grpc).await;
    let on_py = grpc_session(&ch, &plain, &im.py).await;
    let on_host = grpc_session(&ch, &plain, "").await;
    for (session, token) in [(&on_py, &claims_js), (&on_host, &claims_py)] {
        let e = grpc_read(&ch, token, session, "/usr/share/marker")
            .await
            .unwrap_err();
        assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e:?}");
        let mut procs = ProcessServiceClient::new(ch.clone());
        let mut spec = spec("m", &["/bin/cat", "/usr/share/marker"]);
        spec.cwd = root.display().to_string();
        let req = pb::ExecRequest {
            session_id: session.clone(),
            spec: Some(spec),
        };
        let e = procs.exec(authed(req, token)).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e:?}");
    }
    assert_eq!(
        grpc_read(&ch, &claims_py, &on_py, "/usr/share/marker")
            .await
            .map_err(|e| e.to_string()),
        Ok("py".to_owned())
    );
    // Without a session, a claimed token's file calls run in its image
    // (a session opened for the call), not on the tenant's default.
    assert_eq!(
        grpc_read(&ch, &claims_js, "", "/usr/share/marker")
            .await
            .map_err(|e| e.to_string()),
        Ok("js".to_owned())
    );
}

// === A first handshake that outlasts its tenant's pull (issue #43) ===

/// A registry slower than any handshake, for as long as a test wants: a
/// proxy on a loopback port of its own in front of `upstream` that holds
/// every blob request until [`Gate::release`] (a flag, not a delay), and
/// notes the path of each blob `GET`.
struct Gate {
    addr: String,
    open: std::sync::Arc<(std::sync::Mutex<bool>, std::sync::Condvar)>,
    blob_gets: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
}

impl Gate {
    fn start(upstream: &str) -> Gate {
        use std::io::{Read as _, Write as _};
        use std::net::{Shutdown, TcpListener, TcpStream};
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap().to_string();
        let open = std::sync::Arc::new((std::sync::Mutex::new(false), std::sync::Condvar::new()));
        let blob_gets = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let (o, gets, upstream) = (open.clone(), blob_gets.clone(), upstream.to_owned());
        std::thread::spawn(move || {
            for client in l.incoming() {
                let Ok(mut client) = client else { return };
                let (open, gets, upstream) = (o.clone(), gets.clone(), upstream.clone());
                std::thread::spawn(move || {
                    let Ok(mut up) = TcpStream::connect(&upstream) else {
                        return;
                    };
                    let (Ok(mut from_up), Ok(mut to_client)) = (up.try_clone(), client.try_clone())
                    else {
                        return;
                    };
                    // Answers go back as they come.
                    std::thread::spawn(move || {
                        let _ = std::io::copy(&mut from_up, &mut to_client);
                        let _ = to_client.shutdown(Shutdown::Write);
                    });
                    // Requests go on head by head (`GET` and `HEAD`: no
                    // body), a blob's once the gate is open.
                    loop {
                        let mut head = Vec::new();
                        let mut b = [0u8; 1];
                        while !head.ends_with(b"\r\n\r\n") {
                            if head.len() > 16384 || client.read(&mut b).unwrap_or(0) == 0 {
                                let _ = up.shutdown(Shutdown::Write);
                                return;
                            }
                            head.push(b[0]);
                        }
                        let text = String::from_utf8_lossy(&head).into_owned();
                        let mut words = text.split_whitespace();
                        let (method, path) =
                            (words.next().unwrap_or(""), words.next().unwrap_or(""));
                        if path.contains("/blobs/") {
                            if method == "GET" {
                                gets.lock().unwrap().push(path.to_owned());
                            }
                            let (lock, opened) = &*open;
                            let mut is_open = lock.lock().unwrap();
                            while !*is_open {
                                is_open = opened.wait(is_open).unwrap();
                            }
                        }
                        if up.write_all(&head).is_err() {
                            return;
                        }
                    }
                });
            }
        });
        Gate {
            addr,
            open,
            blob_gets,
        }
    }

    fn release(&self) {
        let (lock, opened) = &*self.open;
        *lock.lock().unwrap() = true;
        opened.notify_all();
    }

    fn blob_gets(&self) -> Vec<String> {
        self.blob_gets.lock().unwrap().clone()
    }
}

impl Drop for Gate {
    fn drop(&mut self) {
        self.release();
    }
}

/// A websocket handshake as `token`: the client, or the refusal's
/// status, `Retry-After` and body.
async fn upgrade(gw: &Gateway, token: &str) -> Result<Client, (u16, Option<String>, String)> {
    use tokio_tungstenite::tungstenite::{self, client::IntoClientRequest as _};
    let mut req = gw.url.as_str().into_client_request().unwrap();
    req.headers_mut()
        .insert("authorization", format!("Bearer {token}").parse().unwrap());
    let answer = tokio::time::timeout(
        common::event_timeout(),
        tokio_tungstenite::connect_async(req),
    )
    .await
    .expect("the handshake was not answered");
    match answer {
        Ok((ws, _)) => Ok(Client::from_ws(ws)),
        Err(tungstenite::Error::Http(r)) => Err((
            r.status().as_u16(),
            r.headers()
                .get("retry-after")
                .map(|v| v.to_str().unwrap().to_owned()),
            String::from_utf8_lossy(r.body().as_deref().unwrap_or_default()).into_owned(),
        )),
        // A connection closed without an answer is what this guards.
        Err(e) => panic!("the handshake failed without an HTTP answer: {e}"),
    }
}

/// Guards issue #43: a tenant's first handshake, which pulls its `image`,
/// is answered before `server.handshake_timeout` closes the connection
/// when the pull outlasts it: the websocket upgrade with 503, a
/// `Retry-After` and a body that says why, a gRPC call with UNAVAILABLE
/// and `retryAfterMs`. The pull goes on (each blob is fetched once), and
/// a retry once it is done runs a command in the image. Also: a
/// connection whose `initialize` waits for a pull still answers pings
/// (its driver went deaf while `initialize` ran).
#[tokio::test]
async fn a_handshake_that_outlasts_the_pull_is_told_to_retry() {
    use tokio_tungstenite::tungstenite::Message;
    let Some(reg) = registry() else { return };
    let work = tempfile::tempdir().unwrap();
    reg.push(&oci::busybox_layout(work.path(), "slow"), "v1", "team/slow");
    let gate = Gate::start(&reg.addr);
    let g = gate.addr.clone();
    let reference = format!("{g}/team/slow:v1");
    // Short, but scaled as the helpers' waits are (the VM lane is slower):
    // only the part of an activation that is not the pull must fit in it.
    let scale = common::event_timeout().as_secs() / common::EVENT_TIMEOUT.as_secs();
    let gw = Gateway::start_with(|d| {
        for t in ["a", "b"] {
            std::fs::create_dir_all(d.join(t)).unwrap();
        }
        format!(
            "[server]\nhandshake_timeout = \"{}s\"\n\
             [[auth.keys]]\nalgorithm = \"HS256\"\nsecret_file = \"{d}/hs256.key\"\n\
             [images]\nstore = \"{d}/store\"\nregistries = [\"{g}\"]\ninsecure_registries = [\"{g}\"]\n\
             [tenants.a]\nroot = \"{d}/a\"\nimage = \"{reference}\"\n\
             [tenants.b]\nroot = \"{d}/b\"\nimages = [\"{g}/team/*\"]\n",
            2 * scale.max(1),
            d = d.display()
        )
    });
    let token = gw.token("a");

    // Tenant `a`'s activation waits for its image, which the gate holds.
    let (status, retry_after, body) = match upgrade(&gw, &token).await {
        Ok(_) => panic!("upgraded while the registry held the image"),
        Err(refused) => refused,
    };
    assert_eq!(status, 503, "{body}");
    let seconds: u64 = retry_after
        .as_deref()
        .unwrap_or_else(|| panic!("no Retry-After: {body}"))
        .parse()
        .unwrap();
    assert!(seconds >= 1, "{seconds}");
    assert!(body.contains("still being pulled"), "{body}");
    // The gRPC door says the same.
    let ch = common::grpc::channel(&gw.grpc).await;
    let mut env = pb::environment_service_client::EnvironmentServiceClient::new(ch);
    let e = env
        .get_info(authed(
            pb::GetInfoRequest {
                session_id: String::new(),
            },
            &token,
        ))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unavailable, "{e:?}");
    assert!(e.message().contains("still being pulled"), "{e:?}");
    let data = e.metadata().get("x-exec-gateway-error-data");
    assert!(
        data.is_some_and(|d| d.to_str().unwrap().contains("retryAfterMs")),
        "{e:?}"
    );

    // A session of `b` asks for the same image: its `initialize` waits
    // for that pull, and its connection still answers a ping meanwhile.
    let mut b = gw.connect_as(&gw.token("b")).await;
    let init = b
        .request_id("initialize", json!({"clientName": "x", "image": reference}))
        .await;
    futures_util::SinkExt::send(&mut b.ws, Message::Ping(b"still there?".to_vec().into()))
        .await
        .unwrap();
    let pong = tokio::time::timeout(common::event_timeout(), async {
        loop {
            match futures_util::StreamExt::next(&mut b.ws).await {
                Some(Ok(Message::Pong(p))) => return p,
                Some(Ok(Message::Text(t))) => panic!("answered while the image is held: {t}"),
                Some(Ok(_)) => {}
                other => panic!("connection ended: {other:?}"),
            }
        }
    })
    .await
    .expect("no pong while initialize waited for the pull");
    assert_eq!(pong.as_ref(), b"still there?");

    gate.release();
    let r = b.response(init).await;
    assert!(r.get("result").is_some(), "{r}");
    b.send(&json!({"method": "initialized"})).await;
    let b_root = gw.dir.path().join("b");
    assert_eq!(marker(&mut b, "m", &b_root).await.as_deref(), Ok("slow"));

    // `a` retries as told until its activation is through.
    let mut a = tokio::time::timeout(common::event_timeout(), async {
        loop {
            match upgrade(&gw, &token).await {
                Ok(c) => return c,
                Err((503, Some(after), _)) => {
                    tokio::time::sleep(std::time::Duration::from_secs(after.parse().unwrap()))
                        .await;
                }
                Err(refused) => panic!("refused: {refused:?}"),
            }
        }
    })
    .await
    .expect("tenant `a` was not activated after its pull");
    a.initialize().await;
    let a_root = gw.dir.path().join("a");
    assert_eq!(marker(&mut a, "m", &a_root).await.as_deref(), Ok("slow"));

    // The pull the first handshake started went on: nothing fetched twice.
    let gets = gate.blob_gets();
    assert!(!gets.is_empty());
    let mut distinct = gets.clone();
    distinct.sort();
    distinct.dedup();
    assert_eq!(gets.len(), distinct.len(), "{gets:?}");
}
