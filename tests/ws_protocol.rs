//! The envelope, handshake, error codes and connection behaviour over a real
//! websocket (docs/protocol.md).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::time::Duration;

use common::{EVENT_TIMEOUT, Gateway};
use futures_util::{SinkExt as _, StreamExt as _};
use serde_json::json;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio_tungstenite::tungstenite::Message;

#[tokio::test]
async fn ids_are_echoed_verbatim_and_no_jsonrpc_field_is_sent() {
    let gw = Gateway::start("");
    let mut c = gw.connect().await;
    for id in [json!("abc"), json!(-7), json!(i64::MAX)] {
        c.send(&json!({"jsonrpc":"2.0","id": id, "method":"nope"}))
            .await;
        let r = c.recv_raw().await.expect("response");
        assert_eq!(r["id"], id);
        assert!(r.get("jsonrpc").is_none(), "{r}");
        assert_eq!(r["error"]["code"], -32601);
        assert_eq!(
            r["error"]["message"],
            "exec-server stub does not implement `nope` yet"
        );
    }
}

#[tokio::test]
async fn pre_init_errors_use_the_reference_messages() {
    let gw = Gateway::start("");
    let mut c = gw.connect().await;
    // Params are decoded first (as the reference does), then the gate.
    let (code, msg) = c.call_err("process/start", json!({})).await;
    assert_eq!((code, msg.as_str()), (-32602, "missing field `processId`"));
    let (code, msg) = c
        .call_err(
            "process/start",
            json!({"processId":"p","argv":["true"],"cwd":"/","env":{},"tty":false}),
        )
        .await;
    assert_eq!(
        (code, msg.as_str()),
        (
            -32600,
            "client must call initialize before using exec methods"
        )
    );
    let (_, msg) = c
        .call_err("fs/readFile", json!({"path":"/etc/hostname"}))
        .await;
    assert_eq!(
        msg,
        "client must call initialize before using filesystem methods"
    );
    // Params are decoded first, as the references do (`{}` is -32602
    // ``missing field `method` `` there too).
    let (code, msg) = c.call_err("http/request", json!({})).await;
    assert_eq!((code, msg.as_str()), (-32602, "missing field `method`"));
    let get = json!({"method": "GET", "url": "http://x/", "requestId": "r"});
    let (_, msg) = c.call_err("http/request", get).await;
    assert_eq!(msg, "client must call initialize before using http methods");
    let r = c.call("initialize", json!({"clientName":"t"})).await;
    assert!(
        r["sessionId"].as_str().is_some_and(|s| s.len() == 36),
        "{r}"
    );
    let (code, msg) = c.call_err("process/list", json!({})).await;
    assert_eq!(
        (code, msg.as_str()),
        (
            -32600,
            "client must send initialized before using exec methods"
        )
    );
    let (code, msg) = c.call_err("initialize", json!({"clientName":"t"})).await;
    assert_eq!(
        (code, msg.as_str()),
        (-32600, "initialize may only be sent once per connection")
    );
    c.send(&json!({"method":"initialized","params":[1,2]}))
        .await;
    let r = c.call("process/list", json!(null)).await;
    assert_eq!(r, json!({"processes": []}));
}

