// Starting a process with `Exec`, whose stream is held for the process's
// first reader: its output is read from seq 0 with back-pressure, none of
// it lost to the gateway's 1 MiB retention however fast the process writes
// (a `Start` and a later `Attach` leave a gap in which it may be).
import type { ClientReadableStream, ServiceError } from "@grpc/grpc-js";
import type { ExecRequest, ExecResponse } from "../gen/exec_gateway/v1/process.js";
import { abortError, throwIfAborted } from "./abort.js";
import { callError, iterateCall, type CallOptions, type Caller } from "./calls.js";
import { ConnectionLost, DeadlineExceeded, ExecGatewayError, isRetryable, Unsent } from "./errors.js";
import type { EventMessage } from "./events.js";
import { startProcess } from "./process.js";

/** The `Exec` stream a process was started with, until a reader takes it. */
export class HeldStream {
  private taken = false;
  /** An error the call ended with while nobody read it. */
  private error: ServiceError | undefined;

  constructor(private readonly call: ClientReadableStream<ExecResponse>) {
    // grpc-js emits a failed call's error as an event: without a listener
    // it would be thrown at the top level. The reader that takes the
    // stream is given it (a stream the gateway dropped as unread, say).
    call.on("error", (e: ServiceError) => {
      this.error = e;
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
 * Start `request`'s process with `Exec` and hold its stream; undefined if
 * the connection dropped before the gateway said whether it started, and
 * it was then started (or found started) with `Start`, retried.
 */
export async function launch(
  caller: Caller,
  request: ExecRequest,
  opts: CallOptions | undefined,
): Promise<HeldStream | undefined> {
  const signal = opts?.signal;
  throwIfAborted(signal);
  const { processes } = caller.conn;
  const call = processes.exec(request, await caller.conn.metadata());
  // Held from the first moment, so that nothing the call emits goes unheard.
  const held = new HeldStream(call);
  try {
    await new Promise<void>((resolve, reject) => {
      // The gateway answers the stream's headers once the process runs; a
      // refused start ends the call without any (trailers only).
      const onAbort = (): void => call.cancel();
      const timer =
        opts?.timeoutMs === undefined
          ? undefined
          : setTimeout(() => {
              done();
              reject(new DeadlineExceeded("DEADLINE_EXCEEDED", `no answer to the start within ${opts.timeoutMs} ms`));
            }, opts.timeoutMs);
      const done = (): void => {
        clearTimeout(timer);
        signal?.removeEventListener("abort", onAbort);
        call.off("metadata", started);
        call.off("error", failed);
      };
      const started = (): void => {
        done();
        resolve();
      };
      const failed = (e: ServiceError): void => {
        done();
        reject(callError(e, signal));
      };
      call.once("metadata", started);
      call.once("error", failed);
      signal?.addEventListener("abort", onAbort, { once: true });
    });
    caller.conn.reached = true;
    return held;
  } catch (e) {
    held.release();
    if (signal?.aborted) throw abortError(signal);
    if (!isRetryable(e)) {
      if (e instanceof ExecGatewayError && !(e instanceof ConnectionLost)) caller.conn.reached = true;
      throw e;
    }
    if (!caller.conn.reached) throw caller.conn.unreachable(e);
    // Started or not, nobody can tell (unless grpc-js never sent it):
    // `Start` again with its id, finding it counting as started.
    const start = { sessionId: request.sessionId, spec: request.spec };
    await startProcess(caller, start, opts, !(e instanceof Unsent));
    return undefined;
  }
}
