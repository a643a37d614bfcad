// Previews (`session.createPreview`, `revokePreview`, `listPreviews`): an
// http.server in the session reached over HTTP on the gateway's client
// listener, by a signed URL (exchanged for its cookie) and by a public
// path, until revoked; and the refusals.
import assert from "node:assert/strict";
import { existsSync } from "node:fs";
import http from "node:http";
import { after, before, describe, test } from "node:test";
import { connect, Forbidden, InvalidArgument, NotFound, type Client, type Session } from "@exec-gateway/client";
import { Gateway, skipReason } from "./harness/gateway.js";

const scope = "exec fs:read fs:write preview";
const PORT = 8000;
const PREVIEW = '[preview]\nbase_url = "http://preview.test"\n';

/** Why previews cannot run here: they need network namespaces. */
function netnsSkip(): string | undefined {
  const base = skipReason();
  if (base !== undefined) return base;
  if (process.getuid?.() !== 0) return "previews need network namespaces (root)";
  const has = (t: string): boolean => ["/usr/sbin", "/usr/bin", "/sbin", "/bin"].some((d) => existsSync(`${d}/${t}`));
  if (!has("slirp4netns") || !has("nft")) return "previews need slirp4netns and nft";
  return undefined;
}

/** python3's http.server on the session's 127.0.0.1:8000, listening. */
async function serving(session: Session): Promise<void> {
  const server = await session.start(["python3", "-u", "-m", "http.server", String(PORT), "--bind", "127.0.0.1"]);
  let seen = "";
  for await (const e of server.events()) {
    if (e.type === "output") {
      seen += Buffer.from(e.data).toString();
      if (seen.includes("Serving HTTP")) return;
    }
  }
  throw new Error(`http.server ended: ${seen}`);
}

interface Answer {
  status: number;
  headers: http.IncomingHttpHeaders;
  body: string;
}

/** GET `target` from the gateway's client listener (`ws://HOST:PORT`), the body read. */
function get(listenUrl: string, target: string, headers: Record<string, string> = {}): Promise<Answer> {
  const { hostname, port } = new URL(listenUrl);
  return new Promise((resolve, reject) => {
    const req = http.request({ host: hostname, port: Number(port), path: target, headers, agent: false }, (res) => {
      const chunks: Buffer[] = [];
      res.on("data", (c: Buffer) => chunks.push(c));
      res.on("end", () =>
        resolve({ status: res.statusCode ?? 0, headers: res.headers, body: Buffer.concat(chunks).toString() }),
      );
      res.on("error", reject);
    });
    req.on("error", reject);
    req.end();
  });
}

describe("previews", { skip: netnsSkip() }, () => {
  let gw: Gateway;
  let client: Client;

  before(async () => {
    gw = await Gateway.start({ extra: PREVIEW });
    client = await connect(gw.target, { token: gw.token({ scope }) });
  });

  after(async () => {
    client?.close();
    await gw?.stop();
  });

  test("a signed URL opens the port until revoked", async (t) => {
    const session = await client.session();
    t.after(() => session.close());
    await serving(session);
    const preview = await session.createPreview(PORT, { expiresInSecs: 600 });
    assert.deepEqual([preview.port, preview.public, preview.path], [PORT, false, `/preview/${session.id}/${PORT}/`]);
    assert.ok(preview.expiresAtMs !== null && Math.abs(preview.expiresAtMs - (Date.now() + 600_000)) < 60_000);
    assert.ok(preview.url !== null);
    const url = new URL(preview.url);
    assert.equal(url.protocol, "http:");
    assert.equal(url.hostname, `${PORT}-${session.id.replaceAll("-", "")}.preview.test`);
    assert.ok(url.searchParams.has("exg_preview"));
    const listed = await session.listPreviews();
    assert.deepEqual(listed.ports, [{ port: PORT, public: false }]);
    assert.equal(typeof listed.openConnections, "number");

    // The URL's first use: a 303 to itself without the grant, and the cookie.
    const host = { Host: url.hostname };
    const first = await get(gw.listenUrl, url.pathname + url.search, host);
    assert.equal(first.status, 303, first.body);
    const cookie = first.headers["set-cookie"]?.[0] ?? "";
    assert.ok(cookie.startsWith("exg_preview="), cookie);
    assert.match(cookie, /HttpOnly/);
    const withCookie = { ...host, Cookie: cookie.split(";")[0]! };
    const page = await get(gw.listenUrl, "/", withCookie);
    assert.equal(page.status, 200, page.body);
    assert.match(page.body, /Directory listing/);

    await session.revokePreview(PORT);
    assert.equal((await get(gw.listenUrl, "/", withCookie)).status, 403);
    // A URL minted after the revocation works.
    const again = new URL((await session.createPreview(PORT)).url!);
    assert.equal((await get(gw.listenUrl, again.pathname + again.search, host)).status, 303);
  });

  test("a public port is open to anyone until revoked", async (t) => {
    const session = await client.session();
    t.after(() => session.close());
    await serving(session);
    const path = `/preview/${session.id}/${PORT}/`;
    assert.equal((await get(gw.listenUrl, path)).status, 401);
    const preview = await session.createPreview(PORT, { public: true });
    assert.deepEqual(
      [preview.port, preview.path, preview.public, preview.expiresAtMs],
      [PORT, path, true, null],
    );
    assert.ok(preview.url !== null && !preview.url.includes("exg_preview"));
    assert.deepEqual((await session.listPreviews()).ports, [{ port: PORT, public: true }]);
    const page = await get(gw.listenUrl, path);
    assert.equal(page.status, 200, page.body);
    assert.match(page.body, /Directory listing/);

    await session.revokePreview(PORT);
    assert.equal((await get(gw.listenUrl, path)).status, 401);
    assert.deepEqual((await session.listPreviews()).ports, [{ port: PORT, public: false }]);
  });

  test("previews are refused", async () => {
    const session = await client.session();
    await assert.rejects(session.createPreview(0), InvalidArgument);
    await assert.rejects(session.createPreview(PORT, { public: true, expiresInSecs: 60 }), InvalidArgument);
    await assert.rejects(session.createPreview(PORT, { expiresInSecs: 30 * 24 * 3600 }), InvalidArgument);
    assert.deepEqual(await session.listPreviews(), { ports: [], openConnections: 0 });
    await session.close();
    await assert.rejects(session.createPreview(PORT), NotFound);
    // No `preview` scope.
    const unscoped = await connect(gw.target, { token: gw.token() });
    try {
      const s = await unscoped.session();
      await assert.rejects(s.createPreview(PORT), Forbidden);
      await assert.rejects(s.listPreviews(), Forbidden);
      await s.close();
    } finally {
      unscoped.close();
    }
  });
});

describe("previews without base_url", { skip: netnsSkip() }, () => {
  test("only a public preview, and no URL", async () => {
    const gw = await Gateway.start();
    const client = await connect(gw.target, { token: gw.token({ scope }) });
    try {
      const session = await client.session();
      await assert.rejects(session.createPreview(PORT), InvalidArgument);
      const preview = await session.createPreview(PORT, { public: true });
      assert.deepEqual([preview.url, preview.path], [null, `/preview/${session.id}/${PORT}/`]);
      await session.close();
    } finally {
      client.close();
      await gw.stop();
    }
  });
});
