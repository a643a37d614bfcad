# The servers of tests/http_request.rs, run in the egress world's "outside"
# namespace (tests/egress_world/netns.sh): `servers.py PKI [ADDR:PORT ...]`
# (PKI: tests/egress_world/pki.sh's directory; "-": only the extra
# servers, wherever they run). Each server answers:
#   /echo...          200 {"server", "method", "path", "headers" (as received,
#                     in order), "body"} as JSON, with X-Multi: a, X-Multi: b
#   /redirect         302 to /echo?from=redirect, body "moved"
#   /to?u=URL&c=CODE  CODE (302) to URL
#   /loop             302 to itself
#   /chain?n=N        302 to /chain?n=N-1; n=0 is /echo
#   /stream?n=N&hold=K  chunked: "chunk0;" ... "chunk{N-1};", one chunk each
#                     0.2 s; with K, the rest only once /release?k=K came
#                     (or after 60 s)
#   /release?k=K      200 "released"
#   /slow?s=S         headers after S seconds
#   /nonutf8          X-Good: fine, X-Bin: \xff\xfe, body "ok"
#   /status/N         status N, body "st" (none for 204 and 304)
# HEAD is answered as GET without the body. Servers (LABEL is "server" in
# /echo): HTTP on port 80 and HTTPS (443, the address's pki certificate) at
# 93.184.215.10 (allowed.test), .11 (other.test), .12 (a.cdn.test); HTTP at
# 10.77.0.1:8080 (private); HTTP at each extra ADDR:PORT (label "extra").
# Prints "ready" once every socket listens.
import http.server, json, ssl, sys, threading, time
from urllib.parse import parse_qs, urlsplit


class Server(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, addr, port, label, cert=None):
        self.label = label
        super().__init__((addr, port), Handler)
        if cert is not None:
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            ctx.load_cert_chain(cert + ".pem", cert + ".key")
            self.socket = ctx.wrap_socket(
                self.socket, server_side=True, do_handshake_on_connect=False)

    def handle_error(self, request, client_address):
        pass


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def setup(self):
        if isinstance(self.request, ssl.SSLSocket):
            self.request.settimeout(30)
            self.request.do_handshake()
            self.request.settimeout(None)
        super().setup()

    def log_message(self, *args):
        pass

    def answer(self, status, headers, body=b""):
        self.send_response_only(status)
        for k, v in headers:
            self.send_header(k, v)
        if status in (204, 304):
            body = b""
        else:
            self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def go(self):
        n = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(n) if n else b""
        url = urlsplit(self.path)
        q = {k: v[0] for k, v in parse_qs(url.query).items()}
        path = url.path
        if path == "/echo":
            seen = json.dumps({
                "server": self.server.label, "method": self.command,
                "path": self.path, "headers": list(self.headers.items()),
                "body": body.decode(errors="replace")}).encode()
            ct = ("Content-Type", "application/json")
            self.answer(200, [ct, ("X-Multi", "a"), ("X-Multi", "b")], seen)
        elif path == "/redirect":
            self.answer(302, [("Location", "/echo?from=redirect")], b"moved")
        elif path == "/to":
            self.answer(int(q.get("c", 302)), [("Location", q["u"])], b"moved")
        elif path == "/loop":
            self.answer(302, [("Location", "/loop")], b"again")
        elif path == "/chain":
            n = int(q["n"])
            to = f"/chain?n={n - 1}" if n > 0 else "/echo?chain=end"
            self.answer(302, [("Location", to)], b"")
        elif path == "/stream":
            self.send_response_only(200)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            self.wfile.flush()
            for i in range(int(q.get("n", 3))):
                if i == 1 and "hold" in q:
                    held(q["hold"]).wait(60)
                piece = f"chunk{i};".encode()
                self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
                self.wfile.flush()
                time.sleep(0.2)
            self.wfile.write(b"0\r\n\r\n")
        elif path == "/release":
            held(q["k"]).set()
            self.answer(200, [], b"released")
        elif path == "/slow":
            time.sleep(float(q.get("s", 3)))
            self.answer(200, [], b"late")
        elif path == "/nonutf8":
            self.send_response_only(200)
            self.send_header("X-Good", "fine")
            self._headers_buffer.append(b"X-Bin: \xff\xfe\r\n")
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"ok")
        elif path.startswith("/status/"):
            self.answer(int(path.split("/")[2]), [], b"st")
        else:
            self.answer(404, [], b"nf")

    do_GET = do_POST = do_PUT = do_DELETE = do_HEAD = do_PATCH = go


HELD, LOCK = {}, threading.Lock()


def held(key):
    with LOCK:
        return HELD.setdefault(key, threading.Event())


def serve(addr, port, label, cert=None):
    s = Server(addr, port, label, cert)
    threading.Thread(target=s.serve_forever, daemon=True).start()


PKI = sys.argv[1]
if PKI != "-":
    for n, label in [(10, "server-10"), (11, "server-11"), (12, "server-12")]:
        serve(f"93.184.215.{n}", 80, label)
        serve(f"93.184.215.{n}", 443, label, f"{PKI}/s{n}")
    serve("10.77.0.1", 8080, "private")
for spec in sys.argv[2:]:
    addr, port = spec.rsplit(":", 1)
    serve(addr, int(port), "extra")
print("ready", flush=True)
threading.Event().wait()
