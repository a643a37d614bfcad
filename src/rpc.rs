//! The typed request every door decodes into, and the typed reply.
//!
//! Decoding is two-step so codes are exact: the method name picks the
//! variant (unknown → -32601), then params decode into that variant's type
//! (failure → -32602 with serde's text).

use std::sync::Arc;

use serde::Serialize;
use serde_json::value::RawValue;
use tokio_util::sync::CancellationToken;

use crate::auth::{Principal, Scopes};
use crate::error::GatewayError;
use crate::protocol::Empty;
use crate::protocol::fs::{
    CopyParams, CreateDirectoryParams, MetadataResponse, PathParams, ReadDirectoryResponse,
    ReadFileResponse, RemoveParams, WriteFileParams,
};
use crate::protocol::jsonrpc::decode_params;
use crate::protocol::methods as m;
use crate::protocol::process::{
    ExecParams, ExecResponse, InitializeParams, InitializeResponse, ListResponse, ProcessIdParams,
    ReadParams, ReadResponse, ResizeParams, SignalParams, TerminateResponse, WriteParams,
    WriteResponse,
};
use crate::protocol::v0::{
    CommandExecParams, CommandExecResponse, CommandExecWriteParams, CommandExecWriteResponse,
};
use crate::session::Session;
use crate::tenant::Tenant;

/// Which family a method belongs to; names the pre-init errors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MethodFamily {
    Initialize,
    Exec,
    Filesystem,
    Http,
}

impl MethodFamily {
    /// The word used in "client must call initialize before using X methods".
    pub fn label(self) -> &'static str {
        match self {
            MethodFamily::Initialize => "initialize",
            MethodFamily::Exec => "exec",
            MethodFamily::Filesystem => "filesystem",
            MethodFamily::Http => "http",
        }
    }

    /// The family of a method name, or None if the method is unknown.
    pub fn of(method: &str) -> Option<MethodFamily> {
        Some(match method {
            m::INITIALIZE => MethodFamily::Initialize,
            m::PROCESS_START
            | m::PROCESS_READ
            | m::PROCESS_WRITE
            | m::PROCESS_TERMINATE
            | m::PROCESS_SIGNAL
            | m::PROCESS_RESIZE
            | m::PROCESS_CLOSE_STDIN
            | m::PROCESS_LIST
            | m::COMMAND_EXEC
            | m::COMMAND_EXEC_WRITE
            | m::COMMAND_EXEC_TERMINATE => MethodFamily::Exec,
            m::FS_READ_FILE
            | m::FS_WRITE_FILE
            | m::FS_CREATE_DIRECTORY
            | m::FS_GET_METADATA
            | m::FS_READ_DIRECTORY
            | m::FS_REMOVE
            | m::FS_COPY => MethodFamily::Filesystem,
            m::HTTP_REQUEST => MethodFamily::Http,
            _ => return None,
        })
    }
}

/// A decoded call.
#[derive(Debug, Clone)]
pub enum Call {
    Initialize(InitializeParams),
    ProcessStart(ExecParams),
    ProcessRead(ReadParams),
    ProcessWrite(WriteParams),
    ProcessTerminate(ProcessIdParams),
    ProcessSignal(SignalParams),
    ProcessResize(ResizeParams),
    ProcessCloseStdin(ProcessIdParams),
    ProcessList,
    FsReadFile(PathParams),
    FsWriteFile(WriteFileParams),
    FsCreateDirectory(CreateDirectoryParams),
    FsGetMetadata(PathParams),
    FsReadDirectory(PathParams),
    FsRemove(RemoveParams),
    FsCopy(CopyParams),
    HttpRequest,
    CommandExec(CommandExecParams),
    CommandExecWrite(CommandExecWriteParams),
    CommandExecTerminate(ProcessIdParams),
    /// gRPC only: a handle to stream a process's events (Attach, Exec).
    ProcessAttach(ProcessIdParams),
    /// gRPC only: open a file to stream it out (ReadFile).
    FsOpenRead(PathParams),
    /// gRPC only: create/truncate a file to stream into it (WriteFile).
    FsOpenWrite(PathParams),
}

