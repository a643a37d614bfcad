//! Codex 0.169.0's direct transport (SigV4) and executor credentials that
//! are bound and revocable: real gateways, the official `codex exec-server
//! --remote ... --remote-transport direct --aws-sigv4` (fetched by
//! scripts/fetch-codex), requests signed here with keys made here.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::path::Path;
use std::time::Duration;

use common::direct::{
    Codex, KEY_ID, KEY2_ID, SECRET, SECRET2, WAIT, codex_169, config, wait_readyz,
};
use common::{Client, Gateway, now};
use hmac::Mac as _;
use serde_json::{Value, json};
use sha2::Digest as _;

fn hex(b: &[u8]) -> String {
    b.iter().map(|c| format!("{c:02x}")).collect()
}

fn hmac(key: &[u8], data: &str) -> Vec<u8> {
    let mut m = hmac::Hmac::<sha2::Sha256>::new_from_slice(key).unwrap();
    m.update(data.as_bytes());
    m.finalize().into_bytes().to_vec()
}

/// `x-amz-date` for a time `offset` seconds from now.
fn amz_date(offset: i64) -> String {
    let t = (now() as i64 + offset) as u64;
    let days = t / 86_400;
    // Civil from days (Howard Hinnant).
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + u64::from(m <= 2);
    let s = t % 86_400;
    format!(
        "{y:04}{m:02}{d:02}T{:02}{:02}{:02}Z",
        s / 3600,
        s / 60 % 60,
        s % 60
    )
}

/// SigV4 headers for a request whose path and query need no encoding.
fn sign(
    method: &str,
    target: &str,
    host: &str,
    body: &[u8],
    date: &str,
    secret: &str,
) -> Vec<(String, String)> {
    sign_as(KEY_ID, method, target, host, body, date, secret)
}

fn sign_as(
    key_id: &str,
    method: &str,
    target: &str,
    host: &str,
    body: &[u8],
    date: &str,
    secret: &str,
) -> Vec<(String, String)> {
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    let mut q: Vec<&str> = query.split('&').filter(|p| !p.is_empty()).collect();
    q.sort();
    let (signed, canon_headers) = if body.is_empty() {
        (
            "host;x-amz-date",
            format!("host:{host}\nx-amz-date:{date}\n"),
        )
    } else {
        (
            "content-type;host;x-amz-date",
            format!("content-type:application/json\nhost:{host}\nx-amz-date:{date}\n"),
        )
    };
    let canonical = format!(
        "{method}\n{path}\n{}\n{canon_headers}\n{signed}\n{}",
        q.join("&"),
        hex(&sha2::Sha256::digest(body))
    );
    let day = &date[..8];
    let to_sign = format!(
        "AWS4-HMAC-SHA256\n{date}\n{day}/us-east-1/execute-api/aws4_request\n{}",
        hex(&sha2::Sha256::digest(canonical.as_bytes()))
    );
    let mut k = format!("AWS4{secret}").into_bytes();
    for part in [day, "us-east-1", "execute-api", "aws4_request"] {
        k = hmac(&k, part);
    }
    let sig = hex(&hmac(&k, &to_sign));
    vec![
        ("x-amz-date".into(), date.into()),
        (
            "authorization".into(),
            format!(
                "AWS4-HMAC-SHA256 Credential={key_id}/{day}/us-east-1/execute-api/aws4_request, SignedHeaders={signed}, Signature={sig}"
            ),
        ),
    ]
}

