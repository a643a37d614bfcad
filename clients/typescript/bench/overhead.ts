// What the SDK costs over the raw generated stubs, against a gateway
// (EXEC_GATEWAY_TARGET, EXEC_GATEWAY_TOKEN, EXEC_GATEWAY_CA):
//   node build/bench/overhead.js [--spawns N] [--mib M]
// - spawn: median of N `true` runs after a warm-up: `session.run` vs. an
//   Exec stream read to its end;
// - throughput: a process writing M MiB (default 64) to stdout, consumed
//   through the SDK's event iteration vs. the raw Exec stream.
// The tenant's requests_per_second must allow a few thousand calls a second.
// Prints one JSON line. Both sides use the same channel settings (message
// limits, a 1 MiB flow-control window), so the difference is the SDK's.
import { readFileSync } from "node:fs";
import { performance } from "node:perf_hooks";
import { Channel, credentials, Metadata, type ChannelCredentials } from "@grpc/grpc-js";
import { connect } from "@exec-gateway/client";
import { environment, process as pb, session as sessionPb } from "@exec-gateway/client/stubs";

function flag(name: string, fallback: number): number {
  const at = process.argv.indexOf(name);
  return at === -1 ? fallback : Number(process.argv[at + 1]);
}

const target = process.env["EXEC_GATEWAY_TARGET"];
const token = process.env["EXEC_GATEWAY_TOKEN"] ?? "";
const caFile = process.env["EXEC_GATEWAY_CA"];
if (!target) {
  console.error("set EXEC_GATEWAY_TARGET and EXEC_GATEWAY_TOKEN");
  process.exit(2);
}
const SPAWNS = flag("--spawns", 200);
const WARMUP = 20;
const MIB = flag("--mib", 64);
const BIG = ["head", "-c", String(MIB * 1024 * 1024), "/dev/zero"];

function median(xs: number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  const mid = s.length >> 1;
  return s.length % 2 ? s[mid]! : (s[mid - 1]! + s[mid]!) / 2;
}

const round = (x: number): number => Math.round(x * 100) / 100;

async function sdk(): Promise<{ spawn_p50_ms: number; throughput_mib_s: number }> {
  const client = await connect(target!, { token, ...(caFile ? { ca: caFile } : {}) });
  try {
    const s = await client.session();
    const times: number[] = [];
    for (let i = 0; i < WARMUP + SPAWNS; i++) {
      const t0 = performance.now();
      const r = await s.run(["true"]);
      if (r.exitCode !== 0) throw new Error(`true exited ${r.exitCode}`);
      if (i >= WARMUP) times.push(performance.now() - t0);
    }
    const t0 = performance.now();
    const p = await s.start(BIG);
    let bytes = 0;
    for await (const ev of p) if (ev.type === "output") bytes += ev.data.length;
    const secs = (performance.now() - t0) / 1000;
    if (bytes !== MIB * 1024 * 1024) throw new Error(`SDK read ${bytes} bytes`);
    await s.close();
    return { spawn_p50_ms: round(median(times)), throughput_mib_s: round(MIB / secs) };
  } finally {
    client.close();
  }
}

async function raw(): Promise<{ spawn_p50_ms: number; throughput_mib_s: number }> {
  const address = target!.replace(/^grpcs?:\/\//, "");
  const creds: ChannelCredentials = target!.startsWith("grpcs://")
    ? credentials.createSsl(caFile ? readFileSync(caFile) : null)
    : credentials.createInsecure();
  const channel = new Channel(address, creds, {
    "grpc.use_local_subchannel_pool": 1,
    "grpc.max_receive_message_length": 17 * 1024 * 1024,
    "grpc-node.flow_control_window": 1024 * 1024,
  });
  const opts = { channelOverride: channel };
  const sessions = new sessionPb.SessionServiceClient(address, creds, opts);
  const envs = new environment.EnvironmentServiceClient(address, creds, opts);
  const procs = new pb.ProcessServiceClient(address, creds, opts);
  const md = new Metadata();
  if (token) md.set("authorization", `Bearer ${token}`);
  try {
    const { sessionId } = await new Promise<sessionPb.CreateSessionResponse>((resolve, reject) =>
      sessions.createSession({ clientName: "bench raw", image: "", snapshot: "" }, md, (e, r) => (e ? reject(e) : resolve(r))),
    );
    const { cwd } = await new Promise<environment.GetInfoResponse>((resolve, reject) =>
      envs.getInfo({ sessionId }, md, (e, r) => (e ? reject(e) : resolve(r))),
    );
    let n = 0;
    /** Exec `argv` and read the stream to its end; the output bytes. */
    const exec = async (argv: string[]): Promise<number> => {
      const spec = pb.ProcessSpec.fromPartial({
        processId: `raw-${n++}`,
        argv,
        cwd,
        envPolicy: { inherit: pb.EnvInherit.ENV_INHERIT_ALL },
      });
      let bytes = 0;
      for await (const m of procs.exec({ sessionId, spec }, md) as AsyncIterable<pb.ExecResponse>) {
        const ev = m.event?.event;
        if (ev?.$case === "output") bytes += ev.output.data.length;
      }
      return bytes;
    };
    const times: number[] = [];
    for (let i = 0; i < WARMUP + SPAWNS; i++) {
      const t0 = performance.now();
      await exec(["true"]);
      if (i >= WARMUP) times.push(performance.now() - t0);
    }
    const t0 = performance.now();
    const bytes = await exec(BIG);
    const secs = (performance.now() - t0) / 1000;
    if (bytes !== MIB * 1024 * 1024) throw new Error(`raw read ${bytes} bytes`);
    await new Promise<void>((resolve, reject) =>
      sessions.closeSession({ sessionId }, md, (e) => (e ? reject(e) : resolve())),
    );
    return { spawn_p50_ms: round(median(times)), throughput_mib_s: round(MIB / secs) };
  } finally {
    channel.close();
  }
}

const result = { sdk: await sdk(), raw: await raw() };
console.log(JSON.stringify(result));
