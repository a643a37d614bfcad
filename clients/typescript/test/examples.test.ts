// The examples, run as a user would: separate node processes configured
// from the environment. resume-job is run twice: start, then resume.
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { existsSync } from "node:fs";
import path from "node:path";
import { after, before, describe, test } from "node:test";
import { promisify } from "node:util";
import { Gateway, PACKAGE_DIR, skipReason } from "./harness/gateway.js";

const run = promisify(execFile);
const EXAMPLES = path.join(PACKAGE_DIR, "build", "examples");

describe("examples", { skip: skipReason() }, () => {
  let gw: Gateway;
  let env: NodeJS.ProcessEnv;

  before(async () => {
    gw = await Gateway.start();
    env = { ...process.env, EXEC_GATEWAY_TARGET: gw.target, EXEC_GATEWAY_TOKEN: gw.token({ tenant: "examples" }) };
  });

  after(async () => {
    await gw?.stop();
  });

  function example(name: string, args: string[]): Promise<{ stdout: string; stderr: string }> {
    return run(process.execPath, [path.join(EXAMPLES, `${name}.js`), ...args], { env });
  }

  test("resume-job: a second process resumes the job and streams the rest, nothing twice", async () => {
    const state = path.join(gw.dir, "job.json");
    const job = ["sh", "-c", 'for i in $(seq 1 40); do echo "step $i"; sleep 0.05; done; exit 3'];
    const first = await example("resume-job", ["start", state, "--detach-after", "3", "--", ...job]);
    assert.match(first.stderr, /detached at seq \d+/);
    assert.ok(existsSync(state));
    const second = await example("resume-job", ["resume", state]).then(
      () => assert.fail("the job exits 3"),
      (e: { code: number; stdout: string }) => e,
    );
    assert.equal(second.code, 3);
    let expected = "";
    for (let i = 1; i <= 40; i++) expected += `step ${i}\n`;
    assert.equal(first.stdout + second.stdout, expected);
    assert.ok(!existsSync(state));
  });

  test("fork-fixes tries four fixes in forks and keeps the passing one", async () => {
    const r = await run(process.execPath, [path.join(EXAMPLES, "fork-fixes.js")], {
      env: { ...env, EXEC_GATEWAY_TOKEN: gw.token({ tenant: "examples", scope: "exec fs:read fs:write snapshot" }) },
    });
    const lines = r.stdout.split("\n").filter((l) => l !== "");
    assert.deepEqual(lines.slice(0, 6), [
      "before: exit 1",
      "drop the +1, integers: fail",
      "sum only: fail",
      "drop the +1: pass",
      "halve twice: fail",
      "original unchanged: true",
    ]);
    assert.match(lines[6] ?? "", /^kept: drop the \+1 \(/);
  });

  test("run-tests streams a suite's output and exits with its code", async () => {
    const ok = await example("run-tests", ["--", "sh", "-c", "echo testing; echo CI=$CI; echo warn >&2"]);
    assert.equal(ok.stdout, "testing\nCI=1\n");
    assert.equal(ok.stderr, "warn\n");
    const failed = await example("run-tests", ["--", "sh", "-c", "echo 1 failed; exit 1"]).then(
      () => assert.fail("the suite fails"),
      (e: { code: number; stdout: string }) => e,
    );
    assert.equal(failed.code, 1);
    assert.equal(failed.stdout, "1 failed\n");
  });

  test("agent-loop writes, runs and reads until it is done", async () => {
    const r = await example("agent-loop", ["20"]);
    assert.match(r.stdout, /^step 1: 0 1 1$/m);
    assert.match(r.stdout, /1597\npassed 1000; done\n$/);
  });
});
