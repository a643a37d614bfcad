//! Images (docs/environments.md): a new tenant whose image is in the
//! store, created and running its first `true`, one at a time and 100 at
//! once, against the same tenant without an image; a warm `true` with and
//! without; a 100 MiB image pulled from a local registry (Debian's
//! `docker-registry`) against `skopeo copy` of the same image; what the
//! store holds per image; a realistic image (a minbase Debian root made by
//! `mmdebstrap` from Debian's packages, the suite pinned) pulled, unpacked
//! and running `dpkg --version` against `skopeo copy`, a warm `true` in it
//! and its store bytes. Every layer at its default (as root).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use exec_gateway::image::layout::{self, LayerBlob};

use super::harness::{BenchResult, Conn, Row, Server, err, ms, percentile};

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
pub(super) struct LocalRegistry {
    child: std::process::Child,
    pub(super) addr: String,
}

impl LocalRegistry {
    pub(super) fn start(dir: &Path) -> BenchResult<LocalRegistry> {
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
         tenant_idle_timeout = \"60s\"\nhandshake_timeout = \"120s\"\nmax_unauthenticated = 512\nmax_unauthenticated_per_source = 512\n\
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
        let token = super::harness::all_scopes_token(
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

    /// Tenant `t`: connect (activating it) to its first `argv` closed; the
    /// time and what it printed.
    async fn first_output(
        &self,
        secret: &str,
        t: &str,
        argv: &[&str],
    ) -> BenchResult<(Duration, String)> {
        let url = self.url(secret, t)?;
        let cwd = self.roots.join(t).display().to_string();
        let t0 = Instant::now();
        let mut c = Conn::open_in(&url, &cwd).await?;
        let out = output_of(&mut c, "p", argv).await?;
        Ok((t0.elapsed(), out))
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

/// Start `argv` in `c`'s session and read its events to the close: what
/// it printed (stdout and stderr); an error unless it exited 0.
async fn output_of(c: &mut Conn, pid: &str, argv: &[&str]) -> BenchResult<String> {
    use serde_json::{Value, json};
    let id = c
        .send(
            "process/start",
            json!({"processId": pid, "argv": argv, "cwd": c.cwd,
                   "env": {"PATH": "/usr/bin:/bin"}, "tty": false}),
        )
        .await?;
    let (mut out, mut code) = (Vec::new(), None);
    loop {
        let v: Value = serde_json::from_str(&c.next_text().await?).map_err(err)?;
        if v.get("id") == Some(&json!(id))
            && let Some(e) = v.get("error")
        {
            return Err(format!("{argv:?}: start failed: {e}"));
        }
        let p = &v["params"];
        if p["processId"] != pid {
            continue;
        }
        match v["method"].as_str() {
            Some("process/output") => {
                if let Some(chunk) = p["chunk"].as_str() {
                    base64_simd::STANDARD
                        .decode_append(chunk, &mut out)
                        .map_err(err)?;
                }
            }
            Some("process/exited") => code = p["exitCode"].as_i64(),
            Some("process/closed") => break,
            _ => {}
        }
    }
    let text = String::from_utf8_lossy(&out).into_owned();
    if code != Some(0) {
        return Err(format!("{argv:?} exited {code:?}: {text}"));
    }
    Ok(text)
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
    rows.extend(debian(exe, dir, secret, &r, p_warm).await?);
    Ok(rows)
}

/// The Debian suite of the realistic image, pinned: a rerun measures the
/// same release.
macro_rules! debian_suite {
    () => {
        "bookworm"
    };
}

const DEBIAN_MIRROR: &str = "http://deb.debian.org/debian";

fn mib(bytes: u64) -> f64 {
    bytes as f64 / f64::from(1 << 20)
}

/// Where the Debian root is kept between runs (the bench's own directory
/// goes at its end): `$XDG_CACHE_HOME/exec-gateway-bench`, else
/// `~/.cache/exec-gateway-bench`.
fn cache_dir(dir: &Path) -> PathBuf {
    std::env::var_os("XDG_CACHE_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .map_or_else(|| dir.join("cache"), |c| c.join("exec-gateway-bench"))
}

/// The minbase Debian root as a tar: made once by `mmdebstrap` from
/// Debian's packages, its device nodes in `/dev` taken out by
/// `mmtarfilter` (registry images have none, and the store refuses them),
/// then taken from the cache. `Err`: why it cannot be had here.
fn debian_root(dir: &Path) -> Result<PathBuf, String> {
    use std::process::{Command, Stdio};
    let arch = exec_gateway::image::fetch::arch();
    let cache = cache_dir(dir);
    let tar = cache.join(format!("debian-{}-minbase-{arch}.tar", debian_suite!()));
    if tar.exists() {
        return Ok(tar);
    }
    for tool in ["/usr/bin/mmdebstrap", "/usr/bin/mmtarfilter"] {
        if !Path::new(tool).exists() {
            return Err(format!(
                "{tool} is not installed (apt-get install mmdebstrap)"
            ));
        }
    }
    std::fs::create_dir_all(&cache).map_err(|e| format!("{}: {e}", cache.display()))?;
    let (raw, filtered) = (
        cache.join("debian.partial-raw.tar"),
        cache.join("debian.partial.tar"),
    );
    eprintln!(
        "making a minbase Debian {} root with mmdebstrap from {DEBIAN_MIRROR} (once: kept as {})",
        debian_suite!(),
        tar.display()
    );
    let made = Command::new("/usr/bin/mmdebstrap")
        .args([
            "--variant=minbase",
            "--format=tar",
            "--quiet",
            debian_suite!(),
        ])
        .arg(&raw)
        .arg(DEBIAN_MIRROR)
        .stdin(Stdio::null())
        .status()
        .map_err(|e| format!("mmdebstrap: {e}"))?;
    if !made.success() {
        let _ = std::fs::remove_file(&raw);
        return Err(format!("mmdebstrap {}: {made}", debian_suite!()));
    }
    let io = |e: std::io::Error| format!("{}: {e}", cache.display());
    let filter = Command::new("/usr/bin/mmtarfilter")
        .arg("--path-exclude=/dev/*")
        .stdin(std::fs::File::open(&raw).map_err(io)?)
        .stdout(std::fs::File::create(&filtered).map_err(io)?)
        .status()
        .map_err(|e| format!("mmtarfilter: {e}"));
    let _ = std::fs::remove_file(&raw);
    match filter {
        Ok(s) if s.success() => {}
        Ok(s) => {
            let _ = std::fs::remove_file(&filtered);
            return Err(format!("mmtarfilter: {s}"));
        }
        Err(e) => return Err(e),
    }
    std::fs::rename(&filtered, &tar).map_err(io)?;
    Ok(tar)
}

/// The realistic image: a minbase Debian root (one gzip layer, as
/// registries serve it) pushed to the local registry; a fresh store pulls
/// and unpacks it and runs `dpkg --version` (proof it is Debian) against
/// `skopeo copy` of the same image; a warm `true` in it against `warm`
/// (no image); its store bytes. No rows (the reason printed) when the root
/// cannot be made here.
async fn debian(
    exe: &Path,
    dir: &Path,
    secret: &str,
    registry: &str,
    no_image_warm: Duration,
) -> BenchResult<Vec<Row>> {
    let root = match debian_root(dir) {
        Ok(p) => p,
        Err(why) => {
            eprintln!("Debian image figures skipped: {why}");
            return Ok(Vec::new());
        }
    };
    let tar = std::fs::read(&root).map_err(|e| format!("{}: {e}", root.display()))?;
    let tar_bytes = tar.len() as u64;
    let layer = LayerBlob::gzip(&tar).map_err(err)?;
    drop(tar);
    let gzip_bytes = layer.blob.len() as u64;
    let layout_dir = dir.join("layout-debian");
    layout::write(
        &layout_dir,
        debian_suite!(),
        &[layer],
        &["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".to_owned()],
    )
    .map_err(err)?;
    let reference = format!("{registry}/bench/debian:{}", debian_suite!());
    LocalRegistry::copy(
        &format!("oci:{}:{}", layout_dir.display(), debian_suite!()),
        &format!("docker://{reference}"),
    )?;
    let cold = Cold::start(exe, dir, "debian", registry, Some(&reference)).await?;
    let (pull, version) = cold
        .at
        .first_output(secret, "first", &["/usr/bin/dpkg", "--version"])
        .await?;
    if !version.contains("Debian") {
        return Err(format!("`dpkg --version` in the Debian image: {version:?}"));
    }
    let d_warm = warm(&cold, secret, "first", 200).await?;
    let store = du(&dir.join("debian-store").join("layers"));
    drop(cold);
    let skopeo = LocalRegistry::copy(
        &format!("docker://{reference}"),
        &format!("oci:{}:1", dir.join("skopeo-debian").display()),
    )?;
    eprintln!(
        "Debian image: {} minbase {} by mmdebstrap from {DEBIAN_MIRROR}: {:.1} MiB tar, \
         {:.1} MiB gzip layer; in it, `dpkg --version`: {}",
        debian_suite!(),
        exec_gateway::image::fetch::arch(),
        mib(tar_bytes),
        mib(gzip_bytes),
        version.lines().next().unwrap_or_default()
    );
    let over = d_warm.as_secs_f64() / no_image_warm.as_secs_f64();
    Ok(vec![
        Row {
            figure: concat!(
                "Debian ",
                debian_suite!(),
                " minbase image: pulled, unpacked, first `dpkg --version` closed"
            ),
            ours: ms(pull),
            baseline: format!("{} (skopeo copy to a layout, not unpacked)", ms(skopeo)),
            ratio: format!("{:.2}x", pull.as_secs_f64() / skopeo.as_secs_f64()),
            target: "(reported)",
            met: None,
            reference: String::new(),
        },
        Row {
            figure: concat!(
                "warm `true` start to closed p50, in the Debian ",
                debian_suite!(),
                " image"
            ),
            ours: ms(d_warm),
            baseline: format!("{} (no image)", ms(no_image_warm)),
            ratio: format!("{over:.2}x"),
            target: "within 5%",
            met: Some(over <= 1.05),
            reference: String::new(),
        },
        Row::reported(
            concat!(
                "store bytes, Debian ",
                debian_suite!(),
                " minbase image (unpacked)"
            ),
            format!("{:.1} MiB", mib(store)),
            format!(
                "{:.1} MiB its tar ({:.1} MiB gzip pulled)",
                mib(tar_bytes),
                mib(gzip_bytes)
            ),
            format!("{:.2}x", store as f64 / tar_bytes as f64),
        ),
    ])
}
