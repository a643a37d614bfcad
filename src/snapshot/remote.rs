//! Snapshots in a registry (`[snapshots] registry`): a snapshot pushed as
//! an OCI image and pulled back by any replica or host that can reach it.
//!
//! - The image: one layer, the tree's tar stream uncompressed
//!   (`application/vnd.oci.image.layer.v1.tar`), so the layer's digest is
//!   the snapshot's `digest`; an image config whose `rootfs.diff_ids`
//!   name it; the snapshot's record as the manifest's annotation
//!   [`RECORD`]. Any OCI tool can copy or inspect it.
//! - Where: `<registry>/<tenant key>:<snapshot id>`, the tenant key the
//!   SHA-256 of the tenant's name. A tenant never names the repository:
//!   another tenant's id looks in the asker's own repository and is not
//!   found there.
//! - Pulling treats the registry's answers as hostile: the manifest is
//!   bounded and must be exactly this shape; the layer is checked against
//!   its digest as it streams (a corrupt or truncated layer is refused
//!   before anything is unpacked); the record must name the id asked for
//!   and the layer's digest, and passes the checks a client's name and
//!   labels do.

use std::collections::BTreeMap;
use std::path::Path;

use reqwest::Method;
use reqwest::header::{ACCEPT, CONTENT_LENGTH, CONTENT_TYPE, HeaderName, LOCATION};
use sha2::Digest as _;

use super::{Snapshot, SnapshotError, check_meta, is_id};
use crate::config::ImagesSettings;
use crate::image::ImageError;
use crate::image::distribution::Registry;
use crate::image::fetch::{self, Fetcher, sha256_hex};

/// The layer's media type: the tar stream as it is.
pub const LAYER_TYPE: &str = "application/vnd.oci.image.layer.v1.tar";
const CONFIG_TYPE: &str = "application/vnd.oci.image.config.v1+json";
const MANIFEST_TYPE: &str = "application/vnd.oci.image.manifest.v1+json";
/// The manifest annotation that holds the snapshot's record (JSON).
pub const RECORD: &str = "dev.exec-gateway.snapshot";
/// A manifest is at most this.
const MAX_MANIFEST_BYTES: u64 = 256 << 10;

/// The registry repository snapshots go to.
#[derive(Clone)]
pub struct Remote {
    /// `host[:port]/path`, as configured.
    repository: String,
    images: ImagesSettings,
}

fn unavailable(e: ImageError) -> SnapshotError {
    SnapshotError::Remote(e.to_string())
}

/// The repository key of tenant `name`.
pub fn tenant_key(name: &str) -> String {
    sha256_hex(name.as_bytes())
}

impl Remote {
    pub fn new(repository: String, images: ImagesSettings) -> Remote {
        Remote { repository, images }
    }

    /// `<repository>/<key>:<id>`: where snapshot `id` of the tenant `key`
    /// is.
    pub fn reference(&self, key: &str, id: &str) -> String {
        format!("{}/{key}:{id}", self.repository)
    }

    fn client(&self, key: &str, id: &str) -> Result<Registry, SnapshotError> {
        let r = oci_client::Reference::try_from(self.reference(key, id).as_str())
            .map_err(|e| SnapshotError::Remote(format!("snapshots.registry: {e}")))?;
        Registry::new(&r, &self.images).map_err(unavailable)
    }

    /// Push snapshot `meta` whose layer is the file `layer` (`size` bytes,
    /// digest `meta.digest`). Returns where it is: `<reference>@<digest of
    /// the manifest>`.
    pub async fn push(
        &self,
        key: &str,
        meta: &Snapshot,
        layer: &Path,
        size: u64,
    ) -> Result<String, SnapshotError> {
        let client = self.client(key, &meta.id)?.pushing();
        let config = serde_json::to_vec(&serde_json::json!({
            "architecture": fetch::arch(),
            "os": "linux",
            "created": rfc3339(meta.created_at_ms),
            "config": { "Labels": meta.labels },
            "rootfs": { "type": "layers", "diff_ids": [meta.digest] },
        }))
        .map_err(|e| SnapshotError::Io(e.to_string()))?;
        let config_digest = format!("sha256:{}", sha256_hex(&config));
        upload(&client, &meta.digest, size, || {
            let f = std::fs::File::open(layer)
                .map_err(|e| ImageError::Unavailable(format!("the snapshot's layer: {e}")))?;
            let stream =
                tokio_util::io::ReaderStream::with_capacity(tokio::fs::File::from_std(f), 1 << 16);
            Ok(reqwest::Body::wrap_stream(stream))
        })
        .await?;
        upload(&client, &config_digest, config.len() as u64, || {
            Ok(reqwest::Body::from(config.clone()))
        })
        .await?;
        let record = serde_json::to_string(&Snapshot {
            pushed: None,
            ..meta.clone()
        })
        .map_err(|e| SnapshotError::Io(e.to_string()))?;
        let manifest = serde_json::to_vec(&serde_json::json!({
            "schemaVersion": 2,
            "mediaType": MANIFEST_TYPE,
            "config": { "mediaType": CONFIG_TYPE, "digest": config_digest, "size": config.len() },
            "layers": [{ "mediaType": LAYER_TYPE, "digest": meta.digest, "size": size }],
            "annotations": {
                RECORD: record,
                "org.opencontainers.image.created": rfc3339(meta.created_at_ms),
            },
        }))
        .map_err(|e| SnapshotError::Io(e.to_string()))?;
        let manifest_digest = format!("sha256:{}", sha256_hex(&manifest));
        let len = manifest.len().to_string();
        client
            .send(
                Method::PUT,
                &format!("manifests/{}", meta.id),
                &[(CONTENT_TYPE, MANIFEST_TYPE), (CONTENT_LENGTH, &len)],
                || Ok(Some(reqwest::Body::from(manifest.clone()))),
            )
            .await
            .map_err(unavailable)?
            .ok_or_else(|| SnapshotError::Remote("the registry has no such repository".into()))?;
        Ok(self.located(key, &manifest_digest))
    }

