//! `http/request` (with `http/request/bodyDelta`) performed inside the
//! tenant's network, in the egress world of tests/egress_names.rs: the
//! gateway in a network namespace of its own whose only way out is a veth to
//! an "outside" namespace holding dnsmasq (tests/egress_world) and the HTTP
//! and HTTPS servers of tests/http_world/servers.py at public test
//! addresses (allowed.test, other.test, a.cdn.test), with certificates of a
//! test CA; servers of the gateway's host on its loopback and its veth
//! address.
//!
//! - Against the official Codex 0.169.0 `exec-server`, run in the gateway's
//!   namespace (so it reaches what the tenant reaches): the same requests
//!   get the same results, errors and streams, but where the gateway
//!   differs on purpose (secrets for `valueEnvVar`, no env denylist, never
//!   the host's loopback).
//! - Only the tenant's network is reached: not the gateway's loopback,
//!   listeners or addresses, nor a private address its egress leaves out.
//! - Under `egress_names`, and with the tenant's secrets (bound to hosts,
//!   unseen by its processes and the audit trail, never the gateway's
//!   environment).
//!
//! Needs root, `ip`, `slirp4netns`, `nft`, `dnsmasq`, `openssl`, `curl`
//! and `python3` (and for the comparison .ci/.tools/codex/0.169.0, from
//! scripts/fetch-codex); skipped with the reason otherwise.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;
#[path = "egress_world/world.rs"]
mod world;

use std::io::BufRead as _;
use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;
use std::process::{Child, Command, Stdio};

use common::{Client, Gateway};
use serde_json::{Value, json};
use world::{World, enter, missing, resolved_world, scratch, serve_in};

const SERVERS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/http_world/servers.py");
/// The requests compared with the reference: `[what, params, the
/// reference's status or error code]`.
const CASES: &str = include_str!("http_world/cases.json");
/// Cases whose error text differs from the reference's in wording only.
const KNOWN_WORDING: &[&str] = &["a numeric requestId", "a negative timeoutMs"];
/// Servers of the gateway's host (its namespace): on its loopback only, and
/// on every address (its veth's is 198.51.100.2).
const LOOPBACK_PORT: u16 = 18777;
const ANY_PORT: u16 = 18778;
/// What both sides put after `value` for `valueEnvVar` `API_TOKEN`: the
/// reference from its environment, the gateway from the tenant's secret.
const TOKEN: &str = "tok-0169-same";

/// The namespaces, dnsmasq and the servers; removed on drop.
/// The egress tests' world (tests/egress_world/world.rs) with this
/// file's servers: HTTP and HTTPS in the outside namespace, and on the
/// gateway's host its loopback and every address.
fn world() -> World {
    let mut w = resolved_world();
    let pki = w.dir.path().join("pki");
    w.children
        .push(serve_in(&w.net, &[SERVERS, pki.to_str().unwrap()]));
    let (lo, any) = (
        format!("127.0.0.1:{LOOPBACK_PORT}"),
        format!("0.0.0.0:{ANY_PORT}"),
    );
    w.children.push(serve_in(&w.gw, &[SERVERS, "-", &lo, &any]));
    w
}

/// `argv` on the gateway's host, as root: a control.
fn host(w: &World, argv: &[&str]) -> std::process::Output {
    let mut cmd = Command::new("ip");
    cmd.args(["netns", "exec", &w.gw]).args(argv);
    cmd.output().unwrap()
}

fn secret_file(scratch: &Path, name: &str, value: &str) -> String {
    world::secret_file(scratch, name, value)
        .display()
        .to_string()
}

/// `[tenants.T.secrets.NAME]` bound to `hosts` (TOML array text).
fn secret_toml(tenant: &str, name: &str, file: &str, hosts: &str) -> String {
    format!("[tenants.{tenant}.secrets.{name}]\nfile = \"{file}\"\nhosts = {hosts}\n")
}

