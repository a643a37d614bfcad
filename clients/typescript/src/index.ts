/**
 * The TypeScript SDK of exec-gateway's gRPC API (clients/README.md).
 *
 * ```ts
 * const client = await connect("grpc://127.0.0.1:50051", { token });
 * const session = await client.session();
 * const r = await session.run(["echo", "hi"]);
 * ```
 */
export { connect, Client, type SessionOptions } from "./client/client.js";
export type { ConnectOptions, Pem, TokenSource } from "./client/connection.js";
export type { CallOptions } from "./client/calls.js";
export {
  Session,
  type PreviewOptions,
  type RunOptions,
  type SnapshotOptions,
  type SpawnOptions,
  type StartOptions,
} from "./client/session.js";
export { Process, type EventsOptions } from "./client/process.js";
export {
  FORWARD_CHUNK_BYTES,
  PortConnection,
  PortForward,
  type PortForwardOptions,
} from "./client/forward.js";
export {
  Files,
  type CopyOptions,
  type MkdirOptions,
  type ReadOptions,
  type RemoveOptions,
  type WalkOptions,
  type WriteData,
} from "./client/files.js";
export {
  RunResult,
  type ClosedEvent,
  type DirEntry,
  type EgressPolicy,
  type EnvironmentInfo,
  type ExitStatus,
  type ExitedEvent,
  type FileStat,
  type OutputEvent,
  type OutputLostEvent,
  type Preview,
  type PreviewPort,
  type Previews,
  type ProcessEvent,
  type ProcessInfo,
  type ProcessStateName,
  type SignalName,
  type Snapshot,
  type StreamName,
  type WalkEntry,
  type WalkResult,
} from "./client/types.js";
export {
  AlreadyExists,
  CommandTimeout,
  ConnectionLost,
  DeadlineExceeded,
  ExecGatewayError,
  ExecutorUnavailable,
  Forbidden,
  Internal,
  InvalidArgument,
  NotFound,
  OutputLimitExceeded,
  Overloaded,
  OwnerRestarted,
  OwnerUnavailable,
  QuotaExceeded,
  RateLimited,
  SessionAttached,
  ShuttingDown,
  StdinClosed,
  Unauthenticated,
  Unimplemented,
  statusError as errorFromStatus,
  type ErrorData,
} from "./client/errors.js";
