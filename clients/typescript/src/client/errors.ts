// The SDK's errors (clients/README.md, "Errors"), built from a gRPC status
// and the gateway's `x-exec-gateway-error-data` trailer.
import { Metadata, status as Status, type ServiceError } from "@grpc/grpc-js";

/** The gateway's machine-readable details of an error (JSON). */
export type ErrorData = Readonly<Record<string, unknown>>;

/** The trailer that carries {@link ErrorData}. */
export const ERROR_DATA_KEY = "x-exec-gateway-error-data";

/** Every error the SDK raises for the gateway or the connection. */
export class ExecGatewayError extends Error {
  /** The gRPC status name (`NOT_FOUND`, `UNAVAILABLE`…). */
  readonly code: string;
  /** The gateway's error data, when it sent any. */
  readonly data: ErrorData | undefined;

  constructor(code: string, message: string, data?: ErrorData, options?: { cause?: unknown }) {
    super(message, options);
    this.name = new.target.name;
    this.code = code;
    this.data = data;
  }
}

/** No token, or a forged, expired or unknown one. */
export class Unauthenticated extends ExecGatewayError {}

/** The token lacks a scope. */
export class Forbidden extends ExecGatewayError {
  /** The scope the call needs (`exec`, `fs:read`, `fs:write`). */
  readonly requiredScope: string | undefined;
  constructor(code: string, message: string, data?: ErrorData) {
    super(code, message, data);
    this.requiredScope = str(data?.["requiredScope"]);
  }
}

/** A path, process or session that does not exist (or is another tenant's). */
export class NotFound extends ExecGatewayError {}

/** The session's replica restarted; its processes are gone. */
export class OwnerRestarted extends NotFound {
  readonly replica: string | undefined;
  constructor(code: string, message: string, data?: ErrorData) {
    super(code, message, data);
    this.replica = str(data?.["replica"]);
  }
}

/** A process id in use. */
export class AlreadyExists extends ExecGatewayError {}

/** Bad parameters, a path outside the rules. */
export class InvalidArgument extends ExecGatewayError {}

/** The session is attached elsewhere. */
export class SessionAttached extends ExecGatewayError {}

/** The gateway's or the tenant's in-flight limit. */
export class Overloaded extends ExecGatewayError {}

/** The tenant's request rate. */
export class RateLimited extends Overloaded {
  /** Seconds to wait before asking again, when the gateway says. */
  readonly retryAfter: number | undefined;
  constructor(code: string, message: string, data?: ErrorData) {
    super(code, message, data);
    this.retryAfter = seconds(data?.["retryAfterMs"]);
  }
}

/** The replica is draining. */
export class ShuttingDown extends ExecGatewayError {}

/** The session's replica cannot be reached. */
export class OwnerUnavailable extends ExecGatewayError {
  readonly replica: string | undefined;
  constructor(code: string, message: string, data?: ErrorData) {
    super(code, message, data);
    this.replica = str(data?.["replica"]);
  }
}

/** The session's executor is gone or none is free. */
export class ExecutorUnavailable extends ExecGatewayError {
  readonly pool: string | undefined;
  readonly executor: string | undefined;
  constructor(code: string, message: string, data?: ErrorData) {
    super(code, message, data);
    this.pool = str(data?.["pool"]);
    this.executor = str(data?.["executor"]);
  }
}

/** A tenant quota. */
export class QuotaExceeded extends ExecGatewayError {
  /** `sessions`, `processes`, `retained_output_bytes`. */
  readonly quota: string | undefined;
  readonly limit: number | undefined;
  /** Seconds, when the gateway says when room is expected. */
  readonly retryAfter: number | undefined;
  constructor(code: string, message: string, data?: ErrorData) {
    super(code, message, data);
    this.quota = str(data?.["quota"]);
    this.limit = num(data?.["limit"]);
    this.retryAfter = seconds(data?.["retryAfterMs"]);
  }
}

/** The gateway's request deadline, or the call's own `timeoutMs`. */
export class DeadlineExceeded extends ExecGatewayError {}

/** A method this gateway does not serve. */
export class Unimplemented extends ExecGatewayError {}

/** An OS or internal failure (and any status without a class of its own). */
export class Internal extends ExecGatewayError {}

/** A write to a process whose stdin is closed or was never a pipe. */
export class StdinClosed extends ExecGatewayError {}

/**
 * The gateway could not be reached within `resumeWithin`, or the connection
 * dropped under a call that cannot be retried (`signal`, a write of a
 * stream of chunks).
 */
