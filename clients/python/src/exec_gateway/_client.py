"""The client and its sessions."""

from __future__ import annotations

import asyncio
import posixpath
from typing import Optional, Union

import grpc

from ._errors import CommandTimeout, ExecGatewayError, OutputLimitExceeded, Unauthenticated
from ._files import Files
from ._forward import PortConnection, PortForward, connect_port, port_forward
from ._link import DEFAULT_RESUME_WITHIN, Link, PemSource, Token
from ._process import Process, launch, new_process_id, spec
from ._types import (EgressPolicy, EnvironmentInfo, Exited, Output, OutputLost, Preview,
                     PreviewPort, Previews, ProcessInfo, Result, Snapshot)
from .v1 import environment_pb2
from .v1 import process_pb2 as ppb
from .v1 import session_pb2 as spb

#: How often an open session tells the gateway it is still wanted. The
#: gateway's shortest detach TTL is 10 s; an idle session is kept well
#: within it.
SESSION_KEEPALIVE_INTERVAL = 3.0

#: How long `run` waits for a process it killed at its timeout to end.
RUN_KILL_WAIT = 10.0

#: How much output (stdout and stderr together) `run` holds by default;
#: past it the process is killed and `OutputLimitExceeded` raised. Larger
#: outputs are read with `start` and its events, chunk by chunk.
RUN_MAX_OUTPUT_BYTES = 64 << 20

_STATES = {
    ppb.PROCESS_STATE_STARTING: "starting",
    ppb.PROCESS_STATE_RUNNING: "running",
    ppb.PROCESS_STATE_EXITED: "exited",
    ppb.PROCESS_STATE_CLOSED: "closed",
}


async def connect(target: str, *, token: Token = None, ca: PemSource = None,
                  cert: PemSource = None, key: PemSource = None,
                  resume_within: float = DEFAULT_RESUME_WITHIN,
                  keepalive_interval: float = SESSION_KEEPALIVE_INTERVAL,
                  allow_plaintext: bool = False,
                  client_name: str = "exec-gateway-python") -> "Client":
    """A client of the gateway at `target` (`grpc://HOST:PORT`, or
    `grpcs://HOST:PORT` for TLS). `token` (a JWT, or a function returning the
    current one) authenticates each call; a client certificate (`cert`,
    `key`) may instead, on a gateway that maps certificates to tenants. `ca`
    is the PEM bundle (path or bytes) the gateway's certificate must chain
    to (default: the system's roots). Open sessions are kept alive with a
    call every `keepalive_interval` seconds, which must be below the
    gateway's `server.detach_ttl` (10 s at the least by default). A token
    is sent in the clear (`grpc://`) only to a loopback address, unless
    `allow_plaintext`. Nothing is sent until the first call."""
    if token is None and cert is None:
        raise Unauthenticated("a token or a client certificate is needed", code="UNAUTHENTICATED")
    if keepalive_interval <= 0:
        raise ValueError("keepalive_interval must be positive")
    return Client(Link(target, token=token, ca=ca, cert=cert, key=key,
                       resume_within=resume_within, allow_plaintext=allow_plaintext),
                  client_name, keepalive_interval)


