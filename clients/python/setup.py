"""Generates the gRPC stubs from proto/ into the built package.

The .proto files are the repository's (../../proto from here), read when
the package is built, so the stubs are never committed beside them. To
build elsewhere, put a copy of the repository's proto/ beside setup.py."""

import pathlib

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = pathlib.Path(__file__).resolve().parent


def proto_root() -> pathlib.Path:
    for candidate in (HERE.parents[1] / "proto", HERE / "proto"):
        if (candidate / "exec_gateway" / "v1").is_dir():
            return candidate
    raise SystemExit("exec-gateway: proto/exec_gateway/v1 not found beside the package")


class BuildWithStubs(build_py):
    def run(self):
        super().run()
        from grpc_tools import protoc

        root = proto_root()
        out = pathlib.Path(self.build_lib)
        protos = sorted(str(p.relative_to(root))
                        for p in (root / "exec_gateway" / "v1").glob("*.proto"))
        rc = protoc.main(["protoc", f"-I{root}", f"--python_out={out}", f"--pyi_out={out}",
                          f"--grpc_python_out={out}", *protos])
        if rc != 0:
            raise SystemExit(f"exec-gateway: protoc failed ({rc})")
        (out / "exec_gateway" / "v1" / "__init__.py").write_text(
            '"""Stubs generated from proto/exec_gateway/v1 when the package was built."""\n')


setup(cmdclass={"build_py": BuildWithStubs})
