"""Comparing the two sides' answers to a step: the intended differences
(INTENDED, each a named predicate with its one-line reason, and `explain`,
which tells whether they account for a difference entirely), and the
signatures that group the other differences into classes (`signature`,
`classify`).
"""

import json
import os
import re
import urllib.parse
from dataclasses import dataclass
from typing import Any

from .side import Side
from .steps import (REVISIONS, NEWER_METHODS, GATEWAY_EXTENSIONS, NO_ID, P, dumps, _shown,
                    expect_of, Session, Request, Frame, WaitExit, Resume)

# -- intended differences ------------------------------------------------------------


def inside(path, root):
    path, root = str(path), str(root).rstrip("/")
    return path == root or path.startswith(root + "/")


def escape_reason(path, root, follow_final=True):
    """Why resolving `path` beneath `root` (as openat2 RESOLVE_BENEATH does,
    after lexical normalisation) leaves it: `lexical`, `absolute-symlink`,
    `symlink-out`, or None."""
    path = os.path.normpath(path)
    root = os.path.normpath(str(root))
    if not inside(path, root):
        return "lexical"
    rel = os.path.relpath(path, root)
    parts = [] if rel == "." else rel.split("/")
    cur, hops = root, 0
    while parts:
        part = parts.pop(0)
        nxt = os.path.join(cur, part)
        if (parts or follow_final) and os.path.islink(nxt):
            hops += 1
            if hops > 40:
                return None
            target = os.readlink(nxt)
            if target.startswith("/"):
                return "absolute-symlink"
            new = os.path.normpath(os.path.join(cur, target))
            if not inside(new, root):
                return "symlink-out"
            rel = os.path.relpath(new, root)
            parts = ([] if rel == "." else rel.split("/")) + parts
            cur = root
        else:
            cur = nxt
    return None


PATH_KEYS = ("path", "cwd", "sourcePath", "destinationPath", "present", "missing")


def path_params(step):
    """(key, P) for every path placeholder of a request's params."""
    params = step.params if isinstance(step, Request) else None
    found = []
    if isinstance(params, dict):
        for key in PATH_KEYS:
            v = params.get(key)
            for item in (v if isinstance(v, list) else [v]):
                if isinstance(item, P):
                    found.append((key, item))
    elif isinstance(params, list):
        found += [("positional", v) for v in params if isinstance(v, P)]
    return found


def error_of(answer):
    if isinstance(answer, dict) and isinstance(answer.get("error"), dict):
        return answer["error"]
    return None


def result_of(answer):
    if isinstance(answer, dict) and "result" in answer and "error" not in answer:
        return answer["result"]
    return None


OUTSIDE = re.compile(r"path `(.*)` is outside the tenant root")


def _escapes(ctx, host_path, key):
    """Whether the gateway may call `host_path` (param `key`) outside its root."""
    params = ctx.params if isinstance(ctx.params, dict) else {}
    follow = params.get("followSymlinks") is not False and not (
        ctx.method == "fs/remove" or (ctx.method == "fs/copy" and key == "sourcePath"))
    return escape_reason(host_path, ctx.gw_side.root, follow)


def _confined(ctx):
    ref, gw = ctx.ref, ctx.gw
    gw_err = error_of(gw)
    m = OUTSIDE.fullmatch(str(gw_err.get("message"))) if gw_err and gw_err.get("code") == -32004 else None
    if m:
        ref_err = error_of(ref)
        if ref_err and ref_err.get("code") == -32602:
            return None  # the reference refused the params first: a precedence difference
        named = ctx.gw_side.denorm(m.group(1))
        keys = [k for k, p in path_params(ctx.step)
                if isinstance(p, P) and p.base != "none" and p.host_path(ctx.gw_side).rstrip("/")
                == named.rstrip("/")] or ["path"]
        if any(_escapes(ctx, named, k) for k in keys):
            return "<confined>", "<confined>"
        return None
    # Listings: the gateway skips entries whose resolution leaves the root.
    ref_res, gw_res = result_of(ref), result_of(gw)
    if ctx.method not in ("fs/readDirectory", "fs/walk") or not (
            isinstance(ref_res, dict) and isinstance(gw_res, dict)
            and isinstance(ref_res.get("entries"), list) and isinstance(gw_res.get("entries"), list)):
        return None
    (_, p), = path_params(ctx.step)[:1] or [(None, None)]
    if not isinstance(p, P) or p.base == "none":
        return None
    listed = os.path.realpath(p.host_path(ctx.gw_side))
    kept = []
    for e in ref_res["entries"]:
        if e in gw_res["entries"] or not isinstance(e, dict):
            kept.append(e)
            continue
        if ctx.method == "fs/readDirectory":
            host = os.path.join(listed, str(e.get("fileName")))
        else:
            host = ctx.gw_side.denorm(urllib.parse.unquote(str(e.get("path", ""))[len("file://"):])
                                      if str(e.get("path", "")).startswith("file://")
                                      else str(e.get("path", "")))
        if not (os.path.islink(host) and escape_reason(host, ctx.gw_side.root)):
            kept.append(e)
    return dict(ref, result=dict(ref_res, entries=kept)), gw


