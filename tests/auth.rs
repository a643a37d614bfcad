//! The JWT matrix at the websocket handshake: keys are generated here (RSA,
//! EC P-256, Ed25519 with openssl; HS256 at random), tokens minted with
//! jsonwebtoken, a JWK set served by a real local HTTP server. Every bad token
//! is refused with 401/403 before any upgrade, and a valid token is accepted
//! on the same server right after each refusal.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::disallowed_methods
)]

mod common;

use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use common::{Gateway, keypair, now, rsa, rsa_jwk};
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use parking_lot::Mutex;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

const ISS: &str = "https://issuer.test";
const AUD: &str = "exec-gateway";

fn claims() -> Value {
    json!({"sub": "u", "tenant": "t1", "scope": "exec fs:read", "iss": ISS, "aud": AUD,
           "exp": now() + 600, "iat": now()})
}

fn sign(alg: Algorithm, kid: Option<&str>, key: &EncodingKey, claims: &Value) -> String {
    let mut h = Header::new(alg);
    h.kid = kid.map(str::to_owned);
    jsonwebtoken::encode(&h, claims, key).unwrap()
}

fn with(mut c: Value, k: &str, v: Value) -> Value {
    c[k] = v;
    c
}

fn without(mut c: Value, k: &str) -> Value {
    c.as_object_mut().unwrap().remove(k);
    c
}

/// A tiny HTTP server answering every GET with the current JWKS body.
async fn jwks_server(body: Arc<Mutex<String>>) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((mut s, _)) = listener.accept().await else {
                return;
            };
            let body = body.lock().clone();
            tokio::spawn(async move {
                let mut buf = vec![0u8; 4096];
                let _ = s.read(&mut buf).await;
                let resp = format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = s.write_all(resp.as_bytes()).await;
            });
        }
    });
    format!("http://{addr}/jwks.json")
}

