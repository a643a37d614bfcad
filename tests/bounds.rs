//! Bounded against anyone: what a tenant, or a client that never
//! authenticates, can make the gateway hold. Memory claims are read from
//! the gateway's own accounting (`exec_gateway_outbound_bytes*`), never
//! from timing.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::disallowed_methods
)]

mod common;

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use common::{EVENT_TIMEOUT, Gateway, metric, scratch, serve_expecting_refusal, write_file};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpSocket, TcpStream};

/// A gateway whose one tenant, `t1` (host-rooted), has `settings`.
fn t1_with(settings: &str) -> Gateway {
    Gateway::start_with(|d| {
        format!(
            "[[auth.keys]]\nalgorithm = \"HS256\"\nsecret_file = \"{}/hs256.key\"\n\
             [tenants.t1]\nroot = \"/\"\n{settings}",
            d.display()
        )
    })
}

async fn admin_metric(gw: &Gateway, name: &str, labels: &str) -> Option<f64> {
    gw.metric(name, labels).await
}

/// A TCP connection from `source` (any 127/8 address is this host).
async fn connect_from(source: &str, to: &str) -> TcpStream {
    let sock = TcpSocket::new_v4().unwrap();
    sock.bind(format!("{source}:0").parse().unwrap()).unwrap();
    let to: SocketAddr = to.parse().unwrap();
    tokio::time::timeout(EVENT_TIMEOUT, sock.connect(to))
        .await
        .expect("connect timeout")
        .expect("connect")
}

/// True once the peer has closed `s` (EOF or reset); false if it is still
/// open after a short look. Reads nothing of value: these sockets send
/// nothing and get nothing.
async fn closed_by_peer(s: &mut TcpStream, wait: Duration) -> bool {
    // What the server sends first (an HTTP/2 server preface) is skipped.
    let mut buf = [0u8; 1024];
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        match tokio::time::timeout_at(deadline, s.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return true,
            Ok(Ok(_)) => continue,
            Err(_) => return false,
        }
    }
}

// === 1. Replies are budgeted before they are built ===

#[tokio::test]
async fn a_client_that_stops_reading_holds_one_reply_not_four() {
    let dir = scratch();
    let file = dir.path().join("big.bin");
    // 40 MiB (53 MiB of base64: far more than socket buffers hold), sparse
    // but for a marker at each end.
    const LEN: usize = 40 * 1024 * 1024;
    let f = std::fs::File::create(&file).unwrap();
    f.set_len(LEN as u64).unwrap();
    use std::os::unix::fs::FileExt as _;
    f.write_all_at(b"head", 0).unwrap();
    f.write_all_at(b"tail", LEN as u64 - 4).unwrap();
    let gw = Gateway::start("[server]\nslow_client_timeout = \"10m\"\n");
    // A client with a small receive buffer that takes frames this large.
    let sock = TcpSocket::new_v4().unwrap();
    sock.set_recv_buffer_size(64 * 1024).unwrap();
    let tcp = sock.connect(gw.addr.parse().unwrap()).await.unwrap();
    let mut req = tokio_tungstenite::tungstenite::client::IntoClientRequest::into_client_request(
        gw.url.as_str(),
    )
    .unwrap();
    req.headers_mut().insert(
        "authorization",
        format!("Bearer {}", gw.token("t1")).parse().unwrap(),
    );
    let config = tokio_tungstenite::tungstenite::protocol::WebSocketConfig::default()
        .max_message_size(Some(128 << 20))
        .max_frame_size(Some(128 << 20));
    let (ws, _) = tokio_tungstenite::client_async_with_config(
        req,
        tokio_tungstenite::MaybeTlsStream::Plain(tcp),
        Some(config),
    )
    .await
    .unwrap();
    let mut c = common::Client::from_ws(ws);
    c.initialize().await;
    // Four reads of the same file, and then the client reads nothing.
    let path = file.display().to_string();
    let mut ids = Vec::new();
    for _ in 0..4 {
        ids.push(c.request_id("fs/readFile", json!({"path": path})).await);
    }
    let labels = "tenant=\"t1\"";
    // The first reply is queued (and partly in the socket); the other three
    // wait for room before a byte of them is read from disk.
    let mut waiting = 0.0;
    let deadline = tokio::time::Instant::now() + EVENT_TIMEOUT;
    while waiting < 3.0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "three replies never waited for room (outbound_waiting {waiting})"
        );
        waiting = admin_metric(&gw, "exec_gateway_outbound_waiting", labels)
            .await
            .expect("outbound_waiting exported");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let reply = (LEN as f64 / 3.0).ceil() * 4.0 + 64.0;
    let held = admin_metric(&gw, "exec_gateway_outbound_bytes", labels)
        .await
        .unwrap();
    let peak = admin_metric(&gw, "exec_gateway_outbound_bytes_peak", labels)
        .await
        .unwrap();
    assert!(held >= reply, "the queued reply is accounted: {held}");
    assert!(
        peak < 2.0 * reply,
        "at most one reply held at a time: peak {peak} for a {reply}-byte reply"
    );
    // The client reads again: nothing was lost.
    for id in ids {
        let r = c.response(id).await;
        let data = common::unb64(r["result"]["dataBase64"].as_str().expect("data"));
        assert_eq!(data.len(), LEN);
        assert_eq!(&data[..4], b"head");
        assert_eq!(&data[data.len() - 4..], b"tail");
    }
    let mut held = 1.0;
    let deadline = tokio::time::Instant::now() + EVENT_TIMEOUT;
    while held > 0.0 {
        assert!(tokio::time::Instant::now() < deadline, "still held: {held}");
        held = admin_metric(&gw, "exec_gateway_outbound_bytes", labels)
            .await
            .unwrap();
    }
}

