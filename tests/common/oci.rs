//! Images the tests make from files (OCI layouts written here: blobs,
//! config, manifest, index), a real registry (Debian's `docker-registry`)
//! started on loopback, and `skopeo` to push layouts into it.

#![allow(dead_code)]

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use sha2::Digest as _;

pub fn sha256_hex(b: &[u8]) -> String {
    sha2::Sha256::digest(b)
        .iter()
        .map(|x| format!("{x:02x}"))
        .collect()
}

/// One entry of a layer.
pub enum Entry<'a> {
    File(&'a str, u32, Vec<u8>),
    Dir(&'a str, u32),
    Symlink(&'a str, &'a str),
    Hardlink(&'a str, &'a str),
    /// A raw header: type, name and link name as given (hostile cases).
    Raw(tar::EntryType, &'a str, &'a str, Vec<u8>),
}

/// A layer's tar from its entries.
pub fn layer(entries: &[Entry<'_>]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for e in entries {
        let mut h = tar::Header::new_gnu();
        let (kind, name, link, data, mode) = match e {
            Entry::File(n, m, d) => (tar::EntryType::Regular, *n, "", d.clone(), *m),
            Entry::Dir(n, m) => (tar::EntryType::Directory, *n, "", Vec::new(), *m),
            Entry::Symlink(n, t) => (tar::EntryType::Symlink, *n, *t, Vec::new(), 0o777),
            Entry::Hardlink(n, t) => (tar::EntryType::Link, *n, *t, Vec::new(), 0o644),
            Entry::Raw(k, n, t, d) => (*k, *n, *t, d.clone(), 0o644),
        };
        h.set_entry_type(kind);
        h.set_mode(mode);
        h.set_size(data.len() as u64);
        h.set_mtime(1_700_000_000);
        // Raw names: `set_path` refuses `..` and absolute paths.
        let old = h.as_old_mut();
        old.name[..name.len()].copy_from_slice(name.as_bytes());
        old.linkname[..link.len()].copy_from_slice(link.as_bytes());
        h.set_cksum();
        b.append(&h, &data[..]).unwrap();
    }
    b.into_inner().unwrap()
}

/// The static busybox as a layer: `bin/busybox` and `bin/sh`, `bin/ls`,
/// ... linked to it, plus `marker` naming the image.
pub fn busybox_layer(marker: &str) -> Vec<u8> {
    let bb = std::fs::read("/bin/busybox").expect("busybox-static (/bin/busybox)");
    let mut entries = vec![
        Entry::Dir("bin", 0o755),
        Entry::File("bin/busybox", 0o755, bb),
        Entry::Dir("usr", 0o755),
        Entry::Dir("usr/share", 0o755),
        Entry::File("usr/share/marker", 0o644, marker.as_bytes().to_vec()),
        Entry::Dir("etc", 0o755),
        Entry::File(
            "etc/os-release",
            0o644,
            format!("ID={marker}\n").into_bytes(),
        ),
    ];
    for tool in [
        "sh", "ls", "cat", "id", "touch", "echo", "env", "pwd", "mkdir", "true", "stat", "sleep",
        "readlink", "wc", "head",
    ] {
        entries.push(Entry::Symlink(
            Box::leak(format!("bin/{tool}").into_boxed_str()),
            "busybox",
        ));
    }
    layer(&entries)
}

pub fn gzip(b: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    e.write_all(b).unwrap();
    e.finish().unwrap()
}

/// A layer as it goes into an image: its bytes as stored and the media type.
pub struct Layer {
    pub blob: Vec<u8>,
    pub media_type: &'static str,
    /// The diff_id the config names (the uncompressed tar's digest,
    /// unless a test lies).
    pub diff_id: String,
}

impl Layer {
    pub fn gzip(tar: &[u8]) -> Layer {
        Layer {
            blob: gzip(tar),
            media_type: "application/vnd.oci.image.layer.v1.tar+gzip",
            diff_id: format!("sha256:{}", sha256_hex(tar)),
        }
    }

    pub fn plain(tar: &[u8]) -> Layer {
        Layer {
            blob: tar.to_vec(),
            media_type: "application/vnd.oci.image.layer.v1.tar",
            diff_id: format!("sha256:{}", sha256_hex(tar)),
        }
    }
}

/// Write an OCI image layout at `dir` holding one image tagged `tag`
/// with `layers` and `env`; returns the manifest's digest.
pub fn write_layout(dir: &Path, tag: &str, layers: &[Layer], env: &[&str]) -> String {
    let blobs = dir.join("blobs/sha256");
    std::fs::create_dir_all(&blobs).unwrap();
    let put = |b: &[u8]| {
        let h = sha256_hex(b);
        std::fs::write(blobs.join(&h), b).unwrap();
        (format!("sha256:{h}"), b.len())
    };
    let config = serde_json::json!({
        "architecture": "amd64",
        "os": "linux",
        "config": {"Env": env, "WorkingDir": "/"},
        "rootfs": {"type": "layers", "diff_ids": layers.iter().map(|l| l.diff_id.clone()).collect::<Vec<_>>()},
    });
    let config = serde_json::to_vec(&config).unwrap();
    let (config_digest, config_size) = put(&config);
    let layer_descs: Vec<_> = layers
        .iter()
        .map(|l| {
            let (d, n) = put(&l.blob);
            serde_json::json!({"mediaType": l.media_type, "digest": d, "size": n})
        })
        .collect();
    let manifest = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": config_digest, "size": config_size},
        "layers": layer_descs,
    });
    let manifest = serde_json::to_vec(&manifest).unwrap();
    let (manifest_digest, manifest_size) = put(&manifest);
    let index = serde_json::json!({
        "schemaVersion": 2,
        "manifests": [{
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": manifest_digest, "size": manifest_size,
            "annotations": {"org.opencontainers.image.ref.name": tag},
        }],
    });
    std::fs::write(dir.join("index.json"), serde_json::to_vec(&index).unwrap()).unwrap();
    std::fs::write(dir.join("oci-layout"), br#"{"imageLayoutVersion":"1.0.0"}"#).unwrap();
    manifest_digest
}

