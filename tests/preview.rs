//! Preview URLs (docs/preview.md): HTTP and websocket requests into a
//! port inside a session's network namespace, by path with a token and by
//! host name with a signed URL (exchanged for a cookie) or a public port;
//! with curl, Python's http.client and headless Chromium as the clients,
//! and what no preview reaches or lets through.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::process::Command;

use common::{Client, Gateway, mint};
use serde_json::{Value, json};

const SCOPES: &str = "exec fs:read fs:write preview";
/// The port the tenant's app listens on, inside its namespace.
const PORT: u16 = 8000;
const APP: &str = include_str!("preview_app/app.py");
const DOMAIN: &str = "preview.test";

/// Tenants `a` and `b`, each with a network namespace of its own, and
/// preview host names under `preview.test`; none where this cannot run
/// here (the reason printed).
fn gateway(extra: &str) -> Option<Gateway> {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: previews need network namespaces (root)");
        return None;
    }
    for (tool, package) in [
        ("slirp4netns", "slirp4netns"),
        ("nft", "nftables"),
        ("curl", "curl"),
    ] {
        if !["/usr/sbin", "/usr/bin", "/sbin", "/bin"]
            .iter()
            .any(|d| std::path::Path::new(d).join(tool).is_file())
        {
            eprintln!("skipped: `{tool}` is not installed (Debian package {package})");
            return None;
        }
    }
    let extra = extra.to_owned();
    Some(Gateway::start_with(move |d| {
        for t in ["a", "b"] {
            std::fs::create_dir_all(d.join(t)).unwrap();
        }
        format!(
            "[[auth.keys]]\nalgorithm = \"HS256\"\nsecret_file = \"{d}/hs256.key\"\n\
             [tenants.a]\nroot = \"{d}/a\"\n\
             [tenants.b]\nroot = \"{d}/b\"\n\
             [preview]\nbase_url = \"http://{DOMAIN}\"\n{timeout}{extra}",
            timeout = if extra.contains("response_timeout") {
                ""
            } else {
                "response_timeout = \"2s\"\n"
            },
            d = d.display(),
        )
    }))
}

/// A session of `tenant` running the test app on 127.0.0.1:PORT in its
/// namespace.
async fn serving(gw: &Gateway, tenant: &str) -> (Client, String) {
    let root = gw.dir.path().join(tenant);
    std::fs::write(root.join("app.py"), APP).unwrap();
    let mut c = Client::connect(&gw.url, &mint(&gw.secret, tenant, SCOPES)).await;
    let sid = c.initialize().await;
    c.call(
        "process/start",
        json!({"processId": "app", "argv": ["python3", "app.py", PORT.to_string()],
               "cwd": root, "env": {"PATH": "/usr/bin:/bin"}, "tty": false}),
    )
    .await;
    let (out, code) = c
        .sh(
            "wait",
            root.to_str().unwrap(),
            &format!(
                "for i in $(seq 200); do python3 -c 'import socket; socket.create_connection((\"127.0.0.1\", {PORT}))' 2>/dev/null && exit 0; sleep 0.05; done; exit 1"
            ),
        )
        .await;
    assert_eq!(code, 0, "the app did not listen: {out}");
    (c, sid)
}

/// An answer: status, headers (names lower case), body.
struct Answer {
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
}

impl Answer {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
    fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("{e}: {}", self.body))
    }
}

/// curl `path` on the gateway's client listener, as `host` if given,
/// with `args` added.
fn curl(gw: &Gateway, host: Option<&str>, path: &str, args: &[&str]) -> Answer {
    let mut cmd = Command::new("curl");
    cmd.args(["-sS", "-i", "--max-time", "60"]);
    if let Some(h) = host {
        cmd.args(["-H", &format!("Host: {h}")]);
    }
    cmd.args(args).arg(format!("http://{}{path}", gw.addr));
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "curl: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut text = String::from_utf8_lossy(&out.stdout).into_owned();
    while text.starts_with("HTTP/1.1 100") {
        text = text.split_once("\r\n\r\n").unwrap().1.to_owned();
    }
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    Answer {
        status,
        headers,
        body: body.to_owned(),
    }
}