export class ConnectionLost extends ExecGatewayError {}

/** `run`'s timeout passed; the process was terminated. */
export class CommandTimeout extends ExecGatewayError {
  /** Standard output up to the timeout. */
  readonly stdout: Uint8Array;
  /** Standard error up to the timeout. */
  readonly stderr: Uint8Array;
  constructor(message: string, stdout: Uint8Array, stderr: Uint8Array) {
    super("DEADLINE_EXCEEDED", message);
    this.stdout = stdout;
    this.stderr = stderr;
  }
}

/** `run`'s output passed its `maxOutputBytes`; the process was terminated. */
export class OutputLimitExceeded extends ExecGatewayError {
  /** Standard output up to the limit. */
  readonly stdout: Uint8Array;
  /** Standard error up to the limit. */
  readonly stderr: Uint8Array;
  constructor(message: string, stdout: Uint8Array, stderr: Uint8Array) {
    super("RESOURCE_EXHAUSTED", message);
    this.stdout = stdout;
    this.stderr = stderr;
  }
}

/** The texts of the gateway's own UNAVAILABLE answers that carry no data. */
const GATEWAY_UNAVAILABLE_TEXTS = new Set(["Server overloaded; retry later.", "server is shutting down"]);

/**
 * What grpc-js says when a TLS handshake fails: the peer's certificate is
 * not trusted, or the gateway refused ours. Asking again cannot help.
 */
const TLS_FAILURE =
  /certificate|self[- ]signed|unable to (get|verify) (local )?issuer|alert|wrong version number|SSL routines|ERR_SSL|ERR_TLS/i;

/** A TLS alert the gateway sent: it refused the handshake (this client's certificate). */
const TLS_ALERT = /SSL alert number|alert (bad|unsupported|unknown|certificate|access denied|handshake failure)/i;

/** What grpc-js says when a stream broke with its connection. */
const BROKEN_STREAM =
  /RST_STREAM|ECONNRESET|EPIPE|ECONNREFUSED|socket hang up|connection (dropped|closed|reset)|GOAWAY/i;

/** The gRPC status name of a numeric code. */
export function statusName(code: number): string {
  const name = (Status as unknown as Record<number, string | undefined>)[code];
  return name ?? `STATUS_${code}`;
}

/** The gateway's error data in `metadata`, when present and valid JSON. */
export function errorData(metadata: Metadata | undefined): ErrorData | undefined {
  const raw = metadata?.get(ERROR_DATA_KEY)[0];
  if (raw === undefined) return undefined;
  try {
    const v: unknown = JSON.parse(typeof raw === "string" ? raw : raw.toString("utf8"));
    return v !== null && typeof v === "object" && !Array.isArray(v) ? (v as ErrorData) : { value: v };
  } catch {
    // Not JSON: kept as text rather than lost.
    return { raw: typeof raw === "string" ? raw : raw.toString("utf8") };
  }
}

/** Whether `e` looks like a grpc-js call error. */
export function isServiceError(e: unknown): e is ServiceError {
  return e instanceof Error && typeof (e as Partial<ServiceError>).code === "number" && "details" in e;
}

/**
 * The SDK error for a failed call (a grpc-js ServiceError: the raw stubs'
 * errors too). A connection that broke (or never came up) is a
 * {@link ConnectionLost}, which the SDK's retrying layer retries when the
 * call allows it, except after a TLS handshake failure, which asking again
 * will not fix.
 */
export function statusError(e: ServiceError): ExecGatewayError {
  const data = errorData(e.metadata);
  const message = e.details || e.message;
  const code = statusName(e.code);
  switch (e.code) {
    case Status.UNAUTHENTICATED:
      return new Unauthenticated(code, message, data);
    case Status.PERMISSION_DENIED:
      return new Forbidden(code, message, data);
    case Status.NOT_FOUND:
      return data?.["reason"] === "ownerRestarted"
        ? new OwnerRestarted(code, message, data)
        : new NotFound(code, message, data);
    case Status.ALREADY_EXISTS:
      return new AlreadyExists(code, message, data);
    case Status.INVALID_ARGUMENT:
      return new InvalidArgument(code, message, data);
    case Status.FAILED_PRECONDITION:
      return new SessionAttached(code, message, data);
    case Status.RESOURCE_EXHAUSTED:
      return new QuotaExceeded(code, message, data);
    case Status.DEADLINE_EXCEEDED:
      return new DeadlineExceeded(code, message, data);
    case Status.UNIMPLEMENTED:
      return new Unimplemented(code, message, data);
    case Status.UNAVAILABLE:
      return unavailable(code, message, data);
    case Status.INTERNAL:
      if (message.startsWith(UNREADABLE)) return unreadable(code, message.slice(UNREADABLE.length), data);
      return internalOrLost(code, message, data);
    case Status.UNKNOWN:
    case Status.CANCELLED:
      return internalOrLost(code, message, data);
    default:
      return new Internal(code, message, data);
  }
}

