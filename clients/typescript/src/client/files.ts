// Files under the tenant's root, with a session (where it runs) or without.
import { inspect } from "node:util";
import type { ClientWritableStream } from "@grpc/grpc-js";
import type { FileServiceClient, WriteFileRequest, WriteFileResponse } from "../gen/exec_gateway/v1/file.js";
import { abortError, throwIfAborted } from "./abort.js";
import {
  bind,
  bindStream,
  callError,
  grpcOptions,
  Recovery,
  streamOnce,
  withDeadline,
  type Attempt,
  type CallOptions,
  type Caller,
  type UnaryMethod,
} from "./calls.js";
import { Internal, NotFound } from "./errors.js";
import { asBuffer, toBytes } from "./process.js";
import { toDirEntry, toFileStat, toWalkResult, type DirEntry, type FileStat, type WalkResult } from "./types.js";

/** Bytes of one WriteFile message. */
export const FILE_CHUNK_BYTES = 1024 * 1024;

export interface ReadOptions extends CallOptions {
  /** First byte to read. */
  offset?: number;
  /** At most this many bytes; 0 or absent: to the end. */
  length?: number;
}

export interface MkdirOptions extends CallOptions {
  /** Create missing parents too (and succeed if the directory exists). */
  parents?: boolean;
}

export interface RemoveOptions extends CallOptions {
  /** Remove a directory with its contents. */
  recursive?: boolean;
  /** A missing path is not an error. */
  force?: boolean;
}

export interface CopyOptions extends CallOptions {
  /** Required to copy a directory. */
  recursive?: boolean;
}

export interface WalkOptions extends CallOptions {
  /** Deepest level listed; the directory's own entries are level 0 (default 64). */
  maxDepth?: number;
  /** Directories read, the first included (default 10 000). */
  maxDirectories?: number;
  /** Entries returned (default 100 000, the gateway's cap). */
  maxEntries?: number;
  /** Descend into symlinks to directories. */
  followDirectorySymlinks?: boolean;
  /** List a `.hidden` directory but do not descend into it. */
  pruneHiddenDirectories?: boolean;
}

/** What `files.write` takes: bytes, text, or chunks of either. */
export type WriteData = Uint8Array | string | Iterable<Uint8Array | string> | AsyncIterable<Uint8Array | string>;

/** Resolves a relative path against the tenant's root (absolute ones are kept). */
export type Resolve = (path: string, opts: CallOptions | undefined) => Promise<string>;

/** The file operations of a session, or of the tenant's root without one (`sessionId` ""). */
export class Files {
  /** A private field: the channel (and the calls on it) stay out of `util.inspect`, whatever its options. */
  readonly #caller: Caller;

  constructor(
    caller: Caller,
    private readonly sessionId: string,
    private readonly resolve: Resolve,
  ) {
    this.#caller = caller;
  }

  /** What `console.log` shows: whose files, never the token. */
  [inspect.custom](): string {
    return this.sessionId === "" ? "Files { tenant root }" : `Files { sessionId: ${inspect(this.sessionId)} }`;
  }

  /**
   * Stream a file's bytes in chunks (1 MiB each from the gateway). A
   * dropped connection continues from the offset reached.
   */
  async *read(path: string, opts: ReadOptions = {}): AsyncGenerator<Uint8Array, void, undefined> {
    opts = withDeadline(opts);
    const conn = this.#caller.conn;
    const signal = opts.signal;
    const deadline = this.#caller.deadline(opts);
    const full = await this.resolve(path, opts);
    const length = opts.length ?? 0;
    let offset = opts.offset ?? 0;
    let got = 0;
    const recovery = new Recovery(conn, deadline, signal);
    for (;;) {
      throwIfAborted(signal);
      const request = {
        sessionId: this.sessionId,
        path: full,
        offset,
        length: length === 0 ? 0 : length - got,
      };
      const a: Attempt = { md: await conn.metadata(), deadline, retried: recovery.retried };
      try {
        for await (const msg of streamOnce(bindStream(conn.files.readFile, conn.files, request), a, signal)) {
          recovery.progressed();
          // Never past `length`, whatever the gateway sends.
          const data = length !== 0 && got + msg.data.length > length ? msg.data.subarray(0, length - got) : msg.data;
          offset += data.length;
          got += data.length;
          if (data.length > 0) yield data;
          // Done: the stream is cancelled, not read to its end.
          if (length !== 0 && got >= length) return;
        }
        return;
      } catch (e) {
        if (!recovery.mayRetry(e)) throw e;
        if (length !== 0 && got >= length) return;
        await recovery.broke(e);
      }
    }
  }

