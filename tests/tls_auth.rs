//! TLS as the clients see it: `exec` over `wss://` and `grpcs://` with its
//! CA option, client certificates as credentials, an expired server
//! certificate, and the admin listener over TLS. Certificates are made
//! here (rcgen); the clients are the real binary and rustls.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::path::{Path, PathBuf};

use common::Gateway;
use common::pki::{Ca, Leaf, LeafSpec};

const BIN: &str = env!("CARGO_BIN_EXE_exec-gateway");

/// A gateway serving `server` on both doors, asking for client
/// certificates of `clients` when given.
fn tls_gateway(server: &Leaf, clients: Option<&Ca>) -> Gateway {
    Gateway::start_with(|d| {
        server.install(d, "tls");
        let client_ca = clients
            .map(|ca| {
                format!(
                    "client_ca_file = \"{}\"\n",
                    ca.write(d, "clients.crt").display()
                )
            })
            .unwrap_or_default();
        format!(
            "[server.tls]\ncert_file = \"{0}/tls.crt\"\nkey_file = \"{0}/tls.key\"\n{client_ca}\
             [[auth.keys]]\nalgorithm = \"HS256\"\nsecret_file = \"{0}/hs256.key\"\n\
             [tenants.t1]\nroot = \"/\"\n[tenants.t2]\nroot = \"/\"\n",
            d.display()
        )
    })
}

/// `exec-gateway exec` with `args` (URL, credentials) running `echo`;
/// its exit code and what it printed (stdout, then stderr).
async fn exec(args: &[&str]) -> (Option<i32>, String) {
    let mut cmd = tokio::process::Command::new(BIN);
    cmd.arg("exec")
        .args(args)
        .args(["--", "echo", "over-tls"])
        .env_remove("EXEC_GATEWAY_TOKEN")
        .env_remove("EXEC_GATEWAY_URL")
        .env_remove("EXEC_GATEWAY_CA")
        .kill_on_drop(true);
    let out = tokio::time::timeout(common::event_timeout(), cmd.output())
        .await
        .expect("exec finished")
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr),
    )
}

/// Both door URLs of `gw` as the client names them.
fn doors(gw: &Gateway) -> [(String, bool); 2] {
    [
        (gw.url.clone(), false),
        (gw.grpc.replace("https://", "grpcs://"), true),
    ]
}

fn url_args(url: &str, grpc: bool) -> Vec<String> {
    let mut v = vec!["--url".to_owned(), url.to_owned()];
    if grpc {
        v.push("--grpc".to_owned());
    }
    v
}

fn strs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

/// `exec --ca` trusts the gateway's CA on both doors; without it (the
/// public web roots) or with another CA the handshake is refused, and the
/// client says why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_exec_client_dials_tls_with_its_ca_bundle() {
    let ca = Ca::new("gateway");
    let gw = tls_gateway(&ca.server(), None);
    let dir = gw.dir.path();
    let ca_file = ca.write(dir, "ca.crt");
    let other = Ca::new("other").write(dir, "other.crt");
    let token = gw.token("t1");
    for (url, grpc) in doors(&gw) {
        let mut args = url_args(&url, grpc);
        args.extend(["--token".to_owned(), token.clone()]);
        let with_ca = [args.clone(), vec!["--ca".to_owned(), path(&ca_file)]].concat();
        let (code, text) = exec(&strs(&with_ca)).await;
        assert_eq!(code, Some(0), "{url}: {text}");
        assert!(text.contains("over-tls"), "{url}: {text}");
        for refused in [
            args.clone(),
            [args.clone(), vec!["--ca".to_owned(), path(&other)]].concat(),
        ] {
            let (code, text) = exec(&strs(&refused)).await;
            assert_eq!(code, Some(125), "{url}: {text}");
            assert!(text.to_lowercase().contains("certificate"), "{url}: {text}");
        }
    }
}

fn path(p: &Path) -> String {
    p.display().to_string()
}

