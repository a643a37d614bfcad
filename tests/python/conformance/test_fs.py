"""fs/*: the seven file methods both revisions share, with each revision's
path form, result shape and errors."""

import os
import time

import pytest

from .harness import b64, unb64

REVISIONS = ("may", "nov")

ENOENT = {"code": -32004, "message": "No such file or directory (os error 2)"}


def metadata_keys(t):
    keys = {"isDirectory", "isFile", "isSymlink", "createdAtMs", "modifiedAtMs"}
    return keys | {"size"} if t.nov else keys


def entries(result):
    return sorted((e["fileName"], e["isDirectory"], e["isFile"]) for e in result["entries"])


async def test_write_and_read_file(t):
    c = await t.session()
    data = bytes(range(256)) * 40
    assert await c.call("fs/writeFile", {"path": t.p("f.bin"), "dataBase64": b64(data)}) == {}
    assert (t.dir / "f.bin").read_bytes() == data
    assert await c.call("fs/readFile", {"path": t.p("f.bin")}) == {"dataBase64": b64(data)}
    # Truncates an existing file.
    await c.call("fs/writeFile", {"path": t.p("f.bin"), "dataBase64": b64("short")})
    assert unb64((await c.call("fs/readFile", {"path": t.p("f.bin")}))["dataBase64"]) == b"short"
    assert await c.error("fs/readFile", {"path": t.p("missing")}) == ENOENT
    assert await c.error("fs/writeFile", {"path": t.p("nodir/f"), "dataBase64": ""}) == ENOENT
    assert await c.error("fs/writeFile", {"path": t.p("g")}) == {
        "code": -32602, "message": "missing field `dataBase64`"}


async def test_read_file_on_directory(t):
    c = await t.session()
    e = await c.error("fs/readFile", {"path": t.p()})
    assert e == t.pick(may={"code": -32603, "message": "Is a directory (os error 21)"},
                       nov={"code": -32600, "message": f"path `{t.dir}` is not a file"})


async def test_write_file_bad_base64(t):
    c = await t.session()
    assert await c.error("fs/writeFile", {"path": t.p("g"), "dataBase64": "!!notb64"}) == {
        "code": -32600,
        "message": "fs/writeFile requires valid base64 dataBase64: Invalid symbol 33, offset 0."}
    assert not (t.dir / "g").exists()


async def test_create_directory(t):
    c = await t.session()
    # recursive defaults to true; an existing directory is fine then.
    assert await c.call("fs/createDirectory", {"path": t.p("a/b/c")}) == {}
    assert (t.dir / "a/b/c").is_dir()
    assert await c.call("fs/createDirectory", {"path": t.p("a")}) == {}
    assert await c.error("fs/createDirectory", {"path": t.p("x/y"), "recursive": False}) == ENOENT
    exists = {"code": -32603, "message": "File exists (os error 17)"}
    assert await c.error("fs/createDirectory", {"path": t.p("a"), "recursive": False}) == exists
    (t.dir / "file").write_text("x")
    assert await c.error("fs/createDirectory", {"path": t.p("file")}) == exists
    assert await c.call("fs/createDirectory", {"path": t.p("new"), "recursive": False}) == {}
    assert (t.dir / "new").is_dir()


async def test_metadata(t):
    before = time.time() * 1000
    (t.dir / "f.txt").write_text("payload")
    (t.dir / "d").mkdir()
    c = await t.session()
    for name, is_dir in (("f.txt", False), ("d", True)):
        m = await c.call("fs/getMetadata", {"path": t.p(name)})
        st = os.stat(t.dir / name)
        assert set(m) == metadata_keys(t), m
        assert (m["isDirectory"], m["isFile"], m["isSymlink"]) == (is_dir, not is_dir, False)
        assert m["modifiedAtMs"] == st.st_mtime_ns // 1_000_000
        # 0 when the birth time is unavailable, else when it was made.
        assert m["createdAtMs"] == 0 or before - 60_000 < m["createdAtMs"] <= m["modifiedAtMs"]
        if t.nov:
            assert m["size"] == st.st_size
    assert await c.error("fs/getMetadata", {"path": t.p("missing")}) == ENOENT


