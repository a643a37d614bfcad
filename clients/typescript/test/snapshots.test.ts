// Snapshots and forks (`session.snapshot()`, `client.fork(snapshot, n)`):
// each fork sees the snapshot and only its own changes.
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import { connect, Forbidden, InvalidArgument, NotFound, type Client } from "@exec-gateway/client";
import { Gateway, skipReason } from "./harness/gateway.js";

const scope = "exec fs:read fs:write snapshot";

describe("snapshots and forks", { skip: skipReason() }, () => {
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

  test("forks start from the snapshot and stay apart", async () => {
    const origin = await client.session();
    const root = (await origin.environmentInfo()).cwd;
    await origin.files.write(`${root}/state`, "saved");
    const snap = await origin.snapshot({ name: "checkpoint", labels: { step: "3" } });
    assert.deepEqual([snap.name, snap.labels, snap.image], ["checkpoint", { step: "3" }, null]);
    assert.match(snap.digest, /^sha256:[0-9a-f]{64}$/);
    await origin.files.write(`${root}/state`, "moved on");

    const forks = await client.fork(snap, 3);
    assert.equal(new Set(forks.map((s) => s.id)).size, 3);
    for (const [n, s] of forks.entries()) {
      assert.equal(await s.files.readText(`${root}/state`), "saved");
      const r = await s.run(["/bin/sh", "-c", `echo fork${n} > state && cat state`], { cwd: root });
      assert.deepEqual([r.stdoutText, r.exitCode], [`fork${n}\n`, 0]);
    }
    for (const [n, s] of forks.entries()) {
      assert.equal(await s.files.readText(`${root}/state`), `fork${n}\n`);
    }
    assert.equal(await origin.files.readText(`${root}/state`), "moved on");

    const one = await client.session({ snapshot: snap.id });
    assert.equal(await one.files.readText(`${root}/state`), "saved");
    assert.deepEqual((await client.snapshots()).map((s) => s.id), [snap.id]);
    assert.equal((await client.getSnapshot(snap.id)).digest, snap.digest);
    assert.ok(snap.expiresAtMs && snap.pushed === null);
    // No snapshot registry on this gateway: nowhere to push; promoting
    // keeps it until it is deleted.
    await assert.rejects(client.pushSnapshot(snap), InvalidArgument);
    const kept = await client.promoteSnapshot(snap);
    assert.deepEqual([kept.id, kept.expiresAtMs, kept.pushed], [snap.id, null, null]);
    await client.deleteSnapshot(snap);
    await assert.rejects(client.getSnapshot(snap.id), NotFound);
    await assert.rejects(client.fork(snap, 1), NotFound);
    assert.equal(await forks[0]!.files.readText(`${root}/state`), "fork0\n");
    await assert.rejects(client.session({ resume: origin.id, snapshot: snap.id }), TypeError);
    for (const s of [...forks, one, origin]) await s.close();
  });

  test("without the scope nothing is saved", async () => {
    const plain = await connect(gw.target, { token: gw.token() });
    try {
      const s = await plain.session();
      await assert.rejects(s.snapshot(), Forbidden);
      await assert.rejects(plain.snapshots(), Forbidden);
      await s.close();
    } finally {
      plain.close();
    }
  });
});
