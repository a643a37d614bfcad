"""TLS on the client listeners, from real clients: Python `websockets`
over `wss://`, `grpcio` and Node's `@grpc/grpc-js` over TLS, trusting a CA
this test makes (with `cryptography`); a client trusting another CA is
refused; a client certificate of the configured client CA authenticates
without a token."""

import asyncio
import datetime
import ipaddress
import json
import os
import secrets
import ssl
import subprocess

import grpc
import pytest
import websockets
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from conftest import Gateway, gateway_binary


def _cert(subject, issuer, public_key, signing_key, ca=False, san=None):
    now = datetime.datetime.now(datetime.timezone.utc)
    b = (x509.CertificateBuilder().subject_name(subject).issuer_name(issuer)
         .public_key(public_key).serial_number(x509.random_serial_number())
         .not_valid_before(now - datetime.timedelta(minutes=5))
         .not_valid_after(now + datetime.timedelta(days=1)))
    if ca:
        b = b.add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
    if san:
        b = b.add_extension(x509.SubjectAlternativeName(san), critical=False)
    return b.sign(signing_key, hashes.SHA256())


def _pem(cert, key):
    pem = serialization.Encoding.PEM
    return (cert.public_bytes(pem),
            key.private_bytes(pem, serialization.PrivateFormat.PKCS8,
                              serialization.NoEncryption()))


def make_pki(name, client_subject=None):
    """A CA, and a certificate for 127.0.0.1 it signed: (ca, cert, key) PEMs;
    with `client_subject` (name attributes), a fourth and fifth: a client
    certificate of that subject and its key."""
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"{name} test CA")])
    ca = _cert(ca_name, ca_name, ca_key.public_key(), ca_key, ca=True)
    key = ec.generate_private_key(ec.SECP256R1())
    leaf = _cert(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")]), ca_name,
                 key.public_key(), ca_key,
                 san=[x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                      x509.DNSName("localhost")])
    out = (ca.public_bytes(serialization.Encoding.PEM),) + _pem(leaf, key)
    if client_subject:
        ckey = ec.generate_private_key(ec.SECP256R1())
        out += _pem(_cert(x509.Name(client_subject), ca_name, ckey.public_key(), ca_key), ckey)
    return out


@pytest.fixture
def tls_gateway(tmp_path):
    ca, cert, key = make_pki("ours")
    (tmp_path / "tls.crt").write_bytes(cert)
    (tmp_path / "tls.key").write_bytes(key)
    (tmp_path / "ca.crt").write_bytes(ca)
    # Machine clients: tenant t1 (O), scopes (OU), a name (CN).
    clients_ca, _, _, client_cert, client_key = make_pki("clients", [
        x509.NameAttribute(NameOID.ORGANIZATION_NAME, "t1"),
        x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, "exec fs:read"),
        x509.NameAttribute(NameOID.COMMON_NAME, "py-bot"),
    ])
    (tmp_path / "clients.crt").write_bytes(clients_ca)
    secret = secrets.token_hex(32).encode()
    (tmp_path / "hs256.key").write_bytes(secret)
    (tmp_path / "gateway.toml").write_text(
        f"[server.tls]\ncert_file = \"{tmp_path}/tls.crt\"\nkey_file = \"{tmp_path}/tls.key\"\n"
        f"client_ca_file = \"{tmp_path}/clients.crt\"\n"
        "[[auth.keys]]\nalgorithm = \"HS256\"\n"
        f"secret_file = \"{tmp_path}/hs256.key\"\n"
        "[tenants.t1]\nroot = \"/\"\n"
    )
    proc = subprocess.Popen(
        [gateway_binary(), "serve", "--listen", "ws://127.0.0.1:0",
         "--grpc-listen", "127.0.0.1:0", "--admin-listen", "off",
         "--config", str(tmp_path / "gateway.toml")],
        stdout=subprocess.PIPE, text=True,
        env={**os.environ, "XDG_STATE_HOME": str(tmp_path / "state")},
    )
    try:
        url = proc.stdout.readline().strip()
        assert url.startswith("wss://127.0.0.1:"), url
        grpc_url = proc.stdout.readline().strip()
        assert grpc_url.startswith("grpcs://127.0.0.1:"), grpc_url
        gw = Gateway(url, secret)
        gw.grpc_target = grpc_url.removeprefix("grpcs://")
        gw.ca = ca
        gw.ca_file = str(tmp_path / "ca.crt")
        gw.client = (client_cert, client_key)
        (tmp_path / "client.crt").write_bytes(client_cert)
        (tmp_path / "client.key").write_bytes(client_key)
        gw.client_files = (str(tmp_path / "client.crt"), str(tmp_path / "client.key"))
        yield gw
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def test_websockets_over_tls(tls_gateway):
    async def run():
        ctx = ssl.create_default_context(cadata=tls_gateway.ca.decode())
        async with websockets.connect(tls_gateway.url, ssl=ctx,
                                      additional_headers=tls_gateway.headers()) as ws:
            await ws.send(json.dumps({"id": 1, "method": "initialize",
                                      "params": {"clientName": "py-tls"}}))
            reply = json.loads(await asyncio.wait_for(ws.recv(), 20))
            assert reply["result"]["sessionId"], reply
        other = ssl.create_default_context(cadata=make_pki("other")[0].decode())
        with pytest.raises(ssl.SSLCertVerificationError):
            await websockets.connect(tls_gateway.url, ssl=other,
                                     additional_headers=tls_gateway.headers())
    asyncio.run(run())


