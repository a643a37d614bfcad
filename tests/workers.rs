//! Per-tenant workers: processes are spawned by a worker process that is
//! confined as a whole, and a worker that dies takes only its own sessions'
//! processes along (reported with a clear failure), while other tenants
//! never notice and the tenant gets a replacement. Skipped, with the
//! probe's reason, where the worker layer is inactive.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::disallowed_methods
)]

mod common;

use common::{Gateway, eventually, pid_alive};
use serde_json::json;

fn gateway() -> Gateway {
    Gateway::start_with(|dir| {
        format!(
            "[[auth.keys]]\nalgorithm = \"HS256\"\nsecret_file = \"{}/hs256.key\"\n\
             [tenants.a]\nroot = \"/\"\n[tenants.b]\nroot = \"/\"\n",
            dir.display()
        )
    })
}

async fn require_workers(gw: &Gateway) -> bool {
    let (_, body) = gw.admin_get("/readyz").await;
    if body.contains("workers: active") {
        true
    } else {
        eprintln!(
            "SKIPPED: worker layer inactive on this host: {}",
            body.trim()
        );
        false
    }
}

fn status_field(pid: i32, field: &str) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| {
            l.strip_prefix(&format!("{field}:"))
                .map(|v| v.trim().to_owned())
        })
        .unwrap_or_default()
}

/// Start a sleeper that prints its pid; returns (pid, its parent = the worker).
async fn sleeper(c: &mut common::Client, id: &str) -> (i32, i32) {
    c.start(id, &["sh", "-c", "echo $$; exec sleep 60"]).await;
    let pid: i32 = c.first_line(id).await.trim().parse().unwrap();
    let ppid: i32 = status_field(pid, "PPid").parse().unwrap();
    (pid, ppid)
}

#[tokio::test]
async fn processes_are_spawned_by_a_confined_worker_per_tenant() {
    let gw = gateway();
    if !require_workers(&gw).await {
        return;
    }
    let (mut a, _) = gw.session_of("a").await;
    let (mut b, _) = gw.session_of("b").await;
    let (_, wa) = sleeper(&mut a, "s").await;
    let (_, wb) = sleeper(&mut b, "s").await;
    let gateway_pid = i32::try_from(gw.child.id()).unwrap();
    assert_ne!(wa, gateway_pid, "a's process was spawned by the gateway");
    assert_ne!(wa, wb, "tenants share a worker");
    for w in [wa, wb] {
        let cmdline = std::fs::read_to_string(format!("/proc/{w}/cmdline")).unwrap();
        assert!(cmdline.contains("worker"), "{cmdline}");
        assert_eq!(status_field(w, "PPid"), gateway_pid.to_string());
        assert_eq!(status_field(w, "NoNewPrivs"), "1");
        assert_eq!(status_field(w, "Seccomp"), "2", "filter mode");
    }
    let cgroup = std::fs::read_to_string(format!("/proc/{wa}/cgroup")).unwrap();
    assert!(
        cgroup.contains(&format!("exec-gateway/gw-{gateway_pid}/a")),
        "{cgroup}"
    );
    // The worker's link to the gateway never reaches a tenant process.
    a.start(
        "fds",
        &[
            "sh",
            "-c",
            "test -e /proc/$$/fd/3 && echo leaked || echo clean",
        ],
    )
    .await;
    assert_eq!(a.collect("fds").await.stdout, b"clean\n");
}

#[tokio::test]
async fn a_dead_worker_fails_only_its_own_processes() {
    let gw = gateway();
    if !require_workers(&gw).await {
        return;
    }
    let (mut a, _) = gw.session_of("a").await;
    let (mut b, _) = gw.session_of("b").await;
    let (pa, wa) = sleeper(&mut a, "victim").await;
    let (pb, _) = sleeper(&mut b, "bystander").await;
    // Kill a's worker.
    assert_eq!(kill9(wa), 0, "could not signal worker {wa}");
    // a's process is reported ended, with the reason, and is really gone.
    let out = a.collect("victim").await;
    assert_eq!(out.exit_code, Some(-1));
    let r = a.call("process/read", json!({"processId":"victim"})).await;
    assert_eq!(
        r["failure"],
        json!("its worker process died; the process was killed")
    );
    eventually("a's process dies with its worker", || !pid_alive(pa)).await;
    let (_, metrics) = gw.admin_get("/metrics").await;
    assert!(
        metrics.contains("exec_gateway_worker_deaths_total{tenant=\"a\"} 1"),
        "{metrics}"
    );
    assert!(metrics.contains("exec_gateway_worker_deaths_total{tenant=\"b\"} 0"));
    // b never noticed, and a gets a replacement worker.
    assert!(pid_alive(pb), "b's process was affected");
    b.start("more", &["sh", "-c", "echo b-ok"]).await;
    assert_eq!(b.collect("more").await.stdout, b"b-ok\n");
    a.start("again", &["sh", "-c", "echo a-ok"]).await;
    assert_eq!(a.collect("again").await.stdout, b"a-ok\n");
    // File operations (which run in the workers) carry on too.
    let r = a
        .call("fs/getMetadata", json!({"path": "/etc/hostname"}))
        .await;
    assert_eq!(r["isFile"], json!(true), "{r}");
}

