//! The typed operations every door decodes into, and their results.
//!
//! The JSON-RPC methods are declared once, in [`method_table!`]: name,
//! family (for the pre-`initialize` errors), params type and required
//! scope. Decoding, the method name, the family and the scope are derived
//! from that one list, and dispatch matches on [`Call`] exhaustively, so a
//! method cannot be added without a handler or a scope.
//!
//! Decoding is two-step so codes are exact: the method name picks the
//! variant (unknown → -32601), then params decode into that variant's type
//! (failure → -32602 with serde's text).
//!
//! gRPC-only operations that open a stream ([`Open`]) are separate types:
//! nothing of them leaks into the JSON-RPC surface.

use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use tokio::sync::mpsc;

use crate::auth::Scope;
use crate::error::GatewayError;
use crate::protocol::Empty;
use crate::protocol::egress::{Policy as EgressPolicy, SetParams as EgressSetParams};
use crate::protocol::environment::{
    ConfigReadParams, ConfigReadResponse, DiscoverParams, DiscoverResponse, EnvironmentInfo,
    RootsParams, RootsResponse, StatusResponse,
};
use crate::protocol::fs::{
    CanonicalizeResponse, CopyParams, CreateDirectoryParams, HandleParams, MetadataResponse,
    OpenMode, OpenParams, PathParams, ReadBlockParams, ReadBlockResponse, ReadDirectoryResponse,
    ReadFileResponse, RemoveParams, WalkParams, WalkResponse, WatchMissingParams,
    WatchMissingResponse, WriteBlockParams, WriteFileParams,
};
use crate::protocol::http::{HttpRequestParams, Response as HttpResponse};
use crate::protocol::jsonrpc::decode_params;
use crate::protocol::methods as m;
use crate::protocol::path::{PathField, WirePath};
use crate::protocol::preview::{
    CreateParams as PreviewCreateParams, ListResponse as PreviewListResponse,
    PortParams as PreviewPortParams, Preview,
};
use crate::protocol::process::{
    ExecParams, ExecResponse, InitializeParams, InitializeResponse, ListResponse, MAX_READ_WAIT,
    ProcessEvent, ProcessIdParams, ReadParams, ReadResponse, ResizeParams, SignalParams,
    TerminateResponse, WriteParams, WriteResponse,
};
use crate::protocol::revision::Revision;
use crate::protocol::snapshot::{
    CreateParams as SnapshotCreateParams, IdParams as SnapshotIdParams,
    ListResponse as SnapshotListResponse, Snapshot,
};
use crate::protocol::v0::{
    CommandExecParams, CommandExecResponse, CommandExecWriteParams, CommandExecWriteResponse,
};

/// Longest client-chosen id (`processId`, `handleId`, `writeId`) accepted:
/// every id is held for the life of what it names.
pub const MAX_ID_BYTES: usize = 256;

/// Refuse a client-chosen id longer than [`MAX_ID_BYTES`] (-32602).
pub fn check_id_length(field: &str, id: &str) -> Result<(), GatewayError> {
    if id.len() > MAX_ID_BYTES {
        return Err(GatewayError::InvalidParams(format!(
            "{field} is {} bytes; at most {MAX_ID_BYTES} are accepted",
            id.len()
        )));
    }
    Ok(())
}

/// Which family a method belongs to; names the pre-init errors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MethodFamily {
    Initialize,
    Exec,
    Filesystem,
    Http,
    EnvironmentInfo,
    EnvironmentStatus,
    EnvironmentConfig,
    CapabilityDiscovery,
    Snapshot,
    Preview,
    Egress,
}

impl MethodFamily {
    /// The word used in "client must call initialize before using X methods".
    pub fn label(self) -> &'static str {
        match self {
            MethodFamily::Initialize => "initialize",
            MethodFamily::Exec => "exec",
            MethodFamily::Filesystem => "filesystem",
            MethodFamily::Http => "http",
            MethodFamily::EnvironmentInfo => "environment info",
            MethodFamily::EnvironmentStatus => "environment status",
            MethodFamily::EnvironmentConfig => "environment config",
            MethodFamily::CapabilityDiscovery => "capability discovery",
            MethodFamily::Snapshot => "snapshot",
            MethodFamily::Preview => "preview",
            MethodFamily::Egress => "egress",
        }
    }
}

/// Params of a method that takes none: anything given is ignored.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NoParams;

impl Serialize for NoParams {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap as _;
        s.serialize_map(Some(0))?.end()
    }
}

impl<'de> Deserialize<'de> for NoParams {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        serde::de::IgnoredAny::deserialize(d).map(|_| NoParams)
    }
}