/// Why a test that needs the registry cannot run here, if it cannot.
pub fn registry_missing() -> Option<&'static str> {
    for (bin, why) in [
        (
            "/usr/bin/docker-registry",
            "docker-registry is not installed (apt-get install docker-registry)",
        ),
        (
            "/usr/bin/skopeo",
            "skopeo is not installed (apt-get install skopeo)",
        ),
        ("/bin/busybox", "busybox-static is not installed"),
    ] {
        if !Path::new(bin).exists() {
            return Some(why);
        }
    }
    None
}

/// A `docker-registry` on loopback, plain HTTP, storing under its own
/// directory; stopped when dropped.
pub struct TestRegistry {
    child: Child,
    pub addr: String,
    pub dir: tempfile::TempDir,
}

impl TestRegistry {
    pub fn start() -> TestRegistry {
        Self::start_configured(&RegistryConfig::default())
    }

    /// Push the layout at `layout` (tag `tag`) as `repo:tag`.
    pub fn push(&self, layout: &Path, tag: &str, repo: &str) {
        let out = Command::new("/usr/bin/skopeo")
            .args(["copy", "--quiet", "--dest-tls-verify=false"])
            .arg(format!("oci:{}:{tag}", layout.display()))
            .arg(format!("docker://{}/{repo}:{tag}", self.addr))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "skopeo copy: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    pub fn reference(&self, repo: &str, tag: &str) -> String {
        format!("{}/{repo}:{tag}", self.addr)
    }
}

impl Drop for TestRegistry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A busybox image with `marker`, written as a layout under `dir`.
pub fn busybox_layout(dir: &Path, marker: &str) -> PathBuf {
    let layout = dir.join(format!("layout-{marker}"));
    write_layout(
        &layout,
        "v1",
        &[Layer::gzip(&busybox_layer(marker))],
        &["PATH=/bin", &format!("IMAGE_MARKER={marker}")],
    );
    layout
}

/// How a [`TestRegistry::start_configured`] registry serves.
#[derive(Default)]
pub struct RegistryConfig<'a> {
    /// `docker-registry`'s log level (`info` logs every request).
    pub log_level: Option<&'a str>,
    /// A certificate and key (PEM files) to serve HTTPS with.
    pub tls: Option<(&'a Path, &'a Path)>,
    /// An htpasswd (bcrypt) file: basic authentication for every request.
    pub htpasswd: Option<&'a Path>,
}

