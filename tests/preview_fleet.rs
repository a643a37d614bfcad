//! Previews through any replica of a fleet (docs/preview.md, "Fleet"): a
//! session of `gw-0` previewed through `gw-1`, by path with a token, by
//! host name with a signed URL and its cookie, on a public port and over
//! a websocket; its owner decides who may open it, and a revocation there
//! holds here. A server that closes its connection after each answer
//! (HTTP/1.0) answers every request of a client's kept connection, on the
//! owner and relayed.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::process::Command;

use common::{Client, mint};
use serde_json::{Value, json};

const SCOPES: &str = "exec fs:read fs:write preview";
const PORT: u16 = 8000;
const APP: &str = include_str!("preview_app/app.py");
const DOMAIN: &str = "preview.test";

/// curl on `addr` as `host`: status, the `set-cookie` header, body.
fn curl(
    addr: &str,
    host: Option<&str>,
    path: &str,
    args: &[&str],
) -> (u16, Option<String>, String) {
    let mut cmd = Command::new("curl");
    cmd.args(["-sS", "-i", "--max-time", "30"]);
    if let Some(h) = host {
        cmd.args(["-H", &format!("Host: {h}")]);
    }
    let out = cmd
        .args(args)
        .arg(format!("http://{addr}{path}"))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let cookie = head
        .lines()
        .find_map(|l| l.strip_prefix("set-cookie: "))
        .map(|c| c.split(';').next().unwrap().to_owned());
    (status, cookie, body.to_owned())
}

/// Two replicas and a session of tenant `a` on `gw-0` serving a port.
struct Setup {
    r: common::fleet::Replicas,
    token: String,
    c: Client,
    sid: String,
    _dirs: (tempfile::TempDir, tempfile::TempDir),
}

/// Two replicas whose tenants `a` and `b` have network namespaces of
/// their own, and a session of `a` on `gw-0` running `argv` in its root
/// (with `files` written there) until it listens on `port`; none where
/// this cannot run here (the reason printed).
async fn setup(files: &[(&str, &[u8])], argv: &[&str], port: u16) -> Option<Setup> {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: previews need network namespaces (root)");
        return None;
    }
    for tool in ["slirp4netns", "nft", "curl"] {
        if !["/usr/sbin", "/usr/bin"]
            .iter()
            .any(|d| std::path::Path::new(d).join(tool).is_file())
        {
            eprintln!("skipped: `{tool}` is not installed");
            return None;
        }
    }
    let keys = tempfile::tempdir().unwrap();
    let key = keys.path().join("preview.key");
    std::fs::write(&key, [0x42u8; 32]).unwrap();
    let roots = tempfile::tempdir().unwrap();
    for t in ["a", "b"] {
        std::fs::create_dir_all(roots.path().join(t)).unwrap();
    }
    let r = common::fleet::launch(2, |d| {
        format!(
            "[[auth.keys]]\nalgorithm = \"HS256\"\nsecret_file = \"{d}/hs256.key\"\n\
             [tenants.a]\nroot = \"{r}/a\"\n[tenants.b]\nroot = \"{r}/b\"\n\
             [preview]\nbase_url = \"http://{DOMAIN}\"\nkey_file = \"{k}\"\n",
            d = d.display(),
            r = roots.path().display(),
            k = key.display(),
        )
    });
    let token = mint(&r.secret, "a", SCOPES);
    let root = roots.path().join("a");
    for (name, bytes) in files {
        std::fs::write(root.join(name), bytes).unwrap();
    }
    let mut c = Client::connect(&r.replicas[0].as_ref().unwrap().url, &token).await;
    let sid = c.initialize().await;
    assert!(sid.starts_with("gw-0."), "{sid}");
    c.call(
        "process/start",
        json!({"processId": "app", "argv": argv, "cwd": root,
               "env": {"PATH": "/usr/bin:/bin"}, "tty": false}),
    )
    .await;
    let (out, code) = c
        .sh(
            "wait",
            root.to_str().unwrap(),
            &format!(
                "for i in $(seq 200); do python3 -c 'import socket; socket.create_connection((\"127.0.0.1\", {port}))' 2>/dev/null && exit 0; sleep 0.05; done; exit 1"
            ),
        )
        .await;
    assert_eq!(code, 0, "{out}");
    Some(Setup {
        r,
        token,
        c,
        sid,
        _dirs: (keys, roots),
    })
}