/// Declares the JSON-RPC methods: `Variant(Params) = NAME, Family, scope;`.
macro_rules! method_table {
    ($( $variant:ident($params:ty) = $name:path, $family:ident, $scope:expr; )*) => {
        /// A decoded JSON-RPC call.
        #[derive(Debug, Clone)]
        pub enum Call {
            $( $variant($params), )*
        }

        impl Call {
            /// Decode params for a known method.
            pub fn decode(method: &str, params: Option<&RawValue>) -> Result<Call, GatewayError> {
                match method {
                    $( $name => Ok(Call::$variant(
                        decode_params(params).map_err(GatewayError::InvalidParams)?,
                    )), )*
                    other => Err(GatewayError::MethodNotFound(other.to_owned())),
                }
            }

            /// The params as JSON, to pass the call on to a remote executor.
            pub fn params_json(&self) -> Result<String, GatewayError> {
                match self {
                    $( Call::$variant(p) => serde_json::to_string(p), )*
                }
                .map_err(|e| GatewayError::Internal(format!("encoding params: {e}")))
            }

            /// The wire method name.
            pub fn method(&self) -> &'static str {
                match self {
                    $( Call::$variant(_) => $name, )*
                }
            }

            /// The scope the table gives the method.
            fn table_scope(&self) -> Option<Scope> {
                match self {
                    $( Call::$variant(_) => $scope, )*
                }
            }
        }

        impl MethodFamily {
            /// The family of a method name, or `None` if the method is unknown.
            pub fn of(method: &str) -> Option<MethodFamily> {
                match method {
                    $( $name => Some(MethodFamily::$family), )*
                    _ => None,
                }
            }
        }
    };
}

method_table! {
    Initialize(InitializeParams) = m::INITIALIZE, Initialize, None;
    ProcessStart(ExecParams) = m::PROCESS_START, Exec, Some(Scope::Exec);
    ProcessRead(ReadParams) = m::PROCESS_READ, Exec, Some(Scope::Exec);
    ProcessWrite(WriteParams) = m::PROCESS_WRITE, Exec, Some(Scope::Exec);
    ProcessTerminate(ProcessIdParams) = m::PROCESS_TERMINATE, Exec, Some(Scope::Exec);
    ProcessSignal(SignalParams) = m::PROCESS_SIGNAL, Exec, Some(Scope::Exec);
    ProcessResize(ResizeParams) = m::PROCESS_RESIZE, Exec, Some(Scope::Exec);
    ProcessCloseStdin(ProcessIdParams) = m::PROCESS_CLOSE_STDIN, Exec, Some(Scope::Exec);
    ProcessList(NoParams) = m::PROCESS_LIST, Exec, Some(Scope::Exec);
    FsReadFile(PathParams) = m::FS_READ_FILE, Filesystem, Some(Scope::FsRead);
    FsWriteFile(WriteFileParams) = m::FS_WRITE_FILE, Filesystem, Some(Scope::FsWrite);
    FsCreateDirectory(CreateDirectoryParams) = m::FS_CREATE_DIRECTORY, Filesystem, Some(Scope::FsWrite);
    FsGetMetadata(PathParams) = m::FS_GET_METADATA, Filesystem, Some(Scope::FsRead);
    FsReadDirectory(PathParams) = m::FS_READ_DIRECTORY, Filesystem, Some(Scope::FsRead);
    FsRemove(RemoveParams) = m::FS_REMOVE, Filesystem, Some(Scope::FsWrite);
    FsCopy(CopyParams) = m::FS_COPY, Filesystem, Some(Scope::FsWrite);
    // Executor-side HTTP, performed inside the tenant's network.
    HttpRequest(HttpRequestParams) = m::HTTP_REQUEST, Http, Some(Scope::Exec);
    CommandExec(CommandExecParams) = m::COMMAND_EXEC, Exec, Some(Scope::Exec);
    CommandExecWrite(CommandExecWriteParams) = m::COMMAND_EXEC_WRITE, Exec, Some(Scope::Exec);
    CommandExecTerminate(ProcessIdParams) = m::COMMAND_EXEC_TERMINATE, Exec, Some(Scope::Exec);
    FsCanonicalize(PathParams) = m::FS_CANONICALIZE, Filesystem, Some(Scope::FsRead);
    FsWalk(WalkParams) = m::FS_WALK, Filesystem, Some(Scope::FsRead);
    // `replace` needs fs:write (see `Call::scope`).
    FsOpen(OpenParams) = m::FS_OPEN, Filesystem, Some(Scope::FsRead);
    FsReadBlock(ReadBlockParams) = m::FS_READ_BLOCK, Filesystem, Some(Scope::FsRead);
    FsWriteBlock(WriteBlockParams) = m::FS_WRITE_BLOCK, Filesystem, Some(Scope::FsWrite);
    FsClose(HandleParams) = m::FS_CLOSE, Filesystem, None;
    FsWatchMissing(WatchMissingParams) = m::FS_WATCH_MISSING, Filesystem, Some(Scope::FsRead);
    EnvironmentInfo(NoParams) = m::ENVIRONMENT_INFO, EnvironmentInfo, None;
    EnvironmentStatus(NoParams) = m::ENVIRONMENT_STATUS, EnvironmentStatus, None;
    EnvironmentConfigRead(ConfigReadParams) = m::ENVIRONMENT_CONFIG_READ, EnvironmentConfig, Some(Scope::FsRead);
    CapabilitiesDiscover(DiscoverParams) = m::CAPABILITIES_DISCOVER_V2, CapabilityDiscovery, Some(Scope::FsRead);
    CapabilityRootsDiscover(RootsParams) = m::CAPABILITY_ROOTS_DISCOVER_V1, CapabilityDiscovery, Some(Scope::FsRead);
    SnapshotCreate(SnapshotCreateParams) = m::SNAPSHOT_CREATE, Snapshot, Some(Scope::Snapshot);
    SnapshotList(NoParams) = m::SNAPSHOT_LIST, Snapshot, Some(Scope::Snapshot);
    SnapshotGet(SnapshotIdParams) = m::SNAPSHOT_GET, Snapshot, Some(Scope::Snapshot);
    SnapshotDelete(SnapshotIdParams) = m::SNAPSHOT_DELETE, Snapshot, Some(Scope::Snapshot);
    SnapshotPush(SnapshotIdParams) = m::SNAPSHOT_PUSH, Snapshot, Some(Scope::Snapshot);
    SnapshotPromote(SnapshotIdParams) = m::SNAPSHOT_PROMOTE, Snapshot, Some(Scope::Snapshot);
    // Answered by the gateway from the session's own state (`dispatch`),
    // never by a backend.
    PreviewCreate(PreviewCreateParams) = m::PREVIEW_CREATE, Preview, Some(Scope::Preview);
    PreviewRevoke(PreviewPortParams) = m::PREVIEW_REVOKE, Preview, Some(Scope::Preview);
    PreviewList(NoParams) = m::PREVIEW_LIST, Preview, Some(Scope::Preview);
    // Answered by the gateway from the tenant's egress (`dispatch`).
    EgressGet(NoParams) = m::EGRESS_GET, Egress, Some(Scope::Egress);
    EgressSet(EgressSetParams) = m::EGRESS_SET, Egress, Some(Scope::Egress);
}

