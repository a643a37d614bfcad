//! Port forwarding over gRPC (`SessionService/ForwardPort`,
//! docs/forward.md): bytes both ways with an echo server in a session,
//! half-close, the refusals of the websocket door with their gRPC codes,
//! the end with the session; and a real protocol, Redis, through
//! `exec-gateway port-forward` with `redis-cli`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::process::{Command, Stdio};

use common::forward::gateway;
use common::grpc::{authed, channel};
use common::{Client, Gateway, mint};
use exec_gateway::transport::grpc::pb;
use pb::forward_port_request::Kind as Up;
use pb::forward_port_response::Kind as Down;
use serde_json::json;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

const SCOPES: &str = "exec fs:read fs:write forward";
/// The echo server's port, inside tenant `a`'s namespace.
const ECHO: u16 = 7000;

/// An echo server on 127.0.0.1:ECHO in a session of tenant `a`: each
/// connection gets back what it sends and, at its end of input,
/// `bye N\n` (N: the bytes it read) before the server closes it.
async fn echoing(gw: &Gateway) -> (Client, String) {
    let mut c = Client::connect(&gw.url, &mint(&gw.secret, "a", SCOPES)).await;
    let sid = c.initialize().await;
    let script = format!(
        "import socket, sys\n\
         s = socket.socket()\n\
         s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n\
         s.bind(('127.0.0.1', {ECHO}))\n\
         s.listen(16)\n\
         print('listening', flush=True)\n\
         while True:\n\
         \x20   c, _ = s.accept()\n\
         \x20   n = 0\n\
         \x20   while True:\n\
         \x20       d = c.recv(65536)\n\
         \x20       if not d:\n\
         \x20           break\n\
         \x20       n += len(d)\n\
         \x20       c.sendall(d)\n\
         \x20   c.sendall(b'bye %d\\n' % n)\n\
         \x20   c.close()\n"
    );
    let root = gw.dir.path().join("a");
    c.call(
        "process/start",
        json!({"processId": "echo", "argv": ["python3", "-c", script], "cwd": root,
               "env": {"PATH": "/usr/bin:/bin"}, "tty": false}),
    )
    .await;
    assert_eq!(c.first_line("echo").await, "listening");
    (c, sid)
}

/// A ForwardPort call: the requests' sender (its `open` sent) and the
/// responses, or the status it was refused with.
async fn forward(
    gw: &Gateway,
    token: &str,
    session: &str,
    port: u32,
) -> Result<
    (
        mpsc::Sender<pb::ForwardPortRequest>,
        tonic::Streaming<pb::ForwardPortResponse>,
    ),
    tonic::Status,
> {
    let mut client = pb::session_service_client::SessionServiceClient::new(channel(&gw.grpc).await);
    let (tx, rx) = mpsc::channel(4);
    tx.send(pb::ForwardPortRequest {
        kind: Some(Up::Open(pb::ForwardPortOpen {
            session_id: session.to_owned(),
            port,
        })),
    })
    .await
    .unwrap();
    let mut down = client
        .forward_port(authed(ReceiverStream::new(rx), token))
        .await?
        .into_inner();
    // The first response says the connection is made; a refusal is the
    // call's status instead.
    match down.message().await? {
        Some(pb::ForwardPortResponse {
            kind: Some(Down::Opened(o)),
        }) => assert_eq!(o.port, port),
        other => panic!("expected `opened`, got {other:?}"),
    }
    Ok((tx, down))
}

fn data(b: &[u8]) -> pb::ForwardPortRequest {
    pb::ForwardPortRequest {
        kind: Some(Up::Data(b.to_vec().into())),
    }
}

/// Every byte of the responses until the call ends, and how it ended.
async fn drain(down: &mut tonic::Streaming<pb::ForwardPortResponse>) -> (Vec<u8>, tonic::Status) {
    let mut got = Vec::new();
    loop {
        match down.message().await {
            Ok(Some(pb::ForwardPortResponse {
                kind: Some(Down::Data(b)),
            })) => {
                assert!(b.len() <= 64 << 10, "a chunk of {} bytes", b.len());
                got.extend_from_slice(&b);
            }
            Ok(Some(other)) => panic!("unexpected {other:?}"),
            Ok(None) => return (got, tonic::Status::ok("")),
            Err(s) => return (got, s),
        }
    }
}

