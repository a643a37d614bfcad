//! The tenants of one gateway: what configures them (swapped whole by a
//! reload), which are active, activation on first use, retirement when
//! idle, and the accounts of those retired.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use parking_lot::Mutex;
use tokio::sync::{OwnedMutexGuard, Semaphore};

use super::accounting::{Account, Accounts, Usage, announce_activated, announce_retired};
use super::build::{self, BuildContext, Origin};
use super::{Tenant, unknown_tenant};
use crate::config::{ConfigError, Settings, TemplateSettings, TenantSettings, UidLedger};
use crate::error::GatewayError;
use crate::isolation::Layers;
use crate::isolation::egress::NetTools;
use crate::isolation::reaper::Reaper;
use crate::metrics::Metrics;
use crate::registry::Registry;

/// What configures tenants: `[tenants]`, `[tenant_template]`.
pub struct TenantSet {
    pub configured: BTreeMap<String, TenantSettings>,
    pub template: Option<Arc<TemplateSettings>>,
    ledger: Option<UidLedger>,
    /// Configured tenants a reload removed since the start: refused, even
    /// where the template admits the name (at most
    /// [`MAX_REMOVED_TENANTS`]).
    removed: std::collections::BTreeSet<String>,
}

/// Most configured tenants removed by reloads that the gateway keeps
/// refusing until a restart; a reload past it is refused.
pub const MAX_REMOVED_TENANTS: usize = 100_000;

/// The tenant set in force, shared with whatever must know the tenants
/// (the token verifier) and swapped whole by a reload.
pub type TenantSetCell = Arc<ArcSwap<TenantSet>>;

impl TenantSet {
    /// `s`'s tenants, in a cell of their own.
    pub fn cell(s: &Settings) -> TenantSetCell {
        Arc::new(ArcSwap::from_pointee(TenantSet::new(s)))
    }

    fn new(s: &Settings) -> TenantSet {
        TenantSet {
            configured: s.tenants.clone(),
            template: s.template.clone(),
            ledger: s
                .template
                .as_ref()
                .map(|t| UidLedger::new(&t.roots, s.uid_range, &s.tenants)),
            removed: Default::default(),
        }
    }

    /// `s`'s tenants replacing `old`: the names `old` configured (or had
    /// removed) that `s` does not configure stay removed.
    fn after(old: &TenantSet, s: &Settings) -> Result<TenantSet, ConfigError> {
        let mut new = TenantSet::new(s);
        new.removed = old
            .removed
            .iter()
            .chain(old.configured.keys())
            .filter(|n| !new.configured.contains_key(*n))
            .cloned()
            .collect();
        if new.removed.len() > MAX_REMOVED_TENANTS {
            return Err(ConfigError(format!(
                "more than {MAX_REMOVED_TENANTS} configured tenants removed since the start: restart the gateway to forget them"
            )));
        }
        Ok(new)
    }

    /// Every configured root, the templated roots' directory and the
    /// state directory: covered in every confined tenant's namespace
    /// (each but its own). Made at each activation rather than kept: with
    /// thousands of tenants it would be most of what an idle one costs.
    fn hide_dirs(&self) -> Vec<PathBuf> {
        self.configured
            .values()
            .filter_map(|t| t.root.clone())
            .chain(self.template.as_ref().map(|t| t.roots.clone()))
            .chain(crate::config::state_dir().ok())
            .collect()
    }

    /// The settings of tenant `name`: configured, else templated.
    fn settings_for(&self, name: &str) -> Option<(TenantSettings, bool)> {
        if let Some(t) = self.configured.get(name) {
            return Some((t.clone(), false));
        }
        if self.removed.contains(name) {
            return None;
        }
        let t = self.template.as_ref()?.settings_for(name).ok()?;
        Some((t, true))
    }

    /// Whether a token naming `name` has a tenant.
    pub fn knows(&self, name: &str) -> bool {
        self.configured.contains_key(name)
            || (!self.removed.contains(name)
                && self.template.as_ref().is_some_and(|t| t.admits(name)))
    }
}

/// One tenant's place among the active: its activation (`None` while
/// retired or being built) behind a lock that activation and retirement
/// both take, so they never overlap for one name.
#[derive(Default)]
struct Slot {
    state: Arc<tokio::sync::Mutex<Option<Arc<Tenant>>>>,
    /// Since when nothing but this slot held the tenant.
    idle_since: Mutex<Option<Instant>>,
    /// Activations of this name so far (each one's `@N`).
    generations: std::sync::atomic::AtomicU64,
}

