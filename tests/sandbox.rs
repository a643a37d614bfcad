//! The per-process sandbox layers, proven with real processes in two
//! tenants with their own roots: Landlock keeps a tenant's processes out of
//! the other's root and away from other processes' signals; seccomp refuses
//! namespaces while threads still work; a PTY works under the sandbox; the
//! tenant uid stops cross-tenant reads, signals and `/proc/<pid>/environ`,
//! and file operations run with the tenant's permissions. A test whose layer
//! the probe reports inactive prints the reason and skips.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};

use common::{Client, Gateway, pid_alive, unb64};
use serde_json::{Value, json};

struct Roots {
    _dir: tempfile::TempDir,
    a: PathBuf,
    b: PathBuf,
}

fn roots() -> Roots {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (dir.path().join("a"), dir.path().join("b"));
    for r in [&a, &b] {
        std::fs::create_dir_all(r.join("tmp")).unwrap();
    }
    std::fs::write(a.join("own.txt"), "mine\n").unwrap();
    std::fs::write(b.join("secret.txt"), "b-secret\n").unwrap();
    std::os::unix::fs::symlink(b.join("secret.txt"), a.join("link")).unwrap();
    // The parent must be traversable by the tenants' uids.
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    Roots { _dir: dir, a, b }
}

fn tenant(name: &str, root: &Path, extra: &str) -> String {
    format!(
        "[tenants.{name}]\nroot = \"{r}\"\n{extra}\n\
         [tenants.{name}.base_env]\nPATH = \"/usr/bin:/bin\"\nHOME = \"{r}\"\nTMPDIR = \"{r}/tmp\"\n",
        r = root.display()
    )
}

fn gateway(r: &Roots, isolation: &str, a_extra: &str, b_extra: &str) -> Gateway {
    let (a, b) = (tenant("a", &r.a, a_extra), tenant("b", &r.b, b_extra));
    Gateway::start_with(|dir| {
        format!(
            "[isolation]\n{isolation}\n[[auth.keys]]\nalgorithm = \"HS256\"\nsecret_file = \"{}/hs256.key\"\n{a}{b}",
            dir.display()
        )
    })
}

/// `Some(reason)` when `/readyz` does not list `layer` as active.
async fn skip_reason(gw: &Gateway, layer: &str) -> Option<String> {
    // A gateway configured with an admin token (its file holds the secret
    // copied beside the test's key) is asked with it.
    let token = std::fs::read_to_string(gw.dir.path().join("admin.token")).ok();
    let auth = token.map(|t| format!("Bearer {}", t.trim()));
    let (_, body) = common::http_get_at(&gw.admin, "/readyz", auth.as_deref()).await;
    (!body.contains(&format!("{layer}: active")))
        .then(|| format!("{layer} layer inactive on this host: {}", body.trim()))
}

macro_rules! require {
    ($gw:expr, $layer:expr) => {
        if let Some(reason) = skip_reason(&$gw, $layer).await {
            eprintln!("SKIPPED: {reason}");
            return;
        }
    };
}

/// Run `sh -c script` in `root` and collect it.
async fn sh(c: &mut Client, id: &str, root: &Path, script: &str) -> (String, String, Option<i64>) {
    start(c, id, root, &["sh", "-c", script], json!({})).await;
    let out = c.collect(id).await;
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
        out.exit_code,
    )
}

async fn start(c: &mut Client, id: &str, root: &Path, argv: &[&str], env: Value) -> Value {
    c.call(
        "process/start",
        json!({"processId": id, "argv": argv, "cwd": root, "env": env, "tty": false}),
    )
    .await
}

/// Start a long sleeper; returns its pid on the host (a confined tenant's
/// own numbers are its PID namespace's), found by its unique argument.
async fn sleeper(c: &mut Client, id: &str, root: &Path, env: Value) -> i32 {
    let secs = common::unique_seconds();
    let script = format!("echo up; exec sleep {secs}");
    start(c, id, root, &["sh", "-c", &script], env).await;
    c.first_line(id).await;
    common::host_pid_of(&["sleep", &secs]).await
}

#[tokio::test]
async fn landlock_keeps_a_tenants_processes_inside_its_root() {
    landlock_confines("").await;
}

/// With workers off the gateway spawns, and each child confines itself
/// between fork and exec: the same walls.
#[tokio::test]
async fn landlock_confines_children_the_gateway_spawns_itself() {
    landlock_confines("workers = \"off\"").await;
}

