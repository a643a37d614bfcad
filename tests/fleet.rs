//! A fleet of replicas on loopback: sessions reachable through any replica
//! (websocket relays, forwarded gRPC calls, streams included), the fleet
//! credential on the peer listener, precise errors when an owner is gone
//! or restarted, drain, and the shipped nginx and HAProxy configurations
//! (deploy/lb/) in front of three replicas.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::free_port;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::fleet::relays_started;
use common::grpc::{authed, channel, spec};
use common::{Client, EVENT_TIMEOUT, Gateway, mint, random_secret, unb64};
use exec_gateway::transport::fleet::relay::pb as relay_pb;
use exec_gateway::transport::grpc::pb;
use futures_util::StreamExt as _;
use pb::process_service_client::ProcessServiceClient;
use pb::session_service_client::SessionServiceClient;
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::Message;
use tonic::Request;

const ALL: &str = "exec fs:read fs:write";

/// Replicas `gw-0` … sharing a client key and a fleet key.
struct Fleet {
    replicas: Vec<Option<Gateway>>,
    secret: Vec<u8>,
    fleet_key: Vec<u8>,
    _dir: tempfile::TempDir,
}

impl Fleet {
    fn start(n: usize, extra_toml: &str) -> Fleet {
        let r = common::fleet::launch(n, |d| {
            format!(
                "[[auth.keys]]\nalgorithm = \"HS256\"\nsecret_file = \"{}/hs256.key\"\n\
                 [tenants.t1]\nroot = \"/\"\n[tenants.t2]\nroot = \"/\"\n{extra_toml}",
                d.display()
            )
        });
        Fleet {
            replicas: r.replicas,
            secret: r.secret,
            fleet_key: r.fleet_key,
            _dir: r.dir,
        }
    }

    fn gw(&self, i: usize) -> &Gateway {
        self.replicas[i].as_ref().expect("replica running")
    }

    fn token(&self, tenant: &str) -> String {
        mint(&self.secret, tenant, ALL)
    }

    async fn client(&self, i: usize, tenant: &str) -> Client {
        Client::connect(&self.gw(i).url, &self.token(tenant)).await
    }

    /// `kill -9` replica `i`.
    fn kill(&mut self, i: usize) {
        let mut gw = self.replicas[i].take().expect("running");
        gw.child.kill().unwrap();
        gw.child.wait().unwrap();
    }
}

