// How every call is made: the token as metadata, the caller's AbortSignal
// and deadline, gRPC errors as the SDK's, and the retries of a call that
// can be repeated without changing its outcome while the connection is
// down (clients/README.md, "Resuming after a dropped connection").
import type {
  CallOptions as GrpcCallOptions,
  ClientReadableStream,
  ClientUnaryCall,
  Metadata,
  ServiceError,
} from "@grpc/grpc-js";
import { abortError, sleep, throwIfAborted } from "./abort.js";
import type { Connection } from "./connection.js";
import {
  ConnectionLost,
  DeadlineExceeded,
  ExecGatewayError,
  isRetryable,
  isServiceError,
  statusError,
  Unsent,
} from "./errors.js";

/** What every SDK call takes. */
export interface CallOptions {
  /** Cancels the call, which then rejects with the signal's reason (an AbortError). */
  signal?: AbortSignal;
  /**
   * Milliseconds the call may take, waiting for a reconnect and retries
   * included; then it fails with DeadlineExceeded.
   */
  timeoutMs?: number;
}

/**
 * Where {@link withDeadline} keeps a call's absolute deadline, so that a
 * call made of several (a lookup of the root, then the operation; the
 * chunks of a write and their retries) is bounded as a whole by its
 * `timeoutMs`, not each part by its own.
 */
const DEADLINE_AT: unique symbol = Symbol("exec-gateway.deadlineAt");

/** Options whose deadline was fixed by {@link withDeadline}. */
interface Fixed {
  readonly [DEADLINE_AT]?: number;
}

/**
 * `opts` with its `timeoutMs` turned into a deadline from now, once: the
 * parts of the call that are given the result share it.
 */
export function withDeadline<O extends CallOptions>(opts: O): O {
  if (opts.timeoutMs === undefined || (opts as Fixed)[DEADLINE_AT] !== undefined) return opts;
  return { ...opts, [DEADLINE_AT]: Date.now() + opts.timeoutMs };
}

/** A generated unary method, bound to its request. */
export type Unary<Res> = (
  md: Metadata,
  options: Partial<GrpcCallOptions>,
  callback: (err: ServiceError | null, res: Res) => void,
) => ClientUnaryCall;

/** A generated server-streaming method, bound to its request. */
export type ServerStream<Res> = (md: Metadata, options: Partial<GrpcCallOptions>) => ClientReadableStream<Res>;

/** A generated unary method (its last, fullest overload). */
export type UnaryMethod<Req, Res> = (
  request: Req,
  md: Metadata,
  options: Partial<GrpcCallOptions>,
  callback: (err: ServiceError | null, res: Res) => void,
) => ClientUnaryCall;

/** A generated server-streaming method. */
export type ServerStreamMethod<Req, Res> = (
  request: Req,
  md?: Metadata,
  options?: Partial<GrpcCallOptions>,
) => ClientReadableStream<Res>;

/**
 * `client.method` bound to its client and `request`. (Passing the method
 * lets TypeScript read the request and response types off the stub.)
 */
export function bind<Req, Res>(method: UnaryMethod<Req, Res>, client: object, request: Req): Unary<Res> {
  return (md, options, callback) => method.call(client, request, md, options, callback);
}

/** `client.method` (server streaming) bound to its client and `request`. */
export function bindStream<Req, Res>(
  method: ServerStreamMethod<Req, Res>,
  client: object,
  request: Req,
): ServerStream<Res> {
  return (md, options) => method.call(client, request, md, options);
}

/** One attempt's context. */
export interface Attempt {
  md: Metadata;
  /** Absolute ms, when the call has a deadline. */
  deadline: number | undefined;
  /** Whether an earlier attempt of this call broke after it was sent. */
  retried: boolean;
}

/** The grpc-js options of one attempt. */
export function grpcOptions(deadline: number | undefined): Partial<GrpcCallOptions> {
  return deadline === undefined ? {} : { deadline: new Date(deadline) };
}