fn p<T: serde::de::DeserializeOwned>(params: Option<&RawValue>) -> Result<T, GatewayError> {
    decode_params(params).map_err(GatewayError::InvalidParams)
}

impl Call {
    /// Decode params for a known method.
    pub fn decode(method: &str, params: Option<&RawValue>) -> Result<Call, GatewayError> {
        Ok(match method {
            m::INITIALIZE => Call::Initialize(p(params)?),
            m::PROCESS_START => Call::ProcessStart(p(params)?),
            m::PROCESS_READ => Call::ProcessRead(p(params)?),
            m::PROCESS_WRITE => Call::ProcessWrite(p(params)?),
            m::PROCESS_TERMINATE => Call::ProcessTerminate(p(params)?),
            m::PROCESS_SIGNAL => Call::ProcessSignal(p(params)?),
            m::PROCESS_RESIZE => Call::ProcessResize(p(params)?),
            m::PROCESS_CLOSE_STDIN => Call::ProcessCloseStdin(p(params)?),
            m::PROCESS_LIST => {
                // Takes no params; anything given is ignored.
                Call::ProcessList
            }
            m::FS_READ_FILE => Call::FsReadFile(p(params)?),
            m::FS_WRITE_FILE => Call::FsWriteFile(p(params)?),
            m::FS_CREATE_DIRECTORY => Call::FsCreateDirectory(p(params)?),
            m::FS_GET_METADATA => Call::FsGetMetadata(p(params)?),
            m::FS_READ_DIRECTORY => Call::FsReadDirectory(p(params)?),
            m::FS_REMOVE => Call::FsRemove(p(params)?),
            m::FS_COPY => Call::FsCopy(p(params)?),
            m::HTTP_REQUEST => Call::HttpRequest,
            m::COMMAND_EXEC => Call::CommandExec(p(params)?),
            m::COMMAND_EXEC_WRITE => Call::CommandExecWrite(p(params)?),
            m::COMMAND_EXEC_TERMINATE => Call::CommandExecTerminate(p(params)?),
            other => return Err(GatewayError::MethodNotFound(other.to_owned())),
        })
    }

    /// The wire method name.
    pub fn method(&self) -> &'static str {
        match self {
            Call::Initialize(_) => m::INITIALIZE,
            Call::ProcessStart(_) => m::PROCESS_START,
            Call::ProcessRead(_) => m::PROCESS_READ,
            Call::ProcessWrite(_) => m::PROCESS_WRITE,
            Call::ProcessTerminate(_) => m::PROCESS_TERMINATE,
            Call::ProcessSignal(_) => m::PROCESS_SIGNAL,
            Call::ProcessResize(_) => m::PROCESS_RESIZE,
            Call::ProcessCloseStdin(_) => m::PROCESS_CLOSE_STDIN,
            Call::ProcessList => m::PROCESS_LIST,
            Call::FsReadFile(_) => m::FS_READ_FILE,
            Call::FsWriteFile(_) => m::FS_WRITE_FILE,
            Call::FsCreateDirectory(_) => m::FS_CREATE_DIRECTORY,
            Call::FsGetMetadata(_) => m::FS_GET_METADATA,
            Call::FsReadDirectory(_) => m::FS_READ_DIRECTORY,
            Call::FsRemove(_) => m::FS_REMOVE,
            Call::FsCopy(_) => m::FS_COPY,
            Call::HttpRequest => m::HTTP_REQUEST,
            Call::CommandExec(_) => m::COMMAND_EXEC,
            Call::CommandExecWrite(_) => m::COMMAND_EXEC_WRITE,
            Call::CommandExecTerminate(_) => m::COMMAND_EXEC_TERMINATE,
            Call::ProcessAttach(_) => "process/attach",
            Call::FsOpenRead(_) => "fs/readFile(stream)",
            Call::FsOpenWrite(_) => "fs/writeFile(stream)",
        }
    }
}

/// The scope a call needs (PROTOCOL.md §G.4).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    Exec,
    FsRead,
    FsWrite,
}