#[tokio::test]
async fn forward_port_carries_bytes_both_ways_and_half_closes() {
    let Some(gw) = gateway() else {
        return;
    };
    let (_c, sid) = echoing(&gw).await;
    let token = mint(&gw.secret, "a", SCOPES);
    let (up, mut down) = forward(&gw, &token, &sid, u32::from(ECHO)).await.unwrap();
    // Small and full-sized messages; 200 KiB in all, more than one chunk
    // back.
    let mut sent = b"hello\n".to_vec();
    up.send(data(b"hello\n")).await.unwrap();
    for i in 0..3u8 {
        let chunk = vec![b'a' + i; 64 << 10];
        up.send(data(&chunk)).await.unwrap();
        sent.extend_from_slice(&chunk);
    }
    // The end of the requests is the server's end of input: it answers
    // `bye N` only after reading it, then closes, which ends the call OK.
    drop(up);
    let (got, status) = drain(&mut down).await;
    assert_eq!(status.code(), tonic::Code::Ok, "{status:?}");
    let mut want = sent.clone();
    want.extend_from_slice(format!("bye {}\n", sent.len()).as_bytes());
    assert_eq!(got.len(), want.len());
    assert!(got == want, "the bytes came back changed");

    // A message over 64 KiB ends the call, nothing of it passed on.
    let (up, mut down) = forward(&gw, &token, &sid, u32::from(ECHO)).await.unwrap();
    up.send(data(&vec![b'x'; (64 << 10) + 1])).await.unwrap();
    let (got, status) = drain(&mut down).await;
    assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status:?}");
    assert!(got.is_empty(), "{} bytes came back", got.len());

    // A second `open` is not data.
    let (up, mut down) = forward(&gw, &token, &sid, u32::from(ECHO)).await.unwrap();
    up.send(pb::ForwardPortRequest {
        kind: Some(Up::Open(pb::ForwardPortOpen {
            session_id: sid.clone(),
            port: 1,
        })),
    })
    .await
    .unwrap();
    let (_, status) = drain(&mut down).await;
    assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
}

#[tokio::test]
async fn forward_port_refuses_like_the_websocket_door() {
    let Some(gw) = gateway() else {
        return;
    };
    let (_c, sid) = echoing(&gw).await;
    let token = mint(&gw.secret, "a", SCOPES);
    let refused = |r: Result<_, tonic::Status>| match r {
        Ok(_) => panic!("not refused"),
        Err(s) => s,
    };

    // No `forward` scope.
    let unscoped = mint(&gw.secret, "a", "exec fs:read fs:write");
    let s = refused(forward(&gw, &unscoped, &sid, u32::from(ECHO)).await);
    assert_eq!(s.code(), tonic::Code::PermissionDenied, "{s:?}");
    // Another tenant's session is told exactly like an unknown one.
    let b = mint(&gw.secret, "b", SCOPES);
    let s = refused(forward(&gw, &b, &sid, u32::from(ECHO)).await);
    assert_eq!(s.code(), tonic::Code::NotFound, "{s:?}");
    assert_eq!(s.message(), format!("unknown session id {sid}"));
    let s = refused(forward(&gw, &token, "no-such-session", u32::from(ECHO)).await);
    assert_eq!(s.code(), tonic::Code::NotFound, "{s:?}");
    assert_eq!(s.message(), "unknown session id no-such-session");
    // Nothing listening: the host's own loopback is not the session's.
    let host = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    host.set_nonblocking(true).unwrap();
    let host_port = host.local_addr().unwrap().port();
    for port in [1, host_port] {
        let s = refused(forward(&gw, &token, &sid, u32::from(port)).await);
        assert_eq!(s.code(), tonic::Code::Unavailable, "{s:?}");
        assert!(
            s.message()
                .contains(&format!("nothing accepts connections on port {port}")),
            "{s:?}"
        );
    }
    assert!(host.accept().is_err(), "the host's listener was reached");
    for port in [0, 65536] {
        let s = refused(forward(&gw, &token, &sid, port).await);
        assert_eq!(s.code(), tonic::Code::InvalidArgument, "{s:?}");
    }
    // The first message must be `open`.
    let mut client = pb::session_service_client::SessionServiceClient::new(channel(&gw.grpc).await);
    let first = tokio_stream::iter([data(b"x")]);
    let Err(s) = client.forward_port(authed(first, &token)).await else {
        panic!("not refused");
    };
    assert_eq!(s.code(), tonic::Code::InvalidArgument, "{s:?}");

    // None of that held a stream: `max_streams = 2` open forwards are
    // allowed, a third is refused.
    let one = forward(&gw, &token, &sid, u32::from(ECHO)).await.unwrap();
    let _two = forward(&gw, &token, &sid, u32::from(ECHO)).await.unwrap();
    let s = refused(forward(&gw, &token, &sid, u32::from(ECHO)).await);
    assert_eq!(s.code(), tonic::Code::ResourceExhausted, "{s:?}");
    assert!(s.message().contains("streams"), "{s:?}");
    drop(one);
}

