"""The envelope, the initialize handshake and sessions: both revisions."""

import asyncio
import re

import pytest

from .harness import unb64

REVISIONS = ("may", "nov")

UUID4 = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$")
PARSE_PREFIX = "failed to parse websocket JSON-RPC message from exec-server websocket {addr}: "


async def test_initialize_once_per_connection(t):
    c = await t.connect()
    e = await c.error("initialize", {})
    assert e == {"code": -32602, "message": "missing field `clientName`"}
    # A failed initialize may be retried.
    first = await c.initialize()
    assert UUID4.match(first["sessionId"]), first
    e = await c.error("initialize", {"clientName": "again"})
    assert e == {"code": -32600, "message": "initialize may only be sent once per connection"}
    other = await t.session()
    assert other.init_result["sessionId"] != first["sessionId"]


async def test_gates_before_initialize_and_initialized(t):
    c = await t.connect()
    read = {"processId": "nope"}
    meta = {"path": t.p()}
    assert await c.error("process/read", read) == {
        "code": -32600, "message": "client must call initialize before using exec methods"}
    assert await c.error("fs/getMetadata", meta) == {
        "code": -32600, "message": "client must call initialize before using filesystem methods"}
    await c.initialize()
    assert await c.error("process/read", read) == {
        "code": -32600, "message": "client must send initialized before using exec methods"}
    assert await c.error("fs/getMetadata", meta) == {
        "code": -32600, "message": "client must send initialized before using filesystem methods"}
    await c.notify("initialized")
    assert await c.error("process/read", read) == {
        "code": -32600, "message": "unknown process id nope"}
    assert (await c.call("fs/getMetadata", meta))["isDirectory"] is True


async def test_params_decoded_before_the_initialize_gate(t):
    # The reference decodes params first: bad params win over the gate.
    c = await t.connect()
    assert await c.error("process/read", {}) == {
        "code": -32602, "message": "missing field `processId`"}
    assert await c.error("fs/getMetadata", {}) == {
        "code": -32602, "message": "missing field `path`"}


async def test_unknown_method(t):
    c = await t.session()
    for method in ("foo/bar", "process/resizePty", "fs/watch"):
        assert await c.error(method, {}) == {
            "code": -32601, "message": f"exec-server stub does not implement `{method}` yet"}


async def test_malformed_json_answered_on_id_minus_one(t):
    c = await t.session()
    await c.send_raw("{this is not json")
    m = await c.wait_for(lambda m: m.get("id") == -1)
    assert m == {"error": {"code": -32600, "message": PARSE_PREFIX.format(addr=c.local_address)
                           + "key must be a string at line 1 column 2"}, "id": -1}
    # The connection stays open.
    assert await c.call("process/terminate", {"processId": "nope"}) == {"running": False}


async def test_ids_fields_and_params_forms(t):
    c = await t.session()
    params = {"processId": "nope"}
    for rid in ("abc", -5, 9223372036854775807, 0):
        r = await c.request("process/terminate", params, id=rid)
        assert r == {"id": rid, "result": {"running": False}}
    # `jsonrpc` and `trace` accepted on input, never sent.
    r = await c.request("process/terminate", params, id=7,
                        extra={"jsonrpc": "2.0", "trace": {"traceparent": None}})
    assert r == {"id": 7, "result": {"running": False}}
    # Positional params decode in field order.
    assert await c.call("process/terminate", ["nope"]) == {"running": False}
    # A binary frame carries JSON too.
    await c.send_raw(b'{"id":"bin","method":"process/terminate","params":{"processId":"nope"}}')
    assert (await c.wait_for(lambda m: m.get("id") == "bin")) == {
        "id": "bin", "result": {"running": False}}
    # `initialized` may be repeated, with any params.
    await c.notify("initialized", {"x": 1})
    assert await c.call("process/terminate", params) == {"running": False}
    assert all('"jsonrpc"' not in frame for frame in c.raw)
    assert c.binary_frames == 0


async def test_batch_refused(t):
    c = await t.session()
    await t.tell(c)
    await c.send_raw('[{"id":1,"method":"process/read","params":{"processId":"x"}}]')
    m = await c.wait_for(lambda m: m.get("id") == -1)
    tail = t.pick(may="data did not match any variant of untagged enum JSONRPCMessage",
                  nov="expected a JSON-RPC object")
    assert m == {"error": {"code": -32600, "message": PARSE_PREFIX.format(addr=c.local_address)
                           + tail}, "id": -1}
    assert await c.call("process/terminate", {"processId": "x"}) == {"running": False}


