"""Run a project's test suite in a tenant and stream its output live.

    EXEC_GATEWAY_TARGET=grpc://127.0.0.1:8766 EXEC_GATEWAY_TOKEN=... \\
        python run_tests.py ./my-project -- python3 -m unittest -v

Uploads the local directory into the tenant (under its root), runs the
command there, prints stdout and stderr as they come, and exits with the
command's exit code.
"""

import asyncio
import os
import pathlib
import sys

import exec_gateway


async def upload(session: exec_gateway.Session, local: pathlib.Path, remote: str) -> int:
    count = 0
    for path in sorted(local.rglob("*")):
        if "__pycache__" in path.parts:
            continue
        target = f"{remote}/{path.relative_to(local).as_posix()}"
        if path.is_dir():
            await session.files.mkdir(target, parents=True)
        elif path.is_file():
            await session.files.write(target, path.read_bytes())
            count += 1
    return count


async def main(local: pathlib.Path, command: list[str]) -> int:
    async with await exec_gateway.connect(os.environ["EXEC_GATEWAY_TARGET"],
                                          token=os.environ.get("EXEC_GATEWAY_TOKEN"),
                                          ca=os.environ.get("EXEC_GATEWAY_CA")) as client:
        async with await client.session() as session:
            root = (await session.environment_info()).cwd
            workdir = f"{root}/{local.resolve().name}"
            await session.files.remove(workdir, recursive=True, force=True)
            await session.files.mkdir(workdir, parents=True)
            files = await upload(session, local, workdir)
            print(f"uploaded {files} files to {workdir}", file=sys.stderr)

            process = await session.start(command, cwd=workdir)
            async for event in process:
                if isinstance(event, exec_gateway.Output):
                    out = sys.stderr if event.stream == "stderr" else sys.stdout
                    out.buffer.write(event.data)
                    out.flush()
            status = await process.wait()
            return status.exit_code if status.signal is None else 128 + status.signal


if __name__ == "__main__":
    args = sys.argv[1:]
    if "--" not in args or args.index("--") != 1:
        sys.exit("usage: run_tests.py LOCAL_DIR -- COMMAND...")
    sys.exit(asyncio.run(main(pathlib.Path(args[0]), args[2:])))
