"""What only the November 2026 revision (Codex 0.169.0) does: file:// URIs,
environmentInfo, writeId, process/signal and the newer methods."""

import os
import re
import socket

import pytest

from .conftest import gateway_version
from .harness import Run, b64

REVISIONS = ("nov",)

ENOENT = {"code": -32004, "message": "No such file or directory (os error 2)"}
ENVIRONMENT_INFO_KEYS = {"shell", "executorVersion", "providerId", "cwd", "userHomeDir",
                         "platformOs", "prependPathDirs", "temporaryDirectories", "tempDir",
                         "capabilities"}
CAPABILITIES = {"networkProxyLaunch", "networkProxyReviewDomains", "credentialMasking",
                "credentialMaskingCustomProviders", "capabilityDiscoverySandbox",
                "fsWatchMissing", "capabilityDiscoveryV2", "environmentConfigRead",
                "httpHeaderEnvVars", "sandboxedFileStreaming", "fileWriteStreaming",
                "shellSnapshotV2", "windowsMxc", "linuxRootWritePreservesDevices",
                "linuxApprovedRootWritePreservesRestrictions"}
# What the gateway implements, so advertises (it advertises nothing else).
GATEWAY_CAPABILITIES = {"fsWatchMissing", "capabilityDiscoveryV2", "environmentConfigRead",
                        "fileWriteStreaming"}
WALK = {"maxDepth": 10, "maxDirectories": 100, "maxEntries": 100,
        "followDirectorySymlinks": False, "pruneHiddenDirectories": True}


def walk_tree(t):
    (t.dir / "a/b").mkdir(parents=True)
    (t.dir / "a/b/x").write_text("x")
    (t.dir / "f.txt").write_text("payload")
    (t.dir / ".hidden").mkdir()
    (t.dir / ".hidden/h").write_text("h")
    os.symlink("a", t.dir / "alink")


def walked(t, result):
    return [(str(t.unwire(e["path"])[len(str(t.dir)) + 1:]), e["kind"]) for e in result["entries"]]


@pytest.mark.reference_quirk(
    reason="executorVersion is the server's own version, providerId identifies the "
           "environment, prependPathDirs name the reference's bundled tools (the gateway has "
           "none) and capabilities are true only for what each server implements")
async def test_initialize_environment_info(t):
    c = await t.connect()
    r = await c.initialize()
    assert set(r) == {"sessionId", "environmentInfo"}
    info = r["environmentInfo"]
    assert set(info) == ENVIRONMENT_INFO_KEYS
    assert set(info["shell"]) == {"name", "path"}
    assert info["shell"]["path"].startswith("/")
    assert info["shell"]["name"] == os.path.basename(info["shell"]["path"])
    assert info["cwd"] == t.wire(t.root)
    assert info["userHomeDir"] == t.wire(t.root)
    assert (info["platformOs"], info["tempDir"], info["temporaryDirectories"]) == (
        "linux", "file:///tmp", [])
    assert re.fullmatch(r"sha256:[0-9a-f]{64}", info["providerId"]), info["providerId"]
    assert set(info["capabilities"]) == CAPABILITIES
    assert all(isinstance(v, bool) for v in info["capabilities"].values())
    assert all(d.startswith("file:///") for d in info["prependPathDirs"])
    if t.reference:
        assert info["executorVersion"] == "0.169.0"
        assert info["prependPathDirs"], info
        assert info["capabilities"]["fsWatchMissing"] is True
    else:
        assert info["executorVersion"] == gateway_version()
        assert info["prependPathDirs"] == []
        # httpHeaderEnvVars exactly where the tenant has http/request (a
        # network namespace of its own: valueEnvVar reads its secrets).
        ftp = {"method": "GET", "url": "ftp://127.0.0.1/x", "requestId": "cap"}
        performs = (await c.error("http/request", ftp))["code"] != -32003
        advertised = {k for k, v in info["capabilities"].items() if v}
        assert advertised == GATEWAY_CAPABILITIES | ({"httpHeaderEnvVars"} if performs else set())
    # Stable per environment.
    other = await t.session()
    assert other.init_result["environmentInfo"]["providerId"] == info["providerId"]


async def test_environment_info_and_status(t):
    c = await t.session()
    info = c.init_result["environmentInfo"]
    for params in (None, {}, ...):
        assert await c.call("environment/info", params) == info
        assert await c.call("environment/status", params) == {"status": "ready"}