async fn landlock_confines(isolation: &str) {
    let r = roots();
    let gw = gateway(&r, isolation, "", "");
    require!(gw, "landlock");
    let (mut a, _) = gw.session_of("a").await;
    let (mut b, _) = gw.session_of("b").await;
    let script = format!(
        "cat {a}/own.txt; cat {b}/secret.txt; cat {a}/link; ls {b}; echo x > {b}/planted; \
         echo y > {a}/tmp/scratch && echo wrote-tmp; echo done",
        a = r.a.display(),
        b = r.b.display()
    );
    let (out, err, _) = sh(&mut a, "read", &r.a, &script).await;
    assert!(
        out.contains("mine") && out.contains("wrote-tmp") && out.contains("done"),
        "{out}"
    );
    assert!(!out.contains("b-secret"), "read b's file: {out}");
    // Landlock refuses b's root, or (with namespaces) it is not there at all.
    assert!(
        err.contains("Permission denied") || err.contains("No such file"),
        "{err}"
    );
    assert!(!r.b.join("planted").exists(), "wrote into b's root");

    // Signals stay inside the process's own domain: not b's, not the gateway.
    let bpid = sleeper(&mut b, "victim", &r.b, json!({})).await;
    let script = format!(
        "kill -TERM {bpid}; echo b=$?; kill -0 {}; echo gw=$?",
        gw.child.id()
    );
    let (out, _, _) = sh(&mut a, "signal", &r.a, &script).await;
    assert!(out.contains("b=1") && out.contains("gw=1"), "{out}");
    assert!(pid_alive(bpid), "b's process was signalled");
}

#[tokio::test]
async fn a_pty_works_under_the_sandbox() {
    pty_under_the_sandbox("").await;
}

#[tokio::test]
async fn a_pty_the_gateway_spawns_itself_is_confined_too() {
    pty_under_the_sandbox("workers = \"off\"").await;
}

async fn pty_under_the_sandbox(isolation: &str) {
    let r = roots();
    let gw = gateway(&r, isolation, "", "");
    require!(gw, "landlock");
    let (mut a, _) = gw.session_of("a").await;
    let script = format!(
        "stty size; tty; cat /etc/hostname >/dev/null && echo ok; cat {}/secret.txt 2>/dev/null || echo denied; echo fds=$(ls /proc/$$/fd | wc -l)",
        r.b.display()
    );
    a.call(
        "process/start",
        json!({"processId": "tty", "argv": ["sh", "-c", script],
               "cwd": r.a, "env": {"PATH": "/usr/bin:/bin"}, "tty": true}),
    )
    .await;
    let out = a.collect("tty").await;
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("24 80"), "{text}");
    assert!(text.contains("/dev/pts/"), "{text}");
    assert!(text.contains("ok"), "{text}");
    // Confined like a pipe process.
    assert!(
        text.contains("denied") && !text.contains("b-secret"),
        "{text}"
    );
    assert_eq!(out.exit_code, Some(0));
}

#[tokio::test]
async fn seccomp_refuses_namespaces_and_keeps_threads_working() {
    let r = roots();
    let gw = gateway(&r, "", "", "");
    require!(gw, "seccomp");
    let (mut a, _) = gw.session_of("a").await;
    let (out, _, _) = sh(
        &mut a,
        "ns",
        &r.a,
        "unshare -U true; echo unshare=$?; \
         python3 -c 'import threading; t = threading.Thread(target=print, args=(\"thread-ok\",)); t.start(); t.join()'; \
         python3 -c 'import ctypes; l = ctypes.CDLL(None, use_errno=True); l.syscall(435, None, 0); print(\"clone3\", ctypes.get_errno())'; \
         grep NoNewPrivs /proc/self/status",
    )
    .await;
    assert!(out.contains("unshare=1"), "{out}");
    // clone3's flags are out of seccomp's sight: ENOSYS (libc falls back
    // to clone), also where the worker itself may call it (cgroup v2).
    assert!(out.contains(&format!("clone3 {}", libc::ENOSYS)), "{out}");
    assert!(out.contains("thread-ok"), "{out}");
    assert!(out.contains("NoNewPrivs:\t1"), "{out}");
}

#[tokio::test]
async fn each_tenant_runs_as_its_own_uid() {
    let r = roots();
    use std::os::unix::fs::chown;
    for (root, uid) in [(&r.a, 60001), (&r.b, 60002)] {
        for p in [root.clone(), root.join("tmp")] {
            chown(&p, Some(uid), Some(uid)).unwrap();
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o700)).unwrap();
        }
    }
    chown(r.a.join("own.txt"), Some(60001), Some(60001)).unwrap();
    // A root-owned file inside a's root that only root may read.
    std::fs::write(r.a.join("root-only.txt"), "root\n").unwrap();
    std::fs::set_permissions(
        r.a.join("root-only.txt"),
        std::fs::Permissions::from_mode(0o600),
    )
    .unwrap();
    // Landlock and seccomp off: what is proven here is the uid alone.
    let gw = gateway(
        &r,
        "landlock = \"off\"\nseccomp = \"off\"\nuid = \"required\"",
        "uid = 60001",
        "uid = 60002",
    );
    require!(gw, "uid");
    let (mut a, _) = gw.session_of("a").await;
    let (mut b, _) = gw.session_of("b").await;

    let bpid = sleeper(
        &mut b,
        "victim",
        &r.b,
        json!({"PATH": "/usr/bin:/bin", "B_TOKEN": "b-secret"}),
    )
    .await;
    let script = format!(
        "id -u; id -G; cat {b}/secret.txt; echo read=$?; kill -TERM {bpid}; echo kill=$?; \
         cat /proc/{bpid}/environ; echo environ=$?",
        b = r.b.display()
    );
    let (out, _, _) = sh(&mut a, "probe", &r.a, &script).await;
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(&lines[..2], &["60001", "60001"], "uid, then groups: {out}");
    assert!(
        out.contains("read=1") && out.contains("kill=1") && out.contains("environ=1"),
        "{out}"
    );
    assert!(!out.contains("b-secret"), "{out}");
    assert!(pid_alive(bpid));

    // File operations run with the tenant's permissions and ownership.
    let made = r.a.join("made.txt");
    a.call(
        "fs/writeFile",
        json!({"path": made, "dataBase64": common::b64(b"x")}),
    )
    .await;
    assert_eq!(std::fs::metadata(&made).unwrap().uid(), 60001);
    let (_, msg) = a
        .call_err("fs/readFile", json!({"path": r.a.join("root-only.txt")}))
        .await;
    assert!(msg.to_lowercase().contains("permission denied"), "{msg}");
    let read = a
        .call("fs/readFile", json!({"path": r.a.join("own.txt")}))
        .await;
    assert_eq!(unb64(read["dataBase64"].as_str().unwrap()), b"mine\n");
}

