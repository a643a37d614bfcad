// A process of a session: its events, stdin, signals and exit.
import { randomUUID } from "node:crypto";
import { inspect } from "node:util";
import { SignalKind, WriteStatus, type StartRequest, type WriteResponse } from "../gen/exec_gateway/v1/process.js";
import { anySignal, sleep } from "./abort.js";
import {
  backoffMs,
  bind,
  bindStream,
  streamOnce,
  unaryOnce,
  withDeadline,
  type CallOptions,
  type Caller,
} from "./calls.js";
import { followEvents } from "./events.js";
import {
  AlreadyExists,
  ConnectionLost,
  DeadlineExceeded,
  ExecGatewayError,
  Internal,
  InvalidArgument,
  NotFound,
  StdinClosed,
} from "./errors.js";
import type { HeldStream } from "./launch.js";
import { toProcessInfo, type ExitStatus, type ProcessEvent, type ProcessInfo, type SignalName } from "./types.js";

export interface EventsOptions {
  /** Yield events with seq greater than this (0: from the first). */
  afterSeq?: number;
  /** Stops the iteration, which then throws the signal's reason. */
  signal?: AbortSignal;
}

/** The largest stdin chunk sent in one Write (well under the 16 MiB message limit). */
export const WRITE_CHUNK_BYTES = 1024 * 1024;

/** The gateway's text for a write into a pipe that is closed. */
const STDIN_WRITE_FAILED = "failed to write to process stdin";

const SIGNALS: Record<SignalName, SignalKind> = {
  interrupt: SignalKind.SIGNAL_KIND_INTERRUPT,
  terminate: SignalKind.SIGNAL_KIND_TERMINATE,
  kill: SignalKind.SIGNAL_KIND_KILL,
  hangup: SignalKind.SIGNAL_KIND_HANGUP,
  quit: SignalKind.SIGNAL_KIND_QUIT,
  user1: SignalKind.SIGNAL_KIND_USER1,
  user2: SignalKind.SIGNAL_KIND_USER2,
};

const encoder = new TextEncoder();

/** Bytes of a string (UTF-8) or of a Uint8Array (as is). */
export function toBytes(data: string | Uint8Array): Uint8Array {
  return typeof data === "string" ? encoder.encode(data) : data;
}

/** `bytes` as the Buffer the generated messages take, without a copy. */
export function asBuffer(bytes: Uint8Array): Buffer {
  return Buffer.isBuffer(bytes) ? bytes : Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength);
}

/** The handle of a process, started by this client or another. */
export class Process implements AsyncIterable<ProcessEvent> {
  /**
   * The highest seq any iteration of this handle yielded before an exit,
   * and the exit once one was seen: `wait` starts from there.
   */
  private seenSeq = 0;
  private exit: ExitStatus | undefined;

  /** Private fields: the channel (and the calls on it) stay out of `util.inspect`, whatever its options. */
  readonly #caller: Caller;
  /** The stream `start` opened, for the first reader. */
  #held: HeldStream | undefined;

  constructor(
    caller: Caller,
    readonly sessionId: string,
    /** Unique in the session; not an OS pid. */
    readonly id: string,
    held?: HeldStream,
  ) {
    this.#caller = caller;
    this.#held = held;
  }

  /** Events from the first, as `events()`. */
  [Symbol.asyncIterator](): AsyncIterator<ProcessEvent> {
    return this.events()[Symbol.asyncIterator]();
  }