  /** A whole file (or `offset`/`length` of it). */
  async readBytes(path: string, opts: ReadOptions = {}): Promise<Uint8Array> {
    const parts: Uint8Array[] = [];
    for await (const chunk of this.read(path, opts)) parts.push(chunk);
    return Buffer.concat(parts);
  }

  /** A whole file as UTF-8 text. */
  async readText(path: string, opts: ReadOptions = {}): Promise<string> {
    return new TextDecoder().decode(await this.readBytes(path, opts));
  }

  /**
   * Create or truncate `path` with `data`; the number of bytes written.
   * Bytes and text are sent again whole if the connection drops; chunks
   * from an iterable cannot be, and a drop is a ConnectionLost.
   */
  async write(path: string, data: WriteData, opts: CallOptions = {}): Promise<number> {
    opts = withDeadline(opts);
    const full = await this.resolve(path, opts);
    if (typeof data === "string" || data instanceof Uint8Array) {
      const bytes = toBytes(data);
      return this.#caller.retrying(opts, true, (a) => this.writeOnce(full, chunksOf(bytes), a, opts.signal));
    }
    return this.#caller.retrying(opts, false, (a) => this.writeOnce(full, data, a, opts.signal));
  }

  /** One WriteFile call fed from `chunks`, waiting for the stream to drain. */
  private async writeOnce(
    path: string,
    chunks: Iterable<Uint8Array | string> | AsyncIterable<Uint8Array | string>,
    a: Attempt,
    signal: AbortSignal | undefined,
  ): Promise<number> {
    throwIfAborted(signal);
    const files = this.#caller.conn.files;
    let call: ClientWritableStream<WriteFileRequest> | undefined;
    const answer = new Promise<WriteFileResponse>((resolve, reject) => {
      call = files.writeFile(a.md, grpcOptions(a.deadline), (err, res) =>
        err ? reject(callError(err, signal)) : resolve(res),
      );
    });
    const stream = call!;
    // The answer may come before the last chunk (a refusal): feeding stops.
    let answered = false;
    const settled = answer.then(
      () => void (answered = true),
      () => void (answered = true),
    );
    const onAbort = (): void => stream.cancel();
    signal?.addEventListener("abort", onAbort, { once: true });
    try {
      let first = true;
      const send = async (data: Uint8Array): Promise<void> => {
        const msg: WriteFileRequest = { sessionId: this.sessionId, path: first ? path : "", data: asBuffer(data) };
        first = false;
        if (!stream.write(msg)) {
          // Backpressure: nothing more is queued until grpc-js has sent this.
          await Promise.race([new Promise<void>((r) => stream.once("drain", r)), settled]);
        }
      };
      for await (const chunk of chunks) {
        if (answered) break;
        const bytes = toBytes(chunk);
        for (let at = 0; at < bytes.length && !answered; at += FILE_CHUNK_BYTES) {
          await send(bytes.subarray(at, at + FILE_CHUNK_BYTES));
        }
      }
      // An empty file still needs the message naming it.
      if (first && !answered) await send(new Uint8Array(0));
      stream.end();
    } catch (e) {
      // The chunks' source failed: the call must not complete as if whole.
      stream.cancel();
      throw signal?.aborted ? abortError(signal) : e;
    } finally {
      signal?.removeEventListener("abort", onAbort);
    }
    return (await answer).bytesWritten;
  }

