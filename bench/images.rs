//! Images (docs/environments.md): a new tenant whose image is in the
//! store, created and running its first `true`, one at a time and 100 at
//! once, against the same tenant without an image; a warm `true` with and
//! without; a 100 MiB image pulled from a local registry (Debian's
//! `docker-registry`) against `skopeo copy` of the same image; what the
//! store holds per image. Every layer at its default (as root).

use std::path::Path;
use std::time::{Duration, Instant};

use exec_gateway::image::layout::{self, LayerBlob};

use super::{BenchResult, Conn, Row, Server, err, ms, percentile};

/// A layer of the static busybox (`/bin/sh`, `/bin/true`, ...).
fn busybox_tar() -> BenchResult<Vec<u8>> {
    let bb = std::fs::read("/bin/busybox").map_err(|e| format!("busybox-static: {e}"))?;
    let mut b = tar::Builder::new(Vec::new());
    let mut add = |path: &str, kind: tar::EntryType, mode: u32, data: &[u8], link: &str| {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(kind);
        h.set_mode(mode);
        h.set_size(data.len() as u64);
        if !link.is_empty() {
            h.set_link_name(link)?;
        }
        b.append_data(&mut h, path, data)
    };
    add("bin", tar::EntryType::Directory, 0o755, &[], "").map_err(err)?;
    add("bin/busybox", tar::EntryType::Regular, 0o755, &bb, "").map_err(err)?;
    for tool in ["sh", "true", "cat"] {
        add(
            &format!("bin/{tool}"),
            tar::EntryType::Symlink,
            0o777,
            &[],
            "busybox",
        )
        .map_err(err)?;
    }
    b.into_inner().map_err(err)
}

/// A layer of `mib` MiB of incompressible bytes in 1 MiB files.
fn filler_tar(mib: usize) -> BenchResult<Vec<u8>> {
    let mut b = tar::Builder::new(Vec::new());
    let mut chunk = vec![0u8; 1 << 20];
    for i in 0..mib {
        getrandom::fill(&mut chunk).map_err(err)?;
        let mut h = tar::Header::new_gnu();
        h.set_mode(0o644);
        h.set_size(chunk.len() as u64);
        b.append_data(&mut h, format!("data/f{i}"), &chunk[..])
            .map_err(err)?;
    }
    b.into_inner().map_err(err)
}

/// `docker-registry` on a loopback port, storing under `dir`.
struct LocalRegistry {
    child: std::process::Child,
    addr: String,
}

impl LocalRegistry {
    fn start(dir: &Path) -> BenchResult<LocalRegistry> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(err)?
            .port();
        let addr = format!("127.0.0.1:{port}");
        let cfg = dir.join("registry.yml");
        std::fs::write(
            &cfg,
            format!(
                "version: 0.1\nlog:\n  level: error\nstorage:\n  filesystem:\n    rootdirectory: {}\nhttp:\n  addr: {addr}\n",
                dir.join("registry-data").display()
            ),
        )
        .map_err(err)?;
        let child = std::process::Command::new("/usr/bin/docker-registry")
            .arg("serve")
            .arg(&cfg)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .map_err(|e| format!("docker-registry: {e}"))?;
        let r = LocalRegistry { child, addr };
        for _ in 0..400 {
            if std::net::TcpStream::connect(&r.addr).is_ok() {
                return Ok(r);
            }
            std::thread::sleep(Duration::from_millis(25));
        }
        Err("docker-registry did not listen".to_owned())
    }

    /// `skopeo copy` from `from` to `to`; the time it took.
    fn copy(from: &str, to: &str) -> BenchResult<Duration> {
        let t0 = Instant::now();
        let out = std::process::Command::new("/usr/bin/skopeo")
            .args([
                "copy",
                "--quiet",
                "--src-tls-verify=false",
                "--dest-tls-verify=false",
                from,
                to,
            ])
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
}