#[tokio::test]
async fn jwt_matrix() {
    let keys = tempfile::tempdir().unwrap();
    let k = keys.path();
    let (rsa_priv, rsa_pub) = rsa(k, "rsa");
    let (other_priv, _) = rsa(k, "other");
    let (ec_priv, ec_pub) = keypair(
        k,
        "ec",
        &["-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256"],
    );
    let (ed_priv, ed_pub) = keypair(k, "ed", &["-algorithm", "ed25519"]);
    let (file_priv, file_pub) = rsa(k, "file");
    let (j1_priv, j1_pub) = rsa(k, "j1");
    let (j2_priv, j2_pub) = rsa(k, "j2");
    std::fs::write(
        k.join("jwks.json"),
        json!({"keys": [rsa_jwk(&file_pub, "filekey")]}).to_string(),
    )
    .unwrap();
    let served = Arc::new(Mutex::new(
        json!({"keys": [rsa_jwk(&j1_pub, "j1")]}).to_string(),
    ));
    let jwks_url = jwks_server(served.clone()).await;

    let kd = k.display().to_string();
    let gw = Gateway::start_with(|dir| {
        format!(
            "[auth]\nissuer = \"{ISS}\"\naudience = \"{AUD}\"\njwks_refresh_interval = \"300ms\"\n\
             [[auth.keys]]\nalgorithm = \"HS256\"\nkid = \"hs\"\nsecret_file = \"{d}/hs256.key\"\n\
             [[auth.keys]]\nalgorithm = \"RS256\"\nkid = \"rsa1\"\npublic_key_file = \"{rsa_pub}\"\n\
             [[auth.keys]]\nalgorithm = \"PS256\"\nkid = \"ps\"\npublic_key_file = \"{rsa_pub}\"\n\
             [[auth.keys]]\nalgorithm = \"ES256\"\nkid = \"ec\"\npublic_key_file = \"{ec_pub}\"\n\
             [[auth.keys]]\nalgorithm = \"EdDSA\"\nkid = \"ed\"\npublic_key_file = \"{ed_pub}\"\n\
             [[auth.keys]]\nalgorithm = \"RS256\"\njwks_file = \"{kd}/jwks.json\"\n\
             [[auth.keys]]\nalgorithm = \"RS256\"\njwks_url = \"{jwks_url}\"\n\
             [tenants.t1]\nroot = \"/\"\n",
            d = dir.display()
        )
    });
    let hs = EncodingKey::from_secret(&gw.secret);
    let rsa_key = EncodingKey::from_rsa_pem(&rsa_priv).unwrap();
    let good = sign(Algorithm::RS256, Some("rsa1"), &rsa_key, &claims());
    let bearer = |t: &str| format!("Bearer {t}");

    // Accepted: every configured key type.
    let accepted = [
        ("HS256", sign(Algorithm::HS256, Some("hs"), &hs, &claims())),
        (
            "HS256 without kid",
            sign(Algorithm::HS256, None, &hs, &claims()),
        ),
        // An expiry past the clock's range is taken as year 9999 (the sum
        // used to overflow and panic the connection's task).
        (
            "exp 2^64-1",
            sign(
                Algorithm::HS256,
                Some("hs"),
                &hs,
                &with(claims(), "exp", json!(u64::MAX)),
            ),
        ),
        (
            "exp 2^63-1",
            sign(
                Algorithm::HS256,
                Some("hs"),
                &hs,
                &with(claims(), "exp", json!(i64::MAX)),
            ),
        ),
        ("RS256", good.clone()),
        (
            "PS256",
            sign(Algorithm::PS256, Some("ps"), &rsa_key, &claims()),
        ),
        (
            "ES256",
            sign(
                Algorithm::ES256,
                Some("ec"),
                &EncodingKey::from_ec_pem(&ec_priv).unwrap(),
                &claims(),
            ),
        ),
        (
            "EdDSA",
            sign(
                Algorithm::EdDSA,
                Some("ed"),
                &EncodingKey::from_ed_pem(&ed_priv).unwrap(),
                &claims(),
            ),
        ),
        (
            "JWKS file",
            sign(
                Algorithm::RS256,
                Some("filekey"),
                &EncodingKey::from_rsa_pem(&file_priv).unwrap(),
                &claims(),
            ),
        ),
        (
            "JWKS url",
            sign(
                Algorithm::RS256,
                Some("j1"),
                &EncodingKey::from_rsa_pem(&j1_priv).unwrap(),
                &claims(),
            ),
        ),
        (
            "scope array",
            sign(
                Algorithm::RS256,
                Some("rsa1"),
                &rsa_key,
                &with(claims(), "scope", json!(["exec"])),
            ),
        ),
        (
            "nbf in the past",
            sign(
                Algorithm::RS256,
                Some("rsa1"),
                &rsa_key,
                &with(claims(), "nbf", json!(now() - 10)),
            ),
        ),
    ];
    for (name, token) in &accepted {
        let (status, body) = gw.handshake("/", Some(&bearer(token))).await;
        assert_eq!(status, 101, "{name} refused: {body}");
    }

    // Refused, each followed by a valid token on the same server.
    let b64 = |v: &Value| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v.to_string());
    let none_token = format!(
        "{}.{}.",
        b64(&json!({"alg": "none", "typ": "JWT"})),
        b64(&claims())
    );
    let tampered = {
        let parts: Vec<&str> = good.split('.').collect();
        let forged = with(claims(), "tenant", json!("t2-but-forged"));
        format!("{}.{}.{}", parts[0], b64(&forged), parts[2])
    };
    let rsa_pub_bytes = std::fs::read(&rsa_pub).unwrap();
    let rs = |c: Value| Some(bearer(&sign(Algorithm::RS256, Some("rsa1"), &rsa_key, &c)));
    let other_key = EncodingKey::from_rsa_pem(&other_priv).unwrap();
    let pub_as_secret = EncodingKey::from_secret(&rsa_pub_bytes);
    let refused: Vec<(&str, Option<String>, u16)> = vec![
        ("no token", None, 401),
        ("garbage", Some(bearer("garbage")), 401),
        ("three garbage segments", Some(bearer("a.b.c")), 401),
        ("not bearer", Some(format!("Basic {good}")), 401),
        (
            "wrong key",
            Some(bearer(&sign(
                Algorithm::RS256,
                Some("rsa1"),
                &other_key,
                &claims(),
            ))),
            401,
        ),
        ("alg none", Some(bearer(&none_token)), 401),
        (
            "HS256 signed with the RSA public key",
            Some(bearer(&sign(
                Algorithm::HS256,
                Some("rsa1"),
                &pub_as_secret,
                &claims(),
            ))),
            401,
        ),
        (
            "HS256 with the RSA public key, no kid",
            Some(bearer(&sign(
                Algorithm::HS256,
                None,
                &pub_as_secret,
                &claims(),
            ))),
            401,
        ),
        (
            "expired",
            rs(with(claims(), "exp", json!(now() - 120))),
            401,
        ),
        ("no exp", rs(without(claims(), "exp")), 401),
        (
            "nbf in the future",
            rs(with(claims(), "nbf", json!(now() + 300))),
            401,
        ),
        (
            "wrong iss",
            rs(with(claims(), "iss", json!("https://evil"))),
            401,
        ),
        ("missing iss", rs(without(claims(), "iss")), 401),
        ("wrong aud", rs(with(claims(), "aud", json!("other"))), 401),
        ("missing aud", rs(without(claims(), "aud")), 401),
        ("missing tenant", rs(without(claims(), "tenant")), 401),
        (
            "unknown tenant",
            rs(with(claims(), "tenant", json!("nobody"))),
            401,
        ),
        ("tampered payload", Some(bearer(&tampered)), 401),
        (
            "unknown kid",
            Some(bearer(&sign(
                Algorithm::RS256,
                Some("nope"),
                &rsa_key,
                &claims(),
            ))),
            401,
        ),
        (
            "no usable scope",
            rs(with(claims(), "scope", json!("admin"))),
            403,
        ),
    ];
    for (name, auth, want) in &refused {
        let (status, body) = gw.handshake("/", auth.as_deref()).await;
        assert_eq!(status, *want, "{name}: {body}");
        assert!(
            !body.contains('.') || !body.contains("ey"),
            "{name}: the reply must not echo a token: {body}"
        );
        let (ok, _) = gw.handshake("/", Some(&bearer(&good))).await;
        assert_eq!(ok, 101, "valid token refused right after {name}");
    }

    // access_token in the query (clients that can only be given a URL).
    let (status, _) = gw.handshake(&format!("/?access_token={good}"), None).await;
    assert_eq!(status, 101);

    // JWKS rotation: j2 is unknown until the issuer publishes it; then it
    // is fetched (at most once per refresh interval) and accepted.
    let j2 = sign(
        Algorithm::RS256,
        Some("j2"),
        &EncodingKey::from_rsa_pem(&j2_priv).unwrap(),
        &claims(),
    );
    assert_eq!(gw.handshake("/", Some(&bearer(&j2))).await.0, 401);
    *served.lock() = json!({"keys": [rsa_jwk(&j2_pub, "j2")]}).to_string();
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(
        gw.handshake("/", Some(&bearer(&j2))).await.0,
        101,
        "rotated key accepted"
    );
    // The retired key is gone from the refreshed set.
    let j1 = sign(
        Algorithm::RS256,
        Some("j1"),
        &EncodingKey::from_rsa_pem(&j1_priv).unwrap(),
        &claims(),
    );
    assert_eq!(
        gw.handshake("/", Some(&bearer(&j1))).await.0,
        401,
        "retired key refused"
    );

    // Every refusal was counted by reason; no token appears in the metrics.
    let (_, metrics) = gw.admin_get("/metrics").await;
    for reason in [
        "missing",
        "malformed",
        "signature",
        "expired",
        "not_yet_valid",
        "issuer",
        "audience",
        "unknown_tenant",
        "unknown_kid",
        "no_scope",
    ] {
        assert!(
            metrics.contains(&format!(
                "exec_gateway_auth_failures_total{{reason=\"{reason}\"}}"
            )),
            "{reason}: {metrics}"
        );
    }
}