#[tokio::test]
async fn a_session_of_one_replica_is_previewed_through_another() {
    let port = PORT.to_string();
    let Some(s) = setup(
        &[("app.py", APP.as_bytes())],
        &["python3", "app.py", &port],
        PORT,
    )
    .await
    else {
        return;
    };
    let Setup {
        r,
        token,
        mut c,
        sid,
        _dirs,
    } = s;
    let gw1 = r.replicas[1].as_ref().unwrap();

    // By path with a token, through the other replica.
    let path = format!("/preview/{sid}/{PORT}/headers");
    let auth = format!("Authorization: Bearer {token}");
    let (status, _, body) = curl(&gw1.addr, None, &path, &["-H", &auth]);
    assert_eq!(status, 200, "{body}");
    let seen: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(seen["headers"]["x-exec-gateway-via"], "token");
    assert_eq!(seen["headers"]["x-exec-gateway-tenant"], "a");
    assert!(seen["headers"].get("authorization").is_none());
    // Two requests on one connection (the relayed connection kept).
    let out = Command::new("curl")
        .args(["-sS", "-H", &auth])
        .arg(format!("http://{}{path}", gw1.addr))
        .arg(format!("http://{}{path}", gw1.addr))
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout)
            .matches("\"x-exec-gateway-via\": \"token\"")
            .count(),
        2
    );
    // Another tenant's token: unknown, as on the owner; none: 401.
    let b = mint(&r.secret, "b", SCOPES);
    let (status, _, _) = curl(
        &gw1.addr,
        None,
        &path,
        &["-H", &format!("Authorization: Bearer {b}")],
    );
    assert_eq!(status, 404);
    let (status, _, _) = curl(&gw1.addr, None, &path, &[]);
    assert_eq!(status, 401);

    // A signed URL minted on the owner, exchanged and used on the other.
    let p = c
        .call("gateway/preview/create", json!({"port": PORT}))
        .await;
    let url = p["url"].as_str().unwrap();
    let rest = url.trim_start_matches("http://");
    let (host, grant_path) = rest.split_at(rest.find('/').unwrap());
    assert!(host.ends_with(&format!("-gw-0.{DOMAIN}")), "{host}");
    let (status, cookie, body) = curl(&gw1.addr, Some(host), grant_path, &[]);
    assert_eq!(status, 303, "{body}");
    let cookie = cookie.unwrap();
    let with_cookie = ["-H".to_owned(), format!("Cookie: {cookie}")];
    let args: Vec<&str> = with_cookie.iter().map(String::as_str).collect();
    let (status, _, body) = curl(&gw1.addr, Some(host), "/headers", &args);
    assert_eq!(status, 200, "{body}");
    let seen: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(seen["headers"]["x-exec-gateway-via"], "url");
    assert!(seen["headers"].get("cookie").is_none());
    // A websocket through the other replica.
    {
        use futures_util::{SinkExt as _, StreamExt as _};
        use tokio_tungstenite::tungstenite::Message;
        use tokio_tungstenite::tungstenite::client::IntoClientRequest as _;
        let mut req = format!("ws://{}/preview/{sid}/{PORT}/ws", gw1.addr)
            .into_client_request()
            .unwrap();
        req.headers_mut()
            .insert("authorization", auth[15..].parse().unwrap());
        let (mut ws, _) = tokio_tungstenite::connect_async(req).await.unwrap();
        ws.send(Message::Text("ping".into())).await.unwrap();
        let m = ws.next().await.unwrap().unwrap();
        assert_eq!(m.into_text().unwrap().as_str(), "pong:ping");
    }
    // A kept relayed connection checks each request's origin: a GET, then
    // a cross-origin POST with the same cookie on the same connection.
    {
        use std::io::{Read as _, Write as _};
        let mut t = std::net::TcpStream::connect(&gw1.addr).unwrap();
        write!(
            t,
            "GET /headers HTTP/1.1\r\nHost: {host}\r\nCookie: {cookie}\r\n\r\n\
             POST /upload HTTP/1.1\r\nHost: {host}\r\nCookie: {cookie}\r\n\
             Origin: http://evil.{DOMAIN}\r\nContent-Length: 1\r\nConnection: close\r\n\r\nx"
        )
        .unwrap();
        let mut answer = String::new();
        t.read_to_string(&mut answer).unwrap();
        let statuses: Vec<&str> = answer
            .match_indices("HTTP/1.1 ")
            .map(|(i, _)| &answer[i + 9..i + 12])
            .collect();
        assert_eq!(statuses, ["200", "403"], "{answer}");
    }
    // A host name naming a replica the fleet does not know is an unknown
    // session, never dialled.
    let stranger = host.replace("-gw-0.", "-gw-9.");
    let (status, _, _) = curl(&gw1.addr, Some(&stranger), "/headers", &args);
    assert_eq!(status, 401);
    // A port forward of gw-0's session through gw-1.
    {
        use futures_util::{SinkExt as _, StreamExt as _};
        use tokio_tungstenite::tungstenite::Message;
        use tokio_tungstenite::tungstenite::client::IntoClientRequest as _;
        let forward_token = mint(&r.secret, "a", "exec forward");
        let mut req = format!("ws://{}/forward/{sid}/{PORT}", gw1.addr)
            .into_client_request()
            .unwrap();
        req.headers_mut().insert(
            "authorization",
            format!("Bearer {forward_token}").parse().unwrap(),
        );
        let (mut ws, _) = tokio_tungstenite::connect_async(req).await.unwrap();
        ws.send(Message::Binary(
            b"GET /headers HTTP/1.0\r\nHost: x\r\n\r\n".to_vec().into(),
        ))
        .await
        .unwrap();
        let mut got = Vec::new();
        while let Some(Ok(m)) = ws.next().await {
            match m {
                Message::Binary(b) => got.extend_from_slice(&b),
                Message::Close(_) => break,
                _ => {}
            }
        }
        let got = String::from_utf8_lossy(&got);
        assert!(
            got.starts_with("HTTP/1.1 200") && got.ends_with("\"host\": \"x\"}}"),
            "{got}"
        );
        // Another tenant's token: unknown, as on the owner.
        let b_forward = mint(&r.secret, "b", "exec forward");
        let mut req = format!("ws://{}/forward/{sid}/{PORT}", gw1.addr)
            .into_client_request()
            .unwrap();
        req.headers_mut().insert(
            "authorization",
            format!("Bearer {b_forward}").parse().unwrap(),
        );
        match tokio_tungstenite::connect_async(req).await {
            Err(tokio_tungstenite::tungstenite::Error::Http(r)) => assert_eq!(r.status(), 404),
            other => panic!("another tenant's forward through gw-1: {other:?}"),
        }
    }
    // Revoked on the owner: a request waiting on its answer through the
    // other replica is told so (410), and later ones are refused there
    // too.
    until_open(&mut c, |n| n == 0).await;
    let waiting = Command::new("curl")
        .args([
            "-sS",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            "--max-time",
            "30",
        ])
        .args([
            "-H",
            &format!("Host: {host}"),
            "-H",
            &format!("Cookie: {cookie}"),
        ])
        .arg(format!("http://{}/hang", gw1.addr))
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    until_open(&mut c, |n| n == 1).await;
    c.call("gateway/preview/revoke", json!({"port": PORT}))
        .await;
    let out = waiting.wait_with_output().unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "410",
        "a request waiting through gw-1 when the owner revoked its URL"
    );
    let (status, _, body) = curl(&gw1.addr, Some(host), "/headers", &args);
    assert_eq!(status, 403, "{body}");
    // Public, then revoked.
    c.call(
        "gateway/preview/create",
        json!({"port": PORT, "public": true}),
    )
    .await;
    let (status, _, body) = curl(&gw1.addr, None, &path, &[]);
    assert_eq!(status, 200, "{body}");
    c.call("gateway/preview/revoke", json!({"port": PORT}))
        .await;
    let (status, _, _) = curl(&gw1.addr, None, &path, &[]);
    assert_eq!(status, 401);
}