#[tokio::test]
async fn a_file_over_the_read_limit_is_refused_naming_the_limit() {
    let dir = scratch();
    let file = dir.path().join("two-mib.bin");
    std::fs::File::create(&file)
        .unwrap()
        .set_len(2 * 1024 * 1024)
        .unwrap();
    let gw = t1_with("max_read_file_bytes = 1048576\n");
    let (mut c, _) = gw.session().await;
    let (code, message) = c
        .call_err("fs/readFile", json!({"path": file.display().to_string()}))
        .await;
    assert_eq!(code, -32602, "{message}");
    assert!(message.contains("max_read_file_bytes"), "{message}");
    assert!(message.contains("1048576"), "{message}");
    // A file under the limit still reads.
    let small = write_file(dir.path(), "small.txt", "ok\n");
    let r = c
        .call("fs/readFile", json!({"path": small.display().to_string()}))
        .await;
    assert_eq!(common::unb64(r["dataBase64"].as_str().unwrap()), b"ok\n");
}

#[test]
fn a_read_limit_whose_reply_cannot_fit_the_outbound_budget_is_refused() {
    let dir = scratch();
    std::fs::write(dir.path().join("k"), [7u8; 32]).unwrap();
    let cfg = write_file(
        dir.path(),
        "gw.toml",
        &format!(
            "[[auth.keys]]\nalgorithm = \"HS256\"\nsecret_file = \"{}/k\"\n\
             [tenants.t1]\nroot = \"/\"\nmax_read_file_bytes = 100000000\nmax_outbound_bytes = 100000000\n",
            dir.path().display()
        ),
    );
    let out = serve_expecting_refusal(&cfg);
    assert_eq!(out.status.code(), Some(64));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("max_outbound_bytes"), "{err}");
}

// === 2. writeId is bounded ===

#[tokio::test]
async fn an_oversized_write_id_is_refused() {
    let gw = Gateway::start("");
    let (mut c, _) = gw.session().await;
    c.call(
        "process/start",
        json!({"processId": "w", "argv": ["cat"], "cwd": "/tmp", "pipeStdin": true,
               "env": {"PATH": "/usr/bin:/bin"}, "tty": false}),
    )
    .await;
    let (code, message) = c
        .call_err(
            "process/write",
            json!({"processId": "w", "chunk": "aGkK", "writeId": "x".repeat(4 * 1024 * 1024)}),
        )
        .await;
    assert_eq!(code, -32602, "{message}");
    assert!(message.contains("256"), "{message}");
    // An id of the accepted size still de-duplicates.
    let id = "y".repeat(256);
    for _ in 0..2 {
        let r = c
            .call(
                "process/write",
                json!({"processId": "w", "chunk": "aGkK", "writeId": id}),
            )
            .await;
        assert_eq!(r["status"], "accepted");
    }
    c.call("process/terminate", json!({"processId": "w"})).await;
}

#[tokio::test]
async fn a_client_that_sends_pings_and_never_reads_is_cut_off() {
    let gw = Gateway::start("");
    // Handshake by hand on a socket with a small receive buffer, then pings
    // (each answered by a pong the client never reads).
    let sock = TcpSocket::new_v4().unwrap();
    sock.set_recv_buffer_size(4096).unwrap();
    let mut s = sock.connect(gw.addr.parse().unwrap()).await.unwrap();
    let req = format!(
        "GET / HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\
         Authorization: Bearer {}\r\n\r\n",
        gw.token("t1")
    );
    s.write_all(req.as_bytes()).await.unwrap();
    let mut head = [0u8; 1024];
    let n = s.read(&mut head).await.unwrap();
    assert!(String::from_utf8_lossy(&head[..n]).starts_with("HTTP/1.1 101"));
    let mut ping = vec![0x89, 0x80 | 125, 1, 2, 3, 4];
    ping.extend((0..125u8).map(|i| b'p' ^ [1, 2, 3, 4][usize::from(i % 4)]));
    let burst: Vec<u8> = ping.repeat(1000);
    // 200 MB of pings at most: the gateway must end the connection first.
    let mut cut_off = false;
    for _ in 0..1600 {
        match tokio::time::timeout(EVENT_TIMEOUT, s.write_all(&burst)).await {
            Ok(Ok(())) => {}
            Ok(Err(_)) | Err(_) => {
                cut_off = true;
                break;
            }
        }
    }
    assert!(cut_off, "the gateway kept answering pings nobody reads");
    // Everyone else is served.
    let (mut c, _) = gw.session().await;
    c.call("process/list", json!({})).await;
}

