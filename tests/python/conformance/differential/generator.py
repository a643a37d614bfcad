"""The sequence generator: `generate(seed, revision, index)` builds sequence
`index` from its own random.Random("seed:revision:index") alone (Gen). Here:
Gen's core (random helpers, sessions, the disk layout, path choices, fs
requests and file handles) and the fs, symlink and nov sequence kinds; the
process, envelope and resume kinds are in generator_process.
"""

import random

from .generator_process import ProcessSequences
from .steps import P, b64, Disk, Session, Request, AwaitNotification, Snapshot, Sequence


class Gen(ProcessSequences):
    """Builds one sequence from its own random.Random."""

    KINDS = (("fs", 30), ("symlink", 16), ("process", 26), ("envelope", 14),
             ("resume", 9), ("nov", 5))

    def __init__(self, seed, revision, index):
        self.rng = random.Random(f"{seed}:{revision}:{index}")
        self.index = index
        self.rev = revision
        self.nov = revision == "nov"
        self.steps = []
        self.entries = []      # (rel, tags) known under DIR
        self.out_entries = []  # (rel, tags) known under OUT
        self.pids = {}         # pid -> "short" | "long" | "stdin" | "done"
        self.pid_counter = 0
        self.write_ids = 0
        self.conn_counter = 0

    # helpers
    def chance(self, p):
        return self.rng.random() < p

    def pick(self, items):
        return items[self.rng.randrange(len(items))]

    def weighted(self, pairs):
        total = sum(w for _, w in pairs)
        x = self.rng.uniform(0, total)
        for item, w in pairs:
            x -= w
            if x <= 0:
                return item
        return pairs[-1][0]

    def add(self, step):
        self.steps.append(step)
        return step

    def new_pid(self, prefix="p"):
        self.pid_counter += 1
        return f"{prefix}{self.pid_counter}"

    def write_id(self):
        self.write_ids += 1
        return f"w{self.write_ids}"

    def generate(self):
        kinds = list(self.KINDS)
        if not self.nov:
            kinds = [(k, w if k != "nov" else 3) for k, w in kinds]
        kind = self.weighted(kinds)
        getattr(self, "gen_" + kind)()
        return Sequence(self.index, kind, self.steps)

    # -- sessions
    def session(self, conn="c1", tell=None):
        self.add(Session(conn))
        if tell is None:
            tell = self.chance(0.75)
        if tell:
            self.add(Request(conn, "fs/getMetadata", {"path": P("")}))

    # -- disk layout
    def setup_tree(self, symlinks):
        r = self.chance
        self.add(Disk("write", "f.txt", b"payload"))
        self.entries.append(("f.txt", {"file"}))
        if r(0.5):
            self.add(Disk("write", "empty", b""))
            self.entries.append(("empty", {"file"}))
        if r(0.7):
            self.add(Disk("mkdir", "d"))
            self.add(Disk("write", "d/x", b"x"))
            self.entries += [("d", {"dir"}), ("d/x", {"file"})]
            if r(0.5):
                self.add(Disk("mkdir", "d/sub"))
                self.add(Disk("write", "d/sub/y", b"why"))
                self.entries += [("d/sub", {"dir"}), ("d/sub/y", {"file"})]
        if r(0.25):
            self.add(Disk("mkdir", ".hidden"))
            self.add(Disk("write", ".hidden/h", b"h"))
            self.entries += [(".hidden", {"dir"}), (".hidden/h", {"file"})]
        if r(0.25):
            self.add(Disk("mkdir", "with space"))
            self.add(Disk("write", "with space/g", b"spaced"))
            self.entries += [("with space", {"dir"}), ("with space/g", {"file"})]
        if r(0.15):
            self.add(Disk("write", "unicod\u00e9.txt", "\u00e9t\u00e9".encode()))
            self.entries.append(("unicod\u00e9.txt", {"file"}))
        if r(0.15):
            self.add(Disk("fifo", "fifo"))
            self.entries.append(("fifo", {"fifo"}))
        if r(0.6):
            self.add(Disk("write", "o.txt", b"outside", base="out"))
            self.out_entries.append(("o.txt", {"file"}))
        if r(0.3):
            self.add(Disk("mkdir", "od", base="out"))
            self.add(Disk("write", "od/z", b"z", base="out"))
            self.out_entries += [("od", {"dir"}), ("od/z", {"file"})]
        if not symlinks:
            return
        links = [
            ("l_rel", "f.txt", {"link", "file"}),
            ("l_dir", "d", {"link", "dir"}),
            ("l_abs", P("f.txt"), {"link", "file", "abs"}),
            ("l_absdir", P("d"), {"link", "dir", "abs"}),
            ("l_out_abs", P("o.txt", base="out"), {"link", "file", "outside"}),
            ("l_out_rel", "../../outside/{name}/o.txt", {"link", "file", "outside"}),
            ("l_root", "..", {"link", "dir", "nolist", "nomut"}),
            ("l_up2", "../..", {"link", "dir", "nolist", "nomut", "outside"}),
            ("l_dangling", "missing", {"link", "missing"}),
            ("l_dangling_abs", P("missing"), {"link", "missing", "abs"}),
            ("l_loop1", "l_loop2", {"link", "loop"}),
            ("l_loop2", "l_loop1", {"link", "loop"}),
            ("l_self", "l_self", {"link", "loop"}),
            ("l_chain1", "l_chain2", {"link", "file"}),
            ("l_chain2", "l_rel", {"link", "file"}),
            ("l_chain_abs", "l_abs", {"link", "file", "abs"}),
            ("l_etc", P("/etc/hostname", base="abs"), {"link", "file", "outside", "nomut"}),
            ("l_dotdot_in", "d/../f.txt", {"link", "file"}),
            ("l_back_in", "../{name}/f.txt", {"link", "file"}),
            ("l_fifo", "fifo", {"link", "fifo"}),
        ]
        for name, target, tags in links:
            if r(0.45):
                self.add(Disk("symlink", name, target))
                self.entries.append((name, tags))
        if r(0.3) and any(e[0] == "d" for e in self.entries):
            self.add(Disk("symlink", "d/l_up", "../f.txt"))
            self.entries.append(("d/l_up", {"link", "file"}))
        if r(0.2) and any(e[0] == "d" for e in self.entries):
            self.add(Disk("symlink", "d/l_up_abs", P("f.txt")))
            self.entries.append(("d/l_up_abs", {"link", "file", "abs"}))

    # -- paths
    def path_candidates(self, purpose):
        """(P args, tags) for a purpose: read, list, mutate, create, copy_src."""
        c = [(("",), {"dir", "self"})]
        for rel, tags in self.entries:
            c.append(((rel,), set(tags)))
        for rel, tags in self.out_entries:
            c.append(((rel, "out"), tags | {"outside"}))
        c += [
            (("missing",), {"missing"}),
            (("missing/deeper",), {"missing"}),
            (("d/missing",), {"missing"}),
            (("new.txt",), {"missing", "new"}),
            (("newdir",), {"missing", "new"}),
            (("d/../f.txt",), {"file"}),
            (("./f.txt",), {"file"}),
            (("d//x",), {"file"}),
            (("../{name}/f.txt",), {"file"}),
            (("../../outside/{name}/o.txt",), {"file", "outside"}),
            (("../../outside/{name}/new.txt",), {"missing", "outside"}),
            (("../../../../../../../../etc/hostname",), {"file", "outside", "nomut"}),
            (("missing", "out"), {"missing", "outside"}),
            (("", "out"), {"dir", "outside"}),
            (("/etc/hostname", "abs"), {"file", "outside", "nomut"}),
            (("/", "abs"), {"dir", "outside", "nomut", "nolist"}),
            (("/tmp", "abs"), {"dir", "outside", "nomut", "nolist"}),
            (("", "root"), {"dir", "nomut", "nolist"}),
            (("..",), {"dir", "nomut", "nolist"}),
        ]
        out = []
        for args, tags in c:
            if purpose in ("mutate", "create", "copy_src") and "nomut" in tags:
                continue
            if purpose in ("list",) and ("nolist" in tags):
                continue
            if purpose in ("read", "mutate", "create", "copy_src") and "fifo" in tags:
                # Opening a FIFO blocks the reference (docs: a FIFO hangs 0.130.0)
                continue
            out.append((args, tags))
        return out

    def any_form(self, rel, base="dir", relative=True):
        """P(rel) for a path parameter that has no purpose-made choice (watch
        paths, cwds, discovery roots): mostly the revision's own form, else
        an absolute plain path, a file:// URI or a variant of one, or (when
        `relative`, nothing is written there) a relative path."""
        x = self.rng.random()
        if relative and x < 0.06:
            return P(self.pick([rel or ".", "./" + rel, "file:" + rel]), base="none")
        if x < 0.36:
            return P(rel, base=base, form=self.pick(["plain", "plain", "uri", "localhost",
                                                     "opaque", "upper"]))
        return P(rel, base=base)

    def path(self, purpose="read", prefer=None):
        """A path value for a request: mostly a P in the revision's form."""
        x = self.rng.random()
        if x < 0.03:
            return self.pick([5, None, ["a"], {}, True])
        if x < 0.10:
            # Not absolute: relative, empty, home-relative. Only where nothing
            # is written: 0.169.0 reads `file:f.txt` as /f.txt on the host.
            if purpose in ("mutate", "create", "copy_src"):
                return P(self.pick(["f.txt", "", "./f.txt", "d/x"]), base="none")
            return P(self.pick(["f.txt", "", "./f.txt", "~/f.txt", "file:f.txt", "d/x"]),
                     base="none")
        cands = self.path_candidates(purpose)
        if prefer:
            preferred = [cd for cd in cands if prefer & cd[1]]
            if preferred and self.chance(0.7):
                cands = preferred
        args, tags = self.pick(cands)
        rel = args[0]
        base = args[1] if len(args) > 1 else "dir"
        slash = self.chance(0.06)
        form = "own"
        y = self.rng.random()
        if y < 0.12:
            form = self.pick(["plain", "uri", "localhost", "upper", "opaque", "pct", "host", "http"]
                             if self.nov else ["uri", "uri", "localhost", "opaque"])
        return P(rel, base=base, form=form, slash=slash)

    def sandbox(self):
        if self.nov and self.chance(0.15):
            return {"sandbox": None}
        return {}

    # -- fs requests
    def fs_request(self, conn):
        r = self.rng
        methods = [("fs/readFile", 14), ("fs/writeFile", 12), ("fs/createDirectory", 9),
                   ("fs/getMetadata", 16), ("fs/readDirectory", 10), ("fs/remove", 9),
                   ("fs/copy", 10)]
        if self.nov:
            methods += [("fs/canonicalize", 8), ("fs/walk", 5), ("fs/open", 4)]
        method = self.weighted(methods)
        params = None
        if method == "fs/readFile":
            params = {"path": self.path("read", {"file", "link"})}
        elif method == "fs/getMetadata":
            params = {"path": self.path("read", {"link", "file", "dir"})}
            if self.chance(0.15):
                params["followSymlinks"] = self.pick([False, True])
        elif method == "fs/readDirectory":
            params = {"path": self.path("list", {"dir"})}
        elif method == "fs/canonicalize":
            params = {"path": self.path("read", {"link", "file", "dir"})}
        elif method == "fs/writeFile":
            path = self.path("mutate", {"new", "file", "link"})
            data = self.pick(["", "hello", "line\n", "\u00e9"])
            params = {"path": path, "dataBase64": b64(data)}
            if self.chance(0.1):
                params["dataBase64"] = self.pick(["!!notb64", "aGk", 5, None])
            if isinstance(path, P) and path.base == "dir" and path.rel:
                self.entries.append((path.rel, {"file"}))
        elif method == "fs/createDirectory":
            path = self.path("create", {"new", "missing", "dir"})
            params = {"path": path}
            if self.chance(0.5):
                params["recursive"] = self.pick([True, False, False, "yes"])
            if isinstance(path, P) and path.base == "dir" and path.rel:
                self.entries.append((path.rel, {"dir"}))
        elif method == "fs/remove":
            params = {"path": self.path("mutate", {"file", "dir", "link", "missing"})}
            for k in ("recursive", "force"):
                if self.chance(0.4):
                    params[k] = self.pick([True, False])
        elif method == "fs/copy":
            src = self.path("copy_src", {"file", "dir", "link"})
            dst = self.path("create", {"new", "missing"})
            params = {"sourcePath": src, "destinationPath": dst,
                      "recursive": self.pick([True, False])}
            if self.chance(0.08):
                del params["recursive"]
            if isinstance(dst, P) and dst.base == "dir" and dst.rel:
                self.entries.append((dst.rel, {"file"}))
        elif method == "fs/walk":
            options = {"maxDepth": self.pick([0, 1, 10]), "maxDirectories": self.pick([1, 100]),
                       "maxEntries": self.pick([1, 3, 100]),
                       "followDirectorySymlinks": self.pick([False, True]),
                       "pruneHiddenDirectories": self.pick([True, False])}
            params = {"path": self.path("list", {"dir"}), "options": options}
            if self.chance(0.1):
                del options[self.pick(sorted(options))]
        elif method == "fs/open":
            self.file_handles(conn)
            return
        params.update(self.sandbox())
        self.mutate_params(params)
        self.add(Request(conn, method, params))

    def file_handles(self, conn):
        hid = self.pick(["h1", "h2"])
        mode = self.pick([None, "read", "replace", "append"])
        purpose = "create" if mode == "replace" else "read"
        params = {"handleId": hid, "path": self.path(purpose, {"file", "new"})}
        if mode:
            params["mode"] = mode
        self.add(Request(conn, "fs/open", params))
        for _ in range(self.rng.randint(1, 3)):
            op = self.pick(["read", "read", "write", "close", "reopen"])
            if op == "read":
                self.add(Request(conn, "fs/readBlock", {
                    "handleId": hid, "offset": self.pick([0, 3, 100]),
                    "len": self.pick([1, 3, 100, 0])}))
            elif op == "write":
                self.add(Request(conn, "fs/writeBlock", {
                    "handleId": hid, "offset": self.pick([0, 4]), "chunk": b64("zz")}))
            elif op == "close":
                self.add(Request(conn, "fs/close", {"handleId": hid}))
            else:
                self.add(Request(conn, "fs/open", dict(params)))

    def mutate_params(self, params):
        """Now and then: a field missing, a wrong type, an unknown field."""
        x = self.rng.random()
        if x < 0.05 and params:
            del params[self.pick(sorted(params))]
        elif x < 0.08:
            params["unknownField"] = 1
        elif x < 0.10 and params:
            params[self.pick(sorted(params))] = self.pick([5, "text", [], {}, None])

    # -- sequence kinds
    def gen_fs(self):
        self.setup_tree(symlinks=self.chance(0.3))
        self.session()
        for _ in range(self.rng.randint(3, 9)):
            self.fs_request("c1")
        if self.chance(0.6):
            self.add(Snapshot())

    def gen_symlink(self):
        self.setup_tree(symlinks=True)
        self.session()
        for _ in range(self.rng.randint(3, 9)):
            if self.chance(0.6):
                method = self.weighted([("fs/getMetadata", 5), ("fs/readFile", 4),
                                        ("fs/readDirectory", 2), ("fs/canonicalize", 3 if self.nov else 0),
                                        ("fs/remove", 1), ("fs/writeFile", 1), ("fs/copy", 1)])
                params = {}
                if method == "fs/readDirectory":
                    params["path"] = self.pick([P(""), P("d"), P("l_dir"), P("l_absdir"),
                                                P("od", base="out")])
                elif method == "fs/copy":
                    params = {"sourcePath": self.path("copy_src", {"link"}),
                              "destinationPath": P(self.pick(["cp1", "cp2"])),
                              "recursive": self.pick([True, False])}
                elif method == "fs/writeFile":
                    params = {"path": self.path("mutate", {"link"}), "dataBase64": b64("new")}
                elif method == "fs/remove":
                    params = {"path": self.path("mutate", {"link"})}
                else:
                    params["path"] = self.path("read", {"link"})
                    if self.chance(0.2) and method != "fs/canonicalize":
                        params["followSymlinks"] = False
                self.add(Request("c1", method, params))
            else:
                self.fs_request("c1")
        if self.chance(0.3):
            self.process_with_cwd("c1", cwd=self.path("read", {"link", "dir"}))
        if self.chance(0.5):
            self.add(Snapshot())

    def gen_nov(self):
        """0.169.0's newer methods: watches, walks, handles, environment."""
        self.setup_tree(symlinks=self.chance(0.3))
        self.session(tell=self.chance(0.6))
        for _ in range(self.rng.randint(1, 4)):
            op = self.pick(["watch", "walk", "handles", "env", "env", "caps"])
            if op == "watch":
                self.watch("c1")
            elif op == "walk":
                options = {"maxDepth": self.pick([0, 1, 10]), "maxDirectories": self.pick([1, 100]),
                           "maxEntries": self.pick([1, 3, 100]),
                           "followDirectorySymlinks": self.pick([False, True]),
                           "pruneHiddenDirectories": self.pick([True, False])}
                self.add(Request("c1", "fs/walk", {"path": self.path("list", {"dir"}),
                                                   "options": options}))
            elif op == "handles":
                self.file_handles("c1")
            elif op == "env":
                method = self.pick(["environment/info", "environment/status"])
                self.add(Request("c1", method, self.pick([None, {}, ...])))
            else:
                cwd = self.any_form(self.pick(["", "", "missing"]))
                method, params = self.pick([
                    ("environmentConfig/read", {"cwd": cwd, "configPaths": [["mcp_servers"]],
                                                "requirementsPaths": [["mcp_servers"]]}),
                    ("environmentConfig/read", {"cwd": cwd, "configPaths": [],
                                                "requirementsPaths": []}),
                    ("capabilities/discoverV2", {"cwd": cwd}),
                    ("capabilityRoots/discoverV1", {"roots": []}),
                    ("capabilityRoots/discoverV1", {"roots": [{"id": "r1", "path": cwd}]})])
                self.add(Request("c1", method, params))

    def watch(self, conn):
        missing = [self.any_form(*self.pick([("m1",), ("m2",), ("f.txt",), ("missing", "out"),
                                             ("o.txt", "out"), ("d/m3",)]))
                   for _ in range(self.rng.randint(0, 2))]
        present = self.pick([None, None, "f.txt", "absent"])
        present = present and self.any_form(present)
        wid = self.pick([1, 5, 0])
        params = {"watchId": wid, "missing": missing, "present": present}
        self.mutate_params(params)
        self.add(Request(conn, "fs/watchMissing", params))
        if self.chance(0.6):
            # Make a missing path appear (or the present one go), then wait.
            what = self.pick(["m1", "f.txt"])
            if what == "m1":
                self.add(Request(conn, "fs/writeFile", {"path": P("m1"), "dataBase64": ""}))
            else:
                self.add(Request(conn, "fs/remove", {"path": P("f.txt")}))
            self.add(AwaitNotification(conn, "fs/missingChanged"))


def generate(seed, revision, index):
    return Gen(seed, revision, index).generate()
