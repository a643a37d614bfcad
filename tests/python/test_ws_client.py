"""Cross-language path: a Python `websockets` client with its defaults
(which offer permessage-deflate) drives processes and files."""

import asyncio
import base64
import json
import time

import jwt

import websockets

TIMEOUT = 20


class Client:
    def __init__(self, ws):
        self.ws = ws
        self.next_id = 1
        self.pending = []

    async def recv(self):
        return json.loads(await asyncio.wait_for(self.ws.recv(), TIMEOUT))

    async def wait_for(self, pred):
        for i, m in enumerate(self.pending):
            if pred(m):
                return self.pending.pop(i)
        while True:
            m = await self.recv()
            if pred(m):
                return m
            self.pending.append(m)

    async def call(self, method, params):
        rid = self.next_id
        self.next_id += 1
        await self.ws.send(json.dumps({"id": rid, "method": method, "params": params}))
        return await self.wait_for(
            lambda m: m.get("id") == rid and ("result" in m or "error" in m)
        )


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 60))


def test_process_roundtrip_with_default_compression_offer(gateway):
    async def body():
        async with websockets.connect(gateway.url, additional_headers=gateway.headers()) as ws:  # offers permessage-deflate
            c = Client(ws)
            r = await c.call("initialize", {"clientName": "py"})
            assert len(r["result"]["sessionId"]) == 36
            await ws.send(json.dumps({"method": "initialized"}))
            r = await c.call(
                "process/start",
                {"processId": "p", "argv": ["sh", "-c", "read x; echo py:$x; exit 4"],
                 "cwd": "/tmp", "env": {}, "tty": False, "pipeStdin": True},
            )
            assert r["result"] == {"processId": "p"}
            r = await c.call(
                "process/write",
                {"processId": "p", "chunk": base64.b64encode(b"hi\n").decode()},
            )
            assert r["result"] == {"status": "accepted"}
            out, code, seqs = b"", None, []
            while True:
                m = await c.wait_for(lambda m: m.get("method", "").startswith("process/"))
                seqs.append(m["params"]["seq"])
                if m["method"] == "process/output":
                    out += base64.b64decode(m["params"]["chunk"])
                elif m["method"] == "process/exited":
                    code = m["params"]["exitCode"]
                else:
                    break
            assert out == b"py:hi\n"
            assert code == 4
            assert seqs == list(range(1, len(seqs) + 1))
            assert "jsonrpc" not in m

    run(body())


def test_files_and_errors(gateway, scratch):
    async def body():
        async with websockets.connect(gateway.url, compression=None, additional_headers=gateway.headers()) as ws:
            c = Client(ws)
            await c.call("initialize", {"clientName": "py"})
            await ws.send(json.dumps({"method": "initialized"}))
            path = str(scratch / "f.txt")
            data = bytes(range(256)) * 10
            r = await c.call(
                "fs/writeFile", {"path": path, "dataBase64": base64.b64encode(data).decode()}
            )
            assert r["result"] == {}
            r = await c.call("fs/readFile", {"path": path})
            assert base64.b64decode(r["result"]["dataBase64"]) == data
            r = await c.call("fs/readFile", {"path": str(scratch / "missing")})
            assert r["error"]["code"] == -32004
            await ws.send("{broken")
            m = await c.wait_for(lambda m: m.get("id") == -1)
            assert m["error"]["code"] == -32600
            r = await c.call("process/list", {})
            assert r["result"] == {"processes": []}

    run(body())


def test_pyjwt_tokens_refused_and_accepted(gateway):
    """Tokens minted by PyJWT: forged, expired and wrong-tenant ones are
    refused at the handshake; a valid one is accepted right after."""

    async def status_of(headers=None, url=None):
        try:
            async with websockets.connect(url or gateway.url, additional_headers=headers or {}):
                return 101
        except websockets.exceptions.InvalidStatus as e:
            return e.response.status_code

    async def body():
        forged = jwt.encode({"tenant": "t1", "scope": "exec", "exp": int(time.time()) + 60},
                            b"x" * 40, algorithm="HS256")
        assert await status_of() == 401
        assert await status_of({"Authorization": f"Bearer {forged}"}) == 401
        assert await status_of(gateway.headers(exp=int(time.time()) - 120)) == 401
        assert await status_of(gateway.headers(tenant="nobody")) == 401
        assert await status_of(gateway.headers(scope="admin")) == 403
        # The reference client can only be given a URL: access_token works.
        assert await status_of(url=f"{gateway.url}/?access_token={gateway.token()}") == 101
        assert await status_of(gateway.headers()) == 101

    run(body())


def test_scopes_limit_methods(gateway):
    async def body():
        async with websockets.connect(gateway.url, additional_headers=gateway.headers(scope="fs:read")) as ws:
            c = Client(ws)
            await c.call("initialize", {"clientName": "py"})
            await ws.send(json.dumps({"method": "initialized"}))
            r = await c.call("process/list", {})
            assert r["error"]["code"] == -32003
            assert r["error"]["message"] == "forbidden"
            r = await c.call("fs/getMetadata", {"path": "/tmp"})
            assert r["result"]["isDirectory"] is True
            r = await c.call("fs/writeFile", {"path": "/tmp/x", "dataBase64": ""})
            assert r["error"]["code"] == -32003

    run(body())
