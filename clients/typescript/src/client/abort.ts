// AbortSignal helpers: every call takes `{signal}` and rejects with the
// signal's reason (an AbortError unless the caller gave another) once it
// fires.

/** The error an aborted call rejects with. */
export function abortError(signal: AbortSignal): Error {
  const reason: unknown = signal.reason;
  if (reason instanceof Error) return reason;
  return new DOMException(reason === undefined ? "The operation was aborted" : String(reason), "AbortError");
}

export function throwIfAborted(signal: AbortSignal | undefined): void {
  if (signal?.aborted) throw abortError(signal);
}

/**
 * Wait `ms`, or until `signal` fires (then reject with its reason).
 */
export function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise<void>((resolve, reject) => {
    if (signal?.aborted) {
      reject(abortError(signal));
      return;
    }
    const onAbort = (): void => {
      clearTimeout(timer);
      reject(abortError(signal!));
    };
    const timer = setTimeout(
      () => {
        signal?.removeEventListener("abort", onAbort);
        resolve();
      },
      Math.max(0, ms),
    );
    signal?.addEventListener("abort", onAbort, { once: true });
  });
}

/**
 * A signal that fires when any of `signals` does (undefined ones are
 * skipped), and a function that detaches it from them.
 */
export function anySignal(...signals: (AbortSignal | undefined)[]): {
  signal: AbortSignal;
  dispose: () => void;
} {
  const controller = new AbortController();
  const live = signals.filter((s): s is AbortSignal => s !== undefined);
  const listeners: [AbortSignal, () => void][] = [];
  const dispose = (): void => {
    for (const [s, l] of listeners) s.removeEventListener("abort", l);
    listeners.length = 0;
  };
  for (const s of live) {
    if (s.aborted) {
      controller.abort(s.reason);
      break;
    }
    const l = (): void => {
      controller.abort(s.reason);
      dispose();
    };
    s.addEventListener("abort", l, { once: true });
    listeners.push([s, l]);
  }
  return { signal: controller.signal, dispose };
}