#[tokio::test]
async fn client_chosen_ids_are_bounded() {
    let gw = Gateway::start("");
    let (mut c, _) = gw.session().await;
    let (code, message) = c
        .call_err(
            "process/start",
            json!({"processId": "p".repeat(1 << 20), "argv": ["true"], "cwd": "/tmp",
                   "env": {"PATH": "/usr/bin:/bin"}, "tty": false}),
        )
        .await;
    assert_eq!(code, -32602, "{message}");
    assert!(message.contains("processId"), "{message}");
}

#[tokio::test]
async fn open_file_handles_are_capped_per_tenant() {
    let dir = scratch();
    let f = write_file(dir.path(), "f.txt", "x\n");
    let uri = format!("file://{}", f.display());
    let gw = t1_with("max_open_files = 2\n");
    // Two sessions of the tenant share its two handles.
    let (mut a, _) = gw.session().await;
    let (mut b, _) = gw.session().await;
    for (c, id) in [(&mut a, "h1"), (&mut b, "h2")] {
        c.call(
            "fs/open",
            json!({"handleId": id, "path": uri, "mode": "read"}),
        )
        .await;
    }
    let (code, message) = a
        .call_err(
            "fs/open",
            json!({"handleId": "h3", "path": uri, "mode": "read"}),
        )
        .await;
    assert_eq!(code, -32600, "{message}");
    assert!(message.contains("max_open_files"), "{message}");
    // Closing one gives its place back.
    b.call("fs/close", json!({"handleId": "h2"})).await;
    a.call(
        "fs/open",
        json!({"handleId": "h3", "path": uri, "mode": "read"}),
    )
    .await;
}

#[tokio::test]
async fn a_large_directory_is_listed_not_left_to_the_deadline() {
    let dir = scratch();
    let big = dir.path().join("node_modules");
    std::fs::create_dir(&big).unwrap();
    for i in 0..6000 {
        std::fs::File::create(big.join(format!("package-{i:05}-with-a-longish-name"))).unwrap();
    }
    let gw = Gateway::start("[server]\nrequest_timeout = \"10m\"\n");
    let (mut c, _) = gw.session().await;
    let r = c
        .call(
            "fs/readDirectory",
            json!({"path": big.display().to_string()}),
        )
        .await;
    assert_eq!(r["entries"].as_array().map(Vec::len), Some(6000));
}