/// A client certificate of the configured client CA is a credential: its
/// organization names the tenant, its units the scopes. Certificates of
/// another CA, expired ones, ones naming no or an unknown tenant, or no
/// scope that allows the call are refused; a token still works alongside.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_certificates_authenticate_machine_clients() {
    let server_ca = Ca::new("gateway");
    let clients = Ca::new("clients");
    let gw = tls_gateway(&server_ca.server(), Some(&clients));
    let dir = gw.dir.path().to_path_buf();
    let ca_file = server_ca.write(&dir, "ca.crt");
    let cert = |stem: &str, ca: &Ca, spec: LeafSpec<'_>| -> Vec<String> {
        let (c, k) = ca.leaf(&spec).install(&dir, stem);
        vec!["--cert".to_owned(), path(&c), "--key".to_owned(), path(&k)]
    };
    let bot = |o: Vec<&'static str>, ou: Vec<&'static str>| LeafSpec {
        organizations: o,
        units: ou,
        common_name: Some("build-bot"),
        ..LeafSpec::default()
    };
    // Scopes as a token's `scope` claim: space-separated (rcgen makes one
    // unit of each attribute type).
    let good = cert("bot", &clients, bot(vec!["t1"], vec!["exec fs:read"]));
    let refusals: Vec<(&str, Vec<String>, &str)> = vec![
        (
            "another CA",
            cert(
                "stranger",
                &Ca::new("stranger"),
                bot(vec!["t1"], vec!["exec"]),
            ),
            "",
        ),
        (
            "expired",
            cert(
                "expired",
                &clients,
                LeafSpec {
                    years: Some((2001, 2002)),
                    ..bot(vec!["t1"], vec!["exec"])
                },
            ),
            "",
        ),
        (
            "unknown tenant",
            cert("nobody", &clients, bot(vec!["nobody"], vec!["exec"])),
            "unknown tenant",
        ),
        (
            "no tenant",
            cert("none", &clients, bot(vec![], vec!["exec"])),
            "exactly one organization",
        ),
        (
            "no usable scope",
            cert("reader", &clients, bot(vec!["t1"], vec!["fs:read"])),
            "forbidden",
        ),
    ];
    for (url, grpc) in doors(&gw) {
        let base = [
            url_args(&url, grpc),
            vec!["--ca".to_owned(), path(&ca_file)],
        ]
        .concat();
        let (code, text) = exec(&strs(&[base.clone(), good.clone()].concat())).await;
        assert_eq!(code, Some(0), "{url}: {text}");
        assert!(text.contains("over-tls"), "{url}: {text}");
        for (what, creds, says) in &refusals {
            let (code, text) = exec(&strs(&[base.clone(), creds.clone()].concat())).await;
            assert_ne!(code, Some(0), "{url}, {what}: {text}");
            assert!(
                !text.lines().any(|l| l == "over-tls"),
                "{url}, {what}: {text}"
            );
            assert!(text.contains(says), "{url}, {what}: {text}");
        }
        // A token without a certificate, on the same listener.
        let with_token = [base.clone(), vec!["--token".to_owned(), gw.token("t2")]].concat();
        let (code, text) = exec(&strs(&with_token)).await;
        assert_eq!(code, Some(0), "{url}: {text}");
    }
    // Refusals are counted by reason.
    let (_, metrics) = gw.admin_get("/metrics").await;
    assert!(metrics.contains("reason=\"certificate\""), "{metrics}");
}

/// A server certificate that has expired is still loaded (the gateway
/// says so in its log), and clients refuse it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_server_certificate_is_refused_by_clients() {
    let ca = Ca::new("gateway");
    let expired = ca.leaf(&LeafSpec {
        years: Some((2001, 2002)),
        ..LeafSpec::default()
    });
    let gw = tls_gateway(&expired, None);
    let ca_file = ca.write(gw.dir.path(), "ca.crt");
    for (url, grpc) in doors(&gw) {
        let args = [
            url_args(&url, grpc),
            vec![
                "--ca".to_owned(),
                path(&ca_file),
                "--token".to_owned(),
                gw.token("t1"),
            ],
        ]
        .concat();
        let (code, text) = exec(&strs(&args)).await;
        assert_eq!(code, Some(125), "{url}: {text}");
        assert!(text.to_lowercase().contains("expired"), "{url}: {text}");
    }
}

