// An agent's loop: write a file, run it, read the result, decide, repeat.
//   node build/examples/agent-loop.js [STEPS]
// Each step writes a small script that extends a Fibonacci sequence kept in
// a file, runs it, and reads the file back to choose the next step; it stops
// after STEPS steps (default 10) or once a number passes 1000.
import { clientFromEnv } from "./env.js";

const steps = Number(process.argv[2] ?? 10);
const client = await clientFromEnv("agent-loop example");
try {
  const session = await client.session();
  const dir = "agent-loop";
  await session.files.mkdir(dir, { parents: true });
  await session.files.write(`${dir}/state.txt`, "0 1\n");
  for (let step = 1; step <= steps; step++) {
    // "Think": the next action, as a program.
    const script = `${dir}/step-${step}.sh`;
    await session.files.write(
      script,
      "#!/bin/sh\nset -eu\nset -- $(cat state.txt)\n" +
        'shift $(($# - 2))\necho "$(cat state.txt) $(($1 + $2))" > state.tmp && mv state.tmp state.txt\n',
    );
    // "Act": run it where the files are.
    const r = await session.run(["sh", `step-${step}.sh`], { cwd: dir, timeoutMs: 30_000 });
    if (r.exitCode !== 0) {
      console.error(`step ${step} failed (${r.exitCode}): ${r.stderrText}`);
      process.exitCode = 1;
      break;
    }
    // "Observe": read the result back and decide.
    const numbers = (await session.files.readText(`${dir}/state.txt`)).trim().split(/\s+/).map(Number);
    const last = numbers.at(-1) ?? 0;
    console.log(`step ${step}: ${numbers.join(" ")}`);
    if (last > 1000) {
      console.log("passed 1000; done");
      break;
    }
  }
  await session.files.remove(dir, { recursive: true });
  await session.close();
} finally {
  client.close();
}
