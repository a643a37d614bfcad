// Small helpers the tests share.
import type { Process, ProcessEvent } from "@exec-gateway/client";

const decoder = new TextDecoder();

export function text(data: Uint8Array): string {
  return decoder.decode(data);
}

/** Every event of an iteration, and the output of each stream as text. */
export async function drain(events: AsyncIterable<ProcessEvent>): Promise<{
  events: ProcessEvent[];
  stdout: string;
  stderr: string;
  pty: string;
}> {
  const all: ProcessEvent[] = [];
  const out: Record<"stdout" | "stderr" | "pty", Uint8Array[]> = { stdout: [], stderr: [], pty: [] };
  for await (const ev of events) {
    all.push(ev);
    if (ev.type === "output") out[ev.stream].push(ev.data);
  }
  return {
    events: all,
    stdout: text(Buffer.concat(out.stdout)),
    stderr: text(Buffer.concat(out.stderr)),
    pty: text(Buffer.concat(out.pty)),
  };
}

/**
 * Read `p`'s events until `predicate` holds for the output so far; the
 * iterator stays open for more (return it when done).
 */
export async function readUntil(
  it: AsyncIterator<ProcessEvent>,
  predicate: (output: string) => boolean,
): Promise<{ output: string; events: ProcessEvent[] }> {
  let output = "";
  const events: ProcessEvent[] = [];
  while (!predicate(output)) {
    const n = await it.next();
    if (n.done) throw new Error(`events ended before the output matched; got ${JSON.stringify(output)}`);
    events.push(n.value);
    if (n.value.type === "output") output += text(n.value.data);
  }
  return { output, events };
}

/** Poll `check` every 20 ms until it holds (it throws or returns false meanwhile), at most `ms`. */
export async function eventually<T>(check: () => Promise<T | false>, ms = 10_000): Promise<T> {
  const until = Date.now() + ms;
  let last: unknown;
  for (;;) {
    try {
      const r = await check();
      if (r !== false) return r;
    } catch (e) {
      last = e;
    }
    if (Date.now() > until) {
      throw new Error(`condition not met within ${ms} ms${last ? `: ${String(last)}` : ""}`);
    }
    await new Promise((r) => setTimeout(r, 20));
  }
}

/** Events whose seqs are strictly increasing by one from `first`. */
export function assertContiguous(events: ProcessEvent[], first = 1): void {
  events.forEach((ev, i) => {
    if (ev.seq !== first + i) {
      throw new Error(
        `event ${i} has seq ${ev.seq}, expected ${first + i}: ${JSON.stringify(events.map((e) => e.seq))}`,
      );
    }
  });
}

/** The handle's events as an iterator (to read a part, then more). */
export function iterate(p: Process, afterSeq = 0, signal?: AbortSignal): AsyncIterator<ProcessEvent> {
  return p.events({ afterSeq, ...(signal ? { signal } : {}) })[Symbol.asyncIterator]();
}
