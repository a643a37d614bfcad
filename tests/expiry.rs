//! A token's expiry holds for the connections it opened: seen on
//! d384597, a websocket kept working after its token's `exp` (12 s later
//! `process/start` still ran). Now the connection is closed (1008) when
//! the token expires, its session detached, and a fresh token resumes it.
//! A gRPC stream ends (UNAUTHENTICATED) at its token's expiry, and when a
//! reload removes the key that verified its token.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::disallowed_methods
)]

mod common;

use common::{Client, EVENT_TIMEOUT, Gateway, now};
use futures_util::StreamExt as _;
use serde_json::json;
use tokio_tungstenite::tungstenite::Message;

fn token_until(secret: &[u8], exp: u64) -> String {
    let claims = json!({"sub": "test", "tenant": "t1", "scope": common::ALL_SCOPES, "exp": exp});
    jsonwebtoken::encode(
        &jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256),
        &claims,
        &jsonwebtoken::EncodingKey::from_secret(secret),
    )
    .unwrap()
}

/// A gateway whose tokens expire on the second (no leeway).
fn gateway() -> Gateway {
    Gateway::start_with(|d| {
        format!(
            "[auth]\nleeway = \"0s\"\n[[auth.keys]]\nalgorithm = \"HS256\"\nsecret_file = \"{}/hs256.key\"\n\
             [tenants.t1]\nroot = \"/\"\n",
            d.display()
        )
    })
}

#[tokio::test]
async fn a_connection_closes_when_its_token_expires_and_a_fresh_token_resumes_its_session() {
    let gw = gateway();
    let short = token_until(&gw.secret, now() + 3);
    let mut c = Client::connect(&gw.url, &short).await;
    let sid = c.initialize().await;
    c.start("p", &["sleep", "60"]).await;
    // Closed by the gateway, with the reason, once the token expires.
    let code = tokio::time::timeout(EVENT_TIMEOUT, async {
        loop {
            match c.ws.next().await {
                Some(Ok(Message::Close(Some(f)))) => break Some(u16::from(f.code)),
                Some(Ok(_)) => continue,
                _ => break None,
            }
        }
    })
    .await
    .expect("the connection outlived its token");
    assert_eq!(code, Some(1008));
    // The expired token opens nothing more.
    let (status, _) = gw.handshake("/", Some(&format!("Bearer {short}"))).await;
    assert_eq!(status, 401);
    // The session was detached, not ended: a fresh token resumes it, its
    // process still running.
    let mut c = Client::connect(&gw.url, &gw.token("t1")).await;
    assert_eq!(c.resume(&sid).await["sessionId"], sid.as_str());
    let list = c.call("process/list", json!({})).await;
    let p = &list["processes"][0];
    assert_eq!(p["processId"], "p");
    assert_eq!(p["state"], "running", "{list}");
}

/// Over gRPC each call presents its token, so an expired one is refused at
/// the next call; a server stream opened with it (an `Exec` here) ends
/// with UNAUTHENTICATED when it expires instead of running on.
#[tokio::test]
async fn a_grpc_stream_ends_when_its_token_expires() {
    use exec_gateway::client::{Client as Lib, ProcessSpec};
    let gw = gateway();
    let short = token_until(&gw.secret, now() + 3);
    let client = Lib::connect(&gw.grpc, &short).await.unwrap();
    let mut events = client
        .exec(&ProcessSpec::new("p", ["sleep", "60"]))
        .await
        .unwrap();
    let err = tokio::time::timeout(EVENT_TIMEOUT, async {
        loop {
            match events.next().await {
                Ok(Some(_)) => continue,
                Ok(None) => panic!("the stream ended as if the process had closed"),
                Err(e) => break e,
            }
        }
    })
    .await
    .expect("the stream outlived its token");
    assert!(err.to_string().contains("token expired"), "{err}");
}