/// Removes a directory when dropped.
struct RemoveOnDrop(PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[tokio::test]
async fn the_gateways_key_files_stay_hidden_under_readable_system_dirs() {
    let r = roots();
    // A key where operators put them, under /etc, which tenants may read.
    let keydir = PathBuf::from(format!("/etc/exec-gateway-test-{}", std::process::id()));
    if std::fs::create_dir_all(&keydir).is_err() {
        eprintln!("SKIPPED: cannot create {} (not root?)", keydir.display());
        return;
    }
    let _cleanup = RemoveOnDrop(keydir.clone());
    let key = keydir.join("hs256.key");
    // The fleet key and the admin token are covered like the auth key (on
    // d384597 a tenant read both; from the fleet key it derived a
    // rendezvous ticket and took another tenant's next process/start).
    let fleet_key = keydir.join("fleet.key");
    let admin_token = keydir.join("admin.token");
    std::fs::write(&fleet_key, "fleet-secret-".repeat(4)).unwrap();
    std::fs::write(&admin_token, "admin-secret-".repeat(4)).unwrap();
    let token_copy = admin_token.clone();
    let (a, b) = (tenant("a", &r.a, ""), tenant("b", &r.b, ""));
    let key_for_config = key.clone();
    let peer_port = common::free_port();
    let gw = Gateway::start_with(|dir| {
        std::fs::copy(dir.join("hs256.key"), &key_for_config).unwrap();
        // For the layer check (skip_reason), which reads /readyz with it.
        std::fs::copy(&token_copy, dir.join("admin.token")).unwrap();
        format!(
            "[server]\nadmin_token_file = \"{}\"\n\
             [fleet]\nreplica = \"gw-0\"\nlisten = \"127.0.0.1:{peer_port}\"\nkey_file = \"{}\"\n\
             [fleet.peers]\ngw-0 = \"127.0.0.1:{peer_port}\"\n\
             [[auth.keys]]\nalgorithm = \"HS256\"\nsecret_file = \"{}\"\n{a}{b}",
            admin_token.display(),
            fleet_key.display(),
            key_for_config.display()
        )
    });
    require!(gw, "landlock");
    let (mut c, _) = gw.session_of("a").await;
    let script = format!(
        "cat {k}; echo key=$?; ls {d}; echo dir=$?; cat /etc/hostname >/dev/null; echo etc=$?",
        k = key.display(),
        d = keydir.display()
    );
    let (out, _, _) = sh(&mut c, "peek", &r.a, &script).await;
    // Refused by Landlock, or (with namespaces) /dev/null bound over it.
    assert!(
        !out.contains(&String::from_utf8_lossy(&gw.secret).into_owned()),
        "the key was read: {out}"
    );
    assert!(out.contains("key=1") || out.starts_with("key=0"), "{out}");
    assert!(out.contains("dir=2"), "{out}");
    assert!(
        out.contains("etc=0"),
        "the rest of /etc stays readable: {out}"
    );
    let secret = std::fs::read_to_string(&key).unwrap();
    assert!(!out.contains(secret.trim()), "the key leaked: {out}");
    let script = format!(
        "cat {f}; echo fleet=$?; cat {t}; echo token=$?",
        f = fleet_key.display(),
        t = admin_token.display()
    );
    let (out, _, _) = sh(&mut c, "peek2", &r.a, &script).await;
    assert!(
        !out.contains("fleet-secret"),
        "the fleet key was read: {out}"
    );
    assert!(
        !out.contains("admin-secret"),
        "the admin token was read: {out}"
    );
    // Nor can file operations: the key is outside the tenant's root.
    let (_, msg) = c.call_err("fs/readFile", json!({"path": key})).await;
    assert!(msg.contains("outside the tenant root"), "{msg}");
}

/// No tenant process holds a capability, with or without a uid, in a
/// worker or spawned by the gateway itself, with every layer off too: all
/// five sets are empty, and a setuid-root binary gains nothing.
#[tokio::test]
async fn tenant_processes_hold_no_capabilities() {
    let r = roots();
    for isolation in [
        "",
        "workers = \"off\"",
        "workers = \"off\"\ncgroups = \"off\"\nlandlock = \"off\"\nseccomp = \"off\"\nnamespaces = \"off\"\nnetwork = \"off\"",
    ] {
        let gw = gateway(&r, isolation, "", "");
        let (mut c, _) = gw.session_of("a").await;
        let (out, err, code) = sh(
            &mut c,
            "caps",
            &r.a,
            "grep -E '^Cap(Inh|Prm|Eff|Bnd|Amb)' /proc/self/status; id -u",
        )
        .await;
        assert_eq!(code, Some(0), "{isolation}: {err}");
        let caps: Vec<&str> = out.lines().filter(|l| l.starts_with("Cap")).collect();
        assert_eq!(caps.len(), 5, "{isolation}: {out}");
        for line in caps {
            assert!(
                line.ends_with("0000000000000000"),
                "{isolation}: a capability is held: {line}"
            );
        }
        // Never uid 0 (a tenant without a configured uid gets one).
        let uid: u32 = out.lines().last().unwrap().parse().unwrap();
        assert_ne!(uid, 0, "{isolation}: {out}");
        // Root-only operations fail.
        let (out, _, _) = sh(
            &mut c,
            "root-ops",
            &r.a,
            "hostname gw-test 2>/dev/null && echo CHANGED-HOSTNAME; \
             renice -n -5 $$ >/dev/null 2>&1 && echo RAISED-PRIORITY; echo END",
        )
        .await;
        assert!(out.ends_with("END\n"), "{isolation}: {out}");
        assert!(!out.contains("CHANGED"), "{isolation}: {out}");
        assert!(!out.contains("RAISED"), "{isolation}: {out}");
    }
}

/// Two tenants rooted under /tmp (the case that used to leak): each has a
/// private /tmp, sees its own root at the same path and not the other's,
/// and the gateway's key file (in another directory under /tmp) does not
/// exist for it. Workers on and off.
#[tokio::test]
async fn namespaces_give_each_tenant_its_own_tmp() {
    for isolation in ["", "workers = \"off\""] {
        let r = roots();
        let gw = gateway(&r, isolation, "", "");
        require!(gw, "namespaces");
        let key = gw.dir.path().join("hs256.key");
        assert!(key.starts_with("/tmp"), "the test needs the key under /tmp");
        let (mut a, _) = gw.session_of("a").await;
        let (mut b, _) = gw.session_of("b").await;
        let marker = format!("/tmp/ns-marker-{}", std::process::id());
        let (out, err, _) = sh(
            &mut a,
            "a",
            &r.a,
            &format!(
                "echo from-a > {marker} && echo wrote; cat {a}/own.txt; ls {parent}; \
                 cat {b}/secret.txt; cat {key}; echo END",
                a = r.a.display(),
                b = r.b.display(),
                parent = r.a.parent().unwrap().display(),
                key = key.display()
            ),
        )
        .await;
        assert!(
            out.contains("wrote") && out.contains("mine"),
            "{isolation}: {out} {err}"
        );
        assert!(out.contains("END"), "{isolation}: {out}");
        // a's view of the roots' parent holds its own root only.
        assert!(
            !out.lines().any(|l| l == "b"),
            "{isolation}: b's root listed: {out}"
        );
        assert!(!out.contains("b-secret"), "{isolation}: {out}");
        assert!(
            !out.contains(&String::from_utf8_lossy(&gw.secret).into_owned()),
            "{isolation}: the key was read"
        );
        // Neither b nor the host sees a's /tmp file.
        assert!(
            !Path::new(&marker).exists(),
            "{isolation}: a's /tmp is the host's"
        );
        let (out, _, _) = sh(&mut b, "b", &r.b, &format!("cat {marker}; echo END")).await;
        assert!(
            !out.contains("from-a"),
            "{isolation}: b read a's /tmp: {out}"
        );
        // a's own later process sees its file (the private /tmp persists).
        let (out, _, _) = sh(&mut a, "a2", &r.a, &format!("cat {marker}")).await;
        assert_eq!(out, "from-a\n", "{isolation}");
    }
}

/// `network = "none"`: loopback only; the gateway's own port is not
/// reachable. The other tenant, with the network layer off, keeps the
/// host network.
#[tokio::test]
async fn network_none_leaves_only_loopback() {
    let r = roots();
    let gw = gateway(&r, "network = \"off\"", "network = \"none\"", "");
    require!(gw, "namespaces");
    let port = gw.addr.rsplit(':').next().unwrap().to_owned();
    let script = format!(
        "tail -n +3 /proc/net/dev | cut -d: -f1 | xargs echo; \
         if (exec 3<>/dev/tcp/127.0.0.1/{port}) 2>/dev/null; then echo reached; else echo unreachable; fi"
    );
    let (mut a, _) = gw.session_of("a").await;
    let (out, _, _) = sh(&mut a, "net", &r.a, &format!("bash -c '{script}'")).await;
    assert_eq!(out.lines().next(), Some("lo"), "{out}");
    assert!(out.contains("unreachable"), "{out}");
    let (mut b, _) = gw.session_of("b").await;
    let (out, _, _) = sh(&mut b, "net", &r.b, &format!("bash -c '{script}'")).await;
    assert!(
        out.contains("reached") && !out.contains("unreachable"),
        "{out}"
    );
}

/// What the host keeps from other users under /etc (no read bit for
/// others) is kept from tenants too, even one running as uid 0 without
/// capabilities; world-readable files stay readable.
#[tokio::test]
async fn files_others_may_not_read_stay_hidden_under_etc() {
    use std::os::unix::fs::PermissionsExt as _;
    let secret = PathBuf::from(format!("/etc/exec-gateway-test-{}.key", std::process::id()));
    if std::fs::write(&secret, "host-only-secret\n").is_err() {
        eprintln!("SKIPPED: cannot write under /etc (needs root)");
        return;
    }
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
    let r = roots();
    let gw = gateway(&r, "", "", "");
    let ready = skip_reason(&gw, "landlock").await;
    if let Some(reason) = ready {
        let _ = std::fs::remove_file(&secret);
        eprintln!("SKIPPED: {reason}");
        return;
    }
    let (mut a, _) = gw.session_of("a").await;
    let (out, err, _) = sh(
        &mut a,
        "etc",
        &r.a,
        &format!(
            "id -u; cat {}; cat /etc/shadow >/dev/null && echo SHADOW-READ; head -n1 /etc/passwd",
            secret.display()
        ),
    )
    .await;
    let _ = std::fs::remove_file(&secret);
    assert!(!out.contains("host-only-secret"), "{out}");
    assert!(!out.contains("SHADOW-READ"), "/etc/shadow was read: {out}");
    assert!(err.contains("Permission denied"), "{err}");
    assert!(
        out.lines().any(|l| l.starts_with("root:x:0:0")),
        "{out} {err}"
    );
}

/// A key mounted the way Kubernetes mounts a Secret (`hs.key ->
/// ..data/hs.key`, `..data -> ..TIMESTAMP/`) stays hidden: the symlinks
/// are never granted, so no path reaches the real file.
#[tokio::test]
async fn a_key_behind_secret_volume_symlinks_stays_hidden() {
    let base = PathBuf::from(format!(
        "/etc/exec-gateway-test-secret-{}",
        std::process::id()
    ));
    let stamp = base.join("..2026_11_23_00_00_00.1");
    if std::fs::create_dir_all(&stamp).is_err() {
        eprintln!("SKIPPED: cannot write under /etc (needs root)");
        return;
    }
    std::os::unix::fs::symlink("..2026_11_23_00_00_00.1", base.join("..data")).unwrap();
    std::os::unix::fs::symlink("..data/hs.key", base.join("hs.key")).unwrap();
    let r = roots();
    let key = base.join("hs.key");
    let gw = Gateway::start_with(|dir| {
        std::fs::copy(dir.join("hs256.key"), stamp.join("hs.key")).unwrap();
        format!(
            "[[auth.keys]]\nalgorithm = \"HS256\"\nsecret_file = \"{}\"\n{}",
            key.display(),
            tenant("a", &r.a, "")
        )
    });
    if let Some(reason) = skip_reason(&gw, "landlock").await {
        let _ = std::fs::remove_dir_all(&base);
        eprintln!("SKIPPED: {reason}");
        return;
    }
    let (mut a, _) = gw.session_of("a").await;
    let (out, _, _) = sh(
        &mut a,
        "k",
        &r.a,
        &format!(
            "cat {k}; cat {b}/..data/hs.key; cat {s}/hs.key; echo END",
            k = key.display(),
            b = base.display(),
            s = stamp.display()
        ),
    )
    .await;
    let _ = std::fs::remove_dir_all(&base);
    assert!(out.ends_with("END\n"), "{out}");
    assert!(
        !out.contains(&String::from_utf8_lossy(&gw.secret).into_owned()),
        "the key was read: {out}"
    );
}

/// Roots outside /tmp: in a confined tenant's namespace the other
/// tenant's root is covered by an empty, inaccessible mount, so neither
/// `stat` nor a unix socket listening there reaches it (Landlock alone
/// governs neither).
#[tokio::test]
async fn other_tenants_roots_do_not_exist_for_a_tenant() {
    let base = PathBuf::from(format!(
        "/var/tmp/exec-gateway-test-roots-{}",
        std::process::id()
    ));
    let r = Roots {
        _dir: tempfile::tempdir().unwrap(),
        a: base.join("a"),
        b: base.join("b"),
    };
    for root in [&r.a, &r.b] {
        std::fs::create_dir_all(root.join("tmp")).unwrap();
    }
    std::fs::write(r.b.join("secret.txt"), "b-secret\n").unwrap();
    let sock = r.b.join("svc.sock");
    let listener = std::os::unix::net::UnixListener::bind(&sock).unwrap();
    let gw = gateway(&r, "", "", "");
    if let Some(reason) = skip_reason(&gw, "namespaces").await {
        let _ = std::fs::remove_dir_all(&base);
        eprintln!("SKIPPED: {reason}");
        return;
    }
    let (mut a, _) = gw.session_of("a").await;
    let (out, _, _) = sh(
        &mut a,
        "peek",
        &r.a,
        &format!(
            "stat -c %s {b}/secret.txt && echo STAT-OK; \
             python3 -c \"import socket; s=socket.socket(socket.AF_UNIX); s.connect('{s}'); print('CONNECTED')\" 2>/dev/null; \
             echo END",
            b = r.b.display(),
            s = sock.display()
        ),
    )
    .await;
    drop(listener);
    let _ = std::fs::remove_dir_all(&base);
    assert!(out.ends_with("END\n"), "{out}");
    assert!(!out.contains("STAT-OK"), "b's file was visible: {out}");
    assert!(
        !out.contains("CONNECTED"),
        "b's socket was reachable: {out}"
    );
}

/// seccomp refuses the socket families that reach the hypervisor (vsock)
/// or raw links; ordinary sockets still work.
#[tokio::test]
async fn seccomp_refuses_vsock_and_packet_sockets() {
    let r = roots();
    let gw = gateway(&r, "", "", "");
    require!(gw, "seccomp");
    let (mut a, _) = gw.session_of("a").await;
    let script = "import socket\n\
        for fam in (socket.AF_VSOCK, socket.AF_PACKET):\n\
        \x20   try:\n\
        \x20       socket.socket(fam, socket.SOCK_STREAM if fam == socket.AF_VSOCK else socket.SOCK_RAW)\n\
        \x20       print('OPENED', fam)\n\
        \x20   except OSError as e:\n\
        \x20       print('refused', e.errno)\n\
        socket.socket(socket.AF_INET, socket.SOCK_STREAM)\n\
        print('inet ok')\n";
    let (out, err, _) = sh(&mut a, "sock", &r.a, &format!("python3 -c \"{script}\"")).await;
    if err.contains("not found") {
        eprintln!("SKIPPED: python3 is not installed");
        return;
    }
    assert!(!out.contains("OPENED"), "{out} {err}");
    assert_eq!(out.matches("refused 1").count(), 2, "{out} {err}");
    assert!(out.contains("inet ok"), "{out} {err}");
}

/// A confined tenant's terminals live in its own devpts instance: another
/// terminal on the host (here ones the test opens, as an admin's shell or
/// another tenant's process would hold) is not there to write to.
#[tokio::test]
async fn a_tenant_sees_only_its_own_terminals() {
    use std::os::fd::AsRawFd as _;
    // A few host terminals, so the last one's number is not the tenant's 0.
    let hosts: Vec<_> = (0..3)
        .map(|_| nix::pty::openpty(None, None).unwrap())
        .collect();
    let host = hosts.last().unwrap();
    let name = std::fs::read_link(format!("/proc/self/fd/{}", host.slave.as_raw_fd())).unwrap();
    let r = roots();
    let gw = gateway(&r, "", "", "");
    require!(gw, "namespaces");
    require!(gw, "workers");
    let (mut a, _) = gw.session_of("a").await;
    let script = format!(
        "tty; ls /dev/pts | xargs echo pts:; echo injected > {} && echo WROTE; echo END",
        name.display()
    );
    let r0 = a
        .call(
            "process/start",
            json!({"processId": "t", "argv": ["sh", "-c", script], "cwd": r.a,
                   "env": {"PATH": "/usr/bin:/bin"}, "tty": true}),
        )
        .await;
    assert!(r0.get("error").is_none(), "{r0}");
    let out = String::from_utf8_lossy(&a.collect("t").await.stdout).into_owned();
    assert!(out.contains("END"), "{out}");
    assert!(!out.contains("WROTE"), "wrote to {}: {out}", name.display());
    // Its instance holds its own terminal only.
    let pts = out.lines().find(|l| l.starts_with("pts:")).unwrap_or("");
    assert_eq!(pts.trim(), "pts: 0 ptmx", "{out}");
    // Nothing reached the host terminal.
    nix::fcntl::fcntl(
        &host.master,
        nix::fcntl::FcntlArg::F_SETFL(nix::fcntl::OFlag::O_NONBLOCK),
    )
    .unwrap();
    let mut buf = [0u8; 64];
    let got = nix::unistd::read(&host.master, &mut buf).unwrap_or(0);
    assert!(!String::from_utf8_lossy(&buf[..got]).contains("injected"));
}

/// The uid a tenant's processes run as, and its groups.
async fn ids(c: &mut Client, root: &Path) -> (u32, String) {
    let (out, err, code) = sh(c, "ids", root, "id -u; id -G").await;
    assert_eq!(code, Some(0), "{err}");
    let mut lines = out.lines();
    let uid = lines.next().unwrap().parse().unwrap();
    (uid, lines.next().unwrap_or_default().to_owned())
}

/// A gateway running as root gives each tenant without a configured uid
/// its own, from the default range, the same at every start. Its root
/// (owned by root here, as the directory a user starts the gateway in
/// would be by that user) appears as the tenant's own: its processes and
/// the gateway's file operations write there, and what they create stays
/// the root owner's on disk.
#[tokio::test]
async fn tenants_without_a_uid_get_their_own_and_their_root_stays_its_owners() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("SKIPPED: allocation applies to a gateway running as root");
        return;
    }
    let r = roots();
    let (ua, ub) = {
        let gw = gateway(&r, "", "", "");
        require!(gw, "namespaces");
        let (mut a, _) = gw.session_of("a").await;
        let (mut b, _) = gw.session_of("b").await;
        let ((ua, ga), (ub, _)) = (ids(&mut a, &r.a).await, ids(&mut b, &r.b).await);
        assert!((40000..=59999).contains(&ua), "{ua}");
        assert!((40000..=59999).contains(&ub), "{ub}");
        assert_ne!(ua, ub);
        assert_eq!(ga, ua.to_string(), "no other groups");
        let (out, err, code) = sh(
            &mut a,
            "write",
            &r.a,
            "stat -c %u own.txt; echo x > new.txt && mkdir d && echo wrote",
        )
        .await;
        assert_eq!(code, Some(0), "{err}");
        assert_eq!(out, format!("{ua}\nwrote\n"));
        a.call(
            "fs/writeFile",
            json!({"path": r.a.join("d/fs.txt"), "dataBase64": common::b64(b"y")}),
        )
        .await;
        let meta = a
            .call("fs/getMetadata", json!({"path": r.a.join("new.txt")}))
            .await;
        assert_eq!(meta["isFile"], json!(true), "{meta}");
        for made in ["new.txt", "d", "d/fs.txt"] {
            assert_eq!(
                std::fs::metadata(r.a.join(made)).unwrap().uid(),
                0,
                "{made}"
            );
        }
        // Still not the other tenant's files.
        let (out, _, _) = sh(
            &mut a,
            "cross",
            &r.a,
            &format!("cat {}/secret.txt; echo rc=$?", r.b.display()),
        )
        .await;
        assert!(!out.contains("b-secret") && !out.contains("rc=0"), "{out}");
        (ua, ub)
    };
    let gw = gateway(&r, "", "", "");
    let (mut a, _) = gw.session_of("a").await;
    let (mut b, _) = gw.session_of("b").await;
    assert_eq!(ids(&mut a, &r.a).await.0, ua, "stable across starts");
    assert_eq!(ids(&mut b, &r.b).await.0, ub);
}