async def test_metadata_of_relative_symlinks(t):
    (t.dir / "f.txt").write_text("payload")
    (t.dir / "d").mkdir()
    os.symlink("f.txt", t.dir / "flink")
    os.symlink("d", t.dir / "dlink")
    os.symlink("gone", t.dir / "dangling")
    c = await t.session()
    m = await c.call("fs/getMetadata", {"path": t.p("flink")})
    assert (m["isDirectory"], m["isFile"], m["isSymlink"]) == (False, True, True)
    if t.nov:
        assert m["size"] == 7
    m = await c.call("fs/getMetadata", {"path": t.p("dlink")})
    assert (m["isDirectory"], m["isFile"], m["isSymlink"]) == (True, False, True)
    assert await c.error("fs/getMetadata", {"path": t.p("dangling")}) == ENOENT
    assert await c.call("fs/readFile", {"path": t.p("flink")}) == {"dataBase64": b64("payload")}


async def test_absolute_symlink_inside_workspace(t):
    # A link naming its target by absolute path, both inside the workspace
    # (`ln -s "$PWD/f.txt" abslink`): served like a relative one.
    (t.dir / "f.txt").write_text("payload")
    os.symlink(t.dir / "f.txt", t.dir / "abslink")
    os.symlink(t.dir, t.dir / "absdir")
    c = await t.session()
    listed = entries(await c.call("fs/readDirectory", {"path": t.p()}))
    m = await c.call("fs/getMetadata", {"path": t.p("abslink")})
    assert (m["isDirectory"], m["isFile"], m["isSymlink"]) == (False, True, True)
    assert await c.call("fs/readFile", {"path": t.p("abslink")}) == {
        "dataBase64": b64("payload")}
    assert await c.call("fs/readFile", {"path": t.p("absdir/f.txt")}) == {
        "dataBase64": b64("payload")}
    assert listed == [("absdir", True, False), ("abslink", False, True), ("f.txt", False, True)]


async def test_read_directory(t):
    (t.dir / "f.txt").write_text("x")
    (t.dir / "sub").mkdir()
    os.symlink("sub", t.dir / "sublink")
    os.symlink("f.txt", t.dir / "flink")
    os.symlink("gone", t.dir / "dangling")  # skipped
    c = await t.session()
    r = await c.call("fs/readDirectory", {"path": t.p()})
    assert set(r) == {"entries"}
    assert all(set(e) == {"fileName", "isDirectory", "isFile"} for e in r["entries"])
    assert entries(r) == [("f.txt", False, True), ("flink", False, True),
                          ("sub", True, False), ("sublink", True, False)]
    assert await c.call("fs/readDirectory", {"path": t.p("sub")}) == {"entries": []}
    assert await c.error("fs/readDirectory", {"path": t.p("f.txt")}) == {
        "code": -32603, "message": "Not a directory (os error 20)"}
    assert await c.error("fs/readDirectory", {"path": t.p("missing")}) == ENOENT


async def test_remove(t):
    (t.dir / "tree/sub").mkdir(parents=True)
    (t.dir / "tree/sub/x").write_text("x")
    (t.dir / "f.txt").write_text("x")
    os.symlink("f.txt", t.dir / "link")
    c = await t.session()
    # force defaults to true: a missing path is fine.
    assert await c.call("fs/remove", {"path": t.p("missing")}) == {}
    assert await c.error("fs/remove", {"path": t.p("missing"), "force": False}) == ENOENT
    assert await c.error("fs/remove", {"path": t.p("tree"), "recursive": False}) == {
        "code": -32603, "message": "Directory not empty (os error 39)"}
    # A symlink goes, not its target.
    assert await c.call("fs/remove", {"path": t.p("link")}) == {}
    assert not os.path.lexists(t.dir / "link") and (t.dir / "f.txt").exists()
    # recursive defaults to true.
    assert await c.call("fs/remove", {"path": t.p("tree")}) == {}
    assert not (t.dir / "tree").exists()
    assert await c.call("fs/remove", {"path": t.p("f.txt"), "recursive": False,
                                      "force": False}) == {}
    assert not (t.dir / "f.txt").exists()