#[tokio::test]
async fn grpc_streams_are_capped_per_tenant() {
    use exec_gateway::transport::grpc::pb;
    let dir = scratch();
    let file = dir.path().join("f.bin");
    std::fs::File::create(&file)
        .unwrap()
        .set_len(64 * 1024 * 1024)
        .unwrap();
    let gw = t1_with("max_streams = 2\n");
    let mut files = pb::file_service_client::FileServiceClient::connect(gw.grpc.clone())
        .await
        .unwrap();
    let req = || {
        let mut r = tonic::Request::new(pb::ReadFileRequest {
            path: file.display().to_string(),
            ..Default::default()
        });
        r.metadata_mut().insert(
            "authorization",
            format!("Bearer {}", gw.token("t1")).parse().unwrap(),
        );
        r
    };
    // Two streams opened and not read: the third is refused.
    let a = files.read_file(req()).await.expect("first stream");
    let b = files.read_file(req()).await.expect("second stream");
    let e = files.read_file(req()).await.expect_err("third stream");
    assert_eq!(e.code(), tonic::Code::ResourceExhausted, "{e:?}");
    assert_eq!(e.message(), "quota exceeded: streams (limit 2)", "{e:?}");
    let data = e
        .metadata()
        .get("x-exec-gateway-error-data")
        .expect("error data");
    let data: serde_json::Value = serde_json::from_str(data.to_str().unwrap()).unwrap();
    assert_eq!(data, serde_json::json!({"quota": "streams", "limit": 2}));
    // Closing one frees its place.
    drop(a);
    let mut again = None;
    for _ in 0..100 {
        match files.read_file(req()).await {
            Ok(s) => {
                again = Some(s);
                break;
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
    assert!(
        again.is_some(),
        "a closed stream's place was not given back"
    );
    drop(b);
}

// === 3. Unauthenticated clients are cheap and bounded ===

#[tokio::test]
async fn idle_sockets_from_one_source_do_not_lock_out_the_others() {
    let gw = Gateway::start(
        "[server]\nmax_connections = 8\nmax_unauthenticated_per_source = 4\nhandshake_timeout = \"10m\"\n",
    );
    // Twenty idle sockets from one address on each door (the cap counts
    // both doors: another address for each): four are kept, the rest
    // closed at once.
    let grpc_addr = gw.grpc.trim_start_matches("http://").to_owned();
    let mut kept = Vec::new();
    for (source, addr) in [("127.0.0.2", gw.addr.clone()), ("127.0.0.3", grpc_addr)] {
        let mut socks = Vec::new();
        for _ in 0..20 {
            socks.push(connect_from(source, &addr).await);
        }
        let mut open = 0;
        for s in &mut socks {
            if !closed_by_peer(s, Duration::from_millis(200)).await {
                open += 1;
            }
        }
        assert_eq!(open, 4, "{addr}: sockets kept from one source");
        kept.extend(socks);
    }
    let (_, body) = gw.admin_get("/metrics").await;
    assert_eq!(
        metric(
            &body,
            "exec_gateway_connections_refused_total",
            "door=\"websocket\",reason=\"unauthenticated_per_source\""
        ),
        Some(16.0),
        "{body}"
    );
    // Clients from another address authenticate and work on both doors,
    // more of them than the idle sockets left room for.
    let mut clients = Vec::new();
    for _ in 0..8 {
        let (mut c, _) = gw.session().await;
        c.call("process/list", json!({})).await;
        clients.push(c);
    }
    let mut grpc =
        exec_gateway::transport::grpc::pb::session_service_client::SessionServiceClient::connect(
            gw.grpc.clone(),
        )
        .await
        .unwrap();
    let mut req = tonic::Request::new(exec_gateway::transport::grpc::pb::CreateSessionRequest {
        snapshot: String::new(),
        image: String::new(),
        client_name: "t".into(),
    });
    req.metadata_mut().insert(
        "authorization",
        format!("Bearer {}", gw.token("t1")).parse().unwrap(),
    );
    grpc.create_session(req)
        .await
        .expect("gRPC client admitted");
    // The ninth websocket client finds the authenticated cap full: a clear
    // 503, not a hang.
    let (status, body) = gw
        .handshake("/", Some(&format!("Bearer {}", gw.token("t2"))))
        .await;
    assert_eq!(status, 503, "{body}");
}

#[tokio::test]
async fn when_the_unauthenticated_pool_is_full_the_oldest_makes_room() {
    let gw = Gateway::start(
        "[server]\nmax_unauthenticated = 8\nmax_unauthenticated_per_source = 8\nhandshake_timeout = \"10m\"\n",
    );
    // One source fills the whole pool with idle sockets.
    let mut idle = Vec::new();
    for _ in 0..8 {
        idle.push(connect_from("127.0.0.2", &gw.addr).await);
    }
    // Wait until the gateway has taken all eight in.
    let mut held = 0.0;
    let deadline = tokio::time::Instant::now() + EVENT_TIMEOUT;
    while held < 8.0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "pool never filled: {held}"
        );
        held = admin_metric(
            &gw,
            "exec_gateway_connections",
            "door=\"websocket\",state=\"unauthenticated\"",
        )
        .await
        .unwrap_or(0.0);
    }
    // A real client still gets in: the oldest idle socket gives way.
    let (mut c, _) = gw.session().await;
    c.call("process/list", json!({})).await;
    assert!(
        closed_by_peer(&mut idle[0], EVENT_TIMEOUT).await,
        "the oldest idle socket was not the one closed"
    );
    for s in &mut idle[1..] {
        assert!(!closed_by_peer(s, Duration::from_millis(50)).await);
    }
}

#[tokio::test]
async fn a_connection_that_never_authenticates_is_closed_on_both_doors() {
    let gw = Gateway::start("[server]\nhandshake_timeout = \"1s\"\n");
    let grpc_addr = gw.grpc.trim_start_matches("http://").to_owned();
    // An idle socket (no HTTP/2 preface), a trickled HTTP head, and a
    // kept-alive connection asking only for health.
    let mut idle_grpc = TcpStream::connect(&grpc_addr).await.unwrap();
    let mut idle_ws = TcpStream::connect(&gw.addr).await.unwrap();
    let mut health = TcpStream::connect(&gw.addr).await.unwrap();
    health
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    for (what, s) in [
        ("idle gRPC socket", &mut idle_grpc),
        ("idle websocket socket", &mut idle_ws),
    ] {
        assert!(
            closed_by_peer(s, EVENT_TIMEOUT).await,
            "{what} still open after the handshake timeout"
        );
    }
    // The health answer arrives, then the connection is closed.
    let mut got = Vec::new();
    let read = tokio::time::timeout(EVENT_TIMEOUT, health.read_to_end(&mut got)).await;
    assert!(read.is_ok(), "kept-alive health connection never closed");
    assert!(String::from_utf8_lossy(&got).starts_with("HTTP/1.1 200"));
    let refused = admin_metric(
        &gw,
        "exec_gateway_connections_refused_total",
        "door=\"grpc\",reason=\"handshake_timeout\"",
    )
    .await;
    assert_eq!(refused, Some(1.0));
    // An authenticated websocket outlives the timeout.
    let (mut c, _) = gw.session().await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    c.call("process/list", json!({})).await;
}

#[tokio::test]
async fn the_open_file_limit_is_raised_and_caps_that_cannot_fit_are_refused() {
    // Started with a soft limit of 256: the gateway raises it to the hard one.
    let dir = scratch();
    let wrapper = dir.path().join("low-nofile.sh");
    std::fs::write(
        &wrapper,
        format!(
            "#!/bin/sh\nulimit -Sn 256\nexec {} \"$@\"\n",
            env!("CARGO_BIN_EXE_exec-gateway")
        ),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755)).unwrap();
    let gw = Gateway::start_binary(&wrapper, |d| {
        format!(
            "[[auth.keys]]\nalgorithm = \"HS256\"\nsecret_file = \"{}/hs256.key\"\n\
             [tenants.t1]\nroot = \"/\"\n",
            d.display()
        )
    });
    let limits = std::fs::read_to_string(format!("/proc/{}/limits", gw.child.id())).unwrap();
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .unwrap();
    let fields: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(fields[3], fields[4], "soft limit raised to hard: {line}");
    assert_ne!(fields[3], "256", "{line}");
    // Caps set in the file that no open-file limit can hold: exit 64.
    std::fs::write(dir.path().join("k"), [7u8; 32]).unwrap();
    let cfg = write_file(
        dir.path(),
        "gw.toml",
        &format!(
            "[server]\nmax_connections = 5000000\n[[auth.keys]]\nalgorithm = \"HS256\"\nsecret_file = \"{}/k\"\n\
             [tenants.t1]\nroot = \"/\"\n",
            dir.path().display()
        ),
    );
    let out = serve_expecting_refusal(&cfg);
    assert_eq!(out.status.code(), Some(64));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("RLIMIT_NOFILE"), "{err}");
}

