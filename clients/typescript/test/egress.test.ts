// Egress by name (`client.getEgress()`, `setEgress`): the tenant's host
// names read and replaced, a bad name and a token without the `egress`
// scope refused with nothing changed.
import assert from "node:assert/strict";
import { existsSync } from "node:fs";
import { after, before, describe, test } from "node:test";
import { connect, Forbidden, InvalidArgument, type Client } from "@exec-gateway/client";
import { Gateway, skipReason } from "./harness/gateway.js";

const scope = "exec egress";

/** Why egress by name cannot run here: it needs network namespaces. */
function netnsSkip(): string | undefined {
  const base = skipReason();
  if (base !== undefined) return base;
  if (process.getuid?.() !== 0) return "egress by name needs network namespaces (root)";
  const has = (t: string): boolean => ["/usr/sbin", "/usr/bin", "/sbin", "/bin"].some((d) => existsSync(`${d}/${t}`));
  if (!has("slirp4netns") || !has("nft")) return "egress by name needs slirp4netns and nft";
  return undefined;
}

describe("egress by name", { skip: netnsSkip() }, () => {
  let gw: Gateway;
  let client: Client;

  before(async () => {
    gw = await Gateway.start({ templateExtra: 'egress_names = ["a.test"]\n' });
    client = await connect(gw.target, { token: gw.token({ scope }) });
  });

  after(async () => {
    client?.close();
    await gw?.stop();
  });

  test("the tenant's names are read and replaced", async () => {
    assert.deepEqual(await client.getEgress(), { names: ["a.test"], cidrs: [], internet: false, closed: null });

    const changed = await client.setEgress(["a.test", "*.b.test", "c.test:443"]);
    assert.deepEqual([...(changed.names ?? [])].sort(), ["*.b.test", "a.test", "c.test:443"]);
    assert.equal(changed.closed, 0);
    const now = await client.getEgress();
    assert.deepEqual([...(now.names ?? [])].sort(), ["*.b.test", "a.test", "c.test:443"]);
    assert.equal(now.closed, null);

    // Not a host name: refused, and the names in force stay.
    await assert.rejects(client.setEgress(["d.test", "not a name!"]), InvalidArgument);
    assert.deepEqual((await client.getEgress()).names, now.names);
  });

  test("a token without the egress scope is refused", async () => {
    const unscoped = await connect(gw.target, { token: gw.token({ scope: "exec" }) });
    try {
      const before = await client.getEgress();
      await assert.rejects(unscoped.getEgress(), Forbidden);
      await assert.rejects(unscoped.setEgress(["x.test"]), Forbidden);
      assert.deepEqual((await client.getEgress()).names, before.names);
    } finally {
      unscoped.close();
    }
  });
});
