// Each error class from a real refusal of a real gateway, tenants kept
// apart, and tokens checked.
import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { after, before, describe, test } from "node:test";
import { Client as GrpcClient, credentials, Metadata, type ServiceError } from "@grpc/grpc-js";
import net from "node:net";
import {
  connect,
  ConnectionLost,
  DeadlineExceeded,
  errorFromStatus,
  ExecGatewayError,
  Forbidden,
  Internal,
  InvalidArgument,
  NotFound,
  Overloaded,
  QuotaExceeded,
  RateLimited,
  ShuttingDown,
  Unauthenticated,
  Unimplemented,
  type Client,
} from "@exec-gateway/client";
import { process as pb } from "@exec-gateway/client/stubs";
import { Gateway, signHs256, skipReason, unsignedToken } from "./harness/gateway.js";
import { eventually } from "./harness/util.js";

describe("errors", { skip: skipReason() }, () => {
  let gw: Gateway;
  /** Tenant template with max_sessions = 1, max_in_flight = 1 and a 3 s request timeout. */
  let limited: Gateway;
  /** Tenant template with 1 request per second, a burst of 3. */
  let rated: Gateway;
  const clients: Client[] = [];

  async function client(
    g: Gateway,
    token: string | undefined,
    opts: { resumeWithin?: number; keepaliveInterval?: number } = {},
  ): Promise<Client> {
    const c = await connect(g.target, { ...(token === undefined ? {} : { token }), ...opts });
    clients.push(c);
    return c;
  }

  before(async () => {
    [gw, limited, rated] = await Promise.all([
      Gateway.start(),
      Gateway.start({ server: 'request_timeout = "3s"', templateExtra: "max_sessions = 1\nmax_in_flight = 1\n" }),
      Gateway.start({ templateExtra: "requests_per_second = 1\nburst = 3\n" }),
    ]);
  });

  after(async () => {
    for (const c of clients) c.close();
    await Promise.all([gw?.stop(), limited?.stop(), rated?.stop()]);
  });

  test("every error is an ExecGatewayError with code, message and data", async () => {
    const c = await client(gw, gw.token({ scope: "fs:read" }));
    let e: unknown;
    try {
      await (await c.session()).run(["true"]);
    } catch (err) {
      e = err;
    }
    assert.ok(e instanceof ExecGatewayError, String(e));
    assert.ok(e instanceof Forbidden);
    assert.equal(e.code, "PERMISSION_DENIED");
    assert.equal(e.message, "forbidden");
    assert.deepEqual(e.data, { requiredScope: "exec" });
    assert.equal(e.requiredScope, "exec");
    assert.equal(e.name, "Forbidden");
  });

  test("no token, a forged token, an unsigned one and an expired one are Unauthenticated", async () => {
    const claims = { sub: "x", tenant: "t1", scope: "exec fs:read fs:write", exp: Math.floor(Date.now() / 1000) + 600 };
    // Without a token or a certificate there is nothing to authenticate with.
    await assert.rejects(connect(gw.target), Unauthenticated);
    const tokens: [string, string][] = [
      ["empty (none sent)", ""],
      ["forged", signHs256(claims, "another-key-another-key-another-key!")],
      ["alg none", unsignedToken(claims)],
      ["expired", gw.token({ expiresIn: -3600 })],
      ["malformed", "not-a-jwt"],
    ];
    for (const [what, token] of tokens) {
      const c = await client(gw, token);
      await assert.rejects(c.session(), Unauthenticated, what);
      await assert.rejects(c.files.list("/"), Unauthenticated, what);
    }
    const none = await client(gw, "");
    await assert.rejects(none.session(), { message: "missing bearer token" });
  });

  test("a token is not sent in the clear to a host that is not loopback", async () => {
    await assert.rejects(connect("grpc://10.0.0.1:50051", { token: "t" }), InvalidArgument);
    await assert.rejects(connect("gateway.example:50051", { token: "t" }), /plaintext/);
    // Asked for by name, or to a loopback address: fine (nothing is dialled yet).
    (await connect("grpc://10.0.0.1:50051", { token: "t", allowPlaintext: true })).close();
    (await connect("grpc://localhost:50051", { token: "t" })).close();
    (await connect("[::1]:50051", { token: "t" })).close();
  });

  test("a gateway that never answered is ConnectionLost at once, not retried for resumeWithin", async () => {
    // A port nothing listens on any more.
    const server = net.createServer();
    await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
    const port = (server.address() as net.AddressInfo).port;
    await new Promise<void>((resolve) => server.close(() => resolve()));
    const c = await client(gw, gw.token());
    const nowhere = await connect(`grpc://127.0.0.1:${port}`, { token: gw.token(), resumeWithin: 3600 });
    clients.push(nowhere, c);
    await assert.rejects(nowhere.session(), (e: unknown) => {
      assert.ok(e instanceof ConnectionLost, String(e));
      assert.match(e.message, /cannot reach the gateway at grpc:\/\/127\.0\.0\.1:\d+/);
      return true;
    });
  });

  test("a missing scope is Forbidden with requiredScope", async () => {
    const owner = await client(gw, gw.token({ tenant: "scopes" }));
    const s = await owner.session();
    await s.files.write("f.txt", "x");
    const readOnly = await client(gw, gw.token({ tenant: "scopes", scope: "fs:read" }));
    assert.equal(await readOnly.files.readText(`${gw.root("scopes")}/f.txt`), "x");
    await assert.rejects(readOnly.files.write(`${gw.root("scopes")}/g.txt`, "y"), (e: unknown) => {
      assert.ok(e instanceof Forbidden);
      assert.equal(e.requiredScope, "fs:write");
      return true;
    });
    const execOnly = await client(gw, gw.token({ tenant: "scopes", scope: "exec" }));
    const s2 = await execOnly.session({ resume: s.id });
    await assert.rejects(
      s2.files.readBytes("f.txt"),
      (e: unknown) => e instanceof Forbidden && e.requiredScope === "fs:read",
    );
  });

  test("a token function is asked before each call, so the token can rotate", async () => {
    let calls = 0;
    const c = await connect(gw.target, {
      token: async () => {
        calls += 1;
        return gw.token({ sub: `rotation-${calls}` });
      },
    });
    clients.push(c);
    const s = await c.session();
    await s.run(["true"]);
    await s.list();
    assert.ok(calls >= 3, `asked ${calls} times`);
  });

  test("an unknown session id is NotFound", async () => {
    const c = await client(gw, gw.token());
    await assert.rejects(c.session({ resume: randomUUID() }), NotFound);
  });

  test("another tenant's session, processes and files are out of reach", async () => {
    const a = await client(gw, gw.token({ tenant: "alpha" }));
    const sa = await a.session();
    const pa = await sa.start(["sleep", "60"], { processId: "alpha-proc" });
    await sa.files.write("secret.txt", "alpha only");
    const b = await client(gw, gw.token({ tenant: "beta" }));
    // The session id is answered exactly like an unknown one.
    await assert.rejects(b.session({ resume: sa.id }), NotFound);
    // Its process, asked for by session and process id with beta's token.
    const raw = new pb.ProcessServiceClient(gw.address, credentials.createInsecure());
    try {
      const md = new Metadata();
      md.set("authorization", `Bearer ${gw.token({ tenant: "beta" })}`);
      const err = await new Promise<ServiceError | null>((resolve) =>
        raw.list({ sessionId: sa.id }, md, (e) => resolve(e)),
      );
      assert.equal(err?.code, 5 /* NOT_FOUND */);
      const term = await new Promise<ServiceError | null>((resolve) =>
        raw.terminate({ sessionId: sa.id, processId: pa.id }, md, (e) => resolve(e)),
      );
      assert.equal(term?.code, 5);
    } finally {
      raw.close();
    }
    const sb = await b.session();
    await assert.rejects(sb.process(pa.id).wait(), NotFound);
    // Its files: outside beta's root.
    await assert.rejects(b.files.readBytes(`${gw.root("alpha")}/secret.txt`), NotFound);
    await assert.rejects(sb.files.list(gw.root("alpha")), NotFound);
    const peek = await sb.run(["cat", `${gw.root("alpha")}/secret.txt`]);
    assert.notEqual(peek.exitCode, 0);
    assert.equal(peek.stdoutText, "");
    assert.equal(await pa.terminate(), true);
  });

  test("an OS failure is Internal", async () => {
    const c = await client(gw, gw.token());
    await c.files.mkdir("full/child", { parents: true });
    await assert.rejects(c.files.remove("full"), (e: unknown) => e instanceof Internal && e.code === "INTERNAL");
    await assert.rejects(c.files.readBytes("full"), Internal);
  });

  test("a tenant's session quota is QuotaExceeded with quota and limit", async () => {
    // No session keepalives: on this gateway they would take the one slot.
    const c = await client(limited, limited.token({ tenant: "quota" }), { keepaliveInterval: 3600 });
    await c.session();
    await assert.rejects(c.session(), (e: unknown) => {
      assert.ok(e instanceof QuotaExceeded, String(e));
      assert.equal(e.code, "RESOURCE_EXHAUSTED");
      assert.equal(e.quota, "sessions");
      assert.equal(e.limit, 1);
      return true;
    });
  });

  test("the tenant's in-flight limit is Overloaded; the gateway's request deadline is DeadlineExceeded", async () => {
    const c = await client(limited, limited.token({ tenant: "busy" }), { keepaliveInterval: 3600 });
    const s = await c.session();
    // `sleep` never reads its stdin: a write larger than the pipe blocks
    // in the gateway until its request deadline.
    const p = await s.start(["sleep", "60"], { stdin: true });
    // The write must hold the tenant's one slot: it is asked again if a
    // poll below took the slot first.
    const blocked = (async (): Promise<void> => {
      for (;;) {
        try {
          return await p.write(new Uint8Array(512 * 1024));
        } catch (e) {
          if (!(e instanceof Overloaded)) throw e;
        }
      }
    })();
    const overloaded = await eventually(async () => {
      try {
        await c.files.stat(limited.root("busy"));
        return false;
      } catch (e) {
        if (e instanceof Overloaded) return e;
        throw e;
      }
    });
    assert.ok(!(overloaded instanceof RateLimited));
    assert.equal(overloaded.code, "UNAVAILABLE");
    assert.equal(overloaded.message, "Server overloaded; retry later.");
    await assert.rejects(blocked, (e: unknown) => {
      assert.ok(e instanceof DeadlineExceeded, String(e));
      assert.equal(e.message, "request deadline exceeded");
      return true;
    });
    await p.terminate();
  });

  test("the tenant's request rate is RateLimited with retryAfter in seconds", async () => {
    const c = await client(rated, rated.token({ tenant: "rate" }));
    const limitedErr = await eventually(async () => {
      try {
        await c.environmentInfo();
        return false;
      } catch (e) {
        if (e instanceof RateLimited) return e;
        throw e;
      }
    });
    assert.ok(limitedErr instanceof Overloaded);
    assert.equal(limitedErr.code, "UNAVAILABLE");
    assert.equal(limitedErr.data?.["reason"], "rateLimited");
    assert.equal(typeof limitedErr.retryAfter, "number");
    assert.ok(limitedErr.retryAfter! > 0 && limitedErr.retryAfter! <= 5, String(limitedErr.retryAfter));
  });

  test("a method the gateway does not serve is Unimplemented (through errorFromStatus, for raw stubs)", async () => {
    const raw = new GrpcClient(gw.address, credentials.createInsecure());
    try {
      const md = new Metadata();
      md.set("authorization", `Bearer ${gw.token()}`);
      const e = await new Promise<ServiceError | null>((resolve) =>
        raw.makeUnaryRequest(
          "/exec_gateway.v1.ProcessService/NoSuchMethod",
          (x: Buffer) => x,
          (x: Buffer) => x,
          Buffer.alloc(0),
          md,
          (err) => resolve(err),
        ),
      );
      assert.ok(e);
      const mapped = errorFromStatus(e);
      assert.ok(mapped instanceof Unimplemented, String(mapped));
      assert.equal(mapped.code, "UNIMPLEMENTED");
    } finally {
      raw.close();
    }
  });

  test("a client-side deadline (timeoutMs) is DeadlineExceeded", async () => {
    const c = await client(gw, gw.token());
    const s = await c.session();
    const p = await s.start(["sleep", "60"]);
    await assert.rejects(p.wait({ timeoutMs: 300 }), DeadlineExceeded);
    await p.terminate();
  });

  test("a draining gateway is ShuttingDown", async () => {
    const draining = await Gateway.start({ server: 'shutdown_grace = "30s"' });
    try {
      const c = await client(draining, draining.token());
      const s = await c.session();
      // A running process holds the drain open for its grace.
      await s.start(["sleep", "60"]);
      draining.terminate();
      // New sessions are refused (existing ones finish their work).
      const e = await eventually(async () => {
        try {
          await c.session();
          return false;
        } catch (err) {
          if (err instanceof ShuttingDown) return err;
          throw err;
        }
      });
      assert.equal(e.code, "UNAVAILABLE");
      assert.equal(e.data?.["reason"], "serverShuttingDown");
      // The session's own work goes on while it drains; closing it ends
      // the process holding the drain open.
      assert.ok((await s.list()).length === 1);
      await s.close();
    } finally {
      await draining.stop();
    }
  });
});
