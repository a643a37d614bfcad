//! An image as one tenant sees it: a read-only overlay on the host at
//! `views/<id>`, its lower directories the view's skeleton on top of the
//! image's layers. The skeleton (`skel/<id>`) holds what the tenant's
//! mount namespace mounts onto, whatever the image has there: `dev`,
//! `proc`, `sys`, `tmp`, `etc/resolv.conf`, and the directories down to
//! the tenant's root. Being the upper-most layer, its directories hide
//! whatever the image put at those paths (a symbolic link to elsewhere
//! included), so nothing the image holds can redirect a mount.
//!
//! The overlay is mounted `ro,nosuid,nodev`; a view is shared by the
//! tenant's workers and unmounted when the last holder drops it (and at
//! the next start, if the gateway died holding it).

use std::collections::HashMap;
use std::path::{Component, Path, PathBuf};
use std::sync::{Arc, Weak};

use parking_lot::Mutex;

use super::store::{Image, ImageStore};
use super::{ImageError, fetch::sha256_hex};

/// Mount points every view has (besides the root's path).
const SKELETON_DIRS: &[&str] = &["dev", "proc", "sys", "tmp", "etc"];
/// Files the skeleton holds: `resolv.conf` is mounted onto, and an empty
/// `ld.so.preload` masks the image's, which the host's loader would read
/// (it reads `/etc/ld.so.preload` of the root it runs in) when it starts
/// the tenant's worker in the view, running the image's code in the
/// worker before the worker has closed what it inherits.
const SKELETON_FILES: &[&str] = &["etc/resolv.conf", "etc/ld.so.preload"];
/// Top-level names the namespace mounts the host's or the tenant's own
/// over: never granted as part of the image.
pub const NOT_IMAGE: &[&str] = &["dev", "proc", "sys", "tmp"];

/// A mounted view; unmounted when the last `Arc` goes.
pub struct View {
    /// The overlay's mount point on the host.
    pub path: PathBuf,
    /// Its skeleton (the overlay's top layer).
    skel: PathBuf,
    pub image: Arc<Image>,
    store: Arc<ImageStore>,
}

impl std::fmt::Debug for View {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "View({} at {})", self.image.digest, self.path.display())
    }
}

impl PartialEq for View {
    fn eq(&self, other: &View) -> bool {
        self.path == other.path
    }
}

impl Eq for View {}

impl View {
    /// `[images] max_tenant_bytes` of the store this view is of: what the
    /// distinct images one tenant's live views use may hold together.
    pub fn max_tenant_bytes(&self) -> u64 {
        self.store.settings.max_tenant_bytes
    }

    /// The image's own top-level entries (directories and files, not
    /// symbolic links): what Landlock lets the tenant read and run.
    pub fn readable_entries(&self) -> Vec<PathBuf> {
        let mut out = Vec::new();
        for e in std::fs::read_dir(&self.path)
            .into_iter()
            .flatten()
            .flatten()
        {
            let name = e.file_name();
            if NOT_IMAGE.iter().any(|n| name == *n) {
                continue;
            }
            if e.file_type().is_ok_and(|t| t.is_dir() || t.is_file()) {
                out.push(e.path());
            }
        }
        out.sort();
        out
    }
}

impl View {
    /// The base environment under this image: `base`, with the image's
    /// `Env` laid over it; `SHELL` is one the image has.
    pub fn env_over(&self, base: &HashMap<String, String>) -> HashMap<String, String> {
        let mut env = base.clone();
        for kv in &self.image.env {
            // HOME and TMPDIR stay the tenant's: its workspace and its
            // private /tmp, not the image author's `/root`.
            if let Some((k, v)) = kv.split_once('=')
                && !(base.contains_key(k) && matches!(k, "HOME" | "TMPDIR"))
            {
                env.insert(k.to_owned(), v.to_owned());
            }
        }
        if !self.image.env.iter().any(|kv| kv.starts_with("SHELL=")) {
            let has = |p: &str| self.path.join(p).is_file();
            let shell = if has("bin/bash") || has("usr/bin/bash") {
                "/bin/bash"
            } else {
                "/bin/sh"
            };
            env.insert("SHELL".to_owned(), shell.to_owned());
        }
        env
    }
}

impl Drop for View {
    fn drop(&mut self) {
        crate::isolation::disk::unmount(&self.path);
        let _ = std::fs::remove_dir(&self.path);
        let _ = std::fs::remove_dir_all(&self.skel);
        self.store.release(&self.image.digest);
    }
}

/// Each mount has paths of its own (`<id>.<n>`): a view being dropped
/// unmounts only its own, never the one a new caller just made for the
/// same image and root.
static INSTANCE: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Views alive, by id: one mount per (image, root) however many workers.
static VIEWS: Mutex<Vec<(String, Weak<View>)>> = Mutex::new(Vec::new());

