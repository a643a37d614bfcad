// One client's channel to the gateway: the target and credentials, the
// generated service stubs sharing it, the token as call metadata, and a
// wait for the channel to be (back) up.
import { readFileSync } from "node:fs";
import { inspect } from "node:util";
import {
  Channel,
  type ChannelOptions,
  connectivityState,
  credentials,
  Metadata,
  type ChannelCredentials,
} from "@grpc/grpc-js";
import { EnvironmentServiceClient } from "../gen/exec_gateway/v1/environment.js";
import { FileServiceClient } from "../gen/exec_gateway/v1/file.js";
import { ProcessServiceClient } from "../gen/exec_gateway/v1/process.js";
import { SessionServiceClient } from "../gen/exec_gateway/v1/session.js";
import { abortError } from "./abort.js";
import { ConnectionLost, DeadlineExceeded, InvalidArgument, Unauthenticated } from "./errors.js";

/** A token, or a function giving the current one before each call. */
export type TokenSource = string | (() => string | Promise<string>);

/** PEM text, a path to a PEM file, or its bytes. */
export type Pem = string | Uint8Array;

export interface ConnectOptions {
  /** Sent as `authorization: Bearer …` on every call. */
  token?: TokenSource;
  /** CA bundle the gateway's certificate must chain to (default: the system roots). */
  ca?: Pem;
  /** A client certificate chain, for gateways that map certificates to tenants. */
  cert?: Pem;
  /** The client certificate's private key. */
  key?: Pem;
  /** Seconds a dropped connection is retried before calls fail with ConnectionLost (60). */
  resumeWithin?: number;
  /** `client_name` of the sessions this client creates (for the gateway's logs). */
  clientName?: string;
  /** HTTP/2 ping interval (15 000 ms): how a silently dead connection is noticed. */
  pingIntervalMs?: number;
  /** How long a ping may go unanswered before the connection is given up (10 000 ms). */
  pingTimeoutMs?: number;
  /**
   * Seconds between the calls that keep an open Session alive (3): under
   * the gateway's detach TTL (10 s for gRPC sessions by default).
   */
  keepaliveInterval?: number;
  /** Send the token over plaintext (`grpc://`) to a host that is not loopback. */
  allowPlaintext?: boolean;
  /** Extra grpc-js channel options (they win over the SDK's). */
  channelOptions?: ChannelOptions;
}

export const DEFAULT_RESUME_WITHIN_S = 60;

export const DEFAULT_KEEPALIVE_INTERVAL_S = 3;

/** The gateway's message limit (docs/protocol.md, "gRPC"). */
export const MAX_MESSAGE_BYTES = 16 * 1024 * 1024;

interface Target {
  address: string;
  tls: boolean;
}

/** `grpc://H:P` (plaintext), `grpcs://H:P` (TLS); a bare `H:P` is `grpc://`. */
export function parseTarget(target: string): Target {
  const m = /^([a-z][a-z0-9+.-]*):\/\/(.*)$/i.exec(target);
  const [scheme, rest] = m ? [m[1]!.toLowerCase(), m[2]!] : ["grpc", target];
  const address = rest.replace(/\/+$/, "");
  if (address === "" || address.includes("/")) {
    throw new InvalidArgument("INVALID_ARGUMENT", `not a gateway address: ${JSON.stringify(target)}`);
  }
  switch (scheme) {
    case "grpc":
    case "http":
      return { address, tls: false };
    case "grpcs":
    case "https":
      return { address, tls: true };
    default:
      throw new InvalidArgument(
        "INVALID_ARGUMENT",
        `unsupported scheme ${JSON.stringify(scheme)}: use grpc://HOST:PORT or grpcs://HOST:PORT`,
      );
  }
}

/** Whether `address` (`HOST:PORT`) is a loopback host. */
export function isLoopback(address: string): boolean {
  const host = address
    .replace(/:\d+$/, "")
    .replace(/^\[(.*)\]$/, "$1")
    .toLowerCase();
  if (host === "localhost" || host === "::1") return true;
  return /^127\.\d+\.\d+\.\d+$/.test(host);
}

/** PEM given as text is used as is; any other string is a file's path. */
export function loadPem(pem: Pem): Buffer {
  if (typeof pem !== "string") return Buffer.from(pem);
  if (pem.includes("-----BEGIN ")) return Buffer.from(pem, "utf8");
  return readFileSync(pem);
}

