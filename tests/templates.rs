//! Tenants from a template, activated on first use and retired when idle,
//! and live reload (SIGHUP): real gateway processes, real tokens.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::os::unix::fs::MetadataExt as _;
use std::path::Path;

use common::{ALL_SCOPES, Client, Gateway, event_timeout, mint};
use serde_json::json;

/// A gateway with only a template: roots under `DIR/roots`, one session
/// per tenant, retired after a second idle; `extra` appended.
fn templated(extra: &str) -> Gateway {
    Gateway::start_with(|dir| {
        format!(
            "[server]\ntenant_idle_timeout = \"1s\"\n\
             [[auth.keys]]\nalgorithm = \"HS256\"\nsecret_file = \"{d}/hs256.key\"\n\
             [tenant_template]\nroot = \"{d}/roots/{{tenant}}\"\nmax_sessions = 1\n{extra}",
            d = dir.display()
        )
    })
}

/// Pids of tenant `name`'s workers.
fn workers_of(name: &str) -> Vec<i32> {
    let needle = format!("worker\0--tenant\0{name}\0");
    common::host_pids_where(|cmdline| {
        cmdline
            .windows(needle.len())
            .any(|w| w == needle.as_bytes())
    })
}

/// `/accounting`'s line for `tenant`.
async fn account(gw: &Gateway, tenant: &str) -> Option<serde_json::Value> {
    let (status, body) = gw.admin_get(&format!("/accounting?tenant={tenant}")).await;
    assert_eq!(status, 200, "{body}");
    body.lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .find(|v| v["tenant"] == tenant)
}

/// Start `argv` in the tenant's root (its cwd default).
async fn start(c: &mut Client, cwd: &Path, id: &str, argv: &[&str]) {
    c.call(
        "process/start",
        json!({"processId": id, "argv": argv, "cwd": cwd, "pipeStdin": true,
               "env": {"PATH": "/usr/bin:/bin"}, "tty": false}),
    )
    .await;
}

