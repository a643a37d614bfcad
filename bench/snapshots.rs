//! Snapshots and forks (docs/snapshots.md), beside baselines in the same
//! run: a 1 GiB workspace of 10,000 files (100 directories of 100 files
//! of 104,858 random bytes) snapshotted, against `tar -c | sha256sum` of
//! the same tree; forked into 8 sessions, each from `initialize
//! {snapshot}` to its first `true` closed, against `cp -a` of the tree.
//! Every layer at its default (as root).

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::json;

use super::{BenchResult, Conn, Row, Server, err, ms, percentile};

const DIRS: usize = 100;
const FILES_PER_DIR: usize = 100;
const FILE_BYTES: usize = 104_858;
const FORKS: usize = 8;

fn config(dir: &Path) -> BenchResult<String> {
    let roots = dir.join("snap-roots");
    std::fs::create_dir_all(&roots).map_err(err)?;
    let text = format!(
        "[[auth.keys]]\nalgorithm = \"HS256\"\nsecret_file = \"{k}\"\n\
         [snapshots]\nstore = \"{s}\"\nmax_tenant_bytes = 8589934592\n\
         [tenant_template]\nroot = \"{r}/{{tenant}}\"\nmax_disk_bytes = 1073741824\n\
         requests_per_second = 1000000\nburst = 1000000\n",
        k = dir.join("hs256.key").display(),
        s = dir.join("snap-store").display(),
        r = roots.display(),
    );
    let path = dir.join("snapshots.toml");
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

fn drop_caches() {
    let _ = Command::new("sync").status();
    let _ = std::fs::write("/proc/sys/vm/drop_caches", "3");
}

pub async fn figures(exe: &Path, dir: &Path, secret: &str) -> BenchResult<Vec<Row>> {
    let path = config(dir)?;
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
    let root = dir.join("snap-roots").join("bench");
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
    drop(origin);
    drop(gw);
    let p50 = percentile(&each, 0.5);
    let gib = (DIRS * FILES_PER_DIR * FILE_BYTES) as f64 / f64::from(1u32 << 30);
    Ok(vec![
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
    ])
}
