//! Port forwarding (docs/forward.md): a TCP stream to a port on a
//! session's own loopback, inside its tenant's network namespace, over the
//! websocket door and through `exec-gateway port-forward` with curl; and
//! what it never reaches: another tenant's session, the host's loopback,
//! the gateway's own listeners.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::io::{BufRead as _, Read as _, Write as _};
use std::process::{Command, Stdio};

use common::forward::gateway;
use common::{Client, Gateway, mint};
use futures_util::{SinkExt as _, StreamExt as _};
use serde_json::json;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest as _;

const SCOPES: &str = "exec fs:read fs:write forward";
/// The port the tenant's server listens on, inside its namespace.
const PORT: u16 = 8000;

/// A session of tenant `a` running an HTTP server on 127.0.0.1:PORT in
/// its namespace, serving its root (which holds `hello.txt`).
async fn serving(gw: &Gateway) -> (Client, String) {
    let root = gw.dir.path().join("a");
    std::fs::write(root.join("hello.txt"), "hello from inside\n").unwrap();
    let mut c = Client::connect(&gw.url, &mint(&gw.secret, "a", SCOPES)).await;
    let sid = c.initialize().await;
    c.call(
        "process/start",
        json!({"processId": "web", "argv": ["python3", "-m", "http.server", PORT.to_string(),
               "--bind", "127.0.0.1"], "cwd": root, "env": {"PATH": "/usr/bin:/bin"}, "tty": false}),
    )
    .await;
    // Listening once a shell in the same namespace connects.
    let (out, code) = c
        .sh(
            "wait",
            root.to_str().unwrap(),
            &format!(
                "for i in $(seq 200); do python3 -c 'import socket; socket.create_connection((\"127.0.0.1\", {PORT}))' 2>/dev/null && exit 0; sleep 0.05; done; exit 1"
            ),
        )
        .await;
    assert_eq!(code, 0, "the server did not listen: {out}");
    (c, sid)
}

/// The websocket handshake of a forward: the status it was refused with
/// and its body, or the stream.
async fn open(
    gw: &Gateway,
    token: &str,
    path: &str,
) -> Result<
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>,
    (u16, String),
> {
    let mut req = format!("{}{path}", gw.url).into_client_request().unwrap();
    req.headers_mut()
        .insert("authorization", format!("Bearer {token}").parse().unwrap());
    match tokio_tungstenite::connect_async(req).await {
        Ok((ws, _)) => Ok(ws),
        Err(tokio_tungstenite::tungstenite::Error::Http(r)) => Err((
            r.status().as_u16(),
            String::from_utf8_lossy(r.body().as_deref().unwrap_or_default()).into_owned(),
        )),
        Err(e) => panic!("{e}"),
    }
}