/// A tenant taken out of its slot, to be retired while the slot stays
/// locked.
pub struct Retiring {
    _slot: Option<OwnedMutexGuard<Option<Arc<Tenant>>>>,
    tenant: Arc<Tenant>,
    /// A stale activation a newer one replaced: the name's metric series
    /// are the newer one's now.
    replaced: bool,
}

/// All tenants.
pub struct Tenants {
    ctx: Arc<BuildContext>,
    set: TenantSetCell,
    live: Mutex<HashMap<Arc<str>, Arc<Slot>>>,
    /// Stale activations replaced by newer ones, serving their live
    /// sessions until nothing holds them.
    replaced: Mutex<Vec<Arc<Tenant>>>,
    accounts: Arc<Accounts>,
    max_active: usize,
    idle_timeout: Duration,
}

impl Tenants {
    /// The tenants of `set` (made from `settings`), none active yet.
    /// Configured tenants are checked for what would keep them from ever
    /// starting.
    pub fn new(
        settings: &Settings,
        set: TenantSetCell,
        reaper: Option<Arc<Reaper>>,
        metrics: Arc<Metrics>,
        global_slots: Arc<Semaphore>,
        layers: Layers,
        executors: Option<Arc<Registry>>,
    ) -> Result<Tenants, ConfigError> {
        if nix::unistd::geteuid().is_root() && !layers.uid {
            return Err(ConfigError(
                "the gateway runs as root but cannot give tenants their own uids (setuid failed: see the uid probe above); tenant processes would run as uid 0".to_owned(),
            ));
        }
        preflight_all(settings, layers)?;
        // Held from now on: workers of tenants activated later (after an
        // upgrade replaced the binary) exec this file.
        if layers.workers {
            crate::worker::executable()
                .map_err(|e| ConfigError(format!("the gateway's own executable: {e}")))?;
        }
        if layers.cgroups
            && let (Some(r), Some(dir)) = (&reaper, crate::isolation::cgroup::v2_instance())
        {
            r.watch_cgroup(&dir);
        }
        let tenants = Tenants {
            ctx: Arc::new(BuildContext {
                reaper,
                metrics,
                global_slots,
                layers,
                executors,
                secret_files: settings.secret_files.clone(),
                exited_retention: settings.exited_retention,
                slow_client_timeout: settings.slow_client_timeout,
                images: settings.images.clone(),
                store: parking_lot::Mutex::new(None),
                snapshots: settings.snapshots.clone(),
                snapshot_store: parking_lot::Mutex::new(None),
            }),
            set,
            live: Mutex::new(HashMap::new()),
            replaced: Mutex::new(Vec::new()),
            accounts: Arc::default(),
            max_active: settings.max_active_tenants,
            idle_timeout: settings.tenant_idle_timeout,
        };
        // Where forks can be, the store opens now: what a killed gateway
        // left mounted is cleared at start, not at the first activation.
        if layers.namespaces && layers.workers {
            let _ = tenants.ctx.snapshot_store();
        }
        Ok(tenants)
    }

    /// What configures tenants now.
    pub fn set(&self) -> Arc<TenantSet> {
        self.set.load_full()
    }

    /// The cell the tenant set lives in.
    pub fn set_cell(&self) -> TenantSetCell {
        self.set.clone()
    }

    /// Whether a token naming `name` has a tenant.
    pub fn knows(&self, name: &str) -> bool {
        self.set.load().knows(name)
    }

