# A small app served inside a tenant for tests/preview.rs: a page with a
# script and a websocket back to the app, the headers it received, a body
# digest, a server that never answers, and cookies.
import base64, hashlib, http.server, json, socketserver, struct, sys, threading, time

# Set once a websocket message was answered: a browser's pending fetch of
# /wait holds its virtual clock until then.
ECHOED = threading.Event()

PAGE = b"""<!doctype html><html><head><title>app</title></head><body>
<div id="out">loading</div><script src="app.js"></script></body></html>"""

SCRIPT = b"""
const out = document.getElementById('out');
out.textContent = 'script ran';
fetch('headers').then(r => r.json()).then(j => {
  out.textContent = 'fetched';
  const base = location.pathname.replace(/[^/]*$/, '');
  const ws = new WebSocket((location.protocol === 'https:' ? 'wss://' : 'ws://') + location.host + base + 'ws');
  ws.onopen = () => { out.textContent = 'ws open'; ws.send('ping'); };
  fetch('wait');
  ws.onmessage = e => {
    document.getElementById('out').textContent =
      'rendered via=' + j.headers['x-exec-gateway-via'] + ' ws=' + e.data;
  };
  ws.onerror = () => { out.textContent = 'websocket failed'; };
}).catch(e => { out.textContent = 'fetch failed ' + e; });
"""


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *a):
        pass

    def send(self, status, body, ctype="text/plain", extra=()):
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        for k, v in extra:
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        path = self.path.split("?")[0]
        if path in ("/", "/index.html"):
            self.send(200, PAGE, "text/html")
        elif path == "/app.js":
            self.send(200, SCRIPT, "application/javascript")
        elif path == "/headers":
            body = json.dumps({"path": self.path, "headers": {k.lower(): v for k, v in self.headers.items()}}).encode()
            self.send(200, body, "application/json")
        elif path == "/cookie":
            self.send(200, b"set", extra=[
                ("Set-Cookie", "app=1; Domain=preview.test; Path=/"),
                ("Set-Cookie", "spaced=1; Path=/; Domain =preview.test"),
                ("Set-Cookie", "exg_preview=planted; Path=/"),
            ])
        elif path == "/wait":
            ECHOED.wait(10)
            self.send(200, b"ok")
        elif path == "/hang":
            time.sleep(3600)
        elif path == "/ws":
            self.websocket()
        else:
            self.send(404, b"no such page")

    def do_POST(self):
        n = int(self.headers.get("Content-Length", "0"))
        h = hashlib.sha256()
        while n > 0:
            chunk = self.rfile.read(min(n, 65536))
            if not chunk:
                break
            h.update(chunk)
            n -= len(chunk)
        self.send(200, h.hexdigest().encode())

    def websocket(self):
        key = self.headers["Sec-WebSocket-Key"]
        accept = base64.b64encode(hashlib.sha1((key + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11").encode()).digest())
        self.send_response(101)
        self.send_header("Upgrade", "websocket")
        self.send_header("Connection", "Upgrade")
        self.send_header("Sec-WebSocket-Accept", accept.decode())
        self.end_headers()
        self.wfile.flush()
        r = self.rfile
        while True:
            head = r.read(2)
            if len(head) < 2:
                return
            op, n = head[0] & 0x0F, head[1] & 0x7F
            if n == 126:
                n = struct.unpack(">H", r.read(2))[0]
            elif n == 127:
                n = struct.unpack(">Q", r.read(8))[0]
            mask = r.read(4) if head[1] & 0x80 else b"\0\0\0\0"
            data = bytes(b ^ mask[i % 4] for i, b in enumerate(r.read(n)))
            if op == 8:
                self.wfile.write(b"\x88\x00")
                return
            out = b"pong:" + data
            self.wfile.write(bytes([0x81, len(out)]) + out)
            self.wfile.flush()
            ECHOED.set()


class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    allow_reuse_address = True


Server(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
