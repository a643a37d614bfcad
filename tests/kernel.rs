//! What depends on the kernel and the cgroup version. This host binds the
//! controllers to cgroup v1, so most of these skip here, saying why; the VM
//! lane (scripts/vm-test) runs them as root on Debian's 6.12 and 6.1 with
//! cgroup v2 unified: a pod's shapes (a delegated cgroup, cgroupfs
//! read-only, with and without a cgroup namespace, processes coming and
//! going beside the gateway), what a runtime's `exec` meets afterwards,
//! Landlock on an older ABI, idmapped tmpfs roots, and `/readyz` naming
//! what each layer enforces on the kernel it runs on.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, unsafe_code)]

mod common;

use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::process::Command;

use common::{Gateway, eventually};
use serde_json::json;

const CG: &str = "/sys/fs/cgroup";

fn release() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .unwrap()
        .trim()
        .to_owned()
}

fn kernel_at_least(v: (u32, u32)) -> bool {
    let r = release();
    let mut n = r
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|p| p.parse::<u32>().ok());
    (n.next().unwrap(), n.next().unwrap()) >= v
}

/// The running kernel's Landlock ABI (0: none).
fn landlock_abi() -> i64 {
    // SAFETY: landlock_create_ruleset(NULL, 0, VERSION) returns a number.
    let v = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<libc::c_void>(),
            0usize,
            1u32,
        )
    };
    v.max(0)
}

fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// `Some(reason)` unless this is root on a unified (v2) hierarchy whose
/// root offers pids, memory and cpu.
fn no_v2() -> Option<String> {
    if !is_root() {
        return Some("needs root (cgroups are created and delegated)".into());
    }
    let controllers = std::fs::read_to_string(format!("{CG}/cgroup.controllers"))
        .map_err(|_| ())
        .ok();
    let Some(controllers) = controllers else {
        return Some(format!(
            "{CG} is not the unified (v2) hierarchy here (this host binds the controllers to v1): scripts/vm-test runs this"
        ));
    };
    for c in ["pids", "memory", "cpu"] {
        if !controllers.split_whitespace().any(|x| x == c) {
            return Some(format!("the v2 hierarchy has no `{c}` controller"));
        }
    }
    None
}

macro_rules! skip_unless {
    ($reason:expr) => {
        if let Some(reason) = $reason {
            eprintln!("SKIPPED: {reason}");
            return;
        }
    };
}

fn keys(dir: &Path) -> String {
    format!(
        "[[auth.keys]]\nalgorithm = \"HS256\"\nsecret_file = \"{}/hs256.key\"\n",
        dir.display()
    )
}

/// A cgroup made for one test (what a container runtime makes for a pod's
/// container); on drop everything in it is killed and it is removed.
struct Pod {
    dir: PathBuf,
}

impl Pod {
    fn new() -> Pod {
        let _ = std::fs::write(format!("{CG}/cgroup.subtree_control"), "+pids +memory +cpu");
        let dir = PathBuf::from(format!(
            "{CG}/kernel-test-pod-{}-{}",
            std::process::id(),
            common::unique_seconds()
        ));
        std::fs::create_dir(&dir).unwrap();
        Pod { dir }
    }

    fn procs(&self) -> String {
        std::fs::read_to_string(self.dir.join("cgroup.procs")).unwrap()
    }
}

impl Drop for Pod {
    fn drop(&mut self) {
        let _ = std::fs::write(self.dir.join("cgroup.kill"), "1");
        for _ in 0..500 {
            let events =
                std::fs::read_to_string(self.dir.join("cgroup.events")).unwrap_or_default();
            if !events.contains("populated 1") {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        remove_tree(&self.dir);
    }
}

/// `rmdir` a cgroup and its children, deepest first.
fn remove_tree(dir: &Path) {
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                remove_tree(&e.path());
            }
        }
    }
    let _ = std::fs::remove_dir(dir);
}

