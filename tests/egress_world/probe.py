# What a process reaches, step by step (tests/egress_names.rs); run in a
# tenant, or on the gateway's host as the world's control. Each argument is
# one step, fields comma-separated (addresses may be IPv6); each prints one
# line "LABEL=RESULT":
#   resolve,LABEL,NAME            the IPv4 address, or "nx:<error>"
#   connect,LABEL,HOST,PORT       TCP: "ok:<first line read>", "closed" (EOF
#                                 before any data), "silent" (connected, no
#                                 data in time) or "<Error>:<errno>"
#   tls,LABEL,HOST,PORT,SNI       TLS with SNI (trusting SSL_CERT_FILE), then
#                                 GET / with Host SNI: "ok:<first body line>"
#                                 ("ok:..." whenever the handshake completed)
#                                 or "fail:<Error>"
#   udp,LABEL,ADDR,PORT           a datagram: "reply:<it>", "noreply" or
#                                 "<Error>:<errno>"
#   dns,LABEL,SERVER,NAME         an A query over UDP straight to SERVER:53:
#                                 "answer:rcode=N", "noreply" or "<Error>:<errno>"
#   aaaa,LABEL,NAME               "usable:<addr>" if an AAAA answer accepts
#                                 a connection on 443, else "unusable:<why>"
import socket, ssl, struct, sys

WAIT = 4


def err(e):
    return f"{e.__class__.__name__}:{getattr(e, 'errno', None)}"


def resolve(name):
    try:
        return socket.gethostbyname(name)
    except OSError as e:
        return f"nx:{err(e)}"


def connect(host, port):
    try:
        s = socket.create_connection((host, int(port)), timeout=WAIT)
    except OSError as e:
        return err(e)
    with s:
        try:
            data = s.recv(256)
        except socket.timeout:
            return "silent"
        except OSError as e:
            return "closed:" + err(e)
        return f"ok:{data.decode(errors='replace').strip()}" if data else "closed"


def http_get(s, host):
    """The first line of the body; of what came, if the peer closes first."""
    s.sendall(f"GET / HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
    data = b""
    while not (b"\r\n\r\n" in data and b"\n" in data.split(b"\r\n\r\n", 1)[1]):
        chunk = s.recv(4096)
        if not chunk:
            return data.split(b"\n")[0].decode(errors="replace") or "eof"
        data += chunk
    return data.split(b"\r\n\r\n", 1)[1].split(b"\n")[0].decode()


def tls(host, port, sni):
    """"ok:..." once the handshake with the server completed."""
    try:
        ctx = ssl.create_default_context()
        raw = socket.create_connection((host, int(port)), timeout=WAIT)
        s = ctx.wrap_socket(raw, server_hostname=sni)
    except Exception as e:
        return f"fail:{e.__class__.__name__}"
    with s:
        try:
            return "ok:" + http_get(s, sni)
        except OSError as e:
            return f"ok:then-{e.__class__.__name__}"


def udp(addr, port, payload=b"probe"):
    try:
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.settimeout(WAIT)
        s.sendto(payload, (addr, int(port)))
        return "reply:" + s.recv(2048).decode(errors="replace")
    except socket.timeout:
        return "noreply"
    except OSError as e:
        return err(e)


def dns(server, name):
    q = struct.pack(">HHHHHH", 0x4567, 0x0100, 1, 0, 0, 0)
    q += b"".join(bytes([len(p)]) + p.encode() for p in name.split(".")) + b"\0"
    q += struct.pack(">HH", 1, 1)
    try:
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.settimeout(WAIT)
        s.sendto(q, (server, 53))
        return f"answer:rcode={s.recv(512)[3] & 15}"
    except socket.timeout:
        return "noreply"
    except OSError as e:
        return err(e)


def aaaa(name):
    try:
        infos = socket.getaddrinfo(name, 443, socket.AF_INET6, socket.SOCK_STREAM)
    except OSError as e:
        return f"unusable:{err(e)}"
    why = []
    for *_, addr in infos:
        try:
            with socket.create_connection(addr[:2], timeout=WAIT):
                return f"usable:{addr[0]}"
        except OSError as e:
            why.append(f"{addr[0]}/{err(e)}")
    return "unusable:" + " ".join(why)


STEPS = {"resolve": resolve, "connect": connect, "tls": tls, "udp": udp,
         "dns": dns, "aaaa": aaaa}
for spec in sys.argv[1:]:
    kind, label, *args = spec.split(",")
    print(f"{label}={STEPS[kind](*args)}", flush=True)
