// A process's events, followed across dropped connections: the stream is
// opened again after the last seq yielded, so nothing is lost or repeated
// while the gateway still retains it; what it no longer retains is
// reported as an `outputLost` event.
import type { ProcessEvent as PbProcessEvent } from "../gen/exec_gateway/v1/process.js";
import { throwIfAborted } from "./abort.js";
import { Recovery, type Attempt, type Caller } from "./calls.js";
import { DeadlineExceeded, ExecGatewayError, InvalidArgument, Unauthenticated } from "./errors.js";
import { toEvent, type ProcessEvent } from "./types.js";

/** A message of Attach or Exec. */
export interface EventMessage {
  event?: PbProcessEvent | undefined;
}

/**
 * Opens the event stream for one attempt, from after `cursor`. `attempt`
 * counts from 0.
 */
export type OpenEvents = (cursor: number, a: Attempt, attempt: number) => AsyncIterable<EventMessage>;

/**
 * Whether a stream ended in a way that attaching again from the cursor
 * mends: the gateway's live feed dropped a reader that fell behind
 * (ABORTED), or one that left it unread past the slow-client timeout (a
 * held `Exec` stream nobody took in time), or another client's process is
 * still starting.
 */
function isReattachHint(e: unknown): boolean {
  if (e instanceof DeadlineExceeded) return e.message.includes("stopped reading");
  if (e instanceof InvalidArgument) return e.message.endsWith(" is starting");
  return e instanceof ExecGatewayError && e.code === "ABORTED" && e.message.includes("attach again");
}

/** Whether a stream ended because its token expired (a fresh one may go on). */
function isTokenExpiry(e: unknown): boolean {
  return e instanceof Unauthenticated && e.message.includes("token expired");
}

/**
 * Yield the events after `afterSeq` in seq order, until `closed`. A stream
 * that breaks with its connection, that the gateway ended as too slow or
 * unread, that finds the process still starting, or that ended before
 * `closed`, is opened again from the last seq yielded, after a pause (50 ms
 * doubling to 1 s). Only an event past the cursor is progress: once
 * `resumeWithin` has passed without any, whatever the reason, the
 * iteration gives up with ConnectionLost.
 */
export async function* followEvents(
  caller: Caller,
  afterSeq: number,
  signal: AbortSignal | undefined,
  open: OpenEvents,
): AsyncGenerator<ProcessEvent, void, undefined> {
  const conn = caller.conn;
  const recovery = new Recovery(conn, undefined, signal);
  let cursor = afterSeq;
  let attempt = 0;
  // A rotating token gets one fresh try per stretch of progress.
  let renewed = false;
  for (;;) {
    throwIfAborted(signal);
    let why: string;
    try {
      const a: Attempt = { md: await conn.metadata(), deadline: undefined, retried: recovery.retried };
      const stream = open(cursor, a, attempt);
      attempt += 1;
      for await (const msg of stream) {
        // The gateway answered, though perhaps with nothing new.
        conn.reached = true;
        const ev = msg.event;
        if (ev === undefined || ev.seq <= cursor) continue;
        recovery.progressed();
        renewed = false;
        if (ev.seq > cursor + 1) {
          // Every exit and close is retained: a gap is evicted output.
          const lost: ProcessEvent = { type: "outputLost", seq: cursor + 1, chunks: ev.seq - cursor - 1 };
          cursor = ev.seq - 1;
          yield lost;
        }
        cursor = ev.seq;
        const out = toEvent(ev);
        if (out === undefined) continue;
        yield out;
        if (out.type === "closed") return;
      }
      // Ended before `closed` (a feed the gateway closed early, or one
      // with only what was already seen).
      why = "the event stream ended before the process closed";
    } catch (e) {
      if (isReattachHint(e)) {
        // Not a drop, but mended the same way, and as bounded.
        conn.reached = true;
        why = (e as Error).message;
      } else if (isTokenExpiry(e) && conn.rotatingToken && !renewed) {
        renewed = true;
        continue;
      } else if (recovery.mayRetry(e)) {
        await recovery.broke(e);
        continue;
      } else {
        throw e;
      }
    }
    await recovery.again(why, "no new event from the gateway");
  }
}