impl Drop for LocalRegistry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A gateway whose template gives every tenant `image` (none: the host's
/// userland), with its store at `dir/store`.
fn config(dir: &Path, name: &str, registry: &str, image: Option<&str>) -> BenchResult<String> {
    let roots = dir.join(format!("{name}-roots"));
    std::fs::create_dir_all(&roots).map_err(err)?;
    let image = image
        .map(|i| format!("image = \"{i}\"\n"))
        .unwrap_or_default();
    let text = format!(
        "[server]\nmax_connections = 1024\nmax_sessions = 1024\nmax_active_tenants = 200\n\
         tenant_idle_timeout = \"60s\"\nmax_unauthenticated = 512\nmax_unauthenticated_per_source = 512\n\
         [exec]\nmax_processes = 512\n\
         [[auth.keys]]\nalgorithm = \"HS256\"\nsecret_file = \"{k}\"\n\
         [images]\nstore = \"{s}\"\nregistries = [\"{registry}\"]\ninsecure_registries = [\"{registry}\"]\n\
         [tenant_template]\nroot = \"{r}/{{tenant}}\"\nworkers_max = 1\nmax_open_files = 4\nmax_streams = 2\n{image}\
         requests_per_second = 1000000\nburst = 1000000\n",
        k = dir.join("hs256.key").display(),
        s = dir.join(format!("{name}-store")).display(),
        r = roots.display(),
    );
    let path = dir.join(format!("{name}.toml"));
    std::fs::write(&path, text).map_err(err)?;
    Ok(path.display().to_string())
}

struct Cold {
    /// Held: the gateway runs while this lives.
    _server: Server,
    at: std::sync::Arc<Target>,
}

/// What a sample needs: where to connect, how to mint, the roots.
struct Target {
    url: String,
    settings: exec_gateway::config::Settings,
    roots: std::path::PathBuf,
}

impl Target {
    fn url(&self, secret: &str, t: &str) -> BenchResult<String> {
        let token = super::all_scopes_token(
            secret,
            &self.settings,
            t,
            Duration::from_secs(3600),
            "bench",
        )?;
        Ok(format!("{}/?access_token={token}", self.url))
    }

    /// Tenant `t`: connect (activating it) to its first `true` closed.
    async fn first_true(&self, secret: &str, t: &str) -> BenchResult<Duration> {
        let url = self.url(secret, t)?;
        let cwd = self.roots.join(t).display().to_string();
        let t0 = Instant::now();
        let mut c = Conn::open_in(&url, &cwd).await?;
        c.run_to_close("p", &["/bin/true"]).await?;
        Ok(t0.elapsed())
    }
}

impl Cold {
    async fn start(
        exe: &Path,
        dir: &Path,
        name: &str,
        registry: &str,
        image: Option<&str>,
    ) -> BenchResult<Cold> {
        let path = config(dir, name, registry, image)?;
        let settings = exec_gateway::config::Config::load(Path::new(&path))
            .and_then(exec_gateway::config::Config::validate)
            .map_err(err)?;
        let gw = Server::gateway(exe, &path).await?;
        Ok(Cold {
            at: std::sync::Arc::new(Target {
                url: gw.url.clone(),
                settings,
                roots: dir.join(format!("{name}-roots")),
            }),
            _server: gw,
        })
    }

    async fn first_true(&self, secret: &str, t: &str) -> BenchResult<Duration> {
        self.at.first_true(secret, t).await
    }

    /// p50 of `n` new tenants one at a time, and of `n_at_once` at once.
    async fn cold(
        &self,
        secret: &str,
        tag: &str,
        n: usize,
        n_at_once: usize,
    ) -> BenchResult<(Duration, Duration)> {
        let mut one = Vec::new();
        for i in 0..n {
            one.push(self.first_true(secret, &format!("{tag}s{i}")).await?);
        }
        one.sort();
        let mut set = tokio::task::JoinSet::new();
        for i in 0..n_at_once {
            let (at, secret, t) = (self.at.clone(), secret.to_owned(), format!("{tag}c{i}"));
            set.spawn(async move { at.first_true(&secret, &t).await });
        }
        let mut many = Vec::new();
        while let Some(r) = set.join_next().await {
            many.push(r.map_err(err)??);
        }
        many.sort();
        Ok((percentile(&one, 0.5), percentile(&many, 0.5)))
    }
}

/// Warm `true`, start to closed, p50 of `n` in one session of tenant `t`.
async fn warm(cold: &Cold, secret: &str, t: &str, n: usize) -> BenchResult<Duration> {
    let url = cold.at.url(secret, t)?;
    let mut c = Conn::open_in(&url, &cold.at.roots.join(t).display().to_string()).await?;
    let mut v = Vec::new();
    for i in 0..n {
        let t0 = Instant::now();
        c.run_to_close(&format!("w{i}"), &["/bin/true"]).await?;
        v.push(t0.elapsed());
    }
    v.sort();
    Ok(percentile(&v, 0.5))
}

fn du(p: &Path) -> u64 {
    let mut total = 0;
    let mut stack = vec![p.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            match e.file_type() {
                Ok(t) if t.is_dir() => stack.push(e.path()),
                Ok(t) if t.is_file() => total += e.metadata().map(|m| m.len()).unwrap_or(0),
                _ => {}
            }
        }
    }
    total
}