/// Resume `sid` on a fresh connection; the response. A session whose
/// previous connection has not yet been seen to close is retried, as a
/// client would.
async fn resume(c: &mut Client, sid: &str) -> Value {
    let mut r = Value::Null;
    for _ in 0..100 {
        r = c
            .call_raw(
                "initialize",
                json!({"clientName": "test", "resumeSessionId": sid}),
            )
            .await;
        let attached = r["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("already attached"));
        if !attached {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    if r.get("result").is_some() {
        c.send(&json!({"method": "initialized"})).await;
    }
    r
}

/// All output of process `id` after `after` (pipes), via process/read.
async fn read_all(c: &mut Client, id: &str) -> (String, Vec<u64>) {
    let mut text = String::new();
    let mut seqs = Vec::new();
    let mut after = 0u64;
    loop {
        let r = c
            .call(
                "process/read",
                json!({"processId": id, "afterSeq": after, "waitMs": 2000}),
            )
            .await;
        for ch in r["chunks"].as_array().unwrap() {
            seqs.push(ch["seq"].as_u64().unwrap());
            text.push_str(&String::from_utf8_lossy(&unb64(
                ch["chunk"].as_str().unwrap(),
            )));
        }
        after = r["nextSeq"].as_u64().unwrap().saturating_sub(1).max(after);
        if r["closed"] == true {
            return (text, seqs);
        }
    }
}

async fn close_code(c: &mut Client) -> u16 {
    loop {
        let m = tokio::time::timeout(EVENT_TIMEOUT, c.ws.next())
            .await
            .expect("a close frame");
        match m {
            Some(Ok(Message::Close(Some(f)))) => return u16::from(f.code),
            Some(Ok(Message::Close(None))) | None => return 1005,
            Some(Ok(_)) => {}
            Some(Err(e)) => panic!("websocket error before close: {e}"),
        }
    }
}

/// Stdout of an Attach stream until `closed`, and the seqs seen.
async fn attach_all(
    mut s: tonic::Streaming<pb::AttachResponse>,
) -> Result<(String, Vec<u64>), tonic::Status> {
    use pb::process_event::Event;
    let mut out = Vec::new();
    let mut seqs = Vec::new();
    loop {
        let item = tokio::time::timeout(EVENT_TIMEOUT, s.next())
            .await
            .expect("attach event")
            .expect("stream ended before closed")?;
        let ev = item.event.expect("event");
        seqs.push(ev.seq);
        match ev.event.expect("body") {
            Event::Output(o) => out.extend(o.data),
            Event::Exited(_) => {}
            Event::Closed(_) => return Ok((String::from_utf8_lossy(&out).into_owned(), seqs)),
        }
    }
}

#[tokio::test]
async fn a_websocket_session_resumes_through_any_replica() {
    let fleet = Fleet::start(3, "");
    for owner in 0..3 {
        let mut c = fleet.client(owner, "t1").await;
        let sid = c.initialize().await;
        assert!(
            sid.starts_with(&format!("gw-{owner}.")),
            "the id names its owner: {sid}"
        );
        c.call(
            "process/start",
            json!({"processId": "p", "argv": ["sh", "-c", "echo one; read x; echo two"],
                   "cwd": "/tmp", "env": {"PATH": "/usr/bin:/bin"}, "tty": false,
                   "pipeStdin": true}),
        )
        .await;
        drop(c);
        // Through each other replica in turn: the same session, process
        // and seq cursor.
        for via in (0..3).filter(|v| *v != owner) {
            let before = relays_started(fleet.gw(via)).await;
            let mut c = fleet.client(via, "t1").await;
            let r = resume(&mut c, &sid).await;
            assert_eq!(r["result"]["sessionId"], sid.as_str(), "{r}");
            let listed = c.call("process/list", json!({})).await;
            assert_eq!(listed["processes"][0]["processId"], "p", "{listed}");
            let r = c
                .call(
                    "process/read",
                    json!({"processId": "p", "afterSeq": 0, "waitMs": 5000}),
                )
                .await;
            let first = &r["chunks"][0];
            assert_eq!(first["seq"], 1, "{r}");
            assert_eq!(unb64(first["chunk"].as_str().unwrap()), b"one\n");
            assert_eq!(relays_started(fleet.gw(via)).await, before + 1);
            drop(c);
        }
        // Finish it through the last one.
        let mut c = fleet.client((owner + 1) % 3, "t1").await;
        resume(&mut c, &sid).await;
        c.call(
            "process/write",
            json!({"processId": "p", "chunk": common::b64(b"\n"), "writeId": "w1"}),
        )
        .await;
        let (text, _) = read_all(&mut c, "p").await;
        assert_eq!(text, "one\ntwo\n");
    }
}

#[tokio::test]
async fn a_relay_applies_the_owners_tenant_check() {
    let fleet = Fleet::start(2, "");
    let (mut c, sid) = {
        let mut c = fleet.client(0, "t1").await;
        let sid = c.initialize().await;
        (c, sid)
    };
    c.start("secret", &["sleep", "30"]).await;
    drop(c);
    // Another tenant, through the other replica: unknown, as it is locally.
    let mut other = fleet.client(1, "t2").await;
    let r = resume(&mut other, &sid).await;
    assert_eq!(r["error"]["code"], -32600, "{r}");
    assert_eq!(
        r["error"]["message"],
        format!("unknown session id {sid}"),
        "{r}"
    );
    // And over gRPC.
    let ch = channel(&fleet.gw(1).grpc).await;
    let e = ProcessServiceClient::new(ch)
        .list(authed(
            pb::ListRequest {
                session_id: sid.clone(),
            },
            &fleet.token("t2"),
        ))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::NotFound, "{e:?}");
    // A token the fleet does not know is refused before any relay.
    let forged = mint(b"not-the-fleets-client-key-0123456789", "t1", ALL);
    let (status, _) = fleet
        .gw(1)
        .handshake("/", Some(&format!("Bearer {forged}")))
        .await;
    assert_eq!(status, 401);
}

#[tokio::test]
async fn the_peer_listener_requires_the_fleet_credential() {
    let fleet = Fleet::start(2, "");
    let peer = format!("http://{}", fleet.gw(0).fleet.clone().expect("fleet line"));
    let token = fleet.token("t1");
    let now = common::now();
    let credential = |key: &[u8], aud: &str| {
        jsonwebtoken::encode(
            &jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256),
            &json!({"iss": "gw-1", "aud": aud, "iat": now, "exp": now + 60}),
            &jsonwebtoken::EncodingKey::from_secret(key),
        )
        .unwrap()
    };
    let good = credential(&fleet.fleet_key, "gw-0");
    let cases: Vec<(&str, Option<String>, bool)> = vec![
        ("no credential", None, true),
        (
            "another key",
            Some(credential(&random_secret(), "gw-0")),
            true,
        ),
        (
            "another replica's",
            Some(credential(&fleet.fleet_key, "gw-1")),
            true,
        ),
        ("garbage", Some("x.y.z".to_owned()), true),
        (
            "a good credential without a client token",
            Some(good.clone()),
            false,
        ),
    ];
    for (what, cred, with_client_token) in cases {
        let ch = channel(&peer).await;
        let mut req = Request::new(tokio_stream::iter(vec![relay_pb::OpenRequest {
            text: br#"{"id":1,"method":"initialize","params":{}}"#.to_vec().into(),
        }]));
        if let Some(c) = &cred {
            req.metadata_mut()
                .insert("x-exec-gateway-fleet", c.parse().unwrap());
        }
        if with_client_token {
            req.metadata_mut()
                .insert("authorization", format!("Bearer {token}").parse().unwrap());
        }
        let e = relay_pb::relay_service_client::RelayServiceClient::new(ch)
            .open(req)
            .await
            .err()
            .unwrap_or_else(|| panic!("{what}: accepted"));
        assert_eq!(e.code(), tonic::Code::Unauthenticated, "{what}: {e:?}");
    }
    let (_, metrics) = fleet.gw(0).admin_get("/metrics").await;
    assert!(
        metrics.contains("exec_gateway_fleet_auth_failures_total{reason=\"invalid\"} 3"),
        "{metrics}"
    );
    // With both, the relay protocol works: a new session on the owner.
    let ch = channel(&peer).await;
    let mut req = Request::new(tokio_stream::iter(vec![relay_pb::OpenRequest {
        text: br#"{"id":1,"method":"initialize","params":{"clientName":"x"}}"#
            .to_vec()
            .into(),
    }]));
    req.metadata_mut()
        .insert("x-exec-gateway-fleet", good.parse().unwrap());
    req.metadata_mut()
        .insert("authorization", format!("Bearer {token}").parse().unwrap());
    let mut s = relay_pb::relay_service_client::RelayServiceClient::new(ch)
        .open(req)
        .await
        .unwrap()
        .into_inner();
    let first = tokio::time::timeout(EVENT_TIMEOUT, s.message())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    let Some(relay_pb::open_response::Frame::Text(t)) = first.frame else {
        panic!("not a text frame")
    };
    let v: Value = serde_json::from_slice(&t).unwrap();
    assert!(
        v["result"]["sessionId"]
            .as_str()
            .unwrap()
            .starts_with("gw-0."),
        "{v}"
    );
}

#[tokio::test]
async fn grpc_calls_and_streams_reach_the_owner_through_any_replica() {
    let fleet = Fleet::start(3, "");
    let token = fleet.token("t1");
    let chans = [
        channel(&fleet.gw(0).grpc).await,
        channel(&fleet.gw(1).grpc).await,
        channel(&fleet.gw(2).grpc).await,
    ];
    let sid = SessionServiceClient::new(chans[0].clone())
        .create_session(authed(pb::CreateSessionRequest::default(), &token))
        .await
        .unwrap()
        .into_inner()
        .session_id;
    assert!(sid.starts_with("gw-0."), "{sid}");
    // Start through gw-1, stream stdin through gw-2, attach through gw-1.
    ProcessServiceClient::new(chans[1].clone())
        .start(authed(
            pb::StartRequest {
                session_id: sid.clone(),
                spec: Some(pb::ProcessSpec {
                    pipe_stdin: true,
                    ..spec("cat", &["cat"])
                }),
            },
            &token,
        ))
        .await
        .unwrap();
    let input = vec![
        pb::StreamInputRequest {
            session_id: sid.clone(),
            process_id: "cat".into(),
            data: b"relayed ".to_vec().into(),
        },
        pb::StreamInputRequest {
            session_id: String::new(),
            process_id: String::new(),
            data: b"stdin\n".to_vec().into(),
        },
    ];
    let written = ProcessServiceClient::new(chans[2].clone())
        .stream_input(authed(tokio_stream::iter(input), &token))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(written.bytes_written, 14);
    ProcessServiceClient::new(chans[0].clone())
        .close_stdin(authed(
            pb::CloseStdinRequest {
                session_id: sid.clone(),
                process_id: "cat".into(),
            },
            &token,
        ))
        .await
        .unwrap();
    let s = ProcessServiceClient::new(chans[1].clone())
        .attach(authed(
            pb::AttachRequest {
                session_id: sid.clone(),
                process_id: "cat".into(),
                after_seq: 0,
            },
            &token,
        ))
        .await
        .unwrap()
        .into_inner();
    let (out, _) = attach_all(s).await.unwrap();
    assert_eq!(out, "relayed stdin\n");
    // Exec in the session through gw-2.
    let mut exec = ProcessServiceClient::new(chans[2].clone())
        .exec(authed(
            pb::ExecRequest {
                session_id: sid.clone(),
                spec: Some(spec("e", &["echo", "exec"])),
            },
            &token,
        ))
        .await
        .unwrap()
        .into_inner();
    let mut got = Vec::new();
    while let Some(item) = tokio::time::timeout(EVENT_TIMEOUT, exec.next())
        .await
        .unwrap()
    {
        if let Some(pb::process_event::Event::Output(o)) = item.unwrap().event.and_then(|e| e.event)
        {
            got.extend(o.data);
        }
    }
    assert_eq!(got, b"exec\n");
    let listed = ProcessServiceClient::new(chans[2].clone())
        .list(authed(
            pb::ListRequest {
                session_id: sid.clone(),
            },
            &token,
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(listed.processes.len(), 2);
    assert!(relays_started(fleet.gw(1)).await >= 2);
    assert!(relays_started(fleet.gw(2)).await >= 3);
}

#[tokio::test]
async fn an_owner_that_is_gone_or_restarted_is_named() {
    let mut fleet = Fleet::start(3, "");
    let token = fleet.token("t1");
    let mut c = fleet.client(1, "t1").await;
    let sid = c.initialize().await;
    c.start("p", &["sleep", "60"]).await;
    drop(c);
    // A live relay to gw-1 through gw-0, and a gRPC stream through gw-2.
    let mut relayed = fleet.client(0, "t1").await;
    assert!(resume(&mut relayed, &sid).await.get("result").is_some());
    let ch2 = channel(&fleet.gw(2).grpc).await;
    let attach = ProcessServiceClient::new(ch2.clone())
        .attach(authed(
            pb::AttachRequest {
                session_id: sid.clone(),
                process_id: "p".into(),
                after_seq: 0,
            },
            &token,
        ))
        .await
        .unwrap()
        .into_inner();
    // A session of a replica that stays.
    let mut c = fleet.client(2, "t1").await;
    let survivor = c.initialize().await;
    drop(c);

    fleet.kill(1);

    // The live relay closes with 4001 (the owner is gone).
    assert_eq!(close_code(&mut relayed).await, 4001);
    // The gRPC stream ends with UNAVAILABLE naming it.
    let e = attach_all(attach).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unavailable, "{e:?}");
    assert!(e.message().contains("replica gw-1"), "{e:?}");
    // A resume through any survivor: -32007 naming the replica.
    for via in [0, 2] {
        let mut c = fleet.client(via, "t1").await;
        let r = resume(&mut c, &sid).await;
        assert_eq!(r["error"]["code"], -32007, "{r}");
        assert_eq!(r["error"]["data"]["replica"], "gw-1", "{r}");
        let msg = r["error"]["message"].as_str().unwrap();
        assert!(
            msg.contains("owned by replica gw-1, which is unavailable"),
            "{msg}"
        );
    }
    let e = ProcessServiceClient::new(ch2.clone())
        .list(authed(
            pb::ListRequest {
                session_id: sid.clone(),
            },
            &token,
        ))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unavailable, "{e:?}");
    assert!(e.message().contains("replica gw-1"), "{e:?}");
    // A file call naming the session (field 15) is routed to its owner too.
    let e = pb::file_service_client::FileServiceClient::new(ch2.clone())
        .get_metadata(authed(
            pb::GetMetadataRequest {
                path: "/".into(),
                session_id: sid.clone(),
            },
            &token,
        ))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unavailable, "{e:?}");
    assert!(e.message().contains("replica gw-1"), "{e:?}");
    // Only gw-1's sessions fail.
    let mut c = fleet.client(0, "t1").await;
    assert!(resume(&mut c, &survivor).await.get("result").is_some());
    // An id of an earlier run of gw-0 (another boot) is told apart.
    let mut parts: Vec<&str> = survivor.splitn(3, '.').collect();
    parts[0] = "gw-0";
    parts[1] = "00000000";
    let earlier = parts.join(".");
    for via in [0, 2] {
        let mut c = fleet.client(via, "t1").await;
        let r = resume(&mut c, &earlier).await;
        assert_eq!(r["error"]["data"]["reason"], "ownerRestarted", "{r}");
        assert!(
            r["error"]["message"]
                .as_str()
                .unwrap()
                .contains("replica gw-0, which has restarted"),
            "{r}"
        );
    }
    // A replica the fleet does not have.
    let mut c = fleet.client(0, "t1").await;
    let r = resume(&mut c, "gw-9.0a0b0c0d.x").await;
    assert_eq!(r["error"]["code"], -32007, "{r}");
}

