// Files against a real gateway, with a session and without one.
import assert from "node:assert/strict";
import { createHash, randomBytes } from "node:crypto";
import { after, before, describe, test } from "node:test";
import { connect, InvalidArgument, NotFound, type Client, type Files, type Session } from "@exec-gateway/client";
import { Gateway, skipReason } from "./harness/gateway.js";

describe("files", { skip: skipReason() }, () => {
  let gw: Gateway;
  let client: Client;
  let session: Session;
  let files: Files;
  let root: string;

  before(async () => {
    gw = await Gateway.start();
    client = await connect(gw.target, { token: gw.token() });
    session = await client.session();
    files = session.files;
    root = (await session.environmentInfo()).cwd;
  });

  after(async () => {
    client?.close();
    await gw?.stop();
  });

  test("write takes bytes, text and (async) iterables of chunks and returns the bytes written", async () => {
    assert.equal(await files.write(`${root}/bytes.bin`, new Uint8Array([1, 2, 3])), 3);
    assert.deepEqual([...(await files.readBytes(`${root}/bytes.bin`))], [1, 2, 3]);
    assert.equal(await files.write("text.txt", "héllo"), 6);
    assert.equal(await files.readText("text.txt"), "héllo");
    assert.equal(await files.write("iter.txt", ["a", new Uint8Array([0x62]), "c"]), 3);
    assert.equal(await files.readText("iter.txt"), "abc");
    async function* chunks(): AsyncGenerator<string> {
      yield "x";
      await new Promise((r) => setImmediate(r));
      yield "yz";
    }
    assert.equal(await files.write("async.txt", chunks()), 3);
    assert.equal(await files.readText("async.txt"), "xyz");
    assert.equal(await files.write("empty.txt", ""), 0);
    assert.equal((await files.stat("empty.txt")).size, 0);
  });

  test("a file larger than one message streams whole, and read takes offset and length", async () => {
    const data = randomBytes(5 * 1024 * 1024 + 123);
    assert.equal(await files.write("big.bin", data), data.length);
    const chunks: Uint8Array[] = [];
    for await (const c of files.read("big.bin")) chunks.push(c);
    assert.ok(chunks.length > 1, "more than one chunk");
    const got = Buffer.concat(chunks);
    assert.equal(createHash("sha256").update(got).digest("hex"), createHash("sha256").update(data).digest("hex"));
    const part = await files.readBytes("big.bin", { offset: 1_000_000, length: 2_000_000 });
    assert.ok(Buffer.from(part).equals(data.subarray(1_000_000, 3_000_000)));
    const tail = await files.readBytes("big.bin", { offset: data.length - 10 });
    assert.ok(Buffer.from(tail).equals(data.subarray(data.length - 10)));
  });

  test("write of a failing iterable raises its error and does not report success", async () => {
    function* broken(): Generator<string> {
      yield "partial";
      throw new Error("source failed");
    }
    await assert.rejects(files.write("broken.txt", broken()), /source failed/);
  });

  test("mkdir, list, stat, copy, remove", async () => {
    await files.mkdir("d1/d2/d3", { parents: true });
    await files.mkdir("d1/d2/d3", { parents: true });
    await assert.rejects(files.mkdir("nope/child"));
    await files.write("d1/f.txt", "f");
    const entries = (await files.list("d1")).sort((a, b) => a.name.localeCompare(b.name));
    assert.deepEqual(entries, [
      { name: "d2", isDirectory: true, isFile: false },
      { name: "f.txt", isDirectory: false, isFile: true },
    ]);
    const st = await files.stat("d1/f.txt");
    assert.equal(st.isFile, true);
    assert.equal(st.isDirectory, false);
    assert.equal(st.isSymlink, false);
    assert.equal(st.size, 1);
    assert.ok(st.modifiedAtMs > 0);
    assert.equal((await files.stat("d1")).isDirectory, true);

    await files.copy("d1/f.txt", "d1/g.txt");
    assert.equal(await files.readText("d1/g.txt"), "f");
    await assert.rejects(files.copy("d1", "d1copy"), InvalidArgument);
    await files.copy("d1", "d1copy", { recursive: true });
    assert.equal(await files.readText("d1copy/d2/../f.txt"), "f");

    await assert.rejects(files.remove("d1"));
    await files.remove("d1", { recursive: true });
    assert.equal(await files.exists("d1"), false);
    await assert.rejects(files.remove("d1"), NotFound);
    await files.remove("d1", { force: true });
  });

  test("walk lists a tree breadth first within limits", async () => {
    await files.mkdir("w/a/b", { parents: true });
    await files.write("w/top.txt", "t");
    await files.write("w/a/mid.txt", "m");
    await files.write("w/a/b/deep.txt", "d");
    const all = await files.walk("w");
    assert.deepEqual(
      all.entries.map((e) => [e.path.slice(root.length + 1), e.kind]),
      [
        ["w/a", "directory"],
        ["w/top.txt", "file"],
        ["w/a/b", "directory"],
        ["w/a/mid.txt", "file"],
        ["w/a/b/deep.txt", "file"],
      ],
    );
    assert.equal(all.truncated, false);
    assert.deepEqual(all.errors, []);
    const shallow = await files.walk("w", { maxDepth: 1 });
    assert.ok(!shallow.entries.some((e) => e.path.endsWith("deep.txt")));
    const few = await files.walk("w", { maxEntries: 2 });
    assert.equal(few.entries.length, 2);
    assert.equal(few.truncated, true);
  });

  test("canonicalize resolves symlinks and dot-dot inside the root", async () => {
    await files.mkdir("c/real", { parents: true });
    await session.run(["ln", "-s", "real", "c/link"]);
    assert.equal(await files.canonicalize("c/link/../real/./"), `${root}/c/real`);
    assert.equal(await files.canonicalize(`${root}/c/link`), `${root}/c/real`);
    assert.equal((await files.stat("c/link")).isSymlink, true);
  });

  test("client.files reaches the tenant root without a session", async () => {
    await client.files.write("sessionless.txt", "no session");
    assert.equal(await files.readText("sessionless.txt"), "no session");
    assert.ok((await client.files.list(root)).some((e) => e.name === "sessionless.txt"));
    assert.equal((await client.environmentInfo()).cwd, root);
  });

  test("missing paths and paths outside the root are NotFound", async () => {
    await assert.rejects(files.readBytes("missing.txt"), NotFound);
    await assert.rejects(files.stat("missing.txt"), NotFound);
    await assert.rejects(files.readBytes("/etc/hostname"), NotFound);
    await assert.rejects(files.write("/etc/owned", "x"), NotFound);
    await assert.rejects(client.files.list("/"), NotFound);
  });

  test("aborting a read cancels it with an AbortError", async () => {
    await files.write("abort.bin", randomBytes(4 * 1024 * 1024));
    const ac = new AbortController();
    const it = files.read("abort.bin", { signal: ac.signal })[Symbol.asyncIterator]();
    assert.equal((await it.next()).done, false);
    ac.abort();
    await assert.rejects(it.next(), { name: "AbortError" });
  });
});