    /// Tenant `name`, activated if it is not active (its workers started,
    /// its root made if templated). An unknown (or removed) tenant is
    /// refused as unauthenticated; one more than `max_active_tenants`
    /// first retires an idle one, else is refused as overloaded.
    pub async fn get(&self, name: &str) -> Result<Arc<Tenant>, GatewayError> {
        let (slot, evicted) = {
            let mut live = self.live.lock();
            match live.get(name) {
                Some(s) => (s.clone(), None),
                None => {
                    if !self.knows(name) {
                        return Err(unknown_tenant());
                    }
                    let active = live
                        .values()
                        .filter(|s| s.state.try_lock().map_or(true, |t| t.is_some()))
                        .count();
                    let evicted = if active >= self.max_active {
                        match take_idle(&live) {
                            Some(r) => {
                                self.accounts.begin(&r.tenant);
                                Some(r)
                            }
                            None => {
                                tracing::warn!(
                                    tenant = name,
                                    max_active_tenants = self.max_active,
                                    "refused: every active tenant is in use"
                                );
                                return Err(GatewayError::Overloaded);
                            }
                        }
                    } else {
                        None
                    };
                    let s = Arc::new(Slot::default());
                    live.insert(Arc::from(name), s.clone());
                    (s, evicted)
                }
            }
        };
        if let Some(r) = evicted {
            self.retire_off_thread(r).await;
        }
        let mut state = slot.state.clone().lock_owned().await;
        if let Some(t) = state.as_ref() {
            if t.is_removed() {
                return Err(unknown_tenant());
            }
            if !t.is_stale() {
                *slot.idle_since.lock() = None;
                return Ok(t.clone());
            }
            // A reload changed what only a new activation applies: its
            // live sessions stay on this one, new callers get a new one.
            if let Some(old) = state.take() {
                self.replaced.lock().push(old);
            }
        }
        // `@N` only while an earlier activation of the name still serves.
        let generation = if self.replaced.lock().iter().any(|t| *t.name == *name) {
            slot.generations
                .fetch_add(1, std::sync::atomic::Ordering::AcqRel)
                + 1
        } else {
            0
        };
        match self.activate(name, generation).await {
            Ok(t) => {
                *state = Some(t.clone());
                Ok(t)
            }
            Err(e) => {
                drop(state);
                // Gone unless another caller waits on it (it tries in turn;
                // a slot taken out from under it would let its activation
                // live outside the map, never retired).
                let mut live = self.live.lock();
                if live.get(name).is_some_and(|s| Arc::ptr_eq(s, &slot))
                    && Arc::strong_count(&slot) == 2
                {
                    live.remove(name);
                }
                Err(e)
            }
        }
    }

    /// Build tenant `name` from the current settings, off the async threads.
    async fn activate(&self, name: &str, generation: u64) -> Result<Arc<Tenant>, GatewayError> {
        let set = self.set.load_full();
        let (settings, templated) = set.settings_for(name).ok_or_else(unknown_tenant)?;
        let ctx = self.ctx.clone();
        let owned = name.to_owned();
        let started = Instant::now();
        let image = match &settings.image {
            Some(source) => Some(
                self.image_for(name, source, settings.root.as_deref())
                    .await?,
            ),
            None => None,
        };
        let built = tokio::task::spawn_blocking(move || {
            let origin = if templated {
                Origin::Template(set.ledger.as_ref())
            } else {
                Origin::Configured
            };
            build::build(
                &ctx,
                &owned,
                generation,
                settings,
                origin,
                set.hide_dirs(),
                image,
            )
        })
        .await
        .map_err(|e| GatewayError::Internal(format!("tenant activation: {e}")))?;
        match built {
            Ok(t) => {
                tracing::info!(
                    tenant = name,
                    templated,
                    ms = started.elapsed().as_millis() as u64,
                    "tenant activated"
                );
                announce_activated(&t, templated);
                Ok(Arc::new(t))
            }
            Err(e) => {
                tracing::error!(tenant = name, error = %e, "tenant cannot be activated");
                // Why names host paths and other owners' uids: the
                // operator's log has it, not the token's holder.
                Err(GatewayError::Internal(format!(
                    "tenant `{name}` cannot be activated (the gateway's log says why)"
                )))
            }
        }
    }

    /// The image store (opened at first need).
    pub fn image_store(&self) -> Result<Arc<crate::image::ImageStore>, crate::image::ImageError> {
        let mut store = self.ctx.store.lock();
        if let Some(s) = store.as_ref() {
            return Ok(s.clone());
        }
        let s = crate::image::ImageStore::open(&self.ctx.images)?;
        *store = Some(s.clone());
        Ok(s)
    }