    /// The record and layer of snapshot `id` of tenant `key`, if the
    /// registry has it: checked as hostile input, and the layer's size.
    /// And the manifest's digest.
    pub async fn find(
        &self,
        key: &str,
        id: &str,
    ) -> Result<Option<(Snapshot, u64, String)>, SnapshotError> {
        if !is_id(id) {
            return Ok(None);
        }
        let client = self.client(key, id)?;
        let Some(res) = client
            .send(
                Method::GET,
                &format!("manifests/{id}"),
                &[(ACCEPT, MANIFEST_TYPE)],
                || Ok(None),
            )
            .await
            .map_err(unavailable)?
        else {
            return Ok(None);
        };
        let body = crate::image::distribution::bounded(res, MAX_MANIFEST_BYTES, "manifest")
            .await
            .map_err(unavailable)?;
        let (meta, size) = parse(&body, id)?;
        Ok(Some((meta, size, format!("sha256:{}", sha256_hex(&body)))))
    }

    /// `<repository>/<key>@<manifest>`: a pushed snapshot's place.
    pub fn located(&self, key: &str, manifest: &str) -> String {
        format!("{}/{key}@{manifest}", self.repository)
    }

    /// Write the layer of snapshot `meta` (`size` bytes) to `out`, checked
    /// against its digest as it streams.
    pub async fn layer_to(
        &self,
        key: &str,
        meta: &Snapshot,
        size: u64,
        out: &mut (impl tokio::io::AsyncWrite + Unpin),
    ) -> Result<(), SnapshotError> {
        let r = fetch::Registry::new(&self.reference(key, &meta.id), &self.images)
            .map_err(unavailable)?;
        let got = Fetcher::Registry(Box::new(r))
            .blob_to(&meta.digest, size, out)
            .await
            .map_err(|e| match e {
                ImageError::Refused(why) => SnapshotError::Corrupt(why),
                e => unavailable(e),
            })?;
        if got != size {
            return Err(SnapshotError::Corrupt(format!(
                "layer {}: {got} bytes, the manifest says {size}",
                meta.digest
            )));
        }
        Ok(())
    }
}

/// Upload blob `digest` unless the repository has it.
async fn upload(
    client: &Registry,
    digest: &str,
    size: u64,
    body: impl Fn() -> Result<reqwest::Body, ImageError>,
) -> Result<(), SnapshotError> {
    let had = client
        .send(Method::HEAD, &format!("blobs/{digest}"), &[], || Ok(None))
        .await
        .map_err(unavailable)?;
    if had.is_some() {
        return Ok(());
    }
    let started = client
        .send(Method::POST, "blobs/uploads/", &[], || Ok(None))
        .await
        .map_err(unavailable)?
        .ok_or_else(|| SnapshotError::Remote("the registry refused an upload (404)".into()))?;
    let location = started
        .headers()
        .get(LOCATION)
        .and_then(|l| l.to_str().ok())
        .ok_or_else(|| SnapshotError::Remote("an upload without a location".into()))?
        .to_owned();
    let sep = if location.contains('?') { '&' } else { '?' };
    let len = size.to_string();
    let headers: [(HeaderName, &str); 2] = [
        (CONTENT_TYPE, "application/octet-stream"),
        (CONTENT_LENGTH, &len),
    ];
    client
        .send(
            Method::PUT,
            &format!("{location}{sep}digest={digest}"),
            &headers,
            || body().map(Some),
        )
        .await
        .map_err(unavailable)?
        .ok_or_else(|| SnapshotError::Remote("the registry lost the upload (404)".into()))?;
    Ok(())
}

