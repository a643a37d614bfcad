// A TCP proxy between a client and the gateway that a test can break: cut
// every connection (the client reconnects through it), refuse new ones, go
// silent (keep sockets open but forward nothing, as a dead peer does), or
// pass requests on but swallow the answers (the gateway acts on a call
// whose answer the client never sees).
import net from "node:net";

export type ProxyMode = "forward" | "refuse" | "blackhole" | "oneway";

export class Proxy {
  private readonly conns = new Set<net.Socket>();
  private mode: ProxyMode = "forward";
  /** Connections accepted so far. */
  accepted = 0;

  private constructor(
    private readonly server: net.Server,
    readonly port: number,
    private readonly upstreamPort: number,
  ) {}

  /** A proxy on 127.0.0.1 to `upstream` (`HOST:PORT`). */
  static async start(upstream: string): Promise<Proxy> {
    const upstreamPort = Number(upstream.split(":").pop());
    const server = net.createServer();
    await new Promise<void>((resolve, reject) => {
      server.once("error", reject);
      server.listen(0, "127.0.0.1", () => resolve());
    });
    const addr = server.address() as net.AddressInfo;
    const proxy = new Proxy(server, addr.port, upstreamPort);
    server.on("connection", (client) => proxy.accept(client));
    return proxy;
  }

  get target(): string {
    return `grpc://127.0.0.1:${this.port}`;
  }

  private accept(client: net.Socket): void {
    this.accepted += 1;
    if (this.mode !== "forward") {
      // Refused: reset at once (a blackholed or one-way proxy refuses too,
      // so only the connections it already held hang).
      client.resetAndDestroy();
      return;
    }
    const upstream = net.connect(this.upstreamPort, "127.0.0.1");
    client.setNoDelay(true);
    upstream.setNoDelay(true);
    this.conns.add(client);
    this.conns.add(upstream);
    const drop = (): void => {
      client.destroy();
      upstream.destroy();
      this.conns.delete(client);
      this.conns.delete(upstream);
    };
    client.on("error", drop);
    upstream.on("error", drop);
    client.on("close", drop);
    upstream.on("close", drop);
    // Data is forwarded only while the mode is "forward" (and, when
    // "oneway", towards the gateway): the rest is swallowed.
    const pipe = (from: net.Socket, to: net.Socket): void => {
      from.on("data", (chunk: Buffer) => {
        if (this.mode !== "forward" && !(this.mode === "oneway" && to === upstream)) return;
        if (!to.write(chunk)) {
          from.pause();
          to.once("drain", () => from.resume());
        }
      });
    };
    pipe(client, upstream);
    pipe(upstream, client);
  }

  /** Reset every open connection (new ones are still forwarded). */
  cut(): void {
    for (const s of this.conns) s.resetAndDestroy();
    this.conns.clear();
  }

  /** Cut everything and refuse new connections until `forward()`. */
  refuse(): void {
    this.mode = "refuse";
    this.cut();
  }

  /** Stop forwarding without closing anything. */
  blackhole(): void {
    this.mode = "blackhole";
  }

  /** Forward what the client sends; swallow what the gateway answers. */
  oneway(): void {
    this.mode = "oneway";
  }

  forward(): void {
    this.mode = "forward";
  }

  /** Connections open now (client and upstream sides). */
  get open(): number {
    return this.conns.size;
  }

  async close(): Promise<void> {
    this.mode = "refuse";
    this.cut();
    await new Promise<void>((resolve) => this.server.close(() => resolve()));
  }
}
