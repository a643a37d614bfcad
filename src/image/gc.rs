//! Eviction: the store's bound kept by removing images no live view
//! uses, least recently used first, then the layers no image references;
//! the store as the [`Room`] an unpack charges, which evicts when it
//! runs short; and the references kept within `refs::MAX_REFS`.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use parking_lot::Mutex;

use super::ImageError;
use super::fetch::check_digest;
use super::refs::{RefRecord, ref_file};
use super::store::{ImageStore, Inner, write_whole};
use super::unpack::Room;

/// Most image records a store keeps (each a small file in `images/`).
pub const MAX_IMAGES: usize = 1024;

impl ImageStore {
    /// Evict images no live view uses (least recently used first), and
    /// then the layers no image references, until `need` bytes are free
    /// or nothing more can go.
    pub fn make_room(&self, need: u64) {
        let need = i64::try_from(need).unwrap_or(i64::MAX);
        let mut inner = self.inner.lock();
        while self.room.load(Ordering::SeqCst) < need {
            let victim = inner
                .images
                .keys()
                .filter(|d| !inner.in_use.contains_key(*d))
                .min_by_key(|d| inner.last_used.get(*d).copied())
                .cloned();
            let Some(d) = victim else { break };
            self.forget_image(&mut inner, &d);
            self.remove_unreferenced_layers(&mut inner);
        }
    }

    /// Keep the image records within [`MAX_IMAGES`]: records cost almost
    /// no bytes (images of shared or no layers), so the byte bound alone
    /// would not hold them. Least recently used first, never one a live
    /// view uses, nor `keep` (the one just recorded).
    pub(super) fn trim_images(&self, inner: &mut Inner, keep: &str) {
        let mut evicted = false;
        while inner.images.len() > MAX_IMAGES {
            let victim = inner
                .images
                .keys()
                .filter(|d| *d != keep && !inner.in_use.contains_key(*d))
                .min_by_key(|d| inner.last_used.get(*d).copied())
                .cloned();
            let Some(d) = victim else { break };
            self.forget_image(inner, &d);
            evicted = true;
        }
        if evicted {
            self.remove_unreferenced_layers(inner);
        }
    }

    pub(super) fn forget_image(&self, inner: &mut Inner, digest: &str) {
        inner.images.remove(digest);
        inner.last_used.remove(digest);
        if let Ok(h) = check_digest(digest) {
            let _ = std::fs::remove_file(self.dir.join("images").join(format!("{h}.json")));
        }
        // Memory and `refs/` hold the same references (module `refs`).
        for source in inner.refs.forget_digest(digest) {
            let _ = std::fs::remove_file(ref_file(&self.dir, &source));
        }
        tracing::info!(digest, "image evicted from the store");
    }

    pub(super) fn remove_unreferenced_layers(&self, inner: &mut Inner) {
        let referenced: std::collections::HashSet<&String> = inner
            .images
            .values()
            .flat_map(|i| i.layers.iter())
            .collect();
        let gone: Vec<String> = inner
            .layers
            .keys()
            .filter(|k| !referenced.contains(k) && !inner.pinned.contains_key(*k))
            .cloned()
            .collect();
        for k in gone {
            if let Some(m) = inner.layers.remove(&k) {
                let _ = std::fs::remove_file(self.dir.join("layers").join(format!("{k}.json")));
                let _ = std::fs::remove_dir_all(self.layer_dir(&k));
                self.room
                    .fetch_add(i64::try_from(m.bytes).unwrap_or(0), Ordering::SeqCst);
            }
        }
    }
}

/// The store's free bytes as an unpack takes them: when they run short,
/// images no live view uses are evicted to give them.
impl Room for ImageStore {
    fn take(&self, n: u64) -> bool {
        self.room.take(n) || {
            self.make_room(0);
            self.room.load(Ordering::SeqCst) >= 0
        }
    }

    fn give(&self, n: u64) {
        self.room.give(n);
    }
}

impl ImageStore {
    /// Record that `source` resolves to `digest` (its file written whole),
    /// if the store still has the image, and keep at most `max`
    /// references. Under the store's lock: an eviction either comes
    /// first (nothing recorded) or finds the reference.
    pub(super) fn remember_ref(
        &self,
        source: &str,
        digest: &str,
        max: usize,
    ) -> Result<(), ImageError> {
        let record = serde_json::to_vec(&RefRecord {
            source: source.to_owned(),
            digest: digest.to_owned(),
        })
        .map_err(|e| ImageError::Unavailable(e.to_string()))?;
        let mut inner = self.inner.lock();
        if !inner.images.contains_key(digest) {
            return Ok(());
        }
        write_whole(&ref_file(&self.dir, source), &record)?;
        inner.refs.insert(source, digest);
        self.trim_refs(&mut inner, max, source);
        Ok(())
    }

    /// Keep at most `max` references (never `keep`), their files too.
    pub(super) fn trim_refs(&self, inner: &mut Inner, max: usize, keep: &str) {
        let Inner { refs, in_use, .. } = inner;
        for s in refs.trim(max, keep, in_use) {
            let _ = std::fs::remove_file(ref_file(&self.dir, &s));
            tracing::debug!(image = %s, "image reference dropped (images.MAX_REFS)");
        }
    }
}

/// Layers a pull relies on, unpinned when it ends (done or not).
pub(super) struct Pins {
    store: Arc<ImageStore>,
    keys: Mutex<Vec<String>>,
}

impl ImageStore {
    /// The pins of a pull: the layers it relies on, kept from removal
    /// until it ends (done or not).
    pub(super) fn pins(self: &Arc<Self>) -> Pins {
        Pins {
            store: self.clone(),
            keys: Mutex::new(Vec::new()),
        }
    }
}