/// Poll an async `cond` until true or the timeout.
async fn eventually_async<F: std::future::Future<Output = bool>>(what: &str, cond: impl Fn() -> F) {
    let deadline = tokio::time::Instant::now() + event_timeout();
    while !cond().await {
        assert!(tokio::time::Instant::now() < deadline, "timed out: {what}");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

async fn run(c: &mut Client, cwd: &Path, id: &str, argv: &[&str]) -> String {
    start(c, cwd, id, argv).await;
    let out = c.collect(id).await;
    assert_eq!(out.exit_code, Some(0), "{argv:?}: {out:?}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[tokio::test]
async fn a_token_for_an_unconfigured_tenant_is_served_under_the_template() {
    let gw = templated("");
    let root = gw.dir.path().join("roots").join("team-a");
    assert!(!root.exists(), "roots are made on first use, not at start");
    let mut c = Client::connect(&gw.url, &mint(&gw.secret, "team-a", ALL_SCOPES)).await;
    c.initialize().await;
    let meta = std::fs::symlink_metadata(&root).expect("root made on first use");
    assert!(meta.is_dir());
    assert_eq!(meta.mode() & 0o777, 0o700);
    let out = run(
        &mut c,
        &root,
        "p1",
        &["sh", "-c", "id -u; pwd; echo made > here"],
    )
    .await;
    let mut lines = out.lines();
    let uid: u32 = lines.next().unwrap().parse().unwrap();
    assert_eq!(
        lines.next(),
        Some(root.to_str().unwrap()),
        "cwd is the root"
    );
    assert_eq!(
        std::fs::read_to_string(root.join("here")).unwrap(),
        "made\n"
    );
    if nix::unistd::geteuid().is_root() {
        // Its own uid, from the range, owning its root, in the ledger.
        assert_ne!(uid, 0);
        assert_eq!(meta.uid(), uid);
        let entry = gw.dir.path().join("roots/.uids").join(uid.to_string());
        assert_eq!(std::fs::read_link(entry).unwrap(), Path::new("team-a"));
    }
    // The template's limits: one session.
    let mut c2 = Client::connect(&gw.url, &mint(&gw.secret, "team-a", ALL_SCOPES)).await;
    let reply = c2.call_raw("initialize", json!({"clientName": "t"})).await;
    assert_eq!(reply["error"]["code"], -32006, "{reply}");
    // Names outside the pattern (and keys' other tenants) are refused at
    // the handshake, as unknown.
    for name in ["Team-A", "-x", "a_b", ".uids", "x".repeat(64).as_str()] {
        let bearer = format!("Bearer {}", mint(&gw.secret, name, ALL_SCOPES));
        let (status, _) = gw.handshake("/", Some(&bearer)).await;
        assert_eq!(status, 401, "{name}");
    }
    assert!(!gw.dir.path().join("roots/Team-A").exists());
}

#[tokio::test]
async fn without_a_template_an_unconfigured_tenant_is_refused() {
    let gw = Gateway::start("");
    let bearer = format!("Bearer {}", mint(&gw.secret, "team-a", ALL_SCOPES));
    let (status, _) = gw.handshake("/", Some(&bearer)).await;
    assert_eq!(status, 401);
}

#[tokio::test]
async fn templated_tenants_cannot_reach_each_other() {
    let gw = templated("");
    let roots = gw.dir.path().join("roots");
    let mut a = Client::connect(&gw.url, &mint(&gw.secret, "team-a", ALL_SCOPES)).await;
    a.initialize().await;
    let mut b = Client::connect(&gw.url, &mint(&gw.secret, "team-b", ALL_SCOPES)).await;
    b.initialize().await;
    let secret = roots.join("team-a/secret");
    let ra = roots.join("team-a");
    let rb = roots.join("team-b");
    run(
        &mut a,
        &ra,
        "w",
        &["sh", "-c", "echo s3cret > secret; chmod 644 secret"],
    )
    .await;
    assert!(secret.exists());
    // The file API: outside b's root.
    let (code, _) = b
        .call_err("fs/readFile", json!({"path": secret.to_str().unwrap()}))
        .await;
    assert_ne!(code, 0);
    // Its processes: neither the file nor a's processes.
    start(&mut a, &ra, "sleeper", &["sleep", "600"]).await;
    let pid = common::host_pid_of(&["sleep", "600"]).await;
    start(
        &mut b,
        &rb,
        "peek",
        &[
            "sh",
            "-c",
            &format!(
                "cat {} 2>/dev/null && echo READ; ls {} 2>/dev/null | grep -x team-a && echo LISTED; kill -9 {pid} 2>/dev/null && echo KILLED; true",
                secret.display(),
                roots.display()
            ),
        ],
    )
    .await;
    let out = b.collect("peek").await;
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(!text.contains("s3cret") && !text.contains("READ"), "{text}");
    assert!(!text.contains("LISTED"), "{text}");
    assert!(!text.contains("KILLED"), "{text}");
    assert!(common::pid_alive(pid));
    a.call("process/terminate", json!({"processId": "sleeper"}))
        .await;
}

#[tokio::test]
async fn idle_tenants_retire_and_come_back() {
    let gw = templated("");
    let token = mint(&gw.secret, "team-idle", ALL_SCOPES);
    let mut c = Client::connect(&gw.url, &token).await;
    c.initialize().await;
    let root = gw.dir.path().join("roots/team-idle");
    run(&mut c, &root, "p1", &["true"]).await;
    assert!(!workers_of("team-idle").is_empty(), "a worker serves it");
    let first = account(&gw, "team-idle").await.unwrap();
    assert_eq!(first["active"], true);
    assert_eq!(first["processes_started"], 1);
    // A live session keeps it: nothing retires while it is attached.
    tokio::time::sleep(std::time::Duration::from_millis(2500)).await;
    assert!(!workers_of("team-idle").is_empty(), "kept while used");
    drop(c);
    // Gone: no worker, no metric series, the account kept.
    common::eventually("its workers end", || workers_of("team-idle").is_empty()).await;
    let deadline = tokio::time::Instant::now() + event_timeout();
    loop {
        let a = account(&gw, "team-idle").await.unwrap();
        if a["active"] == false {
            assert_eq!(a["processes_started"], 1);
            assert_eq!(a["activations"], 1);
            assert!(a["bytes_in"].as_u64().unwrap() > 0, "{a}");
            assert!(a["bytes_out"].as_u64().unwrap() > 0, "{a}");
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "not retired: {a}");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let (_, metrics) = gw.admin_get("/metrics").await;
    let left: Vec<&str> = metrics
        .lines()
        .filter(|l| l.contains("tenant=\"team-idle\""))
        .collect();
    assert!(left.is_empty(), "a retired tenant has no series: {left:?}");
    // And back on its next session, with its files.
    let mut c = Client::connect(&gw.url, &token).await;
    c.initialize().await;
    let status = run(&mut c, &root, "p2", &["cat", "/proc/self/status"]).await;
    assert!(status.contains("Uid:"), "{status}");
    let again = account(&gw, "team-idle").await.unwrap();
    assert_eq!(again["active"], true);
    assert_eq!(again["activations"], 2);
    assert_eq!(again["processes_started"], 2);
}

/// Reload: a tenant and a key added, a limit changed, a tenant removed
/// while its session finishes, a broken file refused; no session dropped.
#[tokio::test]
async fn sighup_reloads_tenants_keys_and_limits_without_dropping_a_session() {
    let dir = tempfile::tempdir().unwrap();
    let root = |n: &str| {
        let p = dir.path().join(n);
        std::fs::create_dir_all(&p).unwrap();
        p
    };
    let (ra, rb) = (root("a"), root("b"));
    let key2 = common::random_secret();
    std::fs::write(dir.path().join("k2"), &key2).unwrap();
    let tenants = |with_b: bool, max_a: usize, second_key: bool| {
        let mut t = format!(
            "[tenants.a]\nroot = \"{}\"\nmax_sessions = {max_a}\n",
            ra.display()
        );
        if with_b {
            t += &format!("[tenants.b]\nroot = \"{}\"\n", rb.display());
        }
        if second_key {
            t += &format!(
                "[[auth.keys]]\nalgorithm = \"HS256\"\nsecret_file = \"{}/k2\"\n",
                dir.path().display()
            );
        }
        t
    };
    let first = tenants(false, 1, false);
    let gw = Gateway::start_with(|d| {
        format!(
            "[[auth.keys]]\nalgorithm = \"HS256\"\nsecret_file = \"{}/hs256.key\"\n{first}",
            d.display()
        )
    });
    let config = gw.dir.path().join("gateway.toml");
    let head = format!(
        "[[auth.keys]]\nalgorithm = \"HS256\"\nsecret_file = \"{}/hs256.key\"\n",
        gw.dir.path().display()
    );
    let reload = |text: String| {
        std::fs::write(&config, text).unwrap();
        gw.signal(libc::SIGHUP);
    };
    let reloads = |outcome: &'static str| gw.reloads(outcome);
    let mut a1 = Client::connect(&gw.url, &gw.token("a")).await;
    a1.initialize().await;
    start(&mut a1, &ra, "long", &["sh", "-c", "read x; echo got $x"]).await;
    // b is unknown; a allows one session.
    let b_bearer = format!("Bearer {}", gw.token("b"));
    assert_eq!(gw.handshake("/", Some(&b_bearer)).await.0, 401);
    let mut a2 = Client::connect(&gw.url, &gw.token("a")).await;
    assert_eq!(
        a2.call_raw("initialize", json!({"clientName": "t"})).await["error"]["code"],
        -32006
    );
    // Add b and a key, raise a's sessions.
    reload(format!("{head}{}", tenants(true, 2, true)));
    eventually_async("the reload applies", || async {
        reloads("ok").await >= 1.0
    })
    .await;
    let mut b = Client::connect(&gw.url, &gw.token("b")).await;
    b.initialize().await;
    let mut a3 = Client::connect(&gw.url, &mint(&key2, "a", ALL_SCOPES)).await;
    a3.initialize().await;
    // A broken file is refused; everything stays.
    reload(format!("{head}[tenants.a]\nroot = \"/nonexistent/x\"\n"));
    eventually_async("the refusal", || async { reloads("refused").await >= 1.0 }).await;
    let mut b2 = Client::connect(&gw.url, &gw.token("b")).await;
    let r = b2.call_raw("initialize", json!({"clientName": "t"})).await;
    assert!(r.get("result").is_some(), "b still served: {r}");
    // Remove b: its new sessions are refused, its live one goes on.
    reload(format!("{head}{}", tenants(false, 2, true)));
    eventually_async("the second reload", || async { reloads("ok").await >= 2.0 }).await;
    assert_eq!(gw.handshake("/", Some(&b_bearer)).await.0, 401);
    assert_eq!(
        run(&mut b, &rb, "still", &["echo", "served"]).await,
        "served\n"
    );
    // Change a's root: what only a new activation applies. New sessions
    // get it at once; the live one keeps the old.
    let rc = root("c");
    reload(format!(
        "{head}{}",
        tenants(false, 2, true).replace(&ra.display().to_string(), &rc.display().to_string())
    ));
    eventually_async("the third reload", || async { reloads("ok").await >= 3.0 }).await;
    let mut a4 = Client::connect(&gw.url, &gw.token("a")).await;
    a4.initialize().await;
    assert_eq!(
        run(&mut a4, &rc, "new", &["pwd"]).await,
        format!("{}\n", rc.display())
    );
    let r = a4
        .call_raw(
            "process/start",
            json!({"processId": "old", "argv": ["true"], "cwd": ra, "env": {}, "tty": false}),
        )
        .await;
    assert!(
        r.get("error").is_some(),
        "the old root is not the new session's: {r}"
    );
    // a's first session never noticed.
    a1.call(
        "process/write",
        json!({"processId": "long", "chunk": common::b64(b"yes\n")}),
    )
    .await;
    let out = a1.collect("long").await;
    assert_eq!(String::from_utf8_lossy(&out.stdout), "got yes\n");
}

/// The template's cgroup limits are a templated tenant's: its fork bomb
/// stops at `pids_max` while another templated tenant runs.
#[tokio::test]
async fn a_templated_tenants_fork_bomb_stops_at_the_templates_pids_limit() {
    let gw = templated("pids_max = 40\n");
    let (_, ready) = gw.admin_get("/readyz").await;
    if !ready.contains("cgroups: active") {
        eprintln!("skipped: cgroup layer inactive on this host");
        return;
    }
    let roots = gw.dir.path().join("roots");
    let mut a = Client::connect(&gw.url, &mint(&gw.secret, "bomber", ALL_SCOPES)).await;
    a.initialize().await;
    let mut b = Client::connect(&gw.url, &mint(&gw.secret, "bystander", ALL_SCOPES)).await;
    b.initialize().await;
    start(
        &mut a,
        &roots.join("bomber"),
        "bomb",
        &[
            "bash",
            "-c",
            "for i in $(seq 200); do sleep 60 & done; wait",
        ],
    )
    .await;
    a.stderr_until("Resource temporarily unavailable").await;
    assert_eq!(
        run(&mut b, &roots.join("bystander"), "ok", &["echo", "fine"]).await,
        "fine\n"
    );
    a.call("process/terminate", json!({"processId": "bomb"}))
        .await;
}

/// A directory already at `ROOTS/NAME` that the tenant's uid does not own
/// is not adopted as its root: the tenant is refused, nothing is written.
#[tokio::test]
async fn a_root_someone_else_planted_is_not_adopted() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: needs root (tenants get their own uids)");
        return;
    }
    let gw = templated("");
    let planted = gw.dir.path().join("roots/squat");
    std::fs::create_dir_all(&planted).unwrap();
    std::os::unix::fs::chown(&planted, Some(65534), Some(65534)).unwrap();
    let bearer = format!("Bearer {}", mint(&gw.secret, "squat", ALL_SCOPES));
    let (status, body) = gw.handshake("/", Some(&bearer)).await;
    assert_ne!(status, 101, "{body}");
    // Why is the operator's to read in the log: the caller learns neither
    // the host's path nor another owner's uid (found by the attack on
    // issue 42's fixes: the answer named both).
    assert!(body.contains("cannot be activated"), "{body}");
    assert!(
        !body.contains("65534") && !body.contains(&*gw.dir.path().to_string_lossy()),
        "{body}"
    );
    assert_eq!(std::fs::read_dir(&planted).unwrap().count(), 0);
    // Other tenants are served.
    let mut c = Client::connect(&gw.url, &mint(&gw.secret, "fine", ALL_SCOPES)).await;
    c.initialize().await;
}

/// A failed activation (its root another user's directory, a link or a
/// file) takes no uid: with a range of one, the next tenant still gets it.
#[tokio::test]
async fn a_failed_activation_takes_no_uid() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: needs root (tenants get their own uids)");
        return;
    }
    let gw = templated("[isolation]\nuid_range = [47011, 47011]\n");
    let roots = gw.dir.path().join("roots");
    std::fs::create_dir_all(&roots).unwrap();
    let other = roots.join("other");
    std::fs::create_dir(&other).unwrap();
    std::os::unix::fs::chown(&other, Some(65534), Some(65534)).unwrap();
    std::os::unix::fs::symlink("/tmp", roots.join("link")).unwrap();
    std::fs::write(roots.join("file"), "x").unwrap();
    for name in ["other", "link", "file", "other"] {
        let bearer = format!("Bearer {}", mint(&gw.secret, name, ALL_SCOPES));
        let (status, body) = gw.handshake("/", Some(&bearer)).await;
        assert_ne!(status, 101, "{name}: {body}");
        assert!(!body.contains("no free uid"), "{name}: {body}");
    }
    let held = std::fs::read_dir(roots.join(".uids")).map_or(0, |d| d.count());
    assert_eq!(held, 0, "a failed activation holds a uid");
    // The range's one uid is there for a tenant that can run.
    let mut c = Client::connect(&gw.url, &mint(&gw.secret, "fine", ALL_SCOPES)).await;
    c.initialize().await;
    let root = std::fs::symlink_metadata(roots.join("fine")).unwrap();
    assert_eq!(root.uid(), 47011);
}

/// Reload removes what it removes: a configured tenant taken out of the
/// file is refused (401) although the template's pattern admits its name,
/// and a websocket connection whose token's key was taken out is closed
/// (1008, as at expiry) while one of a kept key goes on.
#[tokio::test]
async fn a_reload_removes_a_tenant_and_a_key_even_from_live_connections() {
    let (dir, key2) = (tempfile::tempdir().unwrap(), common::random_secret());
    std::fs::write(dir.path().join("k2"), &key2).unwrap();
    std::fs::create_dir_all(dir.path().join("a")).unwrap();
    let text = |d: &Path, with: bool| {
        let mut t = format!(
            "[[auth.keys]]\nalgorithm = \"HS256\"\nsecret_file = \"{}/hs256.key\"\n\
             [tenant_template]\nroot = \"{}/roots/{{tenant}}\"\n",
            d.display(),
            d.display()
        );
        if with {
            t += &format!(
                "[[auth.keys]]\nalgorithm = \"HS256\"\nkid = \"k2\"\nsecret_file = \"{0}/k2\"\n\
                 [tenants.a]\nroot = \"{0}/a\"\n",
                dir.path().display()
            );
        }
        t
    };
    let gw = Gateway::start_with(|d| text(d, true));
    let bearer = |tenant: &str| format!("Bearer {}", mint(&gw.secret, tenant, ALL_SCOPES));
    assert_eq!(gw.handshake("/", Some(&bearer("a"))).await.0, 101);
    let mut h = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256);
    h.kid = Some("k2".to_owned());
    let by_k2 = jsonwebtoken::encode(
        &h,
        &json!({"tenant": "b", "scope": ALL_SCOPES, "exp": common::now() + 600}),
        &jsonwebtoken::EncodingKey::from_secret(&key2),
    )
    .unwrap();
    let mut gone = Client::connect(&gw.url, &by_k2).await;
    gone.initialize().await;
    let mut kept = Client::connect(&gw.url, &gw.token("b")).await;
    kept.initialize().await;

    std::fs::write(
        gw.dir.path().join("gateway.toml"),
        text(gw.dir.path(), false),
    )
    .unwrap();
    gw.signal(libc::SIGHUP);
    eventually_async("the reload", || async { gw.reloads("ok").await >= 1.0 }).await;

    let (status, body) = gw.handshake("/", Some(&bearer("a"))).await;
    assert_eq!(status, 401, "removed tenant `a` served: {body}");
    assert_eq!(gw.handshake("/", Some(&bearer("c"))).await.0, 101);
    use futures_util::StreamExt as _;
    use tokio_tungstenite::tungstenite::Message;
    let code = tokio::time::timeout(event_timeout(), async {
        loop {
            match gone.ws.next().await {
                Some(Ok(Message::Close(Some(f)))) => break Some(u16::from(f.code)),
                Some(Ok(_)) => continue,
                _ => break None,
            }
        }
    })
    .await
    .expect("a connection of a removed key stayed open");
    assert_eq!(code, Some(1008));
    kept.call("process/list", json!({})).await;
}

/// A SIGHUP sent the moment the gateway says it is up reloads the
/// configuration; it does not end the process (the signal's default):
/// the handler is in place (SigCgt) before the first stdout line, not
/// when a spawned task first runs.
#[tokio::test]
async fn a_sighup_right_after_the_start_reloads_rather_than_ending_the_gateway() {
    for _ in 0..3 {
        let mut gw = Gateway::start("");
        let status = std::fs::read_to_string(format!("/proc/{}/status", gw.child.id())).unwrap();
        let caught = status
            .lines()
            .find_map(|l| l.strip_prefix("SigCgt:"))
            .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
            .unwrap();
        assert_ne!(caught & (1 << (libc::SIGHUP - 1)), 0, "{status}");
        gw.signal(libc::SIGHUP);
        eventually_async("the reload", || async { gw.reloads("ok").await >= 1.0 }).await;
        assert!(gw.child.try_wait().unwrap().is_none(), "the gateway ended");
        let (mut c, _) = gw.session_of("t1").await;
        c.call("process/list", json!({})).await;
    }
}
