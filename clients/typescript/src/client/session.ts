// A session: its processes, its files, where it runs.
import { randomUUID } from "node:crypto";
import path from "node:path";
import { inspect } from "node:util";
import { EnvInherit, type ProcessSpec } from "../gen/exec_gateway/v1/process.js";
import { bind, withDeadline, type CallOptions, type Caller } from "./calls.js";
import { NotFound } from "./errors.js";
import { Files, type Resolve } from "./files.js";
import { connectPort, portForward, type PortConnection, type PortForward, type PortForwardOptions } from "./forward.js";
import { launch } from "./launch.js";
import { Process } from "./process.js";
import { runCommand } from "./run.js";
import {
  toEnvironmentInfo,
  toPreview,
  toPreviews,
  toProcessInfo,
  toSnapshot,
  type EnvironmentInfo,
  type Preview,
  type Previews,
  type ProcessInfo,
  type RunResult,
  type Snapshot,
} from "./types.js";

export interface SnapshotOptions extends CallOptions {
  /** 1-128 bytes. */
  name?: string;
  /** At most 32; keys of 1-63 letters, digits and `-_./`. */
  labels?: Record<string, string>;
}

export interface PreviewOptions extends CallOptions {
  /** Open the port to anyone until `revokePreview`, instead of a signed URL. */
  public?: boolean;
  /** How long a signed URL lasts (default: the gateway's `url_ttl`, 1 h; at most its `max_url_ttl`). */
  expiresInSecs?: number;
}

export interface SpawnOptions {
  /** Working directory: absolute, or relative to the tenant's root (the default). */
  cwd?: string;
  /** Variables laid over the tenant's base environment. */
  env?: Record<string, string>;
  /** Run under a terminal (24×80 until resized); its output is stream `pty`. */
  tty?: boolean;
  /** The process's id, unique in the session (default: a fresh random one). */
  processId?: string;
}

export interface RunOptions extends SpawnOptions {
  /** Kill the process and raise CommandTimeout after this many ms. */
  timeoutMs?: number;
  /** Aborting kills the process; `run` rejects with the signal's reason. */
  signal?: AbortSignal;
  /** Written to the process's stdin, then closed, while its output is read. */
  stdin?: string | Uint8Array;
  /** Past this much output (stdout and stderr together; 64 MiB), OutputLimitExceeded. */
  maxOutputBytes?: number;
}

export interface StartOptions extends SpawnOptions, CallOptions {
  /** Keep a writable stdin pipe (`process.write`); a terminal always has one. */
  stdin?: boolean;
}

/** Resolves paths against the tenant root, looked up once. */
export class RootResolver {
  private root: Promise<string> | undefined;

  constructor(private readonly lookup: (opts: CallOptions | undefined) => Promise<EnvironmentInfo>) {}

  /** The root, as an environment lookup made for another reason found it. */
  learn(root: string): void {
    this.root ??= Promise.resolve(root);
  }

  /** A path as the gateway wants it: absolute, relative ones under the root. */
  readonly resolve: Resolve = async (p, opts) => {
    if (p.startsWith("/")) return p;
    return path.posix.join(await this.rootDir(opts), p);
  };

  private rootDir(opts: CallOptions | undefined): Promise<string> {
    if (this.root === undefined) {
      const pending = this.lookup(opts).then((info) => info.cwd);
      this.root = pending;
      // A failed lookup is not remembered: the next call asks again.
      pending.catch(() => {
        if (this.root === pending) this.root = undefined;
      });
    }
    return this.root;
  }
}

/**
 * A session: processes and the files where they run. While this object is
 * open (not closed or detached, its client not closed) a call every
 * `keepaliveInterval` keeps the gateway from expiring it; after that it
 * lives the gateway's detach TTL, to be resumed.
 */
export class Session {
  /** Files where this session runs. */
  readonly files: Files;
  private readonly paths: RootResolver;
  /** A private field: the channel (and the calls on it) stay out of `util.inspect`, whatever its options. */
  readonly #caller: Caller;
  private keepalive: NodeJS.Timeout | undefined;
  private pinging = false;

