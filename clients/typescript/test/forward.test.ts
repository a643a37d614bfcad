// Port forwarding (`session.connectPort`, `session.portForward`): bytes
// both ways with an echo server in the session, half-close, a local port
// whose connections each become a stream, and the refusals.
import assert from "node:assert/strict";
import { existsSync } from "node:fs";
import net from "node:net";
import { once } from "node:events";
import { after, before, describe, test } from "node:test";
import {
  connect,
  ExecGatewayError,
  Forbidden,
  FORWARD_CHUNK_BYTES,
  NotFound,
  type Client,
  type Session,
} from "@exec-gateway/client";
import { Gateway, skipReason } from "./harness/gateway.js";

const scope = "exec fs:read fs:write forward";
const PORT = 7000;
const QUIET_PORT = 7001;

// Each connection gets back what it sends and, at the end of its input,
// `bye N` (N: the bytes it read); then the server closes it.
const ECHO = `
import socket
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", ${PORT}))
s.listen(16)
print("listening", flush=True)
while True:
    c, _ = s.accept()
    n = 0
    while True:
        d = c.recv(65536)
        if not d:
            break
        n += len(d)
        c.sendall(d)
    c.sendall(b"bye %d\\n" % n)
    c.close()
`;

/** Why forwarding cannot run here: it needs network namespaces. */
function netnsSkip(): string | undefined {
  const base = skipReason();
  if (base !== undefined) return base;
  if (process.getuid?.() !== 0) return "forwarding needs network namespaces (root)";
  const has = (t: string): boolean => ["/usr/sbin", "/usr/bin", "/sbin", "/bin"].some((d) => existsSync(`${d}/${t}`));
  if (!has("slirp4netns") || !has("nft")) return "forwarding needs slirp4netns and nft";
  return undefined;
}

async function echoing(session: Session): Promise<void> {
  const server = await session.start(["python3", "-c", ECHO]);
  for await (const e of server.events()) {
    if (e.type === "output") {
      assert.match(Buffer.from(e.data).toString(), /^listening/);
      return;
    }
  }
  throw new Error("the echo server ended");
}

describe("port forwarding", { skip: netnsSkip() }, () => {
  let gw: Gateway;
  let client: Client;

  before(async () => {
    gw = await Gateway.start();
    client = await connect(gw.target, { token: gw.token({ scope }) });
  });

  after(async () => {
    client?.close();
    await gw?.stop();
  });

  test("a stream carries bytes both ways and half-closes", async () => {
    const session = await client.session();
    await echoing(session);
    const conn = await session.connectPort(PORT);
    const sent = Buffer.concat([Buffer.from("hello\n"), Buffer.alloc(200 * 1024, 7)]);
    await conn.send(sent);
    // The server answers `bye` only once it has read the end.
    conn.end();
    const got: Buffer[] = [];
    for await (const chunk of conn) {
      assert.ok(chunk.length <= FORWARD_CHUNK_BYTES);
      got.push(Buffer.from(chunk));
    }
    assert.ok(Buffer.concat(got).equals(Buffer.concat([sent, Buffer.from(`bye ${sent.length}\n`)])));
    await session.close();
  });

  test("a local port forwards each connection", async (t) => {
    const session = await client.session();
    t.after(() => session.close());
    await echoing(session);
    const forward = await session.portForward(PORT);
    assert.equal(forward.host, "127.0.0.1");
    assert.equal(forward.address, `127.0.0.1:${forward.port}`);
    for (const n of [0, 1]) {
      const sock = net.connect(forward.port, forward.host);
      await once(sock, "connect");
      sock.end(`ping ${n}`);
      const chunks: Buffer[] = [];
      for await (const c of sock) chunks.push(c as Buffer);
      assert.equal(Buffer.concat(chunks).toString(), `ping ${n}bye 6\n`);
    }
    await forward.close();
    const refused = net.connect(forward.port, forward.host);
    await assert.rejects(once(refused, "connect"), /ECONNREFUSED/);
  });

  test("a stream ends with its session", async () => {
    const session = await client.session();
    await echoing(session);
    const conn = await session.connectPort(PORT);
    await session.close();
    await assert.rejects(conn.receive(), (e: unknown) => {
      assert.ok(e instanceof ExecGatewayError);
      assert.equal(e.code, "UNAVAILABLE");
      assert.equal(e.message, "the session ended");
      return true;
    });
  });

  test("forwards are refused like the websocket door", async () => {
    const session = await client.session();
    // Nothing listening.
    await assert.rejects(session.connectPort(QUIET_PORT), (e: unknown) => {
      assert.ok(e instanceof ExecGatewayError);
      assert.equal(e.code, "UNAVAILABLE");
      assert.match(e.message, /nothing accepts connections on port 7001/);
      return true;
    });
    await assert.rejects(session.portForward(QUIET_PORT), ExecGatewayError);
    // An unknown session (another tenant's answers the same: tests/forward_grpc.rs).
    const gone = await client.session();
    await gone.close();
    await assert.rejects(gone.connectPort(QUIET_PORT), (e: unknown) => {
      assert.ok(e instanceof NotFound);
      assert.equal(e.message, `unknown session id ${gone.id}`);
      return true;
    });
    // No `forward` scope.
    const unscoped = await connect(gw.target, { token: gw.token({ scope: "exec fs:read fs:write" }) });
    const s = await unscoped.session();
    await assert.rejects(s.connectPort(QUIET_PORT), Forbidden);
    unscoped.close();
    await session.close();
  });
});