fn kill9(pid: i32) -> i32 {
    std::process::Command::new("kill")
        .arg("-9")
        .arg(pid.to_string())
        .status()
        .map(|s| s.code().unwrap_or(1))
        .unwrap_or(1)
}

#[tokio::test]
async fn a_worker_stopped_by_its_own_tenant_is_replaced_and_others_carry_on() {
    let gw = gateway();
    if !require_workers(&gw).await {
        return;
    }
    let (mut a, _) = gw.session_of("a").await;
    let (mut b, _) = gw.session_of("b").await;
    // A tenant process may signal its own worker (same uid and domain):
    // here it stops it.
    // (It waits for a go file, so that its start is answered first.)
    let dir = tempfile::tempdir().unwrap();
    let go = dir.path().join("go");
    let script = format!(
        "while [ ! -e {} ]; do sleep 0.02; done; kill -STOP $PPID; sleep 60",
        go.display()
    );
    a.start("stopper", &["sh", "-c", &script]).await;
    std::fs::write(&go, "").unwrap();
    let worker: i32 = loop {
        // Children of any of the gateway's threads (workers are started
        // where the tenant is activated, off the main thread).
        let pids: String = std::fs::read_dir(format!("/proc/{}/task", gw.child.id()))
            .map(|tasks| {
                tasks
                    .flatten()
                    .map(|t| std::fs::read_to_string(t.path().join("children")).unwrap_or_default())
                    .collect::<Vec<_>>()
                    .join(" ")
            })
            .unwrap_or_default();
        let stopped = pids
            .split_whitespace()
            .filter_map(|p| p.parse::<i32>().ok())
            .find(|p| status_field(*p, "State").starts_with('T'));
        if let Some(p) = stopped {
            break p;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    };
    // b is served meanwhile.
    b.start("b1", &["sh", "-c", "echo b-ok"]).await;
    assert_eq!(b.collect("b1").await.stdout, b"b-ok\n");
    // a's next spawn finds the worker unresponsive: an error, and the worker
    // is killed (its processes reported failed)...
    let (code, msg) = a
        .call_err(
            "process/start",
            json!({"processId": "blocked", "argv": ["true"], "cwd": "/tmp", "env": {}, "tty": false}),
        )
        .await;
    assert_eq!(code, -32603, "{msg}");
    assert!(msg.contains("worker"), "{msg}");
    eventually("the stopped worker is gone", || !pid_alive(worker)).await;
    let out = a.collect("stopper").await;
    assert_eq!(out.exit_code, Some(-1));
    // ...and the one after gets a fresh worker.
    a.start("after", &["sh", "-c", "echo a-ok"]).await;
    assert_eq!(a.collect("after").await.stdout, b"a-ok\n");
}

/// An upgrade replaces the binary under a running gateway: a worker
/// started afterwards still runs the gateway's own executable (held open
/// since start), not whatever now lies at the path.
#[tokio::test]
async fn a_binary_replaced_on_disk_does_not_change_new_workers() {
    let dir = tempfile::tempdir().unwrap();
    let bin = dir.path().join("exec-gateway");
    std::fs::copy(env!("CARGO_BIN_EXE_exec-gateway"), &bin).unwrap();
    // b is confined (Landlock grants it the gateway's executable alone of
    // this directory).
    let broot = dir.path().join("broot");
    std::fs::create_dir(&broot).unwrap();
    let gw = Gateway::start_binary(&bin, |d| {
        format!(
            "[[auth.keys]]\nalgorithm = \"HS256\"\nsecret_file = \"{}/hs256.key\"\n\
             [tenants.a]\nroot = \"/\"\n[tenants.b]\nroot = \"{}\"\n",
            d.display(),
            broot.display()
        )
    });
    if !require_workers(&gw).await {
        return;
    }
    let (mut a, _) = gw.session_of("a").await;
    let (_, worker) = sleeper(&mut a, "s1").await;
    // The upgrade: another program now lies at the path.
    let other = dir.path().join("other");
    std::fs::copy("/bin/true", &other).unwrap();
    std::fs::rename(&other, &bin).unwrap();
    assert_eq!(kill9(worker), 0);
    common::eventually("the worker to die", || !common::pid_alive(worker)).await;
    // A new worker serves the next spawn (a spawn racing the gateway's
    // notice of the death fails and is retried).
    for i in 0..20 {
        let id = format!("s2-{i}");
        let r = a
            .call_raw(
                "process/start",
                json!({"processId": id, "argv": ["sh", "-c", "echo $$; exec sleep 60"],
                       "cwd": "/", "env": {}, "tty": false}),
            )
            .await;
        if r.get("error").is_some() {
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            continue;
        }
        let pid: i32 = a.first_line(&id).await.trim().parse().unwrap();
        let new_worker: i32 = status_field(pid, "PPid").parse().unwrap();
        assert_ne!(new_worker, worker);
        assert!(common::pid_alive(pid));
        // A tenant first used after the upgrade: its workers, started
        // now, exec the gateway's file too (and Landlock lets them).
        let (mut b, _) = gw.session_of("b").await;
        b.call(
            "process/start",
            json!({"processId": "b1", "argv": ["sh", "-c", "echo b-ok"], "cwd": broot,
                   "env": {"PATH": "/usr/bin:/bin"}, "tty": false}),
        )
        .await;
        assert_eq!(b.collect("b1").await.stdout, b"b-ok\n");
        return;
    }
    panic!("no new worker served a spawn");
}

/// A tenant that keeps killing its own worker gets its replacements
/// spaced out (refused with "restarting" meanwhile) instead of making the
/// gateway fork workers flat out; the other tenant is served throughout.
#[tokio::test]
async fn a_tenant_killing_its_worker_is_backed_off_and_others_are_served() {
    let gw = gateway();
    if !require_workers(&gw).await {
        return;
    }
    let (mut a, _) = gw.session_of("a").await;
    let (mut b, _) = gw.session_of("b").await;
    let (mut refused, mut killed) = (0, 0);
    for i in 0..30 {
        let r = a
            .call_raw(
                "process/start",
                json!({"processId": format!("k{i}"), "argv": ["sh", "-c", "kill -9 $PPID"],
                       "cwd": "/", "env": {}, "tty": false}),
            )
            .await;
        match r.get("error") {
            // Overloaded, with when to retry.
            Some(e) if e["code"] == -32001 && e["data"]["retryAfterMs"].as_u64().is_some() => {
                refused += 1
            }
            // Started, or failed because the worker it killed died under
            // the spawn's answer (a loaded machine runs the child first):
            // either way a worker was killed.
            _ => killed += 1,
        }
        let out = b
            .call(
                "process/start",
                json!({"processId": format!("b{i}"), "argv": ["true"],
                                           "cwd": "/", "env": {}, "tty": false}),
            )
            .await;
        assert!(out.get("error").is_none(), "{out}");
    }
    assert!(killed >= 1, "no worker was ever killed");
    assert!(
        refused >= 1,
        "replacements were never backed off ({killed} kills)"
    );
}

/// Issue #26 through a real worker (the tenant's PID namespace included):
/// short-lived processes, started back to back over several connections,
/// are checked by the gateway while they exit and are reaped. Every start
/// must succeed: 800 over 8 connections, the benchmark. (This
/// keeps the whole path honest; it rarely met the race, even before the
/// fix, in a debug build: the race itself is forced, and stressed, in
/// `worker::client`'s unit tests.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn short_lived_processes_started_at_a_steady_rate_are_never_refused() {
    let gw = gateway();
    if !require_workers(&gw).await {
        return;
    }
    const CONNECTIONS: usize = 8;
    const EACH: usize = 100;
    let mut tasks = Vec::new();
    for _ in 0..CONNECTIONS {
        let (mut c, _) = gw.session_of("a").await;
        tasks.push(tokio::spawn(async move {
            for i in 0..EACH {
                let id = format!("t{i}");
                // Over the tenant's rate: told when to retry (-32001), as
                // a benchmark client is; anything else is a failure.
                loop {
                    let r = c
                        .call_raw(
                            "process/start",
                            json!({"processId": id, "argv": ["true"], "cwd": "/tmp",
                                   "env": {"PATH": "/usr/bin:/bin"}, "tty": false}),
                        )
                        .await;
                    if r.get("result").is_some() {
                        break;
                    }
                    assert_eq!(r["error"]["code"], json!(-32001), "start {i}: {r}");
                    let ms = r["error"]["data"]["retryAfterMs"].as_u64().unwrap_or(10);
                    tokio::time::sleep(std::time::Duration::from_millis(ms.max(1))).await;
                }
                assert_eq!(c.collect(&id).await.exit_code, Some(0), "{id}");
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
}