  constructor(
    caller: Caller,
    /** The session's id: pass it to `client.session({resume})` to pick it up elsewhere. */
    readonly id: string,
    private readonly forget: (s: Session) => void,
  ) {
    this.#caller = caller;
    this.paths = new RootResolver((opts) => this.environmentInfo(opts));
    this.files = new Files(caller, id, this.paths.resolve);
    this.keepalive = setInterval(() => void this.ping(), caller.conn.keepaliveIntervalMs);
    // It keeps the session alive, not this process.
    this.keepalive.unref();
  }

  /** One keepalive call; the next real call reports what goes wrong. */
  private async ping(): Promise<void> {
    if (this.pinging || this.#caller.conn.isClosed) return;
    this.pinging = true;
    const { sessions } = this.#caller.conn;
    try {
      const opts = { timeoutMs: this.#caller.conn.keepaliveIntervalMs * 2 };
      await this.#caller.unary(opts, false, bind(sessions.resumeSession, sessions, { sessionId: this.id }));
    } catch (e) {
      // Gone for good: nothing left to keep alive. Anything else (a drop,
      // a busy gateway) is for the next real call to meet and report.
      if (e instanceof NotFound) this.detach();
    } finally {
      this.pinging = false;
    }
  }

  /**
   * Stop keeping the session alive (it then lives the gateway's detach
   * TTL, to be resumed by id). Calls on it still work.
   */
  detach(): void {
    clearInterval(this.keepalive);
    this.keepalive = undefined;
    this.forget(this);
  }

  /** Where the session runs: shell, cwd (the tenant root), home, platform, capabilities. */
  async environmentInfo(opts?: CallOptions): Promise<EnvironmentInfo> {
    const env = this.#caller.conn.environment;
    const r = await this.#caller.unary(opts, true, bind(env.getInfo, env, { sessionId: this.id }));
    const info = toEnvironmentInfo(r);
    this.paths.learn(info.cwd);
    return info;
  }

  private async spec(
    argv: readonly string[],
    processId: string,
    opts: StartOptions,
    call: CallOptions | undefined,
  ): Promise<ProcessSpec> {
    const tty = opts.tty ?? false;
    return {
      processId,
      argv: [...argv],
      // The gateway wants an absolute cwd: none means the tenant's root.
      cwd: await this.paths.resolve(opts.cwd ?? ".", call),
      env: {},
      tty,
      pipeStdin: (opts.stdin ?? false) && !tty,
      // The tenant's whole base environment with `env` laid over it.
      envPolicy: {
        inherit: EnvInherit.ENV_INHERIT_ALL,
        ignoreDefaultExcludes: false,
        exclude: [],
        set: { ...opts.env },
        includeOnly: [],
      },
    };
  }

  /**
   * Run a command to its end and collect its output. With `timeoutMs`, the
   * process is killed when it passes and CommandTimeout (with the output so
   * far) is raised; past `maxOutputBytes`, OutputLimitExceeded; aborting
   * `signal` kills it too.
   */
  run(argv: readonly string[], opts: RunOptions = {}): Promise<RunResult> {
    return runCommand(this, argv, opts);
  }

  /**
   * Start a process; its handle streams events and takes stdin and signals.
   * Its output waits for the first reader (iterating it, or `wait`), the
   * process blocking on a full pipe meanwhile as with a local pipe. Read it
   * promptly: a stream left unread for the gateway's slow-client timeout
   * (30 s) is dropped, and then only the newest 1 MiB is retained.
   * Given up on (`signal`, `timeoutMs`) before the gateway said whether it
   * started, the start is seen through and the process killed before this
   * rejects: nothing is left running.
   */
  async start(argv: readonly string[], opts: StartOptions = {}): Promise<Process> {
    const processId = opts.processId ?? randomUUID();
    // One deadline for the root's lookup (for a relative cwd) and the start.
    const bounded = withDeadline(opts);
    const spec = await this.spec(argv, processId, bounded, bounded);
    const held = await launch(this.#caller, { sessionId: this.id, spec }, bounded);
    return new Process(this.#caller, this.id, processId, held);
  }

  /** What `console.log` shows: the id, never the token. */
  [inspect.custom](): string {
    return `Session { id: ${inspect(this.id)} }`;
  }

  /** The handle of a process started earlier, by this client or another. */
  process(processId: string): Process {
    return new Process(this.#caller, this.id, processId);
  }

  /**
   * Save the session's workspace as it is now (its processes held still
   * for the copy); fork sessions from it with `client.fork`. Needs the
   * token's `snapshot` scope.
   */
  async snapshot(opts: SnapshotOptions = {}): Promise<Snapshot> {
    const { sessions } = this.#caller.conn;
    const r = await this.#caller.unary(
      opts,
      false,
      bind(sessions.createSnapshot, sessions, {
        sessionId: this.id,
        name: opts.name ?? "",
        labels: opts.labels ?? {},
      }),
    );
    if (!r.snapshot) throw new TypeError("the gateway answered CreateSnapshot without a snapshot");
    return toSnapshot(r.snapshot);
  }

  /**
   * A TCP stream to `port` on the session's own loopback, made by the
   * gateway inside the tenant's network (docs/forward.md): `send` and
   * `receive` bytes, `end` (half-close), `close`. Needs the `forward` scope.
   */
  connectPort(port: number): Promise<PortConnection> {
    return connectPort(this.#caller, this.id, port);
  }

  /**
   * Listen on a local port (default: a free one on 127.0.0.1; `address`
   * says which); each connection accepted becomes a stream to `port` on
   * the session's loopback. `close()` stops it. A refusal rejects here,
   * before listening.
   */
  portForward(port: number, opts: PortForwardOptions = {}): Promise<PortForward> {
    return portForward(this.#caller, this.id, port, opts);
  }

  /**
   * Preview `port` on the session's own loopback over HTTP (docs/preview.md):
   * a signed URL (`url`, a credential: anyone holding it opens the port until
   * it expires or is revoked), or with `public` the port open to anyone until
   * `revokePreview`. `path` is the preview's path on the gateway's client
   * listener, for token holders. Needs the `preview` scope; InvalidArgument
   * for a port of 0, an expiry past the gateway's `max_url_ttl` or on a
   * public preview, or a signed URL from a gateway without `[preview] base_url`.
   */
  async createPreview(port: number, opts: PreviewOptions = {}): Promise<Preview> {
    const { sessions } = this.#caller.conn;
    // A retry mints another URL at worst: the lost answer's is never seen.
    const r = await this.#caller.unary(
      opts,
      true,
      bind(sessions.createPreview, sessions, {
        sessionId: this.id,
        port,
        public: opts.public ?? false,
        expiresInSecs: opts.expiresInSecs ?? 0,
      }),
    );
    if (!r.preview) throw new TypeError("the gateway answered CreatePreview without a preview");
    return toPreview(r.preview);
  }

  /**
   * End every URL minted for `port` so far and its public state, and close
   * the connections they let in (a URL minted after it works).
   */
  async revokePreview(port: number, opts?: CallOptions): Promise<void> {
    const { sessions } = this.#caller.conn;
    await this.#caller.unary(opts, true, bind(sessions.revokePreview, sessions, { sessionId: this.id, port }));
  }

  /** The session's ports with preview state, and the connections open into them through previews. */
  async listPreviews(opts?: CallOptions): Promise<Previews> {
    const { sessions } = this.#caller.conn;
    const r = await this.#caller.unary(opts, true, bind(sessions.listPreviews, sessions, { sessionId: this.id }));
    return toPreviews(r);
  }

  /** The session's processes. */
  async list(opts?: CallOptions): Promise<ProcessInfo[]> {
    const { processes } = this.#caller.conn;
    const r = await this.#caller.unary(opts, true, bind(processes.list, processes, { sessionId: this.id }));
    return r.processes.map(toProcessInfo);
  }

  /** End the session now and kill its processes. */
  async close(opts?: CallOptions): Promise<void> {
    this.detach();
    const { sessions } = this.#caller.conn;
    await this.#caller.unaryDoneIf(
      opts,
      bind(sessions.closeSession, sessions, { sessionId: this.id }),
      (e) => e instanceof NotFound,
    );
  }
}