class Client:
    """A connection to a gateway (one HTTP/2 channel, reconnected as needed)."""

    def __init__(self, link: Link, client_name: str,
                 keepalive_interval: float = SESSION_KEEPALIVE_INTERVAL) -> None:
        self.link = link
        self.client_name = client_name
        self.keepalive_interval = keepalive_interval
        #: File operations in the tenant's root, outside any session.
        self.files = Files(link, self._root)
        self._root_path: Optional[str] = None
        self._sessions: set[Session] = set()

    async def __aenter__(self) -> "Client":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def session(self, resume: Optional[str] = None, *,
                      image: Optional[str] = None,
                      snapshot: Union[str, Snapshot, None] = None) -> "Session":
        """A new session, or the tenant's session `resume` (started by this
        client or another, before a restart say). A new session's processes
        see `image` as `/`: a reference the tenant may use (its own image,
        or one its `images` allow); default: the tenant's own image (or the
        token's `image` claim), if any. A resumed session keeps its image.
        A new session with `snapshot` works in a copy-on-write fork of it,
        on the image it was taken on."""
        link = self.link
        if resume is not None and (image is not None or snapshot is not None):
            raise ValueError("a resumed session keeps its image and workspace: "
                             "pass resume, or image and snapshot, not both")
        if resume is not None:
            await link.call(lambda: link.sessions.ResumeSession(
                spb.ResumeSessionRequest(session_id=resume), metadata=link.metadata()))
            session_id = resume
        else:
            # A retried create may leave the first attempt's session behind;
            # unused, the gateway removes it after its detach TTL.
            resp = await link.call(lambda: link.sessions.CreateSession(
                spb.CreateSessionRequest(client_name=self.client_name, image=image or "",
                                         snapshot=_snapshot_id(snapshot)),
                metadata=link.metadata()))
            session_id = resp.session_id
        session = Session(self, session_id)
        self._sessions.add(session)
        return session

    async def fork(self, snapshot: Union[str, Snapshot], n: int = 1) -> list["Session"]:
        """`n` new sessions, each working in a copy-on-write fork of
        `snapshot` (all of them, or none: QuotaExceeded past the tenant's
        `max_forks_per_tenant`)."""
        link = self.link
        resp = await link.call(lambda: link.sessions.ForkSessions(
            spb.ForkSessionsRequest(snapshot_id=_snapshot_id(snapshot), count=n),
            metadata=link.metadata()))
        sessions = [Session(self, sid) for sid in resp.session_ids]
        self._sessions.update(sessions)
        return sessions

    async def snapshots(self) -> list[Snapshot]:
        """The tenant's snapshots, oldest first."""
        link = self.link
        resp = await link.call(lambda: link.sessions.ListSnapshots(
            spb.ListSnapshotsRequest(), metadata=link.metadata()))
        return [_snapshot(s) for s in resp.snapshots]

    async def get_snapshot(self, snapshot_id: str) -> Snapshot:
        """One of the tenant's snapshots (NotFound: not the tenant's)."""
        link = self.link
        return _snapshot((await link.call(lambda: link.sessions.GetSnapshot(
            spb.GetSnapshotRequest(snapshot_id=snapshot_id), metadata=link.metadata()))).snapshot)

    async def delete_snapshot(self, snapshot: Union[str, Snapshot]) -> None:
        """Deletes one of the tenant's snapshots; forks working on it keep it."""
        link = self.link
        await link.call(lambda: link.sessions.DeleteSnapshot(
            spb.DeleteSnapshotRequest(snapshot_id=_snapshot_id(snapshot)),
            metadata=link.metadata()))

    async def push_snapshot(self, snapshot: Union[str, Snapshot]) -> Snapshot:
        """Pushes a snapshot to the gateway's snapshot registry, from which
        any replica restores it (`pushed` says where)."""
        link = self.link
        return _snapshot((await link.call(lambda: link.sessions.PushSnapshot(
            spb.PushSnapshotRequest(snapshot_id=_snapshot_id(snapshot)),
            metadata=link.metadata()))).snapshot)

    async def promote_snapshot(self, snapshot: Union[str, Snapshot]) -> Snapshot:
        """Keeps a snapshot until it is deleted (`expires_at_ms` None), and
        pushes it when the gateway has a snapshot registry: every session of
        the tenant, on any replica, can start from it."""
        link = self.link
        return _snapshot((await link.call(lambda: link.sessions.PromoteSnapshot(
            spb.PromoteSnapshotRequest(snapshot_id=_snapshot_id(snapshot)),
            metadata=link.metadata()))).snapshot)

    async def get_egress(self) -> EgressPolicy:
        """The tenant's egress: the host names its processes may reach
        (None: decided by addresses alone), beside its CIDRs. Needs the
        `egress` scope (`Forbidden`)."""
        link = self.link
        return _egress((await link.call(lambda: link.sessions.GetEgress(
            spb.GetEgressRequest(), metadata=link.metadata()))).policy)

    async def set_egress(self, names: list[str]) -> EgressPolicy:
        """Replaces the tenant's host names: new connections take them at
        once, and open connections to names they no longer allow are closed
        (`closed` counts them). Needs the `egress` scope (`Forbidden`);
        `InvalidArgument` for a name that is not a host name, `*.` wildcard
        or `NAME:PORT`, or a tenant without `egress_names` in its
        configuration (the names in force then stay)."""
        if isinstance(names, str):
            raise TypeError("names is a list of names, not one string")
        link = self.link
        # Retried: the same list again changes nothing (though a retry's
        # `closed` counts only what it closed itself).
        return _egress((await link.call(lambda: link.sessions.SetEgress(
            spb.SetEgressRequest(names=list(names)), metadata=link.metadata()))).policy)

    async def environment_info(self) -> EnvironmentInfo:
        """Where calls without a session run: the tenant's root."""
        return await _environment_info(self.link, "")

    async def _root(self) -> str:
        if self._root_path is None:
            self._root_path = (await self.environment_info()).cwd
        return self._root_path

    async def close(self) -> None:
        """Stops keeping sessions alive and closes the channel. The sessions
        are not closed: they live the gateway's detach TTL, to be resumed."""
        for session in list(self._sessions):
            session._stop_keepalive()
        self._sessions.clear()
        await self.link.close()


