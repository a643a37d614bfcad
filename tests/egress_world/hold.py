# A long-lived HTTPS connection (tests/egress_names.rs): opens one
# keep-alive connection to https://$1/ (trusting SSL_CERT_FILE), asks once
# and prints "first=<body line>"; then waits until the file $2 exists and
# asks again on the same connection: "second=ok:<body line>",
# "second=closed:<how>" (EOF, reset, TLS error) or "second=timeout".
import os, socket, ssl, sys, time

host, trigger = sys.argv[1], sys.argv[2]


def ask(s):
    s.sendall(f"GET / HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
    data = b""
    while not (b"\r\n\r\n" in data and b"\n" in data.split(b"\r\n\r\n", 1)[1]):
        chunk = s.recv(4096)
        if not chunk:
            raise EOFError("eof")
        data += chunk
    return data.split(b"\r\n\r\n", 1)[1].split(b"\n")[0].decode()


raw = socket.create_connection((host, 443), timeout=10)
s = ssl.create_default_context().wrap_socket(raw, server_hostname=host)
print("first=" + ask(s), flush=True)
while not os.path.exists(trigger):
    time.sleep(0.05)
try:
    print("second=ok:" + ask(s), flush=True)
except socket.timeout:
    print("second=timeout", flush=True)
except (EOFError, OSError) as e:
    print(f"second=closed:{e.__class__.__name__}", flush=True)