impl Scope {
    pub fn name(self) -> &'static str {
        match self {
            Scope::Exec => "exec",
            Scope::FsRead => "fs:read",
            Scope::FsWrite => "fs:write",
        }
    }

    pub fn granted(self, scopes: &Scopes) -> bool {
        match self {
            Scope::Exec => scopes.exec,
            Scope::FsRead => scopes.fs_read,
            Scope::FsWrite => scopes.fs_write,
        }
    }
}

impl Call {
    /// The scope this call requires; `None` for session management.
    pub fn required_scope(&self) -> Option<Scope> {
        match self {
            Call::Initialize(_) => None,
            Call::ProcessStart(_)
            | Call::ProcessRead(_)
            | Call::ProcessWrite(_)
            | Call::ProcessTerminate(_)
            | Call::ProcessSignal(_)
            | Call::ProcessResize(_)
            | Call::ProcessCloseStdin(_)
            | Call::ProcessList
            | Call::CommandExec(_)
            | Call::CommandExecWrite(_)
            | Call::CommandExecTerminate(_)
            | Call::ProcessAttach(_)
            // Executor-side HTTP runs on the executor like a process would.
            | Call::HttpRequest => Some(Scope::Exec),
            Call::FsReadFile(_)
            | Call::FsGetMetadata(_)
            | Call::FsReadDirectory(_)
            | Call::FsOpenRead(_) => Some(Scope::FsRead),
            Call::FsWriteFile(_)
            | Call::FsCreateDirectory(_)
            | Call::FsRemove(_)
            | Call::FsCopy(_)
            | Call::FsOpenWrite(_) => Some(Scope::FsWrite),
        }
    }
}

/// Everything a handler needs besides the call.
#[derive(Clone)]
pub struct RequestContext {
    /// Who is calling (from the JWT).
    pub principal: Arc<Principal>,
    /// The principal's tenant.
    pub tenant: Arc<Tenant>,
    /// The session the call runs in; process calls need one, file calls do
    /// not (gRPC file calls carry none). It belongs to `tenant`.
    pub session: Option<Arc<Session>>,
    /// Cancelled when another connection takes the session over.
    pub evicted: CancellationToken,
}

/// A call plus its context: what flows through the tower stack.
#[derive(Clone)]
pub struct RpcRequest {
    pub call: Call,
    pub ctx: RequestContext,
}

/// A typed result; serialises to exactly the wire `result`.
#[derive(Debug, Clone, Serialize)]
#[serde(untagged)]
pub enum Reply {
    Initialize(InitializeResponse),
    ProcessStart(ExecResponse),
    ProcessRead(ReadResponse),
    ProcessWrite(WriteResponse),
    ProcessTerminate(TerminateResponse),
    ProcessList(ListResponse),
    FsReadFile(ReadFileResponse),
    FsGetMetadata(MetadataResponse),
    FsReadDirectory(ReadDirectoryResponse),
    CommandExec(CommandExecResponse),
    CommandExecWrite(CommandExecWriteResponse),
    Empty(Empty),
    /// gRPC only (never serialised).
    #[serde(skip_serializing)]
    Process(crate::exec::ProcessHandle),
    /// gRPC only (never serialised).
    #[serde(skip_serializing)]
    File(crate::fs::FileHandle),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_method_and_bad_params_have_distinct_codes() {
        let e = Call::decode("nope/nope", None).unwrap_err();
        assert_eq!(e.to_jsonrpc().code, -32601);
        assert_eq!(
            e.to_string(),
            "exec-server stub does not implement `nope/nope` yet"
        );
        let raw: Box<RawValue> = serde_json::from_str(r#"{"processId":"p"}"#).unwrap();
        let e = Call::decode(m::PROCESS_START, Some(&raw)).unwrap_err();
        assert_eq!(e.to_jsonrpc().code, -32602);
        assert_eq!(e.to_string(), "missing field `argv`");
    }

    #[test]
    fn every_known_method_has_a_family() {
        for name in [
            m::PROCESS_START,
            m::FS_COPY,
            m::HTTP_REQUEST,
            m::COMMAND_EXEC,
        ] {
            assert!(MethodFamily::of(name).is_some(), "{name}");
        }
        assert_eq!(MethodFamily::of("x"), None);
    }
}