/// The gateway as a pod runs it: started in the pod's cgroup beside a
/// stand-in for the container's init and a loop of short-lived processes
/// (exec probes, `kubectl exec`), in a mount namespace of its own where
/// cgroupfs is read-only; with `cgroupns`, in a cgroup namespace rooted at
/// the pod's cgroup with cgroup2 mounted afresh, as runtimes do.
fn pod_gateway(pod: &Pod, cgroupns: bool, init_file: &Path) -> Gateway {
    let mount = if cgroupns {
        "umount -l /sys/fs/cgroup && mount -t cgroup2 -o ro,nosuid,nodev,noexec cgroup2 /sys/fs/cgroup"
    } else {
        "mount -o remount,bind,ro /sys/fs/cgroup"
    };
    let script = format!(
        "#!/bin/sh\nset -e\necho $$ > {pod}/cgroup.procs\nsleep 100000 &\necho $! > {init}\n\
         (while :; do /bin/true; done) &\n\
         exec unshare --mount {ns} sh -c '{mount} && exec {bin} \"$@\"' gateway \"$@\"\n",
        pod = pod.dir.display(),
        init = init_file.display(),
        ns = if cgroupns { "--cgroup" } else { "" },
        bin = env!("CARGO_BIN_EXE_exec-gateway"),
    );
    let wrapper = init_file.with_file_name("pod.sh");
    std::fs::write(&wrapper, script).unwrap();
    std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755)).unwrap();
    Gateway::launch(&wrapper, None, &[], |dir| {
        format!(
            "[isolation]\ncgroups = \"required\"\n{}[tenants.a]\nroot = \"/\"\npids_max = 40\n",
            keys(dir)
        )
    })
}

/// Start in a pod three times, processes coming and going beside the
/// gateway each time (`cgroups = "required"`: a start that cannot empty
/// the pod's cgroup fails). Every process of the pod's cgroup ends in the
/// supervisor leaf, the tenant's limits apply, and what a runtime adds to
/// the container afterwards (`kubectl exec`: runc and crun meet EBUSY at
/// the container's cgroup and join its init's) lands in that leaf, while
/// the tenant goes on working.
async fn a_pod_starts_and_stays_enterable(cgroupns: bool) {
    skip_unless!(no_v2());
    for start in 0..3 {
        let pod = Pod::new();
        let scratch = tempfile::tempdir().unwrap();
        let init_file = scratch.path().join("init.pid");
        let gw = pod_gateway(&pod, cgroupns, &init_file);
        let pid = gw.child.id();
        let supervisor = pod.dir.join("exec-gateway-supervisor");
        let held = std::fs::read_to_string(supervisor.join("cgroup.procs")).unwrap();
        assert!(
            held.lines().any(|l| l == pid.to_string()),
            "start {start}: the gateway is not in the supervisor leaf: {held}"
        );
        assert_eq!(
            pod.procs(),
            "",
            "start {start}: the pod's cgroup holds processes"
        );
        // The tenant's cgroup exists once it is active (its first session).
        let (mut a, _) = gw.session_of("a").await;
        let tenant = pod.dir.join(format!("exec-gateway/gw-{pid}/a"));
        assert_eq!(
            std::fs::read_to_string(tenant.join("pids.max"))
                .unwrap()
                .trim(),
            "40"
        );
        a.start("where", &["sh", "-c", "grep '^0::' /proc/self/cgroup"])
            .await;
        let line = a.first_line("where").await;
        assert!(
            line.contains(&format!("/exec-gateway/gw-{pid}/a/p")),
            "start {start}: {line}"
        );
        if start < 2 {
            continue;
        }
        // `kubectl exec`: the runtime puts a new process in the container's
        // cgroup, which has controllers enabled for its children now...
        let mut exec = Command::new("sleep").arg("600").spawn().unwrap();
        let err = std::fs::write(pod.dir.join("cgroup.procs"), exec.id().to_string())
            .expect_err("a process joined a cgroup with controllers enabled for its children");
        assert_eq!(err.raw_os_error(), Some(libc::EBUSY), "{err}");
        // ...so, as runc and crun do, it joins the cgroup of the init.
        let init = std::fs::read_to_string(&init_file).unwrap();
        let init_cg = std::fs::read_to_string(format!("/proc/{}/cgroup", init.trim())).unwrap();
        let init_cg = init_cg.trim().trim_start_matches("0::");
        assert_eq!(
            Path::new(&format!("{CG}{init_cg}")),
            supervisor,
            "the init is not in the supervisor leaf"
        );
        std::fs::write(format!("{CG}{init_cg}/cgroup.procs"), exec.id().to_string())
            .expect("joining the init's cgroup");
        a.start("after", &["true"]).await;
        assert_eq!(a.collect("after").await.exit_code, Some(0));
        let _ = exec.kill();
        let _ = exec.wait();
    }
}

#[tokio::test]
async fn a_pod_with_a_cgroup_namespace_starts_and_stays_enterable() {
    a_pod_starts_and_stays_enterable(true).await;
}

#[tokio::test]
async fn a_pod_without_a_cgroup_namespace_starts_and_stays_enterable() {
    a_pod_starts_and_stays_enterable(false).await;
}

