//! The local backend: a tenant's processes run in its worker pool (or, with
//! workers off, are spawned by the gateway under the tenant's sandbox), and
//! its file operations run in a worker (or on the gateway's blocking pool).

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use super::{Backend, OpFuture, SessionBackend};
use crate::error::GatewayError;
use crate::exec::{Api, ExecSettings, ProcessTable, StartOptions};
use crate::fs::{FsDone, FsError, FsOp, FsRoot};
use crate::isolation::sandbox::Sandbox;
use crate::outbound::Attachment;
use crate::protocol::Empty;
use crate::protocol::fs::{PathParams, ReadFileResponse, WriteFileParams};
use crate::protocol::process::{ExecParams, ExecResponse};
use crate::protocol::v0::{CommandExecParams, CommandExecResponse, CommandExecWriteResponse};
use crate::protocol::{ByteChunk, base64_decode};
use crate::rpc::{Call, Op, Open, Opened, Outcome, Reply};
use crate::spawn::{LocalSpawner, Spawner};
use crate::worker::WorkerPool;

/// Where a tenant's processes and file operations run.
pub enum Runner {
    /// In the tenant's workers (each confined as a whole).
    Workers(Arc<WorkerPool>),
    /// In the gateway: each child confines itself with `sandbox`; file
    /// operations run on the blocking pool (as the tenant's uid, if any).
    Here(Option<Arc<Sandbox>>),
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
}

impl LocalBackend {
    pub fn new(root: Arc<FsRoot>, exec: Arc<ExecSettings>, runner: Runner) -> LocalBackend {
        LocalBackend {
            shared: Arc::new(Shared { root, exec, runner }),
        }
    }
}

impl Backend for LocalBackend {
    fn open_session(
        &self,
        attachment: Arc<Attachment>,
    ) -> Result<Arc<dyn SessionBackend>, GatewayError> {
        let spawner: Box<dyn Spawner> = match &self.shared.runner {
            Runner::Workers(pool) => Box::new(pool.session()),
            Runner::Here(sandbox) => Box::new(LocalSpawner {
                sandbox: sandbox.clone(),
            }),
        };
        Ok(Arc::new(LocalSession {
            table: ProcessTable::new(attachment, self.shared.exec.clone(), spawner),
            shared: self.shared.clone(),
        }))
    }

    fn run_sessionless(&self, op: Op) -> OpFuture {
        let shared = self.shared.clone();
        Box::pin(async move {
            match op {
                Op::Call(call) if is_file_call(&call) => {
                    shared.file_call(call).await.map(Outcome::Reply)
                }
                Op::Open(open @ (Open::ReadFile(_) | Open::WriteFile(_))) => {
                    shared.open_file(open).await
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
    )
}

fn empty() -> Reply {
    Reply::Empty(Empty {})
}

impl Shared {
    /// Run a file operation where the tenant's file operations run.
    async fn fs(&self, op: FsOp) -> Result<FsDone, GatewayError> {
        let done = match &self.runner {
            Runner::Workers(pool) => pool.fs(op).await,
            Runner::Here(_) => {
                let root = self.root.clone();
                blocking(move || crate::fs::run(&root, op)).await
            }
        };
        Ok(done?)
    }

    async fn fs_file(&self, op: FsOp) -> Result<std::fs::File, GatewayError> {
        match self.fs(op).await? {
            FsDone::File(f) => Ok(f),
            other => Err(unexpected(&other)),
        }
    }

    async fn file_call(&self, call: Call) -> Result<Reply, GatewayError> {
        let done = |op| async { self.fs(op).await };
        Ok(match call {
            Call::FsReadFile(p) => {
                let file = self.fs_file(FsOp::OpenRead(p)).await?;
                let data = blocking(move || crate::fs::read_whole(file)).await?;
                // Encoded later, straight into the response frame.
                Reply::FsReadFile(ReadFileResponse {
                    data_base64: ByteChunk(data),
                })
            }
            Call::FsWriteFile(p) => {
                let data = write_data(&p)?;
                let file = self
                    .fs_file(FsOp::OpenWrite(PathParams { path: p.path }))
                    .await?;
                blocking(move || crate::fs::write_whole(&file, &data)).await?;
                empty()
            }
            Call::FsCreateDirectory(p) => {
                done(FsOp::CreateDirectory(p)).await?;
                empty()
            }
            Call::FsGetMetadata(p) => match done(FsOp::GetMetadata(p)).await? {
                FsDone::Metadata(m) => Reply::FsGetMetadata(m),
                other => return Err(unexpected(&other)),
            },
            Call::FsReadDirectory(p) => match done(FsOp::ReadDirectory(p)).await? {
                FsDone::Directory(d) => Reply::FsReadDirectory(d),
                other => return Err(unexpected(&other)),
            },
            Call::FsRemove(p) => {
                done(FsOp::Remove(p)).await?;
                empty()
            }
            Call::FsCopy(p) => {
                done(FsOp::Copy(p)).await?;
                empty()
            }
            other => {
                return Err(GatewayError::Internal(format!(
                    "{} is not a file call",
                    other.method()
                )));
            }
        })
    }

    async fn open_file(&self, open: Open) -> Result<Outcome, GatewayError> {
        let op = match open {
            Open::ReadFile(p) => FsOp::OpenRead(p),
            Open::WriteFile(p) => FsOp::OpenWrite(p),
            _ => {
                return Err(GatewayError::Internal("not a file stream".to_owned()));
            }
        };
        Ok(Outcome::Opened(Opened::File(self.fs_file(op).await?)))
    }

    fn check_cwd(&self, cwd: &str) -> Result<(), GatewayError> {
        Ok(self.root.check_cwd(cwd)?)
    }
}

fn unexpected(done: &FsDone) -> GatewayError {
    GatewayError::Internal(format!("unexpected file operation result: {done:?}"))
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

/// One session on the local backend: its process table.
struct LocalSession {
    table: Arc<ProcessTable>,
    shared: Arc<Shared>,
}

const PROCESS: StartOptions = StartOptions {
    api: Api::Process,
    retained_cap: None,
    hold_output: false,
};

impl LocalSession {
    async fn call(&self, call: Call, evicted: CancellationToken) -> Result<Reply, GatewayError> {
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
                table.start(p, PROCESS)?;
                Reply::ProcessStart(ExecResponse { process_id })
            }
            Call::ProcessRead(p) => Reply::ProcessRead(table.read(p, &evicted).await?),
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
            | Call::FsCopy(_)) => self.shared.file_call(file).await?,
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
                return self.shared.open_file(file).await;
            }
        }))
    }
}

impl SessionBackend for LocalSession {
    fn run(self: Arc<Self>, op: Op, evicted: CancellationToken) -> OpFuture {
        Box::pin(async move {
            match op {
                Op::Call(call) => self.call(call, evicted).await.map(Outcome::Reply),
                Op::Open(open) => self.open(open).await,
            }
        })
    }

    fn kill_all(&self) {
        self.table.kill_all();
    }

    fn live_processes(&self) -> usize {
        self.table.live_count()
    }
}
