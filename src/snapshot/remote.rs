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
//! - Signed: the manifest's [`SIGNATURE`] annotation is an HMAC-SHA256,
//!   with `[snapshots] key_file`, of the tenant's key, the record, the
//!   layer's digest and the tree root's mode ([`ROOT_MODE`]). Anyone who
//!   can write to the registry can put a manifest at a tenant's tag, or
//!   copy one tenant's there; only one a gateway with the key pushed for
//!   that tenant is restored.
//! - Pulling treats the registry's answers as hostile: the manifest is
//!   bounded, must be exactly this shape and verify; the layer is checked
//!   against its digest as it streams (a corrupt or truncated layer is
//!   refused before anything is unpacked); the record must name the id
//!   asked for and the layer's digest, and passes the checks a client's
//!   name and labels do.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use reqwest::Method;
use reqwest::header::{ACCEPT, CONTENT_LENGTH, CONTENT_TYPE, HeaderName, LOCATION};

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
/// The annotation that signs the record, layer and root mode.
pub const SIGNATURE: &str = "dev.exec-gateway.snapshot.signature";
/// The annotation with the tree root's permission bits (octal): the tar
/// stream has no entry for the root.
pub const ROOT_MODE: &str = "dev.exec-gateway.snapshot.root-mode";
/// A manifest is at most this.
const MAX_MANIFEST_BYTES: u64 = 256 << 10;

/// The registry repository snapshots go to.
#[derive(Clone)]
pub struct Remote {
    /// `host[:port]/path`, as configured.
    repository: String,
    images: ImagesSettings,
    key: crate::config::SnapshotKey,
}

/// What a restore takes from the registry: the record, the layer's size
/// and the tree root's mode, and the manifest's digest.
pub struct Found {
    pub meta: Snapshot,
    pub size: u64,
    pub root_mode: u32,
    pub manifest: String,
}

/// The signature of a pushed snapshot of tenant `key`.
fn sign(
    k: &crate::config::SnapshotKey,
    key: &str,
    record: &str,
    layer: &str,
    root_mode: u32,
) -> Option<hmac::Hmac<sha2::Sha256>> {
    use hmac::Mac as _;
    let mut mac = <hmac::Hmac<sha2::Sha256>>::new_from_slice(&k.0).ok()?;
    for part in [
        "exec-gateway snapshot v1",
        key,
        record,
        layer,
        &format!("{root_mode:o}"),
    ] {
        mac.update(&(part.len() as u64).to_be_bytes());
        mac.update(part.as_bytes());
    }
    Some(mac)
}

fn unavailable(e: ImageError) -> SnapshotError {
    SnapshotError::Remote(e.to_string())
}

/// The repository key of tenant `name`.
pub fn tenant_key(name: &str) -> String {
    sha256_hex(name.as_bytes())
}

