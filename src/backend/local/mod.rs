//! The local backend: a tenant's processes run in its worker pool (or, with
//! workers off, are spawned by the gateway under the tenant's sandbox), and
//! its file operations run in a worker (or on the gateway's blocking pool).
//!
//! [`route`] is the one place a method meets its handler: one line per
//! method of the table in `crate::rpc`, each handler in the file of its
//! family ([`process`], [`files`], [`handles`], [`watch`],
//! [`environment`]). Answers follow the session's revision through its
//! [`Policy`]; no handler matches on a revision.

mod environment;
mod files;
mod handles;
mod http;
mod process;
mod snapshot;
mod watch;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use parking_lot::Mutex;

use super::{Backend, OpFuture, Place, RunScope, SessionBackend};
use crate::error::GatewayError;
use crate::fs::{FsDone, FsError, FsOp, FsRoot};
use crate::isolation::sandbox::Sandbox;
use crate::outbound::Attachment;
use crate::process::{ExecSettings, ProcessTable};
use crate::protocol::Empty;
use crate::protocol::environment::EnvironmentInfo;
use crate::protocol::path::WirePath;
use crate::protocol::revision::{GRPC, NOV_2026, RevisionCell};
use crate::rpc::{Call, Op, Open, Outcome, Reply};
use crate::spawn::{LocalSpawner, Spawner};
use crate::worker::WorkerPool;

pub use handles::{MAX_FILE_HANDLES, MAX_READ_BLOCK_BYTES};
pub use watch::MAX_WATCHED_PATHS;

/// Where a tenant's processes and file operations run.
pub enum Runner {
    /// In the tenant's workers (each confined as a whole).
    Workers(Arc<WorkerPool>),
    /// In the gateway: each child confines itself with `sandbox`; file
    /// operations run on the blocking pool (as the tenant's uid, if any).
    Here(Option<Arc<Sandbox>>),
}

/// What a tenant's commands run in, as `environmentInfo` describes it.
#[derive(Debug, Clone)]
pub struct EnvironmentSpec {
    pub tenant: String,
    /// The tenant root (commands' default cwd).
    pub root: PathBuf,
    pub home: String,
    pub tmp: String,
    pub shell: String,
    /// The image its processes see as `/`.
    pub image: Option<std::sync::Arc<crate::image::Image>>,
}

/// A tenant on this gateway's own machinery.
pub struct LocalBackend {
    shared: Arc<Shared>,
    /// Sessions that chose another image than the tenant's run on a pool
    /// of their own per image, made by `images` when first needed; forks
    /// on a pool of their own each.
    images: Option<ImagePools>,
    /// The tenant's snapshots, and how its forks are made.
    snapshots: Option<Arc<snapshot::Snapshots>>,
}

/// Starts a pool of the tenant's workers at a place: its `/` the place's
/// view (if any), its root the place's workspace (if any).
pub type PoolFactory = Box<dyn Fn(&Place) -> Result<Arc<WorkerPool>, String> + Send + Sync>;

pub use snapshot::Snapshots;

/// Most images a tenant's sessions run at once besides its default (each
/// a pool of workers of its own).
pub const MAX_SESSION_IMAGES: usize = 4;

struct ImagePools {
    start: PoolFactory,
    /// The tenant's own base environment (images lay theirs over it).
    base_env: std::collections::HashMap<String, String>,
    /// By view path: the runner of sessions on that view.
    running: Mutex<Vec<(PathBuf, Arc<Shared>)>>,
}

/// What the tenant's sessions share.
struct Shared {
    /// The image its processes see (kept mounted while it runs).
    view: Option<Arc<crate::image::View>>,
    root: Arc<FsRoot>,
    exec: Arc<ExecSettings>,
    runner: Runner,
    env: EnvironmentSpec,
    /// `fs/readFile` limit (`max_read_file_bytes`).
    max_read_file_bytes: u64,
    /// `fs/open` handles over all the tenant's sessions (`max_open_files`).
    open_files: Arc<tokio::sync::Semaphore>,
    /// A fork's workspace (its own pool, killed when the last session on
    /// it ends, before the workspace is unmounted).
    fork: Option<Arc<crate::snapshot::Workspace>>,
    /// The image reference its sessions were chosen by (snapshots record it).
    image: Option<String>,
    /// Its `http/request` client, inside its network (none without a
    /// network of its own: then refused).
    http: Option<Arc<crate::egress::HttpEgress>>,
    /// Its egress by name, once started (after the backend is built).
    egress: EgressSlot,
}