class Session:
    """A session: processes and the files where they run. It stays alive
    while this object is open (a call every few seconds); once it is not, the
    gateway keeps it for its detach TTL, to be resumed."""

    def __init__(self, client: Client, session_id: str) -> None:
        self.client = client
        self.id = session_id
        self.files = Files(client.link, self._root_dir, session_id)
        self._root: Optional[str] = None
        self._keepalive: Optional[asyncio.Task[None]] = asyncio.get_running_loop().create_task(
            self._keep_alive())

    def __repr__(self) -> str:
        return f"Session({self.id!r})"

    async def __aenter__(self) -> "Session":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _keep_alive(self) -> None:
        link, interval = self.client.link, self.client.keepalive_interval
        while True:
            await asyncio.sleep(interval)
            try:
                await link.sessions.ResumeSession(
                    spb.ResumeSessionRequest(session_id=self.id), metadata=link.metadata(),
                    timeout=interval * 2)
            except grpc.aio.AioRpcError as e:
                if e.code() in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.UNAUTHENTICATED,
                                grpc.StatusCode.PERMISSION_DENIED):
                    # Gone, or no longer ours: nothing left to keep alive.
                    self._keepalive = None
                    self.client._sessions.discard(self)
                    return
                # Anything else (a drop, a busy gateway): the next call says.

    def _stop_keepalive(self) -> None:
        if self._keepalive is not None:
            self._keepalive.cancel()
            self._keepalive = None

    def detach(self) -> None:
        """Stops keeping the session alive (it lives the detach TTL more)."""
        self._stop_keepalive()
        self.client._sessions.discard(self)

    async def close(self) -> None:
        """Ends the session now; its processes are killed."""
        self.detach()
        link = self.client.link
        await link.call(lambda: link.sessions.CloseSession(
            spb.CloseSessionRequest(session_id=self.id), metadata=link.metadata()))

    async def start(self, argv: list[str], *, cwd: Optional[str] = None,
                    env: Optional[dict[str, str]] = None, tty: bool = False,
                    stdin: bool = False, process_id: Optional[str] = None) -> Process:
        """Starts a process (`cwd` default: the tenant's root; `env` laid over
        the tenant's base environment; `stdin`: a pipe to `write` to).

        Its output waits for the first reader (iterating it, or `wait`), the
        process blocking on a full pipe meanwhile, as with a local pipe. Read
        it promptly: a stream not read for the gateway's slow-client timeout
        (30 s) is dropped, and then only the newest 1 MiB is kept."""
        process_id = process_id or new_process_id()
        process = Process(self, process_id)
        request = ppb.ExecRequest(
            session_id=self.id, spec=spec(process_id, argv, await self._cwd(cwd), env, tty, stdin))
        # Cancelled while the gateway starts it, the start is still seen
        # through (the gateway goes on with it), and its process killed.
        launching = asyncio.ensure_future(launch(process, request))
        try:
            await asyncio.shield(launching)
        except asyncio.CancelledError:
            await asyncio.shield(_kill_started(process, launching))
            raise
        return process

    async def _root_dir(self) -> str:
        """The session's root (asked once)."""
        if self._root is None:
            self._root = (await self.environment_info()).cwd
        return self._root

    async def _cwd(self, cwd: Optional[str]) -> str:
        """`cwd` (relative: under the root), or the session's root: the API
        takes absolute paths only."""
        if cwd and cwd.startswith("/"):
            return cwd
        root = await self._root_dir()
        return posixpath.join(root, cwd) if cwd else root

    def process(self, process_id: str) -> Process:
        """The handle of a process started earlier (by any client)."""
        return Process(self, process_id)

    async def run(self, argv: list[str], *, cwd: Optional[str] = None,
                  env: Optional[dict[str, str]] = None, timeout: Optional[float] = None,
                  stdin: Optional[bytes] = None,
                  max_output_bytes: int = RUN_MAX_OUTPUT_BYTES) -> Result:
        """Runs a command to its end and returns its output and exit. `stdin`
        is written to it (then closed) while its output is read. Past
        `timeout` seconds it is killed and `CommandTimeout` raised; past
        `max_output_bytes` of output, `OutputLimitExceeded`. Both carry the
        output so far."""
        out, err = bytearray(), bytearray()
        status: list[Exited] = []
        # Cancelled (or timed out) during its start, `start` kills it.
        process: Optional[Process] = None

        async def collect() -> None:
            nonlocal process
            process = await self.start(argv, cwd=cwd, env=env, stdin=stdin is not None)
            feeding = (asyncio.get_running_loop().create_task(_feed(process, stdin))
                       if stdin is not None else None)
            try:
                async for event in process:
                    if isinstance(event, Output):
                        (err if event.stream == "stderr" else out).extend(event.data)
                        if len(out) + len(err) > max_output_bytes:
                            raise _TooMuch()
                    elif isinstance(event, Exited):
                        status.append(event)
                    elif isinstance(event, OutputLost):
                        raise ExecGatewayError(
                            f"{event.chunks} chunks of output from seq {event.seq} are no "
                            "longer retained", code="DATA_LOSS")
                if feeding is not None:
                    await feeding
            finally:
                if feeding is not None and not feeding.done():
                    feeding.cancel()

        async def kill() -> None:
            if process is None:
                return
            try:
                # Killed, and its end seen, before the caller hears of it.
                await process.terminate()
                await process.wait(RUN_KILL_WAIT)
            except (ExecGatewayError, asyncio.TimeoutError):
                pass

        try:
            if timeout is None:
                await collect()
            else:
                await asyncio.wait_for(collect(), timeout)
        except asyncio.TimeoutError:
            await kill()
            raise CommandTimeout(f"{argv[0]} ran past its timeout of {timeout} s",
                                 stdout=bytes(out), stderr=bytes(err)) from None
        except _TooMuch:
            await kill()
            raise OutputLimitExceeded(
                f"{argv[0]} printed more than max_output_bytes ({max_output_bytes})",
                stdout=bytes(out), stderr=bytes(err)) from None
        except BaseException:
            # Cancelled, or its output cut short: a process nobody will read
            # is not left running.
            if not status:
                await asyncio.shield(kill())
            raise
        if not status:
            raise ExecGatewayError("the process closed without an exit", code="INTERNAL")
        return Result(bytes(out), bytes(err), status[0].exit_code, status[0].signal)

    async def list(self) -> list[ProcessInfo]:
        link = self.client.link
        resp = await link.call(lambda: link.processes.List(
            ppb.ListRequest(session_id=self.id), metadata=link.metadata()))
        return [ProcessInfo(
            p.process_id, _STATES.get(p.state, "unknown"), p.tty,  # type: ignore[arg-type]
            p.exit_code if p.HasField("exit_code") else None, p.next_seq,
            p.first_retained_seq if p.HasField("first_retained_seq") else None)
            for p in resp.processes]

    async def environment_info(self) -> EnvironmentInfo:
        """Where the session runs: shell, cwd, home, platform, capabilities."""
        return await _environment_info(self.client.link, self.id)

    async def connect_port(self, port: int) -> PortConnection:
        """A TCP stream to `port` on the session's own loopback, made by the
        gateway inside the tenant's network (docs/forward.md): `send` and
        `receive` bytes, `close_write`, `close`. Needs the `forward` scope."""
        return await connect_port(self.client.link, self.id, port)

    async def port_forward(self, port: int, *, local_port: int = 0,
                           local_host: str = "127.0.0.1") -> PortForward:
        """Listens on `local_host:local_port` (default: a free port on
        127.0.0.1; its `address` says which); each connection accepted
        becomes a stream to `port` on the session's loopback. `close()` (or
        `async with`) stops it. A refusal is raised here, before listening."""
        return await port_forward(self.client.link, self.id, port, local_port=local_port,
                                  local_host=local_host)

    async def create_preview(self, port: int, public: bool = False,
                             expires_in_secs: Optional[int] = None) -> Preview:
        """Previews `port` on the session's own loopback over HTTP
        (docs/preview.md): a signed URL (`url`, a credential: anyone holding
        it opens the port until it expires, `expires_in_secs` or the
        gateway's `url_ttl`, or is revoked), or with `public` the port open
        to anyone until `revoke_preview`. `path` is the preview's path on the
        gateway's client listener, for token holders. Needs the `preview`
        scope; `InvalidArgument` for a port of 0, an expiry past the
        gateway's `max_url_ttl` or on a public preview, or a signed URL from
        a gateway without `[preview] base_url`."""
        link = self.client.link
        # A retry mints another URL at worst: the lost answer's is never seen.
        resp = await link.call(lambda: link.sessions.CreatePreview(
            spb.CreatePreviewRequest(session_id=self.id, port=port, public=public,
                                     expires_in_secs=expires_in_secs or 0),
            metadata=link.metadata()))
        p = resp.preview
        return Preview(port=p.port, url=p.url or None, path=p.path, public=p.public,
                       expires_at_ms=p.expires_at_ms or None)

    async def revoke_preview(self, port: int) -> None:
        """Ends every URL minted for `port` so far and its public state, and
        closes the connections they let in (a URL minted after it works)."""
        link = self.client.link
        await link.call(lambda: link.sessions.RevokePreview(
            spb.RevokePreviewRequest(session_id=self.id, port=port),
            metadata=link.metadata()))

    async def list_previews(self) -> Previews:
        """The session's ports with preview state, and the connections open
        into them through previews."""
        link = self.client.link
        resp = await link.call(lambda: link.sessions.ListPreviews(
            spb.ListPreviewsRequest(session_id=self.id), metadata=link.metadata()))
        return Previews(ports=[PreviewPort(p.port, p.public) for p in resp.ports],
                        open_connections=resp.open_connections)

    async def snapshot(self, name: Optional[str] = None,
                       labels: Optional[dict[str, str]] = None) -> Snapshot:
        """Saves this session's workspace as it is now (its processes held
        still for the copy); fork sessions from it with `client.fork`."""
        link = self.client.link
        return _snapshot((await link.call(lambda: link.sessions.CreateSnapshot(
            spb.CreateSnapshotRequest(session_id=self.id, name=name or "",
                                      labels=labels or {}),
            metadata=link.metadata()))).snapshot)


