//! OS-level isolation, proven with real processes: a fork bomb stops at its
//! tenant's pids limit and a memory hog is OOM-killed (reported) while the
//! other tenant works; `setsid` escapers die on terminate and when the
//! gateway is SIGKILLed. Each test needs the cgroup layer: where the probe
//! says it is inactive, the test prints the reason and skips.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::path::Path;

use common::{Gateway, cgroup2_mount, eventually, pid_alive, unb64};
use serde_json::json;

fn gateway() -> Gateway {
    gateway_with("")
}

fn gateway_with(isolation: &str) -> Gateway {
    Gateway::start_with(|dir| {
        format!(
            "[isolation]\n{isolation}\n\
             [[auth.keys]]\nalgorithm = \"HS256\"\nsecret_file = \"{}/hs256.key\"\n\
             [tenants.a]\nroot = \"/\"\npids_max = 40\nmemory_max_bytes = 67108864\ncpu_max_cores = 0.5\n\
             [tenants.b]\nroot = \"/\"\n",
            dir.display()
        )
    })
}

/// The cgroup layer's state from `/readyz`; `Some(reason)` to skip.
async fn skip_reason(gw: &Gateway) -> Option<String> {
    let (_, body) = gw.admin_get("/readyz").await;
    if body.contains("cgroups: active") {
        None
    } else {
        Some(format!(
            "cgroup layer inactive on this host: {}",
            body.trim()
        ))
    }
}

macro_rules! require_cgroups {
    ($gw:expr) => {
        if let Some(reason) = skip_reason(&$gw).await {
            eprintln!("SKIPPED: {reason}");
            return;
        }
    };
}

/// Whether `/sys/fs/cgroup` is the unified (v2) hierarchy, which a gateway
/// with the default `cgroup_version = "auto"` then uses: the VM lane
/// (scripts/vm-test); this host binds the controllers to v1.
fn unified() -> bool {
    Path::new("/sys/fs/cgroup/cgroup.controllers").exists()
}

/// A tenant's cgroup directory holding `controller`'s files.
fn tenant_cgroup(gw: &Gateway, controller: &str, tenant: &str) -> String {
    let instance = format!("exec-gateway/gw-{}/{tenant}", gw.child.id());
    if unified() {
        format!("/sys/fs/cgroup/{instance}")
    } else {
        format!("/sys/fs/cgroup/{controller}/{instance}")
    }
}

fn cgroup_file(gw: &Gateway, controller: &str, tenant: &str, file: &str) -> String {
    std::fs::read_to_string(format!("{}/{file}", tenant_cgroup(gw, controller, tenant)))
        .unwrap_or_default()
}

/// A tenant's CPU quota per 100 ms period, in microseconds (`None`: none),
/// from `cpu.cfs_quota_us` (v1) or `cpu.max` (v2).
fn cpu_quota(gw: &Gateway, tenant: &str) -> Option<u64> {
    let text = if unified() {
        let max = cgroup_file(gw, "cpu", tenant, "cpu.max");
        let (quota, period) = max.trim().split_once(' ').unwrap();
        assert_eq!(period, "100000");
        quota.to_owned()
    } else {
        cgroup_file(gw, "cpu", tenant, "cpu.cfs_quota_us")
    };
    text.trim().parse().ok()
}

/// The tenant's worker's own tasks: threads in the tenant's cgroup (v1),
/// or what its `worker` leaf counts (v2).
fn worker_pids(gw: &Gateway, tenant: &str) -> usize {
    let worker: usize = if unified() {
        cgroup_file(gw, "pids", &format!("{tenant}/worker"), "pids.current")
            .trim()
            .parse()
            .unwrap()
    } else {
        cgroup_file(gw, "pids", tenant, "tasks").lines().count()
    };
    worker + slirp_tasks(gw, tenant)
}

/// The tasks of the tenant's slirp4netns, which runs in a cgroup of the
/// tenant's own (its network's way out costs the tenant).
fn slirp_tasks(gw: &Gateway, tenant: &str) -> usize {
    let under = format!("/gw-{}/{tenant}/", gw.child.id());
    common::host_pids_where(|cmd| {
        cmd.split(|b| *b == 0)
            .next()
            .is_some_and(|a0| a0.ends_with(b"slirp4netns"))
    })
    .into_iter()
    .filter(|pid| {
        std::fs::read_to_string(format!("/proc/{pid}/cgroup")).is_ok_and(|c| c.contains(&under))
    })
    .map(|pid| std::fs::read_dir(format!("/proc/{pid}/task")).map_or(0, Iterator::count))
    .sum()
}

