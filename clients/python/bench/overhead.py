"""What the SDK costs over the raw generated stubs, measured in one run
against one gateway: spawn p50 (`true`, started and run to its close) and
output throughput (a process writing 64 MiB to stdout, read to its end).

    python bench/overhead.py [--spawns 300] [--mib 64]

Against EXEC_GATEWAY_TARGET/EXEC_GATEWAY_TOKEN if set (the tenant's
`requests_per_second` must allow a few thousand calls a second); otherwise it starts
a gateway itself from EXEC_GATEWAY_BIN (default: target/release/exec-gateway,
build it with `cargo build --release`). Prints a table and one JSON line.
The two sides alternate in rounds so that drift hits both alike.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import pathlib
import statistics
import sys
import time

import exec_gateway
from exec_gateway.v1 import process_pb2 as pb
from exec_gateway.v1 import session_pb2 as spb

HERE = pathlib.Path(__file__).resolve().parent
ROUNDS = 5


async def raw_run(link, session_id: str, argv: list[str], cwd: str, n: int) -> int:
    """`Exec` on the generated stub, as a hand-written client would: the
    bytes of stdout counted, the stream read to its close."""
    spec = pb.ProcessSpec(process_id=f"raw-{n}", argv=argv, cwd=cwd,
                          env_policy=pb.EnvPolicy(inherit=pb.ENV_INHERIT_ALL))
    total = 0
    async for msg in link.processes.Exec(pb.ExecRequest(session_id=session_id, spec=spec),
                                         metadata=link.metadata()):
        if msg.event.WhichOneof("event") == "output":
            total += len(msg.event.output.data)
        elif msg.event.WhichOneof("event") == "closed":
            break
    return total


async def sdk_run(session: exec_gateway.Session, argv: list[str]) -> int:
    """The SDK's streaming path: `start` and iterate the events."""
    total = 0
    proc = await session.start(argv)
    async for event in proc:
        if isinstance(event, exec_gateway.Output):
            total += len(event.data)
    return total


async def measure(target: str, token: str, spawns: int, mib: int) -> dict:
    async with await exec_gateway.connect(target, token=token) as client:
        session = await client.session()
        link = client.link
        raw_session = (await link.sessions.CreateSession(
            spb.CreateSessionRequest(client_name="bench-raw"), metadata=link.metadata()
        )).session_id
        cwd = (await session.environment_info()).cwd
        counter = iter(range(10**9))
        spawn = {"sdk": [], "raw": []}
        throughput = {"sdk": [], "raw": []}
        big = ["head", "-c", str(mib << 20), "/dev/zero"]

        # Warm-up: the tenant's worker, the connection, both code paths.
        for _ in range(20):
            await session.run(["true"])
            await raw_run(link, raw_session, ["true"], cwd, next(counter))

        for _ in range(ROUNDS):
            for side in ("sdk", "raw"):
                for _ in range(spawns // ROUNDS):
                    t = time.perf_counter()
                    if side == "sdk":
                        await session.run(["true"])
                    else:
                        await raw_run(link, raw_session, ["true"], cwd, next(counter))
                    spawn[side].append(time.perf_counter() - t)
                t = time.perf_counter()
                got = (await sdk_run(session, big) if side == "sdk"
                       else await raw_run(link, raw_session, big, cwd, next(counter)))
                assert got == mib << 20, got
                throughput[side].append(mib / (time.perf_counter() - t))
        await link.sessions.CloseSession(spb.CloseSessionRequest(session_id=raw_session),
                                         metadata=link.metadata())
        await session.close()
    return {side: {"spawn_p50_ms": round(statistics.median(spawn[side]) * 1000, 3),
                   "throughput_mib_s": round(statistics.median(throughput[side]), 1)}
            for side in ("sdk", "raw")}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--spawns", type=int, default=300)
    ap.add_argument("--mib", type=int, default=64)
    args = ap.parse_args()
    target = os.environ.get("EXEC_GATEWAY_TARGET")
    site = None
    if target:
        token = os.environ.get("EXEC_GATEWAY_TOKEN", "")
    else:
        sys.path.insert(0, str(HERE.parent / "tests"))
        from conftest import REPO, Site  # noqa: E402 - the test suite's launcher
        os.environ.setdefault("EXEC_GATEWAY_BIN",
                              str(REPO / "target" / "release" / "exec-gateway"))
        site = Site()
        # The tenant's default request rate (200/s) is not what is measured.
        gateway = site.start(template="requests_per_second = 1000000\nburst = 1000000\n")
        target, token = gateway.target, gateway.token()
    try:
        result = asyncio.run(measure(target, token, args.spawns, args.mib))
    finally:
        if site is not None:
            site.close()
    sdk, raw = result["sdk"], result["raw"]
    print(f"{'':24}{'SDK':>10}{'raw stubs':>12}{'SDK/raw':>10}")
    print(f"{'spawn p50 (ms)':24}{sdk['spawn_p50_ms']:>10}{raw['spawn_p50_ms']:>12}"
          f"{sdk['spawn_p50_ms'] / raw['spawn_p50_ms']:>10.2f}")
    print(f"{'stdout (MiB/s)':24}{sdk['throughput_mib_s']:>10}{raw['throughput_mib_s']:>12}"
          f"{sdk['throughput_mib_s'] / raw['throughput_mib_s']:>10.2f}")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