    /// The view of `source` for tenant `name` rooted at `root`: pulled
    /// if the store lacks it. What went wrong is logged in full; the
    /// caller is told the reference and the kind of failure (a layout's
    /// host path only for registry images, which name none).
    pub async fn image_for(
        &self,
        name: &str,
        source: &crate::config::ImageSource,
        root: Option<&std::path::Path>,
    ) -> Result<Arc<crate::image::View>, GatewayError> {
        let fail = |e: crate::image::ImageError| {
            tracing::error!(tenant = name, image = %source, error = %e, "image unavailable");
            match source {
                crate::config::ImageSource::Registry { .. } => GatewayError::from(e),
                _ => GatewayError::Internal(format!(
                    "image `{source}` could not be had (the gateway's log says why)"
                )),
            }
        };
        let store = self.image_store().map_err(fail)?;
        let root = root.map(std::path::Path::to_path_buf);
        // Evicted between the two steps (another pull needed the room):
        // pulled again, once.
        let mut tries = 2;
        loop {
            tries -= 1;
            let image = store.resolve(source).await.map_err(fail)?;
            let (store, root) = (store.clone(), root.clone());
            let viewed = tokio::task::spawn_blocking(move || store.view(&image, root.as_deref()))
                .await
                .map_err(|e| GatewayError::Internal(format!("image view: {e}")))?;
            match viewed {
                Err(crate::image::ImageError::Evicted(_)) if tries > 0 => continue,
                other => return other.map_err(fail),
            }
        }
    }

    /// Whether tenant `name`'s own `image` is being pulled now: its
    /// activation waits for that pull (module `transport::authenticate`).
    pub fn image_pulling(&self, name: &str) -> bool {
        let Some(store) = self.ctx.store.lock().clone() else {
            return false;
        };
        self.set
            .load()
            .settings_for(name)
            .and_then(|(s, _)| s.image)
            .is_some_and(|source| store.pulling(&source))
    }

    /// `/readyz` detail: the image store's images, by digest, and how
    /// many live views (tenants, session images) use each.
    pub fn images_report(&self) -> String {
        let Some(store) = self.ctx.store.lock().clone() else {
            return String::new();
        };
        let mut out = format!(
            "images: {} bytes of {} in the store\n",
            store.used_bytes(),
            self.ctx.images.max_store_bytes
        );
        for (image, views) in store.list() {
            out.push_str(&format!(
                "image: {} {} ({} bytes, {views} in use)\n",
                image.digest, image.source, image.bytes
            ));
        }
        out
    }

    /// The view a new session of `tenant` asked for (`initialize`'s
    /// `image`, a token's `image` claim, gRPC `CreateSession`): only an
    /// image the tenant may use (its own, or one its `images` allow).
    pub async fn session_image(
        &self,
        tenant: &Tenant,
        source: &crate::config::ImageSource,
    ) -> Result<Arc<crate::image::View>, GatewayError> {
        let t = &tenant.settings;
        // Refused before anything is pulled.
        if tenant.places_on_executors() && t.placement != crate::config::Placement::Local {
            return Err(GatewayError::InvalidParams(
                "images run on the gateway's own workers; this tenant's sessions run on executors (placement)".to_owned(),
            ));
        }
        if !super::confine::images_possible(t, self.ctx.layers) {
            return Err(GatewayError::InvalidParams(format!(
                "tenant `{}` cannot run images: they need a root of its own and the namespaces and workers layers",
                tenant.name
            )));
        }
        if t.image.as_ref() == Some(source)
            && let Some(v) = &tenant.image
        {
            return Ok(v.clone());
        }
        if !t.images.iter().any(|p| p.allows(source)) && t.image.as_ref() != Some(source) {
            return Err(GatewayError::Forbidden(format!(
                "image `{source}` is not among the images tenant `{}` may use",
                tenant.name
            )));
        }
        let _one = tenant
            .image_pulls
            .acquire()
            .await
            .map_err(|_| GatewayError::Draining)?;
        self.image_for(&tenant.name, source, t.root.as_deref())
            .await
    }