/// Start process `esc`, whose child leaves its process group and session
/// (`setsid`); returns the escaper's pid.
async fn start_escaper(a: &mut common::Client) -> i32 {
    a.start(
        "esc",
        &["sh", "-c", "setsid sh -c 'echo $$; exec sleep 300' & wait"],
    )
    .await;
    let escaper = pid_line(a, "esc").await;
    assert!(pid_alive(escaper));
    escaper
}

async fn pid_line(c: &mut common::Client, id: &str) -> i32 {
    c.first_line(id).await.trim().parse().unwrap()
}

#[tokio::test]
async fn a_fork_bomb_stops_at_its_tenants_pids_limit() {
    let gw = gateway();
    require_cgroups!(gw);
    let (mut a, _) = gw.session_of("a").await;
    let (mut b, _) = gw.session_of("b").await;
    // Forks as fast as bash can, 500 long-lived children, far past the limit.
    a.start(
        "bomb",
        &[
            "bash",
            "-c",
            "for i in $(seq 500); do sleep 60 & done; wait",
        ],
    )
    .await;
    // Wait for the bomb to hit the limit: bash reports the refused forks.
    a.stderr_until("Resource temporarily unavailable").await;
    // The configured limits are the tenant's cgroup's.
    assert_eq!(cgroup_file(&gw, "pids", "a", "pids.max").trim(), "40");
    assert_eq!(cpu_quota(&gw, "a"), Some(50000));
    assert_eq!(cpu_quota(&gw, "b"), None);
    let current: u64 = cgroup_file(&gw, "pids", "a", "pids.current")
        .trim()
        .parse()
        .unwrap();
    assert!(current <= 40, "tenant a has {current} pids, limit 40");
    // Tenant b starts and finishes processes meanwhile.
    for i in 0..5 {
        let id = format!("ok{i}");
        b.start(&id, &["true"]).await;
        assert_eq!(b.collect(&id).await.exit_code, Some(0));
    }
    // Terminate reaches every forked copy through the cgroup.
    a.call("process/terminate", json!({"processId":"bomb"}))
        .await;
    // What remains is the tenant's worker itself (its threads sit in the
    // tenant's own cgroup; every spawned process is in a per-process one).
    eventually("the bomb's cgroup empties", || {
        let own = worker_pids(&gw, "a");
        cgroup_file(&gw, "pids", "a", "pids.current").trim() == own.to_string()
    })
    .await;
}

#[tokio::test]
async fn a_memory_hog_is_oom_killed_and_reported_while_b_completes() {
    let gw = gateway();
    require_cgroups!(gw);
    let (mut a, _) = gw.session_of("a").await;
    let (mut b, _) = gw.session_of("b").await;
    a.start(
        "hog",
        &["python3", "-c", "x = bytearray(512 << 20); print(len(x))"],
    )
    .await;
    b.start("fine", &["sh", "-c", "echo done"]).await;
    let hog = a.collect("hog").await;
    assert_eq!(hog.exit_code, Some(-1), "killed by a signal");
    assert!(hog.stdout.is_empty(), "the allocation never completed");
    let r = a.call("process/read", json!({"processId":"hog"})).await;
    assert_eq!(
        r["failure"],
        json!("killed by the out-of-memory killer (tenant memory limit)")
    );
    let fine = b.collect("fine").await;
    assert_eq!(
        (fine.stdout.as_slice(), fine.exit_code),
        (&b"done\n"[..], Some(0))
    );
}

#[tokio::test]
async fn setsid_escapers_die_on_terminate() {
    escapers_die_on_terminate("").await;
}

/// With workers off, each child joins its cgroups itself before exec.
#[tokio::test]
async fn escapers_of_children_the_gateway_spawns_itself_die_too() {
    escapers_die_on_terminate("workers = \"off\"").await;
}

async fn escapers_die_on_terminate(isolation: &str) {
    let gw = gateway_with(isolation);
    require_cgroups!(gw);
    let (mut a, _) = gw.session_of("a").await;
    // The grandchild leaves the process group (and session): killpg misses it.
    let escaper = start_escaper(&mut a).await;
    a.call("process/terminate", json!({"processId":"esc"}))
        .await;
    eventually("the setsid escaper dies", || !pid_alive(escaper)).await;
}

#[tokio::test]
async fn sigkill_of_the_gateway_leaves_no_escaper_behind() {
    let mut gw = gateway();
    require_cgroups!(gw);
    let (mut a, _) = gw.session_of("a").await;
    let escaper = start_escaper(&mut a).await;
    gw.signal(9);
    gw.wait_exit();
    eventually("the reaper kills the escaper through the cgroup", || {
        !pid_alive(escaper)
    })
    .await;
}

