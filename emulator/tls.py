"""A throwaway certificate authority and a ``localhost`` server certificate for the emulator's HTTPS endpoint.

Why HTTPS at all: our buckets' policies (and the CDK bootstrap bucket's) deny every request whose
``aws:SecureTransport`` is false. The emulator evaluates that condition from the real transport (see
``cfn_compat`` item 6), so clients must use TLS, as on AWS. Clients trust the CA through
``AWS_CA_BUNDLE`` (AWS CLI, boto3, CDK CLI) and ``NODE_EXTRA_CA_CERTS`` (Node.js).

The key pair is made fresh for every emulator run, valid for one day, for ``localhost`` and
``127.0.0.1`` only, and written only into the run's own directory.
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass(frozen=True)
class TlsFiles:
    ca_cert: Path  # what clients trust
    server_cert: Path  # leaf + CA chain
    server_key: Path


def make_tls_files(directory: Path) -> TlsFiles:
    """Write ``ca.pem``, ``server.pem`` and ``server.key`` (mode 0600) into ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC)
    not_before, not_after = now - datetime.timedelta(minutes=5), now + datetime.timedelta(days=1)

    ca_key, ca_cert = _ca(not_before, not_after)
    key, cert = _server_cert(ca_key, ca_cert.subject, not_before, not_after)
    files = TlsFiles(directory / "ca.pem", directory / "server.pem", directory / "server.key")
    pem = serialization.Encoding.PEM
    files.ca_cert.write_bytes(ca_cert.public_bytes(pem))
    files.server_cert.write_bytes(cert.public_bytes(pem) + ca_cert.public_bytes(pem))
    files.server_key.touch(mode=0o600)
    files.server_key.write_bytes(
        key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return files


def _ca(
    not_before: datetime.datetime, not_after: datetime.datetime
) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    """The emulator's own CA: a key and its self-signed certificate, valid for the run."""
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "spot-training emulator CA")])
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    return ca_key, ca_cert


def _server_cert(
    ca_key: ec.EllipticCurvePrivateKey, ca_name: x509.Name, not_before: datetime.datetime, not_after: datetime.datetime
) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    """The endpoint's key and certificate (localhost and 127.0.0.1), signed by the CA."""
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .add_extension(
            x509.SubjectAlternativeName([x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    return key, cert