/// `[server.admin_tls]` serves the admin routes over HTTPS only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_listener_serves_https() {
    let ca = Ca::new("admin");
    let gw = Gateway::start_with(|d| {
        ca.server().install(d, "admin");
        format!(
            "[server.admin_tls]\ncert_file = \"{0}/admin.crt\"\nkey_file = \"{0}/admin.key\"\n\
             [[auth.keys]]\nalgorithm = \"HS256\"\nsecret_file = \"{0}/hs256.key\"\n\
             [tenants.t1]\nroot = \"/\"\n",
            d.display()
        )
    });
    let root = reqwest::Certificate::from_pem(ca.pem.as_bytes()).unwrap();
    let https = reqwest::Client::builder()
        .add_root_certificate(root)
        .build()
        .unwrap();
    let r = https
        .get(format!("https://{}/metrics", gw.admin))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert!(r.text().await.unwrap().contains("exec_gateway_"));
    let plain = reqwest::Client::new()
        .get(format!("http://{}/metrics", gw.admin))
        .send()
        .await;
    assert!(
        plain.is_err() || plain.is_ok_and(|r| r.status() != 200),
        "plaintext got the metrics"
    );
}

/// `serve` with `config` (and these files in `dir`): its exit code and
/// stderr, when it refuses; None when it started (it is stopped then).
fn serve_outcome(dir: &Path, config: &str) -> Option<(Option<i32>, String)> {
    let file = dir.join("gateway.toml");
    std::fs::write(&file, config).unwrap();
    let mut child = std::process::Command::new(BIN)
        .args(["serve", "--listen", "ws://127.0.0.1:0", "--config"])
        .arg(&file)
        .env("XDG_STATE_HOME", dir.join("state"))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = String::new();
    let stdout = child.stdout.take().unwrap();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(stdout), &mut first).unwrap();
    if first.is_empty() {
        let out = child.wait_with_output().unwrap();
        return Some((
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        ));
    }
    let _ = child.kill();
    let _ = child.wait();
    None
}

/// Plaintext off loopback is refused unless asked for by name: the admin
/// listener (its token would cross the network in clear) and the fleet's
/// peer listener (peer traffic and clients' tokens).
#[test]
fn plaintext_off_loopback_is_refused_unless_asked_for() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::write(d.join("hs256.key"), common::random_secret()).unwrap();
    std::fs::write(d.join("admin.token"), "a".repeat(40)).unwrap();
    std::fs::write(d.join("fleet.key"), common::random_secret()).unwrap();
    let ca = Ca::new("pki");
    ca.server().install(d, "tls");
    let ca_file: PathBuf = ca.write(d, "ca.crt");
    let base = format!(
        "[[auth.keys]]\nalgorithm = \"HS256\"\nsecret_file = \"{0}/hs256.key\"\n\
         [tenants.t1]\nroot = \"/\"\n",
        d.display()
    );
    let admin = |extra: &str| {
        format!(
            "[server]\nadmin_listen = \"0.0.0.0:0\"\nadmin_token_file = \"{}/admin.token\"\n{extra}\n{base}",
            d.display()
        )
    };
    let tls = format!(
        "[server.admin_tls]\ncert_file = \"{0}/tls.crt\"\nkey_file = \"{0}/tls.key\"\n",
        d.display()
    );
    let (code, err) = serve_outcome(d, &admin("")).expect("refused");
    assert_eq!(code, Some(64), "{err}");
    assert!(err.contains("server.admin_tls"), "{err}");
    assert!(serve_outcome(d, &admin("admin_plaintext = true")).is_none());
    assert!(serve_outcome(d, &admin(&tls)).is_none());
    let fleet = |extra: &str| {
        format!(
            "[server]\nadmin_listen = \"off\"\n{base}[fleet]\nreplica = \"gw-0\"\nlisten = \"0.0.0.0:0\"\n\
             key_file = \"{0}/fleet.key\"\n{extra}\n[fleet.peers]\ngw-0 = \"127.0.0.1:1\"\n",
            d.display()
        )
    };
    let (code, err) = serve_outcome(d, &fleet("")).expect("refused");
    assert_eq!(code, Some(64), "{err}");
    assert!(err.contains("fleet.tls"), "{err}");
    assert!(serve_outcome(d, &fleet("allow_plaintext = true")).is_none());
    let mtls = format!(
        "[fleet.tls]\ncert_file = \"{0}/tls.crt\"\nkey_file = \"{0}/tls.key\"\nca_file = \"{1}\"\n",
        d.display(),
        ca_file.display()
    );
    // `[fleet.tls]` is a table: it follows the keys of [fleet].
    let with_tls = fleet("").replace("[fleet.peers]", &format!("{mtls}[fleet.peers]"));
    assert!(serve_outcome(d, &with_tls).is_none(), "{with_tls}");
    // A loopback listener whose peers are elsewhere sends them clients'
    // tokens in clear: refused too.
    let far_peer = fleet("")
        .replace("listen = \"0.0.0.0:0\"", "listen = \"127.0.0.1:0\"")
        .replace(
            "gw-0 = \"127.0.0.1:1\"",
            "gw-0 = \"127.0.0.1:1\"\ngw-1 = \"192.0.2.10:9470\"",
        );
    let (code, err) = serve_outcome(d, &far_peer).expect("refused");
    assert_eq!(code, Some(64), "{err}");
    assert!(err.contains("192.0.2.10"), "{err}");
}

