"""exec-gateway's Python SDK: sessions, processes and files on a gateway,
over its gRPC API. Async first; `exec_gateway.sync` for blocking code.

    import asyncio, exec_gateway

    async def main():
        async with await exec_gateway.connect("grpc://127.0.0.1:8766", token=TOKEN) as client:
            session = await client.session()
            result = await session.run(["echo", "hello"])
            print(result.stdout, result.exit_code)

    asyncio.run(main())
"""

from ._client import SESSION_KEEPALIVE_INTERVAL, Client, Session, connect
from ._errors import (Aborted, AlreadyExists, CommandTimeout, ConnectionLost,
                      DeadlineExceeded, ExecGatewayError, ExecutorUnavailable, Forbidden,
                      Internal, InvalidArgument, NotFound, OutputLimitExceeded, Overloaded,
                      OwnerRestarted, OwnerUnavailable, QuotaExceeded, RateLimited,
                      SessionAttached, ShuttingDown, StdinClosed, Unauthenticated, Unavailable,
                      Unimplemented)
from ._files import Files
from ._forward import FORWARD_CHUNK_BYTES, PortConnection, PortForward
from ._link import DEFAULT_RESUME_WITHIN, FILE_CHUNK_BYTES
from ._process import Process
from ._types import (Closed, DirEntry, EgressPolicy, EnvironmentInfo, Event, Exited, ExitStatus,
                     Metadata, Output, OutputLost, Preview, PreviewPort, Previews, ProcessInfo,
                     Result, SignalName, Snapshot, StreamName, WalkEntry, WalkError, WalkResult)

__version__ = "0.1.0"

__all__ = [
    "connect", "Client", "Session", "Process", "Files", "PortConnection", "PortForward",
    "Event", "Output", "Exited", "Closed", "OutputLost", "ExitStatus", "Result",
    "ProcessInfo", "DirEntry", "Metadata", "WalkEntry", "WalkError", "WalkResult",
    "EnvironmentInfo", "SignalName", "StreamName", "Snapshot", "Preview", "PreviewPort",
    "Previews", "EgressPolicy",
    "ExecGatewayError", "ConnectionLost", "Unauthenticated", "Forbidden", "NotFound",
    "OwnerRestarted", "AlreadyExists", "InvalidArgument", "SessionAttached", "Unavailable",
    "Overloaded", "RateLimited", "ShuttingDown", "OwnerUnavailable", "ExecutorUnavailable",
    "QuotaExceeded", "DeadlineExceeded", "Aborted", "Unimplemented", "Internal",
    "StdinClosed", "CommandTimeout", "OutputLimitExceeded",
    "DEFAULT_RESUME_WITHIN", "FILE_CHUNK_BYTES", "FORWARD_CHUNK_BYTES", "SESSION_KEEPALIVE_INTERVAL",
]