@pytest.mark.reference_quirk(
    reason="codexHomeDir is the reference's CODEX_HOME; the gateway keeps no Codex home and "
           "names .codex under the tenant's home")
async def test_environment_config_read(t):
    c = await t.session()
    assert await c.error("environmentConfig/read", {
        "cwd": t.p(), "configPaths": [], "requirementsPaths": []}) == {
        "code": -32602, "message": "at least one config or requirements path is required"}
    assert await c.error("environmentConfig/read", {
        "cwd": t.p(), "configPaths": [["mcp_servers"]]}) == {
        "code": -32602, "message": "missing field `requirementsPaths`"}
    r = await c.call("environmentConfig/read", {
        "cwd": t.p(), "configPaths": [["mcp_servers"]], "requirementsPaths": [["mcp_servers"]]})
    assert set(r) == {"userHomeDir", "codexHomeDir", "hostname", "config", "requirements"}
    assert r["userHomeDir"] == t.wire(t.root)
    assert r["hostname"] == socket.gethostname()
    empty = {"layers": [], "cloudInsertionIndex": 0}
    assert (r["config"], r["requirements"]) == (empty, empty)
    if t.reference:
        assert r["codexHomeDir"] == t.wire(t.server.codex_home)
    else:
        assert r["codexHomeDir"] == t.wire(t.root / ".codex")


async def test_capability_discovery(t):
    c = await t.session()
    assert await c.call("capabilities/discoverV2", {"cwd": t.p()}) == {
        "plugins": [], "skills": [], "warnings": []}
    # A missing cwd finds nothing too.
    assert await c.call("capabilities/discoverV2", {"cwd": t.p("missing")}) == {
        "plugins": [], "skills": [], "warnings": []}
    assert await c.error("capabilities/discoverV2", {}) == {
        "code": -32602, "message": "missing field `cwd`"}
    assert await c.call("capabilityRoots/discoverV1", {"roots": []}) == {"roots": []}
    assert await c.error("capabilityRoots/discoverV1", {"roots": [{"path": t.p()}]}) == {
        "code": -32602, "message": "missing field `id`"}
    assert await c.error("capabilityRoots/discoverV1", {}) == {
        "code": -32602, "message": "missing field `roots`"}


async def test_capability_roots_reports_each_root(t):
    c = await t.session()
    r = await c.call("capabilityRoots/discoverV1", {"roots": [{"id": "r1", "path": t.p()}]})
    assert r == {"roots": [{"id": "r1", "path": t.p(), "plugin": None, "skills": [],
                            "namespaceManifests": [], "warnings": [], "error": None}]}


async def test_canonicalize(t):
    walk_tree(t)
    os.symlink("f.txt", t.dir / "flink")
    c = await t.session()
    for path, want in (("flink", "f.txt"), ("a/b/../../f.txt", "f.txt"), ("alink/b", "a/b")):
        assert await c.call("fs/canonicalize", {"path": t.p(path)}) == {"path": t.p(want)}
    assert await c.error("fs/canonicalize", {"path": t.p("missing")}) == ENOENT
    assert await c.error("fs/canonicalize", {"path": str(t.dir)}) == {
        "code": -32602, "message": "invalid URI: relative URL without a base"}


async def test_walk(t):
    walk_tree(t)
    c = await t.session()

    async def walk(**options):
        r = await c.call("fs/walk", {"path": t.p(), "options": dict(WALK, **options)})
        assert set(r) == {"entries", "errors", "truncated"}
        assert r["errors"] == []
        return walked(t, r), r["truncated"]

    # Breadth first, names sorted; hidden directories listed, not entered;
    # directory symlinks skipped unless followed.
    assert await walk() == ([(".hidden", "directory"), ("a", "directory"), ("f.txt", "file"),
                             ("a/b", "directory"), ("a/b/x", "file")], False)
    assert await walk(pruneHiddenDirectories=False) == (
        [(".hidden", "directory"), ("a", "directory"), ("f.txt", "file"), (".hidden/h", "file"),
         ("a/b", "directory"), ("a/b/x", "file")], False)
    assert await walk(followDirectorySymlinks=True) == (
        [(".hidden", "directory"), ("a", "directory"), ("alink", "directory"), ("f.txt", "file"),
         ("a/b", "directory"), ("a/b/x", "file")], False)
    assert await walk(maxEntries=1) == ([(".hidden", "directory")], True)
    assert await walk(maxDepth=1) == ([(".hidden", "directory"), ("a", "directory"),
                                       ("f.txt", "file"), ("a/b", "directory")], False)
    assert await walk(maxDirectories=1) == ([(".hidden", "directory"), ("a", "directory"),
                                             ("f.txt", "file")], True)
    for limit in ("maxEntries", "maxDirectories"):
        assert await c.error("fs/walk", {"path": t.p(), "options": dict(WALK, **{limit: 0})}) == {
            "code": -32600, "message": "filesystem walk limits must be greater than zero"}
    assert await c.error("fs/walk", {"path": t.p("missing"), "options": WALK}) == ENOENT
    assert await c.call("fs/walk", {"path": t.p("f.txt"), "options": WALK}) == {
        "entries": [], "errors": [], "truncated": False}
    assert await c.error("fs/walk", {"path": t.p()}) == {
        "code": -32602, "message": "missing field `options`"}