/// A manifest this module wrote, as hostile input: one tar layer, the
/// record naming `id` and that layer.
fn parse(body: &[u8], id: &str) -> Result<(Snapshot, u64), SnapshotError> {
    let bad = |why: &str| SnapshotError::Corrupt(format!("snapshot {id} in the registry: {why}"));
    #[derive(serde::Deserialize)]
    struct Descriptor {
        #[serde(rename = "mediaType")]
        media_type: String,
        digest: String,
        size: u64,
    }
    #[derive(serde::Deserialize)]
    struct Manifest {
        layers: Vec<Descriptor>,
        #[serde(default)]
        annotations: BTreeMap<String, String>,
    }
    let m: Manifest = serde_json::from_slice(body).map_err(|_| bad("not a manifest"))?;
    let [layer] = m.layers.as_slice() else {
        return Err(bad("not one layer"));
    };
    if layer.media_type != LAYER_TYPE {
        return Err(bad("its layer is not an uncompressed tar"));
    }
    fetch::check_digest(&layer.digest).map_err(|_| bad("a layer digest that is not sha256"))?;
    let record = m
        .annotations
        .get(RECORD)
        .ok_or_else(|| bad("no snapshot record"))?;
    let meta: Snapshot = serde_json::from_str(record).map_err(|_| bad("a malformed record"))?;
    if meta.id != id {
        return Err(bad("its record names another snapshot"));
    }
    if meta.digest != layer.digest {
        return Err(bad("its record names another layer"));
    }
    check_meta(meta.name.as_deref(), &meta.labels).map_err(|e| bad(&e.to_string()))?;
    if let Some(image) = &meta.image
        && (image.is_empty() || image.len() > 4096 || image.chars().any(char::is_control))
    {
        return Err(bad("a malformed image"));
    }
    Ok((meta, layer.size))
}

/// A layer's bytes and digest, written to `out` from the tree.
pub fn write_layer(tree: &Path, out: &Path, max_entries: u64) -> std::io::Result<(String, u64)> {
    struct Hashing<W> {
        inner: W,
        hash: sha2::Sha256,
        n: u64,
    }
    impl<W: std::io::Write> std::io::Write for Hashing<W> {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            let n = self.inner.write(buf)?;
            self.hash.update(&buf[..n]);
            self.n += n as u64;
            Ok(n)
        }
        fn flush(&mut self) -> std::io::Result<()> {
            self.inner.flush()
        }
    }
    let f = std::fs::File::create(out)?;
    let mut w = Hashing {
        inner: std::io::BufWriter::with_capacity(1 << 16, f),
        hash: sha2::Sha256::new(),
        n: 0,
    };
    super::capture::layer(tree, &mut w, max_entries)?;
    std::io::Write::flush(&mut w)?;
    let digest = format!("sha256:{}", fetch::hex(&w.hash.finalize()));
    Ok((digest, w.n))
}

/// Milliseconds since the epoch as RFC 3339 (UTC).
fn rfc3339(ms: u64) -> String {
    let t = std::time::UNIX_EPOCH + std::time::Duration::from_secs(ms / 1000);
    humantime::format_rfc3339_seconds(t).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn manifest(id: &str, digest: &str, media: &str, layers: usize) -> Vec<u8> {
        let record = serde_json::json!({
            "id": id, "labels": {}, "digest": digest, "bytes": 4096, "entries": 1,
            "skipped": 0, "createdAtMs": 1, "expiresAtMs": 2,
        })
        .to_string();
        let layer = serde_json::json!({"mediaType": media, "digest": digest, "size": 10});
        serde_json::to_vec(&serde_json::json!({
            "schemaVersion": 2,
            "layers": vec![layer; layers],
            "annotations": { RECORD: record },
        }))
        .unwrap_or_default()
    }

    #[test]
    fn only_a_manifest_of_this_shape_is_taken() {
        let id = "snap-0123456789abcdef0123456789abcdef";
        let d = format!("sha256:{}", "a".repeat(64));
        let ok = parse(&manifest(id, &d, LAYER_TYPE, 1), id);
        assert!(
            matches!(ok, Ok((ref m, 10)) if m.id == id),
            "{:?}",
            ok.err()
        );
        let other = "snap-fedcba9876543210fedcba9876543210";
        for (body, why) in [
            (manifest(other, &d, LAYER_TYPE, 1), "another snapshot"),
            (manifest(id, &d, LAYER_TYPE, 2), "not one layer"),
            (
                manifest(id, &d, "application/vnd.oci.image.layer.v1.tar+gzip", 1),
                "uncompressed",
            ),
            (manifest(id, "sha256:zz", LAYER_TYPE, 1), "not sha256"),
            (b"{}".to_vec(), "not a manifest"),
        ] {
            match parse(&body, id) {
                Err(SnapshotError::Corrupt(e)) => assert!(e.contains(why), "{e}"),
                other => panic!("{why}: {other:?}"),
            }
        }
    }
}