async fn post_register(addr: &str, id: &str, headers: &[(String, String)]) -> (u16, Value) {
    let mut r = reqwest::Client::new()
        .post(format!(
            "http://{addr}/cloud/environment/{id}/direct/register"
        ))
        .header("content-type", "application/json")
        .body(r#"{"transport":"direct_jsonrpc_v1"}"#);
    for (k, v) in headers {
        r = r.header(k, v);
    }
    let r = r.send().await.unwrap();
    let status = r.status().as_u16();
    let text = r.text().await.unwrap_or_default();
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

/// Dial a registration URL with `headers`: the status (101 when upgraded)
/// and the websocket.
async fn dial(
    url: &str,
    headers: &[(String, String)],
) -> (
    u16,
    Option<
        tokio_tungstenite::WebSocketStream<
            tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>,
        >,
    >,
) {
    use tokio_tungstenite::tungstenite::client::IntoClientRequest as _;
    let mut req = url.into_client_request().unwrap();
    for (k, v) in headers {
        req.headers_mut().insert(
            http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
            v.parse().unwrap(),
        );
    }
    match tokio_tungstenite::connect_async(req).await {
        Ok((ws, _)) => (101, Some(ws)),
        Err(tokio_tungstenite::tungstenite::Error::Http(r)) => (r.status().as_u16(), None),
        Err(e) => panic!("dial {url}: {e}"),
    }
}

/// Until the gateway closes `link` (within [`WAIT`], else `why`).
async fn wait_closed(
    link: &mut tokio_tungstenite::WebSocketStream<
        tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>,
    >,
    why: &str,
) {
    use futures_util::StreamExt as _;
    let closed = tokio::time::timeout(WAIT, async {
        while let Some(Ok(m)) = link.next().await {
            if m.is_close() {
                break;
            }
        }
    })
    .await;
    assert!(closed.is_ok(), "{why}");
}

/// The target (path and query) of a URL.
fn target_of(url: &str) -> String {
    let rest = url.split_once("://").unwrap().1;
    format!("/{}", rest.split_once('/').unwrap().1)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn signed_requests_are_verified_bound_and_never_replayed() {
    let gw = Gateway::start_with(|d| config(d, Some("env-a"), "registration_ttl = \"2s\""));
    let host = gw.addr.clone();
    let path = "/cloud/environment/env-a/direct/register";
    let body = br#"{"transport":"direct_jsonrpc_v1"}"#;
    let good = sign("POST", path, &host, body, &amz_date(0), SECRET);
    let (status, reg) = post_register(&gw.addr, "env-a", &good).await;
    assert_eq!(status, 200, "{reg}");
    assert_eq!(reg["environment_id"], "env-a");
    assert_eq!(reg["transport"], "direct_jsonrpc_v1");
    assert!(
        reg["registration_id"]
            .as_str()
            .is_some_and(|r| !r.is_empty())
    );
    let url = reg["url"].as_str().unwrap().to_owned();
    assert!(
        url.starts_with(&format!(
            "ws://{host}/cloud/environment/env-a/direct/ws?registration="
        )),
        "{url}"
    );
    // The same signed request again: a replay.
    let (status, body_) = post_register(&gw.addr, "env-a", &good).await;
    assert_eq!((status, &body_["error"]["code"]), (401, &json!("replayed")));
    // Another secret, a clock ten minutes off, another environment than
    // the key is bound to, no signature at all.
    let forged = sign(
        "POST",
        path,
        &host,
        body,
        &amz_date(0),
        "not-the-secret-at-all-0000",
    );
    assert_eq!(post_register(&gw.addr, "env-a", &forged).await.0, 401);
    let late = sign("POST", path, &host, body, &amz_date(-600), SECRET);
    let (status, e) = post_register(&gw.addr, "env-a", &late).await;
    assert_eq!(status, 401);
    assert!(
        e["error"]["message"]
            .as_str()
            .unwrap()
            .contains("x-amz-date"),
        "{e}"
    );
    let other = "/cloud/environment/env-b/direct/register";
    let wrong = sign("POST", other, &host, body, &amz_date(1), SECRET);
    let (status, e) = post_register(&gw.addr, "env-b", &wrong).await;
    assert_eq!(
        (status, &e["error"]["code"]),
        (403, &json!("wrong_executor")),
        "{e}"
    );
    assert_eq!(post_register(&gw.addr, "env-a", &[]).await.0, 401);
    // The same signature in capitals (once taken as a new one).
    let mut upper = good.clone();
    let (head, sig) = upper[1].1.rsplit_once("Signature=").unwrap();
    upper[1].1 = format!("{head}Signature={}", sig.to_uppercase());
    assert_eq!(post_register(&gw.addr, "env-a", &upper).await.0, 401);
    // env-a is reserved for the key bound to it: another key of the pool
    // cannot register as it.
    let other_key = sign_as(KEY2_ID, "POST", path, &host, body, &amz_date(2), SECRET2);
    let (status, e) = post_register(&gw.addr, "env-a", &other_key).await;
    assert_eq!(
        (status, &e["error"]["code"]),
        (403, &json!("wrong_executor")),
        "{e}"
    );

    // The dial: signed by the key, once per signature.
    let target = target_of(&url);
    let signed = sign("GET", &target, &host, b"", &amz_date(0), SECRET);
    let (status, ws) = dial(&url, &signed).await;
    assert_eq!(status, 101);
    assert_eq!(dial(&url, &signed).await.0, 503, "a replayed dial");
    assert_eq!(dial(&url, &[]).await.0, 401, "an unsigned dial");
    let forged = sign(
        "GET",
        &target,
        &host,
        b"",
        &amz_date(2),
        "not-the-secret-at-all-0000",
    );
    assert_eq!(dial(&url, &forged).await.0, 401);
    let stolen = url.replace("/env-a/", "/env-b/");
    let s = sign("GET", &target_of(&stolen), &host, b"", &amz_date(3), SECRET);
    assert_eq!(dial(&stolen, &s).await.0, 401, "the URL names its executor");
    // A registration this gateway cannot read (one issued before a restart
    // of a gateway outside a fleet): 409, and the executor registers again.
    let unknown =
        format!("ws://{host}/cloud/environment/env-a/direct/ws?registration=issued.elsewhere.x");
    let s = sign(
        "GET",
        &target_of(&unknown),
        &host,
        b"",
        &amz_date(4),
        SECRET,
    );
    assert_eq!(dial(&unknown, &s).await.0, 409);
    let (_, readyz) = gw.admin_get("/readyz").await;
    assert!(
        readyz.contains("pool p: 1 executors, 1 idle links"),
        "{readyz}"
    );
    drop(ws);
    // Past registration_ttl a dial gets 409: register again.
    let deadline = tokio::time::Instant::now() + WAIT;
    let mut skew = 10;
    loop {
        let s = sign("GET", &target, &host, b"", &amz_date(skew), SECRET);
        skew += 1;
        let status = dial(&url, &s).await.0;
        if status == 409 {
            break;
        }
        assert!(matches!(status, 101 | 503), "{status}");
        assert!(tokio::time::Instant::now() < deadline, "never expired");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn metric(gw: &Gateway, name: &str) -> u64 {
    let (_, m) = gw.admin_get("/metrics").await;
    m.lines()
        .find_map(|l| l.strip_prefix(&format!("{name} ")))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

fn uri(p: &Path) -> String {
    format!("file://{}", p.display())
}

async fn open(gw: &Gateway) -> (Client, Value) {
    let mut c = gw.connect().await;
    let init = c.call("initialize", json!({"clientName": "test"})).await;
    c.send(&json!({"method": "initialized"})).await;
    (c, init)
}

/// `echo WORD` in `cwd` on the session; its output.
async fn echo(c: &mut Client, id: &str, cwd: &Path, word: &str) -> String {
    c.call(
        "process/start",
        json!({"processId": id, "argv": ["/bin/sh", "-c", format!("echo {word}")],
               "cwd": uri(cwd), "env": {"PATH": "/usr/bin:/bin"}, "tty": false}),
    )
    .await;
    let mut out = Vec::new();
    let mut after: Option<u64> = None;
    loop {
        let r = c
            .call(
                "process/read",
                json!({"processId": id, "afterSeq": after, "waitMs": 2000}),
            )
            .await;
        for chunk in r["chunks"].as_array().unwrap() {
            out.extend(common::unb64(chunk["chunk"].as_str().unwrap()));
        }
        after = r["nextSeq"].as_u64().map(|n| n - 1);
        if r["closed"] == true {
            return String::from_utf8_lossy(&out).into_owned();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_official_0169_executor_joins_serves_redials_and_comes_back() {
    let Some(bin) = codex_169() else { return };
    let gw = Gateway::start_with(|d| config(d, None, ""));
    let codex = Codex::start(&bin, &gw.addr, "env-1");
    wait_readyz(&gw, "pool p: 1 executors, 1 idle links").await;
    let (mut c, init) = open(&gw).await;
    // What the session reports is the executor's own description.
    let env = &init["environmentInfo"];
    assert_eq!(env["executorVersion"], "0.169.0", "{init}");
    assert_eq!(env["cwd"], uri(&codex.work()), "{init}");
    assert!(
        init["sessionId"].as_str().unwrap().contains("env-1"),
        "{init}"
    );
    let work = codex.work();
    assert_eq!(echo(&mut c, "p1", &work, "hello").await, "hello\n");
    let file = work.join("f.txt");
    c.call(
        "fs/writeFile",
        json!({"path": uri(&file), "dataBase64": common::b64(b"from the gateway")}),
    )
    .await;
    assert_eq!(std::fs::read(&file).unwrap(), b"from the gateway");
    let r = c.call("fs/readFile", json!({"path": uri(&file)})).await;
    assert_eq!(
        common::unb64(r["dataBase64"].as_str().unwrap()),
        b"from the gateway"
    );
    // The session ends (detached past detach_ttl), its link with it; the
    // executor dials the same URL
    // again (one registration) and is ready for the next session.
    drop(c);
    wait_readyz(&gw, "pool p: 1 executors, 1 idle links, 0 sessions").await;
    assert_eq!(
        metric(&gw, "exec_gateway_executor_registrations_total").await,
        1
    );
    let (mut c, _) = open(&gw).await;
    assert_eq!(echo(&mut c, "p2", &work, "again").await, "again\n");
    drop(c);
    // Killed: a new session waits, then fails naming the pool; a new
    // executor registers and serves.
    drop(codex);
    wait_readyz(&gw, "pool p: 0 executors").await;
    let mut c = gw.connect().await;
    let r = c
        .call_raw("initialize", json!({"clientName": "test"}))
        .await;
    assert_eq!(r["error"]["code"], -32007, "{r}");
    let codex = Codex::start(&bin, &gw.addr, "env-1");
    wait_readyz(&gw, "pool p: 1 executors, 1 idle links").await;
    let (mut c, _) = open(&gw).await;
    assert_eq!(echo(&mut c, "p3", &codex.work(), "back").await, "back\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bound_key_registers_only_its_executor_and_a_revoked_one_is_cut_off() {
    let Some(bin) = codex_169() else { return };
    let gw = Gateway::start_with(|d| config(d, Some("env-a"), ""));
    // Bound to env-a: as env-b it is refused, which the executor takes as
    // final.
    let mut other = Codex::start(&bin, &gw.addr, "env-b");
    let (status, err) = other.exit();
    assert!(!status.success());
    assert!(err.contains("403"), "{err}");
    let codex = Codex::start(&bin, &gw.addr, "env-a");
    wait_readyz(&gw, "pool p: 1 executors, 1 idle links").await;
    let (mut c, _) = open(&gw).await;
    assert_eq!(
        echo(&mut c, "p1", &codex.work(), "before").await,
        "before\n"
    );
    // Revoked while a session runs on it: the link ends at the reload,
    // the session's next call fails, and the executor's dial is refused.
    std::fs::write(gw.dir.path().join("revoked"), format!("key {KEY_ID}\n")).unwrap();
    gw.signal(1);
    let mut codex = codex;
    let (status, err) = codex.exit();
    assert!(!status.success(), "{err}");
    assert!(err.contains("403"), "{err}");
    let r = c.call_raw("process/list", json!({})).await;
    assert_eq!(r["error"]["code"], -32007, "{r}");
    wait_readyz(&gw, "pool p: 0 executors").await;
}

/// May's registry: a credential with `executor_id` registers only as it,
/// one whose `jti` is revoked not at all, and a live link ends when its
/// credential expires or is revoked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn executor_credentials_are_bound_expire_and_are_revoked_on_live_links() {
    let gw = Gateway::start_with(|d| config(d, None, ""));
    let token = |claims: Value| {
        jsonwebtoken::encode(
            &jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256),
            &claims,
            &jsonwebtoken::EncodingKey::from_secret(&gw.secret),
        )
        .unwrap()
    };
    let register = |id: &'static str, bearer: String| {
        let addr = gw.addr.clone();
        async move {
            let r = reqwest::Client::new()
                .post(format!("http://{addr}/cloud/executor/{id}/register"))
                .bearer_auth(bearer)
                .body("{}")
                .send()
                .await
                .unwrap();
            let status = r.status().as_u16();
            let text = r.text().await.unwrap_or_default();
            (
                status,
                serde_json::from_str::<Value>(&text).unwrap_or(Value::Null),
            )
        }
    };
    let bound = token(json!({"sub": "ci", "pool": "p", "scope": "executor",
                              "executor_id": "e1", "jti": "j-bound", "exp": now() + 3600}));
    let (status, e) = register("e2", bound.clone()).await;
    assert_eq!(
        (status, &e["error"]["code"]),
        (403, &json!("wrong_executor")),
        "{e}"
    );
    // A `jti` that is not text could never be revoked: refused.
    let numeric = token(json!({"sub": "ci", "pool": "p", "scope": "executor",
                                "jti": 5, "exp": now() + 3600}));
    assert_eq!(register("e2", numeric).await.0, 403);
    let (status, r) = register("e1", bound).await;
    assert_eq!(status, 200, "{r}");
    let (mut link, _) = tokio_tungstenite::connect_async(r["url"].as_str().unwrap())
        .await
        .unwrap();
    wait_readyz(&gw, "pool p: 1 executors, 1 idle links").await;
    // Revoked by jti: the live link is closed at the reload, and the
    // credential registers no more.
    std::fs::write(
        gw.dir.path().join("revoked"),
        "# stolen from e1\njti j-bound\n",
    )
    .unwrap();
    gw.signal(1);
    wait_closed(&mut link, "the revoked link stayed open").await;
    let again = token(json!({"sub": "ci", "pool": "p", "scope": "executor",
                              "jti": "j-bound", "exp": now() + 3600}));
    let (status, e) = register("e1", again).await;
    assert_eq!(
        (status, &e["error"]["code"]),
        (403, &json!("revoked")),
        "{e}"
    );
    // A credential that expires while its link is up: the link ends then.
    let short = token(json!({"sub": "ci", "pool": "p", "scope": "executor",
                              "jti": "j-short", "exp": now() + 3}));
    let (status, r) = register("e3", short).await;
    assert_eq!(status, 200, "{r}");
    let (mut link, _) = tokio_tungstenite::connect_async(r["url"].as_str().unwrap())
        .await
        .unwrap();
    wait_closed(&mut link, "the expired credential's link stayed open").await;
    wait_readyz(&gw, "pool p: 0 executors").await;
}

/// An access key removed from the configuration is cut off at the
/// reload, its live links included, as a revoked one is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_removed_by_a_reload_loses_its_links() {
    let gw = Gateway::start_with(|d| config(d, None, ""));
    let host = gw.addr.clone();
    let path = "/cloud/environment/env-2/direct/register";
    let body = br#"{"transport":"direct_jsonrpc_v1"}"#;
    let s = sign_as(KEY2_ID, "POST", path, &host, body, &amz_date(0), SECRET2);
    let (status, reg) = post_register(&gw.addr, "env-2", &s).await;
    assert_eq!(status, 200, "{reg}");
    let url = reg["url"].as_str().unwrap().to_owned();
    let s = sign_as(
        KEY2_ID,
        "GET",
        &target_of(&url),
        &host,
        b"",
        &amz_date(0),
        SECRET2,
    );
    let (status, ws) = dial(&url, &s).await;
    assert_eq!(status, 101);
    let mut link = ws.unwrap();
    wait_readyz(&gw, "pool p: 1 executors, 1 idle links").await;
    // The configuration without the second key, reloaded.
    let file = gw.dir.path().join("gateway.toml");
    let text = std::fs::read_to_string(&file).unwrap();
    let block = format!(
        "[[executors.pools.p.access_keys]]\nid = \"{KEY2_ID}\"\nsecret_file = \"{}/ak2.secret\"\n",
        gw.dir.path().display()
    );
    assert!(text.contains(&block), "{text}");
    std::fs::write(&file, text.replace(&block, "")).unwrap();
    gw.signal(1);
    wait_closed(&mut link, "the removed key's link stayed open").await;
    let s = sign_as(KEY2_ID, "POST", path, &host, body, &amz_date(1), SECRET2);
    assert_eq!(post_register(&gw.addr, "env-2", &s).await.0, 401);
    // The key that stayed still registers.
    let p1 = "/cloud/environment/env-1/direct/register";
    let s = sign("POST", p1, &host, body, &amz_date(1), SECRET);
    assert_eq!(post_register(&gw.addr, "env-1", &s).await.0, 200);
}