impl TestRegistry {
    /// A `docker-registry` on loopback as `config` says (HTTPS, basic
    /// authentication, its log level); stopped when dropped.
    pub fn start_configured(config: &RegistryConfig<'_>) -> TestRegistry {
        let dir = tempfile::tempdir().unwrap();
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let addr = format!("127.0.0.1:{port}");
        let mut yaml = format!(
            "version: 0.1\nlog:\n  level: {}\nstorage:\n  filesystem:\n    rootdirectory: {}/data\n  delete:\n    enabled: true\nhttp:\n  addr: {addr}\n",
            config.log_level.unwrap_or("warn"),
            dir.path().display()
        );
        if let Some((cert, key)) = config.tls {
            yaml.push_str(&format!(
                "  tls:\n    certificate: {}\n    key: {}\n",
                cert.display(),
                key.display()
            ));
        }
        if let Some(file) = config.htpasswd {
            yaml.push_str(&format!(
                "auth:\n  htpasswd:\n    realm: exec-gateway-test\n    path: {}\n",
                file.display()
            ));
        }
        let cfg = dir.path().join("config.yml");
        std::fs::write(&cfg, yaml).unwrap();
        let mut child = Command::new("/usr/bin/docker-registry")
            .arg("serve")
            .arg(&cfg)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.path().join("registry.log")).unwrap())
            .spawn()
            .unwrap();
        for _ in 0..200 {
            if std::net::TcpStream::connect(&addr).is_ok() {
                return TestRegistry { child, addr, dir };
            }
            std::thread::sleep(std::time::Duration::from_millis(25));
        }
        let _ = child.kill();
        let _ = child.wait();
        panic!(
            "docker-registry did not listen on {addr}: {}",
            registry_log_of(dir.path())
        );
    }

    /// [`TestRegistry::push`] with `user:password` (HTTPS unverified).
    pub fn push_with_creds(&self, layout: &Path, tag: &str, repo: &str, creds: &str) {
        let out = Command::new("/usr/bin/skopeo")
            .args(["copy", "--quiet", "--dest-tls-verify=false", "--dest-creds"])
            .arg(creds)
            .arg(format!("oci:{}:{tag}", layout.display()))
            .arg(format!("docker://{}/{repo}:{tag}", self.addr))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "skopeo copy: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// What the registry has logged so far.
    pub fn log(&self) -> String {
        registry_log_of(self.dir.path())
    }
}

fn registry_log_of(dir: &Path) -> String {
    std::fs::read_to_string(dir.join("registry.log")).unwrap_or_default()
}

/// The digests of the layers of the image tagged `tag` in the layout at
/// `layout`, bottom first.
pub fn layer_digests(layout: &Path, tag: &str) -> Vec<String> {
    let read = |p: PathBuf| -> serde_json::Value {
        serde_json::from_slice(&std::fs::read(p).unwrap()).unwrap()
    };
    let index = read(layout.join("index.json"));
    let manifest = index["manifests"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["annotations"]["org.opencontainers.image.ref.name"] == tag)
        .unwrap_or_else(|| panic!("no manifest tagged {tag} in {}", layout.display()));
    let digest = manifest["digest"].as_str().unwrap();
    let manifest = read(
        layout
            .join("blobs/sha256")
            .join(digest.trim_start_matches("sha256:")),
    );
    manifest["layers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["digest"].as_str().unwrap().to_owned())
        .collect()
}

/// Successful GETs of blob `digest` in a registry log (at level info).
pub fn blob_gets(log: &str, digest: &str) -> usize {
    log.lines()
        .filter(|l| {
            l.contains("msg=\"response completed\"")
                && l.contains("http.request.method=GET ")
                && l.contains(&format!("/blobs/{digest}"))
        })
        .count()
}

// === Hostile images and the store's state (tests/images.rs) ===

/// Why a test that needs only `/bin/busybox` cannot run here.
pub fn busybox_missing() -> Option<&'static str> {
    (!Path::new("/bin/busybox").exists()).then_some("busybox-static is not installed")
}

/// This host's architecture as image configs name it.
pub fn host_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    }
}

/// Where blob `bytes` lies in the layout at `layout`.
pub fn blob_path(layout: &Path, bytes: &[u8]) -> PathBuf {
    layout.join("blobs/sha256").join(sha256_hex(bytes))
}

/// Change one byte of the file at `path` (its size stays).
pub fn tamper(path: &Path) {
    let mut b = std::fs::read(path).unwrap();
    let i = b.len() / 2;
    b[i] ^= 0x55;
    std::fs::write(path, b).unwrap();
}