/// A gateway in the world's gateway namespace, `GW_ONLY` in its own
/// environment, one isolated tenant per `(name, toml)` rooted at
/// `scratch/name`; audited to `audit.jsonl` in its dir.
fn launch(w: &World, scratch: &Path, tenants: &[(&str, String)]) -> Gateway {
    enter(&w.gw);
    let bin = scratch.join("gateway-in-netns");
    let exe = env!("CARGO_BIN_EXE_exec-gateway");
    let script = format!(
        "#!/bin/sh\nexec env GW_ONLY=gateway-only-value ip netns exec {} {exe} \"$@\"\n",
        w.gw
    );
    std::fs::write(&bin, script).unwrap();
    std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
    let mut text = String::new();
    for (name, toml) in tenants {
        let root = scratch.join(name);
        std::fs::create_dir_all(&root).unwrap();
        text += &format!("[tenants.{name}]\nroot = \"{}\"\n{toml}\n", root.display());
    }
    Gateway::launch(&bin, None, &[], |dir| {
        format!(
            "[isolation]\nnetwork = \"required\"\n[audit]\nfile = \"{0}/audit.jsonl\"\n\
             [[auth.keys]]\nalgorithm = \"HS256\"\nsecret_file = \"{0}/hs256.key\"\n{text}",
            dir.display()
        )
    })
}

async fn session(gw: &Gateway, tenant: &str) -> Client {
    let mut c = Client::connect(&gw.url, &gw.token(tenant)).await;
    c.initialize().await;
    c
}

/// The official 0.169.0 exec-server in the gateway's namespace, with
/// `API_TOKEN`, an empty `EMPTY_VAR` and a denylisted `OPENAI_API_KEY` in
/// its environment, trusting the world's CA.
struct Reference {
    child: Child,
    url: String,
    _home: tempfile::TempDir,
}