#[tokio::test]
async fn a_draining_replica_serves_its_sessions_and_takes_no_new_ones() {
    let mut fleet = Fleet::start(2, "[server]\nshutdown_grace = \"60s\"\n");
    let mut direct = fleet.client(0, "t1").await;
    let sid = direct.initialize().await;
    let marker = format!("{}/drain-go", common::scratch().keep().display());
    direct
        .start(
            "job",
            &[
                "sh",
                "-c",
                &format!(
                    "echo started; while [ ! -e {marker} ]; do sleep 0.05; done; echo finished"
                ),
            ],
        )
        .await;
    fleet.gw(0).signal(15);
    for _ in 0..500 {
        if fleet.gw(0).http_get("/readyz").await.0 == 503 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(fleet.gw(0).http_get("/readyz").await.0, 503);
    // No new session on it, over either door: a new websocket gets 503 at
    // the handshake (a balancer retries it on another replica).
    let mut req = tokio_tungstenite::tungstenite::client::IntoClientRequest::into_client_request(
        fleet.gw(0).url.as_str(),
    )
    .unwrap();
    req.headers_mut().insert(
        "authorization",
        format!("Bearer {}", fleet.token("t1")).parse().unwrap(),
    );
    match tokio_tungstenite::connect_async(req).await {
        Err(tokio_tungstenite::tungstenite::Error::Http(resp)) => {
            assert_eq!(resp.status(), 503);
            assert_eq!(resp.headers()["retry-after"], "1");
        }
        other => panic!("a draining replica upgraded a new connection: {other:?}"),
    }
    let e = SessionServiceClient::new(channel(&fleet.gw(0).grpc).await)
        .create_session(authed(
            pb::CreateSessionRequest::default(),
            &fleet.token("t1"),
        ))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unavailable);
    // Its live session goes on, directly and through a relay.
    let listed = direct.call("process/list", json!({})).await;
    assert_eq!(listed["processes"][0]["processId"], "job", "{listed}");
    let mut relayed = fleet.client(1, "t1").await;
    drop(direct);
    let r = resume(&mut relayed, &sid).await;
    assert!(r.get("result").is_some(), "{r}");
    // A read before the job ends tells the draining gateway that this
    // client reads with `process/read` (docs/operations.md, "Shutdown"):
    // one it has not seen read follows notifications and is closed (1012)
    // once they are all queued, which could come before this client's
    // first read reached the owner (it did, once, on a loaded CI machine).
    relayed
        .call(
            "process/read",
            json!({"processId": "job", "afterSeq": 0, "waitMs": 0}),
        )
        .await;
    std::fs::write(&marker, "").unwrap();
    let (text, _) = read_all(&mut relayed, "job").await;
    assert_eq!(text, "started\nfinished\n");
    // Then it stops: the client is told to reconnect (1012).
    assert_eq!(close_code(&mut relayed).await, 1012);
    let mut gw0 = fleet.replicas[0].take().unwrap();
    assert!(gw0.wait_exit().success());
}

