//! The local backend: a tenant's processes run in its worker pool (or, with
//! workers off, are spawned by the gateway under the tenant's sandbox), and
//! its file operations run in a worker (or on the gateway's blocking pool).
//!
//! Answers follow the session's protocol revision: paths in its form, the
//! fields each revision has, each reference's error for the same failure.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio_util::sync::CancellationToken;

use super::{Backend, OpFuture, RunScope, SessionBackend};
use crate::error::GatewayError;
use crate::exec::{Api, ExecSettings, ProcessTable, StartOptions};
use crate::fs::{FsDone, FsError, FsOp, FsRoot};
use crate::isolation::sandbox::Sandbox;
use crate::outbound::{Attachment, Outbound};
use crate::protocol::environment::{
    ConfigLayers, ConfigReadParams, ConfigReadResponse, DiscoverResponse, EnvironmentInfo,
    RootsResponse, Shell, StatusResponse,
};
use crate::protocol::fs::{
    CanonicalizeResponse, HandleParams, OpenMode, OpenParams, PathParams, ReadBlockParams,
    ReadBlockResponse, ReadFileResponse, WalkResponse, WatchMissingParams, WatchMissingResponse,
    WriteBlockParams, WriteFileParams,
};
use crate::protocol::path::{WirePath, to_wire};
use crate::protocol::process::{ExecParams, ExecResponse, SandboxType};
use crate::protocol::revision::{Revision, RevisionCell};
use crate::protocol::v0::{CommandExecParams, CommandExecResponse, CommandExecWriteResponse};
use crate::protocol::{ByteChunk, Empty, base64_decode, notify};
use crate::rpc::{Call, EncodedReply, Op, Open, Opened, Outcome, Reply};
use crate::spawn::{LocalSpawner, Spawner};
use crate::worker::WorkerPool;

/// Open `fs/open` handles per session.
pub const MAX_FILE_HANDLES: usize = 64;
/// Largest `fs/readBlock` (the reference's limit).
pub const MAX_READ_BLOCK_BYTES: u64 = 1024 * 1024;
/// Paths one `fs/watchMissing` may watch.
pub const MAX_WATCHED_PATHS: usize = 1024;
/// A watch checks its paths this often at first, backing off to
/// [`WATCH_POLL_MAX`] while nothing changes.
const WATCH_POLL_MIN: Duration = Duration::from_millis(100);
const WATCH_POLL_MAX: Duration = Duration::from_secs(2);

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

    fn run_sessionless(&self, op: Op) -> OpFuture {
        let shared = self.shared.clone();
        Box::pin(async move {
            // gRPC: plain paths.
            let revision = Revision::May2026;
            match op {
                Op::Call(Call::EnvironmentInfo(_)) => Ok(Outcome::Reply(Reply::EnvironmentInfo(
                    Box::new(shared.environment(revision)),
                ))),
                Op::Call(call) if is_file_call(&call) => {
                    shared.file_call(call, revision).await.map(Outcome::Reply)
                }
                Op::Open(open @ (Open::ReadFile(_) | Open::WriteFile(_))) => {
                    shared.open_file(open, revision).await
                }
                _ => Err(GatewayError::InvalidRequest(
                    "this call needs a session".to_owned(),
                )),
            }
        })
    }

    fn retire(&self) {
        if let Runner::Workers(pool) = &self.shared.runner {
            pool.kill_all();
        }
    }
}