def frame_kind(step, revision):
    """What a Frame carries, as the reference decodes it."""
    obj = parse_frame(step)
    if obj is _JUNK:
        return "junk"
    if not isinstance(obj, dict):
        return "not-an-object"
    if "method" not in obj:
        return "response" if ("result" in obj or "error" in obj) else "other"
    if "id" not in obj:
        return "initialized" if obj.get("method") == "initialized" else "notification"
    rid = obj["id"]
    if expect_of(rid) is NO_ID:
        return "bad-id"
    return "request"


_JUNK = object()


def parse_frame(step):
    """A Frame's JSON value (`-0` read as a float, as serde_json does), or _JUNK."""
    text = step.frame if isinstance(step.frame, str) else dumps(_shown(step.frame))
    try:
        return json.loads(text, parse_int=lambda t: -0.0 if t == "-0" else int(t))
    except ValueError:
        return _JUNK


def _unexpected(ctx):
    if not isinstance(ctx.step, Frame):
        return None
    ref, gw = ctx.ref, ctx.gw
    if ref.get("closed") != "no close frame" or ref.get("unsolicited"):
        return None
    if gw.get("closed") or gw.get("timeout"):
        return None
    for u in gw.get("unsolicited", []):
        if not (u.get("id") == -1 and (u.get("error") or {}).get("code") == -32600):
            return None
    kind = frame_kind(ctx.step, ctx.revision)
    if kind in ("notification", "initialized", "response") or (
            kind == "bad-id" and ctx.revision == "may"):
        return "<unexpected>", "<unexpected>"
    return None


def _responses(ctx):
    """The responses to compare: a Frame's are under "answer"."""
    if isinstance(ctx.step, Frame):
        return (ctx.ref.get("answer") if isinstance(ctx.ref, dict) else None,
                ctx.gw.get("answer") if isinstance(ctx.gw, dict) else None)
    return ctx.ref, ctx.gw


def _rewrap(ctx, ref_resp, gw_resp):
    if isinstance(ctx.step, Frame):
        return dict(ctx.ref, answer=ref_resp), dict(ctx.gw, answer=gw_resp)
    return ref_resp, gw_resp


def _request(step):
    """(method, params) a step sends, or (None, None)."""
    if isinstance(step, Request):
        return step.method, step.params
    if isinstance(step, (Session, Resume)):
        return "initialize", getattr(step, "params", None)
    if isinstance(step, Frame):
        obj = parse_frame(step)
        if isinstance(obj, dict) and isinstance(obj.get("method"), str) and "id" in obj:
            return obj["method"], obj.get("params", ...)
    return None, None


def _whole(ctx, mark):
    """Explains the whole response (a Frame's probe and the rest must still match)."""
    return _rewrap(ctx, mark, mark)


def _http(ctx):
    ref, gw = _responses(ctx)
    if ctx.method == "http/request" and error_of(gw) == {
            "code": -32003, "message": "http/request is disabled on this gateway"}:
        return _whole(ctx, "<http>")
    return None


def _extensions(ctx):
    ref, gw = _responses(ctx)
    if ctx.method in GATEWAY_EXTENSIONS and (error_of(ref) or {}).get("code") == -32601:
        return _whole(ctx, "<extension>")
    return None


def _may_environment_info(ctx):
    ref, gw = _responses(ctx)
    ref_res, gw_res = result_of(ref), result_of(gw)
    if (ctx.method == "initialize" and isinstance(ref_res, dict) and isinstance(gw_res, dict)
            and "environmentInfo" not in ref_res and "environmentInfo" in gw_res):
        gw_res = {k: v for k, v in gw_res.items() if k != "environmentInfo"}
        return _rewrap(ctx, ref, dict(gw, result=gw_res))
    return None


def _may_newer_methods(ctx):
    ref, gw = _responses(ctx)
    if ctx.method in NEWER_METHODS and error_of(ref) == {
            "code": -32601, "message": f"exec-server stub does not implement `{ctx.method}` yet"}:
        return _whole(ctx, "<newer method>")
    return None


IDENTITY_KEYS = ("executorVersion", "providerId", "prependPathDirs", "capabilities")


