"""Previews (`session.create_preview`, `revoke_preview`, `list_previews`):
an http.server in the session reached over HTTP on the gateway's client
listener, by a signed URL (exchanged for its cookie) and by a public path,
until revoked; and the refusals."""

from __future__ import annotations

import asyncio
import functools
import http.client
import os
import time
import urllib.parse

import pytest

import exec_gateway

SCOPE = "exec fs:read fs:write preview"
PORT = 8000
PREVIEW = '[preview]\nbase_url = "http://preview.test"\n'

needs_netns = pytest.mark.skipif(
    os.geteuid() != 0 or not all(
        any(os.path.isfile(os.path.join(d, t)) for d in ("/usr/sbin", "/usr/bin", "/sbin", "/bin"))
        for t in ("slirp4netns", "nft")),
    reason="previews need network namespaces: root, slirp4netns and nft")


def aio(test):
    """Runs an async test on a fresh event loop (no plugin needed)."""
    @functools.wraps(test)
    def run(*args, **kwargs):
        return asyncio.run(test(*args, **kwargs))
    return run


@pytest.fixture
def gateway(site):
    return site.start(extra=PREVIEW)


async def serving(session: exec_gateway.Session) -> exec_gateway.Process:
    """python3's http.server on the session's 127.0.0.1:8000, listening."""
    server = await session.start(["python3", "-u", "-m", "http.server", str(PORT),
                                  "--bind", "127.0.0.1"])
    seen = b""
    async for event in server.events():
        if isinstance(event, exec_gateway.Output):
            seen += event.data
            if b"Serving HTTP" in seen:
                return server
    raise AssertionError(f"http.server ended: {seen!r}")


async def get(listener: str, target: str, headers: dict[str, str]) -> http.client.HTTPResponse:
    """GET `target` from the gateway's client listener (`ws://HOST:PORT`),
    the body read; in a thread, off the event loop."""
    host, port = urllib.parse.urlsplit(listener).netloc.rsplit(":", 1)

    def fetch() -> http.client.HTTPResponse:
        conn = http.client.HTTPConnection(host, int(port), timeout=30)
        try:
            conn.request("GET", target, headers=headers)
            resp = conn.getresponse()
            resp.body = resp.read()  # type: ignore[attr-defined]
            return resp
        finally:
            conn.close()

    return await asyncio.to_thread(fetch)


@needs_netns
@aio
async def test_a_signed_url_opens_the_port_until_revoked(gateway):
    async with await exec_gateway.connect(gateway.target,
                                          token=gateway.token(scope=SCOPE)) as client:
        session = await client.session()
        await serving(session)
        preview = await session.create_preview(PORT, expires_in_secs=600)
        assert isinstance(preview, exec_gateway.Preview)
        assert (preview.port, preview.public) == (PORT, False)
        assert preview.path == f"/preview/{session.id}/{PORT}/"
        assert preview.expires_at_ms is not None
        assert abs(preview.expires_at_ms - (time.time() + 600) * 1000) < 60_000
        url = urllib.parse.urlsplit(preview.url)
        assert (url.scheme, url.hostname) == (
            "http", f"{PORT}-{session.id.replace('-', '')}.preview.test")
        assert url.query.startswith("exg_preview=")
        listed = await session.list_previews()
        assert listed.ports == [exec_gateway.PreviewPort(PORT, False)]
        assert listed.open_connections >= 0

        # The URL's first use: a 303 to itself without the grant, and the cookie.
        host = {"Host": url.hostname}
        first = await get(gateway.ws_url, f"{url.path}?{url.query}", host)
        assert first.status == 303, (first.status, first.body)
        assert first.getheader("Location") in ("/", f"http://{url.hostname}/")
        cookie = first.getheader("Set-Cookie")
        assert cookie is not None and cookie.startswith("exg_preview="), cookie
        assert "HttpOnly" in cookie
        with_cookie = {**host, "Cookie": cookie.split(";", 1)[0]}
        page = await get(gateway.ws_url, "/", with_cookie)
        assert page.status == 200, (page.status, page.body)
        assert b"Directory listing" in page.body

        await session.revoke_preview(PORT)
        assert (await get(gateway.ws_url, "/", with_cookie)).status == 403
        # A URL minted after the revocation works.
        again = urllib.parse.urlsplit((await session.create_preview(PORT)).url)
        assert (await get(gateway.ws_url, f"{again.path}?{again.query}", host)).status == 303
        await session.close()


@needs_netns
@aio
async def test_a_public_port_is_open_to_anyone_until_revoked(gateway):
    async with await exec_gateway.connect(gateway.target,
                                          token=gateway.token(scope=SCOPE)) as client:
        session = await client.session()
        await serving(session)
        path = f"/preview/{session.id}/{PORT}/"
        assert (await get(gateway.ws_url, path, {})).status == 401
        preview = await session.create_preview(PORT, public=True)
        assert (preview.port, preview.path, preview.public, preview.expires_at_ms) == (
            PORT, path, True, None)
        assert preview.url is not None and "exg_preview" not in preview.url
        assert (await session.list_previews()).ports == [exec_gateway.PreviewPort(PORT, True)]
        page = await get(gateway.ws_url, path, {})
        assert page.status == 200, (page.status, page.body)
        assert b"Directory listing" in page.body

        await session.revoke_preview(PORT)
        assert (await get(gateway.ws_url, path, {})).status == 401
        assert (await session.list_previews()).ports == [exec_gateway.PreviewPort(PORT, False)]
        await session.close()


@needs_netns
@aio
async def test_previews_are_refused(gateway):
    async with await exec_gateway.connect(gateway.target,
                                          token=gateway.token(scope=SCOPE)) as client:
        session = await client.session()
        with pytest.raises(exec_gateway.InvalidArgument):
            await session.create_preview(0)
        with pytest.raises(exec_gateway.InvalidArgument):
            await session.create_preview(PORT, public=True, expires_in_secs=60)
        with pytest.raises(exec_gateway.InvalidArgument):
            await session.create_preview(PORT, expires_in_secs=30 * 24 * 3600)
        assert (await session.list_previews()).ports == []
        await session.close()
        with pytest.raises(exec_gateway.NotFound):
            await session.create_preview(PORT)
    # No `preview` scope.
    async with await exec_gateway.connect(gateway.target, token=gateway.token()) as client:
        session = await client.session()
        with pytest.raises(exec_gateway.Forbidden):
            await session.create_preview(PORT)
        with pytest.raises(exec_gateway.Forbidden):
            await session.list_previews()


@needs_netns
def test_the_sync_api_previews(gateway):
    from exec_gateway.sync import connect

    with connect(gateway.target, token=gateway.token(scope=SCOPE)) as client:
        session = client.session()
        preview = session.create_preview(PORT, public=True)
        assert (preview.public, preview.expires_at_ms) == (True, None)
        assert session.list_previews().ports == [exec_gateway.PreviewPort(PORT, True)]
        session.revoke_preview(PORT)
        assert session.list_previews().ports == [exec_gateway.PreviewPort(PORT, False)]
        session.close()


@needs_netns
@aio
async def test_without_base_url_only_public_previews(site):
    gateway = site.start()
    async with await exec_gateway.connect(gateway.target,
                                          token=gateway.token(scope=SCOPE)) as client:
        session = await client.session()
        with pytest.raises(exec_gateway.InvalidArgument):
            await session.create_preview(PORT)
        preview = await session.create_preview(PORT, public=True)
        assert (preview.url, preview.path) == (None, f"/preview/{session.id}/{PORT}/")