/// v2 only: the tenant's OOM kill takes the process's whole cgroup
/// (`memory.oom.group`: its children too), and terminate kills through
/// `cgroup.kill` what left the process group.
#[tokio::test]
async fn an_oom_kills_the_whole_process_cgroup() {
    skip_unless!(no_v2());
    let gw = Gateway::start_with(|dir| {
        format!(
            "{}[tenants.a]\nroot = \"/\"\nmemory_max_bytes = 67108864\n",
            keys(dir)
        )
    });
    let (mut a, _) = gw.session_of("a").await;
    let secs = common::unique_seconds();
    // A child that only sleeps, then a parent that allocates past the limit.
    a.start(
        "hog",
        &[
            "sh",
            "-c",
            &format!("setsid sleep {secs} & python3 -c 'x = bytearray(512 << 20); print(len(x))'"),
        ],
    )
    .await;
    let hog = a.collect("hog").await;
    assert_eq!(hog.exit_code, Some(-1), "killed by a signal");
    let r = a.call("process/read", json!({"processId": "hog"})).await;
    assert_eq!(
        r["failure"],
        json!("killed by the out-of-memory killer (tenant memory limit)")
    );
    // The sleeping child went with it (group kill), though it used nothing.
    let secs = secs.to_string();
    eventually("the child is killed with the group", || {
        !std::fs::read_dir("/proc").unwrap().flatten().any(|e| {
            std::fs::read(e.path().join("cmdline"))
                .is_ok_and(|c| c == format!("sleep\0{secs}\0").as_bytes())
        })
    })
    .await;
}

/// Landlock on the kernel's own ABI: writes outside the tenant's paths are
/// refused on every kernel (on 6.1, ABI 2, the whole ruleset used to be
/// dropped); `truncate(2)` of a file only granted for reading is refused
/// from ABI 3 on, and where the kernel cannot, `/readyz` says so.
#[tokio::test]
async fn landlock_enforces_what_this_kernel_supports() {
    let base = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    std::fs::set_permissions(base.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let (root, shared) = (base.path().join("root"), base.path().join("shared"));
    std::fs::create_dir_all(root.join("tmp")).unwrap();
    std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o777)).unwrap();
    std::fs::create_dir(&shared).unwrap();
    std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o755)).unwrap();
    let f = shared.join("f");
    std::fs::write(&f, "keep\n").unwrap();
    // Anyone may write it: only Landlock stands in the way.
    std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o666)).unwrap();
    let gw = Gateway::start_with(|dir| {
        format!(
            "{}[tenants.a]\nroot = \"{}\"\nlandlock_read = [\"{}\"]\n",
            keys(dir),
            root.display(),
            shared.display()
        )
    });
    let (_, ready) = gw.admin_get("/readyz").await;
    skip_unless!(
        (!ready.contains("landlock: active"))
            .then(|| format!("the Landlock layer is inactive here: {ready}"))
    );
    let abi = landlock_abi();
    assert!(
        ready.contains(&format!("landlock: active (ABI {};", abi.min(6))),
        "{ready}"
    );
    let (mut a, _) = gw.session_of("a").await;
    let f = f.display();
    let script = format!(
        "echo x >> {f}; echo append=$?; \
         python3 -c 'import os, sys; os.truncate(sys.argv[1], 0)' {f} 2>/dev/null; echo truncate=$?"
    );
    a.call(
        "process/start",
        json!({"processId": "p", "argv": ["sh", "-c", script], "cwd": root,
               "env": {"PATH": "/usr/bin:/bin"}, "tty": false}),
    )
    .await;
    let out = String::from_utf8(a.collect("p").await.stdout).unwrap();
    assert!(
        out.contains("append=") && !out.contains("append=0"),
        "{out}"
    );
    let left = std::fs::read_to_string(shared.join("f")).unwrap();
    assert!(!left.contains('x'), "appended: {left:?}");
    if abi >= 3 {
        assert!(out.contains("truncate=1"), "{out}");
        assert_eq!(left, "keep\n");
        assert!(
            ready.contains("not enforced on this kernel: nothing"),
            "{ready}"
        );
    } else {
        // The kernel's gap, as /readyz states it.
        assert_eq!(left, "", "{out}");
        assert!(ready.contains("truncating files"), "{ready}");
    }
}