fn bearer(token: &str) -> String {
    format!("Authorization: Bearer {token}")
}

/// The host name of a preview URL.
fn host_of(url: &str) -> String {
    url.trim_start_matches("http://")
        .split(['/', '?'])
        .next()
        .unwrap()
        .to_owned()
}

/// The path and query of a preview URL.
fn path_of(url: &str) -> String {
    let rest = url.trim_start_matches("http://");
    rest[rest.find('/').unwrap()..].to_owned()
}

#[tokio::test]
async fn a_path_preview_passes_a_token_holders_request_and_tells_the_app_who() {
    let Some(gw) = gateway("") else {
        return;
    };
    let (_c, sid) = serving(&gw, "a").await;
    let token = mint(&gw.secret, "a", SCOPES);
    let base = format!("/preview/{sid}/{PORT}");

    // The request arrives at the app's own path, with the gateway's
    // headers, not the client's, and without the gateway's token.
    let a = curl(
        &gw,
        None,
        &format!("{base}/headers?x=1"),
        &[
            "-H",
            &bearer(&token),
            "-H",
            "X-Exec-Gateway-Tenant: spoofed",
            "-H",
            "X-Forwarded-For: 6.6.6.6",
            "-H",
            "Cookie: app=1; exg_preview=stolen",
        ],
    );
    assert_eq!(a.status, 200, "{}", a.body);
    let seen = a.json();
    let h = &seen["headers"];
    assert_eq!(seen["path"], "/headers?x=1");
    assert_eq!(h["x-exec-gateway-via"], "token");
    assert_eq!(h["x-exec-gateway-tenant"], "a");
    assert_eq!(h["x-exec-gateway-subject"], "test");
    assert_eq!(h["x-forwarded-prefix"], base);
    assert_eq!(h["x-forwarded-for"], "127.0.0.1");
    assert_eq!(h["cookie"], "app=1");
    assert!(h.get("authorization").is_none(), "{h}");

    // Relative links resolve under the port's own path.
    let a = curl(&gw, None, &base, &["-H", &bearer(&token)]);
    assert_eq!(a.status, 308);
    assert_eq!(a.header("location"), Some(format!("{base}/").as_str()));

    // A body streams through whole (4 MiB, more than any buffer).
    let file = gw.dir.path().join("upload.bin");
    let data: Vec<u8> = (0..4u32 << 20).map(|i| (i * 7 % 251) as u8).collect();
    std::fs::write(&file, &data).unwrap();
    let a = curl(
        &gw,
        None,
        &format!("{base}/upload"),
        &[
            "-H",
            &bearer(&token),
            "--data-binary",
            &format!("@{}", file.display()),
        ],
    );
    use sha2::Digest as _;
    let want: String = sha2::Sha256::digest(&data)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    assert_eq!((a.status, a.body.as_str()), (200, want.as_str()));

    // Who may not: no credential, no scope, another tenant (like an
    // unknown session), a bad path.
    let a = curl(&gw, None, &format!("{base}/headers"), &[]);
    assert_eq!(a.status, 401, "{}", a.body);
    let unscoped = mint(&gw.secret, "a", "exec fs:read");
    let a = curl(
        &gw,
        None,
        &format!("{base}/headers"),
        &["-H", &bearer(&unscoped)],
    );
    assert_eq!(a.status, 403, "{}", a.body);
    let b = mint(&gw.secret, "b", SCOPES);
    let other = curl(&gw, None, &format!("{base}/headers"), &["-H", &bearer(&b)]);
    let unknown = curl(
        &gw,
        None,
        &format!("/preview/no-such-session/{PORT}/headers"),
        &["-H", &bearer(&b)],
    );
    assert_eq!((other.status, unknown.status), (404, 404));
    assert_eq!(other.body, unknown.body);
    let a = curl(
        &gw,
        None,
        &format!("/preview/{sid}/0/"),
        &["-H", &bearer(&token)],
    );
    assert_eq!(a.status, 400);
    // A query token is never taken (the app would see it).
    let a = curl(
        &gw,
        None,
        &format!("{base}/headers?access_token={token}"),
        &[],
    );
    assert_eq!(a.status, 401, "{}", a.body);
}