pub async fn figures(exe: &Path, dir: &Path, secret: &str) -> BenchResult<Vec<Row>> {
    for tool in [
        "/usr/bin/docker-registry",
        "/usr/bin/skopeo",
        "/bin/busybox",
    ] {
        if !Path::new(tool).exists() {
            return Err(format!(
                "the image figures need {tool} (apt-get install docker-registry skopeo busybox-static)"
            ));
        }
    }
    let registry = LocalRegistry::start(dir)?;
    let r = registry.addr.clone();
    // The small image every cold tenant runs, and a 100 MiB one.
    let small = dir.join("layout-small");
    layout::write(
        &small,
        "1",
        &[LayerBlob::gzip(&busybox_tar()?).map_err(err)?],
        &["PATH=/bin".to_owned()],
    )
    .map_err(err)?;
    LocalRegistry::copy(
        &format!("oci:{}:1", small.display()),
        &format!("docker://{r}/bench/small:1"),
    )?;
    let big = dir.join("layout-big");
    layout::write(
        &big,
        "1",
        &[
            LayerBlob::gzip(&busybox_tar()?).map_err(err)?,
            LayerBlob::tar(filler_tar(100)?),
        ],
        &["PATH=/bin".to_owned()],
    )
    .map_err(err)?;
    LocalRegistry::copy(
        &format!("oci:{}:1", big.display()),
        &format!("docker://{r}/bench/big:1"),
    )?;

    let mut rows = Vec::new();
    let (samples, at_once) = (50, 100);
    // Without an image: the baseline of the same machinery.
    let plain = Cold::start(exe, dir, "plain", &r, None).await?;
    plain.first_true(secret, "prime").await?;
    let (p_one, p_many) = plain.cold(secret, "p", samples, at_once).await?;
    let p_warm = warm(&plain, secret, "prime", 200).await?;
    drop(plain);
    let with = Cold::start(exe, dir, "image", &r, Some(&format!("{r}/bench/small:1"))).await?;
    // The first tenant pulls; every later one finds the image in the store.
    with.first_true(secret, "prime").await?;
    let (i_one, i_many) = with.cold(secret, "i", samples, at_once).await?;
    let i_warm = warm(&with, secret, "prime", 200).await?;
    let store_small = du(&dir.join("image-store").join("layers"));
    drop(with);
    rows.push(Row {
        figure: "new tenant with a cached image: connect to first `true` closed p50",
        ours: ms(i_one),
        baseline: format!("{} (same tenant, no image)", ms(p_one)),
        ratio: format!("{:.2}x", i_one.as_secs_f64() / p_one.as_secs_f64()),
        target: "<= 30 ms",
        met: Some(i_one <= Duration::from_millis(30)),
        reference: String::new(),
    });
    rows.push(Row {
        figure: "100 new tenants at once with a cached image: first `true` closed p50",
        ours: ms(i_many),
        baseline: format!("{} (no image)", ms(p_many)),
        ratio: format!("{:.2}x", i_many.as_secs_f64() / p_many.as_secs_f64()),
        target: "<= 100 ms",
        met: Some(i_many <= Duration::from_millis(100)),
        reference: String::new(),
    });
    let over = i_warm.as_secs_f64() / p_warm.as_secs_f64();
    rows.push(Row {
        figure: "warm `true` start to closed p50, with an image",
        ours: ms(i_warm),
        baseline: format!("{} (no image)", ms(p_warm)),
        ratio: format!("{over:.2}x"),
        target: "within 5%",
        met: Some(over <= 1.05),
        reference: String::new(),
    });
    // The 100 MiB pull: a fresh store, one tenant, against skopeo.
    let pulling = Cold::start(exe, dir, "big", &r, Some(&format!("{r}/bench/big:1"))).await?;
    let t0 = Instant::now();
    pulling.first_true(secret, "first").await?;
    let pull = t0.elapsed();
    let store_big = du(&dir.join("big-store").join("layers"));
    drop(pulling);
    let skopeo = LocalRegistry::copy(
        &format!("docker://{r}/bench/big:1"),
        &format!("oci:{}:1", dir.join("skopeo-copy").display()),
    )?;
    rows.push(Row {
        figure: "100 MiB image: pulled, unpacked and first `true` closed",
        ours: ms(pull),
        baseline: format!("{} (skopeo copy to a layout, not unpacked)", ms(skopeo)),
        ratio: format!("{:.2}x", pull.as_secs_f64() / skopeo.as_secs_f64()),
        target: "(reported)",
        met: None,
        reference: String::new(),
    });
    rows.push(Row::reported(
        "store bytes per image (unpacked), any number of tenants on it",
        format!(
            "{:.1} MiB (100 MiB image)",
            store_big as f64 / f64::from(1 << 20)
        ),
        format!(
            "{:.2} MiB (busybox image)",
            store_small as f64 / f64::from(1 << 20)
        ),
        "per tenant: one overlay mount, 0 bytes".to_owned(),
    ));
    Ok(rows)
}
