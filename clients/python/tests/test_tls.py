"""TLS: the SDK over grpcs:// trusting a CA made here, refused by a gateway
of another CA, and a client certificate that authenticates without a
token (its O names the tenant, OU the scopes)."""

from __future__ import annotations

import datetime
import ipaddress

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

import exec_gateway
from exec_gateway import ConnectionLost, Forbidden
from test_processes import aio

PEM = serialization.Encoding.PEM


class Authority:
    """A CA, and what it signs: (certificate PEM, key PEM) pairs."""

    def __init__(self, name: str) -> None:
        self.key = ec.generate_private_key(ec.SECP256R1())
        self.name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        self.pem = self._sign(self.name, self.key.public_key(), ca=True).public_bytes(PEM)

    def _sign(self, subject, public_key, ca=False, san=None):
        now = datetime.datetime.now(datetime.timezone.utc)
        b = (x509.CertificateBuilder().subject_name(subject).issuer_name(self.name)
             .public_key(public_key).serial_number(x509.random_serial_number())
             .not_valid_before(now - datetime.timedelta(minutes=5))
             .not_valid_after(now + datetime.timedelta(hours=1)))
        if ca:
            b = b.add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        if san:
            b = b.add_extension(x509.SubjectAlternativeName(san), critical=False)
        return b.sign(self.key, hashes.SHA256())

    def issue(self, attributes, san=None) -> tuple[bytes, bytes]:
        key = ec.generate_private_key(ec.SECP256R1())
        cert = self._sign(x509.Name(attributes), key.public_key(), san=san)
        return cert.public_bytes(PEM), key.private_bytes(
            PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())


@aio
async def test_grpcs_with_a_ca_and_a_client_certificate_instead_of_a_token(site):
    servers, clients = Authority("server CA"), Authority("client CA")
    cert, key = servers.issue([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")],
                              san=[x509.IPAddress(ipaddress.ip_address("127.0.0.1"))])
    for name, data in {"tls.crt": cert, "tls.key": key, "clients.crt": clients.pem}.items():
        (site.dir / name).write_bytes(data)
    gateway = site.start(extra=f'[server.tls]\ncert_file = "{site.dir}/tls.crt"\n'
                               f'key_file = "{site.dir}/tls.key"\n'
                               f'client_ca_file = "{site.dir}/clients.crt"\n')
    assert gateway.target.startswith("grpcs://")

    async with await exec_gateway.connect(gateway.target, token=gateway.token(),
                                          ca=servers.pem) as client:
        session = await client.session()
        assert (await session.run(["echo", "over tls"])).stdout == b"over tls\n"
        await session.close()

    # A machine client: tenant from O, scopes from OU; no token.
    bot_cert, bot_key = clients.issue([
        x509.NameAttribute(NameOID.ORGANIZATION_NAME, "alpha"),
        x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, "fs:read"),
        x509.NameAttribute(NameOID.COMMON_NAME, "bot")])
    async with await exec_gateway.connect(gateway.target, ca=servers.pem, cert=bot_cert,
                                          key=bot_key) as bot:
        session = await bot.session()
        root = (await session.environment_info()).cwd
        assert root.endswith("/roots/alpha")
        with pytest.raises(Forbidden) as e:
            await session.run(["true"])
        assert e.value.required_scope == "exec"
        session.detach()

    # Trusting another CA: the handshake fails, and is not retried.
    async with await exec_gateway.connect(gateway.target, token=gateway.token(),
                                          ca=Authority("other").pem) as stranger:
        with pytest.raises(ConnectionLost, match="CERTIFICATE_VERIFY_FAILED"):
            await stranger.session()

    # A CA for a plaintext target is a mistake, said before any call; so is
    # a token in the clear to another host, unless asked for.
    with pytest.raises(ValueError):
        await exec_gateway.connect("grpc://127.0.0.1:1", token="t", ca=servers.pem)
    for target in ("grpc://10.1.2.3:8766", "gateway.example.com:8766", "grpc://[2001:db8::1]:1"):
        with pytest.raises(ValueError, match="plaintext"):
            await exec_gateway.connect(target, token="t")
        await (await exec_gateway.connect(target, token="t", allow_plaintext=True)).close()
    for target in ("grpc://localhost:1", "grpc://127.0.0.2:1", "grpc://[::1]:1"):
        await (await exec_gateway.connect(target, token="t")).close()


@aio
async def test_a_plaintext_channel_ignores_http_proxies_from_the_environment(gateway):
    import asyncio
    import os
    seen = []

    async def proxy(reader, writer):
        seen.append(await reader.read(200))
        writer.close()

    server = await asyncio.start_server(proxy, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    saved = {k: os.environ.get(k) for k in ("http_proxy", "grpc_proxy", "no_proxy")}
    os.environ.update(http_proxy=f"http://127.0.0.1:{port}", grpc_proxy=f"http://127.0.0.1:{port}")
    os.environ.pop("no_proxy", None)
    try:
        async with await exec_gateway.connect(gateway.target, token=gateway.token()) as client:
            session = await client.session()
            assert (await session.run(["echo", "direct"])).stdout == b"direct\n"
            await session.close()
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        server.close()
    assert seen == [], seen