impl Remote {
    pub fn new(
        repository: String,
        images: ImagesSettings,
        key: crate::config::SnapshotKey,
    ) -> Remote {
        Remote {
            repository,
            images,
            key,
        }
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

    /// Push snapshot `meta` whose tree is at `tree` (walked again as it is
    /// sent: the registry checks it gives `meta.digest`) and whose root has
    /// `root_mode`. Returns where it is (`<reference>@<digest of the
    /// manifest>`), and whether it is promoted (here, or already in the
    /// registry).
    pub async fn push(
        &self,
        key: &str,
        meta: &Snapshot,
        (tree, max_entries): (PathBuf, u64),
        root_mode: u32,
    ) -> Result<(String, bool), SnapshotError> {
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
        let sent = Arc::new(AtomicU64::new(0));
        let size = upload(&client, &meta.digest, None, &sent, || {
            Ok(layer_body(tree.clone(), max_entries, sent.clone()))
        })
        .await?;
        upload(
            &client,
            &config_digest,
            Some(config.len() as u64),
            &AtomicU64::new(0),
            || Ok(reqwest::Body::from(config.clone())),
        )
        .await?;
        // A promotion is never undone by a push: a copy restored before
        // the snapshot was promoted elsewhere pushes it promoted.
        let promoted = meta.expires_at_ms.is_none()
            || matches!(self.find(key, &meta.id).await, Ok(Some(f)) if f.meta.expires_at_ms.is_none());
        let record = serde_json::to_string(&Snapshot {
            pushed: None,
            expires_at_ms: meta.expires_at_ms.filter(|_| !promoted),
            ..meta.clone()
        })
        .map_err(|e| SnapshotError::Io(e.to_string()))?;
        use hmac::Mac as _;
        let signature = sign(&self.key, key, &record, &meta.digest, root_mode)
            .map(|m| fetch::hex(&m.finalize().into_bytes()))
            .ok_or_else(|| SnapshotError::Io("the signing key".to_owned()))?;
        let manifest = serde_json::to_vec(&serde_json::json!({
            "schemaVersion": 2,
            "mediaType": MANIFEST_TYPE,
            "config": { "mediaType": CONFIG_TYPE, "digest": config_digest, "size": config.len() },
            "layers": [{ "mediaType": LAYER_TYPE, "digest": meta.digest, "size": size }],
            "annotations": {
                RECORD: record,
                SIGNATURE: signature,
                ROOT_MODE: format!("{root_mode:o}"),
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
        Ok((self.located(key, &manifest_digest), promoted))
    }

    /// Snapshot `id` of tenant `key`, if the registry has it: checked as
    /// hostile input and against its signature.
    pub async fn find(&self, key: &str, id: &str) -> Result<Option<Found>, SnapshotError> {
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
        let (meta, size, root_mode) = parse(&body, id, |record, layer, mode, signature| {
            use hmac::Mac as _;
            let theirs = (signature.len() == 64)
                .then(|| {
                    (0..32)
                        .map(|i| u8::from_str_radix(signature.get(2 * i..2 * i + 2)?, 16).ok())
                        .collect::<Option<Vec<u8>>>()
                })
                .flatten();
            match (sign(&self.key, key, record, layer, mode), theirs) {
                (Some(mac), Some(theirs)) => mac.verify_slice(&theirs).is_ok(),
                _ => false,
            }
        })?;
        Ok(Some(Found {
            meta,
            size,
            root_mode,
            manifest: format!("sha256:{}", sha256_hex(&body)),
        }))
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

/// Upload blob `digest` unless the repository has it; its size. `body`
/// makes the bytes (afresh for a second attempt) and counts them in
/// `sent`; `size` is said when known (else the body is sent chunked).
async fn upload(
    client: &Registry,
    digest: &str,
    size: Option<u64>,
    sent: &AtomicU64,
    body: impl Fn() -> Result<reqwest::Body, ImageError>,
) -> Result<u64, SnapshotError> {
    let had = client
        .send(Method::HEAD, &format!("blobs/{digest}"), &[], || Ok(None))
        .await
        .map_err(unavailable)?;
    if let Some(had) = had {
        return had
            .headers()
            .get(CONTENT_LENGTH)
            .and_then(|l| l.to_str().ok()?.parse().ok())
            .ok_or_else(|| SnapshotError::Remote("a blob without its length".into()));
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
    let len = size.map(|n| n.to_string());
    let mut headers: Vec<(HeaderName, &str)> = vec![(CONTENT_TYPE, "application/octet-stream")];
    if let Some(len) = &len {
        headers.push((CONTENT_LENGTH, len));
    }
    // The registry checks the bytes against `digest` before it keeps them.
    let put = client
        .send(
            Method::PUT,
            &format!("{location}{sep}digest={digest}"),
            &headers,
            || {
                sent.store(0, Ordering::SeqCst);
                body().map(Some)
            },
        )
        .await;
    if !matches!(put, Ok(Some(_))) {
        // The upload is cancelled rather than left for the registry to
        // purge (best effort: the registry may be what failed).
        let _ = client
            .send(Method::DELETE, &location, &[], || Ok(None))
            .await;
    }
    put.map_err(unavailable)?
        .ok_or_else(|| SnapshotError::Remote("the registry lost the upload (404)".into()))?;
    Ok(sent.load(Ordering::SeqCst))
}

/// The tar stream of the tree at `tree`, made as it is sent (by a blocking
/// task, `LAYER_CHUNK` bytes at a time, at most `LAYER_CHUNKS_AHEAD` of
/// them waiting), its bytes counted in `sent`. A stream that is dropped
/// stops the walk.
fn layer_body(tree: PathBuf, max_entries: u64, sent: Arc<AtomicU64>) -> reqwest::Body {
    const LAYER_CHUNK: usize = 256 << 10;
    const LAYER_CHUNKS_AHEAD: usize = 8;
    let (tx, rx) = tokio::sync::mpsc::channel::<std::io::Result<bytes::Bytes>>(LAYER_CHUNKS_AHEAD);
    struct Chunks {
        tx: tokio::sync::mpsc::Sender<std::io::Result<bytes::Bytes>>,
        buf: Vec<u8>,
        sent: Arc<AtomicU64>,
    }
    impl Chunks {
        fn send(&mut self) -> std::io::Result<()> {
            if self.buf.is_empty() {
                return Ok(());
            }
            let chunk = std::mem::replace(&mut self.buf, Vec::with_capacity(LAYER_CHUNK));
            self.sent.fetch_add(chunk.len() as u64, Ordering::SeqCst);
            self.tx
                .blocking_send(Ok(bytes::Bytes::from(chunk)))
                .map_err(|_| std::io::Error::from(std::io::ErrorKind::BrokenPipe))
        }
    }
    impl std::io::Write for Chunks {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            let n = b.len().min(LAYER_CHUNK - self.buf.len());
            self.buf.extend_from_slice(&b[..n]);
            if self.buf.len() == LAYER_CHUNK {
                self.send()?;
            }
            Ok(n)
        }
        fn flush(&mut self) -> std::io::Result<()> {
            self.send()
        }
    }
    tokio::task::spawn_blocking(move || {
        let mut w = Chunks {
            tx: tx.clone(),
            buf: Vec::with_capacity(LAYER_CHUNK),
            sent,
        };
        if let Err(e) = super::capture::layer(&tree, &mut w, max_entries)
            .and_then(|_| std::io::Write::flush(&mut w))
        {
            // The upload fails; the registry keeps nothing.
            let _ = tx.blocking_send(Err(e));
        }
    });
    reqwest::Body::wrap_stream(tokio_stream::wrappers::ReceiverStream::new(rx))
}

/// A manifest this module wrote, as hostile input: one tar layer, the
/// record naming `id` and that layer, signed (`verify` is given the record,
/// the layer's digest, the root's mode and the signature); the record, the
/// layer's size and the root's mode.
fn parse(
    body: &[u8],
    id: &str,
    verify: impl FnOnce(&str, &str, u32, &str) -> bool,
) -> Result<(Snapshot, u64, u32), SnapshotError> {
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
    let root_mode = m
        .annotations
        .get(ROOT_MODE)
        .and_then(|s| u32::from_str_radix(s, 8).ok())
        .filter(|m| *m <= 0o1777)
        .ok_or_else(|| bad("no root mode"))?;
    let signature = m
        .annotations
        .get(SIGNATURE)
        .ok_or_else(|| bad("not signed"))?;
    if !verify(record, &layer.digest, root_mode, signature) {
        return Err(bad(
            "its signature does not verify (not pushed for this tenant by a gateway with this snapshot key)",
        ));
    }
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
    if meta.skipped > 1 << 40 || meta.created_at_ms > now_ms().saturating_add(86_400_000) {
        return Err(bad("a record out of range"));
    }
    Ok((meta, layer.size, root_mode))
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
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
            "annotations": { RECORD: record, ROOT_MODE: "755", SIGNATURE: "s" },
        }))
        .unwrap_or_default()
    }

    #[test]
    fn an_unsigned_or_wrongly_signed_manifest_is_refused() {
        let id = "snap-0123456789abcdef0123456789abcdef";
        let d = format!("sha256:{}", "a".repeat(64));
        let body = manifest(id, &d, LAYER_TYPE, 1);
        match parse(&body, id, |_, _, _, _| false) {
            Err(SnapshotError::Corrupt(e)) => assert!(e.contains("signature"), "{e}"),
            other => panic!("{other:?}"),
        }
        // What is signed: the record, the layer and the mode as written.
        let seen = std::cell::RefCell::new(None);
        let ok = parse(&body, id, |record, layer, mode, sig| {
            *seen.borrow_mut() =
                Some((record.contains(id), layer.to_owned(), mode, sig.to_owned()));
            true
        });
        assert!(ok.is_ok());
        assert_eq!(
            seen.into_inner(),
            Some((true, d.clone(), 0o755, "s".to_owned()))
        );
        let key = crate::config::SnapshotKey(vec![7; 32]);
        let a = sign(&key, "tenant-a", "{}", &d, 0o755).map(|m| {
            use hmac::Mac as _;
            m.finalize().into_bytes()
        });
        let b = sign(&key, "tenant-b", "{}", &d, 0o755).map(|m| {
            use hmac::Mac as _;
            m.finalize().into_bytes()
        });
        assert!(
            a.is_some() && a != b,
            "another tenant's key signs differently"
        );
    }

    #[test]
    fn only_a_manifest_of_this_shape_is_taken() {
        let id = "snap-0123456789abcdef0123456789abcdef";
        let d = format!("sha256:{}", "a".repeat(64));
        let ok = parse(&manifest(id, &d, LAYER_TYPE, 1), id, |_, _, _, _| true);
        assert!(
            matches!(ok, Ok((ref m, 10, 0o755)) if m.id == id),
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
            match parse(&body, id, |_, _, _, _| true) {
                Err(SnapshotError::Corrupt(e)) => assert!(e.contains(why), "{e}"),
                other => panic!("{why}: {other:?}"),
            }
        }
    }
}