fn is_file_call(call: &Call) -> bool {
    matches!(
        call,
        Call::FsReadFile(_)
            | Call::FsWriteFile(_)
            | Call::FsCreateDirectory(_)
            | Call::FsGetMetadata(_)
            | Call::FsReadDirectory(_)
            | Call::FsRemove(_)
            | Call::FsCopy(_)
            | Call::FsCanonicalize(_)
            | Call::FsWalk(_)
    )
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

    /// `fs/readFile`: over the limit is -32602 naming it; the reply's
    /// bytes are reserved in the caller's outbound budgets (waiting for
    /// room) before the file is read, and it is encoded as it is read.
    async fn read_file(
        &self,
        p: PathParams,
        revision: Revision,
        reply: Option<Outbound>,
    ) -> Result<Outcome, GatewayError> {
        let err = |e: FsError| e.into_gateway_error(revision);
        let file = self.fs_file(FsOp::OpenRead(p)).await.map_err(err)?;
        let len = file
            .metadata()
            .map_err(|e| err(FsError::from_io(&e)))?
            .len();
        let limit = self.max_read_file_bytes;
        if len > limit {
            return Err(GatewayError::InvalidParams(format!(
                "file is {len} bytes, over this gateway's fs/readFile limit of {limit} bytes (max_read_file_bytes); read it in blocks with fs/open and fs/readBlock, or stream it with gRPC FileService/ReadFile"
            )));
        }
        let Some(out) = reply else {
            let data = blocking(move || crate::fs::read_whole(file, limit))
                .await
                .map_err(err)?;
            return Ok(Outcome::Reply(Reply::FsReadFile(ReadFileResponse {
                data_base64: ByteChunk(data),
            })));
        };
        let size = usize::try_from(crate::config::read_file_reply_bytes(len)).unwrap_or(usize::MAX);
        let held = out.reserve(size).await.map_err(|_| {
            GatewayError::Internal("the connection closed before the reply was sent".to_owned())
        })?;
        let result = blocking(move || crate::fs::read_encoded(file, len))
            .await
            .map_err(err)?;
        Ok(Outcome::Encoded(EncodedReply {
            result,
            gap: crate::protocol::jsonrpc::ENVELOPE_GAP,
            held,
        }))
    }

    async fn fs_file(&self, op: FsOp) -> Result<std::fs::File, FsError> {
        match self.fs(op).await? {
            FsDone::File(f) => Ok(f),
            other => Err(unexpected(&other)),
        }
    }

    async fn file_call(&self, call: Call, revision: Revision) -> Result<Reply, GatewayError> {
        let err = |e: FsError| e.into_gateway_error(revision);
        let done = |op| async { self.fs(op).await.map_err(err) };
        Ok(match call {
            Call::FsReadFile(p) => {
                let file = self.fs_file(FsOp::OpenRead(p)).await.map_err(err)?;
                let limit = self.max_read_file_bytes;
                let data = blocking(move || crate::fs::read_whole(file, limit))
                    .await
                    .map_err(err)?;
                // Encoded later, straight into the response frame.
                Reply::FsReadFile(ReadFileResponse {
                    data_base64: ByteChunk(data),
                })
            }
            Call::FsWriteFile(p) => {
                let data = write_data(&p)?;
                let open = PathParams {
                    path: p.path,
                    follow_symlinks: p.follow_symlinks,
                };
                let file = self.fs_file(FsOp::OpenWrite(open)).await.map_err(err)?;
                blocking(move || crate::fs::write_whole(&file, &data))
                    .await
                    .map_err(err)?;
                empty()
            }
            Call::FsCreateDirectory(p) => {
                done(FsOp::CreateDirectory(p)).await?;
                empty()
            }
            Call::FsGetMetadata(p) => match done(FsOp::GetMetadata(p)).await? {
                FsDone::Metadata(m) => Reply::FsGetMetadata(m),
                other => return Err(unexpected(&other).into()),
            },
            Call::FsReadDirectory(p) => match done(FsOp::ReadDirectory(p)).await? {
                FsDone::Directory(d) => Reply::FsReadDirectory(d),
                other => return Err(unexpected(&other).into()),
            },
            Call::FsRemove(p) => {
                done(FsOp::Remove(p)).await?;
                empty()
            }
            Call::FsCopy(p) => {
                done(FsOp::Copy(p)).await?;
                empty()
            }
            Call::FsCanonicalize(p) => match done(FsOp::Canonicalize(p)).await? {
                FsDone::Path(path) => Reply::FsCanonicalize(CanonicalizeResponse {
                    path: to_wire(&path, revision),
                }),
                other => return Err(unexpected(&other).into()),
            },
            Call::FsWalk(p) => match done(FsOp::Walk(p)).await? {
                FsDone::Walk(mut w) => {
                    rewrite_walk(&mut w, revision);
                    Reply::FsWalk(w)
                }
                other => return Err(unexpected(&other).into()),
            },
            other => {
                return Err(GatewayError::Internal(format!(
                    "{} is not a file call",
                    other.method()
                )));
            }
        })
    }

    async fn open_file(&self, open: Open, revision: Revision) -> Result<Outcome, GatewayError> {
        let op = match open {
            Open::ReadFile(p) => FsOp::OpenRead(p),
            Open::WriteFile(p) => FsOp::OpenWrite(p),
            _ => {
                return Err(GatewayError::Internal("not a file stream".to_owned()));
            }
        };
        let file = self
            .fs_file(op)
            .await
            .map_err(|e| e.into_gateway_error(revision))?;
        Ok(Outcome::Opened(Opened::File(file)))
    }

    fn check_cwd(&self, cwd: &WirePath) -> Result<(), GatewayError> {
        Ok(self.root.check_cwd(cwd.as_str())?)
    }

    /// `environmentInfo`: the tenant's root, home, temporary directory and
    /// shell, and only the capabilities the gateway really has; paths in
    /// `revision`'s form.
    fn environment(&self, revision: Revision) -> EnvironmentInfo {
        use sha2::Digest as _;
        let uri = |p: &str| to_wire(p, revision);
        let env = &self.env;
        let digest = sha2::Sha256::digest(format!("exec-gateway/tenant/{}", env.tenant));
        let provider: String = digest.iter().map(|b| format!("{b:02x}")).collect();
        let shell_name = Path::new(&env.shell)
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "sh".to_owned());
        let capabilities = [
            ("fsWatchMissing", true),
            ("capabilityDiscoveryV2", true),
            ("environmentConfigRead", true),
            ("fileWriteStreaming", true),
            ("sandboxedFileStreaming", false),
            ("networkProxyLaunch", false),
            ("networkProxyReviewDomains", false),
            ("credentialMasking", false),
            ("credentialMaskingCustomProviders", false),
            ("capabilityDiscoverySandbox", false),
            ("httpHeaderEnvVars", false),
            ("shellSnapshotV2", false),
            ("windowsMxc", false),
            ("linuxRootWritePreservesDevices", false),
            ("linuxApprovedRootWritePreservesRestrictions", false),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect::<BTreeMap<_, _>>();
        EnvironmentInfo {
            shell: Shell {
                name: shell_name,
                path: env.shell.clone(),
            },
            executor_version: env!("CARGO_PKG_VERSION").to_owned(),
            provider_id: format!("sha256:{provider}"),
            cwd: uri(&env.root.display().to_string()),
            user_home_dir: uri(&env.home),
            platform_os: "linux".to_owned(),
            prepend_path_dirs: Vec::new(),
            temporary_directories: Vec::new(),
            temp_dir: uri(&env.tmp),
            capabilities,
        }
    }
}