/// Where a tenant's `TenantEgress` is put once it runs.
pub type EgressSlot = Arc<std::sync::OnceLock<Arc<crate::egress::TenantEgress>>>;

impl Drop for Shared {
    fn drop(&mut self) {
        if self.fork.is_some()
            && let Runner::Workers(pool) = &self.runner
        {
            pool.kill_all();
        }
    }
}

impl LocalBackend {
    pub fn new(
        root: Arc<FsRoot>,
        exec: Arc<ExecSettings>,
        runner: Runner,
        env: EnvironmentSpec,
        max_read_file_bytes: u64,
        max_open_files: usize,
    ) -> LocalBackend {
        LocalBackend {
            images: None,
            snapshots: None,
            shared: Arc::new(Shared {
                view: None,
                root,
                exec,
                runner,
                env,
                max_read_file_bytes,
                open_files: Arc::new(tokio::sync::Semaphore::new(max_open_files)),
                fork: None,
                image: None,
                http: None,
                egress: EgressSlot::default(),
            }),
        }
    }
}

impl LocalBackend {
    /// Sessions run `view` (the tenant's image); `start` makes the pools
    /// of sessions that choose another.
    pub fn with_images(
        mut self,
        view: Option<Arc<crate::image::View>>,
        image: Option<String>,
        start: PoolFactory,
        base_env: std::collections::HashMap<String, String>,
    ) -> Self {
        if let Some(shared) = Arc::get_mut(&mut self.shared) {
            shared.view = view;
            shared.image = image;
        }
        self.images = Some(ImagePools {
            start,
            base_env,
            running: Mutex::new(Vec::new()),
        });
        self
    }

    /// The bytes of the images the tenant's views would use with `view`
    /// added (its default's, the `running` pools', `view`'s; each image
    /// once): what `[images] max_tenant_bytes` bounds.
    fn image_bytes(&self, running: &[(PathBuf, Arc<Shared>)], view: &crate::image::View) -> u64 {
        let mut images: HashMap<&str, u64> = HashMap::new();
        let views = running
            .iter()
            .filter_map(|(_, s)| s.view.as_deref())
            .chain(self.shared.view.as_deref())
            .chain([view]);
        for v in views {
            images.insert(&v.image.digest, v.image.bytes);
        }
        images.values().sum()
    }

    /// Sessions' `http/request` goes through `http` (inside the tenant's
    /// network).
    pub fn with_http(mut self, http: Arc<crate::egress::HttpEgress>) -> Self {
        if let Some(shared) = Arc::get_mut(&mut self.shared) {
            shared.http = Some(http);
        }
        self
    }

    /// The slot the tenant's egress by name is put in once it runs
    /// (processes started with Codex's `networkProxy` get a proxy of it).
    pub fn egress_slot(&self) -> EgressSlot {
        self.shared.egress.clone()
    }

    /// Sessions can snapshot and fork through `snapshots`.
    pub fn with_snapshots(mut self, snapshots: Arc<Snapshots>) -> Self {
        self.snapshots = Some(snapshots);
        self
    }

    /// What sessions at `place` run on: a fork's pool of its own, or
    /// [`Self::shared_for_view`].
    fn shared_for(&self, place: Place) -> Result<Arc<Shared>, GatewayError> {
        let Some(workspace) = place.workspace else {
            return self.shared_for_view(place.view, place.image);
        };
        let Some(pools) = &self.images else {
            return Err(GatewayError::InvalidParams(
                "this tenant's sessions cannot start from a snapshot: they need a root of their own and the namespaces and workers layers".to_owned(),
            ));
        };
        let view = place.view.or_else(|| self.shared.view.clone());
        let image = place.image.or_else(|| self.shared.image.clone());
        let pool = (pools.start)(&Place {
            view: view.clone(),
            image: image.clone(),
            workspace: Some(workspace.clone()),
        })
        .map_err(|e| {
            tracing::error!(tenant = %self.shared.env.tenant, error = %e, "fork workers");
            GatewayError::Internal(
                "the fork's workers could not start (the gateway's log says why)".to_owned(),
            )
        })?;
        let tree = std::fs::File::open(workspace.path()).map_err(|e| {
            GatewayError::Internal(format!("the fork's workspace could not be opened: {e}"))
        })?;
        let root = FsRoot::confined_at(&self.shared.env.root, tree.into())
            .with_creds(self.shared.root.creds());
        let mut shared = self.shared_on(view.as_ref(), pool, Arc::new(root));
        shared.fork = Some(workspace);
        shared.image = image;
        Ok(Arc::new(shared))
    }