/// 1,000 configured tenants at their defaults start at RLIMIT_NOFILE
/// 20,000: the defaulted `max_active_tenants` is lowered to fit, like the
/// connection caps, and `/readyz` says to what; one written in the file
/// that cannot fit is refused.
#[tokio::test]
async fn a_thousand_configured_tenants_start_with_their_active_cap_lowered_to_fit() {
    let dir = scratch();
    let wrapper = dir.path().join("nofile-20000.sh");
    std::fs::write(
        &wrapper,
        format!(
            "#!/bin/sh\nulimit -n 20000\nexec {} \"$@\"\n",
            env!("CARGO_BIN_EXE_exec-gateway")
        ),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755)).unwrap();
    let tenants: String = (0..1000)
        .map(|i| format!("[tenants.t{i}]\nroot = \"/\"\n"))
        .collect();
    let gw = Gateway::start_binary(&wrapper, |d| {
        format!(
            "[[auth.keys]]\nalgorithm = \"HS256\"\nsecret_file = \"{}/hs256.key\"\n{tenants}",
            d.display()
        )
    });
    let (status, body) = gw.admin_get("/readyz").await;
    assert_eq!(status, 200, "{body}");
    let cap: usize = body
        .split("(server.max_active_tenants ")
        .nth(1)
        .and_then(|r| r.split(')').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no cap in {body}"));
    assert!((1..1000).contains(&cap), "{body}");
    // The lowered cap serves: a tenant's session runs.
    let (mut c, _) = gw.session_of("t999").await;
    c.call("process/list", json!({})).await;

    // Set in the file, a cap that cannot fit refuses the start.
    std::fs::write(dir.path().join("k"), [7u8; 32]).unwrap();
    let cfg = write_file(
        dir.path(),
        "gw.toml",
        &format!(
            "[server]\nmax_active_tenants = 1000\n[[auth.keys]]\nalgorithm = \"HS256\"\nsecret_file = \"{}/k\"\n{tenants}",
            dir.path().display()
        ),
    );
    let mut child = std::process::Command::new(&wrapper)
        .args(["serve", "--listen", "ws://127.0.0.1:0", "--config"])
        .arg(&cfg)
        .env("XDG_STATE_HOME", dir.path().join("state"))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + common::event_timeout();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            panic!("a cap that cannot fit did not refuse the start");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(status.code(), Some(64));
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
    assert!(err.contains("1000 active tenants"), "{err}");
}

