//! Proof that an image's layer is what the store holds under its
//! diff_id, and that the image's source has it: a layer already in the
//! store is shared with a new image only
//!
//! - once that image's own blob has been fetched and found to unpack to
//!   the same diff_id: otherwise an image that merely names another's
//!   diff_id in its config (a private layer of another tenant's, say)
//!   would be handed its contents without ever having had them;
//! - and once the source pulling it (a registry's repository, a layout,
//!   an archive) has served that blob itself: otherwise a registry that
//!   names a blob digest it does not hold (a hostile one, or one that
//!   does not check that a manifest's blobs exist) would hand its tenants
//!   a layer another source proved. A blob digest already proven needs
//!   only its bytes downloaded and checked against it, not unpacked.
//!
//! What was proven is kept with the layer's record ([`Proven`]), each list
//! bounded, the oldest entry dropped first; a record from before sources
//! were kept has none: the next pull proves its source.

use std::io::Read as _;
use std::sync::atomic::Ordering;

use serde::{Deserialize, Serialize};
use sha2::Digest as _;

use super::ImageError;
use super::fetch::{Fetcher, hex};
use super::tmp::Work;
use super::unpack::Compression;
use crate::config::ImageSource;

/// Most blob digests remembered as proven for one layer.
pub const MAX_PROVEN_BLOBS: usize = 8;
/// Most sources remembered as holding one layer's blob.
pub const MAX_PROVEN_SOURCES: usize = 64;

/// What is proven of one stored layer: the blobs shown to unpack to it
/// and the sources that served one, newest first.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Proven {
    #[serde(default)]
    blobs: Vec<String>,
    #[serde(default)]
    sources: Vec<String>,
}

impl Proven {
    /// A layer just unpacked from blob `blob`, served by `origin`.
    pub fn new(blob: &str, origin: &str) -> Proven {
        Proven {
            blobs: vec![blob.to_owned()],
            sources: vec![origin.to_owned()],
        }
    }

    /// Whether `origin` has served this layer's blob.
    pub fn served_by(&self, origin: &str) -> bool {
        self.sources.iter().any(|s| s == origin)
    }

    /// This, with blob `digest` proven and `origin` as having served it,
    /// each first, the oldest dropped past its bound.
    pub fn with(&self, digest: &str, origin: &str) -> Proven {
        let mut p = self.clone();
        for (list, new, max) in [
            (&mut p.blobs, digest, MAX_PROVEN_BLOBS),
            (&mut p.sources, origin, MAX_PROVEN_SOURCES),
        ] {
            list.retain(|x| x != new);
            list.truncate(max - 1);
            list.insert(0, new.to_owned());
        }
        p
    }
}

/// Where an image's blobs come from, as [`Proven`] records it: a
/// registry's host and repository (the registry checks a blob's presence
/// per repository), a layout's directory, an archive's file.
pub fn origin(source: &ImageSource) -> String {
    match source {
        ImageSource::Registry { reference, .. } => {
            match oci_client::Reference::try_from(reference.as_str()) {
                Ok(r) => format!("{}/{}", r.registry(), r.repository()),
                // Not parsed: the whole reference, a source of its own.
                Err(_) => reference.clone(),
            }
        }
        ImageSource::Layout { dir, .. } => format!("oci:{}", dir.display()),
        ImageSource::Archive { file, .. } => format!("oci-archive:{}", file.display()),
    }
}

/// Share the stored layer `proven` describes with an image from `origin`
/// naming it by blob `layer` (`diff_id` in hex; at most `bound` bytes
/// uncompressed): nothing to do (`None`) when `origin` has served a blob
/// proven for it; else the blob is fetched from `origin` (checked against
/// its digest, and unpacked to its diff_id when the digest is not one
/// proven yet) and what is proven now is returned, for the record.
#[allow(clippy::too_many_arguments)]
pub async fn share(
    fetcher: &Fetcher,
    proven: &Proven,
    origin: &str,
    layer: &oci_spec::image::Descriptor,
    compression: Compression,
    diff_id: &str,
    bound: u64,
    work: &Work,
) -> Result<Option<Proven>, ImageError> {
    let digest = layer.digest().as_ref();
    let known = proven.blobs.iter().any(|b| b == digest);
    if known && proven.served_by(origin) {
        return Ok(None);
    }
    if known {
        // What it unpacks to is proven: only that `origin` holds it is
        // not, so its bytes, checked against its digest as they stream.
        fetcher
            .blob_to(digest, layer.size(), &mut tokio::io::sink())
            .await?;
    } else {
        prove(
            fetcher,
            digest,
            layer.size(),
            compression,
            diff_id,
            bound,
            work,
        )
        .await?;
    }
    Ok(Some(proven.with(digest, origin)))
}

