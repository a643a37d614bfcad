// Port forwarding (docs/forward.md): a TCP stream to a port on a session's
// own loopback, over `SessionService/ForwardPort`. `session.connectPort`
// gives one stream to send and receive bytes on; `session.portForward`
// listens on a local port and makes each connection it accepts a stream
// of its own.
import { once } from "node:events";
import net from "node:net";
import { status, type ClientDuplexStream, type ServiceError } from "@grpc/grpc-js";
import type { ForwardPortRequest, ForwardPortResponse } from "../gen/exec_gateway/v1/session.js";
import type { Caller } from "./calls.js";
import { ExecGatewayError, isServiceError, statusError } from "./errors.js";

/** Most bytes of one message either way (the gateway's bound); `send` splits larger data. */
export const FORWARD_CHUNK_BYTES = 64 * 1024;

/** Responses held unread before the stream is paused (each at most 64 KiB). */
const HELD_RESPONSES = 2;

/**
 * The gateway's UNAVAILABLE answers of a forward (nothing listening, the
 * session ended…), which are not a dropped connection.
 */
const GATEWAY_UNAVAILABLE =
  /^(nothing accepts connections|the session ended|the connection reached its maximum age|the server's connection failed)/;

/** What a failed ForwardPort call raises. */
function forwardError(e: ServiceError): ExecGatewayError {
  const message = e.details || e.message;
  if (e.code === status.UNAVAILABLE && GATEWAY_UNAVAILABLE.test(message)) {
    return new ExecGatewayError("UNAVAILABLE", message);
  }
  // The tenant's network, not a session's attachment.
  if (e.code === status.FAILED_PRECONDITION) return new ExecGatewayError("FAILED_PRECONDITION", message);
  return statusError(e);
}

/**
 * One forwarded TCP stream: `send` bytes to the server, `receive` its
 * bytes (`null` once it closed its side, everything delivered), `end` to
 * end what is sent (the server reads the end of its input; what it says
 * goes on arriving), `close` to end it now. An end for any other reason
 * (the session ended, the token expired, nothing more accepted) rejects
 * `receive` or `send` with the gateway's error.
 */
export class PortConnection implements AsyncIterable<Buffer> {
  readonly #call: ClientDuplexStream<ForwardPortRequest, ForwardPortResponse>;
  readonly #queue: ForwardPortResponse[] = [];
  #ended = false;
  #closed = false;
  #error: Error | undefined;
  #wake: (() => void) | undefined;

  /** @internal */
  constructor(
    call: ClientDuplexStream<ForwardPortRequest, ForwardPortResponse>,
    /** The session's port. */
    readonly port: number,
  ) {
    this.#call = call;
    call.on("data", (m: ForwardPortResponse) => {
      this.#queue.push(m);
      if (this.#queue.length >= HELD_RESPONSES) call.pause();
      this.#notify();
    });
    call.on("error", (e: unknown) => {
      this.#error ??= isServiceError(e) ? forwardError(e) : (e as Error);
      this.#notify();
    });
    call.on("end", () => {
      this.#ended = true;
      this.#notify();
    });
  }

  #notify(): void {
    const wake = this.#wake;
    this.#wake = undefined;
    wake?.();
  }

  /** The next response; `null` at the end of the call (OK). */
  async next(): Promise<ForwardPortResponse | null> {
    for (;;) {
      const m = this.#queue.shift();
      if (m !== undefined) {
        if (this.#queue.length < HELD_RESPONSES) this.#call.resume();
        return m;
      }
      if (this.#closed) return null;
      if (this.#error !== undefined) throw this.#error;
      if (this.#ended) return null;
      await new Promise<void>((resolve) => (this.#wake = resolve));
    }
  }

  /** The server's next bytes (at most 64 KiB); `null` once it closed its side. */
  async receive(): Promise<Buffer | null> {
    for (;;) {
      const m = await this.next();
      if (m === null) return null;
      if (m.kind?.$case === "data") return m.kind.data;
    }
  }

  async *[Symbol.asyncIterator](): AsyncIterator<Buffer> {
    for (let chunk = await this.receive(); chunk !== null; chunk = await this.receive()) yield chunk;
  }

  /** Send `data` to the server, in messages of at most 64 KiB, waiting while the stream is full. */
  async send(data: string | Uint8Array): Promise<void> {
    const bytes = typeof data === "string" ? Buffer.from(data) : Buffer.from(data.buffer, data.byteOffset, data.byteLength);
    for (let i = 0; i < bytes.length; i += FORWARD_CHUNK_BYTES) {
      if (this.#error !== undefined) throw this.#error;
      if (this.#closed || this.#ended) throw new ExecGatewayError("CANCELLED", "the forward is closed");
      const chunk = bytes.subarray(i, i + FORWARD_CHUNK_BYTES);
      if (!this.#call.write({ kind: { $case: "data", data: chunk } })) {
        const ended = new Promise<void>((resolve) => {
          this.#call.once("status", () => resolve());
        });
        await Promise.race([once(this.#call, "drain"), ended]);
      }
    }
    if (this.#error !== undefined) throw this.#error;
  }

  /** End what is sent: the server reads the end of its input. */
  end(): void {
    this.#call.end();
  }

  /** End the stream now (the gateway closes the connection). */
  close(): void {
    if (this.#closed) return;
    this.#closed = true;
    this.#call.cancel();
    this.#notify();
  }
}

/** A stream to `port` on the session's loopback, once the gateway has made the connection. */
export async function connectPort(caller: Caller, sessionId: string, port: number): Promise<PortConnection> {
  if (!Number.isInteger(port) || port < 1 || port > 65535) throw new RangeError("the port must be 1 to 65535");
  const { sessions } = caller.conn;
  const call = sessions.forwardPort(await caller.conn.metadata());
  const conn = new PortConnection(call, port);
  call.write({ kind: { $case: "open", open: { sessionId, port } } });
  const first = await conn.next();
  if (first?.kind?.$case !== "opened") {
    conn.close();
    throw new ExecGatewayError("INTERNAL", "the gateway did not open the forward");
  }
  return conn;
}

export interface PortForwardOptions {
  /** The local port to listen on (default 0: a free one). */
  localPort?: number;
  /** The local address to listen on (default `127.0.0.1`). */
  localHost?: string;
}

/**
 * A local listening socket (`host`, `port`, `address`) whose connections
 * each become a stream to `remotePort` on the session's loopback. `close`
 * stops listening and ends the streams.
 */
export class PortForward {
  readonly #server: net.Server;
  readonly #streams = new Set<{ conn?: PortConnection; sock: net.Socket }>();

  /** @internal */
  constructor(
    server: net.Server,
    /** The address listened on. */
    readonly host: string,
    /** The port listened on. */
    readonly port: number,
    /** The session's port each connection goes to. */
    readonly remotePort: number,
  ) {
    this.#server = server;
  }

  /** `HOST:PORT` listened on. */
  get address(): string {
    return `${this.host}:${this.port}`;
  }

  /** @internal */
  track(entry: { conn?: PortConnection; sock: net.Socket }): () => void {
    this.#streams.add(entry);
    return () => this.#streams.delete(entry);
  }

  /** Stop listening and end every stream. */
  async close(): Promise<void> {
    const closed = new Promise<void>((resolve) => this.#server.close(() => resolve()));
    for (const { conn, sock } of this.#streams) {
      conn?.close();
      sock.destroy();
    }
    this.#streams.clear();
    await closed;
  }
}

/**
 * Listen on `localHost:localPort`, each connection a stream to
 * `remotePort`. One stream is opened first, so that a refusal (an unknown
 * session, nothing listening, no `forward` scope) rejects here rather than
 * at the first connection.
 */
export async function portForward(
  caller: Caller,
  sessionId: string,
  remotePort: number,
  opts: PortForwardOptions = {},
): Promise<PortForward> {
  (await connectPort(caller, sessionId, remotePort)).close();
  let forward: PortForward | undefined;
  // Half-open: a local client that shuts its sending side still gets the answer.
  const server = net.createServer({ allowHalfOpen: true }, (sock) => {
    const entry: { conn?: PortConnection; sock: net.Socket } = { sock };
    const untrack = forward?.track(entry) ?? (() => true);
    sock.on("error", () => sock.destroy());
    sock.on("close", () => {
      entry.conn?.close();
      untrack();
    });
    connectPort(caller, sessionId, remotePort).then(
      (conn) => splice(conn, sock, entry),
      () => sock.destroy(),
    );
  });
  server.listen(opts.localPort ?? 0, opts.localHost ?? "127.0.0.1");
  await Promise.race([
    once(server, "listening"),
    once(server, "error").then(([e]) => {
      throw e;
    }),
  ]);
  const a = server.address() as net.AddressInfo;
  forward = new PortForward(server, a.address, a.port, remotePort);
  return forward;
}

function splice(conn: PortConnection, sock: net.Socket, entry: { conn?: PortConnection }): void {
  entry.conn = conn;
  if (sock.destroyed) {
    conn.close();
    return;
  }
  const up = async (): Promise<void> => {
    // Not destroyed at its end (the default): the answer is still to be written.
    for await (const chunk of sock.iterator({ destroyOnReturn: false })) await conn.send(chunk as Uint8Array);
    // The local client shut its sending side: so does the stream.
    conn.end();
  };
  const down = async (): Promise<void> => {
    for await (const chunk of conn) {
      if (!sock.write(chunk)) await once(sock, "drain");
    }
    sock.end();
  };
  up().catch(() => {
    conn.close();
    sock.destroy();
  });
  down().then(
    () => conn.close(),
    () => {
      conn.close();
      sock.destroy();
    },
  );
}
