"""Try four fixes side by side and keep the one whose tests pass.

    EXEC_GATEWAY_TARGET=grpc://127.0.0.1:8766 EXEC_GATEWAY_TOKEN=... python fork_fixes.py

Writes a small project with a failing test into a session's workspace,
saves the workspace as a snapshot, forks four sessions from it (each a
copy-on-write copy of its own), applies one candidate fix in each, runs the
tests in all four at once, keeps the first fork whose tests pass and
closes the others. The token needs the `snapshot` scope.
"""

import asyncio
import os
import sys

import exec_gateway

BUGGY = "def mean(xs):\n    return sum(xs) / len(xs) + 1\n"
TEST = ("import unittest\nfrom stats import mean\n"
        "class T(unittest.TestCase):\n"
        "    def test_mean(self): self.assertEqual(mean([1, 2, 3]), 2)\n"
        "    def test_empty(self): self.assertEqual(mean([]), 0)\n")
FIXES = {
    "drop the +1": "def mean(xs):\n    return sum(xs) / len(xs)\n",
    "guard empty": "def mean(xs):\n    return 0 if not xs else sum(xs) / len(xs) + 1\n",
    "both": "def mean(xs):\n    return 0 if not xs else sum(xs) / len(xs)\n",
    "round it": "def mean(xs):\n    return round(sum(xs) / len(xs))\n",
}


async def attempt(session: exec_gateway.Session, project: str, fix: str) -> bool:
    await session.files.write(f"{project}/stats.py", fix.encode())
    result = await session.run(["python3", "-m", "unittest", "-q"], cwd=project)
    return result.exit_code == 0


async def main() -> int:
    async with await exec_gateway.connect(os.environ["EXEC_GATEWAY_TARGET"],
                                          token=os.environ.get("EXEC_GATEWAY_TOKEN"),
                                          ca=os.environ.get("EXEC_GATEWAY_CA")) as client:
        origin = await client.session()
        project = f"{(await origin.environment_info()).cwd}/project"
        await origin.files.mkdir(project, parents=True)
        await origin.files.write(f"{project}/stats.py", BUGGY.encode())
        await origin.files.write(f"{project}/test_stats.py", TEST.encode())
        before = await origin.run(["python3", "-m", "unittest", "-q"], cwd=project)
        print(f"before: exit {before.exit_code}")
        snapshot = await origin.snapshot(name="failing tests")
        forks = await client.fork(snapshot, len(FIXES))
        passed = await asyncio.gather(*(attempt(s, project, fix)
                                        for s, fix in zip(forks, FIXES.values())))
        kept = None
        for (name, _), session, ok in zip(FIXES.items(), forks, passed):
            print(f"{name}: {'pass' if ok else 'fail'}")
            if ok and kept is None:
                kept = (name, session)
            else:
                await session.close()
        # The original workspace is untouched by every attempt.
        original = await origin.files.read_bytes(f"{project}/stats.py")
        print(f"original unchanged: {original == BUGGY.encode()}")
        await client.delete_snapshot(snapshot)
        if kept is None:
            print("no fix passed")
            return 1
        name, session = kept
        print(f"kept: {name} ({session.id})")
        return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
