"""The examples, run as a user would run them, against a real gateway."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

EXAMPLES = pathlib.Path(__file__).resolve().parents[1] / "examples"


def run(gateway, *args, **kw) -> subprocess.CompletedProcess:
    env = {**os.environ, "EXEC_GATEWAY_TARGET": gateway.target,
           "EXEC_GATEWAY_TOKEN": gateway.token()}
    return subprocess.run([sys.executable, *map(str, args)], env=env, capture_output=True,
                          timeout=120, **kw)


def test_run_tests_uploads_a_project_and_streams_its_suite(gateway, tmp_path):
    project = tmp_path / "proj"
    project.mkdir()
    (project / "test_math.py").write_text(
        "import unittest\n"
        "class T(unittest.TestCase):\n"
        "    def test_ok(self): self.assertEqual(2 + 2, 4)\n"
        "    def test_bad(self): self.assertEqual(2 + 2, 5)\n")
    r = run(gateway, EXAMPLES / "run_tests.py", project, "--",
            "python3", "-m", "unittest", "-v")
    assert r.returncode == 1, r
    assert b"test_ok" in r.stderr and b"FAILED (failures=1)" in r.stderr, r.stderr
    assert b"uploaded 1 files" in r.stderr


def test_the_agent_loop_recovers_from_its_own_mistake(gateway):
    r = run(gateway, EXAMPLES / "agent_loop.py")
    assert r.returncode == 0, r
    lines = r.stdout.decode().splitlines()
    assert lines[0].startswith("step 0: failed: NameError")
    assert lines[-1] == 'step 2: {"sum": 328, "count": 15}'


def test_a_job_is_followed_by_three_clients_in_turn_without_a_gap(gateway, tmp_path):
    state = tmp_path / "job.json"
    assert run(gateway, EXAMPLES / "resume_job.py", "start", state).returncode == 0
    first = run(gateway, EXAMPLES / "resume_job.py", "follow", state, 5)
    assert first.returncode == 3, first
    second = run(gateway, EXAMPLES / "resume_job.py", "follow", state, 7)
    assert second.returncode == 3, second
    rest = run(gateway, EXAMPLES / "resume_job.py", "follow", state)
    assert rest.returncode == 0, rest
    expected = "".join(f"step {i}\n" for i in range(1, 21)) + "done\n"
    assert (first.stdout + second.stdout + rest.stdout).decode() == expected


def test_four_fixes_are_tried_in_forks_and_the_passing_one_kept(gateway):
    env = {**os.environ, "EXEC_GATEWAY_TARGET": gateway.target,
           "EXEC_GATEWAY_TOKEN": gateway.token(scope="exec fs:read fs:write snapshot")}
    r = subprocess.run([sys.executable, str(EXAMPLES / "fork_fixes.py")], env=env,
                       capture_output=True, timeout=120)
    assert r.returncode == 0, r
    assert r.stdout.decode().splitlines() == [
        "before: exit 1",
        "drop the +1: fail",
        "guard empty: fail",
        "both: pass",
        "round it: fail",
        "original unchanged: True",
    ] + [l for l in r.stdout.decode().splitlines() if l.startswith("kept: both (")], r.stdout