/// `[isolation] uid = "off"` would run tenants as uid 0: refused.
#[test]
fn uid_off_is_refused_for_a_gateway_running_as_root() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("SKIPPED: the refusal applies to a gateway running as root");
        return;
    }
    let r = roots();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("k"), "k".repeat(40)).unwrap();
    let config = dir.path().join("gateway.toml");
    std::fs::write(
        &config,
        format!(
            "[isolation]\nuid = \"off\"\n[[auth.keys]]\nalgorithm = \"HS256\"\nsecret_file = \"{}/k\"\n{}",
            dir.path().display(),
            tenant("a", &r.a, "")
        ),
    )
    .unwrap();
    let out = common::serve_expecting_refusal(&config);
    assert_eq!(out.status.code(), Some(64));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(err.contains("uid = \"off\""), "{err}");
}

/// A root below a directory only root may search (`/root`, mode 0700, is
/// the usual case) is still reached by the tenant's uid: that directory is
/// covered, in the tenant's namespace, by an empty one holding only the
/// way down to the root. The other tenant's root beside it is not there.
#[tokio::test]
async fn a_root_below_a_directory_only_root_may_search_is_reached() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("SKIPPED: only a gateway running as root gives tenants another uid");
        return;
    }
    let parent = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let (a, b) = (parent.path().join("a"), parent.path().join("b"));
    std::fs::create_dir_all(a.join("tmp")).unwrap();
    std::fs::create_dir_all(b.join("tmp")).unwrap();
    std::fs::write(b.join("secret.txt"), "b-secret\n").unwrap();
    std::fs::set_permissions(parent.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    let gw = Gateway::start_with(|dir| {
        format!(
            "[[auth.keys]]\nalgorithm = \"HS256\"\nsecret_file = \"{}/hs256.key\"\n{}{}",
            dir.display(),
            tenant("a", &a, ""),
            tenant("b", &b, "")
        )
    });
    require!(gw, "namespaces");
    let (mut c, _) = gw.session_of("a").await;
    let (out, err, code) = sh(
        &mut c,
        "reach",
        &a,
        &format!(
            "pwd; echo x > made && echo wrote; test -e {b} && echo b-exists || echo b-gone",
            b = b.display()
        ),
    )
    .await;
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(out, format!("{}\nwrote\nb-gone\n", a.display()));
}