/// A forward ends with its session (UNAVAILABLE, "the session ended").
#[tokio::test]
async fn forward_port_ends_with_its_session() {
    let Some(gw) = gateway() else {
        return;
    };
    let (c, sid) = echoing(&gw).await;
    let token = mint(&gw.secret, "a", SCOPES);
    let (_up, mut down) = forward(&gw, &token, &sid, u32::from(ECHO)).await.unwrap();
    drop(c);
    let mut sessions =
        pb::session_service_client::SessionServiceClient::new(channel(&gw.grpc).await);
    sessions
        .close_session(authed(
            pb::CloseSessionRequest {
                session_id: sid.clone(),
            },
            &token,
        ))
        .await
        .unwrap();
    let (_, status) = drain(&mut down).await;
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
    assert_eq!(status.message(), "the session ended");
}

/// A tenant on the host's network has no namespace to forward into.
#[tokio::test]
async fn forward_port_needs_the_tenants_own_network() {
    let gw = Gateway::start_with(|d| {
        std::fs::create_dir_all(d.join("h")).unwrap();
        format!(
            "[[auth.keys]]\nalgorithm = \"HS256\"\nsecret_file = \"{d}/hs256.key\"\n\
             [isolation]\nnetwork = \"off\"\n\
             [tenants.h]\nroot = \"{d}/h\"\nnetwork = \"host\"\n",
            d = d.display(),
        )
    });
    let token = mint(&gw.secret, "h", SCOPES);
    let mut c = Client::connect(&gw.url, &token).await;
    let sid = c.initialize().await;
    let Err(s) = forward(&gw, &token, &sid, 80).await else {
        panic!("not refused");
    };
    assert_eq!(s.code(), tonic::Code::FailedPrecondition, "{s:?}");
    assert!(s.message().contains("network"), "{s:?}");
}

/// Redis in a session, `redis-cli` on the host through `exec-gateway
/// port-forward SESSION 0:6379`: a value set is read back.
#[tokio::test]
async fn redis_through_port_forward() {
    let Some(gw) = gateway() else {
        return;
    };
    for tool in ["redis-server", "redis-cli"] {
        if !std::path::Path::new("/usr/bin").join(tool).is_file() {
            eprintln!("skipped: `{tool}` is not installed (Debian package redis-server)");
            return;
        }
    }
    let token = mint(&gw.secret, "a", SCOPES);
    let mut c = Client::connect(&gw.url, &token).await;
    let sid = c.initialize().await;
    let root = gw.dir.path().join("a");
    c.call(
        "process/start",
        json!({"processId": "redis", "argv": ["redis-server", "--port", "6379",
               "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
               "--dir", root], "cwd": root, "env": {"PATH": "/usr/bin:/bin"}, "tty": false}),
    )
    .await;
    let mut log = String::new();
    while !log.contains("Ready to accept connections") {
        let v = c
            .wait_for("redis-server's log", |v| {
                v["method"] == "process/output" && v["params"]["processId"] == "redis"
            })
            .await;
        log.push_str(&String::from_utf8_lossy(&common::unb64(
            v["params"]["chunk"].as_str().unwrap(),
        )));
    }
    let mut child = Command::new(env!("CARGO_BIN_EXE_exec-gateway"))
        .args([
            "port-forward",
            "--url",
            &gw.url,
            "--token",
            &token,
            &sid,
            "0:6379",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(child.stdout.take().unwrap()),
        &mut line,
    )
    .unwrap();
    let local = line.trim().to_owned();
    let port = local.strip_prefix("127.0.0.1:").expect("a local address");
    let cli = |args: &[&str]| {
        let out = Command::new("redis-cli")
            .args(["-h", "127.0.0.1", "-p", port])
            .args(args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    };
    let value = format!("through the forward {}", std::process::id());
    assert_eq!(cli(&["SET", "greeting", &value]), "OK");
    assert_eq!(cli(&["GET", "greeting"]), value);
    // The value is the session's server's: read inside the session too.
    let (out, code) = c
        .sh(
            "get",
            root.to_str().unwrap(),
            "redis-cli -p 6379 GET greeting",
        )
        .await;
    assert_eq!(code, 0, "{out}");
    assert_eq!(out.trim(), value);
    let _ = child.kill();
    let _ = child.wait();
}
