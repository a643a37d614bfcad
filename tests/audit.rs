//! The audit trail (`[audit]`): a scripted session against the real
//! binary, then its trail read back and compared with what the session
//! did, event for event; no token or environment value in it; the
//! `audit` command's tenant view; rotation bounding it on disk.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::path::Path;

use common::{Client, Gateway, mint};
use serde_json::{Value, json};

const BIN: &str = env!("CARGO_BIN_EXE_exec-gateway");

fn audited(extra: &str) -> Gateway {
    let extra = extra.to_owned();
    Gateway::start_with(move |d| {
        std::fs::create_dir_all(d.join("t1")).unwrap();
        std::fs::create_dir_all(d.join("t2")).unwrap();
        format!(
            "[audit]\nfile = \"{0}/audit.jsonl\"\n{extra}\n\
             [[auth.keys]]\nalgorithm = \"HS256\"\nsecret_file = \"{0}/hs256.key\"\n\
             [tenants.t1]\nroot = \"{0}/t1\"\n[tenants.t2]\nroot = \"{0}/t2\"\n",
            d.display()
        )
    })
}

fn events(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// Wait until the trail holds `n` events (the writer flushes within
/// 200 ms); all of them.
async fn wait_for(path: &Path, n: usize) -> Vec<Value> {
    let deadline = tokio::time::Instant::now() + common::event_timeout();
    loop {
        let e = events(path);
        if e.len() >= n {
            return e;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{} of {n} events: {e:#?}",
            e.len()
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

/// Read process `id` until it has exited.
async fn until_exited(c: &mut Client, id: &str) {
    let mut after = 0;
    loop {
        let r = c
            .call(
                "process/read",
                json!({"processId": id, "afterSeq": after, "waitMs": 5000}),
            )
            .await;
        if r["exited"].as_bool() == Some(true) || r["exitCode"].is_number() {
            return;
        }
        after = r["nextSeq"].as_u64().unwrap_or(after + 1).saturating_sub(1);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_trail_of_a_scripted_session_matches_what_it_did() {
    let mut gw = audited("");
    let trail = gw.dir.path().join("audit.jsonl");
    let t1_root = gw.dir.path().join("t1");
    let token = gw.token("t1");

    // 1. A forged token is refused before any session.
    let forged = mint(b"not the gateway's key, 32 bytes long!!", "t1", "exec");
    let mut req = tokio_tungstenite::tungstenite::client::IntoClientRequest::into_client_request(
        gw.url.as_str(),
    )
    .unwrap();
    req.headers_mut()
        .insert("authorization", format!("Bearer {forged}").parse().unwrap());
    assert!(tokio_tungstenite::connect_async(req).await.is_err());

    // 2. A session: a process with an environment, one terminated, a
    // file written, copied and removed, an escape refused.
    let mut c = Client::connect(&gw.url, &token).await;
    let sid = c.initialize().await;
    c.call(
        "process/start",
        json!({"processId": "p1", "argv": ["sh", "-c", "exit 3"], "cwd": t1_root,
               "env": {"PATH": "/usr/bin:/bin", "SECRET_VAR": "hunter2-value"}, "tty": false}),
    )
    .await;
    until_exited(&mut c, "p1").await;
    c.call(
        "process/start",
        json!({"processId": "p2", "argv": ["sleep", "60"], "cwd": t1_root,
               "env": {"PATH": "/usr/bin:/bin"}, "tty": false}),
    )
    .await;
    c.call("process/terminate", json!({"processId": "p2"}))
        .await;
    until_exited(&mut c, "p2").await;
    let file = t1_root.join("notes.txt");
    let copy = t1_root.join("copy.txt");
    c.call(
        "fs/writeFile",
        json!({"path": file, "dataBase64": common::b64(b"hello audit")}),
    )
    .await;
    c.call(
        "fs/copy",
        json!({"sourcePath": file, "destinationPath": copy, "recursive": false}),
    )
    .await;
    c.call("fs/remove", json!({"path": copy})).await;
    let escape = c
        .call_raw("fs/readFile", json!({"path": "/etc/shadow"}))
        .await;
    assert!(escape.get("error").is_some(), "{escape}");
    drop(c);

    // 3. A token of t2 with read scope only tries to start a process.
    let reader = mint(&gw.secret, "t2", "fs:read");
    let mut r = Client::connect(&gw.url, &reader).await;
    r.initialize().await;
    let refused = r
        .call_raw(
            "process/start",
            json!({"processId": "x", "argv": ["id"], "cwd": "/", "env": {}, "tty": false}),
        )
        .await;
    assert!(refused.get("error").is_some(), "{refused}");
    drop(r);

    // 4. The admin listener is read.
    gw.admin_get("/metrics").await;

    let all = wait_for(&trail, 18).await;
    // Every event names its time and kind; compare the kinds in order,
    // and what each says.
    let kinds: Vec<&str> = all.iter().map(|e| e["event"].as_str().unwrap()).collect();
    assert_eq!(
        kinds,
        vec![
            "auth.refused",
            "tenant.activated",
            "auth.accepted",
            "session.opened",
            "process.started",
            "process.exited",
            "process.started",
            "process.terminated",
            "process.exited",
            "file.written",
            "file.copied",
            "file.removed",
            "call.refused",
            "tenant.activated",
            "auth.accepted",
            "session.opened",
            "call.refused",
            "admin.access",
        ],
        "{all:#?}"
    );
    let at = |i: usize| &all[i];
    assert_eq!(at(0)["door"], "websocket");
    // A tenant's first session activates it (workers started).
    assert_eq!(
        (at(1)["tenant"].as_str(), at(13)["tenant"].as_str()),
        (Some("t1"), Some("t2"))
    );
    assert_eq!(at(0)["credential"], "token");
    assert!(at(0)["message"].as_str().unwrap().contains("signature"));
    assert_eq!(at(2)["tenant"], "t1");
    assert_eq!(at(3)["session"], sid.as_str());
    let started = at(4);
    assert_eq!(started["tenant"], "t1");
    assert_eq!(started["session"], sid.as_str());
    assert_eq!(started["argv"], json!(["sh", "-c", "exit 3"]));
    assert_eq!(started["cwd"], t1_root.display().to_string());
    assert_eq!(started["env_names"], json!(["PATH", "SECRET_VAR"]));
    assert_eq!(started["tty"], false);
    let exited = at(5);
    assert_eq!(exited["process_id"], "p1");
    assert_eq!(exited["exit_code"], 3);
    assert_eq!(exited["signal"], Value::Null);
    assert_eq!(exited["killed_by"], Value::Null);
    let killed = at(8);
    assert_eq!(killed["process_id"], "p2");
    assert_eq!(killed["signal"], 9);
    assert_eq!(killed["killed_by"], "client");
    assert_eq!(at(9)["path"], file.display().to_string());
    assert_eq!(at(9)["size"], 11);
    assert_eq!(at(10)["destination"], copy.display().to_string());
    assert_eq!(at(11)["path"], copy.display().to_string());
    assert_eq!(at(12)["method"], "fs/readFile");
    assert_eq!(at(12)["error"], "outside_root");
    assert_eq!(at(14)["tenant"], "t2");
    assert_eq!(at(16)["tenant"], "t2");
    assert_eq!(at(16)["method"], "process/start");
    assert_eq!(at(16)["error"], "forbidden");
    assert_eq!(at(16)["argv"], json!(["id"]));
    assert_eq!(at(17)["path"], "/metrics");
    assert_eq!(at(17)["status"], 200);
    assert!(all.iter().all(|e| e["ts"].is_string()));

    // Never a token or an environment value.
    let raw = std::fs::read_to_string(&trail).unwrap();
    for secret in [token.as_str(), forged.as_str(), reader.as_str(), "hunter2"] {
        assert!(!raw.contains(secret), "the trail holds a secret");
    }
    // Only its owner reads it.
    let mode =
        std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&trail).unwrap().permissions());
    assert_eq!(mode & 0o077, 0, "{mode:o}");

    // The tenant view: t1's process events only.
    let out = std::process::Command::new(BIN)
        .args(["audit", "--file"])
        .arg(&trail)
        .args(["--tenant", "t1", "--event", "process", "--since", "1h"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let view: Vec<Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let kinds: Vec<&str> = view.iter().map(|e| e["event"].as_str().unwrap()).collect();
    assert_eq!(
        kinds,
        [
            "process.started",
            "process.exited",
            "process.started",
            "process.terminated",
            "process.exited"
        ]
    );

    // At shutdown the sessions left are closed in the trail.
    gw.signal(15);
    gw.wait_exit();
    let last = events(&trail);
    assert!(
        last.iter()
            .any(|e| e["event"] == "session.closed" && e["reason"] == "shutdown"),
        "{last:#?}"
    );
    // And the tenants retired, with what they used.
    let retired = last
        .iter()
        .find(|e| e["event"] == "tenant.retired" && e["tenant"] == "t1")
        .unwrap_or_else(|| panic!("{last:#?}"));
    assert_eq!(retired["reason"], "shutdown");
    assert_eq!(retired["usage"]["processes_started"], 2);
}

/// What docs/operations.md says each event carries: `session.opened` its
/// subject, `process.terminated` its signal, a refusal after a suppressed
/// burst the count left out (a refused call with no fields of its own,
/// `fs/readFile`, once lost it), and U+2028/U+2029/U+0085 escaped, so
/// every event is one line to any reader.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_trail_carries_what_the_docs_say() {
    let gw = audited("");
    let trail = gw.dir.path().join("audit.jsonl");
    let t1_root = gw.dir.path().join("t1");
    let mut c = Client::connect(&gw.url, &gw.token("t1")).await;
    let sid = c.initialize().await;
    c.call(
        "process/start",
        json!({"processId": "p\u{2028}1", "argv": ["sh", "-c", "sleep 60", "x\u{2029}y\u{0085}z"],
               "cwd": t1_root, "env": {}, "tty": false}),
    )
    .await;
    c.call("process/terminate", json!({"processId": "p\u{2028}1"}))
        .await;
    until_exited(&mut c, "p\u{2028}1").await;
    // A burst of refusals past the per-tenant burst, then refusals until
    // one is written after some were left out.
    let deadline = tokio::time::Instant::now() + common::event_timeout();
    let counted = loop {
        for _ in 0..250 {
            let r = c
                .call_raw("fs/readFile", json!({"path": "/etc/shadow"}))
                .await;
            assert!(r.get("error").is_some(), "{r}");
        }
        let found = events(&trail)
            .into_iter()
            .find(|e| e["suppressed_before"].is_u64());
        if let Some(e) = found {
            break e;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no refusal says how many were left out"
        );
    };
    assert_eq!(counted["event"], "call.refused");
    assert_eq!(counted["method"], "fs/readFile");
    assert!(counted["suppressed_before"].as_u64().unwrap() > 0);

    let all = wait_for(&trail, 5).await;
    let opened = all.iter().find(|e| e["event"] == "session.opened").unwrap();
    assert_eq!(opened["session"], sid.as_str());
    assert_eq!(opened["subject"], "test");
    let terminated = all
        .iter()
        .find(|e| e["event"] == "process.terminated")
        .unwrap_or_else(|| panic!("{all:#?}"));
    assert_eq!(terminated["process_id"], "p\u{2028}1");
    assert_eq!(terminated["signal"], 9);
    let started = all
        .iter()
        .find(|e| e["event"] == "process.started")
        .unwrap();
    assert_eq!(started["argv"][3], "x\u{2029}y\u{0085}z");
    let raw = std::fs::read_to_string(&trail).unwrap();
    for c in ['\u{2028}', '\u{2029}', '\u{0085}'] {
        assert!(!raw.contains(c), "{c:?} raw in the trail");
    }
    assert!(raw.contains(r#""x\u2029y\u0085z""#), "{raw}");
}

/// Found by the attack review: at the defaults one tenant's large
/// `process.started` events (64 KiB argv, 200 a second) rotated the whole
/// 600 MiB kept away in about 50 s. Now a tenant's events are whole up
/// to its budget a minute, summarised up to twice it, then left out
/// (counted): what t1 makes the trail keep is bounded, and t2's events
/// are still written whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_tenant_cannot_fill_the_trail() {
    const BUDGET: usize = 65536;
    let gw = audited(&format!(
        "tenant_bytes_per_minute = {BUDGET}
"
    ));
    let trail = gw.dir.path().join("audit.jsonl");
    let t1_root = gw.dir.path().join("t1");
    let mut c = Client::connect(&gw.url, &gw.token("t1")).await;
    c.initialize().await;
    // 60 starts of about 48 KiB of argv each: about 2.9 MiB offered.
    let pad: Vec<String> = (0..12)
        .map(|i| format!("{i}{}", "a".repeat(4000)))
        .collect();
    for i in 0..60 {
        let mut argv = vec!["true".to_owned()];
        argv.extend(pad.iter().cloned());
        c.call(
            "process/start",
            json!({"processId": format!("p{i}"), "argv": argv, "cwd": t1_root,
                   "env": {}, "tty": false}),
        )
        .await;
    }
    let mut o = Client::connect(&gw.url, &gw.token("t2")).await;
    o.initialize().await;
    let t2_root = gw.dir.path().join("t2");
    let mut argv = vec!["true".to_owned()];
    argv.extend(pad.iter().cloned());
    o.call(
        "process/start",
        json!({"processId": "q", "argv": argv, "cwd": t2_root, "env": {}, "tty": false}),
    )
    .await;
    // Until t2's start is written (events are written in order).
    let deadline = tokio::time::Instant::now() + common::event_timeout();
    let all = loop {
        let all = events(&trail);
        if all
            .iter()
            .any(|e| e["tenant"] == "t2" && e["event"] == "process.started")
        {
            break all;
        }
        assert!(tokio::time::Instant::now() < deadline, "t2 never written");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    };
    let raw = std::fs::read_to_string(&trail).unwrap();
    let t1_bytes: usize = raw
        .lines()
        .filter(|l| serde_json::from_str::<Value>(l).unwrap()["tenant"] == "t1")
        .map(|l| l.len() + 1)
        .sum();
    assert!(
        t1_bytes <= 2 * BUDGET + 64 * 1024,
        "t1 made the trail keep {t1_bytes} bytes"
    );
    let t1_started: Vec<&Value> = all
        .iter()
        .filter(|e| e["tenant"] == "t1" && e["event"] == "process.started")
        .collect();
    assert!(t1_started.len() < 60, "none of t1's starts were left out");
    assert_eq!(t1_started[0]["argv"].as_array().unwrap().len(), 13);
    let summary = t1_started
        .iter()
        .find(|e| e["over_budget"] == true)
        .expect("a summarised start");
    assert_eq!(summary["argv_sha256"], t1_started[0]["argv_sha256"]);
    assert!(summary["argv"].as_array().unwrap().len() <= 9);
    // t2's start is whole.
    let q = all
        .iter()
        .find(|e| e["tenant"] == "t2" && e["event"] == "process.started")
        .unwrap();
    assert_eq!(q["argv"].as_array().unwrap().len(), 13);
    assert!(q.get("over_budget").is_none());
    let (_, metrics) = gw.admin_get("/metrics").await;
    let dropped: f64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("exec_gateway_audit_events_dropped_total "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0);
    assert!(dropped > 0.0, "nothing counted as left out");
}

/// A flood of forged-token handshakes from one address past the budget of
/// events with no tenant hides neither the operator's admin access nor
/// another address's refusal (issue 42, finding M3): each has a budget of
/// its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_refusals_hides_neither_admin_access_nor_other_sources() {
    const BUDGET: usize = 65536;
    let gw = audited(&format!("tenant_bytes_per_minute = {BUDGET}\n"));
    let trail = gw.dir.path().join("audit.jsonl");
    let forged = format!(
        "Bearer {}",
        mint(b"not-the-gateway-key-0123456789abc", "t1", "exec")
    );
    // About 300 bytes a refusal: 1,000 of them are past twice the budget.
    for _ in 0..1000 {
        let (status, _) = gw.handshake("/", Some(&forged)).await;
        assert_eq!(status, 401);
    }
    let (status, _) = gw.admin_get("/metrics").await;
    assert_eq!(status, 200);
    // A refusal from a second address.
    {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let sock = tokio::net::TcpSocket::new_v4().unwrap();
        sock.bind("127.0.0.2:0".parse().unwrap()).unwrap();
        let mut s = sock.connect(gw.addr.parse().unwrap()).await.unwrap();
        let req = format!(
            "GET / HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
             Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\
             Authorization: {forged}\r\n\r\n"
        );
        s.write_all(req.as_bytes()).await.unwrap();
        let mut buf = vec![0u8; 512];
        let n = s.read(&mut buf).await.unwrap();
        assert!(String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 401"));
    }
    let from = |e: &Value, ip: &str| {
        e["remote"]
            .as_str()
            .is_some_and(|r| r.starts_with(&format!("{ip}:")))
    };
    // Until the second address's refusal is written (events are written
    // in order).
    let deadline = tokio::time::Instant::now() + common::event_timeout();
    let all = loop {
        let all = events(&trail);
        if all
            .iter()
            .any(|e| e["event"] == "auth.refused" && from(e, "127.0.0.2"))
        {
            break all;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "127.0.0.2 never written"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    };
    let flood: Vec<&Value> = all
        .iter()
        .filter(|e| e["event"] == "auth.refused" && from(e, "127.0.0.1"))
        .collect();
    assert!(flood.len() < 1000, "none of the flood was left out");
    assert!(flood.iter().any(|e| e["over_budget"] == true));
    let admin = all
        .iter()
        .find(|e| e["event"] == "admin.access" && e["path"] == "/metrics")
        .expect("the admin access is written");
    assert!(admin.get("over_budget").is_none(), "{admin}");
    let other = all
        .iter()
        .find(|e| e["event"] == "auth.refused" && from(e, "127.0.0.2"))
        .unwrap();
    assert!(other.get("over_budget").is_none(), "{other}");
    assert!(other.get("omitted_before").is_none(), "{other}");
}

/// Rotation keeps the trail within `max_file_bytes` × (1 + `max_files`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_trail_is_rotated_and_bounded_on_disk() {
    let gw = audited("max_file_bytes = 131072\nmax_files = 2\n");
    let trail = gw.dir.path().join("audit.jsonl");
    let (mut c, _) = gw.session().await;
    for i in 0..120 {
        let r = c
            .call_raw(
                "fs/readFile",
                json!({"path": format!("/etc/escape-{i}-{}", "x".repeat(3000))}),
            )
            .await;
        assert!(r.get("error").is_some());
    }
    drop(c);
    let deadline = tokio::time::Instant::now() + common::event_timeout();
    loop {
        let files = [
            trail.clone(),
            gw.dir.path().join("audit.jsonl.1"),
            gw.dir.path().join("audit.jsonl.2"),
        ];
        if files[2].exists() {
            assert!(!gw.dir.path().join("audit.jsonl.3").exists());
            for f in &files {
                assert!(
                    std::fs::metadata(f).unwrap().len() <= 131072,
                    "{}",
                    f.display()
                );
            }
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "never rotated twice"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    // The trail removed by hand (a logrotate of its own): the next events
    // go to a new file at its path.
    std::fs::remove_file(&trail).unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(400)).await;
    gw.admin_get("/metrics").await;
    common::eventually("the trail is opened anew", || {
        std::fs::read_to_string(&trail).is_ok_and(|t| t.contains("admin.access"))
    })
    .await;
}

/// A trail whose directory leads into a tenant's root (through a symlink)
/// is refused at start, as one written there directly is.
#[test]
fn a_trail_inside_a_tenant_root_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::write(d.join("k"), common::random_secret()).unwrap();
    std::fs::create_dir_all(d.join("t1")).unwrap();
    std::os::unix::fs::symlink(d.join("t1"), d.join("logs")).unwrap();
    let config = d.join("gateway.toml");
    std::fs::write(
        &config,
        format!(
            "[audit]\nfile = \"{0}/logs/audit.jsonl\"\n\
             [[auth.keys]]\nalgorithm = \"HS256\"\nsecret_file = \"{0}/k\"\n\
             [tenants.t1]\nroot = \"{0}/t1\"\n",
            d.display()
        ),
    )
    .unwrap();
    let out = common::serve_refused(&config);
    assert_eq!(out.status.code(), Some(64), "{out:?}");
    assert!(!d.join("t1/audit.jsonl").exists());
}