/// A confined tenant's worker is the init of the tenant's own PID
/// namespace, with its own `/proc`: the tenant lists only its processes
/// (not the other tenant's, not the gateway), its numbers name nothing
/// outside, and it cannot kill its worker (init ignores signals from
/// inside its namespace).
#[tokio::test]
async fn a_tenant_sees_only_its_own_processes() {
    let r = roots();
    let gw = gateway(&r, "", "", "");
    require!(gw, "namespaces");
    require!(gw, "workers");
    let (mut a, _) = gw.session_of("a").await;
    let (mut b, _) = gw.session_of("b").await;
    let bpid = sleeper(&mut b, "victim", &r.b, json!({})).await;
    let workers_of_a = || {
        common::host_pids_where(|c| {
            let needle = b"\0worker\0--tenant\0a\0";
            c.windows(needle.len()).any(|w| w == needle)
        })
    };
    let (out, err, code) = sh(
        &mut a,
        "ps",
        &r.a,
        "for p in /proc/[0-9]*; do printf '%s ' \"${p#/proc/}\"; tr '\\0' ' ' < $p/cmdline; echo; done",
    )
    .await;
    assert_eq!(code, Some(0), "{err}");
    let lines: Vec<&str> = out.lines().collect();
    // The worker (1), the shell, and what it forked for the listing.
    assert!(lines.len() <= 4, "{out}");
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("1 ") && l.contains("worker --tenant a")),
        "{out}"
    );
    assert!(!out.contains("sleep 60."), "b's process is listed: {out}");
    assert!(!out.contains("serve"), "the gateway is listed: {out}");
    let workers = workers_of_a();
    assert!(!workers.is_empty());
    let (out, _, _) = sh(
        &mut a,
        "kill",
        &r.a,
        &format!("kill -KILL 1; echo init=$?; kill -KILL {bpid}; echo b=$?"),
    )
    .await;
    assert!(out.contains("b=1"), "{out}");
    assert!(pid_alive(bpid), "b's process was killed");
    let (out, _, code) = sh(&mut a, "after", &r.a, "echo still-served").await;
    assert_eq!((out.as_str(), code), ("still-served\n", Some(0)));
    // Either listing may also catch a spawn between fork and exec (or a
    // pool's new worker): what matters is that a worker from before lives.
    let now = workers_of_a();
    assert!(
        now.iter().any(|p| workers.contains(p)),
        "the worker was replaced: {workers:?} then {now:?}"
    );
}

