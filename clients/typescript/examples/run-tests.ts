// Run a test suite in the tenant and stream its output live:
//   node build/examples/run-tests.js [--cwd DIR] [--timeout SECONDS] -- COMMAND [ARGS...]
// e.g. `-- sh -c "cd project && make test"`. Ctrl-C interrupts the remote
// suite; the exit code is the suite's (128 + n if a signal n killed it).
import { clientFromEnv } from "./env.js";

function parse(args: string[]): { cwd?: string; timeoutS?: number; argv: string[] } {
  const dash = args.indexOf("--");
  const argv = dash === -1 ? [] : args.slice(dash + 1);
  const flags = dash === -1 ? args : args.slice(0, dash);
  const out: { cwd?: string; timeoutS?: number; argv: string[] } = { argv };
  for (let i = 0; i < flags.length; i += 2) {
    const [flag, value] = [flags[i], flags[i + 1]];
    if (value === undefined) throw new Error(`${flag} needs a value`);
    if (flag === "--cwd") out.cwd = value;
    else if (flag === "--timeout") out.timeoutS = Number(value);
    else throw new Error(`unknown flag ${flag}`);
  }
  if (argv.length === 0) throw new Error("usage: run-tests.js [--cwd DIR] [--timeout SECONDS] -- COMMAND [ARGS...]");
  return out;
}

const opts = parse(process.argv.slice(2));
const client = await clientFromEnv("run-tests example");
let exitCode = 1;
try {
  const session = await client.session();
  const suite = await session.start(opts.argv, {
    ...(opts.cwd ? { cwd: opts.cwd } : {}),
    env: { CI: "1" },
  });
  // Ctrl-C here interrupts the suite there; its exit ends the stream.
  const interrupt = (): void => {
    suite.signal("interrupt").catch((e: unknown) => console.error(`could not interrupt: ${String(e)}`));
  };
  process.on("SIGINT", interrupt);
  const timer =
    opts.timeoutS === undefined
      ? undefined
      : setTimeout(() => {
          console.error(`timed out after ${opts.timeoutS} s; terminating`);
          suite.terminate().catch((e: unknown) => console.error(`could not terminate: ${String(e)}`));
        }, opts.timeoutS * 1000);
  try {
    for await (const ev of suite) {
      switch (ev.type) {
        case "output":
          (ev.stream === "stderr" ? process.stderr : process.stdout).write(ev.data);
          break;
        case "outputLost":
          console.error(`[${ev.chunks} output chunks no longer retained]`);
          break;
        case "exited":
          exitCode = ev.signal === null ? ev.exitCode : 128 + ev.signal;
          break;
        case "closed":
          break;
      }
    }
  } finally {
    clearTimeout(timer);
    process.off("SIGINT", interrupt);
  }
  await session.close();
} finally {
  client.close();
}
process.exitCode = exitCode;