    /// Tenants nothing has held for the idle timeout (or at all, once a
    /// reload made them stale or removed them), taken out for retirement.
    pub fn take_retiring(&self) -> Vec<Retiring> {
        let now = Instant::now();
        let mut out = Vec::new();
        let mut live = self.live.lock();
        live.retain(|_, slot| {
            let Ok(mut state) = slot.state.clone().try_lock_owned() else {
                return true;
            };
            let Some(t) = state.as_ref() else {
                // Emptied, and nobody waiting on it.
                return Arc::strong_count(slot) > 1;
            };
            if Arc::strong_count(t) > 1 || Arc::strong_count(slot) > 1 {
                *slot.idle_since.lock() = None;
                return true;
            }
            let since = *slot.idle_since.lock().get_or_insert(now);
            let done = t.is_removed() || t.is_stale();
            if done || now.duration_since(since) >= self.idle_timeout {
                // The slot stays, locked until the retirement is done: an
                // activation of the same name waits for it (they share
                // the cgroup's and the private /tmp's paths).
                if let Some(tenant) = state.take() {
                    self.accounts.begin(&tenant);
                    out.push(Retiring {
                        _slot: Some(state),
                        tenant,
                        replaced: false,
                    });
                }
            }
            true
        });
        drop(live);
        self.replaced.lock().retain(|t| {
            if Arc::strong_count(t) > 1 {
                return true;
            }
            self.accounts.begin(t);
            out.push(Retiring {
                _slot: None,
                tenant: t.clone(),
                replaced: true,
            });
            false
        });
        out
    }

    /// Retire `r` on a blocking thread and wait for it.
    async fn retire_off_thread(&self, r: Retiring) {
        let ctx = self.ctx.clone();
        let accounts = self.accounts.clone();
        let _ = tokio::task::spawn_blocking(move || retire(&ctx, &accounts, r)).await;
    }

    /// Retire what [`Self::take_retiring`] took.
    pub fn retire_taken(&self, taken: Vec<Retiring>) {
        for r in taken {
            retire(&self.ctx, &self.accounts, r);
        }
    }

    /// Tenants active now.
    pub fn active(&self) -> Vec<Arc<Tenant>> {
        let slots: Vec<Arc<Slot>> = self.live.lock().values().cloned().collect();
        active_of(slots.iter(), &self.replaced.lock())
    }

    /// Every tenant's account (or `only` one's). The registry's locks are
    /// held throughout: an activation moves from them to the accounts'
    /// retiring list under them, so it is counted exactly once.
    pub fn accounts(&self, only: Option<&str>) -> (Vec<Account>, u64) {
        let live = self.live.lock();
        let replaced = self.replaced.lock();
        let report = self
            .accounts
            .report(&active_of(live.values(), &replaced), only);
        drop((replaced, live));
        (report, self.accounts.dropped())
    }

    /// Stop every tenant's backend (shutdown; their sessions are gone) and
    /// detach their `/tmp`.
    pub fn retire(&self) {
        for t in self.active() {
            t.backend.retire();
            announce_retired(&t, &Usage::of(&t), "shutdown");
            if let Some(tmp) = &t.tmp {
                crate::isolation::disk::unmount(tmp);
            }
        }
    }

    /// Read each active tenant's disk use into its gauges (at a scrape:
    /// statfs on a tmpfs and one quota query per tenant).
    pub fn refresh_disk_metrics(&self) {
        for t in self.active() {
            if let Some(Ok(n)) = t.tmp.as_deref().map(crate::isolation::disk::used_bytes) {
                t.metrics
                    .tmp_bytes
                    .set(i64::try_from(n).unwrap_or(i64::MAX));
            }
            if let Some(Ok(n)) = t
                .root_quota
                .as_ref()
                .map(crate::isolation::disk::RootQuota::used_bytes)
            {
                t.metrics
                    .disk_bytes
                    .set(i64::try_from(n).unwrap_or(i64::MAX));
            }
            if let Some(s) = &t.snapshots {
                let (count, bytes, forks) = s.store.usage();
                let g = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
                t.metrics.snapshots.set(g(count as u64));
                t.metrics.snapshot_bytes.set(g(bytes));
                t.metrics.forks.set(g(forks as u64));
            }
        }
    }

    /// Take `settings`' tenants: new ones are served from now on; changed
    /// ones take rate, sessions and cgroup limits in place and anything
    /// else through a new activation for new callers; removed ones refuse
    /// new sessions while their live ones go on. Returns a line on what
    /// changed.
    pub fn reload(&self, settings: &Settings) -> Result<String, ConfigError> {
        preflight_all(settings, self.ctx.layers)?;
        // The new set first: an activation that starts from here on (a
        // stale tenant's replacement included) builds from it.
        let new = Arc::new(TenantSet::after(&self.set.load(), settings)?);
        let old = self.set.swap(new.clone());
        let (mut removed, mut stale, mut changed) = (0, 0, 0);
        for t in self.active() {
            match new.settings_for(&t.name) {
                None => {
                    t.removed.store(true, std::sync::atomic::Ordering::Release);
                    removed += 1;
                }
                Some((mut s, templated)) => {
                    if templated {
                        s.uid = t.settings.uid;
                        s.uid_allocated = t.settings.uid_allocated;
                    }
                    if s != t.settings {
                        changed += 1;
                        if t.update(&s) {
                            stale += 1;
                        }
                    }
                }
            }
        }
        let added = new
            .configured
            .keys()
            .filter(|n| !old.configured.contains_key(*n))
            .count();
        let gone = old
            .configured
            .keys()
            .filter(|n| !new.configured.contains_key(*n))
            .count();
        Ok(format!(
            "tenants: {added} added, {gone} removed ({removed} of them active, draining), {changed} active ones changed ({stale} of them through a new activation)"
        ))
    }
}