/// A tenant's root is idmapped: what it creates is the root owner's on
/// disk. A setuid or setgid bit on such a file would hand the host a
/// setuid-root program, so setting either is refused (chmod, creat, open).
#[tokio::test]
async fn a_tenant_cannot_leave_a_setuid_file_in_its_root() {
    let r = roots();
    let gw = gateway(&r, "", "", "");
    require!(gw, "seccomp");
    let (mut a, _) = gw.session_of("a").await;
    let (out, err, _) = sh(
        &mut a,
        "suid",
        &r.a,
        "cp /bin/true t; chmod 4755 t; echo u=$?; chmod 2755 t; echo g=$?; chmod u+s t; echo us=$?; \
         mkdir d; chmod g+s d; echo d=$?; chmod 755 t; echo plain=$?; \
         python3 -c 'import os; os.open(\"n\", os.O_CREAT|os.O_WRONLY, 0o4755)' 2>/dev/null; echo open=$?",
    )
    .await;
    assert!(
        out.contains("u=1") && out.contains("g=1") && out.contains("us=1") && out.contains("d=1"),
        "{out} {err}"
    );
    assert!(out.contains("plain=0"), "{out}");
    // open(O_CREAT, 04755) is refused: nothing is created.
    assert!(out.contains("open=1"), "{out} {err}");
    assert!(!r.a.join("n").exists(), "{out}");
    for f in ["t", "d"] {
        let mode = std::fs::metadata(r.a.join(f)).unwrap().mode();
        assert_eq!(mode & 0o6000, 0, "{f}: {mode:o}");
    }
}

