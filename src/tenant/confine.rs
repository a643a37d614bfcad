//! How a tenant is confined: its sandbox (Landlock, seccomp, uid, mount,
//! PID and network namespaces), what its namespace covers up, its root's
//! idmapping and its private `/tmp`.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::config::{ConfigError, Network, TenantSettings};
use crate::isolation::Layers;
use crate::isolation::egress::TenantNet;
use crate::isolation::idmap::IdMap;
use crate::isolation::namespace::{NamespaceSpec, NetSpec};
use crate::isolation::sandbox::SandboxSpec;

/// What a confined tenant's mount namespace covers up.
pub(super) struct Hide {
    /// Every tenant's root (each tenant's own is left out for it) and the
    /// state directory (every private /tmp, the embedded key).
    pub(super) dirs: Vec<PathBuf>,
    /// The key files.
    pub(super) files: Vec<PathBuf>,
}

/// The network a tenant gets: as configured, else its own where the
/// network layer is active, else the host's only where the operator let
/// the layer go ([`Layers::host_network`]); otherwise its own, which the
/// inactive layer then refuses (at start, reload or activation).
pub fn effective_network(t: &TenantSettings, layers: Layers) -> Network {
    match t.network {
        Some(n) => n,
        None if layers.network => Network::Isolated,
        None if layers.host_network => Network::Host,
        None => Network::Isolated,
    }
}

/// What confines a tenant's processes, given the active layers: Landlock
/// read-write in the root (or everything for an unconfined tenant), its
/// `TMPDIR` and the configured extras.
#[allow(clippy::too_many_arguments)]
pub(super) fn sandbox_spec(
    name: &str,
    t: &TenantSettings,
    layers: Layers,
    hidden: &[PathBuf],
    hide: &Hide,
    idmap: Option<IdMap>,
    net: Option<Arc<TenantNet>>,
) -> Result<SandboxSpec, ConfigError> {
    let uid = if layers.uid { t.uid } else { None };
    let network = effective_network(t, layers);
    if network == Network::None && !layers.namespaces {
        return Err(ConfigError(format!(
            "tenants.{name}.network = \"none\" needs the namespaces layer, which is off or unavailable on this host"
        )));
    }
    let net = match (network, net) {
        (Network::Host, _) => NetSpec::Host,
        (Network::None, _) => NetSpec::Loopback,
        (Network::Isolated, Some(net)) => NetSpec::Joined(net),
        (Network::Isolated, None) => {
            return Err(ConfigError(format!(
                "tenants.{name}.network = \"isolated\" (a tenant's default where the layer is not off) needs the network layer, which is off or unavailable on this host (see the network probe above), or was not probed at start because every tenant then said \"none\" (restart the gateway to add such a tenant)"
            )));
        }
    };
    // A confined tenant gets its own /tmp (a root of / means unconfined).
    let private_tmp = match (&t.root, layers.namespaces) {
        (Some(root), true) => Some(private_tmp(name, uid, Some(root), t.max_tmp_bytes)?),
        _ => None,
    };
    let cover = match (&t.root, uid) {
        (Some(root), Some(ids)) => unsearchable_ancestor(root, ids),
        _ => None,
    }
    .or_else(|| shared_parent(t, &hide.dirs));
    let namespace = (layers.namespaces && (t.root.is_some() || net != NetSpec::Host)).then(|| {
        NamespaceSpec {
            tmp: private_tmp.clone(),
            root: t.root.clone().unwrap_or_else(|| PathBuf::from("/")),
            net,
            // Only a confined tenant is kept from the others' roots
            // and the gateway's state (a root of / sees the host).
            // What its private /tmp or its cover already hides needs
            // no mount of its own (each would name another tenant's
            // root in its mountinfo).
            hide_dirs: if t.root.is_some() {
                hide.dirs
                    .iter()
                    .filter(|d| Some(d.as_path()) != t.root.as_deref())
                    .filter(|d| !(private_tmp.is_some() && d.starts_with("/tmp")))
                    .filter(|d| !cover.as_ref().is_some_and(|c| d.starts_with(c)))
                    .cloned()
                    .collect()
            } else {
                Vec::new()
            },
            hide_files: hide.files.clone(),
            // Workers enter once; per child (workers off) every spawn
            // would add Landlock rules to the tenant's ruleset.
            private_devpts: t.root.is_some() && layers.workers,
            // The worker is the namespace's init; with workers off,
            // every child would need a parent process of its own.
            pid: t.root.is_some() && layers.workers,
            idmap,
            cover,
            image: None,
            workspace: None,
        }
    });
    let landlock_rw = layers.landlock.then(|| {
        let root = t.root.clone().unwrap_or_else(|| PathBuf::from("/"));
        // Where TMPDIR lies under /tmp, Landlock grants the private
        // directory mounted there (rules follow inodes, not paths).
        let tmp = t.base_env.get("TMPDIR").map(PathBuf::from).map(|p| {
            match (&private_tmp, p.strip_prefix("/tmp")) {
                (Some(private), Ok(rest)) => private.join(rest),
                _ => p,
            }
        });
        std::iter::once(root)
            .chain(tmp)
            .chain(private_tmp.clone())
            .chain(t.landlock_write.iter().cloned())
            .collect()
    });
    // The tenant's resolv.conf, bound over the host's: Landlock grants
    // /etc entry by entry (inodes), and this one is not the host's.
    let mut landlock_ro = t.landlock_read.clone();
    if let Some(NamespaceSpec {
        net: NetSpec::Joined(n),
        ..
    }) = &namespace
    {
        landlock_ro.push(n.resolv_conf().to_path_buf());
        landlock_ro.extend(n.ca_bundle().map(Path::to_path_buf));
    }
    Ok(SandboxSpec {
        uid,
        landlock_rw,
        landlock_ro,
        seccomp: layers.seccomp,
        hidden: hidden.to_vec(),
        namespace,
    })
}

