"""Fixtures: run the real gateway binary on 127.0.0.1:0."""

import os
import pathlib
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


def gateway_binary() -> str:
    return os.environ.get(
        "EXEC_GATEWAY_BIN", str(ROOT / "target" / "debug" / "exec-gateway")
    )


@pytest.fixture
def gateway():
    """Yields the websocket URL of a fresh gateway; kills it afterwards."""
    proc = subprocess.Popen(
        [gateway_binary(), "serve", "--listen", "ws://127.0.0.1:0"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        url = proc.stdout.readline().strip()
        assert url.startswith("ws://127.0.0.1:"), url
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=20)
