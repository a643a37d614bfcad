//! Method and notification names, one const each.

pub const INITIALIZE: &str = "initialize";
/// Extension: end the connection's session now (processes killed).
pub const SESSION_CLOSE: &str = "session/close";
pub const INITIALIZED: &str = "initialized";

pub const PROCESS_START: &str = "process/start";
pub const PROCESS_READ: &str = "process/read";
pub const PROCESS_WRITE: &str = "process/write";
pub const PROCESS_TERMINATE: &str = "process/terminate";
/// Extensions (docs/protocol.md, "Extensions").
pub const PROCESS_SIGNAL: &str = "process/signal";
pub const PROCESS_RESIZE: &str = "process/resize";
pub const PROCESS_CLOSE_STDIN: &str = "process/closeStdin";
pub const PROCESS_LIST: &str = "process/list";

/// Notifications, server → client.
pub const PROCESS_OUTPUT: &str = "process/output";
pub const PROCESS_EXITED: &str = "process/exited";
pub const PROCESS_CLOSED: &str = "process/closed";

pub const FS_READ_FILE: &str = "fs/readFile";
pub const FS_WRITE_FILE: &str = "fs/writeFile";
pub const FS_CREATE_DIRECTORY: &str = "fs/createDirectory";
pub const FS_GET_METADATA: &str = "fs/getMetadata";
pub const FS_READ_DIRECTORY: &str = "fs/readDirectory";
pub const FS_REMOVE: &str = "fs/remove";
pub const FS_COPY: &str = "fs/copy";

/// 0.169.0's file methods.
pub const FS_CANONICALIZE: &str = "fs/canonicalize";
pub const FS_WALK: &str = "fs/walk";
pub const FS_OPEN: &str = "fs/open";
pub const FS_READ_BLOCK: &str = "fs/readBlock";
pub const FS_WRITE_BLOCK: &str = "fs/writeBlock";
pub const FS_CLOSE: &str = "fs/close";
pub const FS_WATCH_MISSING: &str = "fs/watchMissing";
/// Notification, server → client.
pub const FS_MISSING_CHANGED: &str = "fs/missingChanged";

/// 0.169.0's environment methods.
pub const ENVIRONMENT_INFO: &str = "environment/info";
pub const ENVIRONMENT_STATUS: &str = "environment/status";
pub const ENVIRONMENT_CONFIG_READ: &str = "environmentConfig/read";
pub const CAPABILITIES_DISCOVER_V2: &str = "capabilities/discoverV2";
pub const CAPABILITY_ROOTS_DISCOVER_V1: &str = "capabilityRoots/discoverV1";

pub const HTTP_REQUEST: &str = "http/request";
pub const HTTP_REQUEST_BODY_DELTA: &str = "http/request/bodyDelta";
/// Server → client (0.169.0): asked of the client, and its audit.
pub const NETWORK_POLICY_REQUEST: &str = "network/policyRequest";
pub const NETWORK_POLICY_DECISION: &str = "network/policyDecision";

/// Extensions under the gateway's own prefix (docs/snapshots.md).
pub const SNAPSHOT_CREATE: &str = "gateway/snapshot/create";
pub const SNAPSHOT_LIST: &str = "gateway/snapshot/list";
pub const SNAPSHOT_GET: &str = "gateway/snapshot/get";
pub const SNAPSHOT_DELETE: &str = "gateway/snapshot/delete";
pub const SNAPSHOT_PUSH: &str = "gateway/snapshot/push";
pub const SNAPSHOT_PROMOTE: &str = "gateway/snapshot/promote";
/// docs/preview.md.
pub const PREVIEW_CREATE: &str = "gateway/preview/create";
pub const PREVIEW_REVOKE: &str = "gateway/preview/revoke";
pub const PREVIEW_LIST: &str = "gateway/preview/list";
/// docs/isolation.md, "Egress by name".
pub const EGRESS_GET: &str = "gateway/egress/get";
pub const EGRESS_SET: &str = "gateway/egress/set";

/// The older v0 `command/exec` API (docs/protocol.md, "v0").
pub const COMMAND_EXEC: &str = "command/exec";
pub const COMMAND_EXEC_WRITE: &str = "command/exec/write";
pub const COMMAND_EXEC_TERMINATE: &str = "command/exec/terminate";
pub const COMMAND_EXEC_OUTPUT_DELTA: &str = "command/exec/outputDelta";
pub const COMMAND_EXEC_EXITED: &str = "command/exec/exited";