// ---------------------------------------------------------------------
// Real balancers in front of three replicas.

/// The shipped configuration with the example addresses, listeners and
/// paths replaced by this test's.
fn balancer_config(file: &str, fleet: &Fleet, ws_port: u16, grpc_port: u16, dir: &Path) -> String {
    let text = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("deploy/lb")
            .join(file),
    )
    .unwrap();
    let mut out = String::new();
    for line in text.lines() {
        let mut line = line.to_owned();
        for i in 0..3 {
            let host = format!("gw-{i}.example.internal");
            if line.contains(&host) {
                let gw = fleet.gw(i);
                let ws_port_i = gw.addr.rsplit(':').next().unwrap().to_owned();
                let grpc = gw.grpc.trim_start_matches("http://").to_owned();
                line = line
                    .replace(&format!("{host}:8765"), &gw.addr)
                    .replace(&format!("{host}:50051"), &grpc)
                    .replace(" port 8765", &format!(" port {ws_port_i}"));
            }
        }
        line = line
            .replace("listen 8080;", &format!("listen 127.0.0.1:{ws_port};"))
            .replace(
                "listen 8081 http2;",
                &format!("listen 127.0.0.1:{grpc_port} http2;"),
            )
            .replace("bind :8080", &format!("bind 127.0.0.1:{ws_port}"))
            .replace("bind :8081", &format!("bind 127.0.0.1:{grpc_port}"))
            .replace("/var/log/nginx/", &format!("{}/", dir.display()))
            .replace(
                "/run/nginx-exec-gateway.pid",
                &format!("{}/nginx.pid", dir.display()),
            );
        out.push_str(&line);
        out.push('\n');
    }
    out
}

