"""gRPC from another language: a Node.js client (@grpc/grpc-js and
@grpc/proto-loader from npm, pinned in tests/node/package-lock.json and
installed by .ci/run) loads proto/ as it is, runs Exec and a streamed
ReadFile against the gateway, and is refused with a forged token."""

import hashlib
import json
import os
import pathlib
import shutil
import subprocess
import time

import jwt
import pytest

NODE_DIR = pathlib.Path(__file__).resolve().parents[1] / "node"
CHUNK = 1 << 20  # the gateway streams files in 1 MiB messages


def run_node(target, path, token, env=None):
    """Run tests/node/client.js; its exit code and the JSON line it printed."""
    if shutil.which("node") is None:
        pytest.skip("node is not installed (.ci/run installs nodejs)")
    if not (NODE_DIR / "node_modules" / "@grpc" / "grpc-js").is_dir():
        pytest.skip("tests/node/node_modules is missing (run `npm ci --prefix tests/node`)")
    # The token goes through the environment, as a real caller's would.
    r = subprocess.run(["node", str(NODE_DIR / "client.js"), target, path],
                       env=dict(os.environ, EXEC_GATEWAY_TOKEN=token, **(env or {})),
                       capture_output=True, text=True, timeout=120)
    lines = r.stdout.strip().splitlines()
    assert lines, f"client.js printed nothing (exit {r.returncode}): {r.stderr}"
    return r.returncode, json.loads(lines[-1])


def test_node_grpc_exec_and_streamed_read(gateway, scratch):
    blob = os.urandom(5 * CHUNK + 123)
    f = scratch / "node.bin"
    f.write_bytes(blob)
    code, seen = run_node(gateway.grpc_target, str(f), gateway.token())
    assert code == 0 and "error" not in seen, seen

    ex = seen["exec"]
    assert ex["stdout"] == "hello-from-node\n" and ex["stdoutBytes"] == 16
    assert ex["stderr"] == "err\n" and ex["stderrBytes"] == 4
    assert ex["exitCode"] == 7
    # One seq counter from 1 for output, exit and close; `closed` last.
    assert ex["seqs"] == list(range(1, len(ex["seqs"]) + 1)), ex["seqs"]
    assert ex["closed"] is True and ex["events"][-1] == "closed"
    assert ex["events"].count("exited") == 1 and ex["events"].count("closed") == 1

    rd = seen["readFile"]
    assert rd["bytes"] == len(blob)
    assert rd["sha256"] == hashlib.sha256(blob).hexdigest()
    # Streamed in several messages of at most 1 MiB, not one big one.
    assert rd["messages"] >= 6, rd
    assert 0 < rd["largestMessage"] <= CHUNK, rd


def test_node_grpc_with_a_forged_token_is_unauthenticated(gateway, scratch):
    # Well-formed and unexpired, but signed with a key the gateway lacks.
    forged = jwt.encode({"sub": "node", "tenant": "t1", "scope": "exec fs:read",
                         "exp": int(time.time()) + 3600}, os.urandom(32), algorithm="HS256")
    f = scratch / "small"
    f.write_bytes(b"x")
    code, seen = run_node(gateway.grpc_target, str(f), forged)
    assert code == 1, seen
    assert seen["error"]["code"] == "UNAUTHENTICATED", seen
    assert seen["error"]["call"] == "Exec", seen
    assert seen["error"]["details"] == "invalid signature", seen
