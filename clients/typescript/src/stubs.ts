/**
 * The stubs generated from proto/exec_gateway/v1 (ts-proto, grpc-js
 * services), for calls the SDK does not wrap. Messages are plain objects
 * with camelCase fields; `Msg.fromPartial({...})` fills in defaults.
 */
export * as environment from "./gen/exec_gateway/v1/environment.js";
export * as file from "./gen/exec_gateway/v1/file.js";
export * as process from "./gen/exec_gateway/v1/process.js";
export * as session from "./gen/exec_gateway/v1/session.js";