/// Fetch blob `digest` (at most `size` bytes) into the pull's `work`
/// directory and check that it decompresses (to at most `bound` bytes) to
/// `diff_id` (hex): hashed as part of the pull's work, so it stops with
/// the pull (its timeout) and holds the pull's slot until it has.
async fn prove(
    fetcher: &Fetcher,
    digest: &str,
    size: u64,
    compression: Compression,
    diff_id: &str,
    bound: u64,
    work: &Work,
) -> Result<(), ImageError> {
    let blob = work.path().join("proof.blob");
    {
        let mut f = tokio::fs::File::create(&blob)
            .await
            .map_err(|e| ImageError::Unavailable(format!("image store: {e}")))?;
        fetcher.blob_to(digest, size, &mut f).await?;
    }
    let path = blob.clone();
    let got = work
        .blocking(move |stop| -> std::io::Result<String> {
            let f = std::io::BufReader::new(std::fs::File::open(&path)?);
            let mut r: Box<dyn std::io::Read> = match compression {
                Compression::None => Box::new(f),
                Compression::Gzip => Box::new(flate2::read::MultiGzDecoder::new(f)),
            };
            let mut r = (&mut r).take(bound.saturating_add(1));
            let mut hash = sha2::Sha256::new();
            let mut buf = vec![0u8; 256 << 10];
            let mut n = 0u64;
            loop {
                if stop.load(Ordering::Relaxed) {
                    return Err(std::io::Error::other("stopped: its pull ended"));
                }
                let k = r.read(&mut buf)?;
                if k == 0 {
                    break;
                }
                n += k as u64;
                hash.update(&buf[..k]);
            }
            if n > bound {
                return Err(std::io::Error::other(
                    "larger than the image's bound uncompressed",
                ));
            }
            Ok(hex(&hash.finalize()))
        })
        .await?;
    let _ = std::fs::remove_file(&blob);
    match got {
        Ok(h) if h == diff_id => Ok(()),
        Ok(_) => Err(ImageError::Refused(format!(
            "layer {digest}: its content is not the diff_id sha256:{diff_id} its config names"
        ))),
        Err(e) => Err(ImageError::Refused(format!("layer {digest}: {e}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_without_sources_has_none_and_each_list_keeps_its_newest() {
        // A layer's record from before sources were kept.
        let old: Proven = serde_json::from_str(r#"{"blobs":["sha256:a"]}"#).unwrap();
        assert!(!old.served_by("reg/x"));
        let p = old.with("sha256:a", "reg/x");
        assert_eq!(p.blobs, ["sha256:a"]);
        assert!(p.served_by("reg/x") && !p.served_by("reg/y"));
        let mut p = p;
        for i in 0..MAX_PROVEN_SOURCES + 5 {
            p = p.with(&format!("sha256:{i}"), &format!("reg/{i}"));
        }
        assert_eq!(p.sources.len(), MAX_PROVEN_SOURCES);
        assert_eq!(p.blobs.len(), MAX_PROVEN_BLOBS);
        assert!(!p.served_by("reg/x") && !p.served_by("reg/4"));
        assert!(p.served_by("reg/5"));
        // Proven again: first, not twice.
        let p = p.with("sha256:9", "reg/5");
        assert_eq!(p.sources[0], "reg/5");
        assert_eq!(p.sources.iter().filter(|s| *s == "reg/5").count(), 1);
    }

    #[test]
    fn a_source_is_a_repository_a_layout_or_an_archive() {
        let o = |s: &str| origin(&ImageSource::parse(s).unwrap());
        assert_eq!(
            o("reg.example:5000/team/app:v1"),
            "reg.example:5000/team/app"
        );
        assert_eq!(
            o("reg.example:5000/team/app:v2"),
            o(
                "reg.example:5000/team/app@sha256:0000000000000000000000000000000000000000000000000000000000000000"
            )
        );
        assert_ne!(o("reg.example/team/app:v1"), o("reg.example/team/other:v1"));
        assert_ne!(o("reg.example/team/app:v1"), o("other.example/team/app:v1"));
        assert_eq!(o("oci:/srv/layout:v1"), "oci:/srv/layout");
        assert_eq!(o("oci-archive:/srv/a.tar:v1"), "oci-archive:/srv/a.tar");
    }
}