async def test_walk_depth_zero_lists_the_top_level(t):
    walk_tree(t)
    c = await t.session()
    r = await c.call("fs/walk", {"path": t.p(), "options": dict(WALK, maxDepth=0)})
    assert (walked(t, r), r["truncated"]) == (
        [(".hidden", "directory"), ("a", "directory"), ("f.txt", "file")], False)


async def test_file_handles_read(t):
    (t.dir / "f.txt").write_text("payload")
    (t.dir / "d").mkdir()
    c = await t.session()
    assert await c.call("fs/open", {"handleId": "h1", "path": t.p("f.txt")}) == {"handleId": "h1"}
    assert await c.call("fs/readBlock", {"handleId": "h1", "offset": 0, "len": 3}) == {
        "chunk": b64("pay"), "eof": False}
    # A block that ends exactly at the end is not yet eof: a short one is.
    assert await c.call("fs/readBlock", {"handleId": "h1", "offset": 0, "len": 7}) == {
        "chunk": b64("payload"), "eof": False}
    assert await c.call("fs/readBlock", {"handleId": "h1", "offset": 3, "len": 100}) == {
        "chunk": b64("load"), "eof": True}
    assert await c.call("fs/readBlock", {"handleId": "h1", "offset": 100, "len": 100}) == {
        "chunk": "", "eof": True}
    assert await c.call("fs/readBlock", {"handleId": "h1", "offset": 0, "len": 1048576}) == {
        "chunk": b64("payload"), "eof": True}
    for bad in (0, 1048577):
        assert await c.error("fs/readBlock", {"handleId": "h1", "offset": 0, "len": bad}) == {
            "code": -32600, "message": "file read block length must be between 1 and 1048576"}
    assert await c.error("fs/writeBlock", {"handleId": "h1", "offset": 0, "chunk": b64("z")}) == {
        "code": -32603, "message": "Bad file descriptor (os error 9)"}
    assert await c.error("fs/open", {"handleId": "h1", "path": t.p("f.txt")}) == {
        "code": -32600, "message": "file handle `h1` already exists"}
    # close is idempotent; the handle is gone afterwards.
    assert await c.call("fs/close", {"handleId": "h1"}) == {}
    assert await c.call("fs/close", {"handleId": "h1"}) == {}
    unknown = {"code": -32004, "message": "unknown file handle `h1`"}
    assert await c.error("fs/readBlock", {"handleId": "h1", "offset": 0, "len": 1}) == unknown
    assert await c.error("fs/writeBlock", {"handleId": "h1", "offset": 0, "chunk": b64("z")}) == unknown
    assert await c.error("fs/open", {"handleId": "h2", "path": t.p("d")}) == {
        "code": -32600, "message": f"path `{t.dir / 'd'}` is not a file"}
    assert await c.error("fs/open", {"handleId": "h3", "path": t.p("missing")}) == ENOENT
    assert await c.error("fs/open", {"handleId": "h4", "path": t.p("f.txt"), "mode": "append"}) == {
        "code": -32602, "message": "unknown variant `append`, expected `read` or `replace`"}
    assert (t.dir / "f.txt").read_text() == "payload"