/// Check every configured tenant (and the template) for what would keep
/// it from ever starting.
fn preflight_all(settings: &Settings, layers: Layers) -> Result<(), ConfigError> {
    let mut tools: Option<Result<NetTools, String>> = None;
    let mut idmappable = std::collections::HashSet::new();
    for (name, t) in &settings.tenants {
        build::preflight(name, t, layers, &mut tools, &mut idmappable)?;
    }
    if let Some(t) = &settings.template {
        build::preflight(
            "tenant_template",
            &t.example,
            layers,
            &mut tools,
            &mut idmappable,
        )?;
        t.make_roots()?;
    }
    Ok(())
}

/// Take one unused tenant out of `live` (the longest idle), for a tenant
/// that needs its place.
fn take_idle(live: &HashMap<Arc<str>, Arc<Slot>>) -> Option<Retiring> {
    let mut best: Option<(Arc<str>, Instant)> = None;
    for (name, slot) in live.iter() {
        let Ok(state) = slot.state.try_lock() else {
            continue;
        };
        let unused = match state.as_ref() {
            None => false,
            Some(t) => Arc::strong_count(t) == 1 && Arc::strong_count(slot) == 1,
        };
        if !unused {
            continue;
        }
        let since = slot.idle_since.lock().unwrap_or_else(Instant::now);
        if best.as_ref().is_none_or(|(_, b)| since < *b) {
            best = Some((name.clone(), since));
        }
    }
    let (name, _) = best?;
    // Kept, locked while it retires (see `take_retiring`); the sweep
    // removes it emptied.
    let slot = live.get(&name)?;
    let mut state = slot.state.clone().try_lock_owned().ok()?;
    let tenant = state.take()?;
    Some(Retiring {
        _slot: Some(state),
        tenant,
        replaced: false,
    })
}

/// The activations in `slots` (those not locked by an activation or a
/// retirement) and the `replaced` ones still serving.
fn active_of<'a>(
    slots: impl Iterator<Item = &'a Arc<Slot>>,
    replaced: &[Arc<Tenant>],
) -> Vec<Arc<Tenant>> {
    let mut out: Vec<Arc<Tenant>> = slots
        .filter_map(|s| s.state.try_lock().ok().and_then(|t| t.clone()))
        .collect();
    out.extend(replaced.iter().cloned());
    out
}

/// End a tenant's activation: its workers, then its usage into the
/// account, its cgroups, private `/tmp` and metric series (its network
/// namespace goes with the last reference).
fn retire(ctx: &BuildContext, accounts: &Accounts, r: Retiring) {
    let t = r.tenant;
    t.backend.retire();
    let usage = Usage::of(&t);
    let why = match (r.replaced, t.is_removed(), t.is_stale()) {
        (true, _, _) => "replaced",
        (_, true, _) => "removed",
        (_, _, true) => "changed",
        _ => "idle",
    };
    announce_retired(&t, &usage, why);
    if let Some(cg) = &t.cgroup {
        cg.remove();
    }
    if let Some(tmp) = &t.tmp {
        crate::isolation::disk::unmount(tmp);
        // `<state>/tenants/INSTANCE/tmp`, empty once unmounted: nothing
        // is left per tenant that came and went.
        let _ = std::fs::remove_dir(tmp);
        if let Some(parent) = tmp.parent() {
            let _ = std::fs::remove_dir(parent);
        }
    }
    if !r.replaced {
        ctx.metrics.forget_tenant(&t.name);
    }
    // Last: a report showing it inactive finds it wholly retired.
    accounts.retire(&t, &usage);
    tracing::info!(tenant = %t.name, instance = %t.instance, "tenant retired");
    drop(t);
}
