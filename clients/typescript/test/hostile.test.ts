// The SDK against a fake gateway that misbehaves as the real one cannot be
// made to (a grpc-js server with the generated services): streams that end
// without news, writes that never get past "starting", answers longer than
// asked for, numbers past 2^53, a trailer too large for Node's HTTP/2; and
// the token kept from HTTP proxies and from console.log.
import assert from "node:assert/strict";
import net from "node:net";
import { after, afterEach, before, describe, test } from "node:test";
import { inspect } from "node:util";
import { Metadata, status, type ServerWritableStream } from "@grpc/grpc-js";
import {
  connect,
  ConnectionLost,
  DeadlineExceeded,
  ExecGatewayError,
  Internal,
  type Client,
  type ConnectOptions,
  type ProcessEvent,
} from "@exec-gateway/client";
import { file, process as pb } from "@exec-gateway/client/stubs";
import { FAKE_SESSION, FakeGateway, failure } from "./harness/fake.js";

const TOKEN = "tok-4f9c2e-NEVER-PRINT-ME";

function output(seq: number | bigint, data: string): pb.AttachResponse {
  return {
    event: {
      seq: seq as number,
      event: { $case: "output", output: { stream: pb.OutputStream.OUTPUT_STREAM_STDOUT, data: Buffer.from(data) } },
    },
  };
}

function exited(seq: number): pb.AttachResponse {
  return { event: { seq, event: { $case: "exited", exited: { exitCode: 0 } } } };
}

function closed(seq: number): pb.AttachResponse {
  return { event: { seq, event: { $case: "closed", closed: {} } } };
}

/** Write `msgs`, then end the call OK. */
function send(call: ServerWritableStream<unknown, pb.AttachResponse>, ...msgs: pb.AttachResponse[]): void {
  for (const m of msgs) call.write(m);
  call.end();
}

/** What an Attach answers, by process id. */
function attach(call: ServerWritableStream<pb.AttachRequest, pb.AttachResponse>): void {
  const after = call.request.afterSeq;
  switch (call.request.processId) {
    case "empty":
      // Ends at once, without an event.
      return send(call);
    case "stale":
      // Only what the reader has already seen, then ends.
      return send(call, output(after, "stale"));
    case "aborted":
      call.emit("error", failure(status.ABORTED, `reader too slow; attach again with after_seq = ${after}`));
      return;
    case "unread":
      call.emit(
        "error",
        failure(status.DEADLINE_EXCEEDED, "the client stopped reading for longer than the slow-client timeout"),
      );
      return;
    case "starting":
      call.emit("error", failure(status.INVALID_ARGUMENT, "process id starting is starting"));
      return;
    case "drip":
      // One new event per attach, then the stream ends: slow, but progress.
      if (after < 4) return send(call, output(after + 1, `${after + 1}`));
      return send(call, exited(5), closed(6));
    case "hugeseq":
      return send(call, output(1, "one"), output(2n ** 64n - 1n, "huge"), closed(3));
    case "bigtrailer":
      // 1 MiB of error data: past what Node's HTTP/2 takes in a header block.
      call.emit("error", failure(status.RESOURCE_EXHAUSTED, "quota exceeded: processes", "A".repeat(1 << 20)));
      return;
    default:
      return send(call, output(1, "hello"), exited(2), closed(3));
  }
}