#[tokio::test]
async fn a_bad_config_exits_64_with_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        ("unknown key", "[server]\nlisen = 1\n".to_owned()),
        ("no keys", "[tenants.a]\nroot = \"/\"\n".to_owned()),
        (
            "short secret",
            format!(
                "[[auth.keys]]\nalgorithm = \"HS256\"\nsecret_file = \"{0}/short\"\n[tenants.a]\nroot = \"/\"\n",
                dir.path().display()
            ),
        ),
        (
            "key bound to an unknown tenant",
            format!(
                "[[auth.keys]]\nalgorithm = \"HS256\"\nsecret_file = \"{0}/long\"\ntenant = \"nope\"\n[tenants.a]\nroot = \"/\"\n",
                dir.path().display()
            ),
        ),
        (
            "key file inside a tenant root",
            format!(
                "[[auth.keys]]\nalgorithm = \"HS256\"\nsecret_file = \"{0}/long\"\n[tenants.a]\nroot = \"{0}\"\n",
                dir.path().display()
            ),
        ),
        (
            "key file inside a tenant's writable path",
            format!(
                "[[auth.keys]]\nalgorithm = \"HS256\"\nsecret_file = \"{0}/long\"\n[tenants.a]\nroot = \"/\"\nlandlock_write = [\"{0}\"]\n",
                dir.path().display()
            ),
        ),
        (
            "a tenant root inside another's",
            format!(
                "[[auth.keys]]\nalgorithm = \"HS256\"\nsecret_file = \"{0}/long\"\n\
                 [tenants.a]\nroot = \"{0}/roots\"\n[tenants.b]\nroot = \"{0}/roots/b\"\n",
                dir.path().display()
            ),
        ),
        (
            "leeway too large",
            format!(
                "[auth]\nleeway = \"5m\"\n[[auth.keys]]\nalgorithm = \"HS256\"\nsecret_file = \"{0}/short\"\n[tenants.a]\nroot = \"/\"\n",
                dir.path().display()
            ),
        ),
    ];
    std::fs::write(dir.path().join("short"), "tooshort").unwrap();
    std::fs::write(dir.path().join("long"), "k".repeat(40)).unwrap();
    std::fs::create_dir_all(dir.path().join("roots/b")).unwrap();
    for (name, text) in cases {
        let config = dir.path().join("c.toml");
        std::fs::write(&config, text).unwrap();
        let out = common::serve_expecting_refusal(&config);
        assert_eq!(out.status.code(), Some(64), "{name}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(err.trim_end().lines().count(), 1, "{name}: {err}");
        assert!(out.stdout.is_empty(), "{name}");
    }
}