/** The error a failed attempt is reported with. */
export function callError(e: unknown, signal: AbortSignal | undefined): unknown {
  // A cancel we asked for surfaces from grpc-js as CANCELLED.
  if (signal?.aborted) return abortError(signal);
  return isServiceError(e) ? statusError(e) : e;
}

/** One attempt of a unary call. */
export function unaryOnce<Res>(invoke: Unary<Res>, attempt: Attempt, signal: AbortSignal | undefined): Promise<Res> {
  return new Promise<Res>((resolve, reject) => {
    if (signal?.aborted) {
      reject(abortError(signal));
      return;
    }
    let call: ClientUnaryCall | undefined;
    const onAbort = (): void => call?.cancel();
    call = invoke(attempt.md, grpcOptions(attempt.deadline), (err, res) => {
      signal?.removeEventListener("abort", onAbort);
      if (err) reject(callError(err, signal));
      else resolve(res);
    });
    signal?.addEventListener("abort", onAbort, { once: true });
  });
}

/**
 * The messages of one server stream; the call is cancelled when the
 * consumer stops early or `signal` fires. grpc-js reads the next message
 * only when asked (a few are buffered), so a slow consumer holds the
 * stream back instead of piling messages up here.
 */
export function streamOnce<Res>(
  invoke: ServerStream<Res>,
  attempt: Attempt,
  signal: AbortSignal | undefined,
): AsyncGenerator<Res, void, undefined> {
  throwIfAborted(signal);
  return iterateCall(invoke(attempt.md, grpcOptions(attempt.deadline)), signal);
}

/** The messages of a server-streaming call already made, as {@link streamOnce}. */
export async function* iterateCall<Res>(
  call: ClientReadableStream<Res>,
  signal: AbortSignal | undefined,
  /** An error the call ended with before this iteration listened. */
  earlier?: () => unknown,
): AsyncGenerator<Res, void, undefined> {
  const onAbort = (): void => call.cancel();
  signal?.addEventListener("abort", onAbort, { once: true });
  try {
    throwIfAborted(signal);
    for await (const msg of call) yield msg as Res;
    const e = earlier?.();
    if (e !== undefined) throw e;
  } catch (e) {
    throw callError(e, signal);
  } finally {
    signal?.removeEventListener("abort", onAbort);
    call.cancel();
  }
}

/** The pause before asking again after a broken attempt: 50 ms doubling to 1 s. */
export function backoffMs(failures: number): number {
  return Math.min(1_000, 50 * 2 ** Math.max(0, failures - 1));
}

/**
 * How a call gets through a connection that breaks under it: each broken
 * attempt is noted, and the next waits for the channel to reconnect, up to
 * `resumeWithin` after the first break of a stretch without progress.
 */
export class Recovery {
  private lostAt: number | undefined;
  private failures = 0;
  private mayHaveActed = false;

  constructor(
    private readonly conn: Connection,
    private readonly deadline: number | undefined,
    private readonly signal: AbortSignal | undefined,
  ) {}

  /** The call got somewhere: a later break starts a new stretch. */
  progressed(): void {
    this.conn.reached = true;
    this.lostAt = undefined;
    this.failures = 0;
  }

  /**
   * An attempt ended with `e`: whether it is one to try again (the
   * connection broke; `retry` unless it was never sent). The gateway
   * answering at all counts as having reached it.
   */
  mayRetry(e: unknown, retry = true): e is ConnectionLost {
    if (e instanceof ExecGatewayError && !(e instanceof ConnectionLost)) this.conn.reached = true;
    return isRetryable(e) && (retry || e instanceof Unsent);
  }

  /** Whether an earlier attempt broke after it was sent (it may have taken effect). */
  get retried(): boolean {
    return this.mayHaveActed;
  }

  /**
   * An attempt broke with `e`: wait until trying again makes sense, or
   * throw (ConnectionLost past `resumeWithin`, DeadlineExceeded past the
   * call's deadline, the abort reason).
   */
  async broke(e: ConnectionLost): Promise<void> {
    // A gateway never reached is a wrong address more likely than a drop.
    if (!this.conn.reached) throw this.conn.unreachable(e);
    if (!(e instanceof Unsent)) this.mayHaveActed = true;
    await this.again(e.message, "the gateway could not be reached", e);
  }

