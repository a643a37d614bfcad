// Sessions kept alive while open and expiring once left; a held start
// stream nobody reads, dropped by the gateway, and what a later reader gets.
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import { connect, NotFound, type Client } from "@exec-gateway/client";
import { Gateway, skipReason } from "./harness/gateway.js";
import { assertContiguous, drain, eventually } from "./harness/util.js";

describe("session and stream lifetimes", { skip: skipReason() }, () => {
  let gw: Gateway;
  let client: Client;

  before(async () => {
    // Short lifetimes, so that they pass within a test.
    gw = await Gateway.start({ server: 'detach_ttl = "1s"\nslow_client_timeout = "1s"' });
    client = await connect(gw.target, { token: gw.token(), keepaliveInterval: 0.2 });
  });

  after(async () => {
    client?.close();
    await gw?.stop();
  });

  test("an open session is kept alive past the detach TTL; a detached one expires", async () => {
    const kept = await client.session();
    const left = await client.session();
    left.detach();
    // Any call naming `left` would keep it alive: wait out its TTL (1 s)
    // without one. It expires on a timer at the TTL.
    await new Promise((r) => setTimeout(r, 2500));
    await assert.rejects(client.session({ resume: left.id }), NotFound);
    // The kept one outlived the TTL that ended the other.
    assert.ok(Array.isArray(await kept.list()));
    await kept.close();
    await assert.rejects(client.session({ resume: kept.id }), NotFound);
  });

  test("a start stream nobody reads is dropped; a later reader gets the rest and what is lost", async () => {
    const s = await client.session();
    // 40 MiB: more than the buffers between the process and this client
    // (the gateway's channels, the HTTP/2 window, grpc-js's) hold.
    const p = await s.start(["head", "-c", String(40 * 1024 * 1024), "/dev/zero"]);
    // Unread, the stream is dropped after the slow-client timeout and the
    // process runs to its end.
    await eventually(async () => (await s.process(p.id).info()).state === "closed");
    const { events } = await drain(p);
    const lost = events.findIndex((e) => e.type === "outputLost");
    assert.ok(lost >= 0, "some output was lost");
    const gap = events[lost]!;
    assert.ok(gap.type === "outputLost" && gap.chunks > 0);
    assertContiguous(events.slice(0, lost), 1);
    assertContiguous(events.slice(lost + 1), gap.seq + gap.chunks);
    assert.equal(events.at(-1)?.type, "closed");
    await s.close();
  });
});