impl Call {
    /// The scope this call requires; `None` for session management and
    /// environment description.
    pub fn scope(&self) -> Option<Scope> {
        match self {
            Call::FsOpen(p) if p.mode == OpenMode::Replace => Some(Scope::FsWrite),
            other => other.table_scope(),
        }
    }

    /// The path fields of the call, with how the reference words an error
    /// in each.
    pub fn paths(&self) -> Vec<(&WirePath, PathField)> {
        fn one(p: &WirePath) -> Vec<(&WirePath, PathField)> {
            vec![(p, PathField::Path)]
        }
        match self {
            Call::ProcessStart(p) => vec![(&p.cwd, PathField::Cwd)],
            Call::CommandExec(p) => vec![(&p.cwd, PathField::Cwd)],
            Call::FsReadFile(p)
            | Call::FsGetMetadata(p)
            | Call::FsReadDirectory(p)
            | Call::FsCanonicalize(p) => one(&p.path),
            Call::FsWriteFile(p) => one(&p.path),
            Call::FsCreateDirectory(p) => one(&p.path),
            Call::FsRemove(p) => one(&p.path),
            Call::FsCopy(p) => vec![
                (&p.source_path, PathField::Path),
                (&p.destination_path, PathField::Path),
            ],
            Call::FsWalk(p) => one(&p.path),
            Call::FsOpen(p) => one(&p.path),
            Call::FsWatchMissing(p) => p
                .missing
                .iter()
                .chain(p.present.iter())
                .map(|w| (w, PathField::Path))
                .collect(),
            Call::EnvironmentConfigRead(p) => vec![(&p.cwd, PathField::Cwd)],
            Call::CapabilitiesDiscover(p) => vec![(&p.cwd, PathField::Cwd)],
            _ => Vec::new(),
        }
    }