#[tokio::test]
async fn bad_params_give_32602_with_serde_text() {
    let gw = Gateway::start("");
    let (mut c, _) = gw.session().await;
    let (code, msg) = c
        .call_err(
            "process/start",
            json!({"processId":"p","argv":["true"],"env":{},"tty":false}),
        )
        .await;
    assert_eq!((code, msg.as_str()), (-32602, "missing field `cwd`"));
    // Malformed params are reported before "already initialized", as the
    // official servers do (the differential run found it).
    let (code, msg) = c.call_err("initialize", json!(null)).await;
    assert_eq!(
        (code, msg.as_str()),
        (
            -32602,
            "invalid type: null, expected struct InitializeParams"
        )
    );
    let (code, msg) = c
        .call_err("initialize", json!({"clientName": "again"}))
        .await;
    assert_eq!(
        (code, msg.as_str()),
        (-32600, "initialize may only be sent once per connection")
    );
    let (code, msg) = c
        .call_err(
            "process/start",
            json!({"processId":"p","argv":[],"cwd":"/","env":{},"tty":false}),
        )
        .await;
    assert_eq!((code, msg.as_str()), (-32602, "argv must not be empty"));
    // Positional params decode as the reference does.
    let r = c.call("process/terminate", json!(["nope"])).await;
    assert_eq!(r, json!({"running": false}));
    let mut c2 = gw.connect().await;
    let (code, msg) = c2.call_err("initialize", json!(null)).await;
    assert_eq!(
        (code, msg.as_str()),
        (
            -32602,
            "invalid type: null, expected struct InitializeParams"
        )
    );
}

#[tokio::test]
async fn malformed_frames_keep_the_connection_open() {
    let gw = Gateway::start("");
    let (mut c, _) = gw.session().await;
    let local = c.ws.get_ref();
    let peer = match local {
        tokio_tungstenite::MaybeTlsStream::Plain(s) => s.local_addr().expect("addr"),
        _ => unreachable!(),
    };
    for bad in [
        "{not json",
        "[]",
        r#"[{"id":1,"method":"process/list"}]"#,
        "42",
    ] {
        c.send_raw(bad).await;
        let r = c.recv_raw().await.expect("error reply");
        assert_eq!(r["id"], -1, "{bad}: {r}");
        assert_eq!(r["error"]["code"], -32600);
        let msg = r["error"]["message"].as_str().expect("message");
        let prefix = format!(
            "failed to parse websocket JSON-RPC message from exec-server websocket {peer}: "
        );
        assert!(msg.starts_with(&prefix), "{msg}");
    }
    // Binary frames carry JSON too.
    c.ws.send(Message::binary(
        br#"{"id":9,"method":"process/list"}"#.to_vec(),
    ))
    .await
    .expect("send binary");
    let r = c.response(9).await;
    assert_eq!(r["result"], json!({"processes": []}));
}

#[tokio::test]
async fn unknown_notifications_are_answered_on_id_minus_one() {
    let gw = Gateway::start("");
    let (mut c, _) = gw.session().await;
    for msg in [
        json!({"method":"bogus"}),
        json!({"id":null,"method":"process/list"}),
        json!({"id":1.5,"method":"x"}),
    ] {
        c.send(&msg).await;
        let r = c.recv_raw().await.expect("error reply");
        assert_eq!(r["id"], -1);
        assert_eq!(r["error"]["code"], -32600);
    }
    // A response object from the client is ignored, and the connection lives.
    c.send(&json!({"id": 5, "result": {}})).await;
    assert_eq!(
        c.call("process/list", json!({})).await,
        json!({"processes": []})
    );
}

#[tokio::test]
async fn a_long_poll_does_not_block_later_requests() {
    let gw = Gateway::start("");
    let (mut c, _) = gw.session().await;
    c.start("sleeper", &["sleep", "30"]).await;
    let read_id = c
        .request_id(
            "process/read",
            json!({"processId":"sleeper","waitMs":10_000}),
        )
        .await;
    let list_id = c.request_id("process/list", json!({})).await;
    // The list answer must arrive first, while the read is still waiting.
    let first = c.recv_raw().await.expect("a response");
    assert_eq!(first["id"], list_id, "{first}");
    assert_eq!(first["result"]["processes"][0]["state"], "running");
    c.call("process/terminate", json!({"processId":"sleeper"}))
        .await;
    let r = c.response(read_id).await;
    assert_eq!(r["result"]["exited"], true, "{r}");
}

