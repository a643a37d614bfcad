//! The image store on the host (`[images] store`):
//!
//! ```text
//! layers/<key>/        one layer unpacked (key: 32 hex of its diff_id)
//! layers/<key>.json    its diff_id, bytes, entries, proof: written after the
//!                      directory is renamed in; a directory without it
//!                      is an interrupted commit, removed at start
//! images/<hex>.json    an image (manifest digest): its layers, Env,
//!                      WorkingDir, size
//! refs/<hex>.json      what a reference (a tag, a layout) resolved to;
//!                      at most `refs::MAX_REFS` (module `refs`)
//! tmp/                 work in progress; emptied at start
//! skel/, views/        the views (module `view`)
//! ```
//!
//! Nothing half-made is ever served: a layer is unpacked under `tmp/`,
//! checked (its diff_id against the image's config) and renamed into
//! `layers/` whole; an image record is written (temporary file, rename)
//! only once all its layers are in. The store's bytes are bounded
//! (`max_store_bytes`): each file an unpack writes is charged before it is
//! written; when the store is short, images no live view uses are evicted
//! (least recently used first) with the layers no image references, and
//! when nothing can go the pull fails ("the image store is full"). Work in
//! `tmp/` (a blob, an `oci-archive`'s layout) is not charged.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Instant;

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

use super::ImageError;
use super::fetch::{Fetcher, OS, Registry, arch, check_digest, hex, platform_manifest, sha256_hex};
use super::refs::RefRecord;
use super::tmp::{Uncommitted, Work};
use super::unpack::{Budget, Compression, UnpackError, unpack};
use crate::config::{ImageSource, ImagesSettings};

/// An image in the store.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Image {
    /// The manifest's digest (`sha256:...`): the image's identity.
    pub digest: String,
    /// The reference it was first pulled as.
    pub source: String,
    /// Layer keys, bottom first.
    pub layers: Vec<String>,
    /// The config's `Env` (`NAME=value`).
    pub env: Vec<String>,
    /// The config's `WorkingDir`.
    pub working_dir: Option<String>,
    /// Bytes of its layers, unpacked.
    pub bytes: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct LayerMeta {
    pub(super) diff_id: String,
    pub(super) bytes: u64,
    entries: u64,
    /// Blobs proven to unpack to it, sources that served one (`proof`).
    #[serde(flatten)]
    proven: super::proof::Proven,
}

#[derive(Default)]
pub(super) struct Inner {
    pub(super) images: HashMap<String, Arc<Image>>,
    pub(super) refs: super::refs::Refs,
    pub(super) layers: HashMap<String, LayerMeta>,
    /// Live views per image digest (module `view`): never evicted.
    pub(super) in_use: HashMap<String, usize>,
    /// Layers a pull in progress relies on: never removed.
    pub(super) pinned: HashMap<String, usize>,
    pub(super) last_used: HashMap<String, Instant>,
}

/// The store, shared by every tenant of the gateway.
pub struct ImageStore {
    pub(super) settings: ImagesSettings,
    pub(super) dir: PathBuf,
    pub(super) inner: Mutex<Inner>,
    /// Bytes the store may still take (`max_store_bytes` less what its
    /// layers hold); an unpack charges each file as it writes it.
    pub(super) room: Arc<AtomicI64>,
    pulls: tokio::sync::Semaphore,
    flights: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// `lock`, held (flock) while the store is open: one gateway per
    /// store, since opening one unmounts the views it finds.
    _lock: std::fs::File,
}

impl std::fmt::Debug for ImageStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ImageStore({})", self.dir.display())
    }
}

fn io(what: &str, p: &Path, e: impl std::fmt::Display) -> ImageError {
    ImageError::Unavailable(format!("image store {what} {}: {e}", p.display()))
}

/// Write `bytes` to `path` whole (a temporary file beside it, renamed).
pub(super) fn write_whole(path: &Path, bytes: &[u8]) -> Result<(), ImageError> {
    let tmp = path.with_extension("new");
    std::fs::write(&tmp, bytes).map_err(|e| io("write", &tmp, e))?;
    std::fs::rename(&tmp, path).map_err(|e| io("rename", path, e))
}