async def test_file_handles_replace(t):
    (t.dir / "old.txt").write_text("previous content")
    c = await t.session()
    # replace truncates (or creates) at once.
    await c.call("fs/open", {"handleId": "w1", "path": t.p("old.txt"), "mode": "replace"})
    assert (t.dir / "old.txt").read_bytes() == b""
    await c.call("fs/open", {"handleId": "w2", "path": t.p("new.bin"), "mode": "replace"})
    assert (t.dir / "new.bin").read_bytes() == b""
    assert await c.call("fs/writeBlock", {"handleId": "w2", "offset": 0,
                                          "chunk": b64("hello ")}) == {}
    # Past the end: the gap is zero-filled.
    assert await c.call("fs/writeBlock", {"handleId": "w2", "offset": 10,
                                          "chunk": b64("world")}) == {}
    assert await c.error("fs/readBlock", {"handleId": "w2", "offset": 0, "len": 3}) == {
        "code": -32603, "message": "Bad file descriptor (os error 9)"}
    assert await c.call("fs/close", {"handleId": "w2"}) == {}
    assert (t.dir / "new.bin").read_bytes() == b"hello \0\0\0\0world"
    await c.call("fs/close", {"handleId": "w1"})
    assert await c.error("fs/open", {"handleId": "w3", "path": t.p("nodir/x"),
                                     "mode": "replace"}) == ENOENT


async def test_write_block_length_limits(t):
    c = await t.session()
    await c.call("fs/open", {"handleId": "w", "path": t.p("new.bin"), "mode": "replace"})
    limits = {"code": -32600, "message": "file write block length must be between 1 and 1048576"}
    for size in (0, 1048577):
        params = {"handleId": "w", "offset": 0, "chunk": b64(b"x" * size)}
        assert await c.error("fs/writeBlock", params) == limits, size
    assert await c.call("fs/writeBlock", {"handleId": "w", "offset": 0,
                                          "chunk": b64(b"x" * 1048576)}) == {}
    assert (t.dir / "new.bin").stat().st_size == 1048576


async def test_open_mode_must_be_a_variant_name(t):
    (t.dir / "f.txt").write_text("payload")
    c = await t.session()
    assert await c.error("fs/open", {"handleId": "h", "path": t.p("f.txt"), "mode": {}}) == {
        "code": -32602, "message": "invalid value: map, expected map with a single key"}


async def test_write_block_bad_base64(t):
    c = await t.session()
    await c.call("fs/open", {"handleId": "w", "path": t.p("new.bin"), "mode": "replace"})
    assert await c.error("fs/writeBlock", {"handleId": "w", "offset": 0, "chunk": "!!notb64"}) == {
        "code": -32602, "message": "Invalid symbol 33, offset 0."}


async def test_watch_missing(t):
    (t.dir / "present").write_text("x")
    c = await t.session()

    async def watch(watch_id, missing, present=None):
        params = {"watchId": watch_id, "missing": [t.p(m) for m in missing],
                  "present": t.p(present) if present else None}
        return (await c.call("fs/watchMissing", params))["watching"]

    assert await watch(5, ["m1", "m2"]) is True
    # watchId is a generation: an older or equal one is ignored.
    assert await watch(3, ["m3"]) is False
    assert await watch(5, ["m3"]) is False
    (t.dir / "m2").write_text("")
    assert (await c.notification("fs/missingChanged")) == {
        "method": "fs/missingChanged", "params": {"watchId": 5}}
    # Nothing missing, or a `present` path that is absent: not watching.
    assert await watch(7, ["present"]) is False
    assert await watch(8, ["m9"], present="absent") is False
    # Fires (once) when `present` disappears.
    assert await watch(9, ["m9"], present="present") is True
    (t.dir / "present").unlink()
    assert (await c.notification("fs/missingChanged")) == {
        "method": "fs/missingChanged", "params": {"watchId": 9}}
    assert [m for m in c.inbox if m.get("method") == "fs/missingChanged"] == []
    assert await c.error("fs/watchMissing", {"missing": []}) == {
        "code": -32602, "message": "missing field `watchId`"}
    assert await c.error("fs/watchMissing", {"watchId": 11}) == {
        "code": -32602, "message": "missing field `missing`"}