  /**
   * The process's events in seq order, from after `afterSeq`; ends after
   * `closed`. Survives dropped connections (see the README's "Resuming").
   */
  async *events(opts: EventsOptions = {}): AsyncGenerator<ProcessEvent, void, undefined> {
    const { processes } = this.#caller.conn;
    const request = { sessionId: this.sessionId, processId: this.id };
    const stream = followEvents(this.#caller, opts.afterSeq ?? 0, opts.signal, (cursor, a, attempt) => {
      // The first reader takes the stream `start` opened (from seq 0:
      // what is not past the cursor is skipped).
      const held = attempt === 0 ? this.#held?.take(opts.signal) : undefined;
      this.#held = undefined;
      return (
        held ?? streamOnce(bindStream(processes.attach, processes, { ...request, afterSeq: cursor }), a, opts.signal)
      );
    });
    for await (const ev of stream) {
      this.note(ev);
      yield ev;
    }
  }

  /**
   * Let the stream `start` opened go unread (the gateway then holds no
   * output back for it). A later reader attaches anew.
   */
  release(): void {
    this.#held?.release();
    this.#held = undefined;
  }

  private note(ev: ProcessEvent): void {
    if (ev.type === "exited") this.exit = { exitCode: ev.exitCode, signal: ev.signal };
    else if (this.exit === undefined) this.seenSeq = Math.max(this.seenSeq, ev.seq);
  }

  /**
   * Write to stdin (a string as UTF-8). Each chunk carries a write id, so
   * the gateway applies a write retried after a dropped connection once.
   * A process still starting is asked again (50 ms, doubling to 1 s) until
   * `timeoutMs` has passed (DeadlineExceeded), or without one
   * `resumeWithin` (ConnectionLost). `timeoutMs` bounds the whole write:
   * every chunk and every retry.
   */
  async write(data: string | Uint8Array, opts: CallOptions = {}): Promise<void> {
    const bounded = withDeadline(opts);
    const bytes = toBytes(data);
    for (let at = 0; at === 0 || at < bytes.length; at += WRITE_CHUNK_BYTES) {
      await this.writeChunk(bytes.subarray(at, at + WRITE_CHUNK_BYTES), bounded);
    }
  }

  private async writeChunk(data: Uint8Array, opts: CallOptions): Promise<void> {
    const { processes } = this.#caller.conn;
    const request = { sessionId: this.sessionId, processId: this.id, data: asBuffer(data), writeId: randomUUID() };
    const deadline = this.#caller.deadline(opts);
    /** When the gateway first said the process was starting, and how often since. */
    let startingSince: number | undefined;
    let starting = 0;
    for (;;) {
      let r: WriteResponse;
      try {
        r = await this.#caller.unary(opts, true, bind(processes.write, processes, request));
      } catch (e) {
        // After CloseStdin (or once the child closed its end) the gateway
        // answers INTERNAL with this text rather than STDIN_CLOSED.
        if (e instanceof Internal && e.message === STDIN_WRITE_FAILED) {
          throw new StdinClosed("FAILED_PRECONDITION", `stdin of process ${this.id} is closed (${e.message})`, e.data, {
            cause: e,
          });
        }
        throw e;
      }
      switch (r.status) {
        case WriteStatus.WRITE_STATUS_ACCEPTED:
          return;
        case WriteStatus.WRITE_STATUS_STARTING: {
          // Not applied (the id is not recorded either): the same write
          // again, as long as the call's deadline (or resumeWithin) allows.
          startingSince ??= Date.now();
          starting += 1;
          const until = deadline ?? startingSince + this.#caller.conn.resumeWithinMs;
          if (Date.now() < until) await sleep(Math.min(backoffMs(starting), until - Date.now()), opts.signal);
          // Not asked again with no time left to answer in.
          if (Date.now() >= until) throw this.stillStarting(opts);
          continue;
        }
        case WriteStatus.WRITE_STATUS_UNKNOWN_PROCESS:
          throw new NotFound("NOT_FOUND", `unknown process id ${this.id}`);
        case WriteStatus.WRITE_STATUS_STDIN_CLOSED:
          throw new StdinClosed("FAILED_PRECONDITION", `stdin of process ${this.id} is closed`);
        default:
          throw new Internal("UNKNOWN", `the gateway answered the write with status ${r.status}`);
      }
    }
  }

  /** A write given up on because the process stayed "starting" (see `write`). */
  private stillStarting(opts: CallOptions): ExecGatewayError {
    const why = `process ${this.id} was still starting`;
    if (opts.timeoutMs !== undefined) {
      return new DeadlineExceeded("DEADLINE_EXCEEDED", `${why} when the write's timeoutMs (${opts.timeoutMs} ms) passed`);
    }
    const s = this.#caller.conn.resumeWithinMs / 1000;
    return new ConnectionLost("UNAVAILABLE", `${why} after ${s} s (resumeWithin): the write was not applied`);
  }

  /** Close stdin (EOF on a pipe; ^D under a terminal). */
  async closeStdin(opts?: CallOptions): Promise<void> {
    const { processes } = this.#caller.conn;
    const request = { sessionId: this.sessionId, processId: this.id };
    await this.#caller.unary(opts, true, bind(processes.closeStdin, processes, request));
  }

  /**
   * Send a signal to the process group. Not retried: if the connection
   * drops under it, ConnectionLost (it may have been delivered).
   */
  async signal(name: SignalName, opts?: CallOptions): Promise<void> {
    const kind = Object.prototype.hasOwnProperty.call(SIGNALS, name) ? SIGNALS[name] : undefined;
    if (kind === undefined) {
      throw new InvalidArgument("INVALID_ARGUMENT", `unknown signal ${JSON.stringify(name)}`);
    }
    const { processes } = this.#caller.conn;
    const request = { sessionId: this.sessionId, processId: this.id, signal: kind };
    await this.#caller.unary(opts, false, bind(processes.signal, processes, request));
  }

  /** Resize the terminal of a `tty` process. */
  async resize(rows: number, cols: number, opts?: CallOptions): Promise<void> {
    for (const [what, n] of [
      ["rows", rows],
      ["cols", cols],
    ] as const) {
      if (!Number.isInteger(n) || n < 1 || n > 0xffff) {
        throw new InvalidArgument("INVALID_ARGUMENT", `${what} must be an integer from 1 to 65535, not ${n}`);
      }
    }
    const { processes } = this.#caller.conn;
    const request = { sessionId: this.sessionId, processId: this.id, rows, cols };
    await this.#caller.unary(opts, true, bind(processes.resize, processes, request));
  }

  /**
   * SIGKILL the process group; whether it was still running. Retried
   * after a dropped connection (killing twice is harmless), so a retried
   * call may answer false for a kill its first attempt made.
   */
  async terminate(opts?: CallOptions): Promise<boolean> {
    const { processes } = this.#caller.conn;
    const request = { sessionId: this.sessionId, processId: this.id };
    const r = await this.#caller.unary(opts, true, bind(processes.terminate, processes, request));
    return r.running;
  }

  /**
   * Wait for the exit. Reads the events from the last seq an iteration of
   * this handle yielded (output already read is not fetched again), taking
   * the stream `start` opened if no reader has.
   */
  async wait(opts?: CallOptions): Promise<ExitStatus> {
    if (this.exit !== undefined) return this.exit;
    const timeoutMs = opts?.timeoutMs;
    const timeout = new AbortController();
    const { signal, dispose } = anySignal(opts?.signal, timeout.signal);
    const timer =
      timeoutMs === undefined
        ? undefined
        : setTimeout(
            () =>
              timeout.abort(
                new DeadlineExceeded("DEADLINE_EXCEEDED", `process ${this.id} did not exit within ${timeoutMs} ms`),
              ),
            timeoutMs,
          );
    try {
      for await (const ev of this.events({ afterSeq: this.seenSeq, signal })) {
        if (ev.type === "exited") return { exitCode: ev.exitCode, signal: ev.signal };
      }
    } finally {
      clearTimeout(timer);
      dispose();
    }
    // `closed` always follows the exit.
    throw new Internal("INTERNAL", `process ${this.id} closed without an exit status`);
  }

  /** What `console.log` shows: the ids, never the token. */
  [inspect.custom](): string {
    return `Process { id: ${inspect(this.id)}, sessionId: ${inspect(this.sessionId)} }`;
  }

  /** This process as `session.list()` describes it. */
  async info(opts?: CallOptions): Promise<ProcessInfo> {
    const { processes } = this.#caller.conn;
    const r = await this.#caller.unary(opts, true, bind(processes.list, processes, { sessionId: this.sessionId }));
    const p = r.processes.find((x) => x.processId === this.id);
    if (p === undefined) throw new NotFound("NOT_FOUND", `unknown process id ${this.id}`);
    return toProcessInfo(p);
  }
}

/**
 * Start a process, retried with the same id: "already exists" on a retry
 * is the first attempt's doing. `afterDrop`: an earlier call that may have
 * started it (an Exec) broke, so finding it counts from the first attempt.
 */
export async function startProcess(
  caller: Caller,
  request: StartRequest,
  opts: CallOptions | undefined,
  afterDrop = false,
  /** Told as each attempt is sent. */
  attempted?: () => void,
): Promise<void> {
  const { processes } = caller.conn;
  await caller.retrying(opts, true, async (a) => {
    try {
      attempted?.();
      await unaryOnce(bind(processes.start, processes, request), a, opts?.signal);
    } catch (e) {
      // The attempt that broke had started it.
      if ((afterDrop || a.retried) && e instanceof AlreadyExists) return;
      throw e;
    }
  });
}
