// Try four fixes side by side and keep the one whose tests pass.
//   node build/examples/fork-fixes.js
// Writes a small project with a failing test into a session's workspace,
// saves the workspace as a snapshot, forks four sessions from it (each a
// copy-on-write copy of its own), applies one candidate fix in each, runs
// the tests in all four at once, keeps the first fork whose tests pass and
// closes the others. The token needs the `snapshot` scope.
import type { Session } from "@exec-gateway/client";
import { clientFromEnv } from "./env.js";

const BUGGY = 'echo "$1" "$2" | awk \'{ print ($1 + $2) / 2 + 1 }\'\n';
const TEST =
  'set -e\n[ "$(sh mean.sh 2 4)" = 3 ] || { echo "mean 2 4: $(sh mean.sh 2 4)"; exit 1; }\n' +
  '[ "$(sh mean.sh 3 4)" = 3.5 ] || { echo "mean 3 4: $(sh mean.sh 3 4)"; exit 1; }\necho ok\n';
const FIXES: Record<string, string> = {
  "drop the +1, integers": 'echo $(( ($1 + $2) / 2 ))\n',
  "sum only": 'echo $(( $1 + $2 ))\n',
  "drop the +1": 'echo "$1" "$2" | awk \'{ print ($1 + $2) / 2 }\'\n',
  "halve twice": 'echo "$1" "$2" | awk \'{ print ($1 + $2) / 4 }\'\n',
};

async function attempt(session: Session, fix: string): Promise<boolean> {
  await session.files.write("project/mean.sh", fix);
  const r = await session.run(["sh", "test.sh"], { cwd: "project" });
  return r.exitCode === 0;
}

const client = await clientFromEnv("fork-fixes example");
try {
  const origin = await client.session();
  await origin.files.mkdir("project", { parents: true });
  await origin.files.write("project/mean.sh", BUGGY);
  await origin.files.write("project/test.sh", TEST);
  const before = await origin.run(["sh", "test.sh"], { cwd: "project" });
  console.log(`before: exit ${before.exitCode}`);
  const snapshot = await origin.snapshot({ name: "failing tests" });
  const names = Object.keys(FIXES);
  const forks = await client.fork(snapshot, names.length);
  const passed = await Promise.all(forks.map((s, i) => attempt(s, FIXES[names[i]!]!)));
  let kept: [string, Session] | undefined;
  for (const [i, name] of names.entries()) {
    console.log(`${name}: ${passed[i] ? "pass" : "fail"}`);
    if (passed[i] && kept === undefined) kept = [name, forks[i]!];
    else await forks[i]!.close();
  }
  // The original workspace is untouched by every attempt.
  console.log(`original unchanged: ${(await origin.files.readText("project/mean.sh")) === BUGGY}`);
  await client.deleteSnapshot(snapshot);
  if (kept === undefined) {
    console.log("no fix passed");
    process.exitCode = 1;
  } else {
    console.log(`kept: ${kept[0]} (${kept[1].id})`);
  }
} finally {
  client.close();
}
