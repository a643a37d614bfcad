"""A transparent websocket proxy that records every frame, for watching the
JSON-RPC exchange between a real client and the gateway.

`RecordingProxy(upstream)` listens on 127.0.0.1 (a free port). Each client
connection is forwarded to `upstream` with the same path and query string
(so `?access_token=...` passes through) and the same `Authorization`
header; the upstream handshake is made before the client's is answered, so
an HTTP refusal from the gateway (401/403) reaches the client with its
status and body. Frames are relayed verbatim in both directions and
recorded in `frames` as (connection, direction, message), direction being
"c>s" or "s>c".
"""

from __future__ import annotations

import asyncio
import json
import threading
import urllib.parse
from typing import Any

from websockets.asyncio.client import connect
from websockets.asyncio.server import serve
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.http11 import Response


class RecordingProxy:
    def __init__(self, upstream: str):
        self.upstream = upstream.rstrip("/")
        self.frames: list[tuple[int, str, Any]] = []
        self.connections: list[dict] = []  # {id, path, authorization, status}
        self._lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._stop: asyncio.Future | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.port = 0

    # -- results ---------------------------------------------------------
    def messages(self) -> list[tuple[int, str, dict]]:
        """Frames that parse as JSON objects: (connection, direction, obj)."""
        out = []
        with self._lock:
            frames = list(self.frames)
        for conn, direction, data in frames:
            try:
                obj = json.loads(data)
            except (TypeError, ValueError):
                continue
            if isinstance(obj, dict):
                out.append((conn, direction, obj))
        return out

    def exchanges(self, method: str | None = None) -> list[dict]:
        """Requests paired with their responses: {conn, method, params,
        result, error}. `method` filters by method name."""
        pending: dict[tuple[int, Any], dict] = {}
        out = []
        for conn, direction, msg in self.messages():
            if direction == "c>s" and "method" in msg and "id" in msg:
                ex = {"conn": conn, "method": msg["method"], "params": msg.get("params"),
                      "result": None, "error": None}
                pending[(conn, json.dumps(msg["id"]))] = ex
                out.append(ex)
            elif direction == "s>c" and "method" not in msg and "id" in msg:
                ex = pending.pop((conn, json.dumps(msg["id"])), None)
                if ex is not None:
                    ex["result"] = msg.get("result")
                    ex["error"] = msg.get("error")
        return [e for e in out if method is None or e["method"] == method]

    def transcript(self, limit: int = 400, width: int = 600) -> str:
        """The last `limit` frames, one a line, for failure messages."""
        with self._lock:
            frames = list(self.frames)[-limit:]
        lines = []
        for conn, direction, data in frames:
            text = data if isinstance(data, str) else f"<{len(data)} binary bytes>"
            lines.append(f"[{conn}] {direction} {text[:width]}")
        with self._lock:
            conns = list(self.connections)
        head = [f"connection {c['id']}: path={c['path']!r} bearer={c['bearer']} "
                f"upstream status={c['status']}" for c in conns]
        return "\n".join(head + lines)

    # -- running ---------------------------------------------------------
    def __enter__(self) -> "RecordingProxy":
        self._thread.start()
        if not self._ready.wait(30):
            raise RuntimeError("recording proxy did not start")
        return self

    def __exit__(self, *exc) -> None:
        self._loop.call_soon_threadsafe(self._stop.set_result, None)
        self._thread.join(timeout=30)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(self._main())
        self._loop.close()

    async def _main(self) -> None:
        self._stop = self._loop.create_future()
        upstreams: dict[int, Any] = {}

        async def process_request(connection, request):
            with self._lock:
                conn_id = len(self.connections)
                info = {"id": conn_id, "path": request.path, "status": None,
                        "bearer": "authorization" in {k.lower() for k in request.headers}}
                self.connections.append(info)
            headers = {}
            auth = request.headers.get("Authorization")
            if auth is not None:
                headers["Authorization"] = auth
            try:
                up = await connect(self.upstream + request.path, additional_headers=headers,
                                   compression=None, max_size=None, ping_interval=None,
                                   open_timeout=30)
            except InvalidStatus as e:
                info["status"] = e.response.status_code
                return Response(e.response.status_code, e.response.reason_phrase,
                                e.response.headers, e.response.body)
            except OSError as e:
                info["status"] = f"connect failed: {e}"
                return connection.respond(502, f"proxy: upstream unreachable: {e}\n")
            info["status"] = 101
            upstreams[id(connection)] = (conn_id, up)
            return None

        async def handler(client):
            conn_id, up = upstreams.pop(id(client))

            async def pump(src, dst, direction):
                try:
                    async for message in src:
                        with self._lock:
                            self.frames.append((conn_id, direction, message))
                        await dst.send(message)
                except ConnectionClosed:
                    pass
                finally:
                    await dst.close()

            await asyncio.gather(pump(client, up, "c>s"), pump(up, client, "s>c"))

        async with serve(handler, "127.0.0.1", 0, process_request=process_request,
                         compression=None, max_size=None, ping_interval=None) as server:
            self.port = server.sockets[0].getsockname()[1]
            self._ready.set()
            await self._stop

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}"


def path_of(value: str | None) -> str | None:
    """A path as either revision sends it: `/abs` (0.130) or `file:///abs`
    (0.169), as a plain path."""
    if value is None:
        return None
    if value.startswith("file://"):
        parsed = urllib.parse.urlparse(value)
        return urllib.parse.unquote(parsed.path)
    return value