/// Rewrite the config of the image tagged `tag` in the layout at
/// `layout` with `edit`, and its manifest and index to name the new one.
pub fn edit_config(layout: &Path, tag: &str, edit: impl FnOnce(&mut serde_json::Value)) {
    let blobs = layout.join("blobs/sha256");
    let read = |d: &str| -> serde_json::Value {
        serde_json::from_slice(&std::fs::read(blobs.join(d.trim_start_matches("sha256:"))).unwrap())
            .unwrap()
    };
    let put = |v: &serde_json::Value| {
        let b = serde_json::to_vec(v).unwrap();
        std::fs::write(blobs.join(sha256_hex(&b)), &b).unwrap();
        (format!("sha256:{}", sha256_hex(&b)), b.len())
    };
    let index_path = layout.join("index.json");
    let mut index: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&index_path).unwrap()).unwrap();
    let entry = index["manifests"]
        .as_array_mut()
        .unwrap()
        .iter_mut()
        .find(|m| m["annotations"]["org.opencontainers.image.ref.name"] == tag)
        .unwrap();
    let mut manifest = read(entry["digest"].as_str().unwrap());
    let mut config = read(manifest["config"]["digest"].as_str().unwrap());
    edit(&mut config);
    let (d, n) = put(&config);
    manifest["config"]["digest"] = d.into();
    manifest["config"]["size"] = n.into();
    let (d, n) = put(&manifest);
    entry["digest"] = d.into();
    entry["size"] = n.into();
    std::fs::write(&index_path, serde_json::to_vec(&index).unwrap()).unwrap();
}

/// The layout at `layout` as an `oci-archive` (a tar of it) at `file`.
pub fn archive(layout: &Path, file: &Path) {
    let mut b = tar::Builder::new(std::fs::File::create(file).unwrap());
    b.append_dir_all(".", layout).unwrap();
    b.into_inner().unwrap().sync_all().unwrap();
}

/// The gateway binary run with its stderr appended to `gateway.log` in
/// its directory (`XDG_STATE_HOME` is `DIR/state`): a script written once.
fn logging_wrapper() -> PathBuf {
    let bin = env!("CARGO_BIN_EXE_exec-gateway");
    let script = format!(
        "#!/bin/sh\n# exec-gateway, its stderr kept at info level whatever RUST_LOG says (the tests read it; tests/common/oci.rs)\n\
         RUST_LOG=info exec '{bin}' \"$@\" 2>>\"${{XDG_STATE_HOME%/state}}/gateway.log\"\n"
    );
    let path = Path::new(env!("CARGO_TARGET_TMPDIR")).join("exec-gateway-logged.sh");
    if std::fs::read_to_string(&path).ok().as_deref() != Some(script.as_str()) {
        use std::os::unix::fs::PermissionsExt as _;
        // Written beside and renamed in: a concurrent test binary runs
        // either the old script or the new one, never half of one.
        let tmp = path.with_extension(format!("{}.new", std::process::id()));
        std::fs::write(&tmp, &script).unwrap();
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::rename(&tmp, &path).unwrap();
    }
    path
}

/// [`super::Gateway::start_with`], logging JSON into `DIR/gateway.log`
/// (read with [`gateway_log`]).
pub fn start_logged(config: impl FnOnce(&Path) -> String) -> super::Gateway {
    super::Gateway::launch(
        &logging_wrapper(),
        None,
        &["--log-format".to_owned(), "json".to_owned()],
        config,
    )
}