/// A root on tmpfs owned by someone else, for a tenant whose uid the
/// gateway allocates: from Linux 6.3 the root is idmapped (what the tenant
/// writes is the owner's on disk); before, the gateway refuses to start,
/// naming why, instead of serving a tenant that cannot write its root.
#[tokio::test]
async fn a_tmpfs_root_is_idmapped_or_refused() {
    skip_unless!((!is_root()).then_some("uids are allocated by a gateway running as root"));
    let base = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    std::fs::set_permissions(base.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let root = base.path().join("root");
    std::fs::create_dir(&root).unwrap();
    let mounted = Command::new("mount")
        .args([
            "-t",
            "tmpfs",
            "-o",
            "mode=0755,uid=1000,gid=1000",
            "tenant-root",
        ])
        .arg(&root)
        .status()
        .unwrap();
    assert!(mounted.success());
    struct Unmount(PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = Command::new("umount").arg("-l").arg(&self.0).status();
        }
    }
    let _unmount = Unmount(root.clone());
    std::fs::create_dir(root.join("tmp")).unwrap();
    std::os::unix::fs::chown(root.join("tmp"), Some(1000), Some(1000)).unwrap();
    let config = |dir: &Path| format!("{}[tenants.a]\nroot = \"{}\"\n", keys(dir), root.display());
    if !kernel_at_least((6, 3)) {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("hs256.key"), "k".repeat(40)).unwrap();
        let file = dir.path().join("gateway.toml");
        std::fs::write(&file, config(dir.path())).unwrap();
        let out = common::serve_expecting_refusal(&file);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(64), "{err}");
        assert!(err.contains("cannot be idmapped"), "{err}");
        assert!(err.contains("from 6.3"), "{err}");
        return;
    }
    let gw = Gateway::start_with(config);
    let (_, ready) = gw.admin_get("/readyz").await;
    skip_unless!(
        (!ready.contains("namespaces: active"))
            .then(|| format!("the namespaces layer is inactive here: {ready}"))
    );
    let (mut a, _) = gw.session_of("a").await;
    a.call(
        "process/start",
        json!({"processId": "w", "argv": ["sh", "-c", "id -u; echo x > made && stat -c %u made"],
               "cwd": root, "env": {"PATH": "/usr/bin:/bin"}, "tty": false}),
    )
    .await;
    let c = a.collect("w").await;
    let out = String::from_utf8(c.stdout).unwrap();
    let mut lines = out.lines();
    let (uid, owner) = (lines.next().unwrap(), lines.next());
    assert_ne!(uid, "1000", "the tenant runs as its own uid");
    assert_eq!(owner, Some(uid), "its files look its own: {out}");
    assert_eq!(std::fs::metadata(root.join("made")).unwrap().uid(), 1000);
}

/// `/readyz` (admin) names each layer's mechanism on this kernel and the
/// limits in force for each tenant, and what of them is not enforced.
#[tokio::test]
async fn readyz_names_each_layers_mechanism_and_the_limits_in_force() {
    let root = tempfile::tempdir().unwrap();
    std::fs::create_dir(root.path().join("tmp")).unwrap();
    let gw = Gateway::start_with(|dir| {
        format!(
            "{}[tenants.a]\nroot = \"{}\"\npids_max = 40\nmemory_max_bytes = 67108864\ncpu_max_cores = 0.5\n",
            keys(dir),
            root.path().display()
        )
    });
    let (_, ready) = gw.admin_get("/readyz").await;
    let limits = ready
        .lines()
        .find(|l| l.starts_with("limits a: "))
        .unwrap_or_else(|| panic!("{ready}"));
    let cgroups = ready.lines().find(|l| l.starts_with("cgroups: ")).unwrap();
    if cgroups.starts_with("cgroups: active") {
        for set in [
            "pids_max 40,",
            "memory_max_bytes 67108864,",
            "cpu_max_cores 0.5,",
        ] {
            assert!(limits.contains(set), "{limits}");
        }
        let v2 = Path::new(&format!("{CG}/cgroup.controllers")).exists();
        if v2 {
            assert!(cgroups.contains("v2 at "), "{cgroups}");
            assert!(cgroups.contains("cgroup.kill"), "{cgroups}");
        } else {
            assert!(cgroups.contains("v1;"), "{cgroups}");
        }
        if no_v2().is_none() {
            assert!(
                cgroups.contains("controllers pids memory cpu;"),
                "{cgroups}"
            );
            assert!(!limits.contains("no pids controller"), "{limits}");
        }
    } else {
        assert!(limits.contains("pids_max 40 (not enforced"), "{limits}");
    }
    let disk = ready.lines().find(|l| l.starts_with("disk: ")).unwrap();
    if disk.starts_with("disk: active") {
        assert!(limits.contains("(project quota)"), "{limits}");
    } else {
        assert!(
            limits.contains("max_disk_bytes 4294967296 (not enforced"),
            "{limits}"
        );
    }
    assert!(ready.contains("landlock: "), "{ready}");
    assert!(!ready.contains("pasta"), "{ready}");
}