struct Balancer {
    child: Child,
    ws: String,
    grpc: String,
    /// Where its access log goes.
    log: PathBuf,
}

impl Drop for Balancer {
    fn drop(&mut self) {
        // SIGTERM: nginx's master takes its workers with it (SIGKILL
        // would leave them serving).
        let _ = Command::new("kill")
            .arg(self.child.id().to_string())
            .status();
        let _ = self.child.wait();
    }
}

fn which(bin: &str) -> Option<PathBuf> {
    ["/usr/sbin", "/usr/bin", "/sbin", "/bin"]
        .iter()
        .map(|d| Path::new(d).join(bin))
        .find(|p| p.exists())
}

async fn start_balancer(kind: &str, fleet: &Fleet, dir: &Path) -> Option<Balancer> {
    let (ws_port, grpc_port) = (free_port(), free_port());
    let (child, log) = match kind {
        "nginx" => {
            let Some(bin) = which("nginx") else {
                eprintln!("skipped: nginx is not installed (.ci/run installs it)");
                return None;
            };
            let conf = dir.join("nginx.conf");
            std::fs::write(
                &conf,
                balancer_config("nginx.conf", fleet, ws_port, grpc_port, dir),
            )
            .unwrap();
            let child = Command::new(bin)
                .args(["-p", &dir.display().to_string(), "-g", "daemon off;", "-c"])
                .arg(&conf)
                .stdout(Stdio::null())
                .stderr(Stdio::inherit())
                .spawn()
                .unwrap();
            (child, dir.join("exec-gateway.access.log"))
        }
        _ => {
            let Some(bin) = which("haproxy") else {
                eprintln!("skipped: haproxy is not installed (.ci/run installs it)");
                return None;
            };
            let conf = dir.join("haproxy.cfg");
            std::fs::write(
                &conf,
                balancer_config("haproxy.cfg", fleet, ws_port, grpc_port, dir),
            )
            .unwrap();
            let log = dir.join("haproxy.log");
            let child = Command::new(bin)
                .args(["-db", "-f"])
                .arg(&conf)
                .stdout(std::fs::File::create(&log).unwrap())
                .stderr(Stdio::inherit())
                .spawn()
                .unwrap();
            (child, log)
        }
    };
    let b = Balancer {
        child,
        ws: format!("ws://127.0.0.1:{ws_port}/"),
        grpc: format!("http://127.0.0.1:{grpc_port}"),
        log,
    };
    common::eventually("the balancer listens", || {
        std::net::TcpStream::connect(("127.0.0.1", ws_port)).is_ok()
            && std::net::TcpStream::connect(("127.0.0.1", grpc_port)).is_ok()
    })
    .await;
    if kind == "haproxy" {
        // Health checks mark every replica up (rise 2, inter 1s).
        tokio::time::sleep(Duration::from_millis(2500)).await;
    }
    Some(b)
}

