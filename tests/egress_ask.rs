//! Asking the client (`egress_unlisted = "ask"`, Codex's `networkProxy`
//! on `process/start`), in the world of tests/egress_names.rs: a process
//! started with `policyDecisionTimeoutMs` gets a proxy of its own
//! (`HTTPS_PROXY`), and a name the tenant does not list is asked of the
//! session's client with `network/policyRequest` in the reference's
//! shape; its answer decides (allow, deny, for the session), no answer or
//! a malformed one denies, a tenant that denies never asks.
//!
//! Needs what tests/egress_names.rs needs; skipped with the reason
//! otherwise.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;
#[path = "egress_world/world.rs"]
mod world;

use serde_json::{Value, json};
use world::*;

const ASK: &str = "egress_names = [\"allowed.test\"]\negress_unlisted = \"ask\"";

/// Start `curl URL` with Codex's `networkProxy`; its process id.
async fn start_managed(t: &mut Tenant, url: &str, timeout_ms: Option<u64>) -> String {
    t.n += 1;
    let id = format!("m{}", t.n);
    let ca = t.ca();
    let mut np = json!({"proxy": {"enabled": true, "mode": "full"}});
    if let Some(ms) = timeout_ms {
        np["policyDecisionTimeoutMs"] = json!(ms);
    }
    t.c.call(
        "process/start",
        json!({"processId": id, "argv": curl_argv(&ca, &[url]), "cwd": t.root, "tty": false,
               "env": {"PATH": "/usr/bin:/bin", "HOME": t.root}, "networkProxy": np}),
    )
    .await;
    id
}

/// The next `network/policyRequest`.
async fn asked(t: &mut Tenant) -> Value {
    t.c.wait_for("network/policyRequest", |v| {
        v["method"] == "network/policyRequest" && v.get("id").is_some()
    })
    .await
}

async fn answer(t: &mut Tenant, req: &Value, result: Value) {
    t.c.send(&json!({"id": req["id"], "result": result})).await;
}

/// The `network/policyDecision` the gateway sent for process `id`.
async fn decision(t: &mut Tenant, id: &str) -> Value {
    let v =
        t.c.wait_for("network/policyDecision", |v| {
            v["method"] == "network/policyDecision" && v["params"]["processId"] == id
        })
        .await;
    v["params"].clone()
}

#[tokio::test]
async fn an_unlisted_name_is_asked_of_the_client_and_its_answer_decides() {
    if let Some(reason) = missing() {
        eprintln!("SKIPPED: {reason}");
        return;
    }
    let w = world();
    let s = scratch();
    let gw = launch(&w, s.path(), &[("a", ASK)]);
    let mut a = Tenant::of(&gw, s.path(), "a").await;

    // Allowed once: the request has the reference's shape.
    let id = start_managed(&mut a, "https://other.test/", Some(60_000)).await;
    let req = asked(&mut a).await;
    assert_eq!(
        req["params"],
        json!({"processId": id, "request": {"protocol": "https_connect", "host": "other.test", "port": 443}}),
        "{req}"
    );
    assert!(req["id"].as_u64().is_some(), "{req}");
    answer(&mut a, &req, json!({"decision": {"type": "allow"}})).await;
    let out = a.collect(&id).await;
    assert_eq!(out.server(), "server-11", "{out:?}");
    let d = decision(&mut a, &id).await;
    assert_eq!(
        (&d["decision"], &d["source"], &d["host"]),
        (&json!("allow"), &json!("decider"), &json!("other.test")),
        "{d}"
    );

    // Asked again (no scope: nothing remembered); denied with a reason.
    let id = start_managed(&mut a, "https://other.test/", Some(60_000)).await;
    let req = asked(&mut a).await;
    answer(
        &mut a,
        &req,
        json!({"decision": {"type": "deny", "reason": "not today"}}),
    )
    .await;
    let out = a.collect(&id).await;
    assert!(out.code != 0 && out.server().is_empty(), "{out:?}");
    assert_eq!(decision(&mut a, &id).await["reason"], "not today");

    // An error answer and a malformed one deny.
    for bad in [
        json!({"id": 0, "error": {"code": -32000, "message": "nope"}}),
        json!({"result": {"decision": {"type": "maybe"}}}),
        json!({"result": {"decision": {"type": "deny"}}}),
    ] {
        let id = start_managed(&mut a, "https://other.test/", Some(60_000)).await;
        let req = asked(&mut a).await;
        let mut reply = bad.clone();
        reply["id"] = req["id"].clone();
        a.c.send(&reply).await;
        let out = a.collect(&id).await;
        assert!(out.code != 0 && out.server().is_empty(), "{bad}: {out:?}");
        assert_eq!(decision(&mut a, &id).await["decision"], "deny", "{bad}");
    }

    // A listed name is not asked.
    let id = start_managed(&mut a, "https://allowed.test/", Some(60_000)).await;
    let out = a.collect(&id).await;
    assert_eq!(out.server(), "server-10", "{out:?}");
    let d = decision(&mut a, &id).await;
    assert_eq!(d["source"], "baseline_policy", "{d}");

    // Allowed for the session: the next process is not asked.
    let id = start_managed(&mut a, "https://other.test/", Some(60_000)).await;
    let req = asked(&mut a).await;
    answer(
        &mut a,
        &req,
        json!({"decision": {"type": "allow", "scope": "session"}}),
    )
    .await;
    assert_eq!(a.collect(&id).await.server(), "server-11");
    let id = start_managed(&mut a, "https://other.test/", Some(60_000)).await;
    assert_eq!(a.collect(&id).await.server(), "server-11");

    // The tenant's transparent proxy still decides what goes around the
    // process's proxy: the answer opened nothing else.
    let out = a.curl(&["https://other.test/"]).await;
    assert!(out.code != 0 && out.server().is_empty(), "{out:?}");

    // The proxy is the process's: another process of the tenant that
    // finds its port is refused (407) without the token in its URL.
    a.n += 1;
    let holder = format!("m{}", a.n);
    a.c.call(
        "process/start",
        json!({"processId": holder, "argv": ["sh", "-c", "echo \"$HTTPS_PROXY\"; exec sleep 60"],
               "cwd": a.root, "tty": false, "env": {"PATH": "/usr/bin:/bin"},
               "networkProxy": {"proxy": {"enabled": true}, "policyDecisionTimeoutMs": 60000}}),
    )
    .await;
    let line =
        a.c.wait_for("the proxy's URL", |v| {
            v["method"] == "process/output" && v["params"]["processId"] == holder.as_str()
        })
        .await;
    let url = String::from_utf8(common::unb64(line["params"]["chunk"].as_str().unwrap())).unwrap();
    let url = url.trim();
    let (creds, port) = url
        .strip_prefix("http://")
        .and_then(|r| r.split_once('@'))
        .expect("credentials in the proxy's URL");
    assert!(creds.starts_with("exg:") && creds.len() > 20, "{url}");
    let bare = format!("http://{port}");
    let out = a.curl(&["-x", &bare, "https://allowed.test/"]).await;
    assert!(out.code != 0 && out.server().is_empty(), "{out:?}");
    assert!(out.err.contains("407"), "{out:?}");
    a.c.call("process/terminate", json!({"processId": holder}))
        .await;

    // Answers to requests never sent are ignored; the session goes on.
    a.c.send(&json!({"id": 9999, "result": {"decision": {"type": "allow"}}}))
        .await;
    a.c.send(&json!({"id": "1", "result": {}})).await;
    let out = a.curl(&["https://allowed.test/"]).await;
    assert_eq!(out.server(), "server-10", "{out:?}");
    // (Last: a 0.169.0 method makes the session speak its paths.)
    let info = a.c.call("environment/info", json!({})).await;
    assert_eq!(info["capabilities"]["networkProxyLaunch"], true, "{info}");
}