describe("a broken or hostile gateway (a fake)", () => {
  let fake: FakeGateway;
  const clients: Client[] = [];

  async function client(opts: ConnectOptions = {}): Promise<Client> {
    const c = await connect(fake.target, { token: TOKEN, ...opts });
    clients.push(c);
    return c;
  }

  before(async () => {
    fake = await FakeGateway.start({
      process: {
        attach,
        write: (call, cb) => {
          if (call.request.processId === "starting") cb(null, { status: pb.WriteStatus.WRITE_STATUS_STARTING });
          else if (call.request.processId === "weird") cb(null, { status: 77 as pb.WriteStatus });
          else cb(null, { status: pb.WriteStatus.WRITE_STATUS_ACCEPTED });
        },
        list: (call, cb) => {
          if (call.request.sessionId === "bigtrailer") {
            cb(failure(status.RESOURCE_EXHAUSTED, "quota exceeded", "B".repeat(1 << 20)));
          } else {
            cb(null, { processes: [] });
          }
        },
        // Headers at once, as for a running process; then nothing.
        exec: (call) => call.sendMetadata(new Metadata()),
      },
      files: {
        readFile: (call: ServerWritableStream<file.ReadFileRequest, file.ReadFileResponse>) => {
          // Far more than any `length` asked for.
          for (let i = 0; i < 5; i++) call.write({ data: Buffer.alloc(1 << 20, 0x4f) });
          call.end();
        },
      },
    });
  });

  afterEach(() => {
    for (const c of clients.splice(0)) c.close();
  });

  after(() => fake?.stop());

  /** Read `pid`'s events; the error they end with, the events, the attaches made and the time taken. */
  async function follow(
    c: Client,
    pid: string,
  ): Promise<{ error: unknown; events: ProcessEvent[]; attaches: number; ms: number }> {
    const s = await c.session();
    const before = fake.count("attach", pid);
    const t0 = Date.now();
    const events: ProcessEvent[] = [];
    let error: unknown;
    try {
      for await (const ev of s.process(pid).events({ signal: AbortSignal.timeout(20_000) })) events.push(ev);
    } catch (e) {
      error = e;
    }
    return { error, events, attaches: fake.count("attach", pid) - before, ms: Date.now() - t0 };
  }

  test("a grpc:// call never goes through the HTTP proxy that http_proxy names", async () => {
    // A listener in the proxy's place that counts who comes (and hangs up).
    let reached = 0;
    const listener = net.createServer((sock) => {
      reached += 1;
      sock.destroy();
    });
    await new Promise<void>((resolve) => listener.listen(0, "127.0.0.1", resolve));
    const proxyUrl = `http://127.0.0.1:${(listener.address() as net.AddressInfo).port}`;
    const saved = Object.fromEntries(
      ["http_proxy", "https_proxy", "grpc_proxy", "no_proxy", "no_grpc_proxy"].map((k) => [k, process.env[k]]),
    );
    try {
      for (const k of Object.keys(saved)) delete process.env[k];
      process.env["http_proxy"] = proxyUrl;
      const c = await client();
      assert.equal((await c.environmentInfo({ timeoutMs: 5000 })).cwd, "/fake/root");
      assert.equal(reached, 0, "the token went to the proxy");
      // The control: with the proxy allowed again, grpc-js does go there,
      // so the listener is where the token would have gone.
      const proxied = await client({ channelOptions: { "grpc.enable_http_proxy": 1 } });
      await assert.rejects(proxied.environmentInfo({ timeoutMs: 5000 }), ExecGatewayError);
      proxied.close();
      assert.ok(reached > 0, "the control call did not reach the proxy");
    } finally {
      for (const [k, v] of Object.entries(saved)) {
        if (v === undefined) delete process.env[k];
        else process.env[k] = v;
      }
      listener.close();
    }
  });

  for (const pid of ["empty", "stale", "aborted", "unread", "starting"]) {
    test(`an event stream ending without news (${pid}) is re-attached, paced, until resumeWithin`, async () => {
      const c = await client({ resumeWithin: 1 });
      const r = await follow(c, pid);
      assert.ok(r.error instanceof ConnectionLost, `${String(r.error)}`);
      assert.match((r.error as Error).message, /within 1 s/);
      assert.deepEqual(r.events, [], "nothing already seen is yielded");
      // Paced by the backoff (50, 100, 200, 400 ms...): a handful, not thousands.
      assert.ok(r.attaches >= 3 && r.attaches <= 12, `${r.attaches} attaches`);
      assert.ok(r.ms >= 900 && r.ms < 5000, `gave up after ${r.ms} ms`);
    });
  }

  test("an event stream that ends after each new event is followed to its close", async () => {
    const c = await client({ resumeWithin: 1 });
    const r = await follow(c, "drip");
    assert.equal(r.error, undefined);
    assert.deepEqual(
      r.events.map((e) => [e.type, e.seq]),
      [
        ["output", 1],
        ["output", 2],
        ["output", 3],
        ["output", 4],
        ["exited", 5],
        ["closed", 6],
      ],
    );
  });

  test("a seq past 2^53 is Internal, saying so", async () => {
    const c = await client();
    const r = await follow(c, "hugeseq");
    assert.ok(r.error instanceof Internal, String(r.error));
    assert.match((r.error as Error).message, /cannot read.*2\^53/);
    assert.equal(r.attaches, 1, "not retried");
  });

  test("a trailer too large for Node's HTTP/2 wedges the connection; the call still settles", async () => {
    // grpc-js never hears of the call again; the pings notice the dead
    // connection, and the retries give up after resumeWithin.
    const c = await client({ resumeWithin: 1, pingIntervalMs: 300, pingTimeoutMs: 300 });
    const r = await follow(c, "bigtrailer");
    assert.ok(r.error instanceof ConnectionLost, String(r.error));
    assert.ok(r.ms < 10_000, `settled after ${r.ms} ms`);
    const s = await c.session();
    const t0 = Date.now();
    await assert.rejects(c.session({ resume: "bigtrailer" }).then((b) => b.list()), ConnectionLost);
    assert.ok(Date.now() - t0 < 10_000);
    // The client is not left broken: the next call reconnects.
    assert.deepEqual(await s.list({ timeoutMs: 5000 }), []);
    const ok = await follow(c, "plain");
    assert.equal(ok.error, undefined);
    assert.equal(ok.events.at(-1)?.type, "closed");
  });

  test("a write answered 'starting' forever fails at the call's timeoutMs, or after resumeWithin", async () => {
    const c = await client({ resumeWithin: 1 });
    const s = await c.session();
    let t0 = Date.now();
    await assert.rejects(s.process("starting").write("x", { timeoutMs: 400 }), (e: unknown) => {
      assert.ok(e instanceof DeadlineExceeded, String(e));
      assert.match(e.message, /still starting when the write's timeoutMs \(400 ms\) passed/);
      return true;
    });
    let ms = Date.now() - t0;
    assert.ok(ms >= 350 && ms < 3000, `${ms} ms`);
    const before = fake.count("write", "starting");
    t0 = Date.now();
    await assert.rejects(s.process("starting").write("x"), (e: unknown) => {
      assert.ok(e instanceof ConnectionLost, String(e));
      assert.match(e.message, /still starting/);
      return true;
    });
    ms = Date.now() - t0;
    assert.ok(ms >= 900 && ms < 4000, `${ms} ms`);
    assert.ok(fake.count("write", "starting") - before <= 12, "paced");
    // A status the SDK does not know is Internal.
    await assert.rejects(s.process("weird").write("x"), Internal);
  });

  test("a file read never yields past length, whatever the gateway sends", async () => {
    const c = await client();
    let got = 0;
    for await (const chunk of c.files.read("/big", { length: 10 })) got += chunk.length;
    assert.equal(got, 10);
    assert.equal((await c.files.readBytes("/big", { offset: 3, length: (1 << 20) + 5 })).length, (1 << 20) + 5);
    assert.equal((await c.files.readBytes("/big")).length, 5 << 20);
  });

  test("neither util.inspect nor console.log shows the token", async () => {
    const c = await client();
    const s = await c.session();
    const p = s.process("x");
    const started = await s.start(["sleep", "1"], { processId: "held" });
    const objects = { client: c, session: s, process: p, started, files: s.files, root: c.files };
    const options = [{}, { depth: Infinity, showHidden: true }, { depth: 8, customInspect: false, showHidden: true }];
    for (const [name, obj] of Object.entries(objects)) {
      for (const opts of options) {
        const text = inspect(obj, opts);
        assert.ok(!text.includes(TOKEN.slice(4, 20)), `${name} with ${JSON.stringify(opts)}: ${text.slice(0, 300)}`);
      }
    }
    assert.equal(inspect(s), `Session { id: '${FAKE_SESSION}' }`);
    assert.equal(inspect(c), `Client { target: '${fake.target}', sessions: ['${FAKE_SESSION}'] }`);
    started.release();
  });
});
