//! The snapshots on disk.
//!
//! Layout under `[snapshots] store` (mode 0700, the gateway's):
//! `tenants/<hex of the tenant's name>/<id>/{meta.json,tree/}` for each
//! snapshot, `tmp/` for captures under way, `forks/` for the workspaces of
//! forks (module `workspace`). A capture is made in `tmp/` and renamed into
//! place with its record, so a crash leaves either a whole snapshot or
//! nothing; what `tmp/` and `forks/` hold is removed at start, as is a
//! snapshot directory without its record (deleted while a fork used it).
//!
//! One tenant's snapshots are found only under its own directory: another
//! tenant's id answers like an unknown one.

use std::collections::{BTreeMap, HashMap};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicUsize, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use parking_lot::Mutex;

use super::capture::{CaptureError, Source, capture, chown_tree};
use super::tree::Tree;
use super::workspace::Workspace;
use super::{Snapshot, SnapshotError, check_meta, is_id};
use crate::config::SnapshotsSettings;
use crate::image::unpack::Room as _;

/// Every tenant's snapshots.
pub struct SnapshotStore {
    /// Holds the store's lock (`flock` on `lock`): one gateway per store.
    _lock: std::fs::File,
    settings: SnapshotsSettings,
    remote: Option<super::Remote>,
    transfers: Arc<tokio::sync::Semaphore>,
    tenants: Mutex<HashMap<String, Arc<TenantSnapshots>>>,
}

/// One tenant's snapshots.
pub struct TenantSnapshots {
    dir: PathBuf,
    pub(super) tmp: PathBuf,
    forks_dir: PathBuf,
    pub(super) settings: SnapshotsSettings,
    /// The registry snapshots are pushed to, and this tenant's key there.
    pub(super) remote: Option<(super::Remote, String)>,
    /// One push or pull at a time per tenant, and [`MAX_TRANSFERS`] in
    /// all (each writes a layer of up to the tenant's share to `tmp/`).
    pub(super) transfer: Arc<tokio::sync::Semaphore>,
    pub(super) transfers: Arc<tokio::sync::Semaphore>,
    /// By id, each with its tree.
    pub(super) records: Mutex<BTreeMap<String, (Snapshot, Arc<Tree>)>>,
    /// Free bytes of the tenant's share (`max_tenant_bytes`): trees of
    /// deleted snapshots still charged until their last fork ends.
    pub(super) room: Arc<AtomicI64>,
    /// Forks working now.
    forks: Arc<AtomicUsize>,
    /// One capture at a time per tenant (each walks its whole workspace).
    capturing: Arc<tokio::sync::Semaphore>,
}

/// Pushes and pulls of snapshots under way at once, all tenants together.
pub const MAX_TRANSFERS: usize = 4;

pub(super) fn io_err(what: &str) -> impl Fn(io::Error) -> SnapshotError + '_ {
    move |e| SnapshotError::Io(format!("{what}: {e}"))
}

pub(super) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

pub(super) fn mkdir_private(p: &Path) -> io::Result<()> {
    use std::os::unix::fs::DirBuilderExt as _;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(p)
}

impl SnapshotStore {
    /// Open (or create) the store; what a crash left half done goes.
    pub fn open(
        settings: &SnapshotsSettings,
        images: &crate::config::ImagesSettings,
    ) -> Result<Arc<SnapshotStore>, SnapshotError> {
        let root = &settings.store;
        for sub in ["tenants", "tmp", "forks"] {
            mkdir_private(&root.join(sub)).map_err(io_err("creating the store"))?;
        }
        // Another gateway on this store would remove this one's forks and
        // captures as left over: the second is refused.
        let lock = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(root.join("lock"))
            .map_err(io_err("opening the store's lock"))?;
        rustix::fs::flock(&lock, rustix::fs::FlockOperation::NonBlockingLockExclusive).map_err(
            |_| {
                SnapshotError::Io(format!(
                    "{} is in use by another gateway (one gateway per store)",
                    root.display()
                ))
            },
        )?;
        super::workspace::clear_forks(&root.join("forks"));
        clear_dir(&root.join("tmp"));
        Ok(Arc::new(SnapshotStore {
            _lock: lock,
            settings: settings.clone(),
            remote: settings
                .registry
                .clone()
                .map(|(r, key)| super::Remote::new(r, images.clone(), key)),
            transfers: Arc::new(tokio::sync::Semaphore::new(MAX_TRANSFERS)),
            tenants: Mutex::new(HashMap::new()),
        }))
    }