impl Drop for Reference {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn reference(w: &World, bin: &Path) -> Reference {
    let home = tempfile::Builder::new()
        .prefix("codex-home-")
        .tempdir_in("/var/tmp")
        .unwrap();
    let mut child = Command::new("ip")
        .args(["netns", "exec", &w.gw])
        .arg(bin)
        .args(["exec-server", "--listen", "ws://127.0.0.1:0"])
        .env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .env("HOME", home.path())
        .env("CODEX_HOME", home.path())
        .env("SSL_CERT_FILE", w.ca())
        .env("API_TOKEN", TOKEN)
        .env("EMPTY_VAR", "")
        .env("OPENAI_API_KEY", "sk-reference-env")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("codex exec-server");
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let url = line.trim().to_owned();
    assert!(url.starts_with("ws://127.0.0.1:"), "codex printed {line:?}");
    Reference {
        child,
        url,
        _home: home,
    }
}

/// An initialized connection to the reference (no token, no session id).
async fn reference_client(url: &str) -> Client {
    let (ws, _) = tokio_tungstenite::connect_async(url).await.expect("codex");
    let mut c = Client::from_ws(ws);
    c.call("initialize", json!({"clientName": "test"})).await;
    c.send(&json!({"method": "initialized"})).await;
    c
}

/// What of a response is compared: the error; or the status, the headers
/// but `date` and `server`, and the body, an /echo body parsed by [`seen`].
fn shape(r: &Value) -> Value {
    if let Some(e) = r.get("error") {
        return json!({"error": {"code": e["code"], "message": e["message"]}});
    }
    let res = &r["result"];
    let headers: Vec<&Value> = res["headers"]
        .as_array()
        .unwrap_or_else(|| panic!("no headers in {r}"))
        .iter()
        .filter(|h| h["name"] != "date" && h["name"] != "server")
        .collect();
    let body = common::unb64(res["bodyBase64"].as_str().unwrap());
    let body = match serde_json::from_slice::<Value>(&body) {
        Ok(v) if v.get("headers").is_some() => seen(v),
        _ => json!(String::from_utf8_lossy(&body)),
    };
    json!({"status": res["status"], "headers": headers, "body": body})
}

/// An /echo body: `host` and `accept` are set apart (the reference sends
/// them after the caller's headers, the gateway before them: field order
/// across names carries no meaning, RFC 9110 5.3), every other header is
/// kept in the order the server saw it.
fn seen(mut v: Value) -> Value {
    let all = v["headers"].as_array().cloned().unwrap_or_default();
    let lower = |h: &Value| h[0].as_str().unwrap_or_default().to_ascii_lowercase();
    let (first, rest): (Vec<Value>, Vec<Value>) = all
        .into_iter()
        .partition(|h| matches!(lower(h).as_str(), "host" | "accept"));
    let of = |name: &str| -> Vec<Value> {
        let named = first.iter().filter(|h| lower(h) == name);
        named.map(|h| h[1].clone()).collect()
    };
    v["host"] = json!(of("host"));
    v["accept"] = json!(of("accept"));
    v["headers"] = json!(rest);
    v
}

/// The header `name` the /echo of `r` saw (values joined), if any.
fn echoed(r: &Value, name: &str) -> Option<String> {
    let body = common::unb64(r["result"]["bodyBase64"].as_str()?);
    let v: Value = serde_json::from_slice(&body).ok()?;
    let values: Vec<&str> = v["headers"]
        .as_array()?
        .iter()
        .filter(|h| h[0].as_str().is_some_and(|n| n.eq_ignore_ascii_case(name)))
        .filter_map(|h| h[1].as_str())
        .collect();
    (!values.is_empty()).then(|| values.join(","))
}

/// Which server answered an /echo (`server-10` ...).
fn server_of(r: &Value) -> String {
    let body = common::unb64(r["result"]["bodyBase64"].as_str().unwrap_or_default());
    let v: Value = serde_json::from_slice(&body).unwrap_or_default();
    v["server"].as_str().unwrap_or_default().to_owned()
}

fn get(url: &str, id: &str) -> Value {
    json!({"method": "GET", "url": url, "requestId": id})
}

/// `get` with `headers`.
fn with(url: &str, id: &str, headers: Value) -> Value {
    json!({"method": "GET", "url": url, "requestId": id, "headers": headers})
}

fn error_of(r: &Value) -> (i64, String) {
    let e = r
        .get("error")
        .unwrap_or_else(|| panic!("not an error: {r}"));
    let message = e["message"].as_str().unwrap_or_default().to_owned();
    (e["code"].as_i64().unwrap(), message)
}

/// The deltas of stream `id` until its `done`, checked as the reference
/// sends them (seq from 1, the last empty with `done`, `error` always
/// there); the body and the last `error`.
async fn deltas(c: &mut Client, id: &str) -> (String, Value) {
    let (mut body, mut seq) = (Vec::new(), 0);
    loop {
        let v = c
            .wait_for(&format!("a bodyDelta of {id}"), |v| {
                v["method"] == "http/request/bodyDelta" && v["params"]["requestId"] == id
            })
            .await;
        let p = &v["params"];
        seq += 1;
        assert_eq!(p["seq"], seq, "{v}");
        assert!(p.get("error").is_some(), "{v}");
        let data = common::unb64(p["deltaBase64"].as_str().unwrap());
        if p["done"] == true {
            assert!(data.is_empty(), "the last delta carries nothing: {v}");
            return (
                String::from_utf8_lossy(&body).into_owned(),
                p["error"].clone(),
            );
        }
        assert!(p["error"].is_null(), "{v}");
        body.extend(data);
    }
}

/// A streamed request's response, which comes before any of its deltas.
async fn stream_head(c: &mut Client, p: Value) -> Value {
    let id = p["requestId"].as_str().unwrap().to_owned();
    let n = c.request_id("http/request", p).await;
    let r = c.response(n).await;
    let early = c.pending.iter().any(|v| {
        v["method"] == "http/request/bodyDelta" && v["params"]["requestId"] == id.as_str()
    });
    assert!(!early, "a delta of {id} came before its response");
    shape(&r)
}

/// The streaming cases on one side (`side` keeps its held streams apart
/// from the other's on the shared server): what came, shaped.
async fn streams(c: &mut Client, side: &str) -> Vec<Value> {
    let a = "http://allowed.test";
    let mut out = Vec::new();
    let s1 = json!({"method": "GET", "url": format!("{a}/stream?n=3"),
                    "requestId": "s1", "streamResponse": true});
    out.push(stream_head(c, s1).await);
    let (body, error) = deltas(c, "s1").await;
    out.push(json!([body, error]));
    // While s2 is held open: the same id streamed again is refused; not
    // streamed, it is answered.
    let held = format!("{a}/stream?n=2&hold={side}-s2");
    let s2 = json!({"method": "GET", "url": held, "requestId": "s2", "streamResponse": true});
    out.push(stream_head(c, s2.clone()).await);
    out.push(shape(&c.call_raw("http/request", s2).await));
    let plain = get(&format!("{a}/status/201"), "s2");
    out.push(shape(&c.call_raw("http/request", plain).await));
    let release = get(&format!("{a}/release?k={side}-s2"), "r");
    out.push(shape(&c.call_raw("http/request", release).await));
    let (body, error) = deltas(c, "s2").await;
    out.push(json!([body, error]));
    // A stream that fails before its head frees its id.
    let refused = json!({"method": "GET", "url": "http://93.184.215.10:81/",
                         "requestId": "s3", "streamResponse": true});
    for _ in 0..2 {
        out.push(shape(&c.call_raw("http/request", refused.clone()).await));
    }
    // Past timeoutMs while the body is held: the stream ends in an error.
    let late = format!("{a}/stream?n=2&hold={side}-never");
    let s4 = json!({"method": "GET", "url": late, "requestId": "s4",
                    "streamResponse": true, "timeoutMs": 1000});
    out.push(stream_head(c, s4).await);
    let (body, error) = deltas(c, "s4").await;
    out.push(json!([body, error]));
    let s5 = json!({"method": "GET", "url": format!("{a}/status/204"),
                    "requestId": "s5", "streamResponse": true});
    out.push(stream_head(c, s5).await);
    out.push(json!(deltas(c, "s5").await));
    out
}

/// The tenant of the comparison: the internet, the world's CA, and
/// secrets named as the reference's environment variables.
fn compared_tenant(s: &Path, ca: &Path) -> String {
    let token = secret_file(s, "api_token", TOKEN);
    let empty = secret_file(s, "empty", "");
    let openai = secret_file(s, "openai", "sk-tenant-secret");
    let allowed = "[\"allowed.test\"]";
    format!(
        "egress = \"internet\"\nhttp_ca_file = \"{}\"\n{}{}{}",
        ca.display(),
        secret_toml("d", "API_TOKEN", &token, allowed),
        secret_toml("d", "EMPTY_VAR", &empty, allowed),
        secret_toml("d", "OPENAI_API_KEY", &openai, allowed),
    )
}

/// The same requests to the official 0.169.0 binary and to the gateway
/// get the same answers (but for the differences the gateway makes on
/// purpose, asserted on their own).
#[tokio::test]
async fn answers_as_the_official_binary_does() {
    if let Some(reason) = missing() {
        eprintln!("SKIPPED: {reason}");
        return;
    }
    let Some(codex) = common::direct::codex_169() else {
        eprintln!("SKIPPED: the official codex 0.169.0 binary is absent");
        return;
    };
    let w = world();
    let s = scratch();
    let gw = launch(&w, s.path(), &[("d", compared_tenant(s.path(), &w.ca()))]);
    let official = reference(&w, &codex);
    let mut r = reference_client(&official.url).await;
    let mut g = session(&gw, "d").await;

    // (what, params, the reference's status or error code). In
    // "valueEnvVar", `API_TOKEN` is (a) the reference's environment
    // variable and the gateway's tenant secret of that name: both send
    // `value` followed by it.
    let cases: Vec<(String, Value, i64)> = serde_json::from_str(CASES).unwrap();
    let mut differ = Vec::new();
    for (what, p, want) in &cases {
        let (rr, gr) = (
            r.call_raw("http/request", p.clone()).await,
            g.call_raw("http/request", p.clone()).await,
        );
        let got = rr["result"]["status"]
            .as_i64()
            .or_else(|| rr["error"]["code"].as_i64());
        assert_eq!(got, Some(*want), "the reference, {what}: {rr}");
        let (rs, gs) = (shape(&rr), shape(&gr));
        // Known, not http/request's: every method's params name a
        // mistyped number in serde's words (``integer `5` ``), where the
        // reference says `number` / `invalid number`. Same code.
        let wording_only =
            KNOWN_WORDING.contains(&what.as_str()) && rr["error"]["code"] == gr["error"]["code"];
        // Past `timeoutMs` before the head the reference answers by
        // whichever of its two timers of that length fires first (its own:
        // "route-aware request timed out"; its HTTP client's: "error
        // sending request"), so under load either; the gateway says the
        // second. Same code.
        let timer_race = what == "timeoutMs before the head"
            && rr["error"]["code"] == gr["error"]["code"]
            && rr["error"]["message"].as_str().is_some_and(|m| {
                m == "http/request failed: route-aware request timed out"
                    || m.starts_with("http/request failed: error sending request")
            });
        if rs != gs && !wording_only && !timer_race {
            differ.push(format!(
                "{what}:\n  sent      {p}\n  reference {rs}\n  gateway   {gs}"
            ));
        }
    }
    // What the world gave the reference, for the record.
    // (Secrets go over https only: the gateway's one difference there.)
    let echo = "https://allowed.test/echo";
    let env = |var: &str| {
        let h = json!([{"name": "X-Env", "value": "v:", "valueEnvVar": var}]);
        with(echo, "e", h)
    };
    let plain = r.call_raw("http/request", get(echo, "x")).await;
    assert_eq!(server_of(&plain), "server-10", "{plain}");
    let auth = r.call_raw("http/request", env("API_TOKEN")).await;
    assert_eq!(echoed(&auth, "x-env"), Some(format!("v:{TOKEN}")), "{auth}");

    let (rs, gs) = (streams(&mut r, "ref").await, streams(&mut g, "gw").await);
    assert_eq!(rs[1], json!(["chunk0;chunk1;chunk2;", null]), "{rs:?}");
    let active = "http/request streamResponse requestId `s2` is already active";
    assert_eq!(rs[3]["error"]["message"], active, "{rs:?}");
    assert_eq!(rs[7]["error"]["code"], -32603, "{rs:?}");
    assert_eq!(rs[10][1], "error decoding response body", "{rs:?}");
    for (i, (rv, gv)) in rs.iter().zip(&gs).enumerate() {
        if rv != gv {
            differ.push(format!(
                "stream step {i}:\n  reference {rv}\n  gateway   {gv}"
            ));
        }
    }

    // (b) The reference refuses its denylisted variables; a tenant's
    // secret of such a name is the operator's to give, and is sent.
    let p = env("OPENAI_API_KEY");
    let rr = r.call_raw("http/request", p.clone()).await;
    let denied =
        "http/request header X-Env cannot use executor environment variable OPENAI_API_KEY";
    assert_eq!(error_of(&rr), (-32602, denied.to_owned()), "{rr}");
    let gr = g.call_raw("http/request", p).await;
    let sent = echoed(&gr, "x-env");
    assert_eq!(sent.as_deref(), Some("v:sk-tenant-secret"), "{gr}");

    // (c) The reference reaches its host's loopback; the gateway never.
    let lo = get(&format!("http://127.0.0.1:{LOOPBACK_PORT}/echo"), "lo");
    let rr = r.call_raw("http/request", lo.clone()).await;
    assert_eq!(server_of(&rr), "extra", "{rr}");
    let gr = g.call_raw("http/request", lo).await;
    let failed = format!(
        "http/request failed: error sending request for url (http://127.0.0.1:{LOOPBACK_PORT}/echo)"
    );
    assert_eq!(error_of(&gr), (-32603, failed), "{gr}");

    assert!(
        differ.is_empty(),
        "{} differences from the reference:\n{}",
        differ.len(),
        differ.join("\n")
    );
}

/// The tenant's requests reach what its processes reach, never the
/// gateway's host: its loopback and listeners, its addresses, a private
/// address its egress leaves out (which another tenant's egress lists).
/// Such a tenant says `httpHeaderEnvVars`.
#[tokio::test]
async fn only_the_tenants_network_is_reached() {
    if let Some(reason) = missing() {
        eprintln!("SKIPPED: {reason}");
        return;
    }
    let w = world();
    let s = scratch();
    let gw = launch(
        &w,
        s.path(),
        &[
            ("d", "egress = \"internet\"".to_owned()),
            ("p", "egress = [\"10.77.0.1/32\"]".to_owned()),
        ],
    );
    let mut d = session(&gw, "d").await;
    let info = d.call("environment/info", json!({})).await;
    assert_eq!(info["capabilities"]["httpHeaderEnvVars"], true, "{info}");

    let targets = [
        format!("http://127.0.0.1:{LOOPBACK_PORT}/echo"),
        format!("http://{}/", gw.addr),
        format!("http://{}/metrics", gw.admin),
        format!("http://198.51.100.2:{ANY_PORT}/echo"),
        format!("http://10.0.2.2:{ANY_PORT}/echo"),
        "http://10.77.0.1:8080/echo".to_owned(),
    ];
    for url in &targets {
        // The control: the gateway's host reaches each (an HTTP answer),
        // but slirp's gateway address (the tenant's view of the host).
        if !url.contains("10.0.2.2") {
            let o = host(
                &w,
                &["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", url],
            );
            let code = String::from_utf8_lossy(&o.stdout).into_owned();
            assert_ne!(code, "000", "the host's control, {url}");
        }
        let r = d.call_raw("http/request", get(url, "x")).await;
        let failed = format!("http/request failed: error sending request for url ({url})");
        assert_eq!(error_of(&r), (-32603, failed), "{url}: {r}");
    }
    let mut p = session(&gw, "p").await;
    let r = p
        .call_raw("http/request", get("http://10.77.0.1:8080/echo", "x"))
        .await;
    assert_eq!(server_of(&r), "private", "{r}");
}

/// A tenant on the host's network (no namespace of its own) still has no
/// `http/request`, and says so in its capabilities.
#[tokio::test]
async fn a_tenant_on_the_hosts_network_is_refused() {
    let gw = Gateway::start_with(|dir| {
        format!(
            "[isolation]\nnetwork = \"off\"\n[[auth.keys]]\nalgorithm = \"HS256\"\n\
             secret_file = \"{}/hs256.key\"\n[tenants.h]\nroot = \"/\"\nnetwork = \"host\"\n",
            dir.display()
        )
    });
    let mut h = session(&gw, "h").await;
    let info = h.call("environment/info", json!({})).await;
    assert_eq!(info["capabilities"]["httpHeaderEnvVars"], false, "{info}");
    let r = h
        .call_raw("http/request", get("http://127.0.0.1:1/", "x"))
        .await;
    let disabled = "http/request is disabled on this gateway".to_owned();
    assert_eq!(error_of(&r), (-32003, disabled), "{r}");
}

/// Whether the trail holds a `kind` event of tenant `a` naming `name`.
fn audited(trail: &Path, kind: &str, name: &str) -> bool {
    let text = std::fs::read_to_string(trail).unwrap_or_default();
    text.lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .any(|e| e["event"] == kind && e["tenant"] == "a" && e["name"] == name)
}

/// Under `egress_names`: a listed name is reached over HTTPS (the
/// tenant's CA), another is not, both audited. A secret goes to the hosts
/// it is bound to only (a redirect elsewhere drops it; on the port it
/// names), never into the trail, the tenant's processes or their
/// environment; the gateway's own environment is not a secret.
#[tokio::test]
async fn names_and_secrets_decide_what_is_sent() {
    if let Some(reason) = missing() {
        eprintln!("SKIPPED: {reason}");
        return;
    }
    let w = world();
    let s = scratch();
    let value = "key-4c1d-secret-value";
    let file = secret_file(s.path(), "api_key", value);
    let tenant = format!(
        "egress_names = [\"allowed.test\", \"a.cdn.test\"]\nhttp_ca_file = \"{}\"\n{}{}",
        w.ca().display(),
        secret_toml("a", "API_KEY", &file, "[\"allowed.test\"]"),
        secret_toml("a", "TLS_ONLY", &file, "[\"allowed.test:443\"]"),
    );
    let gw = launch(&w, s.path(), &[("a", tenant)]);
    let mut a = session(&gw, "a").await;
    let info = a.call("environment/info", json!({})).await;
    assert_eq!(info["capabilities"]["httpHeaderEnvVars"], true, "{info}");

    let r = a
        .call_raw("http/request", get("https://allowed.test/echo", "x"))
        .await;
    assert_eq!(
        (r["result"]["status"].as_i64(), server_of(&r).as_str()),
        (Some(200), "server-10"),
        "{r}"
    );
    let other = "https://other.test/echo";
    let r = a.call_raw("http/request", get(other, "x")).await;
    let failed = format!("http/request failed: error sending request for url ({other})");
    assert_eq!(error_of(&r), (-32603, failed), "{r}");
    let trail = gw.dir.path().join("audit.jsonl");
    let deadline = tokio::time::Instant::now() + common::event_timeout();
    while !(audited(&trail, "egress.allowed", "allowed.test")
        && audited(&trail, "egress.denied", "other.test"))
    {
        let late = tokio::time::Instant::now() >= deadline;
        assert!(
            !late,
            "{}",
            std::fs::read_to_string(&trail).unwrap_or_default()
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert!(!audited(&trail, "egress.allowed", "other.test"));

    let key = |var: &str| {
        json!([{"name": "X-Api-Key", "value": "k:", "valueEnvVar": var},
                                 {"name": "X-Plain", "value": "p"}])
    };
    let r = a
        .call_raw(
            "http/request",
            with("https://allowed.test/echo", "s", key("API_KEY")),
        )
        .await;
    let sent = format!("k:{value}");
    assert_eq!(echoed(&r, "x-api-key"), Some(sent.clone()), "{r}");
    let r = a
        .call_raw(
            "http/request",
            with("https://a.cdn.test/echo", "s", key("API_KEY")),
        )
        .await;
    let refused = "http/request header X-Api-Key cannot use secret API_KEY for a.cdn.test: \
                   it is bound to allowed.test";
    assert_eq!(error_of(&r), (-32602, refused.to_owned()), "{r}");
    // A redirect to another allowed host drops the secret's header (not
    // the others); one to the same host keeps it.
    let away = "https://allowed.test/to?u=https://a.cdn.test/echo";
    let r = a
        .call_raw("http/request", with(away, "s", key("API_KEY")))
        .await;
    assert_eq!(server_of(&r), "server-12", "{r}");
    assert_eq!(echoed(&r, "x-api-key"), None, "{r}");
    assert_eq!(echoed(&r, "x-plain").as_deref(), Some("p"), "{r}");
    // ... and so does one from https down to http, even on its host.
    let down = "https://allowed.test/to?u=http://allowed.test/echo";
    let r = a
        .call_raw("http/request", with(down, "s", key("API_KEY")))
        .await;
    assert_eq!(server_of(&r), "server-10", "{r}");
    assert_eq!(echoed(&r, "x-api-key"), None, "{r}");
    // A secret goes over https only, and with a `Host` naming its URL's.
    let r = a
        .call_raw(
            "http/request",
            with("http://allowed.test/echo", "s", key("API_KEY")),
        )
        .await;
    let plain = "http/request header X-Api-Key sends secret API_KEY over https only";
    assert_eq!(error_of(&r), (-32602, plain.to_owned()), "{r}");
    let mut h = key("API_KEY");
    h.as_array_mut()
        .unwrap()
        .push(json!({"name": "Host", "value": "other.test"}));
    let r = a
        .call_raw("http/request", with("https://allowed.test/echo", "s", h))
        .await;
    let host = "http/request header Host must name allowed.test when a secret is sent";
    assert_eq!(error_of(&r), (-32602, host.to_owned()), "{r}");
    let here = "https://allowed.test/to?u=/echo";
    let r = a
        .call_raw("http/request", with(here, "s", key("API_KEY")))
        .await;
    assert_eq!(echoed(&r, "x-api-key"), Some(sent.clone()), "{r}");
    // The gateway's own environment is not a secret.
    let r = a
        .call_raw(
            "http/request",
            with("https://allowed.test/echo", "s", key("GW_ONLY")),
        )
        .await;
    let unknown = "http/request header X-Api-Key requires executor environment variable GW_ONLY";
    assert_eq!(error_of(&r), (-32602, unknown.to_owned()), "{r}");

    // The tenant's processes see neither the file nor the value (a 0.169
    // session, as http/request made it: its cwd is a URI).
    let root = format!("file://{}", s.path().join("a").display());
    for (id, argv) in [("cat", vec!["cat", file.as_str()]), ("env", vec!["env"])] {
        a.call(
            "process/start",
            json!({"processId": id, "argv": argv, "cwd": root, "tty": false,
                   "env": {"PATH": "/usr/bin:/bin"}}),
        )
        .await;
        let o = a.collect(id).await;
        let out = String::from_utf8_lossy(&o.stdout).into_owned();
        assert!(!out.contains(value), "{id}: {out}");
        if id == "cat" {
            assert_ne!(o.exit_code, Some(0), "the tenant read the secret's file");
        } else {
            assert_eq!(o.exit_code, Some(0), "env: {out}");
            assert!(!out.contains("API_KEY"), "env: {out}");
        }
    }
    let text = std::fs::read_to_string(&trail).unwrap();
    assert!(!text.contains(value), "the trail holds the secret's value");

    // A secret bound to allowed.test:443 is not sent to allowed.test:80
    // (in clear text), as a redirect there would drop it.
    let r = a
        .call_raw(
            "http/request",
            with("http://allowed.test/echo", "s", key("TLS_ONLY")),
        )
        .await;
    assert_eq!(echoed(&r, "x-api-key"), None, "sent to port 80: {r}");
    let (code, message) = error_of(&r);
    let prefix = "http/request header X-Api-Key cannot use secret TLS_ONLY for allowed.test";
    assert!(code == -32602 && message.starts_with(prefix), "{r}");
}