function channelCredentials(target: Target, opts: ConnectOptions): ChannelCredentials {
  const hasCert = opts.cert !== undefined;
  if (hasCert !== (opts.key !== undefined)) {
    throw new InvalidArgument("INVALID_ARGUMENT", "cert and key go together");
  }
  if (!target.tls) {
    if (opts.ca !== undefined || hasCert) {
      throw new InvalidArgument("INVALID_ARGUMENT", "ca, cert and key need a grpcs:// target");
    }
    return credentials.createInsecure();
  }
  return credentials.createSsl(
    opts.ca === undefined ? null : loadPem(opts.ca),
    opts.key === undefined ? null : loadPem(opts.key),
    opts.cert === undefined ? null : loadPem(opts.cert),
  );
}

export class Connection {
  readonly channel: Channel;
  readonly sessions: SessionServiceClient;
  readonly processes: ProcessServiceClient;
  readonly files: FileServiceClient;
  readonly environment: EnvironmentServiceClient;
  readonly resumeWithinMs: number;
  readonly keepaliveIntervalMs: number;
  readonly clientName: string;
  readonly target: string;
  /**
   * Whether the gateway was ever reached (the channel connected to it, or
   * it answered a call): until then a failed call is an error at once (a
   * wrong address or port); after, even under the first call, a broken
   * connection is a drop to ride out like any other.
   */
  reached = false;
  /**
   * A private field: neither `console.log` nor `util.inspect` (whatever its
   * options) shows it, and the class's own inspection leaves it out.
   */
  readonly #token: TokenSource | undefined;
  private closed = false;

  constructor(target: string, opts: ConnectOptions) {
    const t = parseTarget(target);
    if (opts.token === undefined && opts.cert === undefined) {
      throw new Unauthenticated("UNAUTHENTICATED", "a token or a client certificate (cert and key) is needed");
    }
    if (!t.tls && opts.token !== undefined && !isLoopback(t.address) && !opts.allowPlaintext) {
      // A bearer token in the clear is anyone's on the path to the gateway.
      throw new InvalidArgument(
        "INVALID_ARGUMENT",
        `refusing to send a token over plaintext to ${t.address}: use grpcs:// ` +
          "(or allowPlaintext on a network you trust)",
      );
    }
    const creds = channelCredentials(t, opts);
    this.target = target;
    const resumeWithin = opts.resumeWithin ?? DEFAULT_RESUME_WITHIN_S;
    if (!(resumeWithin >= 0)) {
      throw new InvalidArgument("INVALID_ARGUMENT", "resumeWithin must be a number of seconds >= 0");
    }
    this.resumeWithinMs = resumeWithin * 1000;
    const keepalive = opts.keepaliveInterval ?? DEFAULT_KEEPALIVE_INTERVAL_S;
    if (!(keepalive > 0)) {
      throw new InvalidArgument("INVALID_ARGUMENT", "keepaliveInterval must be a positive number of seconds");
    }
    this.keepaliveIntervalMs = keepalive * 1000;
    this.clientName = opts.clientName ?? "exec-gateway-typescript";
    this.#token = opts.token;
    const options: ChannelOptions = {
      // This client's own connection: closing it, or a dead one, is not
      // shared with other clients of the same target in the process.
      "grpc.use_local_subchannel_pool": 1,
      // Pings notice a connection that died without a FIN or RST.
      "grpc.keepalive_time_ms": opts.pingIntervalMs ?? 15_000,
      "grpc.keepalive_timeout_ms": opts.pingTimeoutMs ?? 10_000,
      "grpc.keepalive_permit_without_calls": 1,
      // Reconnect promptly: a resume is only worth it within resumeWithin.
      "grpc.initial_reconnect_backoff_ms": 250,
      "grpc.max_reconnect_backoff_ms": 2_000,
      "grpc.max_receive_message_length": MAX_MESSAGE_BYTES + 64 * 1024,
      "grpc.max_send_message_length": MAX_MESSAGE_BYTES,
      // A 1 MiB window per stream: output streams fast, while what waits
      // here for a slow reader stays bounded (this window and grpc-js's 16
      // buffered messages; then the gateway holds the process back).
      "grpc-node.flow_control_window": 1024 * 1024,
      // A plaintext call goes straight to the gateway, never through an
      // HTTP proxy named by http_proxy / grpc_proxy: the token would be in
      // the clear to the proxy (and to whatever lies between). Through
      // TLS, the proxy sees only a tunnel.
      ...(t.tls ? {} : { "grpc.enable_http_proxy": 0 }),
      ...opts.channelOptions,
    };
    this.channel = new Channel(t.address, creds, options);
    const stub = { channelOverride: this.channel };
    this.sessions = new SessionServiceClient(t.address, creds, stub);
    this.processes = new ProcessServiceClient(t.address, creds, stub);
    this.files = new FileServiceClient(t.address, creds, stub);
    this.environment = new EnvironmentServiceClient(t.address, creds, stub);
    this.watchReady(this.channel.getConnectivityState(false));
  }

