// Starting a process with `Exec`, whose stream is held for the process's
// first reader: its output is read from seq 0 with back-pressure, none of
// it lost to the gateway's 1 MiB retention however fast the process writes
// (a `Start` and a later `Attach` leave a gap in which it may be).
import type { ClientReadableStream, ServiceError } from "@grpc/grpc-js";
import type { ExecRequest, ExecResponse, StartRequest } from "../gen/exec_gateway/v1/process.js";
import { abortError, throwIfAborted } from "./abort.js";
import { bind, iterateCall, type CallOptions, type Caller } from "./calls.js";
import { ConnectionLost, DeadlineExceeded, isRetryable, statusError, Unsent } from "./errors.js";
import type { EventMessage } from "./events.js";
import { startProcess } from "./process.js";

/**
 * How long a start given up on (aborted, or past its deadline) may take to
 * learn whether the process started, and to kill it if it did.
 */
const ABANDON_MS = 10_000;

/** The `Exec` stream a process was started with, until a reader takes it. */
export class HeldStream {
  private taken = false;
  /** An error the call ended with while nobody read it. */
  private error: ServiceError | undefined;
  /**
   * How the start went: undefined once the gateway answered the stream's
   * headers (the process runs), else the error the call ended with first.
   */
  readonly outcome: Promise<ServiceError | undefined>;

  constructor(private readonly call: ClientReadableStream<ExecResponse>) {
    // grpc-js emits a failed call's error as an event: without a listener
    // it would be thrown at the top level. The reader that takes the
    // stream is given it (a stream the gateway dropped as unread, say).
    call.on("error", (e: ServiceError) => {
      this.error = e;
    });
    // The gateway answers the stream's headers once the process runs; a
    // refused start ends the call without any (trailers only).
    this.outcome = new Promise((resolve) => {
      call.once("metadata", () => resolve(undefined));
      call.once("error", (e: ServiceError) => resolve(e));
      // Ended without headers or an error: nothing to tell a start by but
      // the status, which is OK.
      call.once("status", () => resolve(undefined));
    });
    // grpc-js pauses the HTTP/2 stream between messages only once it has
    // been asked to read: a stream never read takes in everything the
    // gateway sends. Asking once bounds what waits here to the readable's
    // 16 messages (at most 4 MiB of output), and the process is held back
    // beyond that, as with a local pipe.
    call.read(0);
  }

  /** The stream's messages, once; undefined once taken. */
  take(signal: AbortSignal | undefined): AsyncIterable<EventMessage> | undefined {
    if (this.taken) return undefined;
    this.taken = true;
    return iterateCall(this.call, signal, () => this.error);
  }

  /** Give the stream up unread (the process goes on). */
  release(): void {
    this.taken = true;
    this.call.cancel();
  }
}

/**
 * A promise of why the start was given up on: the signal's reason once it
 * fires, DeadlineExceeded once `deadline` passes; `dispose` stops watching.
 */
function stopped(
  signal: AbortSignal | undefined,
  deadline: number | undefined,
): { reason: Promise<unknown>; dispose: () => void } {
  let onAbort: (() => void) | undefined;
  let timer: NodeJS.Timeout | undefined;
  const reason = new Promise<unknown>((resolve) => {
    if (signal !== undefined) {
      onAbort = (): void => resolve(abortError(signal));
      signal.addEventListener("abort", onAbort, { once: true });
    }
    if (deadline !== undefined) {
      timer = setTimeout(
        () =>
          resolve(new DeadlineExceeded("DEADLINE_EXCEEDED", "the start's deadline passed before the gateway answered")),
        Math.max(0, deadline - Date.now()),
      );
    }
  });
  const dispose = (): void => {
    clearTimeout(timer);
    if (onAbort !== undefined) signal?.removeEventListener("abort", onAbort);
  };
  return { reason, dispose };
}

/**
 * Whether the start was given up on (aborted, or past a deadline) with its
 * outcome unknown and the gateway within reach: worth seeing through. (A
 * ConnectionLost after `resumeWithin` is beyond reach.)
 */
function gaveUp(e: unknown, signal: AbortSignal | undefined): boolean {
  return signal?.aborted === true || e instanceof DeadlineExceeded;
}

/**
 * Start `request`'s process with `Exec` and hold its stream; undefined if
 * the connection dropped before the gateway said whether it started, and
 * it was then started (or found started) with `Start`, retried.
 *
 * Given up on (`signal`, or `opts`' deadline) while the outcome is not
 * known, the start is still seen through (the `Exec` answered, or `Start`
 * retried with the same id, as after a drop) and a process it started is
 * killed, before this rejects with the reason: a start the caller gave up
 * on leaves nothing running.
 */