  /**
   * Pause before the next attempt of a call that has not got anywhere
   * since the last {@link progressed} (a broken connection, or a stream the
   * gateway ended without anything new): 50 ms doubling to 1 s, and once
   * `resumeWithin` has passed since the first such attempt, ConnectionLost
   * ("`giveUp` within N s: `why`"); DeadlineExceeded past the call's
   * deadline; the abort reason.
   */
  async again(why: string, giveUp: string, cause?: unknown): Promise<void> {
    const now = Date.now();
    this.lostAt ??= now;
    this.failures += 1;
    const lostBy = this.lostAt + this.conn.resumeWithinMs;
    if (now >= lostBy) {
      throw new ConnectionLost(
        "UNAVAILABLE",
        `${giveUp} within ${this.conn.resumeWithinMs / 1000} s: ${why}`,
        undefined,
        cause === undefined ? undefined : { cause },
      );
    }
    if (this.deadline !== undefined && now >= this.deadline) {
      throw new DeadlineExceeded("DEADLINE_EXCEEDED", `the call's deadline passed: ${why}`);
    }
    // A reset connection may still read READY for a moment.
    const until = Math.min(lostBy, this.deadline ?? Infinity);
    await sleep(Math.min(backoffMs(this.failures), Math.max(0, until - now)), this.signal);
    await this.conn.awaitReconnect(lostBy, this.deadline, this.signal, why);
  }
}

export class Caller {
  constructor(readonly conn: Connection) {}

  /**
   * When a call with `opts` must be done by (absolute ms): the deadline
   * {@link withDeadline} fixed, else `timeoutMs` from now.
   */
  deadline(opts: CallOptions | undefined): number | undefined {
    const fixed = (opts as Fixed | undefined)?.[DEADLINE_AT];
    if (fixed !== undefined) return fixed;
    const t = opts?.timeoutMs;
    return t === undefined ? undefined : Date.now() + t;
  }

  /**
   * Run `attempt`; with `retry`, again while the connection breaks under
   * it, until `resumeWithin` has passed since it first broke (then
   * ConnectionLost). Without `retry` a broken attempt is a ConnectionLost
   * at once, since the call may have taken effect, unless grpc-js failed
   * it unsent (no connection), which is always asked again. Attempts made
   * while the channel is connecting wait for it (grpc-js holds them).
   */
  async retrying<T>(opts: CallOptions | undefined, retry: boolean, attempt: (a: Attempt) => Promise<T>): Promise<T> {
    const signal = opts?.signal;
    const deadline = this.deadline(opts);
    const recovery = new Recovery(this.conn, deadline, signal);
    for (;;) {
      throwIfAborted(signal);
      try {
        const r = await attempt({ md: await this.conn.metadata(), deadline, retried: recovery.retried });
        recovery.progressed();
        return r;
      } catch (e) {
        if (!recovery.mayRetry(e, retry)) throw e;
        await recovery.broke(e);
      }
    }
  }

  /** A unary call, retried per {@link retrying}. */
  unary<Res>(opts: CallOptions | undefined, retry: boolean, invoke: Unary<Res>): Promise<Res> {
    return this.retrying(opts, retry, (a) => unaryOnce(invoke, a, opts?.signal));
  }

  /**
   * A retried unary call whose retry may find it done: after a dropped
   * attempt, an error `doneIf` accepts means the attempt that broke made it
   * (the Python SDK's `done_if`).
   */
  async unaryDoneIf<Res>(
    opts: CallOptions | undefined,
    invoke: Unary<Res>,
    doneIf: (e: unknown) => boolean,
  ): Promise<void> {
    await this.retrying(opts, true, async (a) => {
      try {
        await unaryOnce(invoke, a, opts?.signal);
      } catch (e) {
        if (a.retried && doneIf(e)) return;
        throw e;
      }
    });
  }
}