#[tokio::test]
async fn oversized_message_is_refused_and_the_session_survives() {
    let gw = Gateway::start("[server]\nmax_message_bytes = 65536\n");
    let (mut c, sid) = gw.session().await;
    c.start("keep", &["sleep", "30"]).await;
    let big = "x".repeat(100_000);
    c.send(
        &json!({"id": 99, "method":"fs/writeFile","params":{"path":"/tmp/x","dataBase64": big}}),
    )
    .await;
    // An error on id -1, then a 1009 close.
    let r = c.recv_raw().await.expect("error before close");
    assert_eq!(r["id"], -1);
    assert_eq!(r["error"]["code"], -32600);
    let closed = tokio::time::timeout(EVENT_TIMEOUT, async {
        loop {
            match c.ws.next().await {
                Some(Ok(Message::Close(f))) => return f.map(|f| u16::from(f.code)),
                Some(Ok(_)) => continue,
                _ => return None,
            }
        }
    })
    .await
    .expect("close timeout");
    assert_eq!(closed, Some(1009));
    // Nothing was lost: the session resumes with its process.
    let mut c2 = gw.connect().await;
    let r = c2
        .call(
            "initialize",
            json!({"clientName":"t","resumeSessionId": sid}),
        )
        .await;
    assert_eq!(r["sessionId"], sid);
    c2.send(&json!({"method":"initialized"})).await;
    let list = c2.call("process/list", json!({})).await;
    assert_eq!(list["processes"][0]["processId"], "keep");
    assert_eq!(list["processes"][0]["state"], "running");
}

/// A message over the limit sent while output floods the connection: the
/// client still gets the error and the 1009 close behind the output, not a
/// reset. (The gateway stops reading at the oversized frame's header; a
/// socket closed with those bytes unread is reset by the kernel, which
/// throws away the frames still in its send buffer. It drains them first.)
#[tokio::test]
async fn an_oversized_message_during_output_still_gets_its_close() {
    let gw = Gateway::start("[server]\nmax_message_bytes = 65536\n");
    let (mut c, _) = gw.session().await;
    c.start(
        "flood",
        &["sh", "-c", "head -c 200000000 /dev/zero | base64"],
    )
    .await;
    // Output is streaming before the oversized message goes.
    let mut seen = 0;
    while seen < 2_000_000 {
        match c.ws.next().await {
            Some(Ok(Message::Text(t))) => seen += t.len(),
            other => panic!("output expected: {other:?}"),
        }
    }
    let big = "x".repeat(200_000);
    c.ws
        .send(Message::text(format!(
            r#"{{"id": 99, "method": "fs/writeFile", "params": {{"path": "/tmp/x", "dataBase64": "{big}"}}}}"#
        )))
        .await
        .unwrap();
    let (mut error, mut close) = (None, None);
    let end = tokio::time::timeout(EVENT_TIMEOUT, async {
        loop {
            // A reader slower than the output: the error and the close
            // wait behind full socket buffers when the gateway finishes.
            tokio::time::sleep(Duration::from_millis(2)).await;
            match c.ws.next().await {
                Some(Ok(Message::Text(t))) => {
                    let v: serde_json::Value = serde_json::from_str(t.as_str()).unwrap();
                    if v["id"] == -1 {
                        error = Some(v["error"]["code"].clone());
                    }
                }
                Some(Ok(Message::Close(f))) => {
                    close = f.map(|f| u16::from(f.code));
                    return "closed".to_owned();
                }
                Some(Ok(_)) => {}
                Some(Err(e)) => return format!("error: {e}"),
                None => return "ended without a close frame".to_owned(),
            }
        }
    })
    .await
    .expect("the connection ends");
    assert_eq!(end, "closed");
    assert_eq!(error, Some(json!(-32600)));
    assert_eq!(close, Some(1009));
}

