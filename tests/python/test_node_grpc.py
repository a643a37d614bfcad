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


def run_node(target, path, token):
    if shutil.which("node") is None:
        pytest.skip("node is not installed (.ci/run installs it)")
    if not (NODE_DIR / "node_modules" / "@grpc" / "grpc-js").is_dir():
        pytest.skip("tests/node/node_modules is missing: run `npm ci --prefix tests/node`")
    r = subprocess.run(["node", str(NODE_DIR / "client.js"), target, path],
                       env=dict(os.environ, EXEC_GATEWAY_TOKEN=token),
                       capture_output=True, text=True, timeout=120)
    lines = r.stdout.strip().splitlines()
    assert lines, r.stderr
    return r.returncode, json.loads(lines[-1])


def test_node_grpc_exec_and_streamed_read(gateway, scratch):
    blob = os.urandom(5 * 1024 * 1024 + 123)
    f = scratch / "node.bin"
    f.write_bytes(blob)
    code, seen = run_node(gateway.grpc_target, str(f), gateway.token())
    assert code == 0, seen
    ex = seen["exec"]
    assert ex["stdout"] == "hello-from-node\n" and ex["stderr"] == "err\n"
    assert ex["exitCode"] == 7 and ex["closed"] is True
    assert ex["seqs"] == list(range(1, len(ex["seqs"]) + 1))
    rd = seen["readFile"]
    assert rd["bytes"] == len(blob)
    assert rd["sha256"] == hashlib.sha256(blob).hexdigest()
    assert rd["messages"] >= 5  # streamed in 1 MiB messages, not one


def test_node_grpc_with_a_forged_token_is_unauthenticated(gateway, scratch):
    forged = jwt.encode({"tenant": "t1", "scope": "exec fs:read",
                         "exp": int(time.time()) + 60}, b"f" * 32, algorithm="HS256")
    code, seen = run_node(gateway.grpc_target, "/etc/hostname", forged)
    assert code == 1
    assert seen["error"]["code"] == "UNAUTHENTICATED"
    assert seen["error"]["details"] == "invalid signature"
