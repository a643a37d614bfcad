//! Where an image's documents and blobs come from: a registry (the
//! distribution protocol through `oci-client`: its authentication flow,
//! bearer tokens and blob streams) or an OCI image layout on the host (a
//! directory, or an `oci-archive` unpacked into one). Every document is
//! read to at most [`MAX_DOCUMENT_BYTES`] and every blob to the size its
//! descriptor declares; every byte is checked against its digest.

use std::path::{Path, PathBuf};

use sha2::Digest as _;
use tokio::io::AsyncWriteExt as _;

use super::ImageError;
use crate::config::{ImagesSettings, MAX_DOCUMENT_BYTES};

/// Media types a manifest request accepts.
pub const MANIFEST_TYPES: &[&str] = &[
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.v2+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
];

/// A source of one image's content.
pub enum Fetcher {
    Registry(Box<Registry>),
    Layout(PathBuf),
}

/// One registry reference, and the client that speaks to its registry
/// (module `distribution`).
pub struct Registry {
    reference: oci_client::Reference,
    client: super::distribution::Registry,
}

/// `sha256:<64 hex>`, the only digests accepted.
pub fn check_digest(d: &str) -> Result<&str, ImageError> {
    match d.strip_prefix("sha256:") {
        Some(h)
            if h.len() == 64
                && h.bytes()
                    .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()) =>
        {
            Ok(h)
        }
        _ => Err(ImageError::Refused(format!(
            "digest {} is not sha256:<64 lowercase hex>",
            clipped(d)
        ))),
    }
}

pub fn sha256_hex(bytes: &[u8]) -> String {
    hex(&sha2::Sha256::digest(bytes))
}

pub fn hex(b: &[u8]) -> String {
    use std::fmt::Write as _;
    b.iter()
        .fold(String::with_capacity(b.len() * 2), |mut s, x| {
            let _ = write!(s, "{x:02x}");
            s
        })
}

impl Registry {
    pub fn new(reference: &str, settings: &ImagesSettings) -> Result<Registry, ImageError> {
        let reference = oci_client::Reference::try_from(reference)
            .map_err(|e| ImageError::Refused(format!("{reference}: {e}")))?;
        let client = super::distribution::Registry::new(&reference, settings)?;
        Ok(Registry { reference, client })
    }
}

/// Text from a registry or an image, cut to a bounded length and quoted
/// (its control characters escaped) for an error message.
pub fn clipped(s: &str) -> String {
    // `clip` gives a JSON string: its text, quoted and escaped.
    crate::audit::clip(s).to_string()
}

/// Read a file of a layout to at most `limit` bytes.
fn bounded_file(path: &Path, limit: u64) -> Result<Vec<u8>, ImageError> {
    use std::io::Read as _;
    let f = std::fs::File::open(path)
        .map_err(|e| ImageError::Unavailable(format!("{}: {e}", path.display())))?;
    let mut buf = Vec::new();
    f.take(limit + 1)
        .read_to_end(&mut buf)
        .map_err(|e| ImageError::Unavailable(format!("{}: {e}", path.display())))?;
    if buf.len() as u64 > limit {
        return Err(ImageError::Refused(format!(
            "{}: larger than {limit} bytes",
            path.display()
        )));
    }
    Ok(buf)
}

impl Fetcher {
    /// The manifest (or index) the source names, or the one `digest`
    /// names: its bytes, checked against the digest when one is known.
    pub async fn manifest(
        &self,
        digest: Option<&str>,
        tag: Option<&str>,
    ) -> Result<Vec<u8>, ImageError> {
        match self {
            Fetcher::Registry(r) => {
                let pinned = digest
                    .map(str::to_owned)
                    .or_else(|| r.reference.digest().map(str::to_owned));
                let target = match &pinned {
                    Some(d) => d.clone(),
                    None => r.reference.tag().unwrap_or("latest").to_owned(),
                };
                let res = r
                    .client
                    .get(
                        &format!("manifests/{target}"),
                        Some(&MANIFEST_TYPES.join(", ")),
                        false,
                    )
                    .await?;
                let body =
                    super::distribution::bounded(res, MAX_DOCUMENT_BYTES, "manifest").await?;
                if let Some(d) = &pinned {
                    verify(&body, d, "manifest")?;
                }
                Ok(body)
            }
            Fetcher::Layout(dir) => {
                let digest = match digest {
                    Some(d) => d.to_owned(),
                    None => layout_entry(dir, tag)?,
                };
                let body = self.document(&digest).await?;
                Ok(body)
            }
        }
    }

    /// A small blob (a config, a manifest of a layout), whole.
    pub async fn document(&self, digest: &str) -> Result<Vec<u8>, ImageError> {
        let hexd = check_digest(digest)?;
        let body = match self {
            Fetcher::Layout(dir) => {
                let p = dir.join("blobs/sha256").join(hexd);
                tokio::task::spawn_blocking(move || bounded_file(&p, MAX_DOCUMENT_BYTES))
                    .await
                    .map_err(|e| ImageError::Unavailable(e.to_string()))??
            }
            Fetcher::Registry(_) => {
                // Checked against its digest as it streams.
                let mut body = Vec::new();
                self.blob_to(digest, MAX_DOCUMENT_BYTES, &mut body).await?;
                return Ok(body);
            }
        };
        verify(&body, digest, "document")?;
        Ok(body)
    }