/// A tenant's own process cannot raise its tenant's limits or leave the
/// tenant's cgroup; one that moves itself out of its own process cgroup
/// (to the tenant's `procs`) dies with the next kill. No uid: the tenant
/// runs as uid 0 without capabilities, the case that could write them.
/// (A tenant rooted at `/` is unconfined by definition: this one has a root.)
#[tokio::test]
async fn a_tenant_cannot_write_its_limits_or_leave_its_cgroup() {
    let root = tempfile::tempdir().unwrap();
    let gw = Gateway::start_with(|dir| {
        format!(
            "[[auth.keys]]\nalgorithm = \"HS256\"\nsecret_file = \"{}/hs256.key\"\n\
             [tenants.a]\nroot = \"{}\"\npids_max = 40\n",
            dir.display(),
            root.path().display()
        )
    });
    require_cgroups!(gw);
    let (mut a, _) = gw.session_of("a").await;
    let t = tenant_cgroup(&gw, "pids", "a");
    // Out of its own process cgroup: v1's `procs` holds the tenant's
    // per-process cgroups, v2's `worker` leaf its worker.
    let beside = if unified() { "worker" } else { "procs" };
    let secs = common::unique_seconds();
    let script = format!(
        "echo max > {t}/pids.max && echo RAISED; \
         echo $$ > {t}/cgroup.procs && echo LEFT; \
         setsid sh -c 'echo $$ > {t}/{beside}/cgroup.procs && echo stray; exec sleep {secs}' & \
         sleep 0.5; echo END; exec sleep 300"
    );
    let r = a
        .call(
            "process/start",
            json!({"processId": "p", "argv": ["sh", "-c", &script], "cwd": root.path(),
                   "env": {"PATH": "/usr/bin:/bin"}, "tty": false}),
        )
        .await;
    assert!(r.get("error").is_none(), "{r}");
    let mut text = String::new();
    while !text.contains("END") {
        let v = a
            .wait_for("output", |v| {
                v["method"] == "process/output" && v["params"]["processId"] == "p"
            })
            .await;
        text.push_str(&String::from_utf8_lossy(&unb64(
            v["params"]["chunk"].as_str().unwrap(),
        )));
    }
    assert!(!text.contains("RAISED"), "{text}");
    assert!(!text.contains("LEFT"), "{text}");
    assert_eq!(cgroup_file(&gw, "pids", "a", "pids.max").trim(), "40");
    // Its pid on the host (the tenant's numbers are its PID namespace's).
    if text.lines().any(|l| l == "stray") {
        let stray = common::host_pid_of(&["sleep", &secs]).await;
        assert!(pid_alive(stray));
        a.call("process/terminate", json!({"processId": "p"})).await;
        eventually("the stray to die", || !pid_alive(stray)).await;
    }
}

fn v2_gateway() -> Option<Gateway> {
    if cgroup2_mount().is_none() {
        eprintln!("SKIPPED: no cgroup2 filesystem is mounted");
        return None;
    }
    Some(gateway_with("cgroup_version = \"v2\""))
}

/// A v2 process cgroup's path as `/proc/PID/cgroup` names it.
async fn own_cgroup(a: &mut common::Client, id: &str) -> String {
    a.start(
        id,
        &["sh", "-c", "grep '^0::' /proc/self/cgroup; exec sleep 300"],
    )
    .await;
    a.first_line(id)
        .await
        .trim()
        .trim_start_matches("0::")
        .to_owned()
}