impl ImageStore {
    /// The view of `image` for a tenant rooted at `root` (`None`: no
    /// root path to keep a mount point for).
    pub fn view(
        self: &Arc<Self>,
        image: &Arc<Image>,
        root: Option<&Path>,
    ) -> Result<Arc<View>, ImageError> {
        let root_key = root
            .map(|r| r.to_string_lossy().into_owned())
            .unwrap_or_default();
        let id =
            sha256_hex(format!("{}\0{}\0{root_key}", self.dir.display(), image.digest).as_bytes())
                [..32]
                .to_owned();
        let mut views = VIEWS.lock();
        views.retain(|(_, w)| w.strong_count() > 0);
        if let Some(v) = views
            .iter()
            .find(|(i, _)| *i == id)
            .and_then(|(_, w)| w.upgrade())
        {
            return Ok(v);
        }
        let n = INSTANCE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let skel = self.dir.join("skel").join(format!("{id}.{n}"));
        let path = self.dir.join("views").join(format!("{id}.{n}"));
        // Held before it is mounted: an eviction between the lookup and
        // here finds it in use, or has already removed it (then no mount).
        if !self.hold_if_present(&image.digest) {
            return Err(ImageError::Evicted(image.digest.clone()));
        }
        let mounted = self.mount(image, root, &skel, &path);
        if let Err(e) = mounted {
            self.release(&image.digest);
            let _ = std::fs::remove_dir_all(&skel);
            let _ = std::fs::remove_dir(&path);
            return Err(e);
        }
        let v = Arc::new(View {
            path,
            skel,
            image: image.clone(),
            store: self.clone(),
        });
        views.push((id, Arc::downgrade(&v)));
        Ok(v)
    }

    /// The overlay of `image` under its skeleton at `path`.
    fn mount(
        &self,
        image: &Image,
        root: Option<&Path>,
        skel: &Path,
        path: &Path,
    ) -> Result<(), ImageError> {
        make_skeleton(skel, root)?;
        std::fs::create_dir_all(path).map_err(|e| fail("create", path, e))?;
        let mut lower = skel.display().to_string();
        // A layer the image lists twice (docker's repeated empty layers)
        // is stacked once, where it is topmost: overlayfs refuses one
        // directory twice, and the copy below adds nothing the one above
        // does not already show.
        let mut seen = std::collections::HashSet::new();
        for key in image.layers.iter().rev().filter(|k| seen.insert(*k)) {
            lower.push(':');
            lower.push_str(&self.layer_dir(key).display().to_string());
        }
        let data = format!("lowerdir={lower}");
        // The options must fit in one page with the kernel's own.
        if data.len() > 4000 || lower.contains(',') {
            return Err(ImageError::Refused(format!(
                "{} layers do not fit one overlay's options under {}",
                image.layers.len(),
                self.dir.display()
            )));
        }
        use rustix::mount::MountFlags;
        rustix::mount::mount(
            "exec-gateway-image",
            path,
            "overlay",
            MountFlags::RDONLY | MountFlags::NOSUID | MountFlags::NODEV,
            Some(
                std::ffi::CString::new(data)
                    .map_err(|e| ImageError::Refused(e.to_string()))?
                    .as_c_str(),
            ),
        )
        .map_err(|e| fail("mount the overlay on", path, e))
    }
}

fn fail(what: &str, p: &Path, e: impl std::fmt::Display) -> ImageError {
    ImageError::Unavailable(format!("image view: {what} {}: {e}", p.display()))
}

/// The skeleton for a root at `root`: made anew each time (cheap).
fn make_skeleton(skel: &Path, root: Option<&Path>) -> Result<(), ImageError> {
    use std::os::unix::fs::PermissionsExt as _;
    let _ = std::fs::remove_dir_all(skel);
    let mkdir = |p: &Path| -> Result<(), ImageError> {
        std::fs::create_dir_all(p).map_err(|e| fail("create", p, e))?;
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o755))
            .map_err(|e| fail("chmod", p, e))
    };
    mkdir(skel)?;
    for d in SKELETON_DIRS {
        mkdir(&skel.join(d))?;
    }
    std::fs::set_permissions(skel.join("tmp"), std::fs::Permissions::from_mode(0o1777))
        .map_err(|e| fail("chmod", skel, e))?;
    for f in SKELETON_FILES {
        let p = skel.join(f);
        std::fs::write(&p, b"").map_err(|e| fail("create", &p, e))?;
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644))
            .map_err(|e| fail("chmod", &p, e))?;
    }
    if let Some(root) = root {
        let mut at = skel.to_path_buf();
        for c in root.components() {
            if let Component::Normal(n) = c {
                at.push(n);
                mkdir(&at)?;
            }
        }
    }
    Ok(())
}