#[tokio::test]
async fn a_preview_reaches_only_the_sessions_own_ports() {
    let Some(gw) = gateway("") else {
        return;
    };
    let (_c, sid) = serving(&gw, "a").await;
    let token = mint(&gw.secret, "a", SCOPES);
    let host = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    host.set_nonblocking(true).unwrap();
    let host_port = host.local_addr().unwrap().port();
    let gw_port: u16 = gw.addr.rsplit(':').next().unwrap().parse().unwrap();
    let admin_port: u16 = gw.admin.rsplit(':').next().unwrap().parse().unwrap();
    // Tenant b's app listens on PORT in b's namespace: a's preview of
    // that port is a's own app, never b's.
    let (_cb, _sid_b) = serving(&gw, "b").await;
    for port in [host_port, gw_port, admin_port, 1] {
        let a = curl(
            &gw,
            None,
            &format!("/preview/{sid}/{port}/"),
            &["-H", &bearer(&token)],
        );
        assert_eq!(a.status, 502, "port {port}: {}", a.body);
    }
    assert!(host.accept().is_err(), "the host's listener was reached");
    // Slirp's gateway address and any other host are not a preview's to
    // name: the URL holds a port, never an address.
    let a = curl(
        &gw,
        None,
        &format!("/preview/{sid}/{PORT}/headers"),
        &["-H", &bearer(&token), "-H", "Host: 10.0.2.2:80"],
    );
    assert_eq!(a.status, 200);
    assert_eq!(a.json()["headers"]["x-exec-gateway-tenant"], "a");
}

/// gateway/preview/create over JSON-RPC.
async fn create(c: &mut Client, params: Value) -> Value {
    c.call("gateway/preview/create", params).await
}