/// The next error of a gRPC server stream, skipping its events (a bound,
/// not a timed assertion: before the fix such a stream ran on).
async fn stream_error<T>(s: &mut tonic::Streaming<T>, what: &str) -> tonic::Status {
    tokio::time::timeout(EVENT_TIMEOUT, async {
        loop {
            match s.message().await {
                Ok(Some(_)) => continue,
                Ok(None) => panic!("{what}: ended as if its process had closed"),
                Err(e) => break e,
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("{what}: outlived its token's key"))
}

/// Read an Attach stream until its output holds `want`.
async fn output_until(
    s: &mut tonic::Streaming<exec_gateway::transport::grpc::pb::AttachResponse>,
    want: &str,
) {
    use exec_gateway::transport::grpc::pb::process_event::Event;
    let mut out = Vec::new();
    tokio::time::timeout(EVENT_TIMEOUT, async {
        while !String::from_utf8_lossy(&out).contains(want) {
            let m = s.message().await.unwrap().expect("the stream ended");
            if let Some(Event::Output(o)) = m.event.and_then(|e| e.event) {
                out.extend(o.data);
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("no `{want}` in {:?}", String::from_utf8_lossy(&out)));
}

/// Seen on the release binary: a reload that changed a key's file made
/// each later gRPC call refuse its tokens, but an `Attach` stream opened
/// with one went on delivering output until its process ended. Now a
/// reload that removes (or changes) a key ends the gRPC streams its tokens
/// opened with UNAUTHENTICATED, as their expiry does: server streams
/// (`Attach`, `Exec`) and client streams (`StreamInput`); a stream of a
/// kept key goes on.
#[tokio::test]
async fn grpc_streams_end_when_a_reload_removes_their_tokens_key() {
    use common::grpc::{authed, channel, spec};
    use exec_gateway::transport::grpc::pb;
    use pb::process_service_client::ProcessServiceClient;
    use pb::session_service_client::SessionServiceClient;
    let key2 = common::random_secret();
    let gw = Gateway::start_with(|d| {
        std::fs::write(d.join("k2.key"), &key2).unwrap();
        format!(
            "[auth]\nleeway = \"0s\"\n[[auth.keys]]\nalgorithm = \"HS256\"\nsecret_file = \"{0}/hs256.key\"\n\
             [[auth.keys]]\nalgorithm = \"HS256\"\nkid = \"k2\"\nsecret_file = \"{0}/k2.key\"\n\
             [tenants.t1]\nroot = \"/\"\n",
            d.display()
        )
    });
    let mut h = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256);
    h.kid = Some("k2".to_owned());
    let claims = json!({"tenant": "t1", "scope": common::ALL_SCOPES, "exp": now() + 600});
    let gone =
        jsonwebtoken::encode(&h, &claims, &jsonwebtoken::EncodingKey::from_secret(&key2)).unwrap();
    let kept = token_until(&gw.secret, now() + 600);
    let ch = channel(&gw.grpc).await;
    let mut sessions = SessionServiceClient::new(ch.clone());
    let mut procs = ProcessServiceClient::new(ch);
    let mut session = async |token: &str| {
        let req = pb::CreateSessionRequest {
            snapshot: String::new(),
            image: String::new(),
            client_name: "t".into(),
        };
        let r = sessions.create_session(authed(req, token)).await.unwrap();
        r.into_inner().session_id
    };
    let (sid_gone, sid_kept) = (session(&gone).await, session(&kept).await);
    // In each session a `cat` with a stdin pipe, attached.
    let mut attached = Vec::new();
    for (sid, token) in [(&sid_gone, &gone), (&sid_kept, &kept)] {
        let mut cat = spec("cat", &["cat"]);
        cat.pipe_stdin = true;
        let start = pb::StartRequest {
            session_id: sid.clone(),
            spec: Some(cat),
        };
        procs.start(authed(start, token)).await.unwrap();
        let attach = pb::AttachRequest {
            session_id: sid.clone(),
            process_id: "cat".into(),
            after_seq: 0,
        };
        attached.push(
            procs
                .attach(authed(attach, token))
                .await
                .unwrap()
                .into_inner(),
        );
    }
    let (mut attach_gone, mut attach_kept) = (attached.remove(0), attached.remove(0));
    // An `Exec` and a `StreamInput` of the key to be removed, both live.
    let exec = pb::ExecRequest {
        session_id: sid_gone.clone(),
        spec: Some(spec("e", &["sleep", "600"])),
    };
    let mut exec_gone = procs.exec(authed(exec, &gone)).await.unwrap().into_inner();
    let (input_tx, input_rx) = tokio::sync::mpsc::channel(4);
    input_tx
        .send(pb::StreamInputRequest {
            session_id: sid_gone.clone(),
            process_id: "cat".into(),
            data: b"first\n".to_vec().into(),
        })
        .await
        .unwrap();
    let input = tokio::spawn({
        let mut procs = procs.clone();
        let gone = gone.clone();
        async move {
            let stream = tokio_stream::wrappers::ReceiverStream::new(input_rx);
            procs.stream_input(authed(stream, &gone)).await
        }
    });
    output_until(&mut attach_gone, "first").await;

    // The key's file changes: the key it held is removed.
    std::fs::write(gw.dir.path().join("k2.key"), common::random_secret()).unwrap();
    gw.signal(libc::SIGHUP);

    let err = stream_error(&mut attach_gone, "Attach").await;
    assert_eq!(err.code(), tonic::Code::Unauthenticated, "{err}");
    assert!(err.message().contains("key was removed"), "{err}");
    let err = stream_error(&mut exec_gone, "Exec").await;
    assert_eq!(err.code(), tonic::Code::Unauthenticated, "{err}");
    let err = tokio::time::timeout(EVENT_TIMEOUT, input)
        .await
        .expect("StreamInput outlived its token's key")
        .unwrap()
        .expect_err("StreamInput succeeded");
    assert_eq!(err.code(), tonic::Code::Unauthenticated, "{err}");
    drop(input_tx);
    // Each call refuses the token too.
    let list = pb::ListRequest {
        session_id: sid_gone.clone(),
    };
    let err = procs.list(authed(list, &gone)).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unauthenticated, "{err}");
    // The kept key's stream goes on: its process echoes what is written now.
    let write = pb::WriteRequest {
        session_id: sid_kept.clone(),
        process_id: "cat".into(),
        data: b"after the reload\n".to_vec().into(),
        ..Default::default()
    };
    procs.write(authed(write, &kept)).await.unwrap();
    output_until(&mut attach_kept, "after the reload").await;
}
