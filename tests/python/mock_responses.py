"""A scripted stand-in for the OpenAI Responses API, for driving the real
Codex CLI in tests.

`MockResponses(script)` serves `POST .../responses` on 127.0.0.1 with a
streamed (SSE) answer. `script` is a list of steps; request N is answered by
step N, a callable that gets the parsed request body (and the server, for
the outputs of earlier tool calls) and returns one output item: a tool call
or an assistant message (see `function_call`, `custom_tool_call`,
`tool_search_call`, `assistant_message`). Past the end of the script every request gets a final
assistant message. Every request is recorded (`requests`: method, path,
headers, parsed body) so a test can assert what Codex sent.
"""

from __future__ import annotations

import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable

Step = Callable[[dict, "MockResponses"], dict]


def function_call(call_id: str, name: str, arguments: dict) -> dict:
    return {"type": "function_call", "call_id": call_id, "name": name,
            "arguments": json.dumps(arguments)}


def custom_tool_call(call_id: str, name: str, text: str) -> dict:
    return {"type": "custom_tool_call", "call_id": call_id, "name": name,
            "input": text}


def tool_search_call(call_id: str, query: str, limit: int | None = None) -> dict:
    """A call of Codex's client-side `tool_search` tool (a tool of type
    `tool_search`, not a function): Codex searches the tools it deferred
    (MCP servers' tools, in 0.169.0) and answers with a `tool_search_output`
    item listing the matches, which the model may call from then on."""
    arguments: dict[str, Any] = {"query": query}
    if limit is not None:
        arguments["limit"] = limit
    return {"type": "tool_search_call", "call_id": call_id, "execution": "client",
            "arguments": arguments}


def offered_namespaces(body: dict) -> dict[str, tuple[str, dict]]:
    """Every `namespace` tool a request makes callable: name -> (how, spec),
    `how` being "tools" (in the request's `tools`) or "tool_search" (loaded
    by a `tool_search_output` item in its input)."""
    out: dict[str, tuple[str, dict]] = {}
    for item in body.get("input") or []:
        if item.get("type") == "tool_search_output":
            for tool in item.get("tools") or []:
                if tool.get("type") == "namespace":
                    out[tool.get("name")] = ("tool_search", tool)
    for tool in body.get("tools") or []:
        if tool.get("type") == "namespace":
            out[tool.get("name")] = ("tools", tool)
    return out


def assistant_message(text: str, item_id: str = "msg-final") -> dict:
    return {"type": "message", "role": "assistant", "id": item_id,
            "content": [{"type": "output_text", "text": text}]}


def tool_names(body: dict) -> dict[str, str]:
    """The tools a request offers: name -> type (`function`, `custom`,
    `namespace`, ...). A tool without a name (`tool_search`, `web_search`)
    is listed under its type."""
    out = {}
    for tool in body.get("tools") or []:
        name = tool.get("name") or (tool.get("function") or {}).get("name") or tool.get("type")
        if name:
            out[name] = tool.get("type", "")
    return out


def output_text(item: dict) -> str:
    """The text of a `function_call_output`/`custom_tool_call_output` item."""
    out = item.get("output")
    if isinstance(out, str):
        return out
    if isinstance(out, dict):  # {"content": ..., "success": ...} in some revisions
        out = out.get("content", out)
        if isinstance(out, str):
            return out
    if isinstance(out, list):
        return "".join(p.get("text", "") for p in out if isinstance(p, dict))
    return json.dumps(out)


def call_outputs(body: dict) -> dict[str, str]:
    """call_id -> output text, for every tool output in a request's input."""
    outs = {}
    for item in body.get("input") or []:
        if item.get("type") in ("function_call_output", "custom_tool_call_output"):
            outs[item.get("call_id")] = output_text(item)
    return outs


def session_id_in(text: str) -> int | None:
    m = re.search(r"session ID (\d+)", text)
    return int(m.group(1)) if m else None


class MockResponses:
    def __init__(self, script: list[Step], final_text: str = "All done."):
        self.script = list(script)
        self.final_text = final_text
        self.requests: list[dict[str, Any]] = []
        self.errors: list[str] = []
        self._lock = threading.Lock()
        self._responses = 0
        mock = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):  # keep pytest output quiet
                pass

            def _record(self, body: Any) -> None:
                with mock._lock:
                    mock.requests.append({"method": self.command, "path": self.path,
                                          "headers": dict(self.headers), "body": body})

            def _reply(self, status: int, ctype: str, payload: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)
                self.wfile.flush()

            def do_GET(self):  # e.g. a model list: none here
                self._record(None)
                if self.path.split("?")[0].endswith("/models"):
                    self._reply(200, "application/json", b'{"object":"list","data":[],"models":[]}')
                else:
                    self._reply(404, "application/json", b'{"error":{"message":"not found"}}')

            def do_POST(self):
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length)
                try:
                    body = json.loads(raw)
                except ValueError:
                    body = {"_undecodable": raw[:200].decode("latin-1"),
                            "_encoding": self.headers.get("Content-Encoding")}
                self._record(body)
                if not self.path.split("?")[0].endswith("/responses"):
                    self._reply(404, "application/json", b'{"error":{"message":"not found"}}')
                    return
                self._reply(200, "text/event-stream", mock._answer(body).encode())

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self.base_url = f"http://127.0.0.1:{self.port}/v1"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    # -- scripting -------------------------------------------------------
    def _answer(self, body: dict) -> str:
        with self._lock:
            n = self._responses
            self._responses += 1
        step = self.script[n] if n < len(self.script) else None
        try:
            item = step(body, self) if step else assistant_message(self.final_text)
        except Exception as e:  # a broken expectation ends the turn, visibly
            self.errors.append(f"step {n}: {type(e).__name__}: {e}")
            item = assistant_message(f"mock script failed at step {n}: {e}")
        rid = f"resp-{n}"
        events = [
            {"type": "response.created", "response": {"id": rid}},
            {"type": "response.output_item.done", "item": item},
            {"type": "response.completed", "response": {
                "id": rid,
                "usage": {"input_tokens": 10, "input_tokens_details": None,
                          "output_tokens": 10, "output_tokens_details": None,
                          "total_tokens": 20}}},
        ]
        return "".join(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n" for e in events)

    def response_bodies(self) -> list[dict]:
        return [r["body"] for r in self.requests
                if r["method"] == "POST" and r["path"].split("?")[0].endswith("/responses")]

    def outputs(self) -> dict[str, str]:
        """call_id -> output text over every request so far."""
        outs: dict[str, str] = {}
        for body in self.response_bodies():
            outs.update(call_outputs(body))
        return outs

    def __enter__(self) -> "MockResponses":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()