    /// Tenant `name`'s snapshots (read from disk at first need).
    pub fn tenant(&self, name: &str) -> Result<Arc<TenantSnapshots>, SnapshotError> {
        let mut tenants = self.tenants.lock();
        if let Some(t) = tenants.get(name) {
            return Ok(t.clone());
        }
        let hex: String = name.bytes().map(|b| format!("{b:02x}")).collect();
        let root = &self.settings.store;
        let mut t = TenantSnapshots::load(
            root.join("tenants").join(hex),
            root.join("tmp"),
            root.join("forks"),
            &self.settings,
        )?;
        t.remote = self
            .remote
            .clone()
            .map(|r| (r, super::remote::tenant_key(name)));
        t.transfers = self.transfers.clone();
        let t = Arc::new(t);
        tenants.insert(name.to_owned(), t.clone());
        Ok(t)
    }
}

/// Remove everything in `dir` (not `dir` itself).
fn clear_dir(dir: &Path) {
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            let p = e.path();
            let r = if p.is_dir() && !p.is_symlink() {
                std::fs::remove_dir_all(&p)
            } else {
                std::fs::remove_file(&p)
            };
            if let Err(e) = r {
                tracing::warn!(path = %p.display(), error = %e, "snapshot store: left over");
            }
        }
    }
}

impl TenantSnapshots {
    fn load(
        dir: PathBuf,
        tmp: PathBuf,
        forks_dir: PathBuf,
        settings: &SnapshotsSettings,
    ) -> Result<TenantSnapshots, SnapshotError> {
        mkdir_private(&dir).map_err(io_err("creating the tenant's directory"))?;
        let room = Arc::new(AtomicI64::new(
            i64::try_from(settings.max_tenant_bytes).unwrap_or(i64::MAX),
        ));
        let mut records = BTreeMap::new();
        let now = now_ms();
        for e in std::fs::read_dir(&dir)
            .map_err(io_err("reading the tenant's snapshots"))?
            .flatten()
        {
            let p = e.path();
            let id = e.file_name().to_string_lossy().into_owned();
            let meta: Option<Snapshot> = std::fs::read(p.join("meta.json"))
                .ok()
                .and_then(|b| serde_json::from_slice(&b).ok())
                .filter(|m: &Snapshot| m.id == id && is_id(&id));
            let kept = meta.filter(|m| m.expires_at_ms.is_none_or(|t| t > now));
            let tree = Arc::new(Tree {
                dir: parking_lot::Mutex::new(p.clone()),
                bytes: kept.as_ref().map_or(0, |m| m.bytes),
                deleted: AtomicBool::new(kept.is_none()),
                room: room.clone(),
            });
            // Expired, deleted while a fork used it, or torn: removed
            // (the tree's drop) with nothing to give back.
            if let Some(m) = kept {
                room.take(m.bytes);
                records.insert(id, (m, tree));
            }
        }
        Ok(TenantSnapshots {
            dir,
            tmp,
            forks_dir,
            settings: settings.clone(),
            remote: None,
            transfer: Arc::new(tokio::sync::Semaphore::new(1)),
            transfers: Arc::new(tokio::sync::Semaphore::new(MAX_TRANSFERS)),
            records: Mutex::new(records),
            room,
            forks: Arc::new(AtomicUsize::new(0)),
            capturing: Arc::new(tokio::sync::Semaphore::new(1)),
        })
    }

    /// When retention deletes what was taken (or restored) at `at_ms`.
    pub(super) fn expiry(&self, at_ms: u64) -> u64 {
        at_ms.saturating_add(u64::try_from(self.settings.retention.as_millis()).unwrap_or(u64::MAX))
    }

    /// Delete what retention has expired.
    fn expire(&self) {
        let now = now_ms();
        let expired: Vec<String> = self
            .records
            .lock()
            .iter()
            .filter(|(_, (m, _))| m.expires_at_ms.is_some_and(|t| t <= now))
            .map(|(id, _)| id.clone())
            .collect();
        for id in expired {
            let _ = self.delete(&id);
        }
    }

