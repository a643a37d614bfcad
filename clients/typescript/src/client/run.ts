// `session.run`: start a command, feed it stdin, collect its output up to a
// limit, and make sure it does not outlive the run when the run gives up.
import { randomUUID } from "node:crypto";
import { anySignal } from "./abort.js";
import { CommandTimeout, ExecGatewayError, NotFound, OutputLimitExceeded, StdinClosed } from "./errors.js";
import { toBytes, type Process } from "./process.js";
import { RunResult, type ExitStatus } from "./types.js";
import type { RunOptions, Session } from "./session.js";

/** How much output (stdout and stderr together) `run` holds by default. */
export const RUN_MAX_OUTPUT_BYTES = 64 * 1024 * 1024;

/** How long `run` waits for a process it killed to be seen ending. */
const KILL_WAIT_MS = 10_000;

/** The run's output passed its limit (internal). */
class TooMuchOutput extends Error {}

/** Collected output, bounded by the limit the run was given. */
class Collected {
  readonly stdout: Uint8Array[] = [];
  readonly stderr: Uint8Array[] = [];
  private bytes = 0;

  constructor(private readonly max: number) {}

  add(stream: string, data: Uint8Array): void {
    this.bytes += data.length;
    if (this.bytes > this.max) {
      // What fits is kept, for the error.
      const room = data.length - (this.bytes - this.max);
      if (room > 0) (stream === "stderr" ? this.stderr : this.stdout).push(data.subarray(0, room));
      throw new TooMuchOutput();
    }
    (stream === "stderr" ? this.stderr : this.stdout).push(data);
  }

  out(): Buffer {
    return Buffer.concat(this.stdout);
  }

  err(): Buffer {
    return Buffer.concat(this.stderr);
  }
}

export async function runCommand(session: Session, argv: readonly string[], opts: RunOptions): Promise<RunResult> {
  const processId = opts.processId ?? randomUUID();
  const name = JSON.stringify(argv[0] ?? "");
  const timeout = new AbortController();
  const { signal, dispose } = anySignal(opts.signal, timeout.signal);
  const timer =
    opts.timeoutMs === undefined ? undefined : setTimeout(() => timeout.abort(), Math.max(0, opts.timeoutMs));
  const collected = new Collected(opts.maxOutputBytes ?? RUN_MAX_OUTPUT_BYTES);
  let proc: Process | undefined;
  let exit: ExitStatus | undefined;
  try {
    proc = await session.start(argv, {
      ...(opts.cwd === undefined ? {} : { cwd: opts.cwd }),
      ...(opts.env === undefined ? {} : { env: opts.env }),
      tty: opts.tty ?? false,
      stdin: opts.stdin !== undefined,
      processId,
      signal,
    });
    const feeding = opts.stdin === undefined ? undefined : feed(proc, toBytes(opts.stdin), signal);
    // Awaited below; if the output fails first, that failure is the one
    // reported (and the process killed), so this one must not go unhandled.
    feeding?.catch(() => undefined);
    for await (const ev of proc.events({ signal })) {
      if (ev.type === "output") collected.add(ev.stream, ev.data);
      else if (ev.type === "exited") exit = { exitCode: ev.exitCode, signal: ev.signal };
      else if (ev.type === "outputLost") {
        throw new ExecGatewayError(
          "DATA_LOSS",
          `${ev.chunks} chunks of output from seq ${ev.seq} are no longer retained by the gateway`,
        );
      }
    }
    await feeding;
  } catch (e) {
    if (e instanceof TooMuchOutput) {
      await kill(session, proc, processId, e);
      throw new OutputLimitExceeded(
        `${name} printed more than maxOutputBytes (${opts.maxOutputBytes ?? RUN_MAX_OUTPUT_BYTES})`,
        collected.out(),
        collected.err(),
      );
    }
    // Ours to end: the process must not outlive a run that gave up on it.
    if (signal.aborted || (e instanceof ExecGatewayError && e.code === "DATA_LOSS")) {
      await kill(session, proc, processId, e);
    }
    if (timeout.signal.aborted && !opts.signal?.aborted) {
      throw new CommandTimeout(
        `${name} ran past its timeout of ${opts.timeoutMs} ms`,
        collected.out(),
        collected.err(),
      );
    }
    throw e;
  } finally {
    clearTimeout(timer);
    dispose();
  }
  if (exit === undefined) throw new ExecGatewayError("INTERNAL", `process ${processId} closed without an exit status`);
  return new RunResult(collected.out(), collected.err(), exit.exitCode, exit.signal, processId);
}

/**
 * `data` to the process's stdin, then EOF. A process that closed its stdin
 * (or exited) before taking it all did not want the rest: not an error.
 */
async function feed(proc: Process, data: Uint8Array, signal: AbortSignal): Promise<void> {
  try {
    if (data.length > 0) await proc.write(data, { signal });
    await proc.closeStdin({ signal });
  } catch (e) {
    if (e instanceof StdinClosed) return;
    throw e;
  }
}

/**
 * Kill a process the run gives up on, and see it end, before the caller
 * hears why. A process already gone is fine; a kill that fails is raised
 * (with the reason for the kill as its cause), since the process may live.
 */
async function kill(session: Session, proc: Process | undefined, processId: string, reason: unknown): Promise<void> {
  // `start` may have been cut short after the gateway started it.
  const handle = proc ?? session.process(processId);
  try {
    await handle.terminate({ timeoutMs: KILL_WAIT_MS });
    await handle.wait({ timeoutMs: KILL_WAIT_MS });
  } catch (e) {
    if (e instanceof NotFound) return;
    if (e instanceof Error && e.cause === undefined) Object.defineProperty(e, "cause", { value: reason });
    throw e;
  }
}