#[tokio::test]
async fn a_forward_reaches_the_sessions_server_and_nothing_else() {
    let Some(gw) = gateway() else {
        return;
    };
    let (_c, sid) = serving(&gw).await;
    let token = mint(&gw.secret, "a", SCOPES);

    // Over the websocket door: an HTTP request in, the answer out, then
    // the server's close ends the stream (1000).
    let mut ws = open(&gw, &token, &format!("/forward/{sid}/{PORT}"))
        .await
        .unwrap();
    ws.send(Message::Binary(
        b"GET /hello.txt HTTP/1.0\r\nHost: x\r\n\r\n"
            .to_vec()
            .into(),
    ))
    .await
    .unwrap();
    let mut answer = Vec::new();
    let mut closed = None;
    while let Some(m) = ws.next().await {
        match m.unwrap() {
            Message::Binary(b) => answer.extend_from_slice(&b),
            Message::Close(f) => {
                closed = f.map(|f| u16::from(f.code));
                break;
            }
            _ => {}
        }
    }
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.0 200"), "{answer}");
    assert!(answer.ends_with("hello from inside\n"), "{answer}");
    assert_eq!(closed, Some(1000));

    // What it must not reach, each told by its status.
    let host = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    host.set_nonblocking(true).unwrap();
    let host_port = host.local_addr().unwrap().port();
    let gw_port: u16 = gw.addr.rsplit(':').next().unwrap().parse().unwrap();
    let admin_port: u16 = gw.admin.rsplit(':').next().unwrap().parse().unwrap();
    for port in [host_port, gw_port, admin_port, 1] {
        let e = open(&gw, &token, &format!("/forward/{sid}/{port}"))
            .await
            .err()
            .unwrap();
        assert_eq!(e.0, 502, "port {port}: {}", e.1);
        assert!(
            e.1.contains(&format!("nothing accepts connections on port {port}")),
            "{}",
            e.1
        );
    }
    assert!(host.accept().is_err(), "the host's listener was reached");
    // Another tenant's session is unknown; a token without the scope, a
    // bad port, an unknown session are refused before anything is opened.
    let b = mint(&gw.secret, "b", SCOPES);
    let e = open(&gw, &b, &format!("/forward/{sid}/{PORT}"))
        .await
        .err()
        .unwrap();
    assert_eq!(e.0, 404, "{}", e.1);
    assert_eq!(e.1.trim(), format!("unknown session id {sid}"));
    let unscoped = mint(&gw.secret, "a", "exec fs:read fs:write");
    let e = open(&gw, &unscoped, &format!("/forward/{sid}/{PORT}"))
        .await
        .err()
        .unwrap();
    assert_eq!(e.0, 403, "{}", e.1);
    for (path, status) in [
        (format!("/forward/{sid}/0"), 400),
        (format!("/forward/{sid}/99999"), 400),
        (format!("/forward/{sid}"), 400),
        ("/forward/no-such-session/8000".to_owned(), 404),
    ] {
        let e = open(&gw, &token, &path).await.err().unwrap();
        assert_eq!(e.0, status, "{path}: {}", e.1);
    }
    // None of it used up the tenant's streams (`max_streams = 2`); two
    // open forwards do, and a third is refused until one closes.
    let path = format!("/forward/{sid}/{PORT}");
    let mut one = open(&gw, &token, &path).await.unwrap();
    let _two = open(&gw, &token, &path).await.unwrap();
    let e = open(&gw, &token, &path).await.err().unwrap();
    assert_eq!(e.0, 503, "{}", e.1);
    assert!(e.1.contains("max_streams"), "{}", e.1);
    one.close(None).await.unwrap();
    while one.next().await.is_some() {}
    let mut three = None;
    for _ in 0..200 {
        if let Ok(ws) = open(&gw, &token, &path).await {
            three = Some(ws);
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert!(three.is_some(), "a closed forward gives its stream back");
}

/// `exec-gateway port-forward` with curl as the client: two requests on
/// two connections through one local port.
#[tokio::test]
async fn port_forward_serves_curl_through_a_local_port() {
    let Some(gw) = gateway() else {
        return;
    };
    let (_c, sid) = serving(&gw).await;
    let token = mint(&gw.secret, "a", SCOPES);
    let mut child = Command::new(env!("CARGO_BIN_EXE_exec-gateway"))
        .args([
            "port-forward",
            "--url",
            &gw.url,
            "--token",
            &token,
            "--session",
            &sid,
        ])
        .arg(format!("0:{PORT}"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let local = line.trim().to_owned();
    assert!(local.starts_with("127.0.0.1:"), "{line:?}");
    for _ in 0..2 {
        let out = Command::new("curl")
            .args(["-sS", "--max-time", "30"])
            .arg(format!("http://{local}/hello.txt"))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(String::from_utf8_lossy(&out.stdout), "hello from inside\n");
    }
    // A raw client that half-closes still gets its answer.
    let mut s = std::net::TcpStream::connect(&local).unwrap();
    s.write_all(b"GET /hello.txt HTTP/1.0\r\n\r\n").unwrap();
    s.shutdown(std::net::Shutdown::Write).unwrap();
    let mut answer = String::new();
    s.read_to_string(&mut answer).unwrap();
    assert!(answer.ends_with("hello from inside\n"), "{answer}");
    let _ = child.kill();
    let _ = child.wait();

    // A port where nothing listens is refused at the start, with the
    // gateway's words and the client's exit code.
    let out = Command::new(env!("CARGO_BIN_EXE_exec-gateway"))
        .args([
            "port-forward",
            "--url",
            &gw.url,
            "--token",
            &token,
            "--session",
            &sid,
            "1",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(125));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("nothing accepts connections on port 1"),
        "{err}"
    );
}

/// A forward ends with its session (closed over gRPC here): its websocket
/// closes with 1001 "the session ended"; while it is open it keeps the
/// session alive.
#[tokio::test]
async fn a_forward_ends_with_its_session() {
    use common::grpc::authed;
    use exec_gateway::transport::grpc::pb;
    let Some(gw) = gateway() else {
        return;
    };
    let (c, sid) = serving(&gw).await;
    let token = mint(&gw.secret, "a", SCOPES);
    let mut ws = open(&gw, &token, &format!("/forward/{sid}/{PORT}"))
        .await
        .unwrap();
    drop(c);
    let mut sessions = pb::session_service_client::SessionServiceClient::new(
        common::grpc::channel(&gw.grpc).await,
    );
    sessions
        .close_session(authed(
            pb::CloseSessionRequest {
                session_id: sid.clone(),
            },
            &token,
        ))
        .await
        .unwrap();
    let mut closed = None;
    while let Some(m) = ws.next().await {
        if let Ok(Message::Close(f)) = m {
            closed = f.map(|f| (u16::from(f.code), f.reason.to_string()));
            break;
        }
    }
    assert_eq!(closed, Some((1001, "the session ended".to_owned())));
}

/// A forward holds no longer than its token (1008 at its expiry), and a
/// message over 64 KiB ends it with 1009 rather than passing on part of
/// it.
#[tokio::test]
async fn a_forward_ends_with_its_token_and_refuses_oversized_messages() {
    let Some(gw) = gateway() else {
        return;
    };
    let (_c, sid) = serving(&gw).await;
    let path = format!("/forward/{sid}/{PORT}");
    let short = jsonwebtoken::encode(
        &jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256),
        &json!({"sub": "t", "tenant": "a", "scope": SCOPES, "exp": common::now() + 2}),
        &jsonwebtoken::EncodingKey::from_secret(&gw.secret),
    )
    .unwrap();
    let mut ws = open(&gw, &short, &path).await.unwrap();
    assert_eq!(
        close_of(&mut ws).await,
        Some((1008, "token expired".to_owned()))
    );

    let token = mint(&gw.secret, "a", SCOPES);
    let mut ws = open(&gw, &token, &path).await.unwrap();
    ws.send(Message::Binary(vec![b'x'; (64 << 10) + 1].into()))
        .await
        .unwrap();
    assert_eq!(close_of(&mut ws).await.map(|c| c.0), Some(1009));
}

/// The close frame a forward ends with (its code and reason).
async fn close_of(
    ws: &mut tokio_tungstenite::WebSocketStream<
        tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>,
    >,
) -> Option<(u16, String)> {
    while let Some(m) = ws.next().await {
        match m {
            Ok(Message::Close(f)) => return f.map(|f| (u16::from(f.code), f.reason.to_string())),
            Ok(_) => {}
            Err(_) => return None,
        }
    }
    None
}