/// The idmapping of a tenant's root: a tenant whose uid was allocated
/// (none configured) works in its root as that root's owner. Needs the
/// namespaces layer, where its processes see the idmapped root; without
/// it, and where the root's filesystem cannot be idmapped, the root keeps
/// its ownership and the tenant writes only what its uid may.
///
/// Returns the mapping and the gateway's own idmapped view of the root. A
/// root whose filesystem cannot be idmapped (tmpfs before Linux 6.3, 9p,
/// some FUSE) is refused: its tenant could not write it.
pub(super) fn root_idmap(
    name: &str,
    t: &TenantSettings,
    layers: Layers,
) -> Result<Option<(IdMap, std::os::fd::OwnedFd)>, ConfigError> {
    use std::os::unix::fs::MetadataExt as _;
    let (Some(root), Some((uid, gid))) = (t.root.as_ref(), t.uid) else {
        return Ok(None);
    };
    if !t.uid_allocated || !layers.uid {
        return Ok(None);
    }
    let Ok(meta) = std::fs::metadata(root) else {
        return Ok(None);
    };
    if meta.uid() == uid && meta.gid() == gid {
        return Ok(None);
    }
    let map = IdMap {
        owner_uid: meta.uid(),
        owner_gid: meta.gid(),
        uid,
        gid,
    };
    if !layers.namespaces {
        tracing::warn!(tenant = name, root = %root.display(), owner = meta.uid(), uid,
            "the namespaces layer is off: the tenant's processes run as its allocated uid and cannot write its root unless its permissions allow; set tenants.NAME.uid");
        return Ok(None);
    }
    match crate::isolation::idmap::idmapped_tree(root, map) {
        Ok(tree) => Ok(Some((map, tree))),
        Err(e) => Err(ConfigError(format!(
            "tenants.{name}.root {}: cannot be idmapped ({e}{}), so the tenant's processes (uid {uid}) could not write it (owner {}): set tenants.{name}.uid, give the root to an unused uid, or put it on a filesystem that supports idmapped mounts (ext4, xfs, btrfs; tmpfs from Linux 6.3)",
            root.display(),
            crate::isolation::idmap::why_not(root),
            meta.uid()
        ))),
    }
}

/// The topmost ancestor of `root` (below `/`, not `/tmp`'s subtree) that
/// `uid` cannot search, such as `/root` (mode 0700): the tenant's namespace
/// covers it with an empty tmpfs holding only the way down to the root.
pub(super) fn unsearchable_ancestor(
    root: &std::path::Path,
    (uid, gid): (u32, u32),
) -> Option<PathBuf> {
    use std::os::unix::fs::MetadataExt as _;
    if root.starts_with("/tmp") {
        return None;
    }
    let searchable = |m: &std::fs::Metadata| {
        let mode = m.mode();
        if m.uid() == uid {
            mode & 0o100 != 0
        } else if m.gid() == gid {
            mode & 0o010 != 0
        } else {
            mode & 0o001 != 0
        }
    };
    root.ancestors()
        .skip(1)
        .filter(|a| a.parent().is_some())
        .filter(|a| std::fs::metadata(a).is_ok_and(|m| !searchable(&m)))
        .last()
        .map(|a| a.to_path_buf())
}