    /// The tenant's snapshots, oldest first.
    pub fn list(&self) -> Vec<Snapshot> {
        self.expire();
        let mut all: Vec<Snapshot> = self
            .records
            .lock()
            .values()
            .map(|(m, _)| m.clone())
            .collect();
        all.sort_by(|a, b| (a.created_at_ms, &a.id).cmp(&(b.created_at_ms, &b.id)));
        all
    }

    /// One snapshot of the tenant's.
    pub fn get(&self, id: &str) -> Result<Snapshot, SnapshotError> {
        self.expire();
        self.records
            .lock()
            .get(id)
            .map(|(m, _)| m.clone())
            .ok_or_else(|| SnapshotError::Unknown(id.to_owned()))
    }

    /// Delete a snapshot: gone from the list at once; its tree stays until
    /// the last fork working on it ends.
    pub fn delete(&self, id: &str) -> Result<(), SnapshotError> {
        let (_, tree) = self
            .records
            .lock()
            .remove(id)
            .ok_or_else(|| SnapshotError::Unknown(id.to_owned()))?;
        let dir = tree.dir();
        if let Err(e) = std::fs::remove_file(dir.join("meta.json")) {
            tracing::warn!(snapshot = id, error = %e, "snapshot record left on disk");
        }
        // Out of the id's way (a fork may still work on it): the id can be
        // restored again meanwhile. Forks hold its tree by their mounts,
        // not its path. A name that is not an id goes at the next start.
        let aside = self
            .dir
            .join(format!(".deleted-{}", uuid::Uuid::new_v4().simple()));
        match std::fs::rename(&dir, &aside) {
            Ok(()) => *tree.dir.lock() = aside,
            Err(e) => tracing::warn!(snapshot = id, error = %e, "deleted tree not moved aside"),
        }
        tree.deleted.store(true, Ordering::SeqCst);
        Ok(())
    }

    /// A permit to capture (one at a time per tenant).
    pub async fn capture_permit(&self) -> Option<tokio::sync::OwnedSemaphorePermit> {
        self.capturing.clone().acquire_owned().await.ok()
    }

    /// Capture `source` (blocking: call off the async threads, holding
    /// [`Self::capture_permit`]). `hold` freezes the tenant's processes
    /// for the walk. The tree is given to `owner` (uid, gid) for forks.
    pub fn take<G: Send>(
        &self,
        source: Source,
        image: Option<String>,
        (name, labels): (Option<String>, BTreeMap<String, String>),
        owner: Option<(u32, u32)>,
        hold: impl FnOnce() -> io::Result<G>,
    ) -> Result<Snapshot, SnapshotError> {
        check_meta(name.as_deref(), &labels)?;
        self.expire();
        let count = self.records.lock().len();
        if count >= self.settings.max_per_tenant {
            return Err(SnapshotError::Quota {
                quota: "snapshots kept by the tenant",
                limit: self.settings.max_per_tenant as u64,
            });
        }
        let id = format!("snap-{}", uuid::Uuid::new_v4().simple());
        let work = self.tmp.join(&id);
        let tree = work.join("tree");
        mkdir_private(&tree).map_err(io_err("creating the capture's directory"))?;
        let captured = capture(
            source,
            &tree,
            self.settings.max_entries,
            self.room.as_ref(),
            hold,
        );
        let captured = match captured {
            Ok(c) => c,
            Err(e) => {
                let _ = std::fs::remove_dir_all(&work);
                return Err(match e {
                    CaptureError::Full => SnapshotError::Quota {
                        quota: "snapshot bytes kept by the tenant",
                        limit: self.settings.max_tenant_bytes,
                    },
                    CaptureError::TooLarge(why) => SnapshotError::TooLarge(why),
                    CaptureError::Io(e) => SnapshotError::Io(format!("reading the workspace: {e}")),
                });
            }
        };
        let bytes = captured.unpacked.bytes;
        let fail = |e: io::Error, what: &str| {
            let _ = std::fs::remove_dir_all(&work);
            self.room.give(bytes);
            SnapshotError::Io(format!("{what}: {e}"))
        };
        if let Some(ids) = owner {
            chown_tree(&tree, ids).map_err(|e| fail(e, "giving the tree to the tenant"))?;
        }
        let created = now_ms();
        let meta = Snapshot {
            id,
            name,
            labels,
            image,
            digest: format!("sha256:{}", hex(&captured.unpacked.diff_id)),
            bytes,
            entries: captured.unpacked.entries,
            skipped: captured.skipped,
            created_at_ms: created,
            expires_at_ms: Some(self.expiry(created)),
            pushed: None,
        };
        self.commit(&work, meta.clone())
            .map_err(|e| fail(e, "committing the snapshot"))?;
        Ok(meta)
    }

