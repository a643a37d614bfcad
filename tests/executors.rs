//! Remote executors on loopback: real gateways, real `exec-gateway
//! executor` processes and the official `codex exec-server --remote`
//! (0.130.0, fetched by scripts/fetch-codex), real JWTs.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::free_port;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::direct::wait_readyz;
use common::{Client, Gateway, mint, now, random_secret};
use serde_json::{Value, json};

const EXE: &str = env!("CARGO_BIN_EXE_exec-gateway");
const WAIT: Duration = Duration::from_secs(30);

/// The gateway's config: tenant `t1` on pool `p` (and `t2` local).
fn gateway_config(dir: &Path, open_timeout: &str) -> String {
    format!(
        "[server]\ndetach_ttl = \"60s\"\n\
         [[auth.keys]]\nalgorithm = \"HS256\"\nsecret_file = \"{}/hs256.key\"\n\
         [tenants.t1]\nroot = \"/\"\npool = \"p\"\n\
         [tenants.t2]\nroot = \"/\"\n\
         [executors]\nopen_timeout = \"{open_timeout}\"\n[executors.pools.p]\n",
        dir.display()
    )
}

/// An executor credential for `pool`, signed with `secret`.
fn executor_token(secret: &[u8], pool: &str) -> String {
    let claims = json!({"sub": "ci", "pool": pool, "scope": "executor", "exp": now() + 3600});
    jsonwebtoken::encode(
        &jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256),
        &claims,
        &jsonwebtoken::EncodingKey::from_secret(secret),
    )
    .unwrap()
}

/// One `exec-gateway executor` process with its own tenant root.
struct Executor {
    child: Child,
    root: PathBuf,
    _dir: tempfile::TempDir,
}

