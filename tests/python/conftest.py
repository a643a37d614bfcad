"""Fixtures: run the real gateway binary on 127.0.0.1:0 with a generated
HS256 key; tokens are minted here with PyJWT (the cross-language path)."""

import os
import pathlib
import secrets
import subprocess
import time

import jwt
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


def gateway_binary() -> str:
    return os.environ.get(
        "EXEC_GATEWAY_BIN", str(ROOT / "target" / "debug" / "exec-gateway")
    )


class Gateway:
    def __init__(self, url: str, secret: bytes):
        self.url = url
        self.secret = secret

    def token(self, tenant="t1", scope="exec fs:read fs:write", **extra) -> str:
        claims = {"sub": "py", "tenant": tenant, "scope": scope,
                  "exp": int(time.time()) + 3600}
        claims.update(extra)
        return jwt.encode(claims, self.secret, algorithm="HS256")

    def headers(self, **kw):
        return {"Authorization": f"Bearer {self.token(**kw)}"}


@pytest.fixture
def scratch():
    """A directory any uid may write (mode 1777, like /tmp): the gateway's
    host-rooted tenants run as their own allocated uids when it runs as
    root, and pytest's tmp_path is private to root."""
    import shutil
    import tempfile
    d = pathlib.Path(tempfile.mkdtemp(prefix="exec-gateway-py-"))
    d.chmod(0o1777)
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def gateway(tmp_path):
    """A fresh gateway with tenants t1 and t2 (host-rooted); killed afterwards."""
    secret = secrets.token_hex(32).encode()
    (tmp_path / "hs256.key").write_bytes(secret)
    (tmp_path / "gateway.toml").write_text(
        "[[auth.keys]]\nalgorithm = \"HS256\"\n"
        f"secret_file = \"{tmp_path}/hs256.key\"\n"
        "[tenants.t1]\nroot = \"/\"\n[tenants.t2]\nroot = \"/\"\n"
    )
    proc = subprocess.Popen(
        [gateway_binary(), "serve", "--listen", "ws://127.0.0.1:0",
         "--grpc-listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0",
         "--config", str(tmp_path / "gateway.toml")],
        stdout=subprocess.PIPE,
        text=True,
        # A state directory of its own: concurrent gateways must not share one.
        env={**os.environ, "XDG_STATE_HOME": str(tmp_path / "state")},
    )
    try:
        url = proc.stdout.readline().strip()
        assert url.startswith("ws://127.0.0.1:"), url
        grpc_url = proc.stdout.readline().strip()
        assert grpc_url.startswith("grpc://127.0.0.1:"), grpc_url
        admin = proc.stdout.readline().strip()
        assert admin.startswith("admin http://127.0.0.1:"), admin
        gw = Gateway(url, secret)
        gw.grpc_target = grpc_url.removeprefix("grpc://")
        gw.admin_url = admin.removeprefix("admin ")
        yield gw
    finally:
        proc.terminate()
        proc.wait(timeout=20)


@pytest.fixture(scope="session")
def stubs(tmp_path_factory):
    """Python stubs generated from proto/ now, with grpcio-tools."""
    import importlib
    import sys

    from grpc_tools import protoc

    out = tmp_path_factory.mktemp("stubs")
    protos = sorted(str(p.relative_to(ROOT / "proto"))
                    for p in (ROOT / "proto").rglob("*.proto"))
    rc = protoc.main(["protoc", f"-I{ROOT / 'proto'}", f"--python_out={out}",
                      f"--grpc_python_out={out}", *protos])
    assert rc == 0, "protoc failed"
    sys.path.insert(0, str(out))
    mods = {}
    for name in ["session", "process", "file", "environment"]:
        mods[name] = importlib.import_module(f"exec_gateway.v1.{name}_pb2")
        mods[name + "_grpc"] = importlib.import_module(f"exec_gateway.v1.{name}_pb2_grpc")
    return mods
