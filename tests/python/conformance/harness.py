"""A small JSON-RPC client for exec-server websocket connections.

Messages are newline-free JSON text frames with no `jsonrpc` member. The
client keeps every inbound message it has not yet handed out, so a check can
wait for a response while notifications pile up, then look at them in order.
"""

import asyncio
import base64
import json

import websockets
from websockets.exceptions import ConnectionClosed

# Generous waits: these bound a hang, they never assert speed.
WAIT = 20.0


class ServerClosed(Exception):
    """The server dropped the connection while a message was awaited."""

    def __init__(self, rcvd):
        super().__init__(f"connection closed by the server (close frame: {rcvd!r})")
        self.rcvd = rcvd


class RpcError(Exception):
    """An error response where a result was expected."""

    def __init__(self, method, error):
        super().__init__(f"{method}: {json.dumps(error)}")
        self.error = error
        self.code = error.get("code")
        self.message = error.get("message")


def b64(data: bytes | str) -> str:
    if isinstance(data, str):
        data = data.encode()
    return base64.b64encode(data).decode()


def unb64(text: str) -> bytes:
    return base64.b64decode(text)


class Conn:
    """One websocket connection speaking the exec-server protocol."""

    def __init__(self, ws):
        self.ws = ws
        self.inbox = []          # parsed messages not yet handed out
        self.raw = []            # every text frame received, in order
        self.next_id = 1
        self.closed_rcvd = None  # set once the server has closed
        self.closed = False
        self.process_log = {}    # processId -> its process/* notifications
        self.binary_frames = 0   # the servers send text frames only

    # -- low level ---------------------------------------------------

    @property
    def local_address(self):
        host, port = self.ws.local_address[:2]
        return f"{host}:{port}"

    async def send_raw(self, frame):
        """Send a text (str) or binary (bytes) frame as is."""
        await self.ws.send(frame)

    async def send(self, message: dict):
        await self.ws.send(json.dumps(message, separators=(",", ":")))

    async def _recv(self, timeout):
        if self.closed:
            raise ServerClosed(self.closed_rcvd)
        try:
            frame = await asyncio.wait_for(self.ws.recv(), timeout)
        except ConnectionClosed as e:
            self.closed = True
            self.closed_rcvd = e.rcvd
            raise ServerClosed(e.rcvd) from None
        if isinstance(frame, bytes):
            self.binary_frames += 1
            frame = frame.decode()
        self.raw.append(frame)
        assert "\n" not in frame, f"frame contains a newline: {frame!r}"
        m = json.loads(frame)
        if (isinstance(m, dict) and "id" not in m
                and str(m.get("method", "")).startswith("process/")):
            pid = (m.get("params") or {}).get("processId")
            self.process_log.setdefault(pid, []).append(m)
        return m

    async def wait_for(self, pred, timeout=WAIT):
        """The first message (queued or arriving) matching `pred`."""
        for i, m in enumerate(self.inbox):
            if pred(m):
                return self.inbox.pop(i)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            left = deadline - loop.time()
            if left <= 0:
                raise asyncio.TimeoutError(f"no matching message within {timeout}s; "
                                           f"queued: {self.inbox!r}")
            m = await self._recv(left)
            if pred(m):
                return m
            self.inbox.append(m)

    async def wait_closed(self, timeout=WAIT):
        """Wait until the server drops the connection; True if it did,
        False if the connection was still open (and answering) at the end."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        try:
            while loop.time() < deadline:
                m = await self._recv(max(0.01, deadline - loop.time()))
                self.inbox.append(m)
        except ServerClosed:
            return True
        except asyncio.TimeoutError:
            return False
        return False

    # -- requests ----------------------------------------------------

    async def request(self, method, params=..., *, id=None, extra=None, timeout=WAIT):
        """Send a request and return the whole response message."""
        if id is None:
            id = self.next_id
            self.next_id += 1
        msg = {"id": id, "method": method}
        if params is not ...:
            msg["params"] = params
        if extra:
            msg.update(extra)
        await self.send(msg)
        return await self.wait_for(
            lambda m: "method" not in m and m.get("id") == id
            and ("result" in m or "error" in m), timeout)

    async def call(self, method, params=..., **kw):
        """The result of a request; RpcError on an error response."""
        r = await self.request(method, params, **kw)
        if "error" in r:
            raise RpcError(method, r["error"])
        return r["result"]

    async def error(self, method, params=..., **kw):
        """The error object of a request that must fail."""
        r = await self.request(method, params, **kw)
        assert "error" in r, f"{method} {json.dumps(params)} succeeded: {json.dumps(r)}"
        return r["error"]

    async def notify(self, method, params=...):
        msg = {"method": method}
        if params is not ...:
            msg["params"] = params
        await self.send(msg)

    async def initialize(self, **params):
        params.setdefault("clientName", "conformance")
        return await self.call("initialize", params)

    # -- notifications -----------------------------------------------

    async def notification(self, method, timeout=WAIT, **match):
        def pred(m):
            return (m.get("method") == method and "id" not in m
                    and all(m.get("params", {}).get(k) == v for k, v in match.items()))
        return await self.wait_for(pred, timeout)

    async def process_events(self, process_id, timeout=WAIT):
        """Every process/* notification of one process (also those already
        handed out by `notification`), in arrival order, once all have come:
        process/closed carries the highest seq and every seq below it belongs
        to one output or the exit (the reference may deliver them out of seq
        order)."""
        def complete():
            log = self.process_log.get(process_id, [])
            closed = [m for m in log if m["method"] == "process/closed"]
            return bool(closed) and len(log) >= closed[0]["params"]["seq"]

        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while not complete():
            left = deadline - loop.time()
            if left <= 0:
                raise asyncio.TimeoutError(
                    f"process {process_id} did not close within {timeout}s; "
                    f"seen: {self.process_log.get(process_id)!r}")
            self.inbox.append(await self._recv(left))
        log = list(self.process_log[process_id])
        self.inbox = [m for m in self.inbox if not any(m is e for e in log)]
        return log

    async def close(self):
        try:
            await self.ws.close()
        except Exception:
            pass


class Run:
    """What a finished process produced, from its notifications."""

    def __init__(self, events):
        self.events = events
        self.outputs = [e["params"] for e in events if e["method"] == "process/output"]
        exited = [e["params"] for e in events if e["method"] == "process/exited"]
        closed = [e["params"] for e in events if e["method"] == "process/closed"]
        assert len(exited) == 1, f"exactly one process/exited expected: {events!r}"
        assert len(closed) == 1, f"exactly one process/closed expected: {events!r}"
        self.exited = exited[0]
        self.closed = closed[0]
        self.exit_code = self.exited["exitCode"]

    def data(self, stream=None):
        return b"".join(unb64(o["chunk"]) for o in sorted(self.outputs, key=lambda o: o["seq"])
                        if stream is None or o["stream"] == stream)

    @property
    def seqs(self):
        return sorted(e["params"]["seq"] for e in self.events)


async def connect(url, headers=None, compression=None):
    ws = await websockets.connect(
        url, additional_headers=headers or {}, compression=compression, proxy=None,
        max_size=64 * 1024 * 1024, open_timeout=WAIT, ping_interval=None)
    return Conn(ws)