  /**
   * Sets `reached` once the channel is connected to the gateway (TCP, TLS
   * and HTTP/2 settings done), before any call's answer. grpc-js calls a
   * watcher as the state changes; with no deadline it holds no timer.
   */
  private watchReady(state: connectivityState): void {
    if (state === connectivityState.READY) {
      this.reached = true;
      return;
    }
    if (state === connectivityState.SHUTDOWN) return;
    try {
      this.channel.watchConnectivityState(state, Infinity, (err) => {
        if (err === undefined) this.watchReady(this.channel.getConnectivityState(false));
      });
    } catch {
      // The channel is closed.
    }
  }

  /** Call metadata: the current token, when there is one. */
  async metadata(): Promise<Metadata> {
    const md = new Metadata();
    const token = typeof this.#token === "function" ? await this.#token() : this.#token;
    if (token !== undefined && token !== "") md.set("authorization", `Bearer ${token}`);
    return md;
  }

  /** The error for a gateway never reached (no connection made): not retried. */
  unreachable(e: Error): ConnectionLost {
    return new ConnectionLost("UNAVAILABLE", `cannot reach the gateway at ${this.target}: ${e.message}`, undefined, {
      cause: e,
    });
  }

  /** Whether the token can change between calls. */
  get rotatingToken(): boolean {
    return typeof this.#token === "function";
  }

  get isClosed(): boolean {
    return this.closed;
  }

  /**
   * After a call broke with the connection: return once the channel is
   * connected again or has moved on from the state it is in (a new
   * connection attempt, which the next call waits through). Past `lostBy`
   * (the resume bound) reject with ConnectionLost saying `why`; past
   * `deadline` (the call's own) with DeadlineExceeded; on abort with the
   * signal's reason.
   */
  async awaitReconnect(
    lostBy: number,
    deadline: number | undefined,
    signal: AbortSignal | undefined,
    why: string,
  ): Promise<void> {
    if (this.closed) throw new ConnectionLost("UNAVAILABLE", "the client was closed");
    if (signal?.aborted) throw abortError(signal);
    // `true`: an idle channel starts connecting.
    const state = this.channel.getConnectivityState(true);
    if (state === connectivityState.READY) return;
    const now = Date.now();
    if (deadline !== undefined && now >= deadline) {
      throw new DeadlineExceeded(
        "DEADLINE_EXCEEDED",
        `the call's deadline passed while the gateway was unreachable: ${why}`,
      );
    }
    if (now >= lostBy) {
      throw new ConnectionLost(
        "UNAVAILABLE",
        `the gateway could not be reached within ${this.resumeWithinMs / 1000} s: ${why}`,
      );
    }
    await this.stateChange(state, Math.min(lostBy, deadline ?? Infinity), signal);
    if (signal?.aborted) throw abortError(signal);
  }

  /** Wait for the channel to leave `state`, until `until`, or abort. */
  private stateChange(state: connectivityState, until: number, signal: AbortSignal | undefined): Promise<void> {
    return new Promise<void>((resolve) => {
      let settled = false;
      const done = (): void => {
        if (settled) return;
        settled = true;
        clearTimeout(timer);
        signal?.removeEventListener("abort", done);
        resolve();
      };
      // No deadline on the watcher (grpc-js would keep a timer of its own
      // alive until it); ours is cleared as soon as the state changes.
      const timer = setTimeout(done, Math.max(0, until - Date.now()));
      signal?.addEventListener("abort", done, { once: true });
      try {
        this.channel.watchConnectivityState(state, Infinity, done);
      } catch {
        // The channel was shut down meanwhile: `ready` says so next round.
        done();
      }
    });
  }

  close(): void {
    if (this.closed) return;
    this.closed = true;
    this.channel.close();
  }

  /** What `console.log` shows: the target, never the token. */
  [inspect.custom](): string {
    return `Connection { target: ${inspect(this.target)}${this.closed ? ", closed" : ""} }`;
  }
}