/// Less of the host in view: a tenant whose root lies beside another's
/// (as under /srv/tenants) finds neither the other's root nor its path in
/// its mountinfo, and the kernel's symbol table reads as empty.
#[tokio::test]
async fn a_tenant_sees_neither_the_others_root_path_nor_kernel_symbols() {
    let base =
        PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("roots-{}", std::process::id()));
    let (ra, rb) = (base.join("alpha"), base.join("beta"));
    std::fs::create_dir_all(&ra).unwrap();
    std::fs::create_dir_all(&rb).unwrap();
    std::fs::write(rb.join("secret.txt"), "b-secret\n").unwrap();
    let r = Roots {
        _dir: tempfile::tempdir().unwrap(),
        a: ra.clone(),
        b: rb.clone(),
    };
    let gw = gateway(&r, "", "", "");
    require!(gw, "namespaces");
    let (mut a, _) = gw.session_of("a").await;
    let (out, err, _) = sh(
        &mut a,
        "view",
        &ra,
        &format!(
            "cat /proc/self/mountinfo; echo KALLSYMS; head -c 200 /proc/kallsyms; echo; ls {} 2>&1; cat {}/secret.txt 2>&1",
            base.display(),
            rb.display()
        ),
    )
    .await;
    let _ = std::fs::remove_dir_all(&base);
    let (mountinfo, rest) = out.split_once("KALLSYMS\n").unwrap();
    assert!(mountinfo.contains("alpha"), "{mountinfo}");
    assert!(
        !mountinfo.contains("beta"),
        "b's root shows: {mountinfo} {err}"
    );
    // The shared parent is covered: b's root is not there at all.
    assert!(!rest.contains("b-secret"), "{rest}");
    assert!(rest.contains("No such file or directory"), "{rest}");
    assert!(!rest.contains(" T "), "kernel symbols readable: {rest}");
}