/// cgroup v2 (`cgroup_version = "v2"`; here the hybrid host's unified
/// hierarchy, which has no controllers): every process gets its own
/// cgroup under its tenant's; terminate kills its whole cgroup at once
/// (`cgroup.kill`), `setsid` escapers included, and `cgroup.events` then
/// says it is empty; the other tenant's process lives on.
#[tokio::test]
async fn cgroup_v2_membership_kill_and_events() {
    let Some(gw) = v2_gateway() else { return };
    require_cgroups!(gw);
    let mount = cgroup2_mount().unwrap();
    let (mut a, _) = gw.session_of("a").await;
    let (mut b, _) = gw.session_of("b").await;
    let cg = own_cgroup(&mut a, "own").await;
    let instance = format!("/exec-gateway/gw-{}/", gw.child.id());
    assert!(
        cg.ends_with(&format!("{instance}a/p1")) || cg.contains(&format!("{instance}a/p")),
        "{cg}"
    );
    let bcg = own_cgroup(&mut b, "other").await;
    assert!(bcg.contains(&format!("{instance}b/p")), "{bcg}");
    let events = format!("{mount}{cg}/cgroup.events");
    assert!(
        std::fs::read_to_string(&events)
            .unwrap()
            .contains("populated 1")
    );
    let escaper = start_escaper(&mut a).await;
    a.call("process/terminate", json!({"processId": "esc"}))
        .await;
    eventually("the setsid escaper dies", || !pid_alive(escaper)).await;
    a.call("process/terminate", json!({"processId": "own"}))
        .await;
    // Killed, it is removed once empty (never pooled again): either
    // `cgroup.events` says it is empty, or it is gone.
    eventually(
        "the emptied cgroup says so or is gone",
        || match std::fs::read_to_string(&events) {
            Ok(s) => s.contains("populated 0"),
            Err(e) => e.kind() == std::io::ErrorKind::NotFound,
        },
    )
    .await;
    // b's process is untouched.
    let bevents = format!("{mount}{bcg}/cgroup.events");
    assert!(
        std::fs::read_to_string(&bevents)
            .unwrap()
            .contains("populated 1")
    );
}

/// v2: a process terminated (its cgroup killed with `cgroup.kill`) does
/// not spoil the cgroups that later processes are created in: each of them
/// runs and exits 0 (a kernel kills at birth a child created in a cgroup
/// that was killed before, so a killed cgroup is never pooled again).
#[tokio::test]
async fn cgroup_v2_processes_after_a_terminate_run() {
    let Some(gw) = v2_gateway() else { return };
    require_cgroups!(gw);
    let mount = cgroup2_mount().unwrap();
    let (mut a, _) = gw.session_of("a").await;
    for round in 0..3 {
        let id = format!("victim{round}");
        let cg = own_cgroup(&mut a, &id).await;
        a.call("process/terminate", json!({"processId": id})).await;
        let _ = a.collect(&id).await;
        let dir = format!("{mount}{cg}");
        eventually("the killed cgroup is removed, not pooled", || {
            !Path::new(&dir).exists()
        })
        .await;
        for n in 0..3 {
            let id = format!("after{round}-{n}");
            a.start(&id, &["sh", "-c", "echo alive"]).await;
            let out = a.collect(&id).await;
            assert_eq!(out.exit_code, Some(0), "round {round}, spawn {n}: {out:?}");
            assert_eq!(
                String::from_utf8_lossy(&out.stdout).trim(),
                "alive",
                "round {round}, spawn {n}"
            );
        }
    }
}

/// v2: a gateway killed with SIGKILL leaves nothing: its reaper kills the
/// instance's whole cgroup subtree and removes it.
#[tokio::test]
async fn cgroup_v2_sigkill_of_the_gateway_leaves_nothing() {
    let Some(mut gw) = v2_gateway() else { return };
    require_cgroups!(gw);
    let mount = cgroup2_mount().unwrap();
    let (mut a, _) = gw.session_of("a").await;
    let escaper = start_escaper(&mut a).await;
    let instance = format!("{mount}/exec-gateway/gw-{}", gw.child.id());
    assert!(Path::new(&instance).exists());
    gw.signal(9);
    gw.wait_exit();
    eventually("the reaper kills the escaper", || !pid_alive(escaper)).await;
    eventually("the instance's cgroups are removed", || {
        !Path::new(&instance).exists()
    })
    .await;
}

/// v2 limits: `pids.max`, `memory.max`, `cpu.weight`/`cpu.max` at the
/// tenant, `memory.oom.group` per process. Needs the controllers in the
/// unified hierarchy; a hybrid host binds them to v1.
#[tokio::test]
async fn cgroup_v2_limits() {
    let Some(gw) = v2_gateway() else { return };
    require_cgroups!(gw);
    let mount = cgroup2_mount().unwrap();
    let controllers =
        std::fs::read_to_string(format!("{mount}/cgroup.controllers")).unwrap_or_default();
    for c in ["pids", "memory", "cpu"] {
        if !controllers.split_whitespace().any(|x| x == c) {
            eprintln!(
                "SKIPPED: the cgroup v2 hierarchy at {mount} has no `{c}` controller (this host binds it to v1): limits cannot be tested here"
            );
            return;
        }
    }
    // The tenant's cgroup exists once it is active (its first session).
    let (mut a, _) = gw.session_of("a").await;
    let t = format!("{mount}/exec-gateway/gw-{}/a", gw.child.id());
    let read = |f: &str| std::fs::read_to_string(format!("{t}/{f}")).unwrap_or_default();
    assert_eq!(read("pids.max").trim(), "40");
    assert_eq!(read("memory.max").trim(), "67108864");
    assert_eq!(read("cpu.max").trim(), "50000 100000");
    let cg = own_cgroup(&mut a, "own").await;
    assert_eq!(
        std::fs::read_to_string(format!("{mount}{cg}/memory.oom.group"))
            .unwrap()
            .trim(),
        "1"
    );
}