#[tokio::test]
async fn permessage_deflate_offer_is_declined_not_dropped() {
    let gw = Gateway::start("");
    let mut s = tokio::net::TcpStream::connect(&gw.addr)
        .await
        .expect("connect");
    let req = format!(
        "GET / HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\
         Authorization: Bearer {}\r\n\
         Sec-WebSocket-Extensions: permessage-deflate; client_max_window_bits\r\n\r\n",
        gw.token("t1")
    );
    s.write_all(req.as_bytes()).await.expect("write");
    let mut buf = vec![0u8; 1024];
    let n = tokio::time::timeout(EVENT_TIMEOUT, s.read(&mut buf))
        .await
        .expect("handshake timeout")
        .expect("read");
    let head = String::from_utf8_lossy(&buf[..n]).to_ascii_lowercase();
    assert!(head.starts_with("http/1.1 101"), "{head}");
    assert!(
        head.contains("sec-websocket-accept: s3pplmbitxaq9kygzzhzrbk+xoo="),
        "{head}"
    );
    assert!(!head.contains("sec-websocket-extensions"), "{head}");
}

#[tokio::test]
async fn health_and_readiness_endpoints() {
    let gw = Gateway::start("");
    assert_eq!(gw.http_get("/healthz").await, (200, "ok\n".to_owned()));
    assert_eq!(gw.http_get("/readyz").await.0, 200);
    let (status, body) = gw.admin_get("/metrics").await;
    assert_eq!(status, 200);
    // No series for a tenant nobody has used (only active tenants have any).
    assert!(!body.contains("tenant=\"t1\""), "{body}");
    assert!(body.contains("exec_gateway_tenants_active 0"), "{body}");
    let (mut c, _) = gw.session().await;
    c.call("process/list", json!({})).await;
    let (_, body) = gw.admin_get("/metrics").await;
    assert!(
        body.contains("exec_gateway_sessions{tenant=\"t1\"} 1"),
        "{body}"
    );
    assert!(
        body.contains(
            "exec_gateway_requests_total{tenant=\"t1\",method=\"process/list\",outcome=\"ok\"} 1"
        ),
        "{body}"
    );
    // initialize, which does not pass through the stack, is counted too.
    assert!(
        body.contains(
            "exec_gateway_requests_total{tenant=\"t1\",method=\"initialize\",outcome=\"ok\"} 1"
        ),
        "{body}"
    );
    assert_eq!(gw.http_get("/nope").await.0, 404);
}

/// `http/request` runs inside the tenant's network, never the gateway
/// host's: a server on the host's loopback is not reached (the tenant's
/// loopback has nothing there); without a network of its own the tenant
/// is refused outright.
#[tokio::test]
async fn http_request_never_reaches_the_gateway_hosts_loopback() {
    let gw = Gateway::start("");
    let host = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    host.set_nonblocking(true).unwrap();
    let url = format!("http://{}/", host.local_addr().unwrap());
    let (mut c, _) = gw.session().await;
    let (code, msg) = c
        .call_err(
            "http/request",
            json!({"method":"GET","url": url,"requestId":"r"}),
        )
        .await;
    match code {
        -32003 => assert!(msg.contains("disabled"), "{msg}"),
        -32603 => assert_eq!(
            msg,
            format!("http/request failed: error sending request for url ({url})")
        ),
        other => panic!("{other}: {msg}"),
    }
    assert!(host.accept().is_err(), "the host's loopback was reached");
}

#[tokio::test]
async fn a_slow_header_is_cut_off_and_others_are_served() {
    let gw = Gateway::start("");
    // A client that sends half a request head and stalls does not block others.
    let mut stalled = tokio::net::TcpStream::connect(&gw.addr)
        .await
        .expect("connect");
    stalled
        .write_all(b"GET /healthz HTTP/1.1\r\nHost")
        .await
        .expect("write");
    assert_eq!(gw.http_get("/healthz").await.0, 200);
    let (mut c, _) = gw.session().await;
    assert_eq!(
        c.call("process/list", json!({})).await,
        json!({"processes": []})
    );
    tokio::time::sleep(Duration::from_millis(10)).await;
}

