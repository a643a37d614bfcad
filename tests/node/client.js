// A Node.js client of exec-gateway's gRPC API, with the protos loaded as
// they are (@grpc/proto-loader) and @grpc/grpc-js:
//   node client.js TARGET FILE [TOKEN]
// TARGET and TOKEN may come from EXEC_GATEWAY_TARGET / EXEC_GATEWAY_TOKEN
// instead (the environment keeps the token out of `ps`). Runs
// ProcessService/Exec in a session of its own and a streamed
// FileService/ReadFile of FILE, and prints one JSON line with what it saw.
// A call that fails prints {"error": {"code", "details", "call"}} and
// exits 1. With EXEC_GATEWAY_CA (a PEM file) it speaks TLS, trusting that
// CA.
"use strict";

const path = require("path");
const crypto = require("crypto");
const grpc = require("@grpc/grpc-js");
const loader = require("@grpc/proto-loader");

const args = process.argv.slice(2);
const target = args[0] || process.env.EXEC_GATEWAY_TARGET;
const file = args[1];
const token = args[2] || process.env.EXEC_GATEWAY_TOKEN || "";
if (!target || !file) {
  console.error("usage: node client.js TARGET FILE [TOKEN]");
  process.exit(2);
}

// keepCase: the fields keep their proto names (session_id, exit_code);
// longs as Numbers (seqs are small); enums by name; the oneof's case in
// `event`.
const def = loader.loadSync(
  ["exec_gateway/v1/process.proto", "exec_gateway/v1/file.proto"],
  {
    includeDirs: [path.join(__dirname, "..", "..", "proto")],
    keepCase: true,
    longs: Number,
    enums: String,
    defaults: true,
    oneofs: true,
  },
);
const v1 = grpc.loadPackageDefinition(def).exec_gateway.v1;
const ca = process.env.EXEC_GATEWAY_CA;
const creds = ca
  ? grpc.credentials.createSsl(require("fs").readFileSync(ca))
  : grpc.credentials.createInsecure();
const processes = new v1.ProcessService(target, creds);
const files = new v1.FileService(target, creds);
const md = new grpc.Metadata();
md.set("authorization", `Bearer ${token}`);

function exec() {
  return new Promise((resolve, reject) => {
    const out = { stdout: [], stderr: [] };
    const seen = { exitCode: null, seqs: [], events: [], closed: false };
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
      seen.events.push(ev.event);
      if (ev.event === "output") {
        const s = ev.output.stream === "OUTPUT_STREAM_STDERR" ? "stderr" : "stdout";
        out[s].push(Buffer.from(ev.output.data));
      } else if (ev.event === "exited") {
        seen.exitCode = ev.exited.exit_code;
      } else if (ev.event === "closed") {
        seen.closed = true;
      }
    });
    call.on("error", (err) => reject(Object.assign(err, { call: "Exec" })));
    call.on("end", () => {
      const stdout = Buffer.concat(out.stdout);
      const stderr = Buffer.concat(out.stderr);
      resolve({
        ...seen,
        stdout: stdout.toString("utf8"),
        stderr: stderr.toString("utf8"),
        stdoutBytes: stdout.length,
        stderrBytes: stderr.length,
      });
    });
  });
}

function readFile(p) {
  return new Promise((resolve, reject) => {
    const hash = crypto.createHash("sha256");
    const seen = { bytes: 0, messages: 0, largestMessage: 0 };
    const call = files.ReadFile({ path: p }, md);
    call.on("data", (msg) => {
      hash.update(msg.data);
      seen.bytes += msg.data.length;
      seen.messages += 1;
      seen.largestMessage = Math.max(seen.largestMessage, msg.data.length);
    });
    call.on("error", (err) => reject(Object.assign(err, { call: "ReadFile" })));
    call.on("end", () => resolve({ ...seen, sha256: hash.digest("hex") }));
  });
}

(async () => {
  let result;
  try {
    const ran = await exec();
    const read = await readFile(file);
    result = { exec: ran, readFile: read };
  } catch (err) {
    if (err.code === undefined) throw err;
    result = { error: { code: grpc.status[err.code], details: err.details, call: err.call } };
    process.exitCode = 1;
  } finally {
    processes.close();
    files.close();
  }
  console.log(JSON.stringify(result));
})();