/// The parent of `t`'s root when it also holds another hidden directory
/// (other tenants' roots side by side, as under `/srv/tenants`): covered
/// by one empty tmpfs holding only the way down to the root, the others
/// are gone without a mount each. Not `/`, not under `/tmp` (the private
/// `/tmp` hides those), and not where the tenant was granted other paths.
pub(super) fn shared_parent(t: &TenantSettings, hidden: &[PathBuf]) -> Option<PathBuf> {
    let root = t.root.as_deref()?;
    let parent = root.parent()?;
    if parent == std::path::Path::new("/") || root.starts_with("/tmp") {
        return None;
    }
    let shares = hidden
        .iter()
        .any(|d| d.as_path() != root && d.starts_with(parent));
    let granted = t
        .landlock_read
        .iter()
        .chain(&t.landlock_write)
        .any(|p| p.starts_with(parent) && !p.starts_with(root));
    (shares && !granted).then(|| parent.to_path_buf())
}

/// A root under /tmp is bound back at its path inside the private /tmp,
/// whose mount point the namespace setup walks without following links
/// (and fails on anything but directories). Anything else a tenant left
/// on that path is moved aside at start, so a planted symlink cannot lock
/// the tenant out of new workers for good.
pub(super) fn clear_mount_point(private: &std::path::Path, root: &std::path::Path) {
    let Ok(rel) = root.strip_prefix("/tmp") else {
        return;
    };
    let mut at = private.to_path_buf();
    for c in rel.components() {
        at.push(c);
        match std::fs::symlink_metadata(&at) {
            Ok(m) if m.is_dir() => continue,
            Ok(_) => {
                let aside = at.with_file_name(format!(
                    ".exec-gateway-moved-{}-{}",
                    std::process::id(),
                    at.file_name()
                        .map(|n| n.to_string_lossy().into_owned())
                        .unwrap_or_default()
                ));
                if let Err(e) = std::fs::rename(&at, &aside) {
                    tracing::warn!(path = %at.display(), error = %e, "cannot clear a tenant's mount point");
                }
                return;
            }
            Err(_) => return,
        }
    }
}

/// Without the namespaces layer a confined tenant has no `/tmp` of its
/// own, and the host's holds other tenants' roots and the gateway's files,
/// so it is not granted: the tenant's `TMPDIR`, where it lies under `/tmp`
/// (the default), becomes its directory in the state dir (a tmpfs of
/// `max_tmp_bytes` where the gateway may mount one), which Landlock grants
/// instead. `None`: nothing to change.
pub(super) fn unshared_tmp(
    name: &str,
    t: &TenantSettings,
    layers: Layers,
) -> Result<Option<(TenantSettings, PathBuf)>, ConfigError> {
    let Some(rest) = check_tmpdir(name, t, layers)? else {
        return Ok(None);
    };
    let uid = if layers.uid { t.uid } else { None };
    let dir = own_tmp_dir(name, uid)?;
    // The tenant reaches it by its host path: the directories above may
    // be passed through (0711), not listed; what else is in them is the
    // gateway's (0600, and never granted by Landlock).
    let state = crate::config::state_dir()?;
    for d in [
        state.clone(),
        state.join("tenants"),
        state.join("tenants").join(name),
    ] {
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o711))
            .map_err(|e| ConfigError(format!("tenants.{name}: {}: {e}", d.display())))?;
    }
    // Above the state directory (`XDG_STATE_HOME`, `/var/lib`) is the
    // operator's: say so where the tenant cannot pass.
    if let Some(closed) = state.ancestors().skip(1).find(|a| {
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::metadata(a).is_ok_and(|m| m.permissions().mode() & 0o001 == 0)
    }) {
        tracing::warn!(tenant = name, dir = %closed.display(),
            "the namespaces layer is off and the tenant's TMPDIR lies below a directory others cannot pass: it cannot use it; make that directory passable (0711) or set XDG_STATE_HOME elsewhere");
    }
    if let Err(e) = crate::isolation::disk::mount_tmp(&dir, t.max_tmp_bytes, uid) {
        tracing::warn!(tenant = name, dir = %dir.display(), error = %e,
            "the namespaces layer is off and no tmpfs could be mounted: the tenant's TMPDIR is a plain directory, max_tmp_bytes not enforced");
    }
    let mut adjusted = t.clone();
    adjusted
        .base_env
        .insert("TMPDIR".to_owned(), dir.join(rest).display().to_string());
    Ok(Some((adjusted, dir)))
}

