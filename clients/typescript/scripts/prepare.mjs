// `npm run prepare`: build the package (stubs from ../../proto, then tsc).
// npm runs it after `npm install` in this directory, and also when another
// project installs the package by path (`npm install ./clients/typescript`),
// where npm links this directory without installing its dev dependencies:
// the build tools (buf, ts-proto, typescript) are then installed here first,
// exactly as package-lock.json pins them.
import { spawnSync } from "node:child_process";
import { existsSync } from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";

const pkg = fileURLToPath(new URL("..", import.meta.url));
const npm = process.platform === "win32" ? "npm.cmd" : "npm";
const tools = [
  "node_modules/@bufbuild/buf/bin/buf",
  "node_modules/ts-proto/protoc-gen-ts_proto",
  "node_modules/typescript/bin/tsc",
  "node_modules/@grpc/grpc-js/package.json",
];

function run(args) {
  const r = spawnSync(npm, args, { cwd: pkg, stdio: "inherit" });
  if (r.error) throw r.error;
  if (r.status !== 0) process.exit(r.status ?? 1);
}

if (tools.some((t) => !existsSync(path.join(pkg, t)))) {
  console.error(`prepare: installing the build tools in ${pkg} (npm ci)`);
  // --ignore-scripts: not this script again; the tools need none of theirs.
  run(["ci", "--include=dev", "--ignore-scripts", "--no-audit", "--no-fund"]);
}
run(["run", "build"]);