#[tokio::test]
async fn embedded_default_serves_tenant_default_with_a_minted_token() {
    let state = tempfile::tempdir().unwrap();
    let root = tempfile::tempdir().unwrap();
    let bin = env!("CARGO_BIN_EXE_exec-gateway");
    let token = Command::new(bin)
        .args(["token", "--tenant", "default", "--root"])
        .arg(root.path())
        .env("XDG_STATE_HOME", state.path())
        .output()
        .unwrap();
    assert!(
        token.status.success(),
        "{}",
        String::from_utf8_lossy(&token.stderr)
    );
    let token = String::from_utf8(token.stdout)
        .unwrap()
        .lines()
        .last()
        .unwrap()
        .to_owned();
    let key = state.path().join("exec-gateway/hs256.key");
    use std::os::unix::fs::PermissionsExt as _;
    assert_eq!(
        std::fs::metadata(&key).unwrap().permissions().mode() & 0o777,
        0o600
    );
    let mut child = Command::new(bin)
        .args([
            "serve",
            "--listen",
            "ws://127.0.0.1:0",
            "--admin-listen",
            "127.0.0.1:0",
            "--root",
        ])
        .arg(root.path())
        .env("XDG_STATE_HOME", state.path())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(child.stdout.take().unwrap()),
        &mut line,
    )
    .unwrap();
    let url = line.trim().to_owned();
    let mut c = common::Client::connect(&url, &token).await;
    c.initialize().await;
    let r = c
        .call(
            "fs/writeFile",
            json!({"path": format!("{}/hello.txt", root.path().display()), "dataBase64": "aGkK"}),
        )
        .await;
    assert_eq!(r, json!({}));
    assert_eq!(
        std::fs::read(root.path().join("hello.txt")).unwrap(),
        b"hi\n"
    );
    let (code, msg) = c
        .call_err("fs/readFile", json!({"path": "/etc/hostname"}))
        .await;
    // Outside the root reads as "not found" (clients such as Codex then
    // carry on), while the message says why.
    assert_eq!(code, -32004, "the default tenant is confined to its root");
    assert_eq!(msg, "path `/etc/hostname` is outside the tenant root");
    let _ = child.kill();
    let _ = child.wait();
}