/// A `TMPDIR` under `/tmp` that [`unshared_tmp`] moves (`Some`: the part
/// below `/tmp`), refused if it contains `..`.
pub(super) fn check_tmpdir(
    name: &str,
    t: &TenantSettings,
    layers: Layers,
) -> Result<Option<PathBuf>, ConfigError> {
    let tmpdir = PathBuf::from(t.base_env.get("TMPDIR").map_or("/tmp", String::as_str));
    let Ok(rest) = tmpdir.strip_prefix("/tmp") else {
        return Ok(None);
    };
    if layers.namespaces || t.root.is_none() {
        return Ok(None);
    }
    // Rewritten by its text: a `..` would lead out of the tenant's
    // directory, and Landlock would grant wherever it leads.
    if rest
        .components()
        .any(|c| !matches!(c, std::path::Component::Normal(_)))
    {
        return Err(ConfigError(format!(
            "tenants.{name}.base_env.TMPDIR {}: without the namespaces layer it is moved to the tenant's own directory, and may not contain `..`",
            tmpdir.display()
        )));
    }
    Ok(Some(rest.to_path_buf()))
}

/// `<state dir>/tenants/NAME/tmp`, mode 0700, owned by the tenant's uid
/// when it has one.
pub(super) fn own_tmp_dir(name: &str, uid: Option<(u32, u32)>) -> Result<PathBuf, ConfigError> {
    use std::os::unix::fs::DirBuilderExt as _;
    let err = |e: std::io::Error, p: &std::path::Path| {
        ConfigError(format!("tenants.{name}: private /tmp {}: {e}", p.display()))
    };
    let parent = crate::config::state_dir()?.join("tenants").join(name);
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&parent)
        .map_err(|e| err(e, &parent))?;
    let dir = parent.join("tmp");
    match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(err(e, &dir)),
    }
    if let Some((u, g)) = uid {
        std::os::unix::fs::chown(&dir, Some(u), Some(g)).map_err(|e| err(e, &dir))?;
    }
    Ok(dir)
}

/// The host directory a confined tenant sees as `/tmp`:
/// `<state dir>/tenants/NAME/tmp`, owned by the tenant's uid when it has
/// one, mode 0700; it persists across restarts like a host's /tmp.
pub(super) fn private_tmp(
    name: &str,
    uid: Option<(u32, u32)>,
    root: Option<&std::path::Path>,
    bytes: u64,
) -> Result<PathBuf, ConfigError> {
    let err = |e: std::io::Error, p: &std::path::Path| {
        ConfigError(format!("tenants.{name}: private /tmp {}: {e}", p.display()))
    };
    let dir = own_tmp_dir(name, uid)?;
    // A tmpfs of its size: a full /tmp is the tenant's ENOSPC, not the
    // state directory's filesystem filling for everyone.
    crate::isolation::disk::mount_tmp(&dir, bytes, uid).map_err(|e| err(e, &dir))?;
    if let Some(root) = root {
        clear_mount_point(&dir, root);
    }
    Ok(dir)
}

/// Whether a tenant's processes can be given an image as `/`: the view
/// is entered by its workers' mount namespace, below a root of its own.
pub(super) fn images_possible(t: &TenantSettings, layers: Layers) -> bool {
    layers.namespaces && layers.workers && t.root.is_some()
}

/// `spec` with `view` as the namespace's `/`: Landlock lets the
/// processes read and run the image's own entries (the view's inodes,
/// which the namespace's `/` shares); everything else stays.
/// `spec` for a fork: its workspace attached at the root's path (its files
/// are the tenant's own, so no idmapping), and granted in the root's place.
pub fn with_workspace(
    spec: &SandboxSpec,
    workspace: &std::path::Path,
) -> Result<SandboxSpec, String> {
    let mut spec = spec.clone();
    let ns = spec
        .namespace
        .as_mut()
        .ok_or_else(|| "a fork needs the tenant's own mount namespace".to_owned())?;
    ns.workspace = Some(workspace.to_path_buf());
    ns.idmap = None;
    let root = ns.root.clone();
    if let Some(rw) = spec.landlock_rw.as_mut() {
        for p in rw.iter_mut().filter(|p| **p == root) {
            *p = workspace.to_path_buf();
        }
    }
    Ok(spec)
}

pub fn with_image(spec: &SandboxSpec, view: &crate::image::View) -> Result<SandboxSpec, String> {
    let mut spec = spec.clone();
    let ns = spec
        .namespace
        .as_mut()
        .ok_or_else(|| "an image needs the tenant's own mount namespace".to_owned())?;
    ns.image = Some(view.path.clone());
    spec.landlock_ro.extend(view.readable_entries());
    Ok(spec)
}