async def test_write_id(t):
    c = await t.session()
    await t.start(c, "p", ["sh", "-c", "read a; echo got:$a; read b; echo got:$b"],
                  pipeStdin=True)
    params = {"processId": "p", "chunk": b64("x\n")}
    assert await c.error("process/write", params) == {
        "code": -32602, "message": "missing field `writeId`"}
    assert await c.error("process/write", dict(params, writeId="")) == {
        "code": -32602, "message": "writeId must not be empty"}
    # A repeated writeId is acknowledged but not written again.
    assert await t.write(c, "p", "one\n", write_id="1") == {"status": "accepted"}
    assert await t.write(c, "p", "two\n", write_id="1") == {"status": "accepted"}
    assert await t.write(c, "p", "three\n", write_id="2") == {"status": "accepted"}
    run = Run(await c.process_events("p"))
    assert run.data() == b"got:one\ngot:three\n"


async def test_signal_interrupt(t):
    c = await t.session()
    trap = "trap 'echo got-int; exit 7' INT; echo ready; while :; do sleep 0.05; done"
    await t.start(c, "trap", ["sh", "-c", trap])
    await c.notification("process/output", processId="trap")
    assert await c.call("process/signal", {"processId": "trap", "signal": "interrupt"}) == {}
    run = Run(await c.process_events("trap"))
    assert (run.data(), run.exit_code) == (b"ready\ngot-int\n", 7)
    # To the process group; an uncaught SIGINT is 128+2.
    await t.start(c, "sleep", ["sh", "-c", "sleep 60; echo not-reached"])
    await c.call("process/read", {"processId": "sleep", "waitMs": 200})
    assert await c.call("process/signal", {"processId": "sleep", "signal": "interrupt"}) == {}
    run = Run(await c.process_events("sleep"))
    assert run.exit_code == 130 and b"not-reached" not in run.data()
    # Unknown and finished processes: still {}.
    assert await c.call("process/signal", {"processId": "nope", "signal": "interrupt"}) == {}
    assert await c.call("process/signal", {"processId": "sleep", "signal": "interrupt"}) == {}
    assert await c.error("process/signal", {"processId": "sleep"}) == {
        "code": -32602, "message": "missing field `signal`"}


@pytest.mark.reference_quirk(
    reason="0.169.0 knows only `interrupt`; the gateway's process/signal extension also takes "
           "terminate, kill, hangup, quit, user1 and user2")
async def test_signal_variants(t):
    c = await t.session()
    await t.start(c, "p", ["sleep", "60"])
    params = {"processId": "p", "signal": "terminate"}
    if t.reference:
        assert await c.error("process/signal", params) == {
            "code": -32602, "message": "unknown variant `terminate`, expected `interrupt`"}
        await c.call("process/terminate", {"processId": "p"})
    else:
        assert await c.call("process/signal", params) == {}
        assert Run(await c.process_events("p")).exit_code == 143


async def test_start_accepts_the_client_fields(t):
    c = await t.session()
    params = t.start_params(
        "p", ["sh", "-c", "echo ok"],
        metadata={"threadId": "01a205e0-0bfa-7c73-a46a-a9ab96a42bdd", "toolCallId": "call-1"},
        sandbox=None, enforceManagedNetwork=False, managedNetwork=None, networkProxy=None,
        shellSnapshot=None, arg0=None, pipeStdin=False)
    assert await c.call("process/start", params) == {"processId": "p", "sandboxType": "none"}
    run = Run(await c.process_events("p"))
    assert (run.data(), run.exit_code, run.exited["sandboxDenied"]) == (b"ok\n", 0, False)


@pytest.mark.reference_quirk(
    reason="the reference applies a request's sandbox itself (linuxSeccomp); the gateway "
           "confines every process by tenant and reports sandboxType none")
async def test_start_with_sandbox(t):
    c = await t.session()
    sandbox = {"permissions": {"type": "managed", "file_system": {
        "type": "restricted", "entries": [
            {"path": {"type": "special", "value": {"kind": "root"}}, "access": "read"}]},
        "network": "restricted"}, "cwd": t.p(), "windowsSandboxLevel": "disabled",
        "useLegacyLandlock": False}
    r = await c.call("process/start", t.start_params("p", ["echo", "hi"], sandbox=sandbox))
    assert set(r) == {"processId", "sandboxType"}
    assert r["sandboxType"] == ("linuxSeccomp" if t.reference else "none")
    run = Run(await c.process_events("p"))
    assert (run.data(), run.exit_code, run.exited["sandboxDenied"]) == (b"hi\n", 0, False)


@pytest.mark.reference_quirk(
    reason="the gateway accepts and ignores `sandbox` (the tenant's confinement applies), so "
           "it does not decode one; the reference requires `permissions` in it")