/// A key bound to a tenant accepts the JWTs a Codex `signed-bearer-token`
/// server would (HS256, `exp` and optional `iss`/`aud`, no tenant or scope
/// claim) as that tenant, and refuses tokens naming another tenant.
#[tokio::test]
async fn a_key_bound_to_a_tenant_accepts_codex_tokens_for_it_only() {
    let codex_secret = common::random_secret();
    let gw = Gateway::start_with(|dir| {
        std::fs::write(dir.join("codex.key"), &codex_secret).unwrap();
        format!(
            "[[auth.keys]]\nalgorithm = \"HS256\"\nsecret_file = \"{0}/hs256.key\"\n\
             [[auth.keys]]\nalgorithm = \"HS256\"\nsecret_file = \"{0}/codex.key\"\ntenant = \"t2\"\n\
             [tenants.t1]\nroot = \"/\"\n[tenants.t2]\nroot = \"/\"\n",
            dir.display()
        )
    });
    let key = EncodingKey::from_secret(&codex_secret);
    // What Codex mints: exp (and iss/aud when configured), nothing else.
    let codex = sign(Algorithm::HS256, None, &key, &json!({"exp": now() + 600}));
    let mut c = gw.connect_as(&codex).await;
    c.initialize().await;
    // Every scope: a process runs and a file is read.
    let out = c.start("p", &["echo", "bound"]).await;
    assert!(out.get("error").is_none(), "{out}");
    assert_eq!(c.collect("p").await.stdout, b"bound\n");
    let meta = c.call("fs/getMetadata", json!({"path": "/"})).await;
    assert_eq!(meta["isDirectory"], true, "{meta}");
    // A token of this key naming another tenant is refused.
    let forged = sign(
        Algorithm::HS256,
        None,
        &key,
        &json!({"exp": now() + 600, "tenant": "t1", "scope": "exec"}),
    );
    let (status, body) = gw.handshake("/", Some(&format!("Bearer {forged}"))).await;
    assert_eq!(status, 401, "{body}");
    assert!(body.contains("may not sign for"), "{body}");
    // A scope claim, when present, still narrows the token.
    let narrow = sign(
        Algorithm::HS256,
        None,
        &key,
        &json!({"exp": now() + 600, "scope": "fs:read"}),
    );
    let mut n = gw.connect_as(&narrow).await;
    n.initialize().await;
    let (code, _) = n
        .call_err(
            "process/start",
            json!({"processId":"x","argv":["true"],"cwd":"/","env":{},"tty":false}),
        )
        .await;
    assert_eq!(code, -32003);
    // Tokens of the unbound key still need their tenant claim.
    let unbound = sign(
        Algorithm::HS256,
        None,
        &EncodingKey::from_secret(&gw.secret),
        &json!({"exp": now() + 600, "scope": "exec"}),
    );
    let (status, body) = gw.handshake("/", Some(&format!("Bearer {unbound}"))).await;
    assert_eq!(status, 401, "{body}");
    // With two keys of one algorithm, the key that verifies the signature
    // gives the verdict: an expired Codex token says so.
    let expired = sign(Algorithm::HS256, None, &key, &json!({"exp": now() - 600}));
    let (status, body) = gw.handshake("/", Some(&format!("Bearer {expired}"))).await;
    assert_eq!(status, 401, "{body}");
    assert!(body.contains("expired"), "{body}");
}

/// A token naming a `kid` is tried only against keys configured with that
/// `kid`: one naming another algorithm's key, or no key at all, is an
/// unknown key id (401), even where a key without a kid would verify its
/// signature.
#[tokio::test]
async fn a_kid_must_name_a_configured_key() {
    let keys = tempfile::tempdir().unwrap();
    let (_, rsa_pub) = rsa(keys.path(), "rsa");
    let gw = Gateway::start_with(|d| {
        format!(
            "[[auth.keys]]\nalgorithm = \"HS256\"\nsecret_file = \"{}/hs256.key\"\n\
             [[auth.keys]]\nalgorithm = \"RS256\"\nkid = \"rsa1\"\npublic_key_file = \"{rsa_pub}\"\n\
             [tenants.t1]\nroot = \"/\"\n",
            d.display()
        )
    });
    let hs = EncodingKey::from_secret(&gw.secret);
    let mut ok = gw
        .connect_as(&sign(Algorithm::HS256, None, &hs, &claims()))
        .await;
    ok.initialize().await;
    for kid in ["rsa1", "codex-2026"] {
        let token = sign(Algorithm::HS256, Some(kid), &hs, &claims());
        let (status, body) = gw.handshake("/", Some(&format!("Bearer {token}"))).await;
        assert_eq!(status, 401, "{kid}: {body}");
        assert!(body.contains("unknown key id"), "{kid}: {body}");
    }
}

