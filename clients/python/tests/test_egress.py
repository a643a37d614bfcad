"""Egress by name (`client.get_egress`, `set_egress`): the tenant's host
names read and replaced, a bad name and a token without the `egress` scope
refused with nothing changed; the same through `exec_gateway.sync`."""

from __future__ import annotations

import asyncio
import functools
import os

import pytest

import exec_gateway
import exec_gateway.sync

SCOPE = "exec egress"
TEMPLATE = 'egress_names = ["a.test"]\n'

needs_netns = pytest.mark.skipif(
    os.geteuid() != 0 or not all(
        any(os.path.isfile(os.path.join(d, t)) for d in ("/usr/sbin", "/usr/bin", "/sbin", "/bin"))
        for t in ("slirp4netns", "nft")),
    reason="egress by name needs network namespaces: root, slirp4netns and nft")


def aio(test):
    """Runs an async test on a fresh event loop (no plugin needed)."""
    @functools.wraps(test)
    def run(*args, **kwargs):
        return asyncio.run(test(*args, **kwargs))
    return run


@pytest.fixture
def gateway(site):
    return site.start(template=TEMPLATE)


@needs_netns
@aio
async def test_the_tenants_names_are_read_and_replaced(gateway):
    async with await exec_gateway.connect(gateway.target,
                                          token=gateway.token(scope=SCOPE)) as client:
        policy = await client.get_egress()
        assert policy == exec_gateway.EgressPolicy(names=["a.test"], cidrs=[], internet=False)

        changed = await client.set_egress(["a.test", "*.b.test", "c.test:443"])
        assert sorted(changed.names) == ["*.b.test", "a.test", "c.test:443"]
        assert changed.closed == 0
        now = await client.get_egress()
        assert sorted(now.names) == ["*.b.test", "a.test", "c.test:443"]
        assert now.closed is None

        # Not a host name: refused, and the names in force stay.
        with pytest.raises(exec_gateway.InvalidArgument):
            await client.set_egress(["d.test", "not a name!"])
        assert (await client.get_egress()).names == now.names
        with pytest.raises(TypeError):
            await client.set_egress("a.test")  # type: ignore[arg-type]


@needs_netns
@aio
async def test_a_token_without_the_egress_scope_is_refused(gateway):
    async with await exec_gateway.connect(gateway.target,
                                          token=gateway.token(scope="exec")) as client:
        with pytest.raises(exec_gateway.Forbidden):
            await client.get_egress()
        with pytest.raises(exec_gateway.Forbidden):
            await client.set_egress(["x.test"])
    async with await exec_gateway.connect(gateway.target,
                                          token=gateway.token(scope=SCOPE)) as client:
        assert (await client.get_egress()).names == ["a.test"]


@needs_netns
def test_sync_client(gateway):
    with exec_gateway.sync.connect(gateway.target, token=gateway.token(scope=SCOPE)) as client:
        assert client.get_egress().names == ["a.test"]
        assert client.set_egress(["e.test"]).names == ["e.test"]
        assert client.get_egress().names == ["e.test"]