/// A client chain longer than the gateway takes (4 intermediates) is
/// refused before any path building; a short one is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_over_long_client_chain_is_refused() {
    let server_ca = Ca::new("gateway");
    let clients = Ca::new("clients");
    let gw = tls_gateway(&server_ca.server(), Some(&clients));
    let dir = gw.dir.path().to_path_buf();
    let ca_file = server_ca.write(&dir, "ca.crt");
    // clients -> i1 -> i2 -> ... -> leaf; the chain file holds the leaf
    // and every intermediate.
    let chain = |depth: usize, stem: &str| -> Vec<String> {
        let mut cas = vec![clients.intermediate(&format!("{stem}-1"))];
        for i in 2..=depth {
            let next = cas[cas.len() - 1].intermediate(&format!("{stem}-{i}"));
            cas.push(next);
        }
        let leaf = cas[cas.len() - 1].leaf(&LeafSpec {
            organizations: vec!["t1"],
            units: vec!["exec"],
            ..LeafSpec::default()
        });
        let mut pem = leaf.cert_pem.clone();
        for ca in cas.iter().rev() {
            pem.push_str(&ca.pem);
        }
        let (c, k) = Leaf {
            cert_pem: pem,
            key_pem: leaf.key_pem,
        }
        .install(&dir, stem);
        vec!["--cert".to_owned(), path(&c), "--key".to_owned(), path(&k)]
    };
    let base = [
        url_args(&gw.url, false),
        vec!["--ca".to_owned(), path(&ca_file)],
    ]
    .concat();
    let (code, text) = exec(&strs(&[base.clone(), chain(2, "short")].concat())).await;
    assert_eq!(code, Some(0), "{text}");
    let (code, text) = exec(&strs(&[base, chain(5, "long")].concat())).await;
    assert_ne!(code, Some(0), "{text}");
    assert!(!text.lines().any(|l| l == "over-tls"), "{text}");
}