#[tokio::test]
async fn no_answer_and_a_tenant_that_denies_mean_deny() {
    if let Some(reason) = missing() {
        eprintln!("SKIPPED: {reason}");
        return;
    }
    let w = world();
    let s = scratch();
    let gw = launch(
        &w,
        s.path(),
        &[("a", ASK), ("b", "egress_names = [\"allowed.test\"]")],
    );
    // A client that never answers: denied once the wait is over (the
    // reference's timeout plus 5 s), and asked exactly once.
    let mut a = Tenant::of(&gw, s.path(), "a").await;
    let id = start_managed(&mut a, "https://other.test/", Some(1)).await;
    let req = asked(&mut a).await;
    assert_eq!(req["params"]["request"]["host"], "other.test");
    let out = a.collect(&id).await;
    assert!(out.code != 0 && out.server().is_empty(), "{out:?}");
    assert_eq!(decision(&mut a, &id).await["decision"], "deny");

    // Without policyDecisionTimeoutMs, never asked.
    let id = start_managed(&mut a, "https://other.test/", None).await;
    let out = a.collect(&id).await;
    assert!(out.code != 0 && out.server().is_empty(), "{out:?}");
    let d = decision(&mut a, &id).await;
    assert_eq!(
        (&d["source"], &d["reason"]),
        (&json!("baseline_policy"), &json!("not_allowed")),
        "{d}"
    );

    // A tenant whose unlisted names are denied never asks, whatever the
    // process asks for.
    let mut b = Tenant::of(&gw, s.path(), "b").await;
    let id = start_managed(&mut b, "https://other.test/", Some(60_000)).await;
    let out = b.collect(&id).await;
    assert!(out.code != 0 && out.server().is_empty(), "{out:?}");
    let d = decision(&mut b, &id).await;
    assert_eq!(d["source"], "baseline_policy", "{d}");

    // The reference's launch checks.
    for (np, id, msg) in [
        (
            json!({"proxy": {"enabled": true}, "policyDecisionTimeoutMs": 0}),
            "z",
            "network policy decision callback timeout must be nonzero",
        ),
        (
            json!({"proxy": {"enabled": true}, "policyDecisionTimeoutMs": 10}),
            "",
            "callback-enabled process ID must be non-empty and at most 256 bytes",
        ),
        (
            json!({"proxy": {"enabled": false}}),
            "y",
            "invalid network proxy config: executor-local network proxy launch requires an enabled proxy",
        ),
    ] {
        let (code, m) =
            a.c.call_err(
                "process/start",
                json!({"processId": id, "argv": ["true"], "cwd": a.root, "tty": false,
                       "env": {}, "networkProxy": np}),
            )
            .await;
        assert_eq!((code, m.as_str()), (-32602, msg));
    }
}
