// Processes against a real gateway: run, start and the Process handle.
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import {
  AlreadyExists,
  CommandTimeout,
  connect,
  InvalidArgument,
  NotFound,
  OutputLimitExceeded,
  StdinClosed,
  type Client,
  type Session,
} from "@exec-gateway/client";
import { Gateway, skipReason } from "./harness/gateway.js";
import { assertContiguous, drain, eventually, iterate, readUntil } from "./harness/util.js";

describe("processes", { skip: skipReason() }, () => {
  let gw: Gateway;
  let client: Client;
  let session: Session;

  before(async () => {
    gw = await Gateway.start();
    client = await connect(gw.target, { token: gw.token() });
    session = await client.session();
  });

  after(async () => {
    client?.close();
    await gw?.stop();
  });

  test("run collects stdout, stderr and the exit code", async () => {
    const r = await session.run(["sh", "-c", "printf out; printf err >&2; exit 3"]);
    assert.equal(r.stdoutText, "out");
    assert.equal(r.stderrText, "err");
    assert.deepEqual([...r.stdout], [...Buffer.from("out")]);
    assert.equal(r.exitCode, 3);
    assert.equal(r.signal, null);
  });

  test("run reports the signal that killed the process", async () => {
    const r = await session.run(["sh", "-c", "kill -TERM $$"]);
    assert.equal(r.signal, 15);
    assert.equal(r.exitCode, -1);
  });

  test("run starts in the tenant root with env laid over the base environment", async () => {
    const info = await session.environmentInfo();
    const r = await session.run(["sh", "-c", 'pwd; echo "$GREETING"; test -n "$PATH" && echo path-kept'], {
      env: { GREETING: "hello" },
    });
    assert.equal(r.stdoutText, `${info.cwd}\nhello\npath-kept\n`);
    await session.files.mkdir("sub/dir", { parents: true });
    const sub = await session.run(["pwd"], { cwd: "sub/dir" });
    assert.equal(sub.stdoutText.trim(), `${info.cwd}/sub/dir`);
    const abs = await session.run(["pwd"], { cwd: `${info.cwd}/sub` });
    assert.equal(abs.stdoutText.trim(), `${info.cwd}/sub`);
  });

  test("run keeps binary output byte for byte", async () => {
    const r = await session.run(["sh", "-c", "printf '\\000\\377\\001\\200'"]);
    assert.deepEqual([...r.stdout], [0, 255, 1, 128]);
  });

  test("run under a terminal puts its output in stdout", async () => {
    const r = await session.run(["sh", "-c", "test -t 1 && echo tty"], { tty: true });
    assert.equal(r.stdoutText.trim(), "tty");
    assert.equal(r.exitCode, 0);
  });

  test("a run past its timeout is terminated and raises CommandTimeout with the output so far", async () => {
    const processId = "timeout-run";
    await assert.rejects(
      session.run(["sh", "-c", "echo started; echo warn >&2; exec sleep 60"], { timeoutMs: 3000, processId }),
      (e: unknown) => {
        assert.ok(e instanceof CommandTimeout, String(e));
        assert.equal(Buffer.from(e.stdout).toString(), "started\n");
        assert.equal(Buffer.from(e.stderr).toString(), "warn\n");
        return true;
      },
    );
    const status = await session.process(processId).wait();
    assert.equal(status.signal, 9);
  });

  test("aborting a run terminates the process and rejects with an AbortError", async () => {
    const ac = new AbortController();
    const processId = "aborted-run";
    const running = session.run(["sh", "-c", "echo go; exec sleep 60"], { signal: ac.signal, processId });
    await eventually(async () => (await session.list()).some((p) => p.processId === processId && p.nextSeq > 1));
    ac.abort();
    await assert.rejects(running, { name: "AbortError" });
    const status = await session.process(processId).wait();
    assert.equal(status.signal, 9);
  });

  test("a run or start aborted while it starts leaves nothing running and rejects at once", async () => {
    // The session knows its root already: the abort falls on the start itself.
    await session.environmentInfo();
    const ids: string[] = [];
    for (const delay of [0, 1, 2, 3, 5, 8]) {
      for (const how of ["run", "start"] as const) {
        const processId = `abort-early-${how}-${delay}`;
        ids.push(processId);
        const ac = new AbortController();
        const reason = new Error(`stop ${processId}`);
        setTimeout(() => ac.abort(reason), delay);
        const t0 = Date.now();
        const call: Promise<unknown> =
          how === "run"
            ? session.run(["sleep", "60"], { signal: ac.signal, processId })
            : session.start(["sleep", "60"], { signal: ac.signal, processId });
        const settled = await call.then(
          (v) => ({ v }),
          (e: unknown) => ({ e }),
        );
        const ms = Date.now() - t0;
        if ("v" in settled) {
          // The start won the race (only `start` can: `run` waits for the exit).
          assert.equal(how, "start", `${processId} resolved`);
          await (settled.v as { terminate(): Promise<boolean> }).terminate();
        } else {
          assert.equal(settled.e, reason, `${processId}: ${String(settled.e)}`);
        }
        assert.ok(ms < 3000, `${processId} settled after ${ms} ms`);
      }
    }
    // Nothing the aborted calls started lives on.
    await eventually(async () => {
      const live = (await session.list()).filter(
        (p) => ids.includes(p.processId) && (p.state === "running" || p.state === "starting"),
      );
      assert.deepEqual(
        live.map((p) => p.processId),
        [],
      );
      return true;
    }, 3000);
  });

  test("start yields output, exited and closed with contiguous numeric seqs, then ends", async () => {
    const p = await session.start(["sh", "-c", "echo one; echo two >&2; exit 4"]);
    const { events, stdout, stderr } = await drain(p);
    assert.equal(stdout, "one\n");
    assert.equal(stderr, "two\n");
    assertContiguous(events);
    for (const ev of events) assert.equal(typeof ev.seq, "number");
    const exited = events.find((e) => e.type === "exited");
    assert.deepEqual(exited && { exitCode: exited.exitCode, signal: exited.signal }, { exitCode: 4, signal: null });
    assert.equal(events.at(-1)?.type, "closed");
    assert.deepEqual(await p.wait(), { exitCode: 4, signal: null });
  });

  test("events({afterSeq}) starts after a cursor and a second handle sees the same", async () => {
    const p = await session.start(["sh", "-c", "for i in 1 2 3 4; do echo $i; done"], { processId: "cursor" });
    const all = await drain(p);
    const rest = await drain(session.process("cursor").events({ afterSeq: 2 }));
    assert.deepEqual(
      rest.events.map((e) => e.seq),
      all.events.filter((e) => e.seq > 2).map((e) => e.seq),
    );
    const other = await connect(gw.target, { token: gw.token() });
    try {
      const s2 = await other.session({ resume: session.id });
      const again = await drain(s2.process("cursor"));
      assert.equal(again.stdout, "1\n2\n3\n4\n");
    } finally {
      other.close();
    }
  });

  test("write and closeStdin feed a process's stdin; a later write is StdinClosed", async () => {
    const p = await session.start(["sh", "-c", "cat; echo eof"], { stdin: true });
    await p.write("hello ");
    await p.write(new Uint8Array([0x77, 0x6f, 0x72, 0x6c, 0x64, 0x0a]));
    await p.closeStdin();
    const { stdout } = await drain(p);
    assert.equal(stdout, "hello world\neof\n");
    await assert.rejects(p.write("late"), (e: unknown) => e instanceof StdinClosed || e instanceof NotFound);
  });

  test("writing to a process without a stdin pipe is StdinClosed", async () => {
    const p = await session.start(["sleep", "30"]);
    try {
      await assert.rejects(p.write("x"), StdinClosed);
    } finally {
      await p.terminate();
    }
  });

  test("a large write arrives whole", async () => {
    const p = await session.start(["sh", "-c", "wc -c"], { stdin: true });
    const big = Buffer.alloc(3 * 1024 * 1024 + 17, 0x61);
    const reading = drain(p);
    await p.write(big);
    await p.closeStdin();
    assert.equal((await reading).stdout.trim(), String(big.length));
  });

  test("signal interrupts the process group", async () => {
    const p = await session.start(["sh", "-c", "echo ready; exec sleep 60"]);
    const it = iterate(p);
    await readUntil(it, (o) => o.includes("ready"));
    await p.signal("interrupt");
    assert.deepEqual(await p.wait(), { exitCode: -1, signal: 2 });
    await it.return?.();
    await assert.rejects(p.signal("bogus" as "kill"), InvalidArgument);
  });

  test("resize changes a terminal's size", async () => {
    const p = await session.start(["sh", "-c", "read line; stty size"], { tty: true });
    await p.resize(33, 101);
    await p.write("go\n");
    const { pty } = await drain(p);
    assert.match(pty, /33 101/);
  });

  test("terminate kills a running process and says whether it was running", async () => {
    const p = await session.start(["sleep", "60"]);
    assert.equal(await p.terminate(), true);
    assert.deepEqual(await p.wait(), { exitCode: -1, signal: 9 });
    assert.equal(await p.terminate(), false);
  });

  test("list describes the session's processes", async () => {
    const p = await session.start(["sleep", "60"], { processId: "listed" });
    try {
      const info = (await session.list()).find((x) => x.processId === "listed");
      assert.ok(info);
      assert.equal(info.state, "running");
      assert.equal(info.tty, false);
      assert.equal(info.exitCode, null);
      assert.equal(typeof info.nextSeq, "number");
    } finally {
      await p.terminate();
    }
    await p.wait();
    const done = await eventually(async () => {
      const i = (await session.list()).find((x) => x.processId === "listed");
      return i?.state === "closed" ? i : false;
    });
    assert.equal(done.exitCode, -1);
  });

  test("a process id in use is AlreadyExists; empty argv is InvalidArgument", async () => {
    await session.start(["true"], { processId: "dup" });
    await assert.rejects(session.start(["true"], { processId: "dup" }), AlreadyExists);
    await assert.rejects(session.run(["true"], { processId: "dup" }), AlreadyExists);
    await assert.rejects(session.start([]), InvalidArgument);
  });

  test("an unknown process is NotFound", async () => {
    const ghost = session.process("no-such-process");
    await assert.rejects(drain(ghost), NotFound);
    await assert.rejects(ghost.wait(), NotFound);
    await assert.rejects(ghost.write("x"), NotFound);
    await assert.rejects(ghost.signal("kill"), NotFound);
  });

  test("output the gateway no longer retains is reported as outputLost", async () => {
    // ~3 MiB in 64 KiB lines while nobody reads: the gateway keeps the newest 1 MiB.
    const p = await session.start([
      "sh",
      "-c",
      "i=0; while [ $i -lt 48 ]; do head -c 65535 /dev/zero | tr '\\0' a; echo; i=$((i+1)); done",
    ]);
    // Nobody reads the stream `start` held: the process runs free.
    p.release();
    await eventually(async () => (await p.info()).state === "closed");
    const { events } = await drain(p);
    assert.equal(events[0]?.type, "outputLost");
    const lost = events[0]!;
    assert.ok(lost.type === "outputLost" && lost.chunks > 0 && lost.seq === 1);
    assert.equal(events[1]?.seq, lost.chunks + 1);
    assertContiguous(events.slice(1), lost.chunks + 1);
    assert.equal(events.at(-1)?.type, "closed");
  });

  test("aborting an event stream ends the iteration with an AbortError", async () => {
    const p = await session.start(["sh", "-c", "echo tick; exec sleep 60"]);
    const ac = new AbortController();
    const it = iterate(p, 0, ac.signal);
    await readUntil(it, (o) => o.includes("tick"));
    const next = it.next();
    ac.abort();
    await assert.rejects(next, { name: "AbortError" });
    // The process itself is untouched by a cancelled stream.
    assert.equal((await p.info()).state, "running");
    await p.terminate();
  });

  test("start holds its stream for the first reader: a fast writer loses nothing", async () => {
    const size = 8 * 1024 * 1024;
    const p = await session.start(["head", "-c", String(size), "/dev/zero"]);
    let bytes = 0;
    for await (const ev of p) {
      assert.notEqual(ev.type, "outputLost");
      if (ev.type === "output") bytes += ev.data.length;
    }
    assert.equal(bytes, size);
  });

  test("run writes stdin, then closes it, while it reads the output", async () => {
    const r = await session.run(["sh", "-c", "wc -c; echo done >&2"], { stdin: "hello" });
    assert.equal(r.stdoutText.trim(), "5");
    assert.equal(r.stderrText, "done\n");
    const big = Buffer.alloc(2 * 1024 * 1024 + 3, 0x62);
    const echoed = await session.run(["cat"], { stdin: big });
    assert.ok(Buffer.from(echoed.stdout).equals(big));
    // A process that does not read its stdin is no error.
    assert.equal((await session.run(["true"], { stdin: big })).exitCode, 0);
  });

  test("run past maxOutputBytes kills the process and raises OutputLimitExceeded", async () => {
    await assert.rejects(
      session.run(["sh", "-c", "echo start; exec cat /dev/zero"], { maxOutputBytes: 100_000, processId: "chatty" }),
      (e: unknown) => {
        assert.ok(e instanceof OutputLimitExceeded, String(e));
        assert.equal(e.code, "RESOURCE_EXHAUSTED");
        assert.equal(e.stdout.length + e.stderr.length, 100_000);
        assert.equal(Buffer.from(e.stdout.subarray(0, 6)).toString(), "start\n");
        return true;
      },
    );
    assert.equal((await session.process("chatty").wait()).signal, 9);
  });

  test("environmentInfo describes where the session runs", async () => {
    const info = await session.environmentInfo();
    assert.equal(info.platformOs, "linux");
    assert.equal(info.cwd, gw.root("t1"));
    assert.ok(info.shellPath.startsWith("/"));
    assert.equal(typeof info.capabilities, "object");
  });

  test("close ends the session and its processes; the id is then NotFound", async () => {
    const s = await client.session();
    const p = await s.start(["sleep", "60"]);
    p.release();
    await s.close();
    await assert.rejects(s.process(p.id).wait(), NotFound);
    await assert.rejects(client.session({ resume: s.id }), NotFound);
    await assert.rejects(s.run(["true"]), NotFound);
  });
});
