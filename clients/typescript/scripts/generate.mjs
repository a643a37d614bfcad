// Generates the gRPC stubs (src/gen/) from the repository's protos
// (../../proto) with buf and ts-proto, as buf.gen.yaml says. Runs from the
// package's own directory whatever the caller's working directory is, and
// starts from an empty src/gen/ so that a proto removed upstream leaves no
// stale stub behind.
import { spawnSync } from "node:child_process";
import { existsSync, rmSync } from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";

const pkg = fileURLToPath(new URL("..", import.meta.url));
const protos = path.join(pkg, "..", "..", "proto", "exec_gateway", "v1");
const out = path.join(pkg, "src", "gen");

if (!existsSync(protos)) {
  console.error(
    `generate: ${protos} not found: the stubs are generated from the exec-gateway ` +
      "repository's protos; build this package inside its checkout (clients/typescript).",
  );
  process.exit(1);
}
for (const tool of ["node_modules/@bufbuild/buf/bin/buf", "node_modules/ts-proto/protoc-gen-ts_proto"]) {
  if (!existsSync(path.join(pkg, tool))) {
    console.error(`generate: ${tool} is missing: run \`npm install\` in ${pkg} first.`);
    process.exit(1);
  }
}

rmSync(out, { recursive: true, force: true });
const buf = spawnSync(
  process.execPath,
  [path.join(pkg, "node_modules/@bufbuild/buf/bin/buf"), "generate", "--template", "buf.gen.yaml"],
  { cwd: pkg, stdio: "inherit" },
);
if (buf.error) throw buf.error;
if (buf.status !== 0) {
  console.error(`generate: buf generate failed (exit ${buf.status ?? buf.signal})`);
  process.exit(1);
}
