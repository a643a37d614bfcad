"""Generates the gRPC stubs from proto/ into the built package.

The .proto files the package is built from are its own copy, proto/ beside
this file (the repository's proto/exec_gateway/v1, which the repository's
tests/python/test_sdk_packages.py keeps it identical to): the folder, its
sdist and a copy of either build without the rest of the repository. The
stubs are generated when the package is built, never committed."""

import pathlib

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = pathlib.Path(__file__).resolve().parent
PROTO = HERE / "proto"


class BuildWithStubs(build_py):
    def run(self):
        super().run()
        from grpc_tools import protoc

        if not (PROTO / "exec_gateway" / "v1").is_dir():
            raise SystemExit(f"exec-gateway: {PROTO}/exec_gateway/v1 not found")
        out = pathlib.Path(self.build_lib)
        protos = sorted(str(p.relative_to(PROTO))
                        for p in (PROTO / "exec_gateway" / "v1").glob("*.proto"))
        rc = protoc.main(["protoc", f"-I{PROTO}", f"--python_out={out}", f"--pyi_out={out}",
                          f"--grpc_python_out={out}", *protos])
        if rc != 0:
            raise SystemExit(f"exec-gateway: protoc failed ({rc})")
        (out / "exec_gateway" / "v1" / "__init__.py").write_text(
            '"""Stubs generated from proto/exec_gateway/v1 when the package was built."""\n')


setup(cmdclass={"build_py": BuildWithStubs})
