"""What only the May 2026 revision (Codex 0.130.0) does."""

import pytest

from .harness import Run

REVISIONS = ("may",)

ENOENT = {"code": -32603, "message": "No such file or directory (os error 2)"}
NEWER_METHODS = {
    "environment/info": None,
    "environment/status": None,
    "fs/canonicalize": "path",
    "fs/walk": "path",
    "fs/watchMissing": "missing",
    "capabilities/discoverV2": "cwd",
}


@pytest.mark.reference_quirk(
    reason="both Codex clients send the same initialize, so the gateway cannot know the "
           "revision yet and answers 0.169's superset (sessionId plus environmentInfo), which "
           "the 0.130.0 client accepts")
async def test_initialize_result(t):
    c = await t.connect()
    r = await c.initialize()
    if t.reference:
        assert set(r) == {"sessionId"}
    else:
        assert set(r) == {"sessionId", "environmentInfo"}
        assert r["environmentInfo"]["platformOs"] == "linux"


@pytest.mark.reference_quirk(
    reason="0.130.0 lacks 0.169's newer methods (-32601); the gateway serves them in a May "
           "session too, answering in the session's path form")
async def test_newer_methods(t):
    (t.dir / "f.txt").write_text("x")
    c = await t.session()
    await t.tell(c)
    if t.reference:
        for method in NEWER_METHODS:
            assert await c.error(method, {}) == {
                "code": -32601, "message": f"exec-server stub does not implement `{method}` yet"}
    else:
        r = await c.call("fs/canonicalize", {"path": str(t.dir / "a/../f.txt")})
        assert r == {"path": str(t.dir / "f.txt")}
        assert await c.call("environment/status", None) == {"status": "ready"}


@pytest.mark.reference_quirk(
    reason="process/signal arrived after 0.130.0 (-32601 there); the gateway offers it as an "
           "extension, and a signal death is reported as -1 in a May session")
async def test_process_signal(t):
    c = await t.session()
    await t.start(c, "p", ["sleep", "60"])
    params = {"processId": "p", "signal": "interrupt"}
    if t.reference:
        assert await c.error("process/signal", params) == {
            "code": -32601, "message": "exec-server stub does not implement `process/signal` yet"}
        await c.call("process/terminate", {"processId": "p"})
    else:
        assert await c.call("process/signal", params) == {}
        assert Run(await c.process_events("p")).exit_code == -1


@pytest.mark.reference_quirk(
    reason="0.130.0 decodes {\"id\":null,...} as a notification and drops the connection; the "
           "gateway answers -32600 on id -1 and keeps it")
async def test_null_id(t):
    c = await t.session()
    await t.tell(c)
    await c.send_raw('{"id":null,"method":"process/read","params":{"processId":"x"}}')
    if t.reference:
        assert await c.wait_closed()
        assert c.closed_rcvd is None
    else:
        m = await c.wait_for(lambda m: m.get("id") == -1)
        assert m["error"]["code"] == -32600
        assert await c.error("process/read", {"processId": "x"}) == {
            "code": -32600, "message": "unknown process id x"}


async def test_relative_cwd_fails_at_spawn(t):
    # cwd is a plain PathBuf in 0.130.0: not checked for being absolute.
    c = await t.session()
    await t.tell(c)
    params = t.start_params("p", ["true"], cwd="no-such-relative-dir")
    assert await c.error("process/start", params) == ENOENT


async def test_uri_cwd_is_a_relative_directory(t):
    # A file:// cwd is a relative directory named "file:" to 0.130.0.
    c = await t.session()
    await t.tell(c)
    params = t.start_params("p", ["true"], cwd="file://" + str(t.dir))
    assert await c.error("process/start", params) == ENOENT


@pytest.mark.reference_quirk(
    reason="0.130.0 ignores an unknown writeId field, so a repeated one is written again; the "
           "gateway's documented optional writeId acknowledges a repeat without writing it")
async def test_write_id(t):
    c = await t.session()
    await t.start(c, "p", ["sh", "-c", "read a; echo got:$a; read b; echo got:$b"],
                  pipeStdin=True)
    assert await t.write(c, "p", "one\n", write_id="same") == {"status": "accepted"}
    assert await t.write(c, "p", "two\n", write_id="same") == {"status": "accepted"}
    if t.gateway:
        assert await t.write(c, "p", "three\n", write_id="other") == {"status": "accepted"}
    run = Run(await c.process_events("p"))
    assert run.data() == (b"got:one\ngot:two\n" if t.reference else b"got:one\ngot:three\n")