#[tokio::test]
async fn a_signed_url_becomes_a_cookie_and_revocation_ends_it() {
    let Some(gw) = gateway("") else {
        return;
    };
    let (mut c, sid) = serving(&gw, "a").await;
    let p = create(&mut c, json!({"port": PORT})).await;
    let url = p["url"].as_str().unwrap().to_owned();
    assert!(url.contains(&format!(".{DOMAIN}/?exg_preview=")), "{url}");
    assert_eq!(p["path"], format!("/preview/{sid}/{PORT}/"));
    let host = host_of(&url);

    // First use: a 303 to the same URL without the grant, and the cookie.
    let a = curl(&gw, Some(&host), &path_of(&url), &[]);
    assert_eq!(a.status, 303, "{}", a.body);
    assert_eq!(a.header("location"), Some("/"));
    let set = a.header("set-cookie").unwrap().to_owned();
    assert!(set.starts_with("exg_preview="), "{set}");
    for attr in ["HttpOnly", "SameSite=Lax", "Path=/"] {
        assert!(set.contains(attr), "{set}");
    }
    assert!(!set.to_ascii_lowercase().contains("domain="), "{set}");
    let cookie = set.split(';').next().unwrap().to_owned();

    // Python's http.client with the cookie: the app is told the caller
    // came by URL, and never sees the cookie.
    let script = format!(
        "import http.client, json\n\
         c = http.client.HTTPConnection('{addr}')\n\
         c.request('GET', '/headers', headers={{'Host': '{host}', 'Cookie': '{cookie}; mine=2'}})\n\
         r = c.getresponse()\n\
         print(r.status, json.dumps(json.loads(r.read())['headers']))\n",
        addr = gw.addr
    );
    let out = Command::new("python3")
        .arg("-c")
        .arg(&script)
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&out.stdout);
    let (status, headers) = out.trim().split_once(' ').unwrap();
    assert_eq!(status, "200", "{out}");
    let h: Value = serde_json::from_str(headers).unwrap();
    assert_eq!(h["x-exec-gateway-via"], "url");
    assert_eq!(h["x-exec-gateway-subject"], "test");
    assert_eq!(h["cookie"], "mine=2");

    // What the app sets stays on its host name; it cannot set the
    // gateway's cookie.
    let a = curl(
        &gw,
        Some(&host),
        "/cookie",
        &["-H", &format!("Cookie: {cookie}")],
    );
    assert_eq!(a.status, 200);
    let sets: Vec<&str> = a
        .headers
        .iter()
        .filter(|(n, _)| n == "set-cookie")
        .map(|(_, v)| v.as_str())
        .collect();
    assert_eq!(sets, ["app=1; Path=/", "spaced=1; Path=/"]);

    // The grant of one port opens no other, nor another session.
    let other_port = host.replacen(&format!("{PORT}-"), "8001-", 1);
    let a = curl(
        &gw,
        Some(&other_port),
        "/headers",
        &["-H", &format!("Cookie: {cookie}")],
    );
    assert_eq!(a.status, 401, "{}", a.body);
    let grant = url.split("exg_preview=").nth(1).unwrap();
    let a = curl(
        &gw,
        Some(&other_port),
        &format!("/?exg_preview={grant}"),
        &[],
    );
    assert_eq!(a.status, 403, "{}", a.body);
    // A forged grant.
    let forged = format!("{}x", &grant[..grant.len() - 1]);
    let a = curl(&gw, Some(&host), &format!("/?exg_preview={forged}"), &[]);
    assert_eq!(a.status, 403, "{}", a.body);

    // Revoked: the cookie and the URL are refused from now on.
    let r = c
        .call("gateway/preview/revoke", json!({"port": PORT}))
        .await;
    assert_eq!(r, json!({}));
    let a = curl(
        &gw,
        Some(&host),
        "/headers",
        &["-H", &format!("Cookie: {cookie}")],
    );
    assert_eq!(a.status, 403, "{}", a.body);
    assert!(a.body.contains("revoked"), "{}", a.body);
    let a = curl(&gw, Some(&host), &path_of(&url), &[]);
    assert_eq!(a.status, 403, "{}", a.body);
    assert!(a.body.contains("revoked"), "{}", a.body);
    // A URL minted after the revocation works.
    let p = create(&mut c, json!({"port": PORT, "expiresInSecs": 60})).await;
    let a = curl(&gw, Some(&host), &path_of(p["url"].as_str().unwrap()), &[]);
    assert_eq!(a.status, 303, "{}", a.body);
    // Bounds of the call itself.
    let (code, msg) = c
        .call_err(
            "gateway/preview/create",
            json!({"port": PORT, "expiresInSecs": 999_999_999}),
        )
        .await;
    assert_eq!(code, -32602, "{msg}");
}

#[tokio::test]
async fn a_public_port_is_open_to_anyone_until_revoked() {
    let Some(gw) = gateway("") else {
        return;
    };
    let (mut c, sid) = serving(&gw, "a").await;
    let a = curl(&gw, None, &format!("/preview/{sid}/{PORT}/headers"), &[]);
    assert_eq!(a.status, 401);
    let p = create(&mut c, json!({"port": PORT, "public": true})).await;
    assert_eq!(p["public"], true);
    let host = host_of(p["url"].as_str().unwrap());
    // By path and by host name, with no credential; an Authorization
    // header is the app's own on a public port.
    let a = curl(
        &gw,
        None,
        &format!("/preview/{sid}/{PORT}/headers"),
        &["-H", "Authorization: Basic YXBwOmFwcA=="],
    );
    assert_eq!(a.status, 200, "{}", a.body);
    assert_eq!(a.json()["headers"]["x-exec-gateway-via"], "public");
    assert_eq!(a.json()["headers"]["authorization"], "Basic YXBwOmFwcA==");
    assert!(a.json()["headers"].get("x-exec-gateway-tenant").is_none());
    let a = curl(&gw, Some(&host), "/headers", &[]);
    assert_eq!(a.status, 200, "{}", a.body);
    let listed = c.call("gateway/preview/list", json!({})).await;
    assert_eq!(listed["ports"], json!([{"port": PORT, "public": true}]));
    c.call("gateway/preview/revoke", json!({"port": PORT}))
        .await;
    let a = curl(&gw, Some(&host), "/headers", &[]);
    assert_eq!(a.status, 401, "{}", a.body);
}