async def test_start_sandbox_without_permissions(t):
    c = await t.session()
    params = t.start_params("p", ["true"], sandbox={})
    if t.reference:
        assert await c.error("process/start", params) == {
            "code": -32602, "message": "missing field `permissions`"}
    else:
        assert await c.call("process/start", params) == {"processId": "p", "sandboxType": "none"}
        assert Run(await c.process_events("p")).exit_code == 0


async def test_uri_forms(t):
    (t.dir / "with space").mkdir()
    (t.dir / "with space/f.txt").write_text("payload")
    c = await t.session()
    d = str(t.dir)
    for uri in ("file://localhost" + d, "FILE://" + d, "file:" + d,
                f"file://{d}/../{t.dir.name}"):
        assert (await c.call("fs/getMetadata", {"path": uri}))["isDirectory"] is True, uri
    encoded = f"file://{d}/with%20space/f.txt"
    assert (await c.call("fs/getMetadata", {"path": encoded}))["size"] == 7
    # Results are file:/// URIs, percent-encoded.
    r = await c.call("fs/canonicalize", {"path": f"file://localhost{d}/with%20space/f.txt"})
    assert r == {"path": encoded}
    r = await c.call("fs/walk", {"path": "file://" + d, "options": WALK})
    assert [e["path"] for e in r["entries"]] == [f"file://{d}/with%20space", encoded]
    run = await t.run(c, "pwd", ["pwd"], cwd=f"file://localhost{d}/with%20space")
    assert run.data() == f"{d}/with space\n".encode()


async def test_uri_errors(t):
    c = await t.session()
    d = str(t.dir)
    host = f"file://host{d}"
    assert await c.error("fs/getMetadata", {"path": host}) == {
        "code": -32600, "message": f"'{host}' is invalid on 'linux'"}
    assert await c.error("process/start", t.start_params("p", ["true"], cwd=host)) == {
        "code": -32602,
        "message": f"cwd URI `{host}` is not valid on this exec-server host: "
                   f"'{host}' is invalid on 'linux'"}
    scheme = {"code": -32602, "message": "unsupported path URI scheme `http`"}
    assert await c.error("fs/getMetadata", {"path": "http://x" + d}) == scheme
    assert await c.error("process/start", t.start_params("p", ["true"], cwd="http://x" + d)) == scheme
    plain = {"code": -32602, "message": "invalid URI: relative URL without a base"}
    assert await c.error("process/start", t.start_params("p", ["true"], cwd=d)) == plain


async def test_null_and_float_ids(t):
    c = await t.session()
    await t.tell(c)
    prefix = f"failed to parse websocket JSON-RPC message from exec-server websocket {c.local_address}: "
    for rid in ("null", "1.5"):
        await c.send_raw('{"id":%s,"method":"process/read","params":{"processId":"x"}}' % rid)
        m = await c.wait_for(lambda m: m.get("id") == -1)
        assert m == {"error": {"code": -32600, "message": prefix + "data did not match any "
                               "variant of untagged enum RequestId"}, "id": -1}
    assert await c.call("process/terminate", {"processId": "x"}) == {"running": False}


async def test_gates_of_the_newer_families(t):
    families = [
        ("environment/info", None, "environment info"),
        ("environment/status", None, "environment status"),
        ("environmentConfig/read", {"cwd": t.p(), "configPaths": [["a"]],
                                    "requirementsPaths": []}, "environment config"),
        ("capabilities/discoverV2", {"cwd": t.p()}, "capability discovery"),
        ("capabilityRoots/discoverV1", {"roots": []}, "capability discovery"),
        ("fs/canonicalize", {"path": t.p()}, "filesystem"),
        ("process/signal", {"processId": "x", "signal": "interrupt"}, "exec"),
    ]
    c = await t.connect()
    for method, params, family in families:
        assert await c.error(method, params) == {
            "code": -32600, "message": f"client must call initialize before using {family} methods"}
    await c.initialize()
    for method, params, family in families:
        assert await c.error(method, params) == {
            "code": -32600, "message": f"client must send initialized before using {family} methods"}


async def test_methods_0_169_does_not_implement(t):
    c = await t.session()
    for method in ("fs/unwatch", "fs/readStream", "capabilities/loadDiscoveries"):
        assert await c.error(method, {}) == {
            "code": -32601, "message": f"exec-server stub does not implement `{method}` yet"}