def test_grpcio_over_tls(tls_gateway, stubs):
    s, p = stubs["session"], stubs["process"]
    md = [("authorization", f"Bearer {tls_gateway.token()}")]
    creds = grpc.ssl_channel_credentials(root_certificates=tls_gateway.ca)
    with grpc.secure_channel(tls_gateway.grpc_target, creds) as ch:
        sessions = stubs["session_grpc"].SessionServiceStub(ch)
        procs = stubs["process_grpc"].ProcessServiceStub(ch)
        sid = sessions.CreateSession(s.CreateSessionRequest(client_name="py-tls"),
                                     metadata=md, timeout=20).session_id
        spec = p.ProcessSpec(process_id="t1", argv=["echo", "over tls"], cwd="/tmp",
                             env={"PATH": "/usr/bin:/bin"})
        out = b""
        for msg in procs.Exec(p.ExecRequest(session_id=sid, spec=spec), metadata=md, timeout=20):
            if msg.event.WhichOneof("event") == "output":
                out += msg.event.output.data
        assert out == b"over tls\n"
    other = grpc.ssl_channel_credentials(root_certificates=make_pki("other")[0])
    with grpc.secure_channel(tls_gateway.grpc_target, other) as ch:
        sessions = stubs["session_grpc"].SessionServiceStub(ch)
        with pytest.raises(grpc.RpcError) as e:
            sessions.CreateSession(s.CreateSessionRequest(client_name="py"),
                                   metadata=md, timeout=10)
        assert e.value.code() == grpc.StatusCode.UNAVAILABLE


def test_node_grpc_over_tls(tls_gateway, tmp_path, scratch):
    from test_node_grpc import run_node
    f = scratch / "node.txt"
    f.write_bytes(b"read over tls\n")
    code, seen = run_node(tls_gateway.grpc_target, str(f), tls_gateway.token(),
                          env={"EXEC_GATEWAY_CA": tls_gateway.ca_file})
    assert code == 0 and "error" not in seen, seen
    assert seen["exec"]["stdout"] == "hello-from-node\n"
    assert seen["readFile"]["bytes"] == len(b"read over tls\n")
    # Trusting another CA, Node is refused too.
    other = tmp_path / "other.crt"
    other.write_bytes(make_pki("other")[0])
    code, seen = run_node(tls_gateway.grpc_target, str(f), tls_gateway.token(),
                          env={"EXEC_GATEWAY_CA": str(other)})
    assert code == 1 and seen["error"]["code"] == "UNAVAILABLE", seen
    assert "certificate" in seen["error"]["details"], seen


def test_a_client_certificate_is_the_credential(tls_gateway, stubs):
    """No token: the certificate names tenant t1 and its scopes, over both
    doors."""
    s, p = stubs["session"], stubs["process"]
    cert, key = tls_gateway.client
    creds = grpc.ssl_channel_credentials(root_certificates=tls_gateway.ca,
                                         private_key=key, certificate_chain=cert)
    with grpc.secure_channel(tls_gateway.grpc_target, creds) as ch:
        sessions = stubs["session_grpc"].SessionServiceStub(ch)
        procs = stubs["process_grpc"].ProcessServiceStub(ch)
        sid = sessions.CreateSession(s.CreateSessionRequest(client_name="py-cert"),
                                     timeout=20).session_id
        spec = p.ProcessSpec(process_id="c1", argv=["echo", "by certificate"], cwd="/tmp",
                             env={"PATH": "/usr/bin:/bin"})
        out = b""
        for msg in procs.Exec(p.ExecRequest(session_id=sid, spec=spec), timeout=20):
            if msg.event.WhichOneof("event") == "output":
                out += msg.event.output.data
        assert out == b"by certificate\n"

    async def ws():
        ctx = ssl.create_default_context(cadata=tls_gateway.ca.decode())
        ctx.load_cert_chain(*tls_gateway.client_files)
        async with websockets.connect(tls_gateway.url, ssl=ctx) as conn:
            await conn.send(json.dumps({"id": 1, "method": "initialize",
                                        "params": {"clientName": "py-cert"}}))
            reply = json.loads(await asyncio.wait_for(conn.recv(), 20))
            assert reply["result"]["sessionId"], reply
        # Without the certificate and without a token: refused before the
        # upgrade.
        plain = ssl.create_default_context(cadata=tls_gateway.ca.decode())
        with pytest.raises(websockets.exceptions.InvalidStatus) as e:
            await websockets.connect(tls_gateway.url, ssl=plain)
        assert e.value.response.status_code == 401
    asyncio.run(ws())