impl Executor {
    fn start(gateway_addr: &str, token: &str, id: &str, slots: usize) -> Executor {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("root");
        std::fs::create_dir_all(&root).unwrap();
        std::fs::write(dir.path().join("k"), random_secret()).unwrap();
        let config = dir.path().join("executor.toml");
        std::fs::write(
            &config,
            format!(
                "[server]\ndetach_ttl = \"60s\"\n[[auth.keys]]\nalgorithm = \"HS256\"\nsecret_file = \"{}/k\"\n[tenants.here]\nroot = \"{}\"\n",
                dir.path().display(),
                root.display()
            ),
        )
        .unwrap();
        let child = Command::new(EXE)
            .args(["executor", "--config"])
            .arg(&config)
            .args(["--remote", &format!("http://{gateway_addr}/")])
            .args(["--executor-id", id, "--slots", &slots.to_string()])
            .args(["--label", "kind=ours"])
            .env("CODEX_EXEC_SERVER_REMOTE_BEARER_TOKEN", token)
            .env("XDG_STATE_HOME", dir.path().join("state"))
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn executor");
        Executor {
            child,
            root,
            _dir: dir,
        }
    }

    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Executor {
    fn drop(&mut self) {
        // SIGTERM first: its workers end with it.
        let _ = Command::new("kill")
            .arg(self.child.id().to_string())
            .status();
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while std::time::Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.kill();
    }
}

/// The official executor, or `None` (with the reason printed) without it.
fn codex_binary() -> Option<PathBuf> {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join(".ci/.tools/codex/0.130.0/codex");
    if p.exists() {
        Some(p)
    } else {
        eprintln!(
            "skipped: official codex 0.130.0 absent at {} (run scripts/fetch-codex)",
            p.display()
        );
        None
    }
}

struct Codex {
    child: Child,
    _home: tempfile::TempDir,
}

impl Codex {
    fn start(binary: &Path, gateway_addr: &str, token: &str, id: &str) -> Codex {
        let home = tempfile::Builder::new()
            .prefix("codex-home-")
            .tempdir_in("/var/tmp")
            .unwrap();
        let child = Command::new(binary)
            .args(["exec-server", "--remote", &format!("http://{gateway_addr}")])
            .args(["--executor-id", id])
            .env("CODEX_HOME", home.path())
            .env("CODEX_EXEC_SERVER_REMOTE_BEARER_TOKEN", token)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn codex");
        Codex { child, _home: home }
    }
}

impl Drop for Codex {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Run `echo` in `cwd` through the session; its output.
async fn echo(c: &mut Client, id: &str, cwd: &str, word: &str) -> String {
    c.call(
        "process/start",
        json!({"processId": id, "argv": ["/bin/sh", "-c", format!("echo {word}")],
               "cwd": cwd, "env": {"PATH": "/usr/bin:/bin"}, "tty": false}),
    )
    .await;
    let mut out = Vec::new();
    let mut after: Option<u64> = None;
    loop {
        let r = c
            .call(
                "process/read",
                json!({"processId": id, "afterSeq": after, "waitMs": 2000}),
            )
            .await;
        for chunk in r["chunks"].as_array().unwrap() {
            out.extend(common::unb64(chunk["chunk"].as_str().unwrap()));
        }
        after = r["nextSeq"].as_u64().map(|n| n - 1);
        if r["closed"] == true {
            return String::from_utf8_lossy(&out).into_owned();
        }
    }
}

/// A plain path for the session's cwd (the executor's root).
fn cwd_of(init: &Value) -> String {
    let cwd = init["environmentInfo"]["cwd"].as_str().unwrap_or("/tmp");
    let cwd = cwd.strip_prefix("file://").unwrap_or(cwd);
    if cwd == "/" {
        "/tmp".to_owned()
    } else {
        cwd.to_owned()
    }
}

async fn open(gw: &Gateway) -> (Client, Value) {
    let mut c = gw.connect().await;
    let init = c.call("initialize", json!({"clientName": "test"})).await;
    c.send(&json!({"method": "initialized"})).await;
    (c, init)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_land_on_our_executors_and_the_official_one() {
    let gw = Gateway::start_with(|d| gateway_config(d, "10s"));
    let token = executor_token(&gw.secret, "p");
    let _a = Executor::start(&gw.addr, &token, "ex-a", 2);
    let _b = Executor::start(&gw.addr, &token, "ex-b", 2);
    let codex = codex_binary().map(|b| Codex::start(&b, &gw.addr, &token, "codex-1"));
    let executors = if codex.is_some() { 3 } else { 2 };
    wait_readyz(&gw, &format!("pool p: {executors} executors")).await;
    let links = if codex.is_some() { 5 } else { 4 };
    wait_readyz(&gw, &format!("{links} idle links")).await;

    // Least loaded first: holding one session per link puts one on each
    // executor before any gets a second.
    let mut sessions = Vec::new();
    for _ in 0..links {
        sessions.push(open(&gw).await);
    }
    let on = |name: &str| {
        sessions
            .iter()
            .filter(|(_, init)| {
                init["sessionId"]
                    .as_str()
                    .unwrap()
                    .starts_with(&format!("x-{name}@p."))
            })
            .count()
    };
    assert_eq!(on("ex-a"), 2);
    assert_eq!(on("ex-b"), 2);
    if codex.is_some() {
        assert_eq!(on("codex-1"), 1, "the official executor got a session");
    }
    for (i, (c, init)) in sessions.iter_mut().enumerate() {
        let cwd = cwd_of(init);
        let out = echo(c, "p1", &cwd, &format!("hello-{i}")).await;
        assert_eq!(out, format!("hello-{i}\n"));
        let path = format!("{cwd}/remote-{i}.txt");
        c.call(
            "fs/writeFile",
            json!({"path": path, "dataBase64": common::b64(format!("data {i}").as_bytes())}),
        )
        .await;
        let r = c.call("fs/readFile", json!({"path": path})).await;
        assert_eq!(
            common::unb64(r["dataBase64"].as_str().unwrap()),
            format!("data {i}").as_bytes()
        );
        let _ = std::fs::remove_file(&path);
    }
    // An answer larger than a connection's outbound queue (4 MiB) arrives.
    let (c, init) = sessions
        .iter_mut()
        .find(|(_, i)| i["sessionId"].as_str().unwrap().starts_with("x-ex-b@p."))
        .unwrap();
    let big = format!("{}/big.bin", cwd_of(init));
    let data: Vec<u8> = (0..5_000_000u32).map(|i| (i % 251) as u8).collect();
    c.call(
        "fs/writeFile",
        json!({"path": big, "dataBase64": common::b64(&data)}),
    )
    .await;
    let r = c.call("fs/readFile", json!({"path": big})).await;
    assert_eq!(common::unb64(r["dataBase64"].as_str().unwrap()), data);
    let _ = std::fs::remove_file(&big);
    // Our executors confine sessions to their tenant root.
    let (c, init) = sessions
        .iter_mut()
        .find(|(_, i)| i["sessionId"].as_str().unwrap().starts_with("x-ex-a@p."))
        .unwrap();
    assert!(cwd_of(init).ends_with("/root"));
    let (code, msg) = c
        .call_err("fs/readFile", json!({"path": "/etc/hostname"}))
        .await;
    assert_eq!(code, -32004, "{msg}");
    // The pool's tenant is the only one placed there: t2 runs locally.
    let mut other = Client::connect(&gw.url, &gw.token("t2")).await;
    let sid = other.initialize().await;
    assert!(!sid.contains("x-"), "{sid}");
    // Per-executor metrics.
    let (_, metrics) = gw.admin_get("/metrics").await;
    assert!(
        metrics.contains("exec_gateway_executor_sessions{pool=\"p\",executor=\"ex-a\"} 2"),
        "{metrics}"
    );
    // gRPC sessions of this tenant run on executors too: tests/executor_grpc.rs.
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_executor_fails_only_its_sessions_and_comes_back() {
    let gw = Gateway::start_with(|d| gateway_config(d, "2s"));
    let token = executor_token(&gw.secret, "p");
    let mut a = Executor::start(&gw.addr, &token, "ex-a", 1);
    let _b = Executor::start(&gw.addr, &token, "ex-b", 1);
    wait_readyz(&gw, "pool p: 2 executors, 2 idle links").await;
    let (s1, i1) = open(&gw).await;
    let (s2, i2) = open(&gw).await;
    let (mut on_a, init_a, mut on_b, init_b) =
        if i1["sessionId"].as_str().unwrap().starts_with("x-ex-a@p.") {
            (s1, i1, s2, i2)
        } else {
            (s2, i2, s1, i1)
        };
    assert!(
        init_b["sessionId"]
            .as_str()
            .unwrap()
            .starts_with("x-ex-b@p.")
    );
    let cwd_a = cwd_of(&init_a);
    let cwd_b = cwd_of(&init_b);
    assert_eq!(echo(&mut on_a, "p1", &cwd_a, "before").await, "before\n");

    a.kill();
    // Its session fails with an error naming it...
    let r = on_a
        .call_raw(
            "process/start",
            json!({"processId": "p2", "argv": ["/bin/true"], "cwd": cwd_a, "env": {}, "tty": false}),
        )
        .await;
    assert_eq!(r["error"]["code"], -32007, "{r}");
    assert_eq!(r["error"]["data"]["reason"], "executorUnavailable", "{r}");
    assert_eq!(r["error"]["data"]["executor"], "ex-a", "{r}");
    assert!(
        r["error"]["message"].as_str().unwrap().contains("ex-a"),
        "{r}"
    );
    // ...and the other executor's session does not notice.
    assert_eq!(echo(&mut on_b, "p1", &cwd_b, "still").await, "still\n");

    // A restarted executor registers again and takes new sessions; the
    // old session's processes died with it, and it says so.
    let _a2 = Executor::start(&gw.addr, &token, "ex-a", 1);
    wait_readyz(&gw, "pool p: 2 executors, 1 idle links").await;
    let r = on_a
        .call_raw("process/read", json!({"processId": "p1"}))
        .await;
    assert!(
        r["error"]["message"]
            .as_str()
            .unwrap()
            .contains("unknown session"),
        "{r}"
    );
    let (mut fresh, init) = open(&gw).await;
    assert!(init["sessionId"].as_str().unwrap().starts_with("x-ex-a@p."));
    assert_eq!(
        echo(&mut fresh, "p1", &cwd_of(&init), "again").await,
        "again\n"
    );
}

/// A gateway process, killed when dropped.
struct Fixed(Child);

impl Drop for Fixed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A gateway on a fixed address, and gRPC on `grpc` (it is restarted on
/// them).
fn serve_fixed(dir: &Path, addr: &str, grpc: &str) -> Fixed {
    let mut child = Command::new(EXE)
        .args([
            "serve",
            "--listen",
            &format!("ws://{addr}"),
            "--grpc-listen",
            grpc,
            "--admin-listen",
            "off",
        ])
        .arg("--config")
        .arg(dir.join("gateway.toml"))
        .env("XDG_STATE_HOME", dir.join("state"))
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let mut line = String::new();
    use std::io::BufRead as _;
    std::io::BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim(), format!("ws://{addr}"));
    Fixed(child)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_survive_a_gateway_restart_on_our_executor() {
    let dir = tempfile::tempdir().unwrap();
    let secret = random_secret();
    std::fs::write(dir.path().join("hs256.key"), &secret).unwrap();
    std::fs::write(
        dir.path().join("gateway.toml"),
        gateway_config(dir.path(), "10s"),
    )
    .unwrap();
    let addr = format!("127.0.0.1:{}", free_port());
    let grpc = format!("127.0.0.1:{}", free_port());
    let first = serve_fixed(dir.path(), &addr, &grpc);
    let token = executor_token(&secret, "p");
    let a = Executor::start(&addr, &token, "ex-a", 1);
    let cwd = a.root.display().to_string();
    let url = format!("ws://{addr}");
    let tenant = mint(&secret, "t1", common::ALL_SCOPES);
    // Wait for the link: a session opens once it is there.
    let mut c = Client::connect(&url, &tenant).await;
    let sid = c.initialize().await;
    assert!(sid.starts_with("x-ex-a@p."), "{sid}");
    c.call(
        "process/start",
        json!({"processId": "cat", "argv": ["/bin/cat"], "cwd": cwd, "env": {},
               "tty": false, "pipeStdin": true}),
    )
    .await;
    drop(c);

    drop(first);
    let second = serve_fixed(dir.path(), &addr, &grpc);

    // The executor registers with the new gateway; the client resumes its
    // session there, and the process kept running on the executor.
    let deadline = tokio::time::Instant::now() + WAIT;
    let mut c = loop {
        let mut c = Client::connect(&url, &tenant).await;
        let r = c
            .call_raw(
                "initialize",
                json!({"clientName": "test", "resumeSessionId": sid}),
            )
            .await;
        if r.get("result").is_some() {
            assert_eq!(r["result"]["sessionId"], sid.as_str());
            c.send(&json!({"method": "initialized"})).await;
            break c;
        }
        assert!(tokio::time::Instant::now() < deadline, "never resumed: {r}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    c.call(
        "process/write",
        json!({"processId": "cat", "chunk": common::b64(b"still here\n")}),
    )
    .await;
    let r = c
        .call("process/read", json!({"processId": "cat", "waitMs": 3000}))
        .await;
    let text: Vec<u8> = r["chunks"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|c| common::unb64(c["chunk"].as_str().unwrap()))
        .collect();
    assert_eq!(text, b"still here\n");
    drop(c);

    // Once more, resumed by a gRPC client this time: the same session,
    // its process still there.
    drop(second);
    let _third = serve_fixed(dir.path(), &addr, &grpc);
    use exec_gateway::transport::grpc::pb;
    let ch = common::grpc::channel(&format!("http://{grpc}")).await;
    let mut sessions = pb::session_service_client::SessionServiceClient::new(ch.clone());
    let resumed = loop {
        let req = common::grpc::authed(
            pb::ResumeSessionRequest {
                session_id: sid.clone(),
            },
            &tenant,
        );
        match sessions.resume_session(req).await {
            Ok(r) => break r.into_inner().session_id,
            Err(e) => assert!(
                tokio::time::Instant::now() < deadline,
                "never resumed: {e:?}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(resumed, sid);
    let mut procs = pb::process_service_client::ProcessServiceClient::new(ch);
    let listed = procs
        .list(common::grpc::authed(
            pb::ListRequest {
                session_id: sid.clone(),
            },
            &tenant,
        ))
        .await
        .unwrap()
        .into_inner();
    let ids: Vec<_> = listed
        .processes
        .iter()
        .map(|p| p.process_id.as_str())
        .collect();
    assert_eq!(ids, ["cat"]);
    let req = pb::TerminateRequest {
        session_id: sid.clone(),
        process_id: "cat".into(),
    };
    procs
        .terminate(common::grpc::authed(req, &tenant))
        .await
        .unwrap();
}

async fn register(addr: &str, id: &str, bearer: &str) -> (u16, Value) {
    let r = reqwest::Client::new()
        .post(format!("http://{addr}/cloud/executor/{id}/register"))
        .bearer_auth(bearer)
        .header("content-type", "application/json")
        .body(json!({"executor_id": id, "name": "n", "labels": {}, "metadata": {}}).to_string())
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    let text = r.text().await.unwrap_or_default();
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_executor_credentials_register_and_tickets_are_single_use() {
    let gw = Gateway::start_with(|d| gateway_config(d, "2s"));
    let good = executor_token(&gw.secret, "p");
    // A tenant's token is not an executor credential.
    let (status, body) = register(&gw.addr, "e1", &gw.token("t1")).await;
    assert_eq!(status, 403, "{body}");
    assert_eq!(body["error"]["code"], "forbidden");
    // Nor is a forged one, or one for a pool that does not exist.
    let (status, _) = register(&gw.addr, "e1", &executor_token(&random_secret(), "p")).await;
    assert_eq!(status, 401);
    let (status, _) = register(&gw.addr, "e1", &executor_token(&gw.secret, "nope")).await;
    assert_eq!(status, 403);
    let (status, _) = register(&gw.addr, "bad.id", &good).await;
    assert_eq!(status, 400);
    // An executor credential cannot open client sessions.
    let (status, _) = gw.handshake("/", Some(&format!("Bearer {good}"))).await;
    assert_eq!(status, 403);

    let (status, body) = register(&gw.addr, "e1", &good).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["executor_id"], "e1");
    let url = body["url"].as_str().unwrap().to_owned();
    assert!(url.starts_with(&format!(
        "ws://{}/cloud/executor/e1/rendezvous?ticket=",
        gw.addr
    )));
    // The ticket names its executor: not usable by another.
    let stolen = url.replace("/executor/e1/", "/executor/e2/");
    assert!(tokio_tungstenite::connect_async(&stolen).await.is_err());
    let (_ws, _) = tokio_tungstenite::connect_async(&url)
        .await
        .expect("rendezvous");
    // Used once: a replay is refused.
    assert!(tokio_tungstenite::connect_async(&url).await.is_err());
    let (_, metrics) = gw.admin_get("/metrics").await;
    assert!(metrics.contains("reason=\"ticket_used\""), "{metrics}");
    assert!(
        metrics.contains("reason=\"not_executor_credential\""),
        "{metrics}"
    );

    // Our executor stops on a refused credential, as Codex's does.
    let mut ours = Executor::start(&gw.addr, &gw.token("t1"), "ex-x", 1);
    let deadline = std::time::Instant::now() + WAIT;
    let status = loop {
        if let Some(s) = ours.child.try_wait().unwrap() {
            break s;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "executor kept running"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(!status.success());
    if let Some(bin) = codex_binary() {
        let mut codex = Codex::start(&bin, &gw.addr, &gw.token("t1"), "codex-x");
        let out = {
            let deadline = std::time::Instant::now() + WAIT;
            loop {
                if let Some(s) = codex.child.try_wait().unwrap() {
                    break s;
                }
                assert!(std::time::Instant::now() < deadline, "codex kept running");
                std::thread::sleep(Duration::from_millis(50));
            }
        };
        assert!(!out.success());
        let mut err = String::new();
        use std::io::Read as _;
        codex
            .child
            .stderr
            .take()
            .unwrap()
            .read_to_string(&mut err)
            .unwrap();
        assert!(err.contains("403"), "{err}");
    }
}

#[test]
fn a_pool_serves_one_tenant() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("k"), random_secret()).unwrap();
    std::fs::create_dir_all(dir.path().join("a")).unwrap();
    std::fs::create_dir_all(dir.path().join("b")).unwrap();
    let config = common::write_file(
        dir.path(),
        "g.toml",
        &format!(
            "[[auth.keys]]\nalgorithm = \"HS256\"\nsecret_file = \"{}/k\"\n\
             [tenants.a]\nroot = \"{0}/a\"\npool = \"p\"\n[tenants.b]\nroot = \"{0}/b\"\npool = \"p\"\n\
             [executors.pools.p]\n",
            dir.path().display()
        ),
    );
    let out = common::serve_expecting_refusal(&config);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("a pool serves one tenant"), "{err}");
}

/// A pool serves one tenant whatever made it: a template cannot name one
/// (each templated tenant would run on it), even one a configured tenant
/// names.
#[test]
fn a_template_cannot_name_a_pool() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("k"), random_secret()).unwrap();
    std::fs::create_dir_all(dir.path().join("a")).unwrap();
    let config = common::write_file(
        dir.path(),
        "g.toml",
        &format!(
            "[[auth.keys]]\nalgorithm = \"HS256\"\nsecret_file = \"{0}/k\"\n\
             [tenants.a]\nroot = \"{0}/a\"\npool = \"p\"\n\
             [tenant_template]\nroot = \"{0}/roots/{{tenant}}\"\npool = \"p\"\n\
             [executors.pools.p]\n",
            dir.path().display()
        ),
    );
    let out = common::serve_expecting_refusal(&config);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("tenant_template: pool, pool_labels and placement cannot be templated"),
        "{err}"
    );
}

/// An executor session is resumed only by the tenant that opened it: a
/// reload that would hand the pool (its executors, its detached sessions)
/// to another tenant is refused, and that tenant's resume of the id fails
/// like an unknown one, while the owner still resumes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_tenant_never_resumes_an_executor_session() {
    let config = |d: &Path, pooled: &str| {
        let (p1, p2) = if pooled == "t1" {
            ("pool = \"p\"\n", "")
        } else {
            ("", "pool = \"p\"\n")
        };
        format!(
            "[server]\ndetach_ttl = \"1s\"\n\
             [[auth.keys]]\nalgorithm = \"HS256\"\nsecret_file = \"{}/hs256.key\"\n\
             [tenants.t1]\nroot = \"/\"\n{p1}[tenants.t2]\nroot = \"/\"\n{p2}\
             [executors]\nopen_timeout = \"10s\"\n[executors.pools.p]\n",
            d.display()
        )
    };
    let gw = Gateway::start_with(|d| config(d, "t1"));
    let a = Executor::start(&gw.addr, &executor_token(&gw.secret, "p"), "ex-a", 2);
    let cwd = a.root.display().to_string();
    let t1 = gw.token("t1");
    let mut c = Client::connect(&gw.url, &t1).await;
    let sid = c.initialize().await;
    assert!(sid.starts_with("x-ex-a@p."), "{sid}");
    c.call(
        "process/start",
        json!({"processId": "cat", "argv": ["/bin/cat"], "cwd": cwd, "env": {},
               "tty": false, "pipeStdin": true}),
    )
    .await;
    drop(c);
    // The detach TTL passes: the gateway forgets the session; the
    // executor keeps it, resumable by its id.
    let deadline = tokio::time::Instant::now() + WAIT;
    while gw
        .metric("exec_gateway_sessions", "tenant=\"t1\"")
        .await
        .unwrap_or(0.0)
        > 0.0
    {
        assert!(tokio::time::Instant::now() < deadline, "never expired");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    std::fs::write(
        gw.dir.path().join("gateway.toml"),
        config(gw.dir.path(), "t2"),
    )
    .unwrap();
    gw.signal(libc::SIGHUP);
    let reloads = |outcome: &'static str| gw.reloads(outcome);
    while reloads("ok").await + reloads("refused").await < 1.0 {
        assert!(tokio::time::Instant::now() < deadline, "no reload");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(reloads("refused").await, 1.0, "the pool moved to t2");

    let mut c2 = Client::connect(&gw.url, &gw.token("t2")).await;
    let r = c2
        .call_raw(
            "initialize",
            json!({"clientName": "test", "resumeSessionId": sid}),
        )
        .await;
    assert!(r.get("result").is_none(), "t2 resumed t1's session: {r}");
    // Worded as for an id never issued.
    assert_eq!(r["error"]["code"], -32600, "{r}");
    assert_eq!(
        r["error"]["message"],
        format!("unknown session id {sid}").as_str(),
        "{r}"
    );

    // Its owner resumes it, the process still there.
    let mut c = Client::connect(&gw.url, &t1).await;
    assert_eq!(c.resume(&sid).await["sessionId"], sid.as_str());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_executor_session_is_owned_where_its_link_landed_and_reached_through_any_replica() {
    let dir = tempfile::tempdir().unwrap();
    let key_path = dir.path().join("fleet.key");
    std::fs::write(&key_path, random_secret()).unwrap();
    let secret = random_secret();
    let ports = [free_port(), free_port()];
    let peers = format!(
        "gw-0 = \"127.0.0.1:{}\"\ngw-1 = \"127.0.0.1:{}\"\n",
        ports[0], ports[1]
    );
    let replicas: Vec<Gateway> = (0..2)
        .map(|i| {
            let args = vec![
                "--replica".to_owned(),
                format!("gw-{i}"),
                "--fleet-listen".to_owned(),
                format!("127.0.0.1:{}", ports[i]),
            ];
            let (key_path, peers) = (key_path.clone(), peers.clone());
            Gateway::launch(Path::new(EXE), Some(secret.clone()), &args, move |d| {
                format!(
                    "{}[fleet]\nkey_file = \"{}\"\n[fleet.peers]\n{peers}",
                    gateway_config(d, "2s"),
                    key_path.display()
                )
            })
        })
        .collect();
    let token = executor_token(&secret, "p");
    // A rendezvous ticket from one replica is accepted by another (the
    // balancer may send the executor anywhere).
    let (status, body) = register(&replicas[0].addr, "ex-t", &token).await;
    assert_eq!(status, 200, "{body}");
    let url = body["url"]
        .as_str()
        .unwrap()
        .replace(&replicas[0].addr, &replicas[1].addr);
    let (ws, _) = tokio_tungstenite::connect_async(&url)
        .await
        .expect("rendezvous elsewhere");
    drop(ws);

    let a = Executor::start(&replicas[0].addr, &token, "ex-a", 1);
    wait_readyz(&replicas[0], "pool p: 1 executors, 1 idle links").await;
    let cwd = a.root.display().to_string();
    let tenant = mint(&secret, "t1", common::ALL_SCOPES);
    let mut c = Client::connect(&replicas[0].url, &tenant).await;
    let sid = c.initialize().await;
    assert!(sid.starts_with("gw-0.x-ex-a@p."), "{sid}");
    assert_eq!(echo(&mut c, "p1", &cwd, "owner").await, "owner\n");
    drop(c);
    // Through the other replica: relayed to gw-0, which holds the link.
    let mut c = Client::connect(&replicas[1].url, &tenant).await;
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let r = c
            .call_raw(
                "initialize",
                json!({"clientName": "t", "resumeSessionId": sid}),
            )
            .await;
        if r.get("result").is_some() {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "{r}");
        assert!(
            r["error"]["message"].as_str().unwrap().contains("attached"),
            "{r}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
        c = Client::connect(&replicas[1].url, &tenant).await;
    }
    c.send(&json!({"method": "initialized"})).await;
    assert_eq!(echo(&mut c, "p2", &cwd, "relayed").await, "relayed\n");
    // gw-1 holds no link of the pool: a new session there says so.
    let mut other = Client::connect(&replicas[1].url, &tenant).await;
    let r = other
        .call_raw("initialize", json!({"clientName": "t"}))
        .await;
    assert_eq!(r["error"]["code"], -32007, "{r}");
    assert_eq!(r["error"]["data"]["reason"], "executorUnavailable", "{r}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_holds_at_most_max_links() {
    let gw = Gateway::start_with(|d| format!("{}max_links = 1\n", gateway_config(d, "2s")));
    let token = executor_token(&gw.secret, "p");
    let (status, body) = register(&gw.addr, "e1", &token).await;
    assert_eq!(status, 200, "{body}");
    let (_link, _) = tokio_tungstenite::connect_async(body["url"].as_str().unwrap())
        .await
        .expect("rendezvous");
    wait_readyz(&gw, "pool p: 1 executors, 1 idle links").await;
    let (status, body) = register(&gw.addr, "e2", &token).await;
    assert_eq!(status, 429, "{body}");
    assert_eq!(body["error"]["code"], "pool_links_full");
}

/// gRPC's streamed files on an executor: on May's official executor
/// (0.130.0, whole-file calls only) and on ours, a file written in several
/// messages lands whole and reads back byte for byte, whole and in part.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_files_stream_to_mays_executor_and_ours() {
    use common::grpc::{authed, channel};
    use exec_gateway::transport::grpc::pb;
    use futures_util::StreamExt as _;
    for official in [codex_binary(), None] {
        let gw = Gateway::start_with(|d| gateway_config(d, "5s"));
        let token = executor_token(&gw.secret, "p");
        // A directory both the executor and this test can reach (ours
        // serves its own root).
        let scratch = tempfile::tempdir_in("/var/tmp").unwrap();
        let (_executor, dir) = match &official {
            Some(bin) => {
                let c = Codex::start(bin, &gw.addr, &token, "codex-f");
                ((Some(c), None), scratch.path().to_owned())
            }
            None => {
                let e = Executor::start(&gw.addr, &token, "ours-f", 1);
                let root = e.root.clone();
                ((None, Some(e)), root)
            }
        };
        wait_readyz(&gw, "pool p: 1 executors, 1 idle links").await;
        let ch = channel(&gw.grpc).await;
        let user = gw.token("t1");
        let sid = pb::session_service_client::SessionServiceClient::new(ch.clone())
            .create_session(authed(pb::CreateSessionRequest::default(), &user))
            .await
            .unwrap()
            .into_inner()
            .session_id;
        assert!(sid.starts_with("x-"), "on the executor: {sid}");
        let path = dir.join("f.bin").display().to_string();
        let data: Vec<u8> = (0..1_500_000u32).map(|i| (i % 253) as u8).collect();
        let parts: Vec<_> = data
            .chunks(400_000)
            .enumerate()
            .map(|(i, c)| pb::WriteFileRequest {
                path: if i == 0 { path.clone() } else { String::new() },
                data: c.to_vec().into(),
                session_id: if i == 0 { sid.clone() } else { String::new() },
            })
            .collect();
        let mut files = pb::file_service_client::FileServiceClient::new(ch);
        let wrote = files
            .write_file(authed(futures_util::stream::iter(parts), &user))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(wrote.bytes_written, data.len() as u64);
        assert!(std::fs::read(&path).unwrap() == data, "written whole");
        for (offset, length) in [(0u64, 0u64), (1_048_000, 1_000)] {
            let req = pb::ReadFileRequest {
                path: path.clone(),
                offset,
                length,
                session_id: sid.clone(),
            };
            let mut s = files
                .read_file(authed(req, &user))
                .await
                .unwrap()
                .into_inner();
            let mut got = Vec::new();
            while let Some(m) = tokio::time::timeout(WAIT, s.next()).await.unwrap() {
                got.extend(m.unwrap().data);
            }
            let end = if length == 0 {
                data.len()
            } else {
                (offset + length) as usize
            };
            assert!(got == data[offset as usize..end], "{offset}+{length}");
        }
        if official.is_none() {
            continue;
        }
        // May's executor reads a file whole: a device is refused before it
        // is asked (it would read /dev/zero until its memory ran out).
        let req = pb::ReadFileRequest {
            path: "/dev/zero".into(),
            length: 5,
            session_id: sid.clone(),
            ..Default::default()
        };
        let e = files.read_file(authed(req, &user)).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
        // A write over what goes whole is refused, and the file it would
        // have replaced is left as it was.
        let big = vec![b'x'; 4 * 1024 * 1024];
        let parts: Vec<_> = (0..3)
            .map(|i| pb::WriteFileRequest {
                path: if i == 0 { path.clone() } else { String::new() },
                data: big.clone().into(),
                session_id: if i == 0 { sid.clone() } else { String::new() },
            })
            .collect();
        let e = files
            .write_file(authed(futures_util::stream::iter(parts), &user))
            .await
            .unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
        assert!(std::fs::read(&path).unwrap() == data, "left as it was");
    }
}