    /// What a pool at `view` runs with: the tenant's settings, the
    /// image's environment over its own.
    fn shared_on(
        &self,
        view: Option<&Arc<crate::image::View>>,
        pool: Arc<WorkerPool>,
        root: Arc<FsRoot>,
    ) -> Shared {
        let base = &self.shared;
        let mut exec = (*base.exec).clone();
        let mut env = base.env.clone();
        if let (Some(view), Some(pools)) = (view, &self.images) {
            exec.base_env = view.env_over(&pools.base_env);
            env.shell = exec
                .base_env
                .get("SHELL")
                .cloned()
                .unwrap_or_else(|| "/bin/sh".to_owned());
            env.image = Some(view.image.clone());
        }
        Shared {
            view: view.cloned(),
            root,
            exec: Arc::new(exec),
            runner: Runner::Workers(pool),
            env,
            max_read_file_bytes: base.max_read_file_bytes,
            open_files: base.open_files.clone(),
            fork: None,
            image: None,
            http: base.http.clone(),
            egress: base.egress.clone(),
        }
    }

    /// What sessions on `view` run on: the tenant's default, or that
    /// image's pool (started now if it is not running).
    fn shared_for_view(
        &self,
        view: Option<Arc<crate::image::View>>,
        image: Option<String>,
    ) -> Result<Arc<Shared>, GatewayError> {
        let Some(view) = view else {
            return Ok(self.shared.clone());
        };
        if self
            .shared
            .view
            .as_ref()
            .is_some_and(|v| v.path == view.path)
        {
            return Ok(self.shared.clone());
        }
        let Some(pools) = &self.images else {
            return Err(GatewayError::InvalidParams(
                "this tenant's sessions cannot choose an image".to_owned(),
            ));
        };
        let mut running = pools.running.lock();
        if let Some((_, s)) = running.iter().find(|(p, _)| *p == view.path) {
            return Ok(s.clone());
        }
        let share = view.max_tenant_bytes();
        if running.len() >= MAX_SESSION_IMAGES || self.image_bytes(&running, &view) > share {
            // The pools no session holds any more make room (their
            // workers killed, their views released): only this takes a
            // pool's `Shared` from the list, under its lock, so a count
            // of one here stays one.
            running.retain(|(_, s)| {
                let idle = Arc::strong_count(s) == 1;
                if idle && let Runner::Workers(pool) = &s.runner {
                    pool.kill_all();
                }
                !idle
            });
        }
        if running.len() >= MAX_SESSION_IMAGES {
            return Err(GatewayError::QuotaExceeded {
                quota: "images in use by the tenant's sessions at once",
                limit: MAX_SESSION_IMAGES as u64,
                retry_after_ms: None,
            });
        }
        // Refused before its pool starts; the caller drops the view, and
        // the image stays in the store, evictable.
        let held = self.image_bytes(&running, &view);
        if held > share {
            tracing::info!(tenant = %self.shared.env.tenant, image = %view.image.digest, bytes = held, limit = share, "session image refused: the tenant's share of the image store");
            return Err(GatewayError::QuotaExceeded {
                quota: "image bytes in use by the tenant",
                limit: share,
                retry_after_ms: None,
            });
        }
        let pool = (pools.start)(&Place {
            view: Some(view.clone()),
            image: image.clone(),
            workspace: None,
        })
        .map_err(|e| {
            tracing::error!(tenant = %self.shared.env.tenant, image = %view.image.digest, error = %e, "image workers");
            GatewayError::Internal("the image's workers could not start (the gateway's log says why)".to_owned())
        })?;
        let mut shared = self.shared_on(Some(&view), pool, self.shared.root.clone());
        shared.image = image;
        let shared = Arc::new(shared);
        running.push((view.path.clone(), shared.clone()));
        Ok(shared)
    }
}

/// The calls that need no session (gRPC file calls) on `shared`: the
/// gRPC API's policy, plain paths and every field.
fn sessionless(shared: Arc<Shared>, op: Op) -> OpFuture {
    Box::pin(async move {
        let policy = &GRPC;
        match op {
            Op::Call(Call::EnvironmentInfo(_)) => {
                Ok(Outcome::Reply(environment::info(&shared, policy)))
            }
            Op::Call(call) => files::route(&shared, call, policy, None).await,
            Op::Open(open @ (Open::ReadFile(_) | Open::WriteFile(_))) => {
                files::open_stream(&shared, open, policy).await
            }
            Op::Open(_) => Err(needs_session()),
        }
    })
}