/// A config file a tenant could write (inside its root) would let it grant
/// itself more at the next start: refused with one line naming both.
#[test]
fn a_config_file_inside_a_tenant_root_is_refused() {
    let keys = tempfile::tempdir().unwrap();
    let root = tempfile::tempdir().unwrap();
    std::fs::write(keys.path().join("k"), "k".repeat(40)).unwrap();
    let config = root.path().join("gateway.toml");
    std::fs::write(
        &config,
        format!(
            "[[auth.keys]]\nalgorithm = \"HS256\"\nsecret_file = \"{}/k\"\n[tenants.a]\nroot = \"{}\"\n",
            keys.path().display(),
            root.path().display()
        ),
    )
    .unwrap();
    let out = common::serve_expecting_refusal(&config);
    assert_eq!(out.status.code(), Some(64));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(err.contains("the config file"), "{err}");
}

/// The fleet key and the admin token are secrets like the auth keys: one
/// inside a tenant's root (which the tenant can read) is refused at start.
#[test]
fn a_fleet_key_or_admin_token_inside_a_tenant_root_is_refused() {
    let keys = tempfile::tempdir().unwrap();
    let root = tempfile::tempdir().unwrap();
    std::fs::write(keys.path().join("k"), "k".repeat(40)).unwrap();
    std::fs::write(root.path().join("secret"), "s".repeat(40)).unwrap();
    for section in [
        "[server]\nadmin_token_file = \"ROOT/secret\"\n",
        "[fleet]\nreplica = \"gw-0\"\nkey_file = \"ROOT/secret\"\n[fleet.peers]\ngw-0 = \"127.0.0.1:1\"\n",
    ] {
        let config = keys.path().join("gateway.toml");
        std::fs::write(
            &config,
            format!(
                "{}[[auth.keys]]\nalgorithm = \"HS256\"\nsecret_file = \"{}/k\"\n[tenants.a]\nroot = \"{}\"\n",
                section.replace("ROOT", &root.path().display().to_string()),
                keys.path().display(),
                root.path().display()
            ),
        )
        .unwrap();
        let out = common::serve_expecting_refusal(&config);
        assert_eq!(out.status.code(), Some(64), "{section}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("secret file") && err.contains("which the tenant can read"),
            "{section}: {err}"
        );
    }
}

/// Seen on d384597: `exec-gateway serve` started in the home directory
/// refused to start (its key lay in ~/.local/state, inside the default
/// tenant's root). The state now lives in the session's runtime directory
/// (or /var/lib for root): served from home, the tenant's processes
/// cannot read the key, and the client mints its token from it.
#[test]
fn the_embedded_default_serves_from_the_home_directory_with_its_key_out_of_sight() {
    use std::io::BufRead as _;
    use std::os::unix::fs::PermissionsExt as _;
    let dir = common::scratch();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let (home, run) = (dir.path().join("home"), dir.path().join("run"));
    std::fs::create_dir_all(&home).unwrap();
    std::fs::create_dir_all(&run).unwrap();
    std::fs::set_permissions(&run, std::fs::Permissions::from_mode(0o700)).unwrap();
    let bin = env!("CARGO_BIN_EXE_exec-gateway");
    let env = |c: &mut std::process::Command| {
        c.current_dir(&home)
            .env("HOME", &home)
            .env("XDG_RUNTIME_DIR", &run)
            .env_remove("XDG_STATE_HOME")
            .env_remove("EXEC_GATEWAY_TOKEN");
    };
    let mut serve = std::process::Command::new(bin);
    serve.args([
        "serve",
        "--listen",
        "ws://127.0.0.1:0",
        "--admin-listen",
        "127.0.0.1:0",
    ]);
    env(&mut serve);
    let mut child = serve.stdout(std::process::Stdio::piped()).spawn().unwrap();
    let mut url = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut url)
        .unwrap();
    let url = url.trim().to_owned();
    assert!(
        url.starts_with("ws://127.0.0.1:"),
        "serve did not start: {url:?}"
    );
    let key = run.join("exec-gateway/hs256.key");
    assert!(key.is_file(), "no key at {}", key.display());
    let mut exec = std::process::Command::new(bin);
    exec.args(["exec", "--url", &url, "--", "sh", "-c"])
        .arg(format!(
            "pwd; cat {} 2>&1 || true; ls -A {} 2>&1 || true",
            key.display(),
            run.display()
        ));
    env(&mut exec);
    let out = exec.output().unwrap();
    let _ = child.kill();
    let _ = child.wait();
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{text}");
    assert!(text.starts_with(&format!("{}\n", home.display())), "{text}");
    let secret = std::fs::read_to_string(&key).unwrap();
    assert!(
        !text.contains(secret.trim()),
        "the tenant read the key: {text}"
    );
}