    /// Write blob `digest` (at most `size` bytes, exactly `size` when the
    /// descriptor said so) to `out`, checking its digest.
    pub async fn blob_to(
        &self,
        digest: &str,
        size: u64,
        out: &mut (impl tokio::io::AsyncWrite + Unpin),
    ) -> Result<u64, ImageError> {
        let hexd = check_digest(digest)?.to_owned();
        let mut hash = sha2::Sha256::new();
        let mut n = 0u64;
        let too_large = || ImageError::Refused(format!("blob {digest}: larger than {size} bytes"));
        let io = |e: std::io::Error| ImageError::Unavailable(format!("blob {digest}: {e}"));
        match self {
            Fetcher::Registry(r) => {
                let mut res = r.client.get(&format!("blobs/{digest}"), None, true).await?;
                if res.content_length().is_some_and(|l| l > size) {
                    return Err(too_large());
                }
                let pace = super::distribution::Pace::start();
                while let Some(chunk) = res.chunk().await.map_err(|e| {
                    super::distribution::transfer_failed(&format!("blob {digest}"), e)
                })? {
                    n += chunk.len() as u64;
                    if n > size {
                        return Err(too_large());
                    }
                    pace.check(n, &format!("blob {digest}"))?;
                    hash.update(&chunk);
                    out.write_all(&chunk).await.map_err(io)?;
                }
            }
            Fetcher::Layout(dir) => {
                use tokio::io::AsyncReadExt as _;
                let mut f = tokio::fs::File::open(dir.join("blobs/sha256").join(&hexd))
                    .await
                    .map_err(io)?;
                let mut buf = vec![0u8; 256 << 10];
                loop {
                    let k = f.read(&mut buf).await.map_err(io)?;
                    if k == 0 {
                        break;
                    }
                    n += k as u64;
                    if n > size {
                        return Err(too_large());
                    }
                    hash.update(&buf[..k]);
                    out.write_all(&buf[..k]).await.map_err(io)?;
                }
            }
        }
        out.flush().await.map_err(io)?;
        if hex(&hash.finalize()) != hexd {
            return Err(ImageError::Refused(format!(
                "blob {digest}: its content does not match its digest"
            )));
        }
        Ok(n)
    }
}

fn verify(body: &[u8], digest: &str, what: &str) -> Result<(), ImageError> {
    let want = check_digest(digest)?;
    if sha256_hex(body) != want {
        return Err(ImageError::Refused(format!(
            "{what} {digest}: its content does not match its digest"
        )));
    }
    Ok(())
}

/// The manifest digest a layout's `index.json` names for `tag` (its only
/// manifest when no tag is given).
fn layout_entry(dir: &Path, tag: Option<&str>) -> Result<String, ImageError> {
    let index = bounded_file(&dir.join("index.json"), MAX_DOCUMENT_BYTES)?;
    let index: oci_spec::image::ImageIndex = serde_json::from_slice(&index)
        .map_err(|e| ImageError::Refused(format!("{}/index.json: {e}", dir.display())))?;
    let name = |d: &oci_spec::image::Descriptor| {
        d.annotations()
            .as_ref()
            .and_then(|a| a.get("org.opencontainers.image.ref.name").cloned())
    };
    let chosen: Vec<&oci_spec::image::Descriptor> = match tag {
        Some(t) => index
            .manifests()
            .iter()
            .filter(|d| name(d).as_deref() == Some(t))
            .collect(),
        None => index.manifests().iter().collect(),
    };
    match chosen.as_slice() {
        [one] => Ok(one.digest().to_string()),
        [] => Err(ImageError::Refused(format!(
            "{}: no manifest tagged {}",
            dir.display(),
            tag.unwrap_or("(any)")
        ))),
        _ => Err(ImageError::Refused(format!(
            "{}: several manifests; name a tag",
            dir.display()
        ))),
    }
}

/// The platform images are chosen for.
pub const OS: &str = "linux";
pub fn arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    }
}

/// For an index (or a Docker manifest list): the digest of its manifest
/// for this platform; `None` for a manifest.
pub fn platform_manifest(body: &[u8]) -> Result<Option<String>, ImageError> {
    #[derive(serde::Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Probe {
        media_type: Option<String>,
        manifests: Option<serde_json::Value>,
    }
    let probe: Probe =
        serde_json::from_slice(body).map_err(|e| ImageError::Refused(format!("manifest: {e}")))?;
    let is_index = probe.manifests.is_some()
        || probe
            .media_type
            .as_deref()
            .is_some_and(|m| m.contains("index") || m.contains("list"));
    if !is_index {
        return Ok(None);
    }
    let index: oci_spec::image::ImageIndex = serde_json::from_slice(body)
        .map_err(|e| ImageError::Refused(format!("image index: {e}")))?;
    index
        .manifests()
        .iter()
        .find(|m| {
            m.platform()
                .as_ref()
                .is_some_and(|p| p.os().to_string() == OS && p.architecture().to_string() == arch())
        })
        .map(|m| Some(m.digest().to_string()))
        .ok_or_else(|| ImageError::Refused(format!("the index has no image for {OS}/{}", arch())))
}