#[tokio::test]
async fn a_server_that_never_answers_hurts_nobody_else() {
    let Some(gw) = gateway("max_connections_per_session = 2\nresponse_timeout = \"6s\"\n") else {
        return;
    };
    let (mut c, sid) = serving(&gw, "a").await;
    let (_cb, sid_b) = serving(&gw, "b").await;
    let token = mint(&gw.secret, "a", SCOPES);
    let token_b = mint(&gw.secret, "b", SCOPES);
    // Two requests that hang hold a's two connections; a third is
    // refused, and b is served meanwhile.
    let hang = |gw: &Gateway| {
        let url = format!("http://{}/preview/{sid}/{PORT}/hang", gw.addr);
        let auth = bearer(&token);
        std::thread::spawn(move || {
            Command::new("curl")
                .args([
                    "-sS",
                    "-o",
                    "/dev/null",
                    "-w",
                    "%{http_code}",
                    "-H",
                    &auth,
                    &url,
                ])
                .output()
                .unwrap()
        })
    };
    let h1 = hang(&gw);
    let h2 = hang(&gw);
    loop {
        let listed = c.call("gateway/preview/list", json!({})).await;
        if listed["openConnections"] == 2 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    let a = curl(
        &gw,
        None,
        &format!("/preview/{sid}/{PORT}/headers"),
        &["-H", &bearer(&token)],
    );
    assert_eq!(a.status, 503, "{}", a.body);
    assert!(a.body.contains("max_connections_per_session"), "{}", a.body);
    let b = curl(
        &gw,
        None,
        &format!("/preview/{sid_b}/{PORT}/headers"),
        &["-H", &bearer(&token_b)],
    );
    assert_eq!(b.status, 200, "{}", b.body);
    // The hung requests end with 504 at `response_timeout`.
    for h in [h1, h2] {
        let out = h.join().unwrap();
        assert_eq!(String::from_utf8_lossy(&out.stdout), "504");
    }
}

/// Headless Chromium, if installed.
fn chromium() -> Option<&'static str> {
    let path = "/usr/bin/chromium";
    if std::path::Path::new(path).is_file() {
        Some(path)
    } else {
        eprintln!("skipped: headless Chromium is not installed (Debian package chromium)");
        None
    }
}

/// What Chromium rendered of `url`, with every preview host name
/// resolved to the gateway.
fn render(browser: &str, gw: &Gateway, url: &str) -> String {
    let profile = tempfile::tempdir().unwrap();
    let out = Command::new(browser)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            &format!("--user-data-dir={}", profile.path().display()),
            &format!("--host-resolver-rules=MAP *.{DOMAIN} {}", gw.addr),
            "--virtual-time-budget=10000",
            "--dump-dom",
            url,
        ])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[tokio::test]
