"""The SDKs as a user installs them, not as their suites run them from the
source tree: the Python SDK's sdist and wheel built from a copy of
clients/python alone (python -m build, its build dependencies from PyPI as a
user's would come), and the TypeScript SDK's `npm pack` tarball installed
into an empty project; each then runs a call against a real gateway."""

import os
import pathlib
import shutil
import subprocess
import sys
import tarfile
import textwrap
import zipfile

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
PY_SDK = ROOT / "clients" / "python"
TS_SDK = ROOT / "clients" / "typescript"


def run(argv, cwd, **kw):
    r = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=900, **kw)
    assert r.returncode == 0, f"{argv} failed ({r.returncode}):\n{r.stdout}\n{r.stderr}"
    return r.stdout


def test_python_sdk_proto_copy_is_the_repositorys():
    """clients/python/proto (what the sdist carries) is proto/exec_gateway/v1."""
    ours = sorted(p.relative_to(PY_SDK / "proto") for p in (PY_SDK / "proto").rglob("*.proto"))
    theirs = sorted(p.relative_to(ROOT / "proto")
                    for p in (ROOT / "proto" / "exec_gateway" / "v1").glob("*.proto"))
    assert ours == theirs
    for rel in theirs:
        assert (PY_SDK / "proto" / rel).read_bytes() == (ROOT / "proto" / rel).read_bytes(), (
            f"clients/python/proto/{rel} differs from proto/{rel}: copy it over")


def test_python_sdk_sdist_and_wheel_build_from_a_copy_of_its_folder(gateway, tmp_path):
    src = tmp_path / "python"
    shutil.copytree(PY_SDK, src, ignore=shutil.ignore_patterns(
        "build", "dist", "*.egg-info", "__pycache__"))
    dist = tmp_path / "dist"
    # The sdist, then the wheel built from the unpacked sdist (build's default).
    run([sys.executable, "-m", "build", "--outdir", str(dist), "."], cwd=src)
    sdists = list(dist.glob("exec_gateway-*.tar.gz"))
    wheels = list(dist.glob("exec_gateway-*.whl"))
    assert len(sdists) == 1 and len(wheels) == 1, list(dist.iterdir())
    with tarfile.open(sdists[0]) as t:
        names = t.getnames()
    assert any(n.endswith("proto/exec_gateway/v1/process.proto") for n in names), names
    with zipfile.ZipFile(wheels[0]) as z:
        assert "exec_gateway/v1/process_pb2_grpc.py" in z.namelist()

    # The wheel installed on its own (grpcio and protobuf are this
    # interpreter's), imported from a fresh process and used.
    target = tmp_path / "site"
    run([sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
         "--no-deps", "--target", str(target), str(wheels[0])], cwd=tmp_path)
    script = textwrap.dedent("""
        import asyncio, os, sys
        import exec_gateway
        assert exec_gateway.__file__.startswith(sys.argv[1]), exec_gateway.__file__
        async def main():
            async with await exec_gateway.connect(os.environ["TARGET"],
                                                  token=os.environ["TOKEN"]) as c:
                s = await c.session()
                r = await s.run(["sh", "-c", "echo packaged; exit 3"])
                print(r.stdout.decode().strip(), r.exit_code)
                await s.close()
        asyncio.run(main())
    """)
    out = run([sys.executable, "-c", script, str(target)], cwd=tmp_path,
              env={**os.environ, "PYTHONPATH": str(target),
                   "TARGET": f"grpc://{gateway.grpc_target}", "TOKEN": gateway.token()})
    assert out.split() == ["packaged", "3"]


def test_typescript_sdk_packed_tarball_installs_and_runs(gateway, tmp_path):
    if shutil.which("npm") is None:
        pytest.skip("npm is not installed")
    pkg = TS_SDK
    if not (pkg / "node_modules" / "typescript").is_dir():
        run(["npm", "ci", "--no-audit", "--no-fund"], cwd=pkg)
    packs = tmp_path / "packs"
    packs.mkdir()
    # `npm pack` builds (prepack) and packs dist/ with its types.
    run(["npm", "pack", "--pack-destination", str(packs)], cwd=pkg)
    tarballs = list(packs.glob("exec-gateway-client-*.tgz"))
    assert len(tarballs) == 1, list(packs.iterdir())
    with tarfile.open(tarballs[0]) as t:
        names = set(t.getnames())
    for f in ("package/dist/index.js", "package/dist/index.d.ts", "package/dist/stubs.js",
              "package/dist/gen/exec_gateway/v1/process.js"):
        assert f in names, sorted(names)
    with tarfile.open(tarballs[0]) as t:
        manifest = t.extractfile("package/package.json").read().decode()
    assert '"prepare"' not in manifest

    app = tmp_path / "app"
    app.mkdir()
    (app / "package.json").write_text('{"name": "app", "private": true, "type": "module"}\n')
    # --ignore-scripts: the package must need no install script of its own.
    run(["npm", "install", "--no-audit", "--no-fund", "--ignore-scripts", str(tarballs[0])],
        cwd=app)
    assert not (app / "node_modules" / "@exec-gateway" / "client").is_symlink()
    (app / "main.mjs").write_text(textwrap.dedent("""
        import { connect } from "@exec-gateway/client";
        const c = await connect(process.env.TARGET, { token: process.env.TOKEN });
        const s = await c.session();
        const r = await s.run(["sh", "-c", "echo packed; exit 4"]);
        console.log(Buffer.from(r.stdout).toString().trim(), r.exitCode);
        await s.close();
        c.close();
    """))
    out = run(["node", "main.mjs"], cwd=app,
              env={**os.environ, "TARGET": f"grpc://{gateway.grpc_target}",
                   "TOKEN": gateway.token()})
    assert out.split() == ["packed", "4"]