def _mask_identity(answer):
    res = result_of(answer)
    if not isinstance(res, dict):
        return answer
    info = res.get("environmentInfo") if "environmentInfo" in res else (
        res if "executorVersion" in res else None)
    if not isinstance(info, dict):
        return answer
    info = {k: ("<masked>" if k in IDENTITY_KEYS else v) for k, v in info.items()}
    res = dict(res, environmentInfo=info) if "environmentInfo" in res else info
    return dict(answer, result=res)


def _environment_identity(ctx):
    if ctx.method in ("initialize", "environment/info"):
        ref, gw = _responses(ctx)
        return _rewrap(ctx, _mask_identity(ref), _mask_identity(gw))
    return None


def _codex_home(ctx):
    if ctx.method != "environmentConfig/read":
        return None
    ref, gw = _responses(ctx)
    ref_res, gw_res = result_of(ref), result_of(gw)
    if isinstance(ref_res, dict) and isinstance(gw_res, dict):
        return _rewrap(ctx, dict(ref, result=dict(ref_res, codexHomeDir="<masked>")),
                       dict(gw, result=dict(gw_res, codexHomeDir="<masked>")))
    return None


def _signal_variants(ctx):
    ref, gw = _responses(ctx)
    if (ctx.method == "process/signal" and isinstance(ctx.params, dict)
            and isinstance(ctx.params.get("signal"), str) and ctx.params["signal"] != "interrupt"
            and str((error_of(ref) or {}).get("message", "")).startswith("unknown variant")):
        return _whole(ctx, "<signal>")
    return None


def _sandbox(ctx):
    if not (isinstance(ctx.params, dict) and ctx.params.get("sandbox") is not None):
        return None
    ref, gw = _responses(ctx)
    if (error_of(ref) or {}).get("code") == -32602 and error_of(gw) is None:
        return _whole(ctx, "<sandbox>")
    ref_res, gw_res = result_of(ref), result_of(gw)
    if isinstance(ref_res, dict) and isinstance(gw_res, dict):
        return _rewrap(ctx, dict(ref, result=dict(ref_res, sandboxType="<masked>")),
                       dict(gw, result=dict(gw_res, sandboxType="<masked>")))
    return None


@dataclass
class Intended:
    name: str
    reason: str
    revisions: tuple
    explain: Any        # ctx -> None | (reference', gateway') with the explained part masked
    diverges: Any       # True / False, or None: whether the step changes state (`mutating`)


# The intended differences: short on purpose. Anything they do not explain
# is reported as unintended.
INTENDED = [
    Intended("confined_resolution",
             "the gateway resolves paths beneath the tenant root (RESOLVE_BENEATH): a path outside "
             "it, or through a symlink leading out or with an absolute target (even back inside), "
             "is -32004 `path P is outside the tenant root`, and fs/readDirectory skips such "
             "entries; the reference has no root (reference_quirk: test_path_outside_workspace, "
             "test_cwd_outside_workspace, test_absolute_symlink_inside_workspace)",
             REVISIONS, _confined, None),
    Intended("unexpected_message_kept",
             "the reference drops the connection (no close frame) on an unknown notification, "
             "`initialized` before `initialize`, a client response, or (0.130.0) a request id that "
             "is not an i64 or a string; the gateway answers -32600 on id -1 (ignores a response) "
             "and keeps it (reference_quirk: test_unexpected_messages, test_null_id)",
             REVISIONS, _unexpected, True),
    Intended("http_request_disabled",
             "executor-side HTTP is disabled on the gateway: -32003 whatever the params "
             "(reference_quirk: test_http_request)",
             REVISIONS, _http, False),
    Intended("gateway_extensions",
             "methods the gateway adds (process/closeStdin, process/list, process/resize, "
             "session/close, command/exec*) are -32601 on the reference "
             "(reference_quirk: test_gateway_process_extensions; docs/protocol.md, Extensions)",
             REVISIONS, _extensions, True),
    Intended("may_initialize_superset",
             "the gateway cannot tell the revision at initialize, so it answers 0.169's superset "
             "(environmentInfo too) (reference_quirk: test_initialize_result)",
             ("may",), _may_environment_info, False),
    Intended("may_newer_methods",
             "0.169.0's methods (process/signal, fs/canonicalize, ...) are -32601 on 0.130.0; the "
             "gateway serves them in a May session too (reference_quirk: test_newer_methods, "
             "test_process_signal)",
             ("may",), _may_newer_methods, True),
    Intended("environment_identity",
             "environmentInfo's executorVersion, providerId, prependPathDirs and capabilities "
             "describe each server (reference_quirk: test_initialize_environment_info)",
             ("nov",), _environment_identity, False),
    Intended("codex_home",
             "codexHomeDir is the reference's CODEX_HOME; the gateway names HOME/.codex "
             "(reference_quirk: test_environment_config_read)",
             ("nov",), _codex_home, False),
    Intended("signal_variants",
             "0.169.0 knows only `interrupt`; the gateway's process/signal also takes terminate, "
             "kill, hangup, quit, user1, user2 (reference_quirk: test_signal_variants)",
             ("nov",), _signal_variants, True),
    Intended("sandbox_ignored",
             "the gateway accepts and ignores `sandbox` (sandboxType none; no decoding); the "
             "reference applies it (reference_quirk: test_start_with_sandbox, "
             "test_start_sandbox_without_permissions)",
             REVISIONS, _sandbox, True),
]
# Not generated, so not listed: output chunk sizes (outputs here are a few
# bytes), notification arrival order (normalised: compared sorted), 0.130.0's
# repeated writeId (each writeId is used once in May sequences).