async fn chromium_renders_an_app_through_a_signed_preview_url() {
    let Some(browser) = chromium() else {
        return;
    };
    let Some(gw) = gateway("") else {
        return;
    };
    let (mut c, _sid) = serving(&gw, "a").await;
    let (mut cb, _sid_b) = serving(&gw, "b").await;
    let p = create(&mut c, json!({"port": PORT})).await;
    let url = p["url"].as_str().unwrap().to_owned();
    // The page, its script, a fetch and a websocket back to the app, all
    // through the preview once the URL became a cookie.
    let dom = render(browser, &gw, &url);
    assert!(
        dom.contains("rendered via=url ws=pong:ping"),
        "the page did not render: {dom}"
    );
    // Another session's grant on this session's host name is refused,
    // in the browser too.
    let pb = create(&mut cb, json!({"port": PORT})).await;
    let grant_b = pb["url"]
        .as_str()
        .unwrap()
        .split("exg_preview=")
        .nth(1)
        .unwrap()
        .to_owned();
    let wrong = format!("http://{}/?exg_preview={grant_b}", host_of(&url));
    let dom = render(browser, &gw, &wrong);
    assert!(dom.contains("another session or port"), "{dom}");
    assert!(!dom.contains("rendered"), "{dom}");
    // An expired URL is refused.
    let short = create(&mut c, json!({"port": PORT, "expiresInSecs": 1})).await;
    std::thread::sleep(std::time::Duration::from_millis(2100));
    let dom = render(browser, &gw, short["url"].as_str().unwrap());
    assert!(dom.contains("invalid or has expired"), "{dom}");
}

#[tokio::test]
async fn a_websocket_upgrade_passes_through_and_a_revocation_ends_it() {
    use futures_util::{SinkExt as _, StreamExt as _};
    use tokio_tungstenite::tungstenite::Message;
    use tokio_tungstenite::tungstenite::client::IntoClientRequest as _;
    let Some(gw) = gateway("") else {
        return;
    };
    let (mut c, sid) = serving(&gw, "a").await;
    let token = mint(&gw.secret, "a", SCOPES);
    let url = format!("{}/preview/{sid}/{PORT}/ws", gw.url);
    let mut req = url.as_str().into_client_request().unwrap();
    req.headers_mut()
        .insert("authorization", format!("Bearer {token}").parse().unwrap());
    // A browser's Origin is the app's business, not the gateway's.
    req.headers_mut()
        .insert("origin", "http://elsewhere.example".parse().unwrap());
    let (mut ws, _) = tokio_tungstenite::connect_async(req).await.unwrap();
    ws.send(Message::Text("ping".into())).await.unwrap();
    let m = ws.next().await.unwrap().unwrap();
    assert_eq!(m.into_text().unwrap().as_str(), "pong:ping");

    // Public: anyone's websocket, until the port is revoked, which ends
    // it; a token holder's stays (its token still holds).
    create(&mut c, json!({"port": PORT, "public": true})).await;
    let (mut anon, _) = tokio_tungstenite::connect_async(url.as_str())
        .await
        .unwrap();
    anon.send(Message::Text("hi".into())).await.unwrap();
    let m = anon.next().await.unwrap().unwrap();
    assert_eq!(m.into_text().unwrap().as_str(), "pong:hi");
    c.call("gateway/preview/revoke", json!({"port": PORT}))
        .await;
    match anon.next().await {
        None | Some(Err(_)) | Some(Ok(Message::Close(_))) => {}
        Some(Ok(m)) => panic!("after the revocation: {m:?}"),
    }
    ws.send(Message::Text("again".into())).await.unwrap();
    let m = ws.next().await.unwrap().unwrap();
    assert_eq!(m.into_text().unwrap().as_str(), "pong:again");
    let e = tokio_tungstenite::connect_async(url.as_str())
        .await
        .err()
        .unwrap();
    assert!(
        matches!(&e, tokio_tungstenite::tungstenite::Error::Http(r) if r.status() == 401),
        "{e}"
    );
}

