//! Writing an OCI image layout (`oci-layout`, `index.json`, `blobs/`):
//! an image made from layer tarballs, tagged, for `oci:DIR:TAG` sources,
//! `skopeo copy oci:...` into a registry, and the benchmarks.

use std::io;
use std::path::Path;

use super::fetch::sha256_hex;

/// One layer as it goes into an image.
pub struct LayerBlob {
    /// The bytes stored (compressed as `media_type` says).
    pub blob: Vec<u8>,
    pub media_type: &'static str,
    /// `sha256:` of the uncompressed tar.
    pub diff_id: String,
}

impl LayerBlob {
    /// A gzip-compressed layer of `tar`.
    pub fn gzip(tar: &[u8]) -> io::Result<LayerBlob> {
        use std::io::Write as _;
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        e.write_all(tar)?;
        Ok(LayerBlob {
            blob: e.finish()?,
            media_type: "application/vnd.oci.image.layer.v1.tar+gzip",
            diff_id: format!("sha256:{}", sha256_hex(tar)),
        })
    }

    /// An uncompressed layer.
    pub fn tar(tar: Vec<u8>) -> LayerBlob {
        LayerBlob {
            diff_id: format!("sha256:{}", sha256_hex(&tar)),
            blob: tar,
            media_type: "application/vnd.oci.image.layer.v1.tar",
        }
    }
}

/// Write a layout at `dir` holding one linux/amd64 image tagged `tag`
/// (its only manifest), with `layers` (bottom first) and `env`; returns
/// the manifest's digest.
pub fn write(dir: &Path, tag: &str, layers: &[LayerBlob], env: &[String]) -> io::Result<String> {
    let blobs = dir.join("blobs/sha256");
    std::fs::create_dir_all(&blobs)?;
    let put = |b: &[u8]| -> io::Result<(String, usize)> {
        let h = sha256_hex(b);
        std::fs::write(blobs.join(&h), b)?;
        Ok((format!("sha256:{h}"), b.len()))
    };
    let json = |v: &serde_json::Value| serde_json::to_vec(v).map_err(io::Error::other);
    let config = serde_json::json!({
        "architecture": "amd64",
        "os": "linux",
        "config": {"Env": env},
        "rootfs": {
            "type": "layers",
            "diff_ids": layers.iter().map(|l| l.diff_id.as_str()).collect::<Vec<_>>(),
        },
    });
    let (config_digest, config_size) = put(&json(&config)?)?;
    let mut descriptors = Vec::new();
    for l in layers {
        let (digest, size) = put(&l.blob)?;
        descriptors
            .push(serde_json::json!({"mediaType": l.media_type, "digest": digest, "size": size}));
    }
    let manifest = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {
            "mediaType": "application/vnd.oci.image.config.v1+json",
            "digest": config_digest,
            "size": config_size,
        },
        "layers": descriptors,
    });
    let (digest, size) = put(&json(&manifest)?)?;
    let index = serde_json::json!({
        "schemaVersion": 2,
        "manifests": [{
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": digest,
            "size": size,
            "annotations": {"org.opencontainers.image.ref.name": tag},
        }],
    });
    std::fs::write(dir.join("index.json"), json(&index)?)?;
    std::fs::write(dir.join("oci-layout"), br#"{"imageLayoutVersion":"1.0.0"}"#)?;
    Ok(digest)
}
