# The servers of the egress world (tests/egress_names.rs), run in the
# "outside" namespace: `servers.py PKI REPO` (PKI: pki.sh's directory, REPO:
# repo.sh's) serves WORLD below. Each server is fields comma-separated
# (addresses may be IPv6):
#   https,ADDR,PORT,LABEL,CERT   HTTPS (CERT.pem, CERT.key) answering every
#                                request with "LABEL host=... authorization=...
#                                x-api-key=..." (what it received)
#   http,ADDR,PORT,LABEL         the same, plain HTTP
#   static,ADDR,PORT,DIR,CERT    HTTPS serving the files under DIR
#   banner,ADDR,PORT,TEXT        raw TCP: TEXT and a newline, then an echo
#   tls,ADDR,PORT,TEXT,CERT      TLS: TEXT and a newline, then closes
#   udp,ADDR,PORT,LABEL          UDP: answers each datagram "LABEL:<it>"
# Prints "ready" once every socket is bound and listening.
import functools, http.server, socket, ssl, sys, threading


def context(cert):
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert + ".pem", cert + ".key")
    return ctx


def family(addr):
    return socket.AF_INET6 if ":" in addr else socket.AF_INET


class Server(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, addr, port, handler, label="", ctx=None):
        self.address_family = family(addr)
        self.label = label
        super().__init__((addr, port), handler)
        if ctx is not None:
            # The handshake runs in the request's thread (setup), never in
            # the accept loop: a peer that never says hello stalls only itself.
            self.socket = ctx.wrap_socket(
                self.socket, server_side=True, do_handshake_on_connect=False)

    def handle_error(self, request, client_address):
        pass


class Quiet:
    def setup(self):
        if isinstance(self.request, ssl.SSLSocket):
            self.request.settimeout(60)
            self.request.do_handshake()
            self.request.settimeout(None)
        super().setup()

    def log_message(self, *args):
        pass


class Echo(Quiet, http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self):
        h = self.headers
        body = (f"{self.server.label} host={h.get('Host', '-')} "
                f"authorization={h.get('Authorization', '-')} "
                f"x-api-key={h.get('X-Api-Key', '-')}\n").encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_POST = do_GET


class Static(Quiet, http.server.SimpleHTTPRequestHandler):
    pass


def listener(addr, port, kind=socket.SOCK_STREAM):
    s = socket.socket(family(addr), kind)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((addr, port))
    if kind == socket.SOCK_STREAM:
        s.listen(64)
    return s


def forever(target, *args):
    threading.Thread(target=target, args=args, daemon=True).start()


def banner(s, text):
    def one(c):
        try:
            c.sendall(text.encode() + b"\n")
            while data := c.recv(4096):
                c.sendall(data)
        except OSError:
            pass
        finally:
            c.close()
    while True:
        forever(one, s.accept()[0])


def tls(s, text, ctx):
    def one(c):
        try:
            with ctx.wrap_socket(c, server_side=True) as t:
                t.sendall(text.encode() + b"\n")
        except OSError:
            c.close()
    while True:
        forever(one, s.accept()[0])


def upgrade(s, ctx):
    # Answers a request that asks to upgrade with 101 (its Authorization
    # echoed in X-Authorization), then echoes bytes until closed.
    def one(c):
        try:
            with ctx.wrap_socket(c, server_side=True) as t:
                head = b""
                while b"\r\n\r\n" not in head:
                    chunk = t.recv(4096)
                    if not chunk:
                        return
                    head += chunk
                auth = "-"
                for line in head.split(b"\r\n")[1:]:
                    if line.lower().startswith(b"authorization:"):
                        auth = line.split(b":", 1)[1].strip().decode()
                t.sendall(("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\n"
                           f"Upgrade: echo\r\nX-Authorization: {auth}\r\n\r\n").encode())
                while data := t.recv(4096):
                    t.sendall(data)
        except OSError:
            c.close()
    while True:
        forever(one, s.accept()[0])


def udp(s, label):
    while True:
        data, peer = s.recvfrom(2048)
        s.sendto(label.encode() + b":" + data, peer)


PKI, REPO = sys.argv[1], sys.argv[2]
WORLD = [
    f"https,93.184.215.10,443,server-10,{PKI}/s10",
    f"https,2001:db8::10,443,server-10,{PKI}/s10",
    f"https,93.184.215.11,443,server-11,{PKI}/s11",
    f"https,93.184.215.12,443,server-12,{PKI}/s12",
    f"static,93.184.215.13,443,{REPO},{PKI}/s13",
    f"tls,93.184.215.53,853,dot,{PKI}/s53",
    f"https,93.184.215.53,443,doh,{PKI}/s53",
    "http,93.184.215.10,80,server-10",
    "http,93.184.215.11,80,server-11",
    "http,93.184.215.12,80,server-12",
    "http,93.184.215.13,80,server-13",
    "banner,93.184.215.10,2222,ssh-like",
    f"upgrade,93.184.215.10,8443,-,{PKI}/s10",
    "banner,93.184.215.11,2222,ssh-like-11",
    "banner,10.77.0.1,8080,private",
    "udp,93.184.215.10,443,quic",
]
for spec in WORLD:
    kind, addr, port, arg, *rest = spec.split(",")
    port = int(port)
    if kind == "https":
        forever(Server(addr, port, Echo, arg, context(rest[0])).serve_forever)
    elif kind == "http":
        forever(Server(addr, port, Echo, arg).serve_forever)
    elif kind == "static":
        handler = functools.partial(Static, directory=arg)
        forever(Server(addr, port, handler, ctx=context(rest[0])).serve_forever)
    elif kind == "banner":
        forever(banner, listener(addr, port), arg)
    elif kind == "tls":
        forever(tls, listener(addr, port), arg, context(rest[0]))
    elif kind == "upgrade":
        forever(upgrade, listener(addr, port), context(rest[0]))
    elif kind == "udp":
        forever(udp, listener(addr, port, socket.SOCK_DGRAM), arg)
    else:
        sys.exit(f"unknown server kind {kind}")
print("ready", flush=True)
threading.Event().wait()