/// Trust anchors and certificates inside a tenant's root are refused at
/// start: a tenant that can write the client CA bundle could add a CA of
/// its own and sign itself into any tenant.
#[test]
fn tls_files_inside_a_tenant_root_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::write(d.join("hs256.key"), common::random_secret()).unwrap();
    let root = d.join("t1");
    std::fs::create_dir_all(&root).unwrap();
    let ca = Ca::new("pki");
    ca.server().install(d, "tls");
    ca.write(&root, "clients.crt");
    let config = format!(
        "[server]\nadmin_listen = \"off\"\n[server.tls]\ncert_file = \"{0}/tls.crt\"\nkey_file = \"{0}/tls.key\"\n\
         client_ca_file = \"{1}/clients.crt\"\n\
         [[auth.keys]]\nalgorithm = \"HS256\"\nsecret_file = \"{0}/hs256.key\"\n\
         [tenants.t1]\nroot = \"{1}\"\n",
        d.display(),
        root.display()
    );
    let (code, err) = serve_outcome(d, &config).expect("refused");
    assert_eq!(code, Some(64), "{err}");
    assert!(err.contains("clients.crt"), "{err}");
}

/// `exec-gateway executor --ca` joins a registry served over TLS: the
/// registration over `https://`, the rendezvous over `wss://` (never a
/// plaintext URL, whose ticket anyone on the path could redeem).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_executor_joins_a_tls_registry_with_its_ca() {
    let ca = Ca::new("registry");
    let gw = Gateway::start_with(|d| {
        ca.server().install(d, "tls");
        format!(
            "[server]\ndetach_ttl = \"60s\"\n\
             [server.tls]\ncert_file = \"{0}/tls.crt\"\nkey_file = \"{0}/tls.key\"\n\
             [[auth.keys]]\nalgorithm = \"HS256\"\nsecret_file = \"{0}/hs256.key\"\n\
             [tenants.t1]\nroot = \"/\"\npool = \"p\"\n\
             [executors]\n[executors.pools.p]\n",
            d.display()
        )
    });
    let ca_file = ca.write(gw.dir.path(), "ca.crt");
    let token = jsonwebtoken::encode(
        &jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256),
        &serde_json::json!({"sub": "ci", "pool": "p", "scope": "executor", "exp": common::now() + 3600}),
        &jsonwebtoken::EncodingKey::from_secret(&gw.secret),
    )
    .unwrap();
    let edir = tempfile::tempdir().unwrap();
    let root = edir.path().join("root");
    std::fs::create_dir_all(&root).unwrap();
    std::fs::write(edir.path().join("k"), common::random_secret()).unwrap();
    let config = edir.path().join("executor.toml");
    std::fs::write(
        &config,
        format!(
            "[[auth.keys]]\nalgorithm = \"HS256\"\nsecret_file = \"{}/k\"\n[tenants.here]\nroot = \"{}\"\n",
            edir.path().display(),
            root.display()
        ),
    )
    .unwrap();
    let mut executor = tokio::process::Command::new(BIN)
        .args(["executor", "--config"])
        .arg(&config)
        .args(["--remote", &format!("https://{}/", gw.addr)])
        .args(["--executor-id", "tls-ex", "--slots", "1", "--ca"])
        .arg(&ca_file)
        .env("CODEX_EXEC_SERVER_REMOTE_BEARER_TOKEN", &token)
        .env("XDG_STATE_HOME", edir.path().join("state"))
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let deadline = tokio::time::Instant::now() + common::event_timeout();
    loop {
        let (_, body) = gw.admin_get("/readyz").await;
        if body.contains("1 idle links") {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "never joined: {body}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let tls = common::pki::client_config(&ca.pem, None);
    let mut c = common::Client::connect_tls(&gw.url, &gw.token("t1"), tls)
        .await
        .unwrap();
    c.initialize().await;
    let cwd = root.display().to_string();
    c.call(
        "process/start",
        serde_json::json!({"processId": "p", "argv": ["echo", "on-executor"], "cwd": cwd,
                           "env": {"PATH": "/usr/bin:/bin"}, "tty": false}),
    )
    .await;
    let r = c
        .call(
            "process/read",
            serde_json::json!({"processId": "p", "afterSeq": 0, "waitMs": 5000}),
        )
        .await;
    let chunk = r["chunks"][0]["chunk"].as_str().unwrap_or_default();
    assert_eq!(common::unb64(chunk), b"on-executor\n", "{r}");
    let _ = executor.start_kill();
}