  /**
   * A retried unary call whose request is `{sessionId, path}`, the path
   * resolved under the root, within one deadline.
   */
  async #onPath<Res>(
    path: string,
    opts: CallOptions | undefined,
    method: (files: FileServiceClient) => UnaryMethod<{ sessionId: string; path: string }, Res>,
  ): Promise<Res> {
    const o = withDeadline(opts ?? {});
    const full = await this.resolve(path, o);
    const files = this.#caller.conn.files;
    return this.#caller.unary(o, true, bind(method(files), files, { sessionId: this.sessionId, path: full }));
  }

  /** A directory's entries (readdir order). */
  async list(path: string, opts?: CallOptions): Promise<DirEntry[]> {
    const r = await this.#onPath(path, opts, (f) => f.readDirectory);
    return r.entries.map(toDirEntry);
  }

  /** Metadata of a path (following symlinks, but `isSymlink` is the path's own). */
  async stat(path: string, opts?: CallOptions): Promise<FileStat> {
    return toFileStat(await this.#onPath(path, opts, (f) => f.getMetadata));
  }

  /** Whether a path exists. */
  async exists(path: string, opts?: CallOptions): Promise<boolean> {
    try {
      await this.stat(path, opts);
      return true;
    } catch (e) {
      if (e instanceof NotFound) return false;
      throw e;
    }
  }

  /** Create a directory (with `parents`, its missing parents too). */
  async mkdir(path: string, opts: MkdirOptions = {}): Promise<void> {
    opts = withDeadline(opts);
    const full = await this.resolve(path, opts);
    const files = this.#caller.conn.files;
    const request = { sessionId: this.sessionId, path: full, recursive: opts.parents ?? false };
    await this.#caller.unaryDoneIf(
      opts,
      bind(files.createDirectory, files, request),
      (e) => e instanceof Internal && e.message.startsWith("File exists"),
    );
  }

  /** Remove a path (a symlink itself, never its target). */
  async remove(path: string, opts: RemoveOptions = {}): Promise<void> {
    opts = withDeadline(opts);
    const full = await this.resolve(path, opts);
    const files = this.#caller.conn.files;
    const request = {
      sessionId: this.sessionId,
      path: full,
      recursive: opts.recursive ?? false,
      force: opts.force ?? false,
    };
    await this.#caller.unaryDoneIf(opts, bind(files.remove, files, request), (e) => e instanceof NotFound);
  }

  /** Copy a path (a directory needs `recursive`). */
  async copy(source: string, destination: string, opts: CopyOptions = {}): Promise<void> {
    opts = withDeadline(opts);
    const [src, dst] = [await this.resolve(source, opts), await this.resolve(destination, opts)];
    const files = this.#caller.conn.files;
    const request = {
      sessionId: this.sessionId,
      sourcePath: src,
      destinationPath: dst,
      recursive: opts.recursive ?? false,
    };
    await this.#caller.unary(opts, true, bind(files.copy, files, request));
  }

  /** List a tree breadth first, within limits. */
  async walk(path: string, opts: WalkOptions = {}): Promise<WalkResult> {
    opts = withDeadline(opts);
    const full = await this.resolve(path, opts);
    const files = this.#caller.conn.files;
    const request = {
      sessionId: this.sessionId,
      path: full,
      maxDepth: opts.maxDepth ?? 64,
      maxDirectories: opts.maxDirectories ?? 10_000,
      maxEntries: opts.maxEntries ?? 100_000,
      followDirectorySymlinks: opts.followDirectorySymlinks ?? false,
      pruneHiddenDirectories: opts.pruneHiddenDirectories ?? false,
    };
    const r = await this.#caller.unary(opts, true, bind(files.walk, files, request));
    return toWalkResult(r);
  }

  /** The path with symlinks resolved and `.`/`..` removed. */
  async canonicalize(path: string, opts?: CallOptions): Promise<string> {
    return (await this.#onPath(path, opts, (f) => f.canonicalize)).path;
  }
}

/** Bytes in message-sized pieces (one empty piece for no bytes). */
function* chunksOf(bytes: Uint8Array): Generator<Uint8Array> {
  if (bytes.length === 0) yield bytes;
  for (let at = 0; at < bytes.length; at += FILE_CHUNK_BYTES) yield bytes.subarray(at, at + FILE_CHUNK_BYTES);
}
