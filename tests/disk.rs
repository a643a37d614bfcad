//! What a tenant may put on disk: its private `/tmp` is a tmpfs of
//! `max_tmp_bytes` (a full one is the writer's ENOSPC and a clear
//! `fs/writeFile` error, never the gateway's state filesystem filling for
//! everyone), its use is a metric, and the root's project quota (the
//! `disk` layer) is enforced where the filesystem keeps project quotas and
//! refused with the reason under `required` where it does not.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::os::unix::fs::PermissionsExt as _;

use common::{Gateway, b64};
use serde_json::json;

const MIB: u64 = 1 << 20;

/// Root `a` in a scratch directory others may pass, beside the key file `k`.
fn one_root_and_key() -> (tempfile::TempDir, std::path::PathBuf) {
    let scratch = common::scratch();
    std::fs::set_permissions(scratch.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let root = scratch.path().join("a");
    std::fs::create_dir_all(&root).unwrap();
    std::fs::write(scratch.path().join("k"), "0123456789abcdef0123456789abcdef").unwrap();
    (scratch, root)
}

/// Roots `a` and `b` side by side in a scratch directory others may pass.
fn two_roots() -> (tempfile::TempDir, std::path::PathBuf, std::path::PathBuf) {
    let scratch = common::scratch();
    std::fs::set_permissions(scratch.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let (ra, rb) = (scratch.path().join("a"), scratch.path().join("b"));
    std::fs::create_dir_all(&ra).unwrap();
    std::fs::create_dir_all(&rb).unwrap();
    (scratch, ra, rb)
}

#[tokio::test]
async fn a_tenants_tmp_holds_max_tmp_bytes_and_no_more() {
    let (_scratch, ra, rb) = two_roots();
    let gw = Gateway::start_with(|d| {
        format!(
            "[[auth.keys]]\nalgorithm = \"HS256\"\nsecret_file = \"{}/hs256.key\"\n\
             [tenants.a]\nroot = \"{}\"\nmax_tmp_bytes = {}\n\
             [tenants.b]\nroot = \"{}\"\n",
            d.display(),
            ra.display(),
            8 * MIB,
            rb.display()
        )
    });
    let (_, ready) = gw.admin_get("/readyz").await;
    if !ready.contains("namespaces: active") {
        eprintln!("SKIPPED: the namespaces layer is inactive here: {ready}");
        return;
    }
    assert!(ready.contains("/tmp a tmpfs of max_tmp_bytes"), "{ready}");
    let (mut a, _) = gw.session_of("a").await;
    a.call(
        "process/start",
        json!({"processId": "fill", "cwd": ra, "tty": false, "env": {"PATH": "/usr/bin:/bin"},
               "argv": ["sh", "-c", "dd if=/dev/zero of=/tmp/fill bs=1M count=20 2>&1; echo rc=$?"]}),
    )
    .await;
    let out = String::from_utf8_lossy(&a.collect("fill").await.stdout).into_owned();
    assert!(out.contains("No space left on device"), "{out}");
    assert!(!out.contains("rc=0"), "{out}");
    // The use is a metric, read at the scrape.
    let used = gw
        .metric("exec_gateway_tmp_bytes", "tenant=\"a\"")
        .await
        .unwrap();
    assert!(
        used >= (7 * MIB) as f64 && used <= (8 * MIB) as f64,
        "{used}"
    );
    // The other tenant's /tmp is its own, and not full.
    let (mut b, _) = gw.session_of("b").await;
    b.call(
        "process/start",
        json!({"processId": "w", "cwd": rb, "tty": false, "env": {"PATH": "/usr/bin:/bin"},
               "argv": ["sh", "-c", "dd if=/dev/zero of=/tmp/x bs=1M count=20 2>/dev/null && ls /tmp"]}),
    )
    .await;
    let out = b.collect("w").await;
    assert_eq!(out.exit_code, Some(0));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "x\n");
}

/// Under `disk = "required"` the root's project quota is enforced (EDQUOT
/// past `max_disk_bytes`), or, where the root's filesystem keeps no
/// project quotas (this host's kernel has no CONFIG_QUOTA), the gateway
/// refuses to start and says why.
#[tokio::test]
async fn a_root_quota_is_enforced_or_its_absence_refused() {
    let (scratch, root) = one_root_and_key();
    let config = common::write_file(
        scratch.path(),
        "gateway.toml",
        &format!(
            "[isolation]\ndisk = \"required\"\n\
             [[auth.keys]]\nalgorithm = \"HS256\"\nsecret_file = \"{}/k\"\n\
             [tenants.a]\nroot = \"{}\"\nmax_disk_bytes = {}\n",
            scratch.path().display(),
            root.display(),
            4 * MIB
        ),
    );
    let out = common::serve_expecting_refusal(&config);
    let err = String::from_utf8_lossy(&out.stderr);
    if err.contains("isolation layer `disk` is required but unavailable") {
        assert!(
            err.contains("CONFIG_QUOTA") || err.contains("prjquota"),
            "the refusal names the reason: {err}"
        );
        eprintln!("SKIPPED enforcement: no project quotas on this host; refusal checked");
        return;
    }
    // A host with project quotas on the root's filesystem: enforced.
    let gw = Gateway::start_with(|d| {
        format!(
            "[isolation]\ndisk = \"required\"\n\
             [[auth.keys]]\nalgorithm = \"HS256\"\nsecret_file = \"{}/hs256.key\"\n\
             [tenants.a]\nroot = \"{}\"\nmax_disk_bytes = {}\n",
            d.display(),
            root.display(),
            4 * MIB
        )
    });
    let (mut a, _) = gw.session_of("a").await;
    a.call(
        "process/start",
        json!({"processId": "fill", "cwd": root, "tty": false, "env": {"PATH": "/usr/bin:/bin"},
               "argv": ["sh", "-c", "dd if=/dev/zero of=fill bs=1M count=20 2>&1; echo rc=$?"]}),
    )
    .await;
    let out = String::from_utf8_lossy(&a.collect("fill").await.stdout).into_owned();
    assert!(out.contains("Disk quota exceeded"), "{out}");
    // A file operation past the quota says why.
    let (code, msg) = a
        .call_err(
            "fs/writeFile",
            json!({"path": root.join("more"), "dataBase64": b64(&[7u8; 1 << 20])}),
        )
        .await;
    assert_eq!(code, -32603, "{msg}");
    assert!(msg.contains("disk quota is used up"), "{msg}");
    let used = gw
        .metric("exec_gateway_disk_bytes", "tenant=\"a\"")
        .await
        .unwrap();
    assert!(used <= (4 * MIB) as f64 && used > 0.0, "{used}");
}

/// Without the namespaces layer a confined tenant has no `/tmp` of its
/// own, and the host's holds what is not its: the gateway's key and
/// another tenant's root here. Its `TMPDIR` is then a directory of its own
/// in the state directory, and the host's `/tmp` is not granted (it was,
/// whole: the key could be read and the other root listed).
#[tokio::test]
async fn without_namespaces_a_tenant_gets_its_own_tmpdir_not_the_hosts() {
    let (_scratch, ra, rb) = two_roots();
    std::fs::write(rb.join("secret.txt"), "b-secret\n").unwrap();
    let gw = Gateway::start_with(|d| {
        // Its state directory lies below: passable, as /var/lib is.
        std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o711)).unwrap();
        std::fs::create_dir(d.join("state")).unwrap();
        std::fs::set_permissions(d.join("state"), std::fs::Permissions::from_mode(0o711)).unwrap();
        format!(
            "[isolation]\nnamespaces = \"off\"\nnetwork = \"off\"\n\
             [[auth.keys]]\nalgorithm = \"HS256\"\nsecret_file = \"{}/hs256.key\"\n\
             [tenants.a]\nroot = \"{}\"\n[tenants.b]\nroot = \"{}\"\n",
            d.display(),
            ra.display(),
            rb.display()
        )
    });
    let (_, ready) = gw.admin_get("/readyz").await;
    if !ready.contains("landlock: active") {
        eprintln!("SKIPPED: the Landlock layer is inactive here: {ready}");
        return;
    }
    // The key lives in the gateway's directory under the host's /tmp.
    let key = gw.dir.path().join("hs256.key");
    assert!(key.starts_with(std::env::temp_dir()), "{}", key.display());
    let own = gw.dir.path().join("state/exec-gateway/tenants/a/tmp");
    let (mut a, _) = gw.session_of("a").await;
    let script = format!(
        "echo x > {}/mine && echo wrote; \
         cat {} 2>/dev/null && echo KEY; cat {}/secret.txt 2>/dev/null && echo OTHER; \
         echo y > /tmp/host-tmp-{} 2>/dev/null && echo HOSTTMP; true",
        own.display(),
        key.display(),
        rb.display(),
        std::process::id()
    );
    a.call(
        "process/start",
        json!({"processId": "t", "cwd": ra, "tty": false, "env": {"PATH": "/usr/bin:/bin"},
               "argv": ["sh", "-c", script]}),
    )
    .await;
    let c = a.collect("t").await;
    let out = String::from_utf8_lossy(&c.stdout).into_owned();
    let err = String::from_utf8_lossy(&c.stderr).into_owned();
    assert!(out.contains("wrote"), "{out} {err}");
    assert!(own.join("mine").exists());
    for leak in ["KEY", "OTHER", "b-secret", "HOSTTMP"] {
        assert!(!out.contains(leak), "{leak}: {out}");
    }
}

/// Without namespaces a `TMPDIR` under `/tmp` is moved to the tenant's own
/// directory by its text: one with `..` would lead elsewhere, and Landlock
/// would grant it there. Refused at start, naming the setting.
#[test]
fn without_namespaces_a_tmpdir_with_dot_dot_is_refused() {
    let (scratch, root) = one_root_and_key();
    let config = common::write_file(
        scratch.path(),
        "gateway.toml",
        &format!(
            "[isolation]\nnamespaces = \"off\"\nnetwork = \"off\"\n\
             [[auth.keys]]\nalgorithm = \"HS256\"\nsecret_file = \"{}/k\"\n\
             [tenants.a]\nroot = \"{}\"\n[tenants.a.base_env]\nTMPDIR = \"/tmp/../../var/tmp\"\n",
            scratch.path().display(),
            root.display()
        ),
    );
    let out = common::serve_expecting_refusal(&config);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(64), "{err}");
    assert!(err.contains("base_env.TMPDIR"), "{err}");
}
