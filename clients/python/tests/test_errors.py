"""Each error class, raised by a real refusal of a real gateway; forged
tokens; and another tenant out of reach."""

from __future__ import annotations

import asyncio
import base64
import json
import signal
import time

import jwt
import pytest

import exec_gateway
from exec_gateway import (AlreadyExists, ExecutorUnavailable, Forbidden, InvalidArgument,
                          NotFound, Overloaded, OwnerRestarted, OwnerUnavailable, QuotaExceeded,
                          RateLimited, ShuttingDown, Unauthenticated, Unimplemented)
from conftest import free_port
from exec_gateway.v1 import process_pb2
from test_processes import aio


def unsigned(claims: dict) -> str:
    """A token with `alg: none` and no signature."""
    def part(obj: dict) -> str:
        return base64.urlsafe_b64encode(json.dumps(obj).encode()).rstrip(b"=").decode()
    return f"{part({'alg': 'none', 'typ': 'JWT'})}.{part(claims)}."


@aio
async def test_forged_expired_and_unsigned_tokens_are_unauthenticated(gateway):
    claims = {"sub": "x", "tenant": "alpha", "scope": "exec", "exp": int(time.time()) + 600}
    forged = jwt.encode(claims, b"k" * 64, algorithm="HS256")
    expired = gateway.token(exp=int(time.time()) - 600)
    for token in (forged, expired, unsigned(claims), "not-a-jwt"):
        async with await exec_gateway.connect(gateway.target, token=token) as client:
            with pytest.raises(Unauthenticated):
                await client.session()
            with pytest.raises(Unauthenticated):
                await client.files.list("/")
    with pytest.raises(Unauthenticated):
        await exec_gateway.connect(gateway.target)


@aio
async def test_a_missing_scope_is_forbidden_and_names_it(gateway):
    async with await exec_gateway.connect(gateway.target,
                                          token=gateway.token(scope="fs:read")) as client:
        session = await client.session()
        with pytest.raises(Forbidden) as e:
            await session.run(["true"])
        assert e.value.required_scope == "exec"
        root = (await session.environment_info()).cwd
        with pytest.raises(Forbidden) as e:
            await session.files.write(f"{root}/x", b"x")
        assert e.value.required_scope == "fs:write"
        assert await session.files.list(root) == []


@aio
async def test_not_found_already_exists_invalid_argument_and_unimplemented(gateway):
    async with await exec_gateway.connect(gateway.target, token=gateway.token()) as client:
        session = await client.session()
        root = (await session.environment_info()).cwd
        with pytest.raises(NotFound):
            await session.files.read_bytes(f"{root}/missing")
        with pytest.raises(NotFound):
            await session.process("nobody").write(b"x")
        with pytest.raises(NotFound):
            await client.session(resume="no-such-session")
        await session.start(["sleep", "600"], process_id="dup")
        with pytest.raises(AlreadyExists):
            await session.start(["true"], process_id="dup")
        with pytest.raises(InvalidArgument):
            await session.process("dup").resize(0, 80)
        # A method this gateway does not serve.
        call = client.link.channel.unary_unary(
            "/exec_gateway.v1.ProcessService/Teleport",
            request_serializer=process_pb2.ListRequest.SerializeToString,
            response_deserializer=process_pb2.ListResponse.FromString)
        with pytest.raises(Unimplemented):
            await client.link.call(lambda: call(process_pb2.ListRequest(session_id=session.id),
                                                metadata=client.link.metadata()))
        await session.close()


@aio
async def test_quota_rate_and_in_flight_limits_say_which_and_when(site):
    gateway = site.start(template="max_sessions = 1\nrequests_per_second = 1\nburst = 6\n"
                                  "max_in_flight = 1\n")
    # No keepalive calls of its own: every call of this test is counted.
    async with await exec_gateway.connect(gateway.target, token=gateway.token(),
                                          keepalive_interval=3600) as client:
        session = await client.session()
        with pytest.raises(QuotaExceeded) as e:
            await client.session()
        assert (e.value.quota, e.value.limit) == ("sessions", 1)

        # One long read holds the tenant's only in-flight slot.
        proc = await session.start(["sleep", "600"])
        hold = asyncio.ensure_future(client.link.processes.Read(
            process_pb2.ReadRequest(session_id=session.id, process_id=proc.id, wait_ms=20_000),
            metadata=client.link.metadata()))
        await asyncio.sleep(0.5)
        with pytest.raises(Overloaded) as over:
            await session.list()
        assert not isinstance(over.value, RateLimited)
        hold.cancel()
        await asyncio.gather(hold, return_exceptions=True)

        # The burst spent, the rate refuses and says when to come back. (The
        # held read's slot is freed once the gateway has seen it cancelled:
        # until then a call may still be Overloaded.)
        limited = None
        for _ in range(40):
            try:
                await session.list()
            except RateLimited as e:
                limited = e
                break
            except Overloaded:
                await asyncio.sleep(0.05)
        assert limited is not None, "the rate never refused"
        assert limited.retry_after is not None and limited.retry_after > 0
        session.detach()