/// Wait until the connections open into the session's ports are as
/// `want` says.
async fn until_open(c: &mut Client, want: impl Fn(u64) -> bool) {
    let mut open = 0;
    for _ in 0..500 {
        open = c.call("gateway/preview/list", json!({})).await["openConnections"]
            .as_u64()
            .unwrap();
        if want(open) {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    panic!("{open} connections open into the session's ports");
}

/// One answer read off a client connection: its status line and body
/// (framed by `Content-Length`, as the gateway frames a file's).
fn answer(t: &mut BufReader<std::net::TcpStream>, what: &str) -> (String, Vec<u8>) {
    let mut status = String::new();
    t.read_line(&mut status).unwrap();
    let mut len = None;
    loop {
        let mut line = String::new();
        t.read_line(&mut line).unwrap();
        if line.trim_end().is_empty() {
            break;
        }
        let (name, value) = line.split_once(':').unwrap();
        assert!(
            !(name.eq_ignore_ascii_case("connection") && value.contains("close")),
            "{what}: the gateway closes the client's connection"
        );
        if name.eq_ignore_ascii_case("content-length") {
            len = Some(value.trim().parse::<usize>().unwrap());
        }
    }
    let len = len.unwrap_or_else(|| panic!("{what}: no Content-Length ({status})"));
    let mut body = vec![0; len];
    t.read_exact(&mut body)
        .unwrap_or_else(|e| panic!("{what}: the body was cut: {e}"));
    (status.trim_end().to_owned(), body)
}

#[tokio::test]
async fn a_server_that_closes_after_each_answer_answers_every_request_of_a_kept_connection() {
    // Python's http.server speaks HTTP/1.0: it closes its connection after
    // each answer, while the client's connection to the gateway stays
    // open for the next request (a connection into the session each, on
    // the owner and relayed). A small answer races the close most; a
    // large one is read past it.
    const WEB: u16 = 8001;
    let big: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
    let small = b"small\n".to_vec();
    let port = WEB.to_string();
    let argv = ["python3", "-m", "http.server", &port, "--bind", "127.0.0.1"];
    let Some(s) = setup(&[("big.bin", &big), ("small.txt", &small)], &argv, WEB).await else {
        return;
    };
    for (name, i) in [("the owner", 0), ("another replica", 1)] {
        let addr = &s.r.replicas[i].as_ref().unwrap().addr;
        let t = std::net::TcpStream::connect(addr).unwrap();
        t.set_read_timeout(Some(std::time::Duration::from_secs(30)))
            .unwrap();
        let mut w = t.try_clone().unwrap();
        let mut t = BufReader::new(t);
        for n in 0..16 {
            let (file, want) = if n % 2 == 0 {
                ("small.txt", &small)
            } else {
                ("big.bin", &big)
            };
            write!(
                w,
                "GET /preview/{}/{WEB}/{file} HTTP/1.1\r\nHost: x\r\n\
                 Authorization: Bearer {}\r\n\r\n",
                s.sid, s.token
            )
            .unwrap();
            let what = format!("{name}, request {n} ({file})");
            let (status, body) = answer(&mut t, &what);
            assert_eq!(
                status,
                "HTTP/1.1 200 OK",
                "{what}: {}",
                String::from_utf8_lossy(&body[..body.len().min(200)])
            );
            assert!(
                body == *want,
                "{what}: {} bytes, not the file's {}",
                body.len(),
                want.len()
            );
        }
    }
}
