//! Snapshots and forks (docs/snapshots.md), beside baselines in the same
//! run: a 1 GiB workspace of 10,000 files (100 directories of 100 files
//! of 104,858 random bytes) snapshotted, against `tar -c | sha256sum` of
//! the same tree; forked into 8 sessions, each from `initialize
//! {snapshot}` to its first `true` closed, against `cp -a` of the tree;
//! pushed to a local registry (Debian's `docker-registry`) and restored on
//! a second gateway (`initialize {snapshot}` to its first `true`: pull,
//! check, unpack, fork), against `skopeo copy` of the same layer each way.
//! Every layer at its default (as root).

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::json;

use super::harness::{BenchResult, Conn, Row, Server, err, ms, percentile};

const DIRS: usize = 100;
const FILES_PER_DIR: usize = 100;
const FILE_BYTES: usize = 104_858;
const FORKS: usize = 8;

/// Gateway `n`'s configuration (its own roots and snapshot store),
/// pushing to `registry` when there is one.
fn config(dir: &Path, n: usize, registry: Option<&str>) -> BenchResult<String> {
    let roots = dir.join(format!("snap-roots{n}"));
    std::fs::create_dir_all(&roots).map_err(err)?;
    let key = dir.join("snapshots.key");
    if registry.is_some() {
        std::fs::write(&key, [0x5a; 32]).map_err(err)?;
    }
    let remote = registry.map_or(String::new(), |r| {
        format!(
            "registry = \"{r}/snapshots\"\nkey_file = \"{}\"\n",
            key.display()
        )
    });
    let images = registry.map_or(String::new(), |r| {
        format!(
            "[images]\nstore = \"{}\"\nregistries = [\"{r}\"]\ninsecure_registries = [\"{r}\"]\n",
            dir.join(format!("snap-images{n}")).display()
        )
    });
    let text = format!(
        "[[auth.keys]]\nalgorithm = \"HS256\"\nsecret_file = \"{k}\"\n{images}\
         [snapshots]\nstore = \"{s}\"\nmax_tenant_bytes = 8589934592\n{remote}\
         [tenant_template]\nroot = \"{r}/{{tenant}}\"\nmax_disk_bytes = 1073741824\n\
         requests_per_second = 1000000\nburst = 1000000\n",
        k = dir.join("hs256.key").display(),
        s = dir.join(format!("snap-store{n}")).display(),
        r = roots.display(),
    );
    let path = dir.join(format!("snapshots{n}.toml"));
    std::fs::write(&path, text).map_err(err)?;
    Ok(path.display().to_string())
}

/// The workspace: `DIRS` × `FILES_PER_DIR` files of random bytes.
fn fill(root: &Path) -> BenchResult<()> {
    let mut chunk = vec![0u8; FILE_BYTES];
    for d in 0..DIRS {
        let sub = root.join(format!("d{d:03}"));
        std::fs::create_dir_all(&sub).map_err(err)?;
        for f in 0..FILES_PER_DIR {
            getrandom::fill(&mut chunk).map_err(err)?;
            std::fs::write(sub.join(format!("f{f:03}")), &chunk).map_err(err)?;
        }
    }
    Ok(())
}

fn timed_shell(script: &str) -> BenchResult<Duration> {
    let t0 = Instant::now();
    let st = Command::new("sh")
        .arg("-c")
        .arg(script)
        .stdout(std::process::Stdio::null())
        .status()
        .map_err(err)?;
    if !st.success() {
        return Err(format!("`{script}` failed: {st}"));
    }
    Ok(t0.elapsed())
}

