//! References: what a reference (a tag, a layout, an archive) resolved
//! to, kept in memory and as `refs/<hex>.json`, so that a tag is not
//! asked of the registry again. Bounded by [`MAX_REFS`]: past it, the
//! least recently used references go, those of images no live view uses
//! first. A reference is only a name: its next use resolves it again (a
//! manifest fetched; the layers the store has are not). The store's side
//! (recording, dropping files) is in module `gc`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::fetch::sha256_hex;

/// Most references the store keeps (in memory and in `refs/`).
pub const MAX_REFS: usize = 4096;

/// A reference's record (`refs/<hex>.json`).
#[derive(Debug, Serialize, Deserialize)]
pub(super) struct RefRecord {
    pub(super) source: String,
    pub(super) digest: String,
}

/// A reference's image and when it was last used.
#[derive(Debug)]
struct Ref {
    digest: String,
    /// The [`Refs::clock`] at its last use.
    used: u64,
}

/// The references, by source (`ImageSource`'s text), least recently used
/// known by a clock of uses.
#[derive(Debug, Default)]
pub(super) struct Refs {
    by_source: HashMap<String, Ref>,
    clock: u64,
}

impl Refs {
    /// The digest `source` resolved to, counted as a use.
    pub(super) fn get(&mut self, source: &str) -> Option<String> {
        self.clock += 1;
        let r = self.by_source.get_mut(source)?;
        r.used = self.clock;
        Some(r.digest.clone())
    }

    /// `source` resolves to `digest` (a use).
    pub(super) fn insert(&mut self, source: &str, digest: &str) {
        self.clock += 1;
        self.by_source.insert(
            source.to_owned(),
            Ref {
                digest: digest.to_owned(),
                used: self.clock,
            },
        );
    }

    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.by_source.len()
    }

    /// Forget the references to `digest`; their sources.
    pub(super) fn forget_digest(&mut self, digest: &str) -> Vec<String> {
        let gone: Vec<String> = self
            .by_source
            .iter()
            .filter(|(_, r)| r.digest == digest)
            .map(|(s, _)| s.clone())
            .collect();
        for s in &gone {
            self.by_source.remove(s);
        }
        gone
    }

    /// Forget references until at most `max` are left, but never `keep`:
    /// the least recently used of images not `in_use` first, then (when
    /// only references to images in use are left) the least recently
    /// used of those. Their sources.
    pub(super) fn trim(
        &mut self,
        max: usize,
        keep: &str,
        in_use: &HashMap<String, usize>,
    ) -> Vec<String> {
        let over = self.by_source.len().saturating_sub(max);
        if over == 0 {
            return Vec::new();
        }
        let mut order: Vec<(bool, u64, &String)> = self
            .by_source
            .iter()
            .filter(|(s, _)| s.as_str() != keep)
            .map(|(s, r)| (in_use.contains_key(&r.digest), r.used, s))
            .collect();
        order.sort_unstable();
        let gone: Vec<String> = order
            .into_iter()
            .take(over)
            .map(|(_, _, s)| s.clone())
            .collect();
        for s in &gone {
            self.by_source.remove(s);
        }
        gone
    }
}

/// The file of `source`'s record under the store `dir`.
pub(super) fn ref_file(dir: &Path, source: &str) -> PathBuf {
    dir.join("refs")
        .join(format!("{}.json", &sha256_hex(source.as_bytes())[..32]))
}