/**
 * grpc-js reports a stream its connection dropped under with INTERNAL,
 * UNKNOWN or CANCELLED too (an RST_STREAM, a reset socket): that is the
 * connection's. An OS error the gateway passes on says so ("(os error N)").
 */
function internalOrLost(code: string, message: string, data: ErrorData | undefined): ExecGatewayError {
  if (data === undefined && BROKEN_STREAM.test(message) && !message.includes("(os error")) return lost(message);
  return new Internal(code, message, data);
}

/**
 * UNAVAILABLE is both the gateway's refusal and grpc-js's word for a
 * connection that failed; the gateway's carry error data or a fixed text.
 */
function unavailable(code: string, message: string, data: ErrorData | undefined): ExecGatewayError {
  if (data !== undefined) {
    if (data["quota"] !== undefined) return new QuotaExceeded(code, message, data);
    switch (data["reason"]) {
      case "rateLimited":
        return new RateLimited(code, message, data);
      case "serverShuttingDown":
        return new ShuttingDown(code, message, data);
      case "ownerUnavailable":
        return new OwnerUnavailable(code, message, data);
      case "executorUnavailable":
        return new ExecutorUnavailable(code, message, data);
      default:
        return new Overloaded(code, message, data);
    }
  }
  if (message === "server is shutting down") return new ShuttingDown(code, message);
  if (GATEWAY_UNAVAILABLE_TEXTS.has(message)) return new Overloaded(code, message);
  if (TLS_ALERT.test(message)) {
    // The gateway ended the handshake: it refused this client's certificate.
    return new Unauthenticated(
      "UNAUTHENTICATED",
      `the gateway refused the TLS connection (its client certificate?): ${message}`,
    );
  }
  if (TLS_FAILURE.test(message)) {
    // Not retried: no reconnect fixes a certificate.
    return new TlsFailure(code, `TLS handshake with the gateway failed: ${message}`);
  }
  if (message.startsWith(NOT_CONNECTED)) return new Unsent(code, `no connection: ${message}`);
  return lost(message);
}

/** grpc-js's text for a message from the server it could not decode. */
const UNREADABLE = "Response message parsing error: ";

/**
 * A message from the gateway the SDK cannot decode (grpc-js cancelled the
 * call): never a valid gateway's, so not retried.
 */
function unreadable(code: string, detail: string, data: ErrorData | undefined): Internal {
  const why = detail.includes("MAX_SAFE_INTEGER")
    ? " (a 64-bit number, such as an event's seq, past 2^53 - 1: a JavaScript number cannot hold it exactly)"
    : "";
  return new Internal(code, `the gateway sent a message the SDK cannot read: ${detail}${why}`, data);
}

function lost(detail: string): ConnectionLost {
  return new ConnectionLost("UNAVAILABLE", `connection to the gateway lost: ${detail}`);
}

/**
 * grpc-js's text for a call it failed without sending, because the channel
 * had no connection: such a call may be made again whatever it was.
 */
const NOT_CONNECTED = "No connection established";

/** A ConnectionLost the retrying layer must not retry (a TLS failure). */
export class TlsFailure extends ConnectionLost {
  constructor(code: string, message: string) {
    super(code, message);
    // The public class; this one is the SDK's own distinction.
    this.name = "ConnectionLost";
  }
}

/** A ConnectionLost of a call that was never sent (no connection). */
export class Unsent extends ConnectionLost {
  constructor(code: string, message: string) {
    super(code, message);
    this.name = "ConnectionLost";
  }
}

/** Whether a retrying call may try `e` again once the connection is back. */
export function isRetryable(e: unknown): e is ConnectionLost {
  return e instanceof ConnectionLost && !(e instanceof TlsFailure);
}

function str(v: unknown): string | undefined {
  return typeof v === "string" ? v : undefined;
}

function num(v: unknown): number | undefined {
  return typeof v === "number" && Number.isFinite(v) ? v : undefined;
}

function seconds(ms: unknown): number | undefined {
  const n = num(ms);
  return n === undefined ? undefined : n / 1000;
}