@pytest.mark.reference_quirk(
    reason="the reference drops the connection (no close frame) on an unknown notification, "
           "`initialized` before `initialize` or a client response object; the gateway answers "
           "-32600 on id -1 (or ignores a response) and keeps the connection")
async def test_unexpected_messages(t):
    cases = [
        ("unknown notification", True, {"method": "bogus/notification", "params": {}}),
        ("initialized first", False, {"method": "initialized"}),
        ("client response", True, {"id": 5, "result": {}}),
    ]
    for name, initialize, message in cases:
        c = await (t.session() if initialize else t.connect())
        await c.send(message)
        if t.reference:
            assert await c.wait_closed(), name
            assert c.closed_rcvd is None, f"{name}: a close frame was sent"
            assert c.inbox == [], name
        else:
            if "result" not in message:
                m = await c.wait_for(lambda m: m.get("id") == -1)
                assert m["error"]["code"] == -32600, (name, m)
            if not initialize:
                await c.initialize()
                await c.notify("initialized")
            assert await c.call("process/terminate", {"processId": "x"}) == {"running": False}


async def test_resume_session(t):
    c1 = await t.session()
    sid = c1.init_result["sessionId"]
    await t.start(c1, "r1", ["sh", "-c", "read line; echo after:$line"], pipeStdin=True)
    # While attached, resuming elsewhere is refused.
    c2 = await t.connect()
    e = await c2.error("initialize", {"clientName": "x", "resumeSessionId": sid})
    assert e == {"code": t.pick(may=-32600, nov=-32010),
                 "message": f"session {sid} is already attached to another connection"}
    unknown = "00000000-0000-4000-8000-000000000000"
    e = await c2.error("initialize", {"clientName": "x", "resumeSessionId": unknown})
    assert e == {"code": -32600, "message": f"unknown session id {unknown}"}
    # Detach, then resume on a new connection: processes survived.
    await c1.close()
    for _ in range(100):  # until the server has noticed the disconnect
        c3 = await t.connect()
        r = await c3.request("initialize", {"clientName": "x", "resumeSessionId": sid})
        if "already attached" not in r.get("error", {}).get("message", ""):
            break
        await asyncio.sleep(0.1)
    assert "result" in r, r
    r = r["result"]
    assert r["sessionId"] == sid
    if t.nov:
        assert r["environmentInfo"] == c1.init_result["environmentInfo"]
    await c3.notify("initialized")
    await t.write(c3, "r1", "x\n")
    out = b""
    after, closed = 0, False
    while not closed:
        r = await c3.call("process/read", {"processId": "r1", "afterSeq": after, "waitMs": 5000})
        out += b"".join(unb64(ch["chunk"]) for ch in r["chunks"])
        after = r["chunks"][-1]["seq"] if r["chunks"] else after
        closed = r["closed"] and not r["chunks"]
    assert out == b"after:x\n"


async def test_process_ids_are_per_session(t):
    a = await t.session()
    b = await t.session()
    await t.run(a, "same", ["true"])
    assert await b.error("process/read", {"processId": "same"}) == {
        "code": -32600, "message": "unknown process id same"}
    run = await t.run(b, "same", ["sh", "-c", "exit 4"])
    assert run.exit_code == 4


@pytest.mark.reference_quirk(
    reason="the gateway performs executor-side HTTP inside the tenant's network namespace "
           "(its loopback, never the host's) and refuses it (-32003) to a tenant without one")
async def test_http_request(t):
    c = await t.session()
    ftp = {"method": "GET", "url": "ftp://127.0.0.1/x", "requestId": "r1"}
    refused = {"method": "GET", "url": "http://127.0.0.1:1/x", "requestId": "r2",
               "timeoutMs": 10000}
    answers = [await c.error("http/request", p) for p in (ftp, refused)]
    disabled = {"code": -32003, "message": "http/request is disabled on this gateway"}
    if not t.reference and answers[0] == disabled:
        assert answers[1] == disabled
        return
    assert answers == [
        {"code": -32602, "message": "http/request only supports http and https URLs, got ftp"},
        {"code": -32603,
         "message": "http/request failed: error sending request for url (http://127.0.0.1:1/x)"}]
