//! A tenant's snapshots to and from the registry (module `remote`): a push
//! writes the tree's layer to `tmp/` and sends it; a restore pulls a layer
//! the replica does not have, checks it, unpacks it within the tenant's
//! share and keeps it as a local snapshot with the same id.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use super::store::{TenantSnapshots, io_err, mkdir_private, now_ms};
use super::{Snapshot, SnapshotError};
use crate::image::unpack::{Budget, Compression, Room as _, UnpackError, unpack};

/// The layer of a restore may be at most this many times the tenant's
/// share (a tar stream's headers and padding against 4 KiB blocks).
const LAYER_SLACK: u64 = 2;

/// Removes a transfer's work in `tmp/` however it ends.
struct Scratch(std::path::PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

impl TenantSnapshots {
    fn remote(&self) -> Result<&(super::Remote, String), SnapshotError> {
        self.remote.as_ref().ok_or_else(|| {
            SnapshotError::Invalid(
                "no snapshot registry is configured ([snapshots] registry)".to_owned(),
            )
        })
    }

    /// Permits for one transfer: the tenant's one, and one of the store's.
    async fn transfer_permits(
        &self,
    ) -> Result<[tokio::sync::OwnedSemaphorePermit; 2], SnapshotError> {
        let closed = || SnapshotError::Io("the store is closing".to_owned());
        let own = self
            .transfer
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| closed())?;
        let all = self
            .transfers
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| closed())?;
        Ok([own, all])
    }

    /// Push snapshot `id` to the registry (again, if it was: a registry
    /// emptied since gets it back); returns its record with `pushed`.
    pub async fn push(self: &Arc<Self>, id: &str) -> Result<Snapshot, SnapshotError> {
        let (remote, key) = self.remote()?.clone();
        let (_, tree) = self.tree_of(id)?;
        let _permits = self.transfer_permits().await?;
        let path = tree.path();
        let root_mode = {
            use std::os::unix::fs::PermissionsExt as _;
            std::fs::metadata(&path)
                .map_err(io_err("the snapshot's tree"))?
                .permissions()
                .mode()
                & 0o1777
        };
        // The record as it is now (a promotion may have come meanwhile).
        // The tree is held (`tree`) while it is sent.
        let meta = self.get(id)?;
        let (to, promoted) = remote
            .push(&key, &meta, (path, self.settings.max_entries), root_mode)
            .await?;
        drop(tree);
        let keep = |m: &mut Snapshot| {
            m.pushed = Some(to.clone());
            if promoted {
                m.expires_at_ms = None;
            }
        };
        let mut meta = meta;
        keep(&mut meta);
        Ok(self.update(id, keep).unwrap_or(meta))
    }

    /// Promote snapshot `id`: kept until deleted (retention passes it
    /// by), and pushed when a registry is configured, so that every
    /// session of the tenant, on any replica, can start from it.
    /// All or nothing: a push that fails leaves the snapshot as it was.
    pub async fn promote(self: &Arc<Self>, id: &str) -> Result<Snapshot, SnapshotError> {
        let mut was = None;
        let meta = self
            .update(id, |m| was = m.expires_at_ms.take())
            .ok_or_else(|| SnapshotError::Unknown(id.to_owned()))?;
        if self.remote.is_none() {
            return Ok(meta);
        }
        let pushed = self.push(id).await;
        if pushed.is_err() && was.is_some() {
            self.update(id, |m| m.expires_at_ms = m.expires_at_ms.or(was));
        }
        pushed
    }

    /// Snapshot `id`: the local one, or, when a registry is configured and
    /// holds it, pulled, checked and kept here (owned by `owner`); and
    /// whether this call restored it (a caller that then refuses the fork
    /// deletes it again).
    pub async fn restore(
        self: &Arc<Self>,
        id: &str,
        owner: Option<(u32, u32)>,
    ) -> Result<(Snapshot, bool), SnapshotError> {
        match self.get(id) {
            Err(SnapshotError::Unknown(_)) if self.remote.is_some() => {}
            found => return found.map(|m| (m, false)),
        }
        let (remote, key) = self.remote()?.clone();
        let _permits = self.transfer_permits().await?;
        // Another call may have restored it while this one waited.
        if let Ok(meta) = self.get(id) {
            return Ok((meta, false));
        }
        let super::remote::Found {
            meta,
            size,
            root_mode,
            manifest,
        } = remote
            .find(&key, id)
            .await?
            .ok_or_else(|| SnapshotError::Unknown(id.to_owned()))?;
        if self.records.lock().len() >= self.settings.max_per_tenant {
            return Err(SnapshotError::Quota {
                quota: "snapshots kept by the tenant",
                limit: self.settings.max_per_tenant as u64,
            });
        }
        if size > self.settings.max_tenant_bytes.saturating_mul(LAYER_SLACK) {
            return Err(SnapshotError::TooLarge(format!(
                "its layer is {size} bytes, more than the tenant's snapshots may hold"
            )));
        }
        let work = self
            .tmp
            .join(format!("pull-{}", uuid::Uuid::new_v4().simple()));
        let tree = work.join("tree");
        mkdir_private(&tree).map_err(io_err("the restore's directory"))?;
        let scratch = Scratch(work.clone());
        let layer = work.join("layer.tar");
        {
            let mut f = tokio::fs::File::create(&layer)
                .await
                .map_err(io_err("the restore's layer"))?;
            remote.layer_to(&key, &meta, size, &mut f).await?;
        }
        let this = self.clone();
        let expected = meta.digest.clone();
        let restored = tokio::task::spawn_blocking(move || {
            let r = this.unpack_restored(&layer, &tree, (size, &expected), root_mode, owner);
            let _ = std::fs::remove_file(&layer);
            r
        })
        .await
        .map_err(|e| SnapshotError::Io(e.to_string()))??;
        let kept = Snapshot {
            bytes: restored.0,
            entries: restored.1,
            // A promoted snapshot stays kept; another is this replica's
            // copy for a retention period from now.
            expires_at_ms: meta.expires_at_ms.and(Some(self.expiry(now_ms()))),
            pushed: Some(remote.located(&key, &manifest)),
            ..meta
        };
        if let Err(e) = self.commit(&work, kept.clone()) {
            self.room.give(kept.bytes);
            return Err(SnapshotError::Io(format!(
                "keeping the restored snapshot: {e}"
            )));
        }
        drop(scratch);
        Ok((kept, true))
    }

    /// Unpack a pulled layer into `tree` within the tenant's share: its
    /// bytes and entries. The digest was checked as it streamed; the
    /// unpacker checks it again and gives directories their times back.
    fn unpack_restored(
        &self,
        layer: &std::path::Path,
        tree: &std::path::Path,
        (size, expected): (u64, &str),
        root_mode: u32,
        owner: Option<(u32, u32)>,
    ) -> Result<(u64, u64), SnapshotError> {
        let stop = AtomicBool::new(false);
        let budget = Budget {
            bytes: size,
            entries: self.settings.max_entries,
            whiteouts: false,
        };
        let f = std::fs::File::open(layer).map_err(io_err("the restore's layer"))?;
        let unpacked = unpack(
            std::io::BufReader::with_capacity(1 << 16, f),
            Compression::None,
            tree,
            budget,
            self.room.as_ref(),
            &stop,
        )
        .map_err(|e| match e {
            UnpackError::StoreFull => SnapshotError::Quota {
                quota: "snapshot bytes kept by the tenant",
                limit: self.settings.max_tenant_bytes,
            },
            UnpackError::TooLarge(why) => SnapshotError::TooLarge(why),
            e => SnapshotError::Corrupt(e.to_string()),
        })?;
        let digest = format!("sha256:{}", crate::image::fetch::hex(&unpacked.diff_id));
        if digest != expected {
            self.room.give(unpacked.bytes);
            return Err(SnapshotError::Corrupt(format!(
                "the layer unpacked to {digest}, not {expected}"
            )));
        }
        let kept = (|| {
            super::capture::dir_times_from(layer, tree)?;
            std::fs::set_permissions(
                tree,
                std::os::unix::fs::PermissionsExt::from_mode(root_mode & 0o1777),
            )?;
            if let Some(ids) = owner {
                super::capture::chown_tree(tree, ids)?;
            }
            Ok::<(), std::io::Error>(())
        })();
        if let Err(e) = kept {
            self.room.give(unpacked.bytes);
            return Err(SnapshotError::Io(format!("the restored tree: {e}")));
        }
        Ok((unpacked.bytes, unpacked.entries))
    }
}