@aio
async def test_open_streams_past_the_tenants_cap_are_a_quota(site):
    gateway = site.start(template="max_streams = 1\n")
    async with await exec_gateway.connect(gateway.target, token=gateway.token()) as client:
        session = await client.session()
        # The first process's stream (held for its reader) takes the one place.
        await session.start(["sleep", "600"])
        with pytest.raises(QuotaExceeded) as e:
            await session.start(["true"])
        assert (e.value.quota, e.value.limit) == ("streams", 1)
        await session.close()


@aio
async def test_a_draining_gateway_is_shutting_down(site):
    gateway = site.start(extra="[server]\nshutdown_grace = \"20s\"\n")
    async with await exec_gateway.connect(gateway.target, token=gateway.token()) as client:
        session = await client.session()
        # A live process keeps the gateway draining for its grace.
        await session.start(["sleep", "600"])
        gateway.proc.send_signal(signal.SIGTERM)
        with pytest.raises(ShuttingDown):
            for _ in range(200):
                await client.session()
                await asyncio.sleep(0.05)
        session.detach()


@aio
async def test_an_executor_pool_without_executors_is_executor_unavailable(site):
    (site.dir / "placed").mkdir(mode=0o755)
    gateway = site.start(
        extra="[executors]\nopen_timeout = \"1s\"\n[executors.pools.builders]\n"
              f"[tenants.placed]\nroot = \"{site.dir}/placed\"\npool = \"builders\"\n")
    async with await exec_gateway.connect(gateway.target,
                                          token=gateway.token(tenant="placed")) as client:
        with pytest.raises(ExecutorUnavailable) as e:
            await client.session()
        assert e.value.pool == "builders"


@aio
async def test_a_session_whose_replica_is_gone_or_restarted_says_which(site):
    """Two replicas; a session of gw-0 used through gw-1. gw-0 killed: owner
    unavailable; gw-0 back (a new incarnation): owner restarted."""
    (site.dir / "fleet.key").write_bytes(b"f" * 48)
    ports = [free_port(), free_port()]
    peers = "".join(f'gw-{i} = "127.0.0.1:{p}"\n' for i, p in enumerate(ports))
    extra = f'[fleet]\nkey_file = "{site.dir}/fleet.key"\n[fleet.peers]\n{peers}'

    def replica(i: int):
        return site.start(extra=extra, args=("--replica", f"gw-{i}",
                                             "--fleet-listen", f"127.0.0.1:{ports[i]}"))

    gw0, gw1 = replica(0), replica(1)
    token = gw0.token()
    async with await exec_gateway.connect(gw0.target, token=token) as c0, \
            await exec_gateway.connect(gw1.target, token=token) as c1:
        owned = await c0.session()
        await owned.start(["sleep", "600"])
        owned.detach()
        through = await c1.session(resume=owned.id)
        through.detach()
        assert [p.state for p in await through.list()] == ["running"]

        gw0.stop(signal.SIGKILL)
        with pytest.raises(OwnerUnavailable) as e:
            await through.list()
        assert e.value.replica == "gw-0"

        replica(0)
        with pytest.raises(OwnerRestarted) as e:
            await through.list()
        assert e.value.replica == "gw-0"


@aio
async def test_another_tenant_cannot_reach_a_tenants_sessions_processes_or_files(gateway):
    async with await exec_gateway.connect(gateway.target, token=gateway.token()) as alpha, \
            await exec_gateway.connect(gateway.target,
                                       token=gateway.token(tenant="beta")) as beta:
        a = await alpha.session()
        a_root = (await a.environment_info()).cwd
        await a.files.write(f"{a_root}/secret", b"alpha's secret")
        proc = await a.start(["sh", "-c", "echo private; sleep 600"], process_id="mine")

        b = await beta.session()
        b_root = (await b.environment_info()).cwd
        assert b_root != a_root

        # Alpha's session id, named by beta: as if it did not exist.
        with pytest.raises(NotFound):
            await beta.session(resume=a.id)
        from exec_gateway._client import Session
        stolen = Session(beta, a.id)
        stolen.detach()
        for attempt in (stolen.list(), stolen.process("mine").terminate(),
                        stolen.process("mine").write(b"x"), stolen.process("mine").wait(5),
                        stolen.process("mine").signal("kill")):
            with pytest.raises(NotFound):
                await attempt
        with pytest.raises(NotFound):
            await stolen.run(["true"], cwd=b_root)
        with pytest.raises(NotFound):
            await stolen.files.read_bytes(f"{a_root}/secret")
        # Alpha's files from beta's own session and root: out of reach.
        with pytest.raises(NotFound):
            await b.files.read_bytes(f"{a_root}/secret")
        with pytest.raises(NotFound):
            await beta.files.list(a_root)
        # Nor from a process of beta's, by path or by signal.
        r = await b.run(["sh", "-c", f"cat {a_root}/secret; ls {a_root}; "
                                     "pgrep -x sleep || echo no-sleep-seen"])
        assert b"alpha's secret" not in r.stdout and r.stdout.endswith(b"no-sleep-seen\n"), r
        r = await b.run(["sh", "-c", "kill -9 -1; echo survived"])
        assert r.stdout == b"survived\n" or r.signal == 9
        # Alpha's process is untouched.
        assert [p.state for p in await a.list()] == ["running"]
        await proc.terminate()
        await a.close()
        await b.close()
