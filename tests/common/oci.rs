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
        let dir = tempfile::tempdir().unwrap();
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let addr = format!("127.0.0.1:{port}");
        let config = format!(
            "version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: {}/data\n  delete:\n    enabled: true\nhttp:\n  addr: {addr}\n",
            dir.path().display()
        );
        let cfg = dir.path().join("config.yml");
        std::fs::write(&cfg, config).unwrap();
        let mut child = Command::new("/usr/bin/docker-registry")
            .arg("serve")
            .arg(&cfg)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.path().join("registry.log")).unwrap())
            .spawn()
            .unwrap();
        // Up when /v2/ answers.
        for _ in 0..200 {
            if std::net::TcpStream::connect(&addr).is_ok() {
                return TestRegistry { child, addr, dir };
            }
            std::thread::sleep(std::time::Duration::from_millis(25));
        }
        let _ = child.kill();
        let _ = child.wait();
        panic!("docker-registry did not listen on {addr}");
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