async def _kill_started(process: Process, launching: "asyncio.Future[None]") -> None:
    try:
        await launching
    except (Exception, asyncio.CancelledError):
        return  # not started
    process.release()
    try:
        # Killed, and its end seen, before the caller hears of the cancel
        # (as `run` does): a list right after it finds the process ended.
        await process.terminate()
        await process.wait(RUN_KILL_WAIT)
    except (ExecGatewayError, asyncio.TimeoutError):
        pass


class _TooMuch(Exception):
    """`run`'s output went past its limit (internal)."""


async def _feed(process: Process, data: bytes) -> None:
    if data:
        await process.write(data)
    await process.close_stdin()


async def _environment_info(link: Link, session_id: str) -> EnvironmentInfo:
    i = await link.call(lambda: link.environment.GetInfo(
        environment_pb2.GetInfoRequest(session_id=session_id), metadata=link.metadata()))
    return EnvironmentInfo(
        shell_name=i.shell_name, shell_path=i.shell_path, executor_version=i.executor_version,
        provider_id=i.provider_id, cwd=i.cwd, user_home_dir=i.user_home_dir,
        platform_os=i.platform_os, temp_dir=i.temp_dir,
        prepend_path_dirs=list(i.prepend_path_dirs),
        temporary_directories=list(i.temporary_directories),
        capabilities=dict(i.capabilities))


def _snapshot_id(snapshot: Union[str, Snapshot, None]) -> str:
    if snapshot is None:
        return ""
    return snapshot if isinstance(snapshot, str) else snapshot.id


def _snapshot(s: "spb.Snapshot") -> Snapshot:
    return Snapshot(id=s.id, name=s.name or None, labels=dict(s.labels), image=s.image or None,
                    digest=s.digest, bytes=s.bytes, entries=s.entries, skipped=s.skipped,
                    created_at_ms=s.created_at_ms, expires_at_ms=s.expires_at_ms or None,
                    pushed=s.pushed or None)


def _egress(p: "spb.EgressPolicy") -> EgressPolicy:
    return EgressPolicy(names=list(p.names) if p.names_set else None, cidrs=list(p.cidrs),
                        internet=p.internet,
                        closed=p.closed if p.HasField("closed") else None)
