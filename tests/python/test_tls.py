"""TLS on the client listeners, from real clients: Python `websockets`
over `wss://` and `grpcio` over TLS, trusting a CA this test makes (with
`cryptography`); a client trusting another CA is refused."""

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


def make_pki(name):
    """A CA, and a certificate for 127.0.0.1 it signed: (ca, cert, key) PEMs."""
    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"{name} test CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
          .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(now - datetime.timedelta(minutes=5))
          .not_valid_after(now + datetime.timedelta(days=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    leaf = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")]))
            .issuer_name(ca_name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]),
                critical=False)
            .sign(ca_key, hashes.SHA256()))
    pem = serialization.Encoding.PEM
    return (ca.public_bytes(pem), leaf.public_bytes(pem),
            key.private_bytes(pem, serialization.PrivateFormat.PKCS8,
                              serialization.NoEncryption()))


@pytest.fixture
def tls_gateway(tmp_path):
    ca, cert, key = make_pki("ours")
    (tmp_path / "tls.crt").write_bytes(cert)
    (tmp_path / "tls.key").write_bytes(key)
    secret = secrets.token_hex(32).encode()
    (tmp_path / "hs256.key").write_bytes(secret)
    (tmp_path / "gateway.toml").write_text(
        f"[server.tls]\ncert_file = \"{tmp_path}/tls.crt\"\nkey_file = \"{tmp_path}/tls.key\"\n"
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