#[tokio::test]
async fn previews_are_minted_and_revoked_over_grpc_too() {
    use common::grpc::{authed, channel};
    use exec_gateway::transport::grpc::pb;
    let Some(gw) = gateway("") else {
        return;
    };
    let (_c, sid) = serving(&gw, "a").await;
    let token = mint(&gw.secret, "a", SCOPES);
    let mut s = pb::session_service_client::SessionServiceClient::new(channel(&gw.grpc).await);
    let p = s
        .create_preview(authed(
            pb::CreatePreviewRequest {
                session_id: sid.clone(),
                port: u32::from(PORT),
                public: false,
                expires_in_secs: 60,
            },
            &token,
        ))
        .await
        .unwrap()
        .into_inner()
        .preview
        .unwrap();
    assert_eq!(p.path, format!("/preview/{sid}/{PORT}/"));
    assert!(p.expires_at_ms > 0);
    let a = curl(&gw, Some(&host_of(&p.url)), &path_of(&p.url), &[]);
    assert_eq!(a.status, 303, "{}", a.body);
    // Another tenant's session is unknown; the scope is needed.
    let b = mint(&gw.secret, "b", SCOPES);
    let e = s
        .list_previews(authed(
            pb::ListPreviewsRequest {
                session_id: sid.clone(),
            },
            &b,
        ))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::NotFound, "{e}");
    let unscoped = mint(&gw.secret, "a", "exec");
    let e = s
        .revoke_preview(authed(
            pb::RevokePreviewRequest {
                session_id: sid.clone(),
                port: u32::from(PORT),
            },
            &unscoped,
        ))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e}");
    s.revoke_preview(authed(
        pb::RevokePreviewRequest {
            session_id: sid.clone(),
            port: u32::from(PORT),
        },
        &token,
    ))
    .await
    .unwrap();
    let a = curl(&gw, Some(&host_of(&p.url)), &path_of(&p.url), &[]);
    assert_eq!(a.status, 403, "{}", a.body);
    let e = s
        .create_preview(authed(
            pb::CreatePreviewRequest {
                session_id: sid,
                port: 70_000,
                public: true,
                expires_in_secs: 0,
            },
            &token,
        ))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e}");
}