/// A wrapper that runs the gateway at RLIMIT_NOFILE 20,000, its log
/// (stderr) appended to `DIR/gw.log`.
fn nofile_20000_logged(dir: &Path) -> std::path::PathBuf {
    let wrapper = dir.join("nofile-20000-logged.sh");
    std::fs::write(
        &wrapper,
        format!(
            "#!/bin/sh\nulimit -n 20000\nexec {} \"$@\" 2>>{}/gw.log\n",
            env!("CARGO_BIN_EXE_exec-gateway"),
            dir.display()
        ),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755)).unwrap();
    wrapper
}

/// A reload is held to the descriptor fit of the caps in force (they
/// change only at a restart): a tenant's `max_open_files` raised past
/// what the running caps leave is refused, the running configuration
/// stays and serves. A reload that changes no `[server]` key does not
/// say one needs a restart, though the start lowered the defaulted caps
/// (and a reload with another tenant would lower them differently).
#[tokio::test]
async fn a_reload_that_does_not_fit_the_descriptors_is_refused_and_the_gateway_keeps_serving() {
    let dir = scratch();
    let wrapper = nofile_20000_logged(dir.path());
    let log = dir.path().join("gw.log");
    let read_log = || std::fs::read_to_string(&log).unwrap_or_default();
    let text = |d: &Path, t1: &str| {
        format!(
            "[[auth.keys]]\nalgorithm = \"HS256\"\nsecret_file = \"{}/hs256.key\"\n\
             [tenants.t1]\nroot = \"/\"\n{t1}[tenants.t2]\nroot = \"/\"\n",
            d.display()
        )
    };
    let gw = Gateway::start_binary(&wrapper, |d| text(d, ""));
    assert!(read_log().contains("lowered to fit"), "{}", read_log());
    let config = gw.dir.path().join("gateway.toml");
    // Whole at once: the gateway also polls the file.
    let put = |text: String| {
        let tmp = config.with_extension("new");
        std::fs::write(&tmp, text).unwrap();
        std::fs::rename(&tmp, &config).unwrap();
        gw.signal(libc::SIGHUP);
    };
    let reloads = |outcome: &'static str| gw.reloads(outcome);
    let wait = |what: &'static str, outcome: &'static str, n: f64| async move {
        let deadline = std::time::Instant::now() + common::event_timeout();
        while reloads(outcome).await < n {
            assert!(
                std::time::Instant::now() < deadline,
                "timed out: {what}: {}",
                read_log()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };

    // A third tenant, no [server] key changed: no restart is asked for.
    put(format!(
        "{}[tenants.t3]\nroot = \"/\"\n",
        text(gw.dir.path(), "")
    ));
    wait("the reload", "ok", 1.0).await;
    let l = read_log();
    assert!(l.contains("configuration reloaded"), "{l}");
    assert!(!l.contains("need a restart"), "{l}");

    // t1 may hold 5,000 files: its file alone fits (its defaulted caps
    // lowered), but not beside the caps in force.
    put(text(gw.dir.path(), "max_open_files = 5000\n"));
    wait("the refusal", "refused", 1.0).await;
    let l = read_log();
    assert!(
        l.contains("configuration reload refused") && l.contains("RLIMIT_NOFILE allows 20000"),
        "{l}"
    );
    // The running configuration serves, t3 (which the refused file
    // left out) included.
    for t in ["t1", "t3"] {
        let (mut c, _) = gw.session_of(t).await;
        c.call("process/list", json!({})).await;
    }
}

/// A tenant's `max_open_files` that cannot fit the open-file limit
/// refuses the start (exit 64), rather than every defaulted cap being
/// lowered to 1 around it.
#[test]
fn a_tenant_cap_that_cannot_fit_the_descriptors_refuses_the_start() {
    let dir = scratch();
    let wrapper = dir.path().join("nofile-20000.sh");
    std::fs::write(
        &wrapper,
        format!(
            "#!/bin/sh\nulimit -n 20000\nexec {} \"$@\"\n",
            env!("CARGO_BIN_EXE_exec-gateway")
        ),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::write(dir.path().join("k"), [7u8; 32]).unwrap();
    let cfg = write_file(
        dir.path(),
        "gw.toml",
        &format!(
            "[[auth.keys]]\nalgorithm = \"HS256\"\nsecret_file = \"{}/k\"\n\
             [tenants.t0]\nroot = \"/\"\nmax_open_files = 1000000\n\
             [tenants.t1]\nroot = \"/\"\n",
            dir.path().display()
        ),
    );
    let out = common::serve_expecting_refusal_as(&wrapper, &cfg);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(64), "{err}");
    assert!(err.contains("RLIMIT_NOFILE allows 20000"), "{err}");
}

// === 4. Admin routes are not on the client port ===

#[tokio::test]
async fn metrics_and_readiness_details_are_only_on_the_admin_listener() {
    let gw = Gateway::start("");
    let (status, _) = gw.http_get("/metrics").await;
    assert_eq!(status, 404);
    let (status, body) = gw.http_get("/readyz").await;
    assert_eq!((status, body.as_str()), (200, "ready\n"));
    let (status, body) = gw.admin_get("/metrics").await;
    assert_eq!(status, 200);
    assert!(body.contains("exec_gateway_tenants_active"), "{body}");
    let (status, body) = gw.admin_get("/readyz").await;
    assert_eq!(status, 200);
    assert!(body.contains("landlock:"), "{body}");
}

#[tokio::test]
async fn an_admin_listener_off_loopback_needs_a_token() {
    let dir = scratch();
    std::fs::write(dir.path().join("k"), [7u8; 32]).unwrap();
    let base = format!(
        "[[auth.keys]]\nalgorithm = \"HS256\"\nsecret_file = \"{}/k\"\n[tenants.t1]\nroot = \"/\"\n",
        dir.path().display()
    );
    let cfg = write_file(
        dir.path(),
        "open.toml",
        &format!("[server]\nadmin_listen = \"0.0.0.0:0\"\n{base}"),
    );
    let out = serve_expecting_refusal(&cfg);
    assert_eq!(out.status.code(), Some(64));
    assert!(String::from_utf8_lossy(&out.stderr).contains("admin_token_file"));
    // With a token, the admin routes ask for it.
    let gw = Gateway::start_with(|d| {
        std::fs::write(d.join("admin.token"), "a".repeat(40)).unwrap();
        format!(
            "[server]\nadmin_token_file = \"{0}/admin.token\"\n\
             [[auth.keys]]\nalgorithm = \"HS256\"\nsecret_file = \"{0}/hs256.key\"\n\
             [tenants.t1]\nroot = \"/\"\n",
            d.display()
        )
    });
    assert_eq!(gw.admin_get("/metrics").await.0, 401);
    let wrong = format!("Bearer {}", "b".repeat(40));
    assert_eq!(
        common::http_get_at(&gw.admin, "/metrics", Some(&wrong))
            .await
            .0,
        401
    );
    let right = format!("Bearer {}", "a".repeat(40));
    assert_eq!(
        common::http_get_at(&gw.admin, "/metrics", Some(&right))
            .await
            .0,
        200
    );
}

// === 5. JWKS: https, no redirects, off the handshake path ===

/// What the test JWKS server does with the n-th request (from 0).
#[derive(Clone, Copy)]
enum Answer {
    Jwks,
    Redirect,
    Hang,
}

/// A JWKS endpoint answering request `n` with `plan(n)`; returns its URL and
/// the count of requests seen.
async fn jwks_endpoint(
    body: String,
    plan: fn(usize) -> Answer,
) -> (String, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let count = seen.clone();
    tokio::spawn(async move {
        let mut held = Vec::new();
        loop {
            let Ok((mut s, _)) = listener.accept().await else {
                return;
            };
            let n = count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let mut buf = vec![0u8; 4096];
            let _ = s.read(&mut buf).await;
            let resp = match plan(n) {
                Answer::Jwks => format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                ),
                Answer::Redirect => format!(
                    "HTTP/1.1 302 Found\r\nLocation: http://{addr}/real.json\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                ),
                Answer::Hang => {
                    held.push(s);
                    continue;
                }
            };
            let _ = s.write_all(resp.as_bytes()).await;
        }
    });
    (format!("http://{addr}/jwks.json"), seen)
}

/// An RSA key pair: (private PEM, JWK of the public half).
fn rsa_key(dir: &Path, kid: &str) -> (Vec<u8>, Value) {
    let (pem, public) = common::rsa(dir, kid);
    (pem, common::rsa_jwk(&public, kid))
}

fn rs256(pem: &[u8], kid: &str) -> String {
    let mut h = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::RS256);
    h.kid = Some(kid.to_owned());
    let claims = json!({"sub": "u", "tenant": "t1", "scope": "exec", "exp": common::now() + 600});
    jsonwebtoken::encode(
        &h,
        &claims,
        &jsonwebtoken::EncodingKey::from_rsa_pem(pem).unwrap(),
    )
    .unwrap()
}

fn jwks_config(d: &Path, url: &str, extra: &str) -> String {
    format!(
        "[auth]\n{extra}\n\
         [[auth.keys]]\nalgorithm = \"RS256\"\njwks_url = \"{url}\"\n\
         [tenants.t1]\nroot = \"/\"\n[[auth.keys]]\nalgorithm = \"HS256\"\nsecret_file = \"{}/hs256.key\"\n",
        d.display()
    )
}

#[tokio::test]
async fn a_hung_jwks_endpoint_stalls_no_handshake() {
    let dir = scratch();
    let (pem, jwk) = rsa_key(dir.path(), "k1");
    let body = json!({"keys": [jwk]}).to_string();
    // The first fetch answers; every later one hangs for good.
    let (url, seen) =
        jwks_endpoint(body, |n| if n == 0 { Answer::Jwks } else { Answer::Hang }).await;
    let gw = Gateway::start_with(|d| {
        jwks_config(
            d,
            &url,
            "jwks_refresh_interval = \"500ms\"\njwks_fetch_timeout = \"1h\"\njwks_unknown_kid_wait = \"200ms\"",
        )
    });
    // The start-up fetch has the key: a handshake with it works.
    let known = rs256(&pem, "k1");
    let mut c = common::Client::connect(&gw.url, &known).await;
    c.initialize().await;
    // The next refresh hangs for good.
    let deadline = tokio::time::Instant::now() + EVENT_TIMEOUT;
    while seen.load(std::sync::atomic::Ordering::SeqCst) < 2 {
        assert!(tokio::time::Instant::now() < deadline, "no second fetch");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // A made-up kid waits for that refresh only briefly: the handshake is
    // answered (refused), not held for the fetch.
    let unknown = rs256(&pem, "made-up");
    let (status, _) = gw.handshake("/", Some(&format!("Bearer {unknown}"))).await;
    assert_eq!(status, 401);
    // While that refresh hangs, known keys keep working.
    for _ in 0..3 {
        let mut c = common::Client::connect(&gw.url, &known).await;
        c.initialize().await;
    }
}

#[tokio::test]
async fn jwks_redirects_are_not_followed() {
    let dir = scratch();
    let (pem, jwk) = rsa_key(dir.path(), "k1");
    let body = json!({"keys": [jwk]}).to_string();
    // Every request to the configured URL is redirected to a valid set.
    let (url, _) = jwks_endpoint(body, |n| {
        if n % 2 == 0 {
            Answer::Redirect
        } else {
            Answer::Jwks
        }
    })
    .await;
    let gw = Gateway::start_with(|d| jwks_config(d, &url, "jwks_refresh_interval = \"1h\""));
    let token = rs256(&pem, "k1");
    let (status, _) = gw.handshake("/", Some(&format!("Bearer {token}"))).await;
    assert_eq!(status, 401, "a key from a redirect target was trusted");
    let failed = admin_metric(&gw, "exec_gateway_jwks_fetches_total", "outcome=\"error\"").await;
    assert!(failed.unwrap_or(0.0) >= 1.0);
}

#[test]
fn a_plain_http_jwks_url_off_loopback_is_refused() {
    let dir = scratch();
    std::fs::write(dir.path().join("k"), [7u8; 32]).unwrap();
    let cfg = write_file(
        dir.path(),
        "gw.toml",
        "[[auth.keys]]\nalgorithm = \"RS256\"\njwks_url = \"http://issuer.example.com/jwks.json\"\n\
         [tenants.t1]\nroot = \"/\"\n",
    );
    let out = serve_expecting_refusal(&cfg);
    assert_eq!(out.status.code(), Some(64));
    assert!(String::from_utf8_lossy(&out.stderr).contains("https"));
}

/// Seen on d384597: 80 idle sockets on the admin listener starved every
/// scrape. One source now holds at most ADMIN_MAX_PER_SOURCE (8) of its
/// connections: the ninth is closed at once, and another source is still
/// answered.
#[tokio::test]
async fn one_source_cannot_take_every_admin_connection() {
    let gw = Gateway::start("");
    let mut idle = Vec::new();
    for _ in 0..8 {
        idle.push(TcpStream::connect(&gw.admin).await.unwrap());
    }
    // Connections are admitted in order: the eighth is in before the ninth.
    let mut ninth = TcpStream::connect(&gw.admin).await.unwrap();
    let mut buf = [0u8; 1];
    let n = tokio::time::timeout(EVENT_TIMEOUT, ninth.read(&mut buf))
        .await
        .expect("the ninth connection is closed, not left waiting")
        .unwrap_or(0);
    assert_eq!(n, 0, "the ninth connection of one source was served");
    // Another source address (127.0.0.2 reaches 127.0.0.1 over loopback).
    let sock = TcpSocket::new_v4().unwrap();
    sock.bind("127.0.0.2:0".parse().unwrap()).unwrap();
    let mut other = sock.connect(gw.admin.parse().unwrap()).await.unwrap();
    other
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut reply = Vec::new();
    tokio::time::timeout(EVENT_TIMEOUT, other.read_to_end(&mut reply))
        .await
        .unwrap()
        .unwrap();
    assert!(
        reply.starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&reply)
    );
    drop(idle);
}