impl Pins {
    pub(super) fn pin(&self, key: &str) {
        *self
            .store
            .inner
            .lock()
            .pinned
            .entry(key.to_owned())
            .or_default() += 1;
        self.keys.lock().push(key.to_owned());
    }
}

impl Drop for Pins {
    fn drop(&mut self) {
        let mut inner = self.store.inner.lock();
        for k in self.keys.lock().drain(..) {
            if let Some(n) = inner.pinned.get_mut(&k) {
                *n -= 1;
                if *n == 0 {
                    inner.pinned.remove(&k);
                }
            }
        }
        // A failed pull's layers that no image references go now.
        self.store.remove_unreferenced_layers(&mut inner);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::image::Image;
    use std::path::Path;
    use std::sync::Arc;

    fn image(digest: &str) -> Arc<Image> {
        Arc::new(Image {
            digest: digest.to_owned(),
            source: String::new(),
            layers: Vec::new(),
            env: Vec::new(),
            working_dir: None,
            bytes: 0,
        })
    }

    /// A store of the default settings in a directory of its own.
    fn store() -> (
        tempfile::TempDir,
        crate::config::ImagesSettings,
        std::sync::Arc<ImageStore>,
    ) {
        let dir = tempfile::tempdir().unwrap();
        let settings = crate::config::ImagesConfig {
            store: Some(dir.path().join("store")),
            ..Default::default()
        }
        .validate()
        .unwrap();
        let store = ImageStore::open(&settings).unwrap();
        (dir, settings, store)
    }

    fn refs_on_disk(dir: &Path) -> usize {
        std::fs::read_dir(dir.join("refs")).unwrap().count()
    }

    /// Guards the bound on `refs/`: past it the least recently used
    /// reference of an unused image goes (memory and file), a reference
    /// to an image in use stays while another can go, a use counts as
    /// recent, and a store reopened keeps what was kept.
    #[test]
    fn references_are_bounded_least_recently_used_unused_images_first() {
        let (_dir, settings, store) = store();
        let d = |n: u32| format!("sha256:{n:064x}");
        {
            let mut inner = store.inner.lock();
            for n in 0..4 {
                inner.images.insert(d(n), image(&d(n)));
            }
            // Image 0 is in use.
            inner.in_use.insert(d(0), 1);
        }
        let max = 3;
        store.remember_ref("r/in-use:1", &d(0), max).unwrap();
        store.remember_ref("r/a:1", &d(1), max).unwrap();
        store.remember_ref("r/b:1", &d(2), max).unwrap();
        // `a` used again: `b` is now the least recently used.
        assert_eq!(store.cached("r/a:1").map(|i| i.digest.clone()), Some(d(1)));
        store.remember_ref("r/c:1", &d(3), max).unwrap();
        assert!(store.cached("r/b:1").is_none(), "b is the one dropped");
        assert!(store.cached("r/in-use:1").is_some(), "in use: kept");
        assert!(store.cached("r/a:1").is_some());
        assert!(store.cached("r/c:1").is_some());
        assert_eq!(refs_on_disk(&store.dir), max);
        assert!(!ref_file(&store.dir, "r/b:1").exists());
        // A reference to an image gone is not recorded.
        store.remember_ref("r/gone:1", &d(9), max).unwrap();
        assert!(!ref_file(&store.dir, "r/gone:1").exists());
        // Only references to images in use left: the oldest of them goes.
        {
            let mut inner = store.inner.lock();
            for n in 1..4 {
                inner.in_use.insert(d(n), 1);
            }
        }
        store.remember_ref("r/in-use:2", &d(0), max).unwrap();
        assert_eq!(store.inner.lock().refs.len(), max);
        assert!(
            store.cached("r/in-use:1").is_none(),
            "the oldest in use goes"
        );
        assert!(store.cached("r/in-use:2").is_some(), "the new one stays");
        assert_eq!(refs_on_disk(&store.dir), max);
        // Reopened: the same references (their images have no layers,
        // so their records load).
        for n in 0..4 {
            let p = store.dir.join("images").join(format!("{n:064x}.json"));
            std::fs::write(p, serde_json::to_vec(&*image(&d(n))).unwrap()).unwrap();
        }
        let dir_path = store.dir.clone();
        drop(store);
        let store = ImageStore::open(&settings).unwrap();
        assert_eq!(store.inner.lock().refs.len(), max);
        assert_eq!(refs_on_disk(&dir_path), max);
        assert!(store.cached("r/in-use:2").is_some());
    }

    /// Guards the bound on image records: records of layerless images
    /// cost no bytes, so without it `images/` grows with every digest
    /// pulled. Past `MAX_IMAGES` the least recently used unused record
    /// goes; one in use and the one just recorded stay.
    #[test]
    fn image_records_are_bounded_whatever_their_bytes() {
        let (_dir, _, store) = store();
        let d = |n: usize| format!("sha256:{n:064x}");
        let mut inner = store.inner.lock();
        let start = std::time::Instant::now();
        for n in 0..=MAX_IMAGES {
            inner.images.insert(d(n), image(&d(n)));
            let at = start + std::time::Duration::from_millis(n as u64);
            inner.last_used.insert(d(n), at);
        }
        // The oldest is in use; the newest was just recorded.
        inner.in_use.insert(d(0), 1);
        store.trim_images(&mut inner, &d(MAX_IMAGES));
        assert_eq!(inner.images.len(), MAX_IMAGES);
        assert!(inner.images.contains_key(&d(0)), "in use: kept");
        assert!(inner.images.contains_key(&d(MAX_IMAGES)), "new: kept");
        assert!(
            !inner.images.contains_key(&d(1)),
            "least recently used: gone"
        );
    }
}