async fn balancer_suite(kind: &str) {
    let mut fleet = Fleet::start(3, "[server]\nshutdown_grace = \"60s\"\n");
    let dir = tempfile::tempdir().unwrap();
    let Some(lb) = start_balancer(kind, &fleet, dir.path()).await else {
        return;
    };
    let token = fleet.token("t1");

    // 20 of 20 resumes through the balancer, wherever they land.
    let mut sessions = Vec::new();
    for i in 0..20 {
        let mut c = Client::connect(&lb.ws, &token).await;
        let sid = c.initialize().await;
        c.start("p", &["echo", &format!("n{i}")]).await;
        sessions.push((sid, format!("n{i}\n")));
    }
    let relays_before: u64 = {
        let mut n = 0;
        for i in 0..3 {
            n += relays_started(fleet.gw(i)).await;
        }
        n
    };
    for (sid, want) in &sessions {
        let mut c = Client::connect(&lb.ws, &token).await;
        let r = resume(&mut c, sid).await;
        assert_eq!(r["result"]["sessionId"], sid.as_str(), "{kind}: {r}");
        let (text, _) = read_all(&mut c, "p").await;
        assert_eq!(&text, want, "{kind}");
    }
    let mut relays_after = 0;
    for i in 0..3 {
        relays_after += relays_started(fleet.gw(i)).await;
    }
    assert!(
        relays_after > relays_before,
        "{kind}: round robin must land some resumes on non-owners"
    );
    let owners: std::collections::BTreeSet<&str> = sessions
        .iter()
        .map(|(s, _)| s.split('.').next().unwrap())
        .collect();
    assert!(owners.len() >= 2, "{kind}: sessions spread: {owners:?}");

    // A preview through the balancer (docs/preview.md, "Fleet"): wherever
    // each request lands, the owner's server answers, relayed by the
    // replicas that do not own the session.
    let preview_token = mint(&fleet.secret, "t1", "exec preview");
    let mut web = Client::connect(&lb.ws, &preview_token).await;
    let web_sid = web.initialize().await;
    web.start(
        "web",
        &[
            "python3",
            "-m",
            "http.server",
            "8000",
            "--bind",
            "127.0.0.1",
        ],
    )
    .await;
    let lb_addr = lb.ws.trim_start_matches("ws://").trim_end_matches('/');
    let get = || {
        let out = Command::new("curl")
            .args(["-s", "-o", "/dev/null", "-w", "%{http_code}", "-H"])
            .arg(format!("Authorization: Bearer {preview_token}"))
            .arg(format!("http://{lb_addr}/preview/{web_sid}/8000/"))
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let mut listening = false;
    for _ in 0..200 {
        if get() == "200" {
            listening = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(listening, "{kind}: the preview never answered");
    for _ in 0..6 {
        assert_eq!(get(), "200", "{kind}: a preview through the balancer");
    }
    // The server ends (a replica's drain below waits for its processes).
    web.call("process/terminate", json!({"processId": "web"}))
        .await;
    read_all(&mut web, "web").await;

    // Started over websocket, attached over gRPC, one seq cursor.
    let mut c = Client::connect(&lb.ws, &token).await;
    let sid = c.initialize().await;
    c.start(
        "x",
        &["sh", "-c", "echo a; sleep 0.3; echo b; sleep 0.3; echo c"],
    )
    .await;
    let r = c
        .call(
            "process/read",
            json!({"processId": "x", "afterSeq": 0, "waitMs": 5000}),
        )
        .await;
    let first_seq = r["chunks"][0]["seq"].as_u64().unwrap();
    let grpc = channel(&lb.grpc).await;
    let s = ProcessServiceClient::new(grpc.clone())
        .attach(authed(
            pb::AttachRequest {
                session_id: sid.clone(),
                process_id: "x".into(),
                after_seq: first_seq,
            },
            &token,
        ))
        .await
        .unwrap()
        .into_inner();
    let (out, seqs) = attach_all(s).await.unwrap();
    assert_eq!(seqs[0], first_seq + 1, "{kind}: the cursor carried over");
    assert_eq!(out, "b\nc\n", "{kind}");

    // gRPC balanced per request: every call succeeds wherever it lands.
    let mut sc = SessionServiceClient::new(grpc.clone());
    let mut pc = ProcessServiceClient::new(grpc.clone());
    let gsid = sc
        .create_session(authed(pb::CreateSessionRequest::default(), &token))
        .await
        .unwrap()
        .into_inner()
        .session_id;
    for i in 0..10 {
        let id = format!("g{i}");
        pc.start(authed(
            pb::StartRequest {
                session_id: gsid.clone(),
                spec: Some(spec(&id, &["echo", &id])),
            },
            &token,
        ))
        .await
        .unwrap_or_else(|e| panic!("{kind}: start {i}: {e:?}"));
        let mut text = Vec::new();
        let mut after = 0;
        loop {
            let r = pc
                .read(authed(
                    pb::ReadRequest {
                        session_id: gsid.clone(),
                        process_id: id.clone(),
                        after_seq: after,
                        max_bytes: 0,
                        wait_ms: 2000,
                    },
                    &token,
                ))
                .await
                .unwrap_or_else(|e| panic!("{kind}: read {i}: {e:?}"))
                .into_inner();
            for ch in &r.chunks {
                text.extend_from_slice(&ch.data);
            }
            after = r.next_seq.saturating_sub(1).max(after);
            if r.closed {
                break;
            }
        }
        assert_eq!(text, format!("{id}\n").as_bytes(), "{kind}");
        pc.list(authed(
            pb::ListRequest {
                session_id: gsid.clone(),
            },
            &token,
        ))
        .await
        .unwrap_or_else(|e| panic!("{kind}: list {i}: {e:?}"));
    }

    // A token in the query string (some clients can only do that).
    let (ws, _) = tokio_tungstenite::connect_async(format!("{}?access_token={token}", lb.ws))
        .await
        .unwrap();
    let mut q = Client::from_ws(ws);
    q.initialize().await;
    drop(q);

    // Drain gw-2: its live session finishes, and it takes no new one.
    let mut on2 = fleet.client(2, "t1").await;
    let sid2 = on2.initialize().await;
    let marker = dir.path().join("go");
    std::fs::set_permissions(
        dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o1777),
    )
    .unwrap();
    on2.start(
        "job",
        &[
            "sh",
            "-c",
            &format!(
                "echo started; while [ ! -e {} ]; do sleep 0.05; done; echo finished",
                marker.display()
            ),
        ],
    )
    .await;
    drop(on2);
    fleet.gw(2).signal(15);
    while fleet.gw(2).http_get("/readyz").await.0 != 503 {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Every new session sent during the drain succeeds, though the
    // balancer has not yet seen gw-2 unready (nginx never checks): gw-2
    // answers the handshake 503 and the balancer retries elsewhere.
    let mut new_ids = Vec::new();
    for i in 0..12 {
        let mut c = Client::connect(&lb.ws, &token).await;
        let r = c
            .call_raw("initialize", json!({"clientName": "test"}))
            .await;
        let id = r["result"]["sessionId"].as_str();
        new_ids.push(
            id.unwrap_or_else(|| panic!("{kind}: new session {i} failed: {r}"))
                .to_owned(),
        );
    }
    assert!(
        new_ids.iter().all(|id| !id.starts_with("gw-2.")),
        "{kind}: a draining replica took a new session: {new_ids:?}"
    );
    let mut c = Client::connect(&lb.ws, &token).await;
    assert!(
        resume(&mut c, &sid2).await.get("result").is_some(),
        "{kind}"
    );
    // A read before the job ends tells the draining gateway that this
    // client reads with `process/read` (docs/operations.md, "Shutdown"):
    // a client it has not seen read is one that follows notifications,
    // closed (1012) once they are all queued, and the job's end could
    // come before this client's first read reached gw-2 (it did, once,
    // on a loaded machine).
    c.call(
        "process/read",
        json!({"processId": "job", "afterSeq": 0, "waitMs": 0}),
    )
    .await;
    std::fs::write(&marker, "").unwrap();
    let (text, _) = read_all(&mut c, "job").await;
    assert_eq!(text, "started\nfinished\n", "{kind}");
    drop(c);
    let mut gw2 = fleet.replicas[2].take().unwrap();
    assert!(gw2.wait_exit().success(), "{kind}");

    // kill -9 gw-1: only its sessions fail, with the precise error.
    fleet.kill(1);
    // The token in the query right after a replica died: the balancer's
    // failed attempts to it must not log the request line. Each succeeds
    // at once: the balancer tries the next replica after a refused
    // connection (nginx `proxy_next_upstream_tries 3`: all three), and
    // gw-0 is up. A 502 here means the balancer had marked gw-0 failed too
    // (nginx `max_fails=1`, for `fail_timeout=5s`, longer than any retry a
    // test would make): a replica closed a connection before its answer,
    // as relayed previews of an HTTP/1.0 server once did.
    for _ in 0..3 {
        let url = format!("{}?access_token={token}", lb.ws);
        let (ws, _) = tokio_tungstenite::connect_async(&url)
            .await
            .unwrap_or_else(|e| panic!("{kind}: {e}"));
        drop(ws);
    }
    let errors =
        std::fs::read_to_string(dir.path().join("exec-gateway.error.log")).unwrap_or_default();
    assert!(!errors.contains(&token), "{kind}: a token in the error log");

    for (sid, want) in &sessions {
        let mut c = Client::connect(&lb.ws, &token).await;
        let r = resume(&mut c, sid).await;
        let owner = sid.split('.').next().unwrap();
        match owner {
            "gw-0" => {
                assert!(r.get("result").is_some(), "{kind}: {r}");
                let (text, _) = read_all(&mut c, "p").await;
                assert_eq!(&text, want);
            }
            "gw-1" => {
                assert_eq!(r["error"]["code"], -32007, "{kind}: {r}");
                assert_eq!(r["error"]["data"]["replica"], "gw-1", "{kind}: {r}");
            }
            _ => {
                // gw-2 drained and stopped: equally gone.
                assert_eq!(r["error"]["data"]["replica"], "gw-2", "{kind}: {r}");
            }
        }
    }

    // The access log has every request and never a token.
    let mut log = String::new();
    for _ in 0..50 {
        log = std::fs::read_to_string(&lb.log).unwrap_or_default();
        if log.lines().count() > 40 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(log.lines().count() > 40, "{kind}: access log: {log}");
    assert!(!log.contains(&token), "{kind}: a token in the access log");
    assert!(
        !log.contains("access_token"),
        "{kind}: a query string in the access log"
    );
}

#[tokio::test]
async fn behind_nginx() {
    balancer_suite("nginx").await;
}

#[tokio::test]
async fn behind_haproxy() {
    balancer_suite("haproxy").await;
}

// ---------------------------------------------------------------------------
// Tracing across the fleet.

/// Spans an OTLP collector received: (replica, span name, trace id).
type Received = std::sync::Arc<parking_lot::Mutex<Vec<(String, String, Vec<u8>)>>>;

#[derive(Clone, Default)]
struct Collector(Received);

#[tonic::async_trait]
impl opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::TraceService
    for Collector
{
    async fn export(
        &self,
        req: Request<opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest>,
    ) -> Result<
        tonic::Response<
            opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceResponse,
        >,
        tonic::Status,
    > {
        use opentelemetry_proto::tonic::common::v1::any_value::Value as Any;
        for rs in req.into_inner().resource_spans {
            let instance = rs
                .resource
                .iter()
                .flat_map(|r| r.attributes.iter())
                .find(|kv| kv.key == "service.instance.id")
                .and_then(|kv| kv.value.as_ref())
                .and_then(|v| match &v.value {
                    Some(Any::StringValue(s)) => Some(s.clone()),
                    _ => None,
                })
                .unwrap_or_default();
            for ss in rs.scope_spans {
                for sp in ss.spans {
                    self.0.lock().push((instance.clone(), sp.name, sp.trace_id));
                }
            }
        }
        Ok(tonic::Response::new(
            opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceResponse {
                partial_success: None,
            },
        ))
    }
}

/// An OTLP/gRPC collector on loopback: its address and what it received.
async fn collector() -> (String, Received) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let c = Collector::default();
    let received = c.0.clone();
    exec_gateway::task::start(
        "otlp-collector",
        tonic::transport::Server::builder()
            .add_service(
                opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::TraceServiceServer::new(c),
            )
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
    (addr, received)
}

/// One `process/start` sent through nginx, reaching a replica that relays
/// it to the session's owner, which spawns through its worker: every hop
/// reports a span of the trace the client started (its `trace` field).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_trace_spans_balancer_relay_owner_and_worker() {
    let (addr, received) = collector().await;
    let fleet = Fleet::start(
        3,
        &format!("[tracing]\notlp_endpoint = \"http://{addr}\"\nexport_timeout = \"2s\"\n"),
    );
    let dir = tempfile::tempdir().unwrap();
    let Some(lb) = start_balancer("nginx", &fleet, dir.path()).await else {
        return;
    };
    // The session lives on gw-0; a connection through the balancer that
    // lands on another replica relays to it.
    let mut c = fleet.client(0, "t1").await;
    let sid = c.initialize().await;
    drop(c);
    let token = fleet.token("t1");
    let mut relayed = None;
    for _ in 0..20 {
        let before = [
            relays_started(fleet.gw(1)).await,
            relays_started(fleet.gw(2)).await,
        ];
        let mut c = Client::connect(&lb.ws, &token).await;
        let r = resume(&mut c, &sid).await;
        assert_eq!(r["result"]["sessionId"], sid.as_str(), "{r}");
        if relays_started(fleet.gw(1)).await > before[0] {
            relayed = Some((c, "gw-1"));
            break;
        }
        if relays_started(fleet.gw(2)).await > before[1] {
            relayed = Some((c, "gw-2"));
            break;
        }
    }
    let (mut c, relay) = relayed.expect("round robin reaches another replica");
    let trace_id = "4bf92f3577b34da6a3ce929d0e0e4736";
    c.send(&json!({
        "id": 7, "method": "process/start",
        "params": {"processId": "traced", "argv": ["true"], "cwd": "/tmp",
                   "env": {"PATH": "/usr/bin:/bin"}, "tty": false},
        "trace": {"traceparent": format!("00-{trace_id}-00f067aa0ba902b7-01")},
    }))
    .await;
    let reply = c.response(7).await;
    assert!(reply.get("result").is_some(), "{reply}");
    let want: Vec<u8> = (0..16)
        .map(|i| u8::from_str_radix(&trace_id[2 * i..2 * i + 2], 16).unwrap())
        .collect();
    let hops = [
        (relay, "relay.frame"),
        ("gw-0", "jsonrpc.call"),
        ("gw-0", "worker.spawn"),
    ];
    common::eventually("every hop's span reached the collector", || {
        let got = received.lock();
        hops.iter().all(|(replica, name)| {
            got.iter()
                .any(|(r, n, t)| r == replica && n == name && *t == want)
        })
    })
    .await;
    // Nothing of the trace was reported under another trace id by the
    // owner's call span.
    assert!(
        received
            .lock()
            .iter()
            .filter(|(r, n, _)| r == "gw-0" && n == "jsonrpc.call")
            .all(|(_, _, t)| *t == want),
    );

    // gRPC: `traceparent` metadata through the balancer (per-request
    // balancing); a call that lands on another replica is forwarded to
    // the owner with the trace, and both report it.
    let sid = SessionServiceClient::new(channel(&fleet.gw(0).grpc).await)
        .create_session(authed(pb::CreateSessionRequest::default(), &token))
        .await
        .unwrap()
        .into_inner()
        .session_id;
    let lb_channel = channel(&lb.grpc).await;
    let ids: Vec<String> = (0..6)
        .map(|i| format!("{i:02x}{}", &trace_id[2..]))
        .collect();
    for (i, id) in ids.iter().enumerate() {
        let mut req = authed(
            pb::StartRequest {
                session_id: sid.clone(),
                spec: Some(spec(&format!("g{i}"), &["true"])),
            },
            &token,
        );
        req.metadata_mut().insert(
            "traceparent",
            format!("00-{id}-00f067aa0ba902b7-01").parse().unwrap(),
        );
        ProcessServiceClient::new(lb_channel.clone())
            .start(req)
            .await
            .unwrap();
    }
    let bytes = |hex: &str| -> Vec<u8> {
        (0..16)
            .map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).unwrap())
            .collect()
    };
    common::eventually("a forwarded gRPC call's trace from both replicas", || {
        let got = received.lock();
        ids.iter().map(|id| bytes(id)).any(|t| {
            let of = |r: &dyn Fn(&str) -> bool, name: &str| {
                got.iter()
                    .any(|(rep, n, tt)| r(rep) && n == name && *tt == t)
            };
            of(&|r| r != "gw-0", "grpc.call")
                && of(&|r| r == "gw-0", "grpc.call")
                && of(&|r| r == "gw-0", "worker.spawn")
        })
    })
    .await;
}

/// Issue 42 #11 through a relay: a client of the draining owner that lands
/// on another replica and follows notifications gets every byte, the exit
/// and the owner's 1012, and its close reply (passed back through the
/// relay) ends the owner's drain: with a 600 s grace the owner exits within
/// the test's own bound.
#[tokio::test]
async fn a_draining_owner_ends_when_its_relayed_notification_client_has_everything() {
    const BYTES: usize = 2 * 1024 * 1024;
    let mut fleet = Fleet::start(2, "[server]\nshutdown_grace = \"600s\"\n");
    let mut direct = fleet.client(0, "t1").await;
    let sid = direct.initialize().await;
    drop(direct);
    let mut relayed = fleet.client(1, "t1").await;
    let r = resume(&mut relayed, &sid).await;
    assert!(r.get("result").is_some(), "{r}");
    relayed
        .start("job", &["sh", "-c", &format!("head -c {BYTES} /dev/zero")])
        .await;
    fleet.gw(0).signal(15);
    let got = relayed.collect("job").await;
    assert_eq!(got.stdout.len(), BYTES, "every byte");
    assert_eq!(got.exit_code, Some(0));
    assert_eq!(close_code(&mut relayed).await, 1012);
    while let Some(Ok(_)) = relayed.ws.next().await {}
    let mut gw0 = fleet.replicas[0].take().unwrap();
    assert!(gw0.wait_exit().success());
}
