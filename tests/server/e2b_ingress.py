"""A FAKE wildcard DNS and TLS ingress in front of a service on loopback, for the E2B SDK without
``E2B_SANDBOX_URL``: an HTTP proxy (the SDK's ``proxy`` option) that answers every ``CONNECT
host:443`` for a name under its domain, terminates the tunnel's TLS with a certificate for
``*.{domain}`` (signed by a CA of its own, which the client must trust: `Ingress.ca_file`) and
passes the plain HTTP/1.1 on to the service, its ``Host`` untouched, as an operator's ingress
does. It records which hosts were asked for (`Ingress.hosts`)."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import ssl
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

__all__ = ["Ingress", "ingress"]

_MAX_HEAD = 8 << 10
_CHUNK = 64 << 10


@dataclass
class Ingress:
    url: str
    """The proxy's URL, for the SDK's ``proxy`` option."""
    ca_file: Path
    """The PEM of the CA that signed the ingress's certificate."""
    hosts: list[str] = field(default_factory=list)
    """Every ``host:port`` a ``CONNECT`` asked for, in order."""


def _certificates(domain: str, directory: Path) -> tuple[Path, Path, Path]:
    """A CA's PEM, and a certificate for ``*.{domain}`` it signed with its key (PEMs)."""
    ca_key, leaf_key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "sandboxes test ingress CA")])
    ca = (
        _builder(ca_name, ca_name, ca_key.public_key(), authority=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    leaf_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"*.{domain}")])
    leaf = (
        _builder(leaf_name, ca_name, leaf_key.public_key(), authority=False)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(f"*.{domain}")]), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    paths = directory / "ca.pem", directory / "leaf.pem", directory / "leaf.key"
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(leaf.public_bytes(serialization.Encoding.PEM))
    key = leaf_key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    paths[2].write_bytes(key)
    return paths


def _builder(
    subject: x509.Name, issuer: x509.Name, public_key: ec.EllipticCurvePublicKey, *, authority: bool
) -> x509.CertificateBuilder:
    """A certificate valid from an hour ago for a day, a CA's (``authority``) or a server's."""
    now = datetime.datetime.now(datetime.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=authority, path_length=None), critical=True)
        .add_extension(_usage(cert_sign=authority), critical=True)
    )


def _usage(*, cert_sign: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=not cert_sign,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=cert_sign,
        crl_sign=cert_sign,
        encipher_only=False,
        decipher_only=False,
    )


@contextlib.contextmanager
def ingress(domain: str, service_port: int, directory: Path) -> Iterator[Ingress]:
    """The ingress for ``*.{domain}`` in front of the service on ``127.0.0.1:service_port``,
    served from a thread of its own until the block ends."""
    ca, cert, key = _certificates(domain, directory)
    tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    tls.load_cert_chain(cert, key)
    tls.set_alpn_protocols(["http/1.1"])  # the service speaks HTTP/1.1, as behind most ingresses
    loop = asyncio.new_event_loop()
    started = threading.Event()
    stop = asyncio.Event()
    found: list[Ingress] = []

    async def serve() -> None:
        tunnels: set[asyncio.Task[None]] = set()

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            task = asyncio.current_task()
            assert task is not None
            tunnels.add(task)
            try:
                await _tunnel(reader, writer, found[0], domain, tls, service_port)
            except (ConnectionError, ssl.SSLError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError):
                pass
            except asyncio.CancelledError:  # the ingress's own end (`stop`): the tunnel ends with it
                pass
            finally:
                writer.close()
                tunnels.discard(task)

        server = await asyncio.start_server(handle, "127.0.0.1", 0, limit=_MAX_HEAD)
        port = server.sockets[0].getsockname()[1]
        found.append(Ingress(f"http://127.0.0.1:{port}", ca))
        started.set()
        async with server:
            await stop.wait()
            for task in list(tunnels):  # the client's pooled connections: ended with the ingress
                task.cancel()
            await asyncio.gather(*tunnels, return_exceptions=True)

    def run() -> None:
        try:
            loop.run_until_complete(serve())
        finally:
            loop.close()

    thread = threading.Thread(target=run, name="test-ingress", daemon=True)
    thread.start()
    started.wait(30)
    try:
        yield found[0]
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(30)


async def _tunnel(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    seen: Ingress,
    domain: str,
    tls: ssl.SSLContext,
    service_port: int,
) -> None:
    """One ``CONNECT``: refused unless for a name under ``domain`` on 443; else TLS ended here
    and the plain bytes relayed to the service both ways until either side ends."""
    head = await reader.readuntil(b"\r\n\r\n")  # bounded: the reader's limit
    method, target, _ = head.split(b"\r\n", 1)[0].decode("latin-1").split(" ", 2)
    seen.hosts.append(target)
    name, _, port = target.rpartition(":")
    if method != "CONNECT" or port != "443" or not name.endswith("." + domain):
        writer.write(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n")
        await writer.drain()
        return
    writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
    await writer.drain()
    await writer.start_tls(tls)
    upstream_reader, upstream_writer = await asyncio.open_connection("127.0.0.1", service_port)
    try:
        await asyncio.gather(_pipe(reader, upstream_writer), _pipe(upstream_reader, writer))
    finally:
        upstream_writer.close()


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(ConnectionError, ssl.SSLError):
        while chunk := await reader.read(_CHUNK):
            writer.write(chunk)
            await writer.drain()
    with contextlib.suppress(ConnectionError, ssl.SSLError, OSError, RuntimeError):
        if writer.can_write_eof():
            writer.write_eof()
        else:
            writer.close()