#[tokio::test]
async fn a_hostile_page_or_client_cannot_borrow_a_preview() {
    let Some(gw) = gateway("") else {
        return;
    };
    let (mut c, sid) = serving(&gw, "a").await;
    let p = create(&mut c, json!({"port": PORT})).await;
    let url = p["url"].as_str().unwrap().to_owned();
    let host = host_of(&url);
    let a = curl(&gw, Some(&host), &path_of(&url), &[]);
    let cookie = a
        .header("set-cookie")
        .unwrap()
        .split(';')
        .next()
        .unwrap()
        .to_owned();
    let own = format!("http://{host}");

    // Another preview's page (the same site to a browser) cannot open a
    // websocket or post with the cookie; the preview's own page can.
    let ws = |origin: &str| {
        curl(
            &gw,
            Some(&host),
            "/ws",
            &[
                "-H",
                &format!("Cookie: {cookie}"),
                "-H",
                &format!("Origin: {origin}"),
                "-H",
                "Connection: Upgrade",
                "-H",
                "Upgrade: websocket",
                "-H",
                "Sec-WebSocket-Version: 13",
                "-H",
                "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==",
                "--max-time",
                "5",
            ],
        )
    };
    let evil = ws(&format!("http://8000-{}.{DOMAIN}", "0".repeat(32)));
    assert_eq!(evil.status, 403, "{}", evil.body);
    let post = curl(
        &gw,
        Some(&host),
        "/upload",
        &[
            "-H",
            &format!("Cookie: {cookie}"),
            "-H",
            "Origin: http://evil.example",
            "--data",
            "x",
        ],
    );
    assert_eq!(post.status, 403, "{}", post.body);
    let post = curl(
        &gw,
        Some(&host),
        "/upload",
        &[
            "-H",
            &format!("Cookie: {cookie}"),
            "-H",
            &format!("Origin: {own}"),
            "--data",
            "x",
        ],
    );
    assert_eq!(post.status, 200, "{}", post.body);

    // A planted cookie before the real one does not lock the user out.
    let a = curl(
        &gw,
        Some(&host),
        "/headers",
        &["-H", &format!("Cookie: exg_preview=junk; {cookie}")],
    );
    assert_eq!(a.status, 200, "{}", a.body);

    // Headers spelled with `_` (one name to CGI and WSGI servers) are
    // dropped like the `-` spellings.
    let a = curl(
        &gw,
        Some(&host),
        "/headers",
        &[
            "-H",
            &format!("Cookie: {cookie}"),
            "-H",
            "X-Exec-Gateway_Tenant: spoofed",
            "-H",
            "X_Forwarded_For: 6.6.6.6",
        ],
    );
    let h = &a.json()["headers"];
    let spoofed: Vec<&String> = h
        .as_object()
        .unwrap()
        .iter()
        .filter(|(_, v)| {
            v.as_str()
                .is_some_and(|v| v.contains("spoofed") || v.contains("6.6.6.6"))
        })
        .map(|(k, _)| k)
        .collect();
    assert!(spoofed.is_empty(), "{h}");

    // Two Host headers, a port with a leading zero, a replica part outside
    // a fleet: refused.
    {
        use std::io::{Read as _, Write as _};
        let mut t = std::net::TcpStream::connect(&gw.addr).unwrap();
        write!(
            t,
            "GET /headers HTTP/1.1\r\nHost: {host}\r\nHost: other\r\nCookie: {cookie}\r\nConnection: close\r\n\r\n"
        )
        .unwrap();
        let mut answer = String::new();
        t.read_to_string(&mut answer).unwrap();
        assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
    }
    let token = mint(&gw.secret, "a", SCOPES);
    let a = curl(
        &gw,
        None,
        &format!("/preview/{sid}/0{PORT}/headers"),
        &["-H", &bearer(&token)],
    );
    assert_eq!(a.status, 400, "{}", a.body);
    let a = curl(
        &gw,
        Some(&host.replacen(&format!(".{DOMAIN}"), &format!("-x.{DOMAIN}"), 1)),
        "/",
        &[],
    );
    assert_eq!(a.status, 400, "{}", a.body);
    // The exchange never redirects to another site.
    let grant = url.split("exg_preview=").nth(1).unwrap();
    let a = curl(
        &gw,
        Some(&host),
        &format!("//evil.example/x?exg_preview={grant}"),
        &[],
    );
    assert_eq!(a.status, 303, "{}", a.body);
    assert_eq!(a.header("location"), Some("/evil.example/x"));

    // A GET with a body (which the app would read as a next request with
    // headers of the client's choosing) and a backslash redirect: refused.
    let a = curl(
        &gw,
        Some(&host),
        "/headers",
        &[
            "-H",
            &format!("Cookie: {cookie}"),
            "-X",
            "GET",
            "--data",
            "GET /x HTTP/1.1",
        ],
    );
    assert_eq!(a.status, 400, "{}", a.body);
    let a = curl(
        &gw,
        Some(&host),
        &format!("/%5Cevil.example/?exg_preview={grant}"),
        &[],
    );
    assert_ne!(a.header("location"), Some("/\\evil.example/"));
    {
        use std::io::{Read as _, Write as _};
        let mut t = std::net::TcpStream::connect(&gw.addr).unwrap();
        write!(
            t,
            "GET /\\evil.example/?exg_preview={grant} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
        )
        .unwrap();
        let mut answer = String::new();
        t.read_to_string(&mut answer).unwrap();
        assert!(!answer.contains("location: /\\"), "{answer}");
    }

    // On a public port, an Authorization the gateway does not know is the
    // app's own, passed on.
    create(&mut c, json!({"port": PORT, "public": true})).await;
    let a = curl(
        &gw,
        None,
        &format!("/preview/{sid}/{PORT}/headers"),
        &["-H", "Authorization: Bearer app-own-token"],
    );
    assert_eq!(a.status, 200, "{}", a.body);
    assert_eq!(a.json()["headers"]["authorization"], "Bearer app-own-token");
    assert_eq!(a.json()["headers"]["x-exec-gateway-via"], "public");
}