    /// Write `meta`'s record into `work` (its tree beside it, `meta.bytes`
    /// taken from the room) and move it into place.
    pub(super) fn commit(&self, work: &Path, meta: Snapshot) -> io::Result<()> {
        write_synced(&work.join("meta.json"), &serde_json::to_vec(&meta)?)?;
        let dir = self.dir.join(&meta.id);
        std::fs::rename(work, &dir)?;
        let tree = Arc::new(Tree {
            dir: parking_lot::Mutex::new(dir),
            bytes: meta.bytes,
            deleted: AtomicBool::new(false),
            room: self.room.clone(),
        });
        self.records.lock().insert(meta.id.clone(), (meta, tree));
        Ok(())
    }

    /// Change snapshot `id`'s record (if it is still there) with `edit`,
    /// on disk too.
    pub(super) fn update(&self, id: &str, edit: impl FnOnce(&mut Snapshot)) -> Option<Snapshot> {
        let mut records = self.records.lock();
        let (meta, tree) = records.get_mut(id)?;
        edit(meta);
        if let Ok(json) = serde_json::to_vec(&*meta)
            && let Err(e) = write_synced(&tree.dir().join("meta.json"), &json)
        {
            tracing::warn!(snapshot = id, error = %e, "the snapshot's record is not on disk");
        }
        Some(meta.clone())
    }

    /// Snapshot `id`'s record and its tree's path (held while the tree is).
    pub(super) fn tree_of(&self, id: &str) -> Result<(Snapshot, Arc<Tree>), SnapshotError> {
        self.expire();
        self.records
            .lock()
            .get(id)
            .cloned()
            .ok_or_else(|| SnapshotError::Unknown(id.to_owned()))
    }

    /// A new workspace that starts as snapshot `id`: an overlay of its
    /// tree under a tmpfs of `tmp_bytes` owned by `owner`.
    pub fn fork(
        &self,
        id: &str,
        owner: (u32, u32),
        tmp_bytes: u64,
    ) -> Result<(Workspace, Snapshot), SnapshotError> {
        self.expire();
        let (meta, tree) = self
            .records
            .lock()
            .get(id)
            .cloned()
            .ok_or_else(|| SnapshotError::Unknown(id.to_owned()))?;
        let limit = self.settings.max_forks_per_tenant;
        if self
            .forks
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                (n < limit).then_some(n + 1)
            })
            .is_err()
        {
            return Err(SnapshotError::Quota {
                quota: "forks of the tenant's snapshots working at once",
                limit: limit as u64,
            });
        }
        match Workspace::mount(self.forks.clone(), &self.forks_dir, tree, owner, tmp_bytes) {
            Ok(w) => Ok((w, meta)),
            Err(e) => Err(SnapshotError::Io(format!("mounting the fork: {e}"))),
        }
    }

    /// Snapshots kept, bytes they take (deleted ones a fork still uses
    /// included), forks working: for the metrics.
    pub fn usage(&self) -> (usize, u64, usize) {
        let free = self.room.load(Ordering::SeqCst);
        let max = i64::try_from(self.settings.max_tenant_bytes).unwrap_or(i64::MAX);
        (
            self.records.lock().len(),
            u64::try_from(max.saturating_sub(free)).unwrap_or(0),
            self.forks.load(Ordering::SeqCst),
        )
    }
}

fn write_synced(path: &Path, bytes: &[u8]) -> io::Result<()> {
    use std::io::Write as _;
    let mut f = std::fs::File::create(path)?;
    f.write_all(bytes)?;
    f.sync_all()
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}