/// A walk's host paths in the session's form.
fn rewrite_walk(w: &mut WalkResponse, revision: Revision) {
    for e in &mut w.entries {
        e.path = to_wire(&e.path, revision);
    }
    for e in &mut w.errors {
        e.path = to_wire(&e.path, revision);
    }
}

fn unexpected(done: &FsDone) -> FsError {
    FsError::Io(format!("unexpected file operation result: {done:?}"))
}

/// Decode `fs/writeFile` data (bad base64 is the reference's -32600).
fn write_data(p: &WriteFileParams) -> Result<Vec<u8>, GatewayError> {
    base64_decode(&p.data_base64).map_err(|e| {
        GatewayError::InvalidRequest(format!(
            "fs/writeFile requires valid base64 dataBase64: {e}"
        ))
    })
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

/// An `fs/open` handle.
struct Handle {
    file: Arc<std::fs::File>,
    /// Its place in the tenant's `max_open_files`.
    _slot: tokio::sync::OwnedSemaphorePermit,
}

/// The session's `fs/watchMissing` watch.
struct Watch {
    id: u64,
    stop: CancellationToken,
}

impl Drop for Watch {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// One session on the local backend.
struct LocalSession {
    table: Arc<ProcessTable>,
    shared: Arc<Shared>,
    revision: Arc<RevisionCell>,
    attachment: Arc<Attachment>,
    handles: Mutex<HashMap<String, Handle>>,
    watch: Mutex<Option<Watch>>,
}

const PROCESS: StartOptions = StartOptions {
    api: Api::Process,
    retained_cap: None,
    hold_output: false,
};

impl LocalSession {
    async fn call(&self, call: Call, evicted: CancellationToken) -> Result<Reply, GatewayError> {
        let revision = self.revision.or_default();
        let current = revision == Revision::Nov2026;
        let table = &self.table;
        Ok(match call {
            Call::Initialize(_) => {
                // Handled by the connection, which owns the once-per-connection state.
                return Err(GatewayError::InvalidRequest(
                    "initialize may only be sent once per connection".to_owned(),
                ));
            }
            Call::ProcessStart(p) => {
                self.shared.check_cwd(&p.cwd)?;
                let process_id = p.process_id.clone();
                // The tenant's confinement applies whatever the client asks;
                // no sandbox of the client's is applied on top.
                let sandbox_type = current.then_some(SandboxType::None);
                table.start(p, PROCESS)?;
                Reply::ProcessStart(ExecResponse {
                    process_id,
                    sandbox_type,
                })
            }
            Call::ProcessRead(p) => Reply::ProcessRead(table.read(p, &evicted, None).await?.0),
            Call::ProcessWrite(p) => Reply::ProcessWrite(table.write(p).await?),
            Call::ProcessTerminate(p) | Call::CommandExecTerminate(p) => {
                Reply::ProcessTerminate(table.terminate(&p.process_id))
            }
            Call::ProcessSignal(p) => {
                table.signal(&p)?;
                empty()
            }
            Call::ProcessResize(p) => {
                table.resize(&p)?;
                empty()
            }
            Call::ProcessCloseStdin(p) => {
                table.close_stdin(&p.process_id).await?;
                empty()
            }
            Call::ProcessList(_) => Reply::ProcessList(table.list()),
            Call::HttpRequest(_) => {
                return Err(GatewayError::Forbidden(
                    "http/request is disabled on this gateway".to_owned(),
                ));
            }
            Call::CommandExec(p) => self.command_exec(p)?,
            Call::CommandExecWrite(p) => {
                table.write_v0(&p.process_id, &p.chunk.0).await?;
                Reply::CommandExecWrite(CommandExecWriteResponse { accepted: true })
            }
            file @ (Call::FsReadFile(_)
            | Call::FsWriteFile(_)
            | Call::FsCreateDirectory(_)
            | Call::FsGetMetadata(_)
            | Call::FsReadDirectory(_)
            | Call::FsRemove(_)
            | Call::FsCopy(_)
            | Call::FsCanonicalize(_)
            | Call::FsWalk(_)) => {
                let mut reply = self.shared.file_call(file, revision).await?;
                if let (Revision::May2026, Reply::FsGetMetadata(m)) = (revision, &mut reply) {
                    // May's getMetadata has no size.
                    m.size = None;
                }
                reply
            }
            Call::FsOpen(p) => self.open_handle(p, revision).await?,
            Call::FsReadBlock(p) => self.read_block(p).await?,
            Call::FsWriteBlock(p) => self.write_block(p).await?,
            Call::FsClose(p) => {
                self.handles.lock().remove(&p.handle_id);
                empty()
            }
            Call::FsWatchMissing(p) => self.watch_missing(p).await?,
            // Paths in the session's form (a May session learnt plain paths).
            Call::EnvironmentInfo(_) => {
                Reply::EnvironmentInfo(Box::new(self.shared.environment(revision)))
            }
            Call::EnvironmentStatus(_) => Reply::EnvironmentStatus(StatusResponse {
                status: "ready".to_owned(),
            }),
            Call::EnvironmentConfigRead(p) => self.config_read(&p)?,
            Call::CapabilitiesDiscover(p) => {
                self.shared.check_cwd(&p.cwd)?;
                // No plugins or skills are installed on a gateway.
                Reply::CapabilitiesDiscover(DiscoverResponse {
                    plugins: Vec::new(),
                    skills: Vec::new(),
                    warnings: Vec::new(),
                })
            }
            // One empty entry per root: a gateway has no plugins or skills
            // to find (and scans nothing, inside the root or out).
            Call::CapabilityRootsDiscover(p) => Reply::CapabilityRootsDiscover(RootsResponse {
                roots: p
                    .roots
                    .into_iter()
                    .map(|r| {
                        serde_json::json!({
                            "id": r.id,
                            "path": r.rest.get("path").cloned().unwrap_or(serde_json::Value::Null),
                            "plugin": null,
                            "skills": [],
                            "namespaceManifests": [],
                            "warnings": [],
                            "error": null,
                        })
                    })
                    .collect(),
            }),
        })
    }

    /// v0 `command/exec`: the same table, v0 notifications, stdin closed
    /// for pipe processes, and the client's retained-output cap.
    fn command_exec(&self, p: CommandExecParams) -> Result<Reply, GatewayError> {
        self.shared.check_cwd(&p.cwd)?;
        let process_id = p.process_id.clone();
        let exec = ExecParams {
            process_id: p.process_id,
            argv: p.argv,
            cwd: p.cwd,
            env: p.env,
            tty: p.tty,
            pipe_stdin: false,
            arg0: p.arg0,
            env_policy: None,
            sandbox: None,
        };
        self.table.start(
            exec,
            StartOptions {
                api: Api::CommandExec,
                retained_cap: p.output_bytes_cap,
                hold_output: false,
            },
        )?;
        Ok(Reply::CommandExec(CommandExecResponse {
            process_id,
            running: true,
            exit_code: None,
            stdout: None,
            stderr: None,
        }))
    }

    /// `fs/open`: `read` opens a regular file; `replace` creates or
    /// truncates at once. Handles live as long as the session (bounded).
    async fn open_handle(&self, p: OpenParams, revision: Revision) -> Result<Reply, GatewayError> {
        crate::rpc::check_id_length("handleId", &p.handle_id)?;
        let exists = || {
            GatewayError::InvalidRequest(format!("file handle `{}` already exists", p.handle_id))
        };
        {
            let handles = self.handles.lock();
            if handles.contains_key(&p.handle_id) {
                return Err(exists());
            }
            if handles.len() >= MAX_FILE_HANDLES {
                return Err(GatewayError::InvalidRequest(format!(
                    "too many open file handles (limit {MAX_FILE_HANDLES}); close some first"
                )));
            }
        }
        let slot = self
            .shared
            .open_files
            .clone()
            .try_acquire_owned()
            .map_err(|_| {
                GatewayError::InvalidRequest(
                    "too many open file handles for this tenant (max_open_files); close some first"
                        .to_owned(),
                )
            })?;
        let path = PathParams {
            path: p.path.clone(),
            follow_symlinks: None,
        };
        let op = match p.mode {
            OpenMode::Read => FsOp::OpenRead(path),
            OpenMode::Replace => FsOp::OpenWrite(path),
        };
        let file = self
            .shared
            .fs_file(op)
            .await
            .map_err(|e| e.into_gateway_error(revision))?;
        let mut handles = self.handles.lock();
        if handles.contains_key(&p.handle_id) {
            return Err(exists());
        }
        handles.insert(
            p.handle_id.clone(),
            Handle {
                file: Arc::new(file),
                _slot: slot,
            },
        );
        Ok(Reply::FsOpen(HandleParams {
            handle_id: p.handle_id,
        }))
    }

    fn handle(&self, id: &str) -> Result<Arc<std::fs::File>, GatewayError> {
        self.handles
            .lock()
            .get(id)
            .map(|h| h.file.clone())
            .ok_or_else(|| GatewayError::NotFound(format!("unknown file handle `{id}`")))
    }

    async fn read_block(&self, p: ReadBlockParams) -> Result<Reply, GatewayError> {
        if p.len == 0 || p.len > MAX_READ_BLOCK_BYTES {
            return Err(GatewayError::InvalidRequest(format!(
                "file read block length must be between 1 and {MAX_READ_BLOCK_BYTES}"
            )));
        }
        let file = self.handle(&p.handle_id)?;
        let (data, eof) = blocking(move || {
            use std::os::unix::fs::FileExt as _;
            let io = |e: std::io::Error| FsError::from_io(&e);
            let mut buf = vec![0u8; usize::try_from(p.len).unwrap_or(0)];
            let n = file.read_at(&mut buf, p.offset).map_err(io)?;
            buf.truncate(n);
            let size = file.metadata().map_err(io)?.len();
            Ok((buf, p.offset.saturating_add(n as u64) >= size))
        })
        .await?;
        Ok(Reply::FsReadBlock(ReadBlockResponse {
            chunk: ByteChunk(data),
            eof,
        }))
    }

    async fn write_block(&self, p: WriteBlockParams) -> Result<Reply, GatewayError> {
        if p.chunk.0.is_empty() || p.chunk.0.len() as u64 > MAX_READ_BLOCK_BYTES {
            return Err(GatewayError::InvalidRequest(format!(
                "file write block length must be between 1 and {MAX_READ_BLOCK_BYTES}"
            )));
        }
        let file = self.handle(&p.handle_id)?;
        blocking(move || {
            use std::os::unix::fs::FileExt as _;
            file.write_all_at(&p.chunk.0, p.offset)
                .map_err(|e| FsError::from_io(&e))
        })
        .await?;
        Ok(empty())
    }

    /// `fs/watchMissing`: one watch per session; a higher id replaces the
    /// current one, a lower or equal one is ignored. It fires
    /// `fs/missingChanged` once, when a missing path appears or the
    /// present one disappears.
    async fn watch_missing(&self, p: WatchMissingParams) -> Result<Reply, GatewayError> {
        let not_watching = Reply::FsWatchMissing(WatchMissingResponse { watching: false });
        if p.missing.len() + usize::from(p.present.is_some()) > MAX_WATCHED_PATHS {
            return Err(GatewayError::InvalidParams(format!(
                "too many paths to watch (limit {MAX_WATCHED_PATHS})"
            )));
        }
        if self
            .watch
            .lock()
            .as_ref()
            .is_some_and(|w| p.watch_id <= w.id)
        {
            return Ok(not_watching);
        }
        let mut paths = p.missing.clone();
        paths.extend(p.present.iter().cloned());
        let before = exist(&self.shared.root, paths.clone()).await?;
        let present_gone = p.present.is_some() && before.last() != Some(&true);
        let nothing_missing = before[..p.missing.len()].iter().all(|e| *e);
        let stop = CancellationToken::new();
        {
            let mut current = self.watch.lock();
            if current.as_ref().is_some_and(|w| p.watch_id <= w.id) {
                return Ok(not_watching);
            }
            // The new id replaces the old watch even when it does not watch.
            *current = Some(Watch {
                id: p.watch_id,
                stop: stop.clone(),
            });
        }
        if present_gone || nothing_missing {
            return Ok(not_watching);
        }
        let (root, attachment, id) = (
            self.shared.root.clone(),
            self.attachment.clone(),
            p.watch_id,
        );
        crate::task::spawn("fs-watch", async move {
            let mut every = WATCH_POLL_MIN;
            loop {
                tokio::select! {
                    () = stop.cancelled() => return,
                    () = tokio::time::sleep(every) => {}
                }
                let Ok(now) = exist(&root, paths.clone()).await else {
                    return;
                };
                if now != before {
                    attachment.notify(notify::fs_missing_changed(id)).await;
                    return;
                }
                every = (every * 2).min(WATCH_POLL_MAX);
            }
        });
        Ok(Reply::FsWatchMissing(WatchMissingResponse {
            watching: true,
        }))
    }

    /// `environmentConfig/read`: no configuration layers are kept on a
    /// gateway; the homes are the tenant's.
    fn config_read(&self, p: &ConfigReadParams) -> Result<Reply, GatewayError> {
        if p.config_paths.is_empty() && p.requirements_paths.is_empty() {
            return Err(GatewayError::InvalidParams(
                "at least one config or requirements path is required".to_owned(),
            ));
        }
        self.shared.check_cwd(&p.cwd)?;
        let env = &self.shared.env;
        let none = || ConfigLayers {
            layers: Vec::new(),
            cloud_insertion_index: 0,
        };
        Ok(Reply::EnvironmentConfigRead(ConfigReadResponse {
            user_home_dir: to_wire(&env.home, Revision::Nov2026),
            codex_home_dir: to_wire(
                &Path::new(&env.home).join(".codex").display().to_string(),
                Revision::Nov2026,
            ),
            hostname: nix::unistd::gethostname()
                .map(|h| h.to_string_lossy().into_owned())
                .unwrap_or_default(),
            config: none(),
            requirements: none(),
        }))
    }

    async fn open(&self, open: Open) -> Result<Outcome, GatewayError> {
        Ok(Outcome::Opened(match open {
            Open::Events(p) => Opened::Events(self.table.events(&p.process_id)?),
            Open::Exec(p) => {
                self.shared.check_cwd(&p.cwd)?;
                let process = self.table.start(
                    *p,
                    StartOptions {
                        hold_output: true,
                        ..PROCESS
                    },
                )?;
                Opened::Events(process)
            }
            file @ (Open::ReadFile(_) | Open::WriteFile(_)) => {
                return self
                    .shared
                    .open_file(file, self.revision.or_default())
                    .await;
            }
        }))
    }
}

/// Which of `paths` exist, checked by the gateway (confined to the root;
/// existence is all that is learned).
async fn exist(root: &Arc<FsRoot>, paths: Vec<WirePath>) -> Result<Vec<bool>, GatewayError> {
    let root = root.clone();
    match blocking(move || crate::fs::run(&root, FsOp::Exist(paths))).await? {
        FsDone::Exist(v) => Ok(v),
        other => Err(unexpected(&other).into()),
    }
}

impl SessionBackend for LocalSession {
    fn run(self: Arc<Self>, op: Op, scope: RunScope) -> OpFuture {
        Box::pin(async move {
            match op {
                Op::Call(Call::FsReadFile(p)) => {
                    let revision = self.revision.or_default();
                    self.shared.read_file(p, revision, scope.reply).await
                }
                // Over a JSON-RPC connection the reply's bytes are reserved
                // before it is built, and it leaves encoded.
                Op::Call(Call::ProcessRead(p)) if scope.reply.is_some() => {
                    let (response, held) = self
                        .table
                        .read(p, &scope.evicted, scope.reply.as_ref())
                        .await?;
                    let reply = Reply::ProcessRead(response);
                    match held {
                        Some(held) => Ok(Outcome::Encoded(EncodedReply {
                            result: serde_json::to_string(&reply).map_err(|e| {
                                GatewayError::Internal(format!("encoding a reply: {e}"))
                            })?,
                            gap: 0,
                            held,
                        })),
                        None => Ok(Outcome::Reply(reply)),
                    }
                }
                Op::Call(call) => self.call(call, scope.evicted).await.map(Outcome::Reply),
                Op::Open(open) => self.open(open).await,
            }
        })
    }

    fn kill_all(&self) {
        self.table.kill_all();
        self.watch.lock().take();
        self.handles.lock().clear();
    }

    fn live_processes(&self) -> usize {
        self.table.live_count()
    }

    fn environment(&self) -> EnvironmentInfo {
        self.shared.environment(Revision::Nov2026)
    }
}
