//! The innermost service: runs a [`Call`] against the session's process table
//! and filesystem root. This is the boundary a worker process will satisfy
//! later: it sees only `RpcRequest`s and returns `Reply`s.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use crate::error::GatewayError;
use crate::exec::Family;
use crate::fs;
use crate::protocol::Empty;
use crate::protocol::process::ExecParams;
use crate::protocol::v0::{CommandExecResponse, CommandExecWriteResponse};
use crate::rpc::{Call, Reply, RpcRequest};

/// Runs calls; stateless itself (state lives in the session).
#[derive(Debug, Clone, Copy, Default)]
pub struct Dispatch;

impl tower::Service<RpcRequest> for Dispatch {
    type Response = Reply;
    type Error = GatewayError;
    type Future = Pin<Box<dyn Future<Output = Result<Reply, GatewayError>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: RpcRequest) -> Self::Future {
        Box::pin(handle(req))
    }
}

async fn handle(req: RpcRequest) -> Result<Reply, GatewayError> {
    let RpcRequest { call, ctx } = req;
    let root = &ctx.tenant.fs;
    // Process calls need the session's table; file calls only the tenant.
    let session = || {
        ctx.session
            .as_ref()
            .ok_or_else(|| GatewayError::InvalidRequest("this call needs a session".to_owned()))
    };
    let empty = || Reply::Empty(Empty {});
    // With workers, file operations run there, under the tenant's uid,
    // Landlock domain and seccomp filter.
    if let Some(pool) = &ctx.tenant.exec.workers
        && let Some(reply) = crate::exec::worker::fs_call(pool, &call).await?
    {
        return Ok(reply);
    }
    Ok(match call {
        Call::Initialize(_) => {
            // Handled by the connection, which owns the once-per-connection state.
            return Err(GatewayError::InvalidRequest(
                "initialize may only be sent once per connection".to_owned(),
            ));
        }
        Call::ProcessStart(p) => {
            root.check_cwd(&p.cwd)?;
            Reply::ProcessStart(session()?.processes.start(p, Family::Process, None)?)
        }
        Call::ProcessRead(p) => {
            Reply::ProcessRead(session()?.processes.read(p, &ctx.evicted).await?)
        }
        Call::ProcessWrite(p) => Reply::ProcessWrite(session()?.processes.write(p).await?),
        Call::ProcessTerminate(p) => {
            Reply::ProcessTerminate(session()?.processes.terminate(&p.process_id))
        }
        Call::ProcessSignal(p) => {
            session()?.processes.signal(&p)?;
            empty()
        }
        Call::ProcessResize(p) => {
            session()?.processes.resize(&p)?;
            empty()
        }
        Call::ProcessCloseStdin(p) => {
            session()?.processes.close_stdin(&p.process_id).await?;
            empty()
        }
        Call::ProcessList => Reply::ProcessList(session()?.processes.list()),
        Call::FsReadFile(p) => Reply::FsReadFile(fs::read_file(root, p).await?),
        Call::FsWriteFile(p) => {
            fs::write_file(root, p).await?;
            empty()
        }
        Call::FsCreateDirectory(p) => {
            fs::create_directory(root, p).await?;
            empty()
        }
        Call::FsGetMetadata(p) => Reply::FsGetMetadata(fs::get_metadata(root, p).await?),
        Call::FsReadDirectory(p) => Reply::FsReadDirectory(fs::read_directory(root, p).await?),
        Call::FsRemove(p) => {
            fs::remove(root, p).await?;
            empty()
        }
        Call::FsCopy(p) => {
            fs::copy(root, p).await?;
            empty()
        }
        Call::HttpRequest => {
            return Err(GatewayError::Forbidden(
                "http/request is disabled on this gateway".to_owned(),
            ));
        }
        Call::CommandExec(p) => {
            root.check_cwd(&p.cwd)?;
            let process_id = p.process_id.clone();
            let exec = ExecParams {
                process_id: p.process_id,
                argv: p.argv,
                cwd: p.cwd,
                env: p.env,
                tty: p.tty,
                // v0: pipe-backed processes are launched with stdin closed.
                pipe_stdin: false,
                arg0: p.arg0,
                env_policy: None,
                hold_output: false,
            };
            session()?
                .processes
                .start(exec, Family::V0, p.output_bytes_cap)?;
            Reply::CommandExec(CommandExecResponse {
                process_id,
                running: true,
                exit_code: None,
                stdout: None,
                stderr: None,
            })
        }
        Call::CommandExecWrite(p) => {
            session()?
                .processes
                .write_v0(&p.process_id, p.chunk.0)
                .await?;
            Reply::CommandExecWrite(CommandExecWriteResponse { accepted: true })
        }
        Call::ProcessAttach(p) => Reply::Process(session()?.processes.handle(&p.process_id)?),
        Call::FsOpenRead(p) => Reply::File(fs::open_read(root, p).await?),
        Call::FsOpenWrite(p) => Reply::File(fs::open_write(root, p).await?),
        Call::CommandExecTerminate(p) => {
            Reply::ProcessTerminate(session()?.processes.terminate(&p.process_id))
        }
    })
}