/// The JSON lines a [`start_logged`] gateway has logged so far.
pub fn gateway_log(gw: &super::Gateway) -> Vec<serde_json::Value> {
    std::fs::read_to_string(gw.dir.path().join("gateway.log"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

/// The `error` of the last "image unavailable" line logged for `tenant`.
pub fn image_error(gw: &super::Gateway, tenant: &str) -> Option<String> {
    gateway_log(gw)
        .iter()
        .rev()
        .find(|l| l["fields"]["message"] == "image unavailable" && l["fields"]["tenant"] == tenant)
        .map(|l| l["fields"]["error"].as_str().unwrap_or_default().to_owned())
}

/// Lines logged with `message`.
pub fn logged(gw: &super::Gateway, message: &str) -> usize {
    gateway_log(gw)
        .iter()
        .filter(|l| l["fields"]["message"] == message)
        .count()
}

/// What an image store holds: the names in each of its directories.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct StoreState {
    pub layers: Vec<String>,
    pub images: Vec<String>,
    pub refs: Vec<String>,
    pub tmp: Vec<String>,
}

impl StoreState {
    pub fn of(store: &Path) -> StoreState {
        let names = |sub: &str| -> Vec<String> {
            let mut v: Vec<String> = std::fs::read_dir(store.join(sub))
                .into_iter()
                .flatten()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect();
            v.sort();
            v
        };
        StoreState {
            layers: names("layers"),
            images: names("images"),
            refs: names("refs"),
            tmp: names("tmp"),
        }
    }

    /// The unpacked layers (directories of `layers/`).
    pub fn layer_dirs(&self) -> Vec<&str> {
        self.layers
            .iter()
            .filter(|n| !n.contains('.'))
            .map(String::as_str)
            .collect()
    }
}

/// Mount points at or below `dir` (this process's mount namespace).
pub fn mounts_under(dir: &Path) -> Vec<PathBuf> {
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(PathBuf::from)
        .filter(|p| p.starts_with(dir))
        .collect()
}

/// Unmounts (lazily) whatever is mounted below its directories when
/// dropped: a gateway killed with SIGKILL leaves its views mounted, and a
/// test's temporary directory is removed only once nothing is.
#[derive(Default)]
pub struct Unmounts(Vec<PathBuf>);

impl Unmounts {
    pub fn watch(&mut self, dir: &Path) {
        self.0.push(dir.to_owned());
    }
}

impl Drop for Unmounts {
    fn drop(&mut self) {
        for d in &self.0 {
            let mut mounts = mounts_under(d);
            mounts.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
            for m in mounts {
                let _ = rustix::mount::unmount(&m, rustix::mount::UnmountFlags::DETACH);
            }
        }
    }
}

/// The config blob of the image tagged `tag` in the layout at `layout`.
pub fn config_blob(layout: &Path, tag: &str) -> PathBuf {
    let read = |p: PathBuf| -> serde_json::Value {
        serde_json::from_slice(&std::fs::read(p).unwrap()).unwrap()
    };
    let blob = |d: &serde_json::Value| {
        layout
            .join("blobs/sha256")
            .join(d.as_str().unwrap().trim_start_matches("sha256:"))
    };
    let index = read(layout.join("index.json"));
    let entry = index["manifests"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["annotations"]["org.opencontainers.image.ref.name"] == tag)
        .unwrap();
    let manifest = read(blob(&entry["digest"]));
    blob(&manifest["config"]["digest"])
}

/// A hand-written HTTP server on a loopback port of its own (registries
/// that lie, drip or serve a layout): for each connection, in a thread of
/// its own, `answer` gets the request's path (its head read, at most 16
/// KiB) and the stream to answer on. Its address.
pub fn serve_http(
    answer: impl Fn(&str, &mut std::net::TcpStream) + Send + Sync + 'static,
) -> String {
    use std::io::Read as _;
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    let answer = std::sync::Arc::new(answer);
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(mut s) = s else { return };
            let answer = answer.clone();
            std::thread::spawn(move || {
                let mut head = Vec::new();
                let mut b = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") && head.len() < 16384 {
                    if s.read(&mut b).unwrap_or(0) == 0 {
                        return;
                    }
                    head.push(b[0]);
                }
                let head = String::from_utf8_lossy(&head).into_owned();
                let path = head.split_whitespace().nth(1).unwrap_or("");
                answer(path, &mut s);
            });
        }
    });
    addr
}

/// An empty 404 response.
pub const NOT_FOUND: &[u8] =
    b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\nconnection: close\r\n\r\n";

/// What a registry serving a layout's `blobs` answers `path` with: the
/// manifest `manifest` for any `/manifests/` path, a blob the layout holds
/// for `/blobs/DIGEST`, as (its digest, body, content type); `None` for
/// anything else (a 404).
pub fn layout_object(
    blobs: &Path,
    manifest: &str,
    path: &str,
) -> Option<(String, Vec<u8>, &'static str)> {
    let (digest, kind) = if path.contains("/manifests/") {
        (
            manifest.to_owned(),
            "application/vnd.oci.image.manifest.v1+json",
        )
    } else {
        let (_, d) = path.split_once("/blobs/")?;
        (d.to_owned(), "application/octet-stream")
    };
    let body = std::fs::read(blobs.join(digest.trim_start_matches("sha256:"))).ok()?;
    Some((digest, body, kind))
}

/// A 200 response's head for a body of `len` bytes of `kind`.
pub fn ok_head(kind: &str, len: usize) -> String {
    format!(
        "HTTP/1.1 200 OK\r\ncontent-type: {kind}\r\ncontent-length: {len}\r\nconnection: close\r\n\r\n"
    )
}
