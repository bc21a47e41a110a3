"""The metrics port's TLS: a certificate from files, or a self-signed one made at start.

As controller-runtime's secure metrics do: `--metrics-cert-dir` names a directory holding
tls.crt and tls.key (a mounted kubernetes.io/tls Secret, e.g. cert-manager's), read at start (a
renewed certificate is served from the next restart on). Without it, an ECDSA P-256 key and a
certificate signed by itself, valid for a year, are made at start and never written to a
filesystem (the chart's root filesystem is read-only; they pass through a memfd): a scraper
then skips verification, as the chart's ServiceMonitor does, and what it is allowed rests on
its bearer token (`projector.telemetry.access`), not on the certificate.

The self-signed pair is made by `python -m projector.telemetry.certs` in a child process,
because the
`cryptography` package costs the process that imports it 9 MiB of RSS for good (3.4 of them
anonymous), for a millisecond of work once; the child takes about 0.13 s, while the controller
connects.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import ssl
import sys
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

from projector.errors import ProjectorError

VALID_DAYS = 365
MAKE_TIMEOUT = 30.0
"""Seconds the child that makes the self-signed pair may take."""


def self_signed(hosts: Sequence[str]) -> bytes:
    """A fresh PEM private key followed by its self-signed certificate for `hosts`.

    Imports `cryptography`: call it in a child process
    (`python -m projector.telemetry.certs HOST...`).
    """
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0] if hosts else "projector")])
    alt: list[x509.GeneralName] = []
    for host in hosts:
        try:
            alt.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            alt.append(x509.DNSName(host))
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))  # a scraper's clock a little behind
        .not_valid_after(now + datetime.timedelta(days=VALID_DAYS))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False
        )
    )
    if alt:
        builder = builder.add_extension(x509.SubjectAlternativeName(alt), critical=False)
    cert = builder.sign(key, hashes.SHA256())
    pem_key = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    return pem_key + cert.public_bytes(serialization.Encoding.PEM)


async def make_self_signed(hosts: Sequence[str]) -> bytes:
    """`self_signed(hosts)`, made by a child process (see the module's docstring)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "projector.telemetry.certs",
        *hosts,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        pem, err = await asyncio.wait_for(proc.communicate(), MAKE_TIMEOUT)
    finally:
        if proc.returncode is None:  # timed out or cancelled: no child is left behind
            proc.kill()
            await proc.wait()
    if proc.returncode != 0 or b"PRIVATE KEY" not in pem:
        tail = err.decode(errors="replace").strip().splitlines()[-1:] or [f"exit {proc.returncode}"]
        raise ProjectorError(f"cannot make the metrics port's certificate: {tail[0]}")
    return pem


@contextlib.contextmanager
def _in_memory(pem: bytes) -> Iterator[str]:
    """A path to read `pem` from that no filesystem holds (a memfd), or a private temp file."""
    if hasattr(os, "memfd_create"):
        fd = os.memfd_create("projector-metrics-tls", os.MFD_CLOEXEC)
        try:
            with os.fdopen(os.dup(fd), "wb") as f:
                f.write(pem)
            yield f"/proc/self/fd/{fd}"
        finally:
            os.close(fd)
        return
    with tempfile.TemporaryDirectory() as tmp:  # pragma: no cover - not Linux
        path = Path(tmp) / "tls.pem"
        path.touch(mode=0o600)
        path.write_bytes(pem)
        yield str(path)


def context(cert_dir: str = "", pem: bytes = b"") -> ssl.SSLContext:
    """A server TLS context: tls.crt and tls.key of `cert_dir`, else `pem`'s key and certificate.

    Raises OSError (ssl.SSLError) for files that are missing or do not match.
    """
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    if cert_dir:
        ctx.load_cert_chain(Path(cert_dir, "tls.crt"), Path(cert_dir, "tls.key"))
    else:
        with _in_memory(pem) as path:
            ctx.load_cert_chain(path)
    return ctx


async def serving_context(cert_dir: str) -> ssl.SSLContext:
    """The metrics port's TLS context: from `cert_dir`, or self-signed for this host's names."""
    if cert_dir:
        return context(cert_dir)
    hosts = dict.fromkeys(h for h in (socket.gethostname(), "localhost", "127.0.0.1") if h)
    return context(pem=await make_self_signed(list(hosts)))


if __name__ == "__main__":
    sys.stdout.buffer.write(self_signed(sys.argv[1:]))
