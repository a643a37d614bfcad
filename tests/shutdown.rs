//! SIGTERM/SIGINT: readiness goes false, new sessions are refused, live ones
//! served through the grace, then clients are told to reconnect, process trees
//! are killed, and the gateway exits 0, all within bounded time.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::{Gateway, eventually, pid_alive, unb64};
use futures_util::StreamExt as _;
use serde_json::json;

async fn pid_of(c: &mut common::Client, id: &str) -> i32 {
    let v = c
        .wait_for("pid", |v| {
            v["method"] == "process/output" && v["params"]["processId"] == id
        })
        .await;
    String::from_utf8(unb64(v["params"]["chunk"].as_str().unwrap()))
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

#[tokio::test]
async fn sigterm_drains_kills_trees_and_exits_zero() {
    let mut gw = Gateway::start("[server]\nshutdown_grace = \"1s\"\n");
    let (mut c, _) = gw.session().await;
    c.start("p", &["sh", "-c", "sleep 300 & echo $!; wait"])
        .await;
    let grandchild = pid_of(&mut c, "p").await;
    assert!(pid_alive(grandchild));
    gw.signal(15);
    // During the grace period: not ready, no new sessions, live ones served.
    let deadline = tokio::time::Instant::now() + common::EVENT_TIMEOUT;
    while gw.http_get("/readyz").await.0 != 503 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "readyz never turned 503"
        );
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    let r = c.call_raw("process/list", json!({})).await;
    assert_eq!(r["result"]["processes"][0]["processId"], "p", "{r}");
    let mut other = gw.connect().await;
    let r = other
        .call_raw("initialize", json!({"clientName": "late"}))
        .await;
    assert_eq!(r["error"]["data"]["reason"], "serverShuttingDown", "{r}");
    // At the end of the grace: told to reconnect elsewhere (1012).
    let close = loop {
        match tokio::time::timeout(common::EVENT_TIMEOUT, c.ws.next())
            .await
            .expect("a close frame")
        {
            Some(Ok(tokio_tungstenite::tungstenite::Message::Close(f))) => {
                break f.map(|f| u16::from(f.code));
            }
            Some(Ok(_)) => {}
            other => panic!("no close frame: {other:?}"),
        }
    };
    assert_eq!(close, Some(1012));
    let status = gw.wait_exit();
    assert!(status.success(), "{status:?}");
    eventually("grandchild killed", || !pid_alive(grandchild)).await;
}

#[tokio::test]
async fn sigint_with_idle_sessions_exits_promptly() {
    let mut gw = Gateway::start("");
    let (_c, _) = gw.session().await;
    gw.signal(2);
    assert!(gw.wait_exit().success());
}

#[tokio::test]
async fn sigkill_of_the_gateway_leaves_no_process_group_behind() {
    let mut gw = Gateway::start("");
    let (mut c, _) = gw.session().await;
    c.start("p", &["sh", "-c", "sleep 300 & echo $!; wait"])
        .await;
    let grandchild = pid_of(&mut c, "p").await;
    c.call(
        "process/start",
        json!({"processId":"t","argv":["sh","-c","echo $$; exec sleep 300"],
               "cwd":"/tmp","env":{"PATH":"/usr/bin:/bin"},"tty":true}),
    )
    .await;
    let pty_child = pid_of(&mut c, "t").await;
    assert!(pid_alive(grandchild) && pty_child > 0);
    gw.signal(9);
    let status = gw.wait_exit();
    assert!(!status.success());
    // The reaper sidecar saw its pipe close and killed every registered group.
    eventually("grandchild of a SIGKILLed gateway dies", || {
        !pid_alive(grandchild)
    })
    .await;
    eventually("pty child of a SIGKILLed gateway dies", || {
        !pid_alive(pty_child)
    })
    .await;
}