    /// The revision a call tells by itself: a method only the newer
    /// revision has (whatever form its paths take: 0.169.0 refuses a plain
    /// path there, it does not become 0.130.0), else its paths.
    pub fn tells(&self) -> Option<Revision> {
        match self {
            Call::FsCanonicalize(_)
            | Call::FsWalk(_)
            | Call::FsOpen(_)
            | Call::FsReadBlock(_)
            | Call::FsWriteBlock(_)
            | Call::FsClose(_)
            | Call::FsWatchMissing(_)
            | Call::EnvironmentInfo(_)
            | Call::EnvironmentStatus(_)
            | Call::EnvironmentConfigRead(_)
            | Call::CapabilitiesDiscover(_)
            | Call::CapabilityRootsDiscover(_) => Some(Revision::Nov2026),
            _ => self.paths().iter().find_map(|(p, _)| p.tells()),
        }
    }
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
    FsCanonicalize(CanonicalizeResponse),
    FsWalk(WalkResponse),
    FsOpen(HandleParams),
    FsReadBlock(ReadBlockResponse),
    FsWatchMissing(WatchMissingResponse),
    EnvironmentInfo(Box<EnvironmentInfo>),
    EnvironmentStatus(StatusResponse),
    EnvironmentConfigRead(ConfigReadResponse),
    CapabilitiesDiscover(DiscoverResponse),
    CapabilityRootsDiscover(RootsResponse),
    Snapshot(Box<Snapshot>),
    SnapshotList(SnapshotListResponse),
    Preview(Preview),
    PreviewList(PreviewListResponse),
    Egress(EgressPolicy),
    Http(HttpResponse),
    Empty(Empty),
}

/// A gRPC-only operation: it opens a stream rather than returning a result.
#[derive(Debug, Clone)]
pub enum Open {
    /// A process's events from a seq onwards (`Attach`).
    Events(ProcessIdParams),
    /// Start a process and stream it from its first byte (`Exec`): its
    /// output is held (bounded) until the stream subscribes, so nothing
    /// scrolls out of the retained window first.
    Exec(Box<ExecParams>),
    /// A regular file opened for reading, confined as `fs/readFile`.
    ReadFile(PathParams),
    /// A file created or truncated for writing, confined as `fs/writeFile`.
    WriteFile(PathParams),
}

impl Open {
    /// The name used in metrics and traces (the gRPC method).
    pub fn method(&self) -> &'static str {
        match self {
            Open::Events(_) => "ProcessService/Attach",
            Open::Exec(_) => "ProcessService/Exec",
            Open::ReadFile(_) => "FileService/ReadFile",
            Open::WriteFile(_) => "FileService/WriteFile",
        }
    }

    pub fn scope(&self) -> Scope {
        match self {
            Open::Events(_) | Open::Exec(_) => Scope::Exec,
            Open::ReadFile(_) => Scope::FsRead,
            Open::WriteFile(_) => Scope::FsWrite,
        }
    }
}

/// A live view of one process's events.
pub trait EventSource: Send + Sync {
    /// The retained events with `seq > after_seq` (the replay) and a channel
    /// of every later event, with nothing falling between the two (an
    /// event may appear in both: skip by seq). The channel ends after
    /// `closed`, or early if the subscriber is too slow.
    fn subscribe(&self, after_seq: u64) -> (Vec<ProcessEvent>, mpsc::Receiver<ProcessEvent>);

    /// Why the channel ended before `closed`, when it was not the
    /// subscriber's slowness (a remote process or link that went away).
    fn failure(&self) -> Option<GatewayError> {
        None
    }
}

/// A boxed, sendable future (of a [`BlockFile`] operation).
pub type BoxFuture<'a, T> = std::pin::Pin<Box<dyn std::future::Future<Output = T> + Send + 'a>>;

/// A file on another machine (a remote executor's), read or written in
/// blocks over the executor's link. Blocks go in order; `finish` ends it
/// (a write is complete only once it returns `Ok`).
pub trait BlockFile: Send + Sync {
    /// Up to `len` bytes at `offset`, and whether the file ends there.
    fn read(&self, offset: u64, len: usize)
    -> BoxFuture<'_, Result<(Vec<u8>, bool), GatewayError>>;
    /// `data` at `offset`; `held` is its place in the tenant's inbound
    /// budget, kept while the data is held here.
    fn write(
        &self,
        offset: u64,
        data: Vec<u8>,
        held: crate::outbound::Reservation,
    ) -> BoxFuture<'_, Result<(), GatewayError>>;
    /// Close the file (a buffered write is sent now).
    fn finish(&self) -> BoxFuture<'_, Result<(), GatewayError>>;
}