async def test_copy(t):
    (t.dir / "src/sub").mkdir(parents=True)
    (t.dir / "src/sub/x").write_text("x")
    (t.dir / "src/f.txt").write_text("payload")
    os.symlink("f.txt", t.dir / "src/link")
    c = await t.session()
    assert await c.call("fs/copy", {"sourcePath": t.p("src/f.txt"),
                                    "destinationPath": t.p("g.txt"), "recursive": False}) == {}
    assert (t.dir / "g.txt").read_text() == "payload"
    assert await c.call("fs/copy", {"sourcePath": t.p("src"), "destinationPath": t.p("dst"),
                                    "recursive": True}) == {}
    copied = sorted(str(p.relative_to(t.dir / "dst")) for p in (t.dir / "dst").rglob("*"))
    assert copied == ["f.txt", "link", "sub", "sub/x"]
    # Symlinks are copied as links.
    assert os.readlink(t.dir / "dst/link") == "f.txt"
    assert await c.call("fs/copy", {"sourcePath": t.p("src/link"),
                                    "destinationPath": t.p("link2"), "recursive": False}) == {}
    assert os.readlink(t.dir / "link2") == "f.txt"


async def test_copy_errors(t):
    (t.dir / "src/sub").mkdir(parents=True)
    os.mkfifo(t.dir / "fifo")
    c = await t.session()

    async def copy_error(src, dst, recursive=True):
        return await c.error("fs/copy", {"sourcePath": t.p(src), "destinationPath": t.p(dst),
                                         "recursive": recursive})

    assert await copy_error("src", "dst", recursive=False) == {
        "code": -32600, "message": "fs/copy requires recursive: true when sourcePath is a directory"}
    assert await copy_error("src", "src/sub/inner") == {
        "code": -32600,
        "message": "fs/copy cannot copy a directory to itself or one of its descendants"}
    assert await copy_error("fifo", "fifo2", recursive=False) == {
        "code": -32600, "message": "fs/copy only supports regular files, directories, and symlinks"}
    assert await copy_error("missing", "m2", recursive=False) == ENOENT
    assert await c.error("fs/copy", {"sourcePath": t.p("src"), "destinationPath": t.p("d")}) == {
        "code": -32602, "message": "missing field `recursive`"}


async def test_path_forms(t):
    (t.dir / "f.txt").write_text("payload")
    (t.dir / "a").mkdir()
    c = await t.session()
    # Lexical normalisation of `..`.
    m = await c.call("fs/getMetadata", {"path": t.p("a/../f.txt")})
    assert m["isFile"] is True
    relative = t.pick(
        may={"code": -32602, "message": "AbsolutePathBuf deserialized without a base path"},
        nov={"code": -32602, "message": "invalid URI: relative URL without a base"})
    assert await c.error("fs/getMetadata", {"path": "relative/f.txt"}) == relative
    # The other revision's form, once this session has spoken its own.
    assert await c.error("fs/readFile", {"path": t.other_form(t.dir / "f.txt")}) == relative


async def test_sessions_keep_their_own_revision(t):
    (t.dir / "f.txt").write_text("payload")
    # Another session speaks the other revision first (refused by the
    # reference, served by a server that serves both).
    other = await t.session()
    await other.request("fs/getMetadata", {"path": t.other_form(t.dir / "f.txt")})
    c = await t.session()
    m = await c.call("fs/getMetadata", {"path": t.p("f.txt")})
    assert set(m) == metadata_keys(t)
    r = await c.call("process/start", t.start_params("p", ["true"]))
    assert set(r) == t.pick(may={"processId"}, nov={"processId", "sandboxType"})


@pytest.mark.reference_quirk(
    reason="the reference has no root; the gateway refuses paths outside the tenant root "
           "with -32004 naming the root")
async def test_path_outside_workspace(t):
    c = await t.session()
    await t.tell(c)
    params = {"path": t.wire("/etc/passwd")}
    if t.reference:
        m = await c.call("fs/getMetadata", params)
        assert m["isFile"] is True
    else:
        e = await c.error("fs/getMetadata", params)
        assert e["code"] == -32004
        assert "outside the tenant root" in e["message"], e
