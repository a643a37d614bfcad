//! Proof that an image's layer is what the store holds under its
//! diff_id: a layer already in the store is shared with a new image only
//! once that image's own blob has been fetched and found to unpack to
//! the same diff_id. Otherwise an image that merely names another's
//! diff_id in its config (a private layer of another tenant's, say)
//! would be handed its contents without ever having had them.

use std::io::Read as _;
use std::path::Path;

use sha2::Digest as _;

use super::ImageError;
use super::fetch::{Fetcher, hex};
use super::unpack::Compression;

/// Most blob digests remembered as proven for one layer.
pub const MAX_PROVEN_BLOBS: usize = 8;

/// Fetch blob `digest` (at most `size` bytes) into `tmp` and check that
/// it decompresses (to at most `bound` bytes) to `diff_id` (hex).
pub async fn prove(
    fetcher: &Fetcher,
    digest: &str,
    size: u64,
    compression: Compression,
    diff_id: &str,
    bound: u64,
    tmp: &Path,
) -> Result<(), ImageError> {
    let blob = tmp.join("proof.blob");
    {
        let mut f = tokio::fs::File::create(&blob)
            .await
            .map_err(|e| ImageError::Unavailable(format!("image store: {e}")))?;
        fetcher.blob_to(digest, size, &mut f).await?;
    }
    let path = blob.clone();
    let got = tokio::task::spawn_blocking(move || -> std::io::Result<String> {
        let f = std::io::BufReader::new(std::fs::File::open(&path)?);
        let mut r: Box<dyn std::io::Read> = match compression {
            Compression::None => Box::new(f),
            Compression::Gzip => Box::new(flate2::read::GzDecoder::new(f)),
        };
        let mut r = (&mut r).take(bound.saturating_add(1));
        let mut hash = sha2::Sha256::new();
        let mut buf = vec![0u8; 256 << 10];
        let mut n = 0u64;
        loop {
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
    .await
    .map_err(|e| ImageError::Unavailable(e.to_string()))?;
    let _ = std::fs::remove_file(&blob);
    match got {
        Ok(h) if h == diff_id => Ok(()),
        Ok(_) => Err(ImageError::Refused(format!(
            "layer {digest}: its content is not the diff_id sha256:{diff_id} its config names"
        ))),
        Err(e) => Err(ImageError::Refused(format!("layer {digest}: {e}"))),
    }
}