/// What an [`Open`] produced.
pub enum Opened {
    Events(Arc<dyn EventSource>),
    /// A file of the tenant's own root.
    File(std::fs::File),
    /// A file on the session's executor.
    Blocks(Box<dyn BlockFile>),
}

impl std::fmt::Debug for Opened {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Opened::Events(_) => f.write_str("Opened::Events"),
            Opened::File(file) => write!(f, "Opened::File({file:?})"),
            Opened::Blocks(_) => f.write_str("Opened::Blocks"),
        }
    }
}

/// Anything that passes through the tower stack.
#[derive(Debug, Clone)]
#[expect(
    clippy::large_enum_variant,
    reason = "JSON-RPC calls are the hot path; boxing them costs an allocation per call"
)]
pub enum Op {
    Call(Call),
    Open(Open),
}

impl Op {
    pub fn method(&self) -> &'static str {
        match self {
            Op::Call(c) => c.method(),
            Op::Open(o) => o.method(),
        }
    }

    pub fn scope(&self) -> Option<Scope> {
        match self {
            Op::Call(c) => c.scope(),
            Op::Open(o) => Some(o.scope()),
        }
    }

    /// How long the call may wait by contract (a long-poll's `waitMs`),
    /// on top of the request deadline.
    pub fn contracted_wait(&self) -> Duration {
        match self {
            Op::Call(Call::ProcessRead(p)) => {
                Duration::from_millis(p.wait_ms.unwrap_or(0)).min(MAX_READ_WAIT)
            }
            _ => Duration::ZERO,
        }
    }
}

/// What an [`Op`] produced: the same for every door. A door that hands
/// the call a [`crate::outbound::Responder`] may get [`Outcome::Sent`]; a
/// door that sends an [`Op::Open`] gets [`Outcome::Opened`].
#[derive(Debug)]
pub enum Outcome {
    Reply(Reply),
    Opened(Opened),
    /// The handler already sent the reply through the call's responder
    /// (a large reply, encoded straight into its reserved bytes).
    Sent,
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// Issue 42 #14: a method only 0.169.0 has tells its revision whatever
    /// form its paths take, so a plain path there is refused as 0.169.0
    /// refuses it (before, the plain path told 0.130.0 and was accepted).
    #[test]
    fn a_newer_method_tells_its_revision_even_with_a_plain_path() {
        use crate::protocol::path::PathField;
        let raw: Box<RawValue> =
            serde_json::from_str(r#"{"watchId":1,"missing":["/tmp/m1"],"present":"/tmp"}"#)
                .unwrap();
        let call = Call::decode("fs/watchMissing", Some(&raw)).unwrap();
        assert_eq!(call.tells(), Some(Revision::Nov2026));
        let e = call.paths()[0]
            .0
            .check(Revision::Nov2026, PathField::Path)
            .unwrap_err();
        assert_eq!(e.message, "invalid URI: relative URL without a base");
        // An older method still learns the revision from its path's form.
        let raw: Box<RawValue> = serde_json::from_str(r#"{"path":"/tmp"}"#).unwrap();
        let call = Call::decode("fs/getMetadata", Some(&raw)).unwrap();
        assert_eq!(call.tells(), Some(Revision::May2026));
    }

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
    fn the_table_is_consistent() {
        for name in [
            m::INITIALIZE,
            m::PROCESS_START,
            m::PROCESS_LIST,
            m::FS_COPY,
            m::HTTP_REQUEST,
            m::COMMAND_EXEC,
        ] {
            let family = MethodFamily::of(name).unwrap();
            // Methods without params decode from nothing; the rest need some.
            if let Ok(call) = Call::decode(name, None) {
                assert_eq!(call.method(), name);
            }
            assert_eq!(family == MethodFamily::Initialize, name == m::INITIALIZE);
        }
        assert_eq!(MethodFamily::of("x"), None);
        let list = Call::decode(m::PROCESS_LIST, None).unwrap();
        assert_eq!(list.scope(), Some(Scope::Exec));
        let raw: Box<RawValue> = serde_json::from_str(r#"{"path":"/x"}"#).unwrap();
        let read = Call::decode(m::FS_READ_FILE, Some(&raw)).unwrap();
        assert_eq!(read.scope(), Some(Scope::FsRead));
        assert_eq!(
            Call::decode(
                m::INITIALIZE,
                Some(&serde_json::from_str::<Box<RawValue>>(r#"{"clientName":"c"}"#).unwrap())
            )
            .unwrap()
            .scope(),
            None
        );
    }
}
