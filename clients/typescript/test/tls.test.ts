// TLS: grpcs:// with a CA of the test's own, and a client certificate
// standing for a tenant without a token.
import assert from "node:assert/strict";
import { readFile } from "node:fs/promises";
import { after, before, describe, test } from "node:test";
import { connect, ConnectionLost, Forbidden, Unauthenticated, type Client } from "@exec-gateway/client";
import { Gateway, skipReason } from "./harness/gateway.js";
import { haveOpenssl, makePki, type Pki } from "./harness/pki.js";

const skip = skipReason() ?? (haveOpenssl() ? undefined : "no openssl CLI to make certificates with");

describe("TLS", { skip }, () => {
  let pki: Pki;
  let gw: Gateway;
  /** By name (the certificate has DNS:localhost): Node warns about TLS to a bare IP. */
  let target: string;
  const clients: Client[] = [];

  before(async () => {
    pki = await makePki("/O=t1/OU=exec fs:read/CN=ts-bot");
    gw = await Gateway.start({
      tls: { certFile: pki.serverCert, keyFile: pki.serverKey, clientCaFile: pki.clientCaCert },
    });
    target = gw.target.replace("127.0.0.1", "localhost");
  });

  after(async () => {
    for (const c of clients) c.close();
    await gw?.stop();
    await pki?.remove();
  });

  test("the gateway announces grpcs:// and a client trusting its CA runs commands", async () => {
    assert.match(gw.target, /^grpcs:\/\//);
    const c = await connect(target, { token: gw.token(), ca: pki.caPem });
    clients.push(c);
    const s = await c.session();
    const r = await s.run(["echo", "over tls"]);
    assert.equal(r.stdoutText, "over tls\n");
    // The CA may be given as a path or as bytes too.
    const byPath = await connect(target, { token: gw.token(), ca: pki.caCert });
    clients.push(byPath);
    assert.equal((await byPath.environmentInfo()).platformOs, "linux");
    const byBytes = await connect(target, { token: gw.token(), ca: await readFile(pki.caCert) });
    clients.push(byBytes);
    assert.equal((await byBytes.environmentInfo()).platformOs, "linux");
  });

  test("a client certificate authenticates without a token: tenant from O, scopes from OU", async () => {
    const c = await connect(target, { ca: pki.caPem, cert: pki.clientCert, key: pki.clientKey });
    clients.push(c);
    const s = await c.session();
    assert.equal((await s.environmentInfo()).cwd, gw.root("t1"));
    const r = await s.run(["sh", "-c", "echo cert-authenticated"]);
    assert.equal(r.stdoutText, "cert-authenticated\n");
    // OU grants exec and fs:read only.
    await assert.rejects(
      s.files.write("x.txt", "x"),
      (e: unknown) => e instanceof Forbidden && e.requiredScope === "fs:write",
    );
  });

  test("a client certificate of another CA is refused: Unauthenticated", async () => {
    const c = await connect(target, { ca: pki.caPem, cert: pki.strangerCert, key: pki.strangerKey });
    clients.push(c);
    await assert.rejects(c.session(), Unauthenticated);
  });

  test("a gateway whose certificate the client does not trust is ConnectionLost, without retrying", async () => {
    const c = await connect(target, { token: gw.token(), ca: pki.otherCaPem });
    clients.push(c);
    await assert.rejects(c.session(), (e: unknown) => {
      assert.ok(e instanceof ConnectionLost, String(e));
      assert.equal(e.name, "ConnectionLost");
      assert.match(e.message, /certificate|TLS/i);
      return true;
    });
  });

  test("a plaintext client gets no session from a TLS gateway", async () => {
    const c = await connect(target.replace("grpcs://", "grpc://"), { token: gw.token() });
    clients.push(c);
    await assert.rejects(c.session(), ConnectionLost);
  });
});