/// `session/close` sent right behind other calls: they are answered first,
/// then the close, then the connection ends.
#[tokio::test]
async fn session_close_answers_the_calls_sent_before_it() {
    let gw = Gateway::start("");
    let (mut c, _) = gw.session().await;
    let dir = common::scratch();
    let file = dir.path().join("big");
    std::fs::write(&file, vec![5u8; 1 << 20]).unwrap();
    std::fs::set_permissions(&file, std::os::unix::fs::PermissionsExt::from_mode(0o644)).unwrap();
    let read = c
        .request_id("fs/readFile", json!({"path": file.display().to_string()}))
        .await;
    let close = c.request_id("session/close", json!({})).await;
    let r = c.response(read).await;
    let data = common::unb64(
        r["result"]["dataBase64"]
            .as_str()
            .unwrap_or_else(|| panic!("{r}")),
    );
    assert_eq!(data.len(), 1 << 20);
    assert!(c.response(close).await["result"].is_object());
}

/// A request id over 256 bytes is refused on id -1 and never echoed; the
/// connection goes on.
#[tokio::test]
async fn request_ids_over_256_bytes_are_refused() {
    let gw = Gateway::start("");
    let (mut c, _) = gw.session().await;
    let long = "i".repeat(100_000);
    c.send(&json!({"id": long, "method": "process/list"})).await;
    let r = c.response(-1).await;
    assert_eq!(r["error"]["code"], -32600, "{r}");
    assert!(!r.to_string().contains("iiii"), "the id was echoed");
    assert!(c.call("process/list", json!({})).await["processes"].is_array());
}

/// Pings sent while a reply larger than one websocket fragment is being
/// written are each answered with their own payload, between the reply's
/// frames (a pong inside a data frame would break the client's parse),
/// and the reply arrives whole.
#[tokio::test]
async fn pings_are_answered_around_a_fragmented_reply() {
    let gw = Gateway::start("");
    let (mut c, _) = gw.session().await;
    let dir = common::scratch();
    let file = dir.path().join("big");
    // 3 MiB: a 4 MiB reply, four fragments.
    let data: Vec<u8> = (0..3usize << 20).map(|i| (i * 7 % 251) as u8).collect();
    std::fs::write(&file, &data).unwrap();
    std::fs::set_permissions(&file, std::os::unix::fs::PermissionsExt::from_mode(0o644)).unwrap();
    let mut ids = Vec::new();
    for _ in 0..3 {
        ids.push(
            c.request_id("fs/readFile", json!({"path": file.display().to_string()}))
                .await,
        );
    }
    let sent: Vec<Vec<u8>> = (0..30u8).map(|i| vec![i; 1 + usize::from(i)]).collect();
    for p in &sent {
        c.ws.send(Message::Ping(p.clone().into())).await.unwrap();
    }
    let mut pongs = Vec::new();
    let mut replies = Vec::new();
    tokio::time::timeout(EVENT_TIMEOUT * 4, async {
        while pongs.len() < sent.len() || replies.len() < ids.len() {
            match c.ws.next().await {
                Some(Ok(Message::Pong(p))) => pongs.push(p.to_vec()),
                Some(Ok(Message::Text(t))) => {
                    let v: serde_json::Value = serde_json::from_str(t.as_str()).unwrap();
                    if v["id"].as_i64().is_some_and(|id| ids.contains(&id)) {
                        replies.push(v);
                    }
                }
                Some(Ok(_)) => {}
                other => panic!("connection ended: {other:?}"),
            }
        }
    })
    .await
    .expect("pongs and replies");
    assert_eq!(pongs, sent);
    for r in replies {
        let got = common::unb64(
            r["result"]["dataBase64"]
                .as_str()
                .unwrap_or_else(|| panic!("{r}")),
        );
        assert!(got == data, "a reply came back different");
    }
}