export async function launch(
  caller: Caller,
  request: ExecRequest,
  opts: CallOptions | undefined,
): Promise<HeldStream | undefined> {
  const signal = opts?.signal;
  const deadline = caller.deadline(opts);
  throwIfAborted(signal);
  const md = await caller.conn.metadata();
  // Nothing is sent yet: nothing to undo.
  throwIfAborted(signal);
  const { processes } = caller.conn;
  // No deadline or signal on the call itself: cancelled, the gateway may
  // start the process all the same, and the answer that says so is lost.
  const call = processes.exec(request, md);
  // Held from the first moment, so that nothing the call emits goes unheard.
  const held = new HeldStream(call);
  const stop = stopped(signal, deadline);
  let answer: ServiceError | undefined;
  try {
    const first = await Promise.race([
      held.outcome.then((e) => ({ e })),
      stop.reason.then((reason) => ({ reason })),
    ]);
    if ("reason" in first) {
      await abandon(caller, request, held);
      throw first.reason;
    }
    answer = first.e;
  } finally {
    stop.dispose();
  }
  if (answer === undefined) {
    caller.conn.reached = true;
    return held;
  }
  held.release();
  const e = statusError(answer);
  // The gateway answering at all counts as having reached it.
  if (!(e instanceof ConnectionLost)) caller.conn.reached = true;
  // Refused: nothing started (though the caller may have given up meanwhile).
  if (!isRetryable(e)) throw signal?.aborted ? abortError(signal) : e;
  if (!caller.conn.reached) throw caller.conn.unreachable(e);
  // Started or not, nobody can tell (unless grpc-js never sent it):
  // `Start` again with its id, finding it counting as started.
  const execSent = !(e instanceof Unsent);
  const start: StartRequest = { sessionId: request.sessionId, spec: request.spec };
  let startSent = false;
  try {
    await startProcess(caller, start, opts, execSent, () => void (startSent = true));
  } catch (err) {
    // Given up on with a call out whose answer is lost: see it through.
    if ((execSent || startSent) && gaveUp(err, signal)) {
      await abandonByStart(caller, start, Date.now() + ABANDON_MS);
    }
    throw err;
  }
  return undefined;
}

/**
 * A start given up on while its `Exec` is out: wait for the gateway's
 * answer (or, if the call drops, `Start` the same id again), then kill
 * what it started. Best effort within {@link ABANDON_MS}: past it, or if
 * the gateway cannot be reached, the process may live (a `run` kills it by
 * id after this, and says if it cannot).
 */
async function abandon(caller: Caller, request: ExecRequest, held: HeldStream): Promise<void> {
  const until = Date.now() + ABANDON_MS;
  let timer: NodeJS.Timeout | undefined;
  try {
    const answer = await Promise.race([
      held.outcome,
      new Promise<"late">((resolve) => {
        timer = setTimeout(() => resolve("late"), ABANDON_MS);
      }),
    ]);
    if (answer === "late") return;
    if (answer !== undefined) {
      const e = statusError(answer);
      // Refused, or never sent: nothing runs.
      if (!isRetryable(e) || e instanceof Unsent) return;
      await abandonByStart(caller, { sessionId: request.sessionId, spec: request.spec }, until);
      return;
    }
    await kill(caller, request.sessionId, request.spec?.processId ?? "", until);
  } catch {
    // Best effort (see above).
  } finally {
    clearTimeout(timer);
    held.release();
  }
}

/**
 * A start whose answer was lost and that was then given up on: `Start`
 * the same id again (finding it counts as started), then kill it. Best
 * effort, until `until`.
 */
async function abandonByStart(caller: Caller, start: StartRequest, until: number): Promise<void> {
  try {
    await startProcess(caller, start, { timeoutMs: Math.max(1, until - Date.now()) }, true);
    await kill(caller, start.sessionId, start.spec?.processId ?? "", until);
  } catch {
    // Best effort: the gateway is out of reach, or refused the id.
  }
}

/** SIGKILL a process this start made (retried, as `terminate` is). */
async function kill(caller: Caller, sessionId: string, processId: string, until: number): Promise<void> {
  const { processes } = caller.conn;
  await caller.unary(
    { timeoutMs: Math.max(1, until - Date.now()) },
    true,
    bind(processes.terminate, processes, { sessionId, processId }),
  );
}
