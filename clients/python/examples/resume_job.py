"""A long job that outlives its client: start it, stop watching, come back.

    python resume_job.py start STATE_FILE   # starts the job, saves where it is, exits
    python resume_job.py follow STATE_FILE  # resumes the session and streams the rest

`follow` may be stopped and run again (by a new process, on another
machine): it saves the last seq it printed, so it goes on from there,
nothing repeated, nothing lost while the gateway retains it. The job must
be resumed within the gateway's `server.detach_ttl` of the last client
leaving (10 s by default; a deployment running long jobs raises it).
"""

import asyncio
import json
import os
import pathlib
import sys

import exec_gateway

JOB = 'for i in $(seq 1 20); do echo "step $i"; sleep 0.1; done; echo done'


async def connect() -> exec_gateway.Client:
    return await exec_gateway.connect(os.environ["EXEC_GATEWAY_TARGET"],
                                token=os.environ.get("EXEC_GATEWAY_TOKEN"),
                                ca=os.environ.get("EXEC_GATEWAY_CA"))


async def start(state: pathlib.Path) -> None:
    async with await connect() as client:
        session = await client.session()
        process = await session.start(["sh", "-c", JOB])
        state.write_text(json.dumps({"session": session.id, "process": process.id, "seq": 0}))
        # Leave it running: the gateway keeps the session for its detach TTL.
        session.detach()
    print(f"started {process.id} in session {session.id}", file=sys.stderr)


async def follow(state: pathlib.Path, stop_after: int = 0) -> int:
    saved = json.loads(state.read_text())
    async with await connect() as client:
        session = await client.session(resume=saved["session"])
        process = session.process(saved["process"])
        printed = 0
        async for event in process.events(after_seq=saved["seq"]):
            if isinstance(event, exec_gateway.Output):
                sys.stdout.buffer.write(event.data)
                sys.stdout.flush()
            elif isinstance(event, exec_gateway.OutputLost):
                print(f"[{event.chunks} chunks no longer retained]", file=sys.stderr)
            saved["seq"] = event.seq
            state.write_text(json.dumps(saved))
            printed += 1
            if stop_after and printed == stop_after:
                session.detach()
                return 3  # stopped on purpose: run `follow` again
        status = await process.wait()
        await session.close()
        return status.exit_code


if __name__ == "__main__":
    if len(sys.argv) < 3 or sys.argv[1] not in ("start", "follow"):
        sys.exit("usage: resume_job.py start|follow STATE_FILE [STOP_AFTER_EVENTS]")
    path = pathlib.Path(sys.argv[2])
    if sys.argv[1] == "start":
        asyncio.run(start(path))
    else:
        sys.exit(asyncio.run(follow(path, int(sys.argv[3]) if len(sys.argv) > 3 else 0)))
