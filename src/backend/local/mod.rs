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
mod process;
mod watch;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use parking_lot::Mutex;

use super::{Backend, OpFuture, RunScope, SessionBackend};
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
}

/// A tenant on this gateway's own machinery.
pub struct LocalBackend {
    shared: Arc<Shared>,
}

/// What the tenant's sessions share.
struct Shared {
    root: Arc<FsRoot>,
    exec: Arc<ExecSettings>,
    runner: Runner,
    env: EnvironmentSpec,
    /// `fs/readFile` limit (`max_read_file_bytes`).
    max_read_file_bytes: u64,
    /// `fs/open` handles over all the tenant's sessions (`max_open_files`).
    open_files: Arc<tokio::sync::Semaphore>,
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
            shared: Arc::new(Shared {
                root,
                exec,
                runner,
                env,
                max_read_file_bytes,
                open_files: Arc::new(tokio::sync::Semaphore::new(max_open_files)),
            }),
        }
    }
}

impl Backend for LocalBackend {
    fn open_session(
        &self,
        attachment: Arc<Attachment>,
        revision: Arc<RevisionCell>,
    ) -> Result<Arc<dyn SessionBackend>, GatewayError> {
        let spawner: Box<dyn Spawner> = match &self.shared.runner {
            Runner::Workers(pool) => Box::new(pool.session()),
            Runner::Here(sandbox) => Box::new(LocalSpawner {
                sandbox: sandbox.clone(),
            }),
        };
        Ok(Arc::new(LocalSession {
            table: ProcessTable::new(
                attachment.clone(),
                self.shared.exec.clone(),
                spawner,
                revision.clone(),
            ),
            shared: self.shared.clone(),
            revision,
            attachment,
            handles: Mutex::new(HashMap::new()),
            watch: Mutex::new(None),
        }))
    }

    /// The calls that need no session (gRPC file calls): the gRPC API's
    /// policy, plain paths and every field.
    fn run_sessionless(&self, op: Op) -> OpFuture {
        let shared = self.shared.clone();
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

    fn retire(&self) {
        if let Runner::Workers(pool) = &self.shared.runner {
            pool.kill_all();
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
    revision: Arc<RevisionCell>,
    attachment: Arc<Attachment>,
    handles: Mutex<HashMap<String, handles::Handle>>,
    watch: Mutex<Option<watch::Watch>>,
}

/// Every method of the table, to its handler: one line each.
async fn route(s: &LocalSession, op: Op, scope: RunScope) -> Result<Outcome, GatewayError> {
    let policy = s.revision.policy();
    let call = match op {
        Op::Call(call) => call,
        Op::Open(Open::Events(p)) => return process::attach(s, &p),
        Op::Open(Open::Exec(p)) => return process::exec_stream(s, *p, scope.audit),
        Op::Open(file) => return files::open_stream(&s.shared, file, policy).await,
    };
    let reply = match call {
        // Handled by the connection, which owns the once-per-connection state.
        Call::Initialize(_) => return Err(initialize_once()),
        Call::ProcessStart(p) => process::start(s, p, policy, scope.audit.clone())?,
        Call::ProcessRead(p) => return process::read(s, p, scope).await,
        Call::ProcessWrite(p) => process::write(s, p).await?,
        Call::ProcessTerminate(p) | Call::CommandExecTerminate(p) => process::terminate(s, &p),
        Call::ProcessSignal(p) => process::signal(s, &p)?,
        Call::ProcessResize(p) => process::resize(s, &p)?,
        Call::ProcessCloseStdin(p) => process::close_stdin(s, &p).await?,
        Call::ProcessList(_) => process::list(s),
        Call::HttpRequest(_) => return Err(http_disabled()),
        Call::CommandExec(p) => process::command_exec(s, p, scope.audit.clone())?,
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
}
