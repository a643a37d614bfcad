// Sessions on an image (`client.session({ image })`): a busybox image
// written here as an OCI layout the tenant may use.
import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { existsSync, readFileSync } from "node:fs";
import { mkdir, mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { after, before, describe, test } from "node:test";
import { connect, Forbidden, type Client } from "@exec-gateway/client";
import { Gateway, skipReason } from "./harness/gateway.js";

/** One tar entry: a directory, a file or a symbolic link. */
type Entry = { name: string; mode: number } & ({ dir: true } | { data: Buffer } | { link: string });

/** A ustar archive of `entries`. */
function tar(entries: Entry[]): Buffer {
  const blocks: Buffer[] = [];
  for (const e of entries) {
    const h = Buffer.alloc(512);
    const field = (at: number, len: number, s: string): void => void h.write(s, at, len, "utf8");
    const octal = (at: number, len: number, n: number): void => field(at, len, n.toString(8).padStart(len - 1, "0"));
    const data = "data" in e ? e.data : Buffer.alloc(0);
    field(0, 100, e.name);
    octal(100, 8, e.mode);
    octal(108, 8, 0);
    octal(116, 8, 0);
    octal(124, 12, data.length);
    octal(136, 12, 1_700_000_000);
    field(156, 1, "dir" in e ? "5" : "link" in e ? "2" : "0");
    if ("link" in e) field(157, 100, e.link);
    field(257, 6, "ustar");
    field(263, 2, "00");
    h.fill(" ", 148, 156);
    let sum = 0;
    for (const b of h) sum += b;
    field(148, 8, `${sum.toString(8).padStart(6, "0")}\0 `);
    blocks.push(h, data, Buffer.alloc((512 - (data.length % 512)) % 512));
  }
  blocks.push(Buffer.alloc(1024));
  return Buffer.concat(blocks);
}

/** An OCI image layout at `dir` tagged `v1`: /bin/busybox with `cat` linked to it, and /usr/share/marker. */
async function busyboxLayout(dir: string, marker: string): Promise<string> {
  const layer = tar([
    { name: "bin", mode: 0o755, dir: true },
    { name: "bin/busybox", mode: 0o755, data: readFileSync("/bin/busybox") },
    { name: "bin/cat", mode: 0o777, link: "busybox" },
    { name: "usr", mode: 0o755, dir: true },
    { name: "usr/share", mode: 0o755, dir: true },
    { name: "usr/share/marker", mode: 0o644, data: Buffer.from(marker) },
  ]);
  const blobs = path.join(dir, "blobs", "sha256");
  await mkdir(blobs, { recursive: true });
  const sha = (b: Buffer): string => createHash("sha256").update(b).digest("hex");
  const put = async (b: Buffer): Promise<{ digest: string; size: number }> => {
    await writeFile(path.join(blobs, sha(b)), b);
    return { digest: `sha256:${sha(b)}`, size: b.length };
  };
  const json = (v: unknown): Buffer => Buffer.from(JSON.stringify(v));
  const config = await put(
    json({
      architecture: "amd64",
      os: "linux",
      config: { Env: ["PATH=/bin"] },
      rootfs: { type: "layers", diff_ids: [`sha256:${sha(layer)}`] },
    }),
  );
  const manifest = await put(
    json({
      schemaVersion: 2,
      mediaType: "application/vnd.oci.image.manifest.v1+json",
      config: { mediaType: "application/vnd.oci.image.config.v1+json", ...config },
      layers: [{ mediaType: "application/vnd.oci.image.layer.v1.tar", ...(await put(layer)) }],
    }),
  );
  await writeFile(
    path.join(dir, "index.json"),
    json({
      schemaVersion: 2,
      manifests: [
        {
          mediaType: "application/vnd.oci.image.manifest.v1+json",
          ...manifest,
          annotations: { "org.opencontainers.image.ref.name": "v1" },
        },
      ],
    }),
  );
  await writeFile(path.join(dir, "oci-layout"), '{"imageLayoutVersion":"1.0.0"}');
  return `oci:${dir}:v1`;
}

const skip = skipReason() ?? (existsSync("/bin/busybox") ? undefined : "busybox-static (/bin/busybox) is not installed");

describe("sessions on an image", { skip }, () => {
  let work: string;
  let image: string;
  let gw: Gateway;
  let client: Client;

  before(async () => {
    work = await mkdtemp(path.join(tmpdir(), "eg-ts-image-"));
    image = await busyboxLayout(path.join(work, "layout"), "from-typescript");
    gw = await Gateway.start({
      templateExtra: `images = ["${image}"]\n`,
      extra: `[images]\nstore = "${work}/store"\n`,
    });
    client = await connect(gw.target, { token: gw.token() });
  });

  after(async () => {
    client?.close();
    await gw?.stop();
    if (work) await rm(work, { recursive: true, force: true });
  });

  // Guards: `image` reaches CreateSession; without it the session is on
  // the host; an image the tenant may not use is refused.
  test("a session runs on the image it asks for", async () => {
    const onImage = await client.session({ image });
    const r = await onImage.run(["/bin/cat", "/usr/share/marker"]);
    assert.deepEqual([r.stdoutText, r.exitCode], ["from-typescript", 0]);
    const onHost = await client.session();
    assert.notEqual((await onHost.run(["/bin/cat", "/usr/share/marker"])).exitCode, 0);
    await assert.rejects(client.session({ image: `oci:${work}/elsewhere:v1` }), Forbidden);
    await assert.rejects(client.session({ resume: onImage.id, image }), TypeError);
    await onImage.close();
    await onHost.close();
  });
});