/// A closed process's cgroup goes back to the tenant's pool; while pooled it
/// is root's, so no process of the tenant can move itself into it (where no
/// terminate or session close of its own would reach it).
#[tokio::test]
async fn a_pooled_cgroup_cannot_be_joined_by_the_tenants_processes() {
    let gw = gateway();
    require_cgroups!(gw);
    let (mut a, _) = gw.session_of("a").await;
    // Two at once: two cgroups, one of them idle in the pool while the
    // next process runs in the other.
    a.start("one", &["sleep", "0.3"]).await;
    a.start("two", &["sleep", "0.3"]).await;
    a.collect("one").await;
    a.collect("two").await;
    let script = r#"
        P=$(sed -n 's/^[0-9]*:pids:\(.*\)$/\1/p' /proc/self/cgroup); B=/sys/fs/cgroup/pids
        if [ -z "$P" ]; then P=$(sed -n 's/^0::\(.*\)$/\1/p' /proc/self/cgroup); B=/sys/fs/cgroup; fi
        sleep 1
        for d in $B$(dirname $P)/p*; do
          [ -f $d/cgroup.procs ] && [ "$d" != "$B$P" ] || continue
          [ -z "$(cat $d/cgroup.procs)" ] || continue
          echo try
          (echo $$ > $d/cgroup.procs) 2>/dev/null && echo moved
        done
        true"#;
    a.start("park", &["sh", "-c", script]).await;
    let out = String::from_utf8(a.collect("park").await.stdout).unwrap();
    assert!(out.contains("try"), "no pooled cgroup to try: {out}");
    assert!(!out.contains("moved"), "joined a pooled cgroup: {out}");
}

/// A pipe-mode process has its own session and no controlling terminal:
/// whatever terminal the gateway was started from is not its.
#[tokio::test]
async fn a_pipe_process_leads_its_own_session() {
    let gw = gateway();
    let (mut a, _) = gw.session_of("a").await;
    a.start(
        "s",
        &[
            "sh",
            "-c",
            "set -- $(cut -d' ' -f6,7 /proc/$$/stat); echo $1 $2 $$",
        ],
    )
    .await;
    let line = a.first_line("s").await;
    let f: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(f.len(), 3, "{line}");
    assert_eq!(f[0], f[2], "session id is its pid: {line}");
    assert_eq!(f[1], "0", "no controlling terminal: {line}");
}

/// A tenant's process may set its own limits but not another process's
/// (`prlimit` with a pid): where a tenant shares the gateway's uid (a
/// gateway not run as root) it could otherwise shrink the gateway's
/// descriptor limit and stop every tenant's accepts. Shown on a child of
/// its own, which its uid would otherwise allow.
#[tokio::test]
async fn a_tenant_cannot_set_another_processs_limits() {
    let gw = gateway();
    let (_, ready) = gw.admin_get("/readyz").await;
    if !ready.contains("seccomp: active") {
        eprintln!("SKIPPED: the seccomp layer is inactive here: {ready}");
        return;
    }
    let (mut a, _) = gw.session_of("a").await;
    let script = "sleep 30 & \
        python3 -c 'import resource, sys; resource.prlimit(int(sys.argv[1]), resource.RLIMIT_NOFILE, (16, 16))' $! 2>&1; echo other=$?; \
        python3 -c 'import resource; resource.prlimit(0, resource.RLIMIT_NOFILE, (64, 64))'; echo own=$?; \
        python3 -c 'import resource, sys; resource.prlimit(int(sys.argv[1]), resource.RLIMIT_NOFILE)' $!; echo read=$?; kill $!";
    a.start("p", &["sh", "-c", script]).await;
    let out = String::from_utf8(a.collect("p").await.stdout).unwrap();
    assert!(out.contains("other=1"), "{out}");
    assert!(out.contains("Operation not permitted"), "{out}");
    assert!(out.contains("own=0"), "{out}");
    // Reading another's limits (psutil does) stays allowed.
    assert!(out.contains("read=0"), "{out}");
}