impl Backend for LocalBackend {
    fn open_session(
        &self,
        attachment: Arc<Attachment>,
        revision: Arc<RevisionCell>,
        place: Place,
    ) -> Result<Arc<dyn SessionBackend>, GatewayError> {
        let shared = self.shared_for(place)?;
        let spawner: Box<dyn Spawner> = match &shared.runner {
            Runner::Workers(pool) => Box::new(pool.session()),
            Runner::Here(sandbox) => Box::new(LocalSpawner {
                sandbox: sandbox.clone(),
            }),
        };
        Ok(Arc::new(LocalSession {
            table: ProcessTable::new(
                attachment.clone(),
                shared.exec.clone(),
                spawner,
                revision.clone(),
            ),
            shared,
            snapshots: self.snapshots.clone(),
            revision,
            attachment,
            handles: Mutex::new(HashMap::new()),
            watch: Mutex::new(None),
            http_streams: http::Streams::default(),
            proxies: Arc::default(),
            remembered: crate::egress::ask::Remembered::default(),
            http_stop: tokio_util::sync::CancellationToken::new(),
        }))
    }

    /// The calls that need no session (gRPC file calls): the gRPC API's
    /// policy, plain paths and every field.
    fn run_sessionless(&self, op: Op) -> OpFuture {
        if let Op::Call(
            call @ (Call::SnapshotList(_)
            | Call::SnapshotGet(_)
            | Call::SnapshotDelete(_)
            | Call::SnapshotPush(_)
            | Call::SnapshotPromote(_)),
        ) = op
        {
            let snaps = self.snapshots.clone();
            return Box::pin(async move {
                snapshot::on_store(snaps.as_ref(), call, None)
                    .await
                    .map(Outcome::Reply)
            });
        }
        sessionless(self.shared.clone(), op)
    }

    fn retire(&self) {
        if let Runner::Workers(pool) = &self.shared.runner {
            pool.kill_all();
        }
        if let Some(pools) = &self.images {
            for (_, s) in pools.running.lock().drain(..) {
                if let Runner::Workers(pool) = &s.runner {
                    pool.kill_all();
                }
            }
        }
    }
}

pub(super) fn needs_session() -> GatewayError {
    GatewayError::InvalidRequest("this call needs a session".to_owned())
}

fn empty() -> Reply {
    Reply::Empty(Empty {})
}

impl Shared {
    /// Run a file operation where the tenant's file operations run.
    async fn fs(&self, op: FsOp) -> Result<FsDone, FsError> {
        match &self.runner {
            Runner::Workers(pool) => pool.fs(op).await,
            Runner::Here(_) => {
                let root = self.root.clone();
                blocking(move || crate::fs::run(&root, op)).await
            }
        }
    }

    /// A file opened where the tenant's file operations run.
    async fn fs_file(&self, op: FsOp) -> Result<std::fs::File, FsError> {
        match self.fs(op).await? {
            FsDone::File(f) => Ok(f),
            other => Err(unexpected(&other)),
        }
    }

    fn check_cwd(&self, cwd: &WirePath) -> Result<(), GatewayError> {
        Ok(self.root.check_cwd(cwd.as_str())?)
    }
}

/// Run blocking file work on the blocking pool.
async fn blocking<T, F>(f: F) -> Result<T, FsError>
where
    T: Send + 'static,
    F: FnOnce() -> Result<T, FsError> + Send + 'static,
{
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| FsError::Io(format!("fs task failed: {e}")))?
}

fn unexpected(done: &FsDone) -> FsError {
    FsError::Io(format!("unexpected file operation result: {done:?}"))
}

/// One session on the local backend.
struct LocalSession {
    table: Arc<ProcessTable>,
    shared: Arc<Shared>,
    snapshots: Option<Arc<Snapshots>>,
    revision: Arc<RevisionCell>,
    attachment: Arc<Attachment>,
    handles: Mutex<HashMap<String, handles::Handle>>,
    watch: Mutex<Option<watch::Watch>>,
    /// `http/request` ids whose bodies are streaming.
    http_streams: http::Streams,
    /// Ends the streaming bodies with the session.
    http_stop: tokio_util::sync::CancellationToken,
    /// How many of its processes have a proxy of their own (`networkProxy`).
    proxies: Arc<std::sync::atomic::AtomicUsize>,
    /// Hosts its client decided for the whole session.
    remembered: crate::egress::ask::Remembered,
}

