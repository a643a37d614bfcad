//! A token's expiry holds for the connections it opened: seen on
//! d384597, a websocket kept working after its token's `exp` (12 s later
//! `process/start` still ran). Now the connection is closed (1008) when
//! the token expires, its session detached, and a fresh token resumes it.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

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