@dataclass
class Ctx:
    step: Any
    revision: str
    ref: Any
    gw: Any
    gw_side: Side
    method: Any = None
    params: Any = None

    def __post_init__(self):
        self.method, self.params = _request(self.step)


def explain(step, revision, ref, gw, gw_side):
    """The intended differences that together explain ref != gw, or None."""
    names = []
    for item in INTENDED:
        if revision not in item.revisions:
            continue
        try:
            masked = item.explain(Ctx(step, revision, ref, gw, gw_side))
        except (AttributeError, TypeError, ValueError, KeyError):
            masked = None
        if masked is None:
            continue
        if list(masked) != [ref, gw]:
            names.append(item)
            ref, gw = masked
        if ref == gw:
            return names
    return None


# -- comparing and classifying -------------------------------------------------------

def step_label(step, revision):
    if isinstance(step, Request):
        return step.method
    if isinstance(step, Session):
        return "initialize (new session)"
    if isinstance(step, Resume):
        return "initialize (resume a detached session)"
    if isinstance(step, Frame):
        return "frame: " + frame_kind(step, revision)
    if isinstance(step, WaitExit):
        return "process/read until closed"
    return type(step).__name__.lower()


def template(text):
    """A message with its particulars blanked, for grouping."""
    text = re.sub(r"invalid (type|value): [^,]*,", r"invalid \1: _,", str(text))
    text = re.sub(r"`[^`]*`", "`_`", text)
    text = re.sub(r"'[^']*'", "'_'", text)
    text = re.sub(r"\{SID:\w+\}", "{SID}", text)
    return re.sub(r"\d+", "N", text)


def outcome(answer):
    if not isinstance(answer, dict):
        return repr(answer)
    if "error" in answer and isinstance(answer["error"], dict):
        return f"error {answer['error'].get('code')}: {template(answer['error'].get('message'))}"
    if "result" in answer:
        return "result"
    if any(k in answer for k in ("answer", "probe", "unsolicited")) or isinstance(
            answer.get("closed"), str):  # a Frame
        parts = []
        if "answer" in answer:
            parts.append("answer " + outcome(answer["answer"]))
        for u in answer.get("unsolicited") or []:
            parts.append(("on id -1 " if isinstance(u, dict) and u.get("id") == -1 else "unsolicited ")
                         + outcome(u))
        if "closed" in answer:
            parts.append("connection dropped (" + str(answer["closed"]) + ")")
        if "probe" in answer:
            parts.append("then probe " + outcome(answer["probe"]))
        return "; ".join(parts)
    return "+".join(sorted(answer))


def diff_keys(a, b, prefix="", depth=0):
    if a == b:
        return []
    if isinstance(a, dict) and isinstance(b, dict) and depth < 3:
        keys = []
        for k in list(a) + [k for k in b if k not in a]:
            keys += diff_keys(a.get(k, "<absent>"), b.get(k, "<absent>"), f"{prefix}.{k}", depth + 1)
        return keys
    return [prefix or "."]


def signature(revision, step, ref, gw):
    """What groups differences into classes: two error answers group by their
    (templated) texts whatever the method; anything else by step kind and
    outcome (and, when those match, by where the answers differ)."""
    a, b = outcome(ref), outcome(gw)
    if a.startswith("error") and b.startswith("error"):
        return (revision, "error vs error", a, b, ())
    keys = tuple(diff_keys(ref, gw)) if a == b else ()
    return (revision, step_label(step, revision), a, b, keys)


def classify(diffs):
    classes = {}
    for d in diffs:
        key = json.dumps(d["signature"])
        c = classes.setdefault(key, {"signature": d["signature"], "count": 0, "first": d,
                                     "where": []})
        c["count"] += 1
        c["where"].append([d["sequence"], d["step"]])
    return sorted(classes.values(), key=lambda c: (c["first"]["sequence"], c["first"]["step"]))