/// Every method of the table, to its handler: one line each.
async fn route(s: &LocalSession, op: Op, scope: RunScope) -> Result<Outcome, GatewayError> {
    let policy = s.revision.policy();
    let call = match op {
        Op::Call(call) => call,
        Op::Open(Open::Events(p)) => return process::attach(s, &p),
        Op::Open(Open::Exec(p)) => return process::exec_stream(s, *p, scope.audit).await,
        Op::Open(file) => return files::open_stream(&s.shared, file, policy).await,
    };
    let reply = match call {
        // Handled by the connection, which owns the once-per-connection state.
        Call::Initialize(_) => return Err(initialize_once()),
        // Answered by `dispatch` from the session's own state.
        Call::PreviewCreate(_)
        | Call::PreviewRevoke(_)
        | Call::PreviewList(_)
        | Call::EgressGet(_)
        | Call::EgressSet(_) => {
            return Err(GatewayError::Internal(
                "gateway/preview reached a backend".to_owned(),
            ));
        }
        Call::ProcessStart(p) if p.network_proxy.is_some() => {
            process::start_managed(s, p, policy, scope.audit.clone()).await?
        }
        Call::ProcessStart(p) => process::start(s, p, policy, scope.audit.clone()).await?,
        Call::ProcessRead(p) => return process::read(s, p, scope).await,
        Call::ProcessWrite(p) => process::write(s, p).await?,
        Call::ProcessTerminate(p) | Call::CommandExecTerminate(p) => process::terminate(s, &p),
        Call::ProcessSignal(p) => process::signal(s, &p)?,
        Call::ProcessResize(p) => process::resize(s, &p)?,
        Call::ProcessCloseStdin(p) => process::close_stdin(s, &p).await?,
        Call::ProcessList(_) => process::list(s),
        Call::HttpRequest(p) => return http::request(s, p, scope).await,
        Call::CommandExec(p) => process::command_exec(s, p, scope.audit.clone()).await?,
        Call::CommandExecWrite(p) => process::command_exec_write(s, &p).await?,
        Call::FsOpen(p) => handles::open(s, p, policy).await?,
        Call::FsReadBlock(p) => handles::read_block(s, p).await?,
        Call::FsWriteBlock(p) => handles::write_block(s, p).await?,
        Call::FsClose(p) => handles::close(s, &p),
        Call::FsWatchMissing(p) => watch::watch_missing(s, p).await?,
        Call::EnvironmentInfo(_) => environment::info(&s.shared, policy),
        Call::EnvironmentStatus(_) => environment::status(),
        Call::EnvironmentConfigRead(p) => environment::config_read(&s.shared, &p)?,
        Call::CapabilitiesDiscover(p) => environment::discover(&s.shared, &p)?,
        Call::CapabilityRootsDiscover(p) => environment::roots(p),
        Call::SnapshotCreate(p) => snapshot::create(s, p, scope.audit.clone()).await?,
        call @ (Call::SnapshotList(_)
        | Call::SnapshotGet(_)
        | Call::SnapshotDelete(_)
        | Call::SnapshotPush(_)
        | Call::SnapshotPromote(_)) => {
            snapshot::on_store(s.snapshots.as_ref(), call, scope.audit.as_deref()).await?
        }
        // Whole-file calls: one handler each in `files`, which gRPC's
        // session-less calls reach too.
        file @ (Call::FsReadFile(_)
        | Call::FsWriteFile(_)
        | Call::FsCreateDirectory(_)
        | Call::FsGetMetadata(_)
        | Call::FsReadDirectory(_)
        | Call::FsRemove(_)
        | Call::FsCopy(_)
        | Call::FsCanonicalize(_)
        | Call::FsWalk(_)) => return files::route(&s.shared, file, policy, scope.reply).await,
    };
    Ok(Outcome::Reply(reply))
}

fn initialize_once() -> GatewayError {
    GatewayError::InvalidRequest("initialize may only be sent once per connection".to_owned())
}

fn http_disabled() -> GatewayError {
    GatewayError::Forbidden("http/request is disabled on this gateway".to_owned())
}

impl SessionBackend for LocalSession {
    fn run(self: Arc<Self>, op: Op, scope: RunScope) -> OpFuture {
        Box::pin(async move { route(&self, op, scope).await })
    }

    fn kill_all(&self, why: crate::audit::KilledBy) {
        self.table.kill_all(why);
        self.http_stop.cancel();
        self.watch.lock().take();
        self.handles.lock().clear();
    }

    fn live_processes(&self) -> usize {
        self.table.live_count()
    }

    fn undelivered_closes(&self) -> usize {
        self.table.undelivered_count()
    }

    fn closes_awaiting_read(&self) -> usize {
        self.table.awaiting_read_count()
    }

    fn environment(&self) -> EnvironmentInfo {
        environment::describe(&self.shared, &NOV_2026)
    }

    fn run_sessionless(&self, op: Op) -> OpFuture {
        sessionless(self.shared.clone(), op)
    }
}
