// Start a long job, leave, and pick it up from another process:
//   node build/examples/resume-job.js start STATE_FILE [--detach-after N] [-- COMMAND ARGS...]
//   node build/examples/resume-job.js resume STATE_FILE
// `start` starts the job, streams its first N events (default 5), saves the
// session id, process id and last seq to STATE_FILE and exits, leaving the
// job running. `resume` resumes the session, streams the rest of the
// output from after that seq (nothing repeated, nothing lost while the
// gateway retains it) and exits with the job's exit code.
//
// The gateway keeps a session without callers for its detach TTL (10 s by
// default for gRPC sessions, `server.detach_ttl`) and a process's newest
// 1 MiB of output: resume within that.
import { readFile, rm, writeFile } from "node:fs/promises";
import { clientFromEnv } from "./env.js";

interface State {
  sessionId: string;
  processId: string;
  seq: number;
}

const DEFAULT_JOB = ["sh", "-c", 'for i in $(seq 1 30); do echo "step $i"; sleep 0.2; done'];

const [mode, stateFile, ...rest] = process.argv.slice(2);
if ((mode !== "start" && mode !== "resume") || !stateFile) {
  console.error("usage: resume-job.js start|resume STATE_FILE [--detach-after N] [-- COMMAND ARGS...]");
  process.exit(2);
}

const client = await clientFromEnv("resume-job example");
try {
  if (mode === "start") {
    const dash = rest.indexOf("--");
    const job = dash === -1 ? DEFAULT_JOB : rest.slice(dash + 1);
    const flags = dash === -1 ? rest : rest.slice(0, dash);
    const at = flags.indexOf("--detach-after");
    const detachAfter = at === -1 ? 5 : Number(flags[at + 1]);
    const session = await client.session();
    const job_ = await session.start(job);
    let seq = 0;
    let seen = 0;
    for await (const ev of job_) {
      if (ev.type === "output") process.stdout.write(ev.data);
      seq = ev.seq;
      if (ev.type === "closed" || ++seen >= detachAfter) break;
    }
    const state: State = { sessionId: session.id, processId: job_.id, seq };
    await writeFile(stateFile, JSON.stringify(state));
    console.error(`detached at seq ${seq}; state saved to ${stateFile}`);
  } else {
    const state = JSON.parse(await readFile(stateFile, "utf8")) as State;
    const session = await client.session({ resume: state.sessionId });
    const job = session.process(state.processId);
    let exitCode = 0;
    for await (const ev of job.events({ afterSeq: state.seq })) {
      if (ev.type === "output") process.stdout.write(ev.data);
      else if (ev.type === "outputLost") console.error(`[${ev.chunks} chunks no longer retained]`);
      else if (ev.type === "exited") exitCode = ev.signal === null ? ev.exitCode : 128 + ev.signal;
    }
    await session.close();
    await rm(stateFile);
    process.exitCode = exitCode;
  }
} finally {
  client.close();
}
