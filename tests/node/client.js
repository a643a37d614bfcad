// A Node.js client of exec-gateway's gRPC API, with the protos loaded as
// they are (@grpc/proto-loader) and @grpc/grpc-js:
//   node client.js TARGET FILE     (token in EXEC_GATEWAY_TOKEN)
// runs ProcessService/Exec and a streamed FileService/ReadFile of FILE,
// and prints one JSON line with what it saw. A call that fails prints
// {"error": {"code", "details"}} and exits 1.
"use strict";

const path = require("path");
const crypto = require("crypto");
const grpc = require("@grpc/grpc-js");
const loader = require("@grpc/proto-loader");

const [target, file] = process.argv.slice(2);
const token = process.env.EXEC_GATEWAY_TOKEN || "";

const def = loader.loadSync(
  ["exec_gateway/v1/process.proto", "exec_gateway/v1/file.proto"],
  { includeDirs: [path.join(__dirname, "..", "..", "proto")], keepCase: true, longs: Number, enums: String, defaults: true, oneofs: true },
);
const v1 = grpc.loadPackageDefinition(def).exec_gateway.v1;
const creds = grpc.credentials.createInsecure();
const processes = new v1.ProcessService(target, creds);
const files = new v1.FileService(target, creds);
const md = new grpc.Metadata();
md.set("authorization", `Bearer ${token}`);

function fail(err) {
  console.log(JSON.stringify({ error: { code: grpc.status[err.code], details: err.details } }));
  process.exit(1);
}

function exec() {
  return new Promise((resolve, reject) => {
    const seen = { stdout: "", stderr: "", exitCode: null, seqs: [], closed: false };
    // An empty session_id: the call makes its own session.
    const call = processes.Exec({
      session_id: "",
      spec: {
        process_id: "node1",
        argv: ["sh", "-c", "echo hello-from-node; echo err >&2; exit 7"],
        cwd: "/tmp",
        env: { PATH: "/usr/bin:/bin" },
      },
    }, md);
    call.on("data", (msg) => {
      const ev = msg.event;
      seen.seqs.push(ev.seq);
      if (ev.event === "output") {
        const text = Buffer.from(ev.output.data).toString();
        if (ev.output.stream === "OUTPUT_STREAM_STDERR") seen.stderr += text; else seen.stdout += text;
      } else if (ev.event === "exited") {
        seen.exitCode = ev.exited.exit_code;
      } else if (ev.event === "closed") {
        seen.closed = true;
      }
    });
    call.on("error", reject);
    call.on("end", () => resolve(seen));
  });
}

function readFile(p) {
  return new Promise((resolve, reject) => {
    const hash = crypto.createHash("sha256");
    const seen = { bytes: 0, messages: 0 };
    const call = files.ReadFile({ path: p }, md);
    call.on("data", (msg) => {
      hash.update(msg.data);
      seen.bytes += msg.data.length;
      seen.messages += 1;
    });
    call.on("error", reject);
    call.on("end", () => resolve({ ...seen, sha256: hash.digest("hex") }));
  });
}

(async () => {
  try {
    const ran = await exec();
    const read = await readFile(file);
    console.log(JSON.stringify({ exec: ran, readFile: read }));
    processes.close();
    files.close();
  } catch (err) {
    fail(err);
  }
})();