impl ImageStore {
    /// Open (creating) the store and make it consistent: work left in
    /// `tmp/` and interrupted layer commits are removed, views left
    /// mounted by a previous run are unmounted, images whose layers are
    /// missing are forgotten, and layers no image references are removed.
    pub fn open(settings: &ImagesSettings) -> Result<Arc<ImageStore>, ImageError> {
        let dir = settings.store.clone();
        for sub in ["layers", "images", "refs", "tmp", "skel", "views"] {
            let p = dir.join(sub);
            std::fs::create_dir_all(&p).map_err(|e| io("create", &p, e))?;
        }
        use std::os::unix::fs::PermissionsExt as _;
        // Only the gateway reads the store's bookkeeping; layers are
        // reached through views.
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o711))
            .map_err(|e| io("chmod", &dir, e))?;
        let lock_path = dir.join("lock");
        let lock = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(|e| io("open", &lock_path, e))?;
        rustix::fs::flock(&lock, rustix::fs::FlockOperation::NonBlockingLockExclusive).map_err(
            |_| {
                ImageError::Unavailable(format!(
                    "image store {} is in use by another gateway (one store per gateway process)",
                    dir.display()
                ))
            },
        )?;
        let read_dir = |sub: &str| -> Vec<PathBuf> {
            std::fs::read_dir(dir.join(sub))
                .map(|it| it.filter_map(|e| e.ok().map(|e| e.path())).collect())
                .unwrap_or_default()
        };
        // Views a previous run left mounted (none is live: the lock).
        for p in read_dir("views") {
            if crate::isolation::disk::is_mount_point(&p) {
                crate::isolation::disk::unmount(&p);
            }
            let _ = std::fs::remove_dir(&p);
        }
        // Their skeletons too.
        for p in read_dir("skel") {
            let _ = std::fs::remove_dir_all(&p);
        }
        let _ = std::fs::remove_dir_all(dir.join("tmp"));
        std::fs::create_dir_all(dir.join("tmp")).map_err(|e| io("create", &dir, e))?;
        let mut inner = Inner::default();
        for p in read_dir("layers") {
            let name = p
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            if let Some(key) = name.strip_suffix(".json") {
                match std::fs::read(&p)
                    .ok()
                    .and_then(|b| serde_json::from_slice::<LayerMeta>(&b).ok())
                {
                    Some(m) if dir.join("layers").join(key).is_dir() => {
                        inner.layers.insert(key.to_owned(), m);
                    }
                    _ => {
                        let _ = std::fs::remove_file(&p);
                    }
                }
            }
        }
        for p in read_dir("layers") {
            let name = p
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            if p.is_dir() && !inner.layers.contains_key(&name) {
                let _ = std::fs::remove_dir_all(&p);
            } else if name.ends_with(".new") {
                let _ = std::fs::remove_file(&p);
            }
        }
        for p in read_dir("images") {
            let image = std::fs::read(&p)
                .ok()
                .and_then(|b| serde_json::from_slice::<Image>(&b).ok())
                .filter(|i| i.layers.iter().all(|l| inner.layers.contains_key(l)));
            match image {
                Some(i) => {
                    inner.last_used.insert(i.digest.clone(), Instant::now());
                    inner.images.insert(i.digest.clone(), Arc::new(i));
                }
                None => {
                    let _ = std::fs::remove_file(&p);
                }
            }
        }
        // Oldest first: the least recently recorded is the least recently
        // used when the bound drops some.
        let mut refs: Vec<(std::time::SystemTime, PathBuf)> = read_dir("refs")
            .into_iter()
            .map(|p| {
                let at = std::fs::metadata(&p)
                    .and_then(|m| m.modified())
                    .unwrap_or(std::time::UNIX_EPOCH);
                (at, p)
            })
            .collect();
        refs.sort();
        for (_, p) in refs {
            match std::fs::read(&p)
                .ok()
                .and_then(|b| serde_json::from_slice::<RefRecord>(&b).ok())
            {
                Some(r)
                    if inner.images.contains_key(&r.digest)
                        && p == super::refs::ref_file(&dir, &r.source) =>
                {
                    inner.refs.insert(&r.source, &r.digest);
                }
                _ => {
                    let _ = std::fs::remove_file(&p);
                }
            }
        }
        let store = ImageStore {
            settings: settings.clone(),
            dir,
            room: Arc::new(AtomicI64::new(0)),
            inner: Mutex::new(inner),
            pulls: tokio::sync::Semaphore::new(settings.max_concurrent_pulls),
            flights: Mutex::new(HashMap::new()),
            _lock: lock,
        };
        store.trim_images(&mut store.inner.lock(), "");
        store.remove_unreferenced_layers(&mut store.inner.lock());
        store.trim_refs(&mut store.inner.lock(), super::refs::MAX_REFS, "");
        let used: u64 = store.inner.lock().layers.values().map(|m| m.bytes).sum();
        store.room.store(
            i64::try_from(settings.max_store_bytes).unwrap_or(i64::MAX)
                - i64::try_from(used).unwrap_or(i64::MAX),
            Ordering::SeqCst,
        );
        Ok(Arc::new(store))
    }

    /// Bytes the store's layers hold.
    pub fn used_bytes(&self) -> u64 {
        self.inner.lock().layers.values().map(|m| m.bytes).sum()
    }

    /// The images in the store, with how many live views use each.
    pub fn list(&self) -> Vec<(Arc<Image>, usize)> {
        let inner = self.inner.lock();
        let mut v: Vec<_> = inner
            .images
            .values()
            .map(|i| (i.clone(), inner.in_use.get(&i.digest).copied().unwrap_or(0)))
            .collect();
        v.sort_by(|a, b| a.0.digest.cmp(&b.0.digest));
        v
    }

    /// Where layer `key` lies unpacked.
    pub(super) fn layer_dir(&self, key: &str) -> PathBuf {
        self.dir.join("layers").join(key)
    }

    /// Count one more live view of `digest`, if the store still has it.
    pub(super) fn hold_if_present(&self, digest: &str) -> bool {
        let mut inner = self.inner.lock();
        if !inner.images.contains_key(digest) {
            return false;
        }
        *inner.in_use.entry(digest.to_owned()).or_default() += 1;
        inner.last_used.insert(digest.to_owned(), Instant::now());
        true
    }

    pub(super) fn release(&self, digest: &str) {
        let mut inner = self.inner.lock();
        if let Some(n) = inner.in_use.get_mut(digest) {
            *n -= 1;
            if *n == 0 {
                inner.in_use.remove(digest);
            }
        }
        inner.last_used.insert(digest.to_owned(), Instant::now());
    }

    /// The image `source` names: from the store when it was pulled
    /// before (a tag is not looked up again), else pulled now (once,
    /// however many ask at once), within `pull_timeout`.
    pub async fn resolve(self: &Arc<Self>, source: &ImageSource) -> Result<Arc<Image>, ImageError> {
        if let Some(i) = self.cached(&source.to_string()) {
            return Ok(i);
        }
        // The pull runs in a task of its own: a caller that goes away (a
        // handshake past its deadline) does not cancel it, and the next
        // caller finds the image in the store (or joins the pull).
        let (store, source) = (self.clone(), source.clone());
        crate::task::start(
            "image-pull",
            async move { store.resolve_here(&source).await },
        )
        .await
        .map_err(|e| ImageError::Unavailable(format!("image pull: {e}")))?
    }

    async fn resolve_here(
        self: &Arc<Self>,
        source: &ImageSource,
    ) -> Result<Arc<Image>, ImageError> {
        let key = source.to_string();
        let flight = self.flight(&key);
        let _one = flight.lock().await;
        if let Some(i) = self.cached(&key) {
            // Pulled by the caller ahead: its entry goes with the last.
            drop(_one);
            drop(flight);
            self.forget_flight(&key);
            return Ok(i);
        }
        let timeout = self.settings.pull_timeout;
        let work = Work::start(&self.dir.join("tmp"))?;
        let mut slot = None;
        let pull = async {
            let closed = |_| ImageError::Unavailable("the store is closed".to_owned());
            slot = Some(self.pulls.acquire().await.map_err(closed)?);
            self.pull(source, &work).await
        };
        let started = Instant::now();
        let r = match tokio::time::timeout(timeout, pull).await {
            Ok(r) => r,
            Err(_) => Err(ImageError::Unavailable(format!(
                "{key}: not pulled within images.pull_timeout ({})",
                humantime::format_duration(timeout)
            ))),
        };
        // A pull past its timeout was dropped, but not its blocking work
        // (an unpack): it is told to stop and waited for, its bytes given
        // back and `tmp/` cleared, before the slot goes to another pull.
        work.stop().await;
        drop(slot);
        self.forget_flight(&key);
        match &r {
            Ok(i) => {
                tracing::info!(image = %key, digest = %i.digest, bytes = i.bytes, ms = started.elapsed().as_millis() as u64, "image pulled")
            }
            Err(e) => tracing::warn!(image = %key, error = %e, "image pull failed"),
        }
        r
    }

    /// Whether a pull of `source` is under way (or waits for a pull
    /// slot): what a handshake that waits for it tells its client.
    pub fn pulling(&self, source: &ImageSource) -> bool {
        self.flights.lock().contains_key(&source.to_string())
    }

    /// The image `source` resolved to, if the store has both (a use of
    /// the reference).
    pub(super) fn cached(&self, source: &str) -> Option<Arc<Image>> {
        let mut inner = self.inner.lock();
        let d = inner.refs.get(source)?;
        inner.images.get(&d).cloned()
    }

    fn flight(&self, key: &str) -> Arc<tokio::sync::Mutex<()>> {
        self.flights
            .lock()
            .entry(key.to_owned())
            .or_default()
            .clone()
    }

    fn forget_flight(&self, key: &str) {
        let mut f = self.flights.lock();
        // Only the map and the caller hold it: nobody waits on it.
        if f.get(key).is_some_and(|m| Arc::strong_count(m) <= 2) {
            f.remove(key);
        }
    }

    async fn pull(
        self: &Arc<Self>,
        source: &ImageSource,
        work: &Work,
    ) -> Result<Arc<Image>, ImageError> {
        let tmp = work.path();
        let (fetcher, tag) = match source {
            ImageSource::Registry {
                reference,
                registry,
            } => {
                if !self.settings.allows(registry) {
                    return Err(ImageError::NotAllowed(format!(
                        "registry `{registry}` is not in [images] registries"
                    )));
                }
                (
                    Fetcher::Registry(Box::new(Registry::new(reference, &self.settings)?)),
                    None,
                )
            }
            ImageSource::Layout { dir, tag } => (Fetcher::Layout(dir.clone()), tag.clone()),
            ImageSource::Archive { file, tag } => {
                let layout = tmp.join("layout");
                let file = file.clone();
                let budget = self.budget_for_archive();
                // Work in `tmp/`, gone when the pull is: bounded by its
                // budget, not charged to the store (whose bytes are its
                // layers').
                let room = AtomicI64::new(i64::try_from(budget.bytes).unwrap_or(i64::MAX));
                work.blocking(move |stop| -> Result<(), ImageError> {
                    std::fs::create_dir(&layout).map_err(|e| io("create", &layout, e))?;
                    let f = std::fs::File::open(&file).map_err(|e| io("open", &file, e))?;
                    unpack(f, Compression::None, &layout, budget, &room, stop)
                        .map_err(|e| ImageError::Refused(format!("{}: {e}", file.display())))?;
                    Ok(())
                })
                .await??;
                (Fetcher::Layout(tmp.join("layout")), tag.clone())
            }
        };
        let mut body = fetcher.manifest(None, tag.as_deref()).await?;
        let mut digest = format!("sha256:{}", sha256_hex(&body));
        if let Some(d) = platform_manifest(&body)? {
            body = fetcher.manifest(Some(&d), None).await?;
            digest = d;
        }
        let origin = super::proof::origin(source);
        // Shared as it is only with a source that served its layers.
        let existing = {
            let inner = self.inner.lock();
            let ok = |k: &String| {
                inner
                    .layers
                    .get(k)
                    .is_some_and(|m| m.proven.served_by(&origin))
            };
            let image = inner.images.get(&digest);
            image.filter(|i| i.layers.iter().all(ok)).cloned()
        };
        let image = match existing {
            Some(i) => i,
            None => {
                let at = source.to_string();
                self.pull_image(&fetcher, &body, &digest, (&at, &origin), work)
                    .await?
            }
        };
        self.remember_ref(&source.to_string(), &image.digest, super::refs::MAX_REFS)?;
        Ok(image)
    }

    fn budget_for_archive(&self) -> Budget {
        Budget {
            bytes: self
                .settings
                .max_image_bytes
                .saturating_add(self.settings.max_layer_bytes),
            entries: 4 * self.settings.max_layers as u64 + 16,
            whiteouts: true,
        }
    }

    async fn pull_image(
        self: &Arc<Self>,
        fetcher: &Fetcher,
        body: &[u8],
        digest: &str,
        (source, origin): (&str, &str),
        work: &Work,
    ) -> Result<Arc<Image>, ImageError> {
        let s = &self.settings;
        let manifest: oci_spec::image::ImageManifest = serde_json::from_slice(body)
            .map_err(|e| ImageError::Refused(format!("manifest: {e}")))?;
        let layers = manifest.layers();
        // Nothing to mount (an overlay needs a lower layer).
        if layers.is_empty() {
            return Err(ImageError::Refused(
                "the manifest names no layers".to_owned(),
            ));
        }
        if layers.len() > s.max_layers {
            return Err(ImageError::Refused(format!(
                "{} layers, more than images.max_layers ({})",
                layers.len(),
                s.max_layers
            )));
        }
        let config = fetcher
            .document(manifest.config().digest().as_ref())
            .await?;
        let config: oci_spec::image::ImageConfiguration = serde_json::from_slice(&config)
            .map_err(|e| ImageError::Refused(format!("image config: {e}")))?;
        if config.os().to_string() != OS || config.architecture().to_string() != arch() {
            return Err(ImageError::Refused(format!(
                "an image for {}/{}, not {OS}/{}",
                config.os(),
                config.architecture(),
                arch()
            )));
        }
        let diff_ids = config.rootfs().diff_ids();
        if diff_ids.len() != layers.len() {
            return Err(ImageError::Refused(format!(
                "the config names {} layers, the manifest {}",
                diff_ids.len(),
                layers.len()
            )));
        }
        let mut keys = Vec::new();
        let mut image_bytes = 0u64;
        let mut image_entries = 0u64;
        let pins = self.pins();
        for (layer, diff_id) in layers.iter().zip(diff_ids) {
            let want = check_digest(diff_id)?.to_owned();
            let key = want[..32].to_owned();
            let compression =
                Compression::of_media_type(layer.media_type().as_ref()).ok_or_else(|| {
                    ImageError::Refused(format!(
                        "layer media type {} is not unpacked here (tar or tar+gzip)",
                        super::fetch::clipped(layer.media_type().as_ref())
                    ))
                })?;
            if layer.size() > s.max_layer_bytes {
                return Err(ImageError::Refused(format!(
                    "a layer of {} bytes, more than images.max_layer_bytes ({})",
                    layer.size(),
                    s.max_layer_bytes
                )));
            }
            pins.pin(&key);
            // One flight per layer and blob: pulls of one blob are made
            // once, and a pull of another blob naming the same diff_id
            // (a hostile one, say, slow to unpack and then refused) holds
            // up no other.
            let flight_key = format!("layer:{key}:{}", layer.digest().as_ref());
            let flight = self.flight(&flight_key);
            let meta = {
                let _one = flight.lock().await;
                let known = self.inner.lock().layers.get(&key).cloned();
                match known {
                    Some(m) if m.diff_id != *diff_id => {
                        return Err(ImageError::Refused(format!(
                            "layer {diff_id}: its first 128 bits name another layer in the store"
                        )));
                    }
                    Some(mut m) => {
                        let bound = s.max_image_bytes.saturating_sub(image_bytes);
                        let proven = &m.proven;
                        let shared = super::proof::share(
                            fetcher,
                            proven,
                            origin,
                            layer,
                            compression,
                            &want,
                            bound,
                            work,
                        );
                        if let Some(p) = shared.await? {
                            m.proven = p;
                            self.record_layer(&key, &m)?;
                        }
                        m
                    }
                    None => {
                        let remaining = Budget {
                            bytes: s.max_image_bytes.saturating_sub(image_bytes),
                            entries: s.max_entries.saturating_sub(image_entries),
                            whiteouts: true,
                        };
                        self.fetch_layer(
                            fetcher,
                            (layer.digest().as_ref(), origin),
                            layer.size(),
                            compression,
                            &want,
                            &key,
                            remaining,
                            work,
                        )
                        .await?
                    }
                }
            };
            self.forget_flight(&flight_key);
            image_bytes += meta.bytes;
            image_entries += meta.entries;
            if image_bytes > s.max_image_bytes || image_entries > s.max_entries {
                return Err(ImageError::Refused(format!(
                    "unpacked, more than images.max_image_bytes ({}) or images.max_entries ({})",
                    s.max_image_bytes, s.max_entries
                )));
            }
            keys.push(key);
        }
        let env = config
            .config()
            .as_ref()
            .and_then(|c| c.env().clone())
            .unwrap_or_default();
        let image = Image {
            digest: digest.to_owned(),
            source: source.to_owned(),
            layers: keys,
            env: env
                .into_iter()
                .filter(|e| e.contains('=') && !e.contains('\0'))
                .take(1024)
                .collect(),
            working_dir: config
                .config()
                .as_ref()
                .and_then(|c| c.working_dir().clone()),
            bytes: image_bytes,
        };
        let record =
            serde_json::to_vec(&image).map_err(|e| ImageError::Unavailable(e.to_string()))?;
        let hexd = check_digest(digest)?;
        // Stored already (its layers now proven for `origin`): it stays.
        if let Some(i) = self.inner.lock().images.get(digest) {
            return Ok(i.clone());
        }
        write_whole(
            &self.dir.join("images").join(format!("{hexd}.json")),
            &record,
        )?;
        let image = Arc::new(image);
        let mut inner = self.inner.lock();
        inner.last_used.insert(image.digest.clone(), Instant::now());
        inner.images.insert(image.digest.clone(), image.clone());
        self.trim_images(&mut inner, &image.digest);
        drop(inner);
        drop(pins);
        Ok(image)
    }

    /// Download, check, unpack and commit one layer.
    #[allow(clippy::too_many_arguments)]
    async fn fetch_layer(
        self: &Arc<Self>,
        fetcher: &Fetcher,
        (blob_digest, origin): (&str, &str),
        size: u64,
        compression: Compression,
        diff_id: &str,
        key: &str,
        budget: Budget,
        work: &Work,
    ) -> Result<LayerMeta, ImageError> {
        let tmp = work.path();
        let blob = tmp.join(format!("{key}.blob"));
        {
            let mut f = tokio::fs::File::create(&blob)
                .await
                .map_err(|e| io("create", &blob, e))?;
            fetcher.blob_to(blob_digest, size, &mut f).await?;
        }
        let dest = tmp.join(key);
        let store = self.clone();
        let (blob2, dest2) = (blob.clone(), dest.clone());
        let bounds = format!(
            "images.max_image_bytes ({}) and images.max_entries ({}) bound the image's layers together",
            self.settings.max_image_bytes, self.settings.max_entries
        );
        let max_store = self.settings.max_store_bytes;
        let unpacked = work.blocking(move |stop| {
            let r = std::fs::create_dir(&dest2)
                .map_err(|e| io("create", &dest2, e))
                .and_then(|()| std::fs::File::open(&blob2).map_err(|e| io("open", &blob2, e)));
            let r = r.and_then(|f| {
                let f = std::io::BufReader::with_capacity(256 << 10, f);
                unpack(f, compression, &dest2, budget, &*store, stop).map_err(|e| match e {
                    UnpackError::Io(e) => io("unpack into", &dest2, e),
                    UnpackError::StoreFull => ImageError::Unavailable(format!(
                        "the image store is full: images.max_store_bytes ({max_store}) is taken by images in use"
                    )),
                    e @ UnpackError::TooLarge(_) => ImageError::Refused(format!("{e} ({bounds})")),
                    e @ UnpackError::Hostile(_) => ImageError::Refused(e.to_string()),
                    e @ UnpackError::Stopped => ImageError::Unavailable(e.to_string()),
                })
            });
            let _ = std::fs::remove_file(&blob2);
            match r {
                // From here on, dropped (a check or the commit failed, or
                // the pull went away) it removes the layer and gives its
                // bytes back.
                Ok(u) => Ok((u, Uncommitted::new(store, dest2, u.bytes))),
                Err(e) => {
                    if stop.load(Ordering::SeqCst) {
                        tracing::info!(dir = %dest2.display(), "layer unpack stopped: its pull ended");
                    }
                    let _ = std::fs::remove_dir_all(&dest2);
                    Err(e)
                }
            }
        });
        let (unpacked, mut layer) = unpacked.await??;
        if hex(&unpacked.diff_id) != diff_id {
            return Err(ImageError::Refused(format!(
                "layer {blob_digest}: its content is not the diff_id sha256:{diff_id} its config names"
            )));
        }
        let meta = LayerMeta {
            diff_id: format!("sha256:{diff_id}"),
            bytes: unpacked.bytes,
            entries: unpacked.entries,
            proven: super::proof::Proven::new(blob_digest, origin),
        };
        let final_dir = self.layer_dir(key);
        // Another blob of the same content may have been unpacked and
        // committed meanwhile (flights are per blob): then this one, now
        // proven too, joins that layer's record and its copy goes.
        let committed = self.inner.lock().layers.get(key).cloned();
        let renamed = match committed {
            Some(_) => Err(std::io::Error::from(std::io::ErrorKind::AlreadyExists)),
            None => std::fs::rename(&dest, &final_dir),
        };
        if let Err(e) = renamed {
            let Some(mut m) = self.inner.lock().layers.get(key).cloned() else {
                return Err(io("commit", &final_dir, e));
            };
            if m.diff_id != meta.diff_id {
                return Err(ImageError::Refused(format!(
                    "layer {}: its first 128 bits name another layer in the store",
                    meta.diff_id
                )));
            }
            m.proven = m.proven.with(blob_digest, origin);
            self.record_layer(key, &m)?;
            return Ok(m);
        }
        layer.moved_to(final_dir);
        self.record_layer(key, &meta)?;
        // Its bytes are the layer's record's now (given back when the
        // layer goes).
        layer.keep();
        Ok(meta)
    }

    /// Write layer `key`'s record (whole) and keep it.
    fn record_layer(&self, key: &str, meta: &LayerMeta) -> Result<(), ImageError> {
        let record =
            serde_json::to_vec(meta).map_err(|e| ImageError::Unavailable(e.to_string()))?;
        write_whole(
            &self.dir.join("layers").join(format!("{key}.json")),
            &record,
        )?;
        self.inner
            .lock()
            .layers
            .insert(key.to_owned(), meta.clone());
        Ok(())
    }
}