/// `skopeo copy` with `args` (plain-HTTP registries); the time it took.
fn skopeo(args: &[&str]) -> BenchResult<Duration> {
    let t0 = Instant::now();
    let out = Command::new("/usr/bin/skopeo")
        .args([
            "copy",
            "--quiet",
            "--src-tls-verify=false",
            "--dest-tls-verify=false",
        ])
        .args(args)
        .output()
        .map_err(|e| format!("skopeo: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "skopeo copy: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(t0.elapsed())
}

fn drop_caches() {
    let _ = Command::new("sync").status();
    let _ = std::fs::write("/proc/sys/vm/drop_caches", "3");
}

pub async fn figures(exe: &Path, dir: &Path, secret: &str) -> BenchResult<Vec<Row>> {
    let tools = ["/usr/bin/docker-registry", "/usr/bin/skopeo"];
    let registry = match tools.iter().find(|t| !Path::new(t).exists()) {
        None => Some(super::images::LocalRegistry::start(dir)?),
        Some(t) => {
            eprintln!("snapshot push and restore figures skipped: {t} is not installed");
            None
        }
    };
    let reg = registry.as_ref().map(|r| r.addr.clone());
    let path = config(dir, 0, reg.as_deref())?;
    let settings = exec_gateway::config::Config::load(Path::new(&path))
        .and_then(exec_gateway::config::Config::validate)
        .map_err(err)?;
    let gw = Server::gateway(exe, &path).await?;
    let token = exec_gateway::auth::mint(
        jsonwebtoken::Algorithm::HS256,
        secret.as_bytes(),
        &settings.auth,
        "bench",
        &[
            "exec".to_owned(),
            "fs:read".to_owned(),
            "fs:write".to_owned(),
            "snapshot".to_owned(),
        ],
        Duration::from_secs(3600),
        "bench",
    )?;
    let url = format!("{}/?access_token={token}", gw.url);
    let root = dir.join("snap-roots0").join("bench");
    let cwd = root.display().to_string();
    // Activates the tenant (its root made), then the tree is written.
    let mut origin = Conn::open_in(&url, &cwd).await?;
    fill(&root)?;
    let q = |p: &Path| p.display().to_string();
    drop_caches();
    let tar = timed_shell(&format!("tar -C {} -cf - . | sha256sum", q(&root)))?;
    drop_caches();
    let t0 = Instant::now();
    let snap = origin.call("gateway/snapshot/create", json!({})).await?;
    let taken = t0.elapsed();
    let id = snap["id"].as_str().ok_or("no snapshot id")?.to_owned();
    let copy = dir.join("snap-copy");
    drop_caches();
    let cp = timed_shell(&format!("cp -a {} {}", q(&root), q(&copy)))?;
    let _ = std::fs::remove_dir_all(&copy);

    let mut each = Vec::new();
    let mut forks = Vec::new();
    for i in 0..FORKS {
        let t0 = Instant::now();
        let mut c =
            Conn::open_with(&url, &cwd, json!({"clientName": "bench", "snapshot": id})).await?;
        c.run_to_close(&format!("t{i}"), &["/bin/true"]).await?;
        each.push(t0.elapsed());
        forks.push(c);
    }
    drop(forks);
    each.sort();
    // All eight at once.
    let t0 = Instant::now();
    let mut set = tokio::task::JoinSet::new();
    for i in 0..FORKS {
        let (url, cwd, id) = (url.clone(), cwd.clone(), id.clone());
        set.spawn(async move {
            let mut c =
                Conn::open_with(&url, &cwd, json!({"clientName": "bench", "snapshot": id})).await?;
            c.run_to_close(&format!("a{i}"), &["/bin/true"]).await?;
            Ok::<_, String>(c)
        });
    }
    let mut held = Vec::new();
    while let Some(r) = set.join_next().await {
        held.push(r.map_err(err)??);
    }
    let together = t0.elapsed();
    drop(held);
    let mut rows = match &reg {
        Some(r) => anywhere(exe, dir, r, &token, &mut origin, &id).await?,
        None => Vec::new(),
    };
    drop(origin);
    drop(gw);
    let p50 = percentile(&each, 0.5);
    let gib = (DIRS * FILES_PER_DIR * FILE_BYTES) as f64 / f64::from(1u32 << 30);
    let mut first = vec![
        Row {
            figure: "fork of a 1 GiB, 10,000-file workspace: initialize {snapshot} to first `true` closed, p50 of 8",
            ours: ms(p50),
            baseline: format!("{} (`cp -a` of the tree)", ms(cp)),
            ratio: format!("{:.4}x", p50.as_secs_f64() / cp.as_secs_f64()),
            target: "<= 50 ms",
            met: Some(p50 <= Duration::from_millis(50)),
            reference: String::new(),
        },
        Row::reported(
            "8 forks at once: all 8 to their first `true` closed",
            ms(together),
            format!("{} (`cp -a` once)", ms(cp)),
            format!("{:.3}x", together.as_secs_f64() / cp.as_secs_f64()),
        ),
        Row::reported(
            "snapshot of the same workspace (cold cache), its processes frozen for the walk",
            ms(taken),
            format!(
                "{} (`tar -c | sha256sum`, cold cache; {gib:.2} GiB)",
                ms(tar)
            ),
            format!("{:.2}x", taken.as_secs_f64() / tar.as_secs_f64()),
        ),
    ];
    first.append(&mut rows);
    Ok(first)
}

/// Snapshot `id` pushed by `origin`'s gateway to the registry at `reg`,
/// then restored by a second gateway; `skopeo copy` of the same image
/// each way as the baselines.
async fn anywhere(
    exe: &Path,
    dir: &Path,
    reg: &str,
    token: &str,
    origin: &mut Conn,
    id: &str,
) -> BenchResult<Vec<Row>> {
    drop_caches();
    let t0 = Instant::now();
    let pushed = origin
        .call("gateway/snapshot/push", json!({"snapshotId": id}))
        .await?;
    let push = t0.elapsed();
    let at = pushed["pushed"].as_str().ok_or("no pushed")?;
    let repo = at.split('@').next().ok_or("no repository")?;
    let layout = dir.join("snap-skopeo");
    drop_caches();
    // Both copies keep the layer as it is (skopeo would otherwise gzip
    // an uncompressed layer on its way).
    let pull_copy = skopeo(&[
        "--dest-oci-accept-uncompressed-layers",
        &format!("docker://{repo}:{id}"),
        &format!("oci:{}:1", layout.display()),
    ])?;
    // Into a registry of its own: one that has the blob would skip it.
    let empty_dir = dir.join("snap-registry2");
    std::fs::create_dir_all(&empty_dir).map_err(err)?;
    let empty = super::images::LocalRegistry::start(&empty_dir)?;
    drop_caches();
    let push_copy = skopeo(&[
        "--preserve-digests",
        &format!("oci:{}:1", layout.display()),
        &format!("docker://{}/skopeo-copy:1", empty.addr),
    ])?;
    drop(empty);
    let _ = std::fs::remove_dir_all(&layout);
    let path = config(dir, 1, Some(reg))?;
    let second = Server::gateway(exe, &path).await?;
    let url = format!("{}/?access_token={token}", second.url);
    let cwd = dir.join("snap-roots1").join("bench").display().to_string();
    // The tenant activated (its root made) before the clock starts.
    let warm = Conn::open_in(&url, &cwd).await?;
    drop(warm);
    drop_caches();
    let t0 = Instant::now();
    let mut c = Conn::open_with(&url, &cwd, json!({"clientName": "bench", "snapshot": id})).await?;
    c.run_to_close("r", &["/bin/true"]).await?;
    let restore = t0.elapsed();
    drop(c);
    drop(second);
    Ok(vec![
        Row::reported(
            "push of the snapshot (one 1 GiB layer, made as it is sent) to a local registry, cold cache",
            ms(push),
            format!(
                "{} (`skopeo copy` of the same layer, layout to an empty registry)",
                ms(push_copy)
            ),
            format!("{:.2}x", push.as_secs_f64() / push_copy.as_secs_f64()),
        ),
        Row::reported(
            "restore on a second gateway: initialize {snapshot} to first `true` closed (pull, check, unpack, fork), cold cache",
            ms(restore),
            format!(
                "{} (`skopeo copy` of the same layer to a layout, not unpacked)",
                ms(pull_copy)
            ),
            format!("{:.2}x", restore.as_secs_f64() / pull_copy.as_secs_f64()),
        ),
    ])
}
