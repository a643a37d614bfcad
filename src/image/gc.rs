//! Eviction: the store's bound kept by removing images no live view
//! uses, least recently used first, then the layers no image references;
//! and the store as the [`Room`] an unpack charges, which evicts when it
//! runs short.

use std::sync::atomic::Ordering;

use super::fetch::check_digest;
use super::store::{ImageStore, Inner, RefRecord};
use super::unpack::Room;

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

    pub(super) fn forget_image(&self, inner: &mut Inner, digest: &str) {
        inner.images.remove(digest);
        inner.last_used.remove(digest);
        inner.refs.retain(|_, d| d != digest);
        if let Ok(h) = check_digest(digest) {
            let _ = std::fs::remove_file(self.dir.join("images").join(format!("{h}.json")));
        }
        for p in std::fs::read_dir(self.dir.join("refs"))
            .into_iter()
            .flatten()
            .flatten()
        {
            let gone = std::fs::read(p.path())
                .ok()
                .and_then(|b| serde_json::from_slice::<RefRecord>(&b).ok())
                .is_some_and(|r| r.digest == digest);
            if gone {
                let _ = std::fs::remove_file(p.path());
            }
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
