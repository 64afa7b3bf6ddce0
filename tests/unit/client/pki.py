"""Throwaway test PKI: a CA, a server certificate for `daemon.test` only (so dialling 127.0.0.1
needs the server-name override), a client certificate, and an unrelated second CA, as PEM files in
a directory.

Made with the `cryptography` package when it is installed, else with the `openssl` command; when
neither is there, `make_pki` skips the test (TLS tests need real certificates, and the project does
not depend on either just for them). EC P-256 keys, valid from an hour ago for a day.
"""

from __future__ import annotations

import datetime
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

SERVER_NAME = "daemon.test"


@dataclass(frozen=True)
class Pki:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    other_ca: Path  # signed nothing here: a client trusting it must refuse the server

    def read(self, name: str) -> bytes:
        return Path(getattr(self, name)).read_bytes()


def make_pki(directory: Path) -> Pki:
    """Write the PKI into `directory`. Skips the calling test when no generator is available."""
    directory.mkdir(parents=True, exist_ok=True)
    pki = Pki(*(directory / n for n in ("ca.pem", "server.pem", "server.key", "client.pem", "client.key", "other.pem")))
    try:
        import cryptography  # noqa: F401
    except ImportError:
        if shutil.which("openssl") is None:
            pytest.skip("TLS tests need test certificates: neither the cryptography package nor openssl is installed")
        _with_openssl(directory, pki)
    else:
        _with_cryptography(pki)
    return pki


def _with_cryptography(pki: Pki) -> None:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.UTC)

    def name(cn: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])

    def key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
        return key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )

    def builder(subject: str, issuer: str, public_key: ec.EllipticCurvePublicKey) -> x509.CertificateBuilder:
        return (
            x509.CertificateBuilder()
            .subject_name(name(subject))
            .issuer_name(name(issuer))
            .public_key(public_key)
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=1))
        )

    def make_ca(path: Path, cn: str) -> ec.EllipticCurvePrivateKey:
        key = ec.generate_private_key(ec.SECP256R1())
        cert = (
            builder(cn, cn, key.public_key())
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256())
        )
        path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        return key

    ca_key = make_ca(pki.ca, "calculet test CA")
    make_ca(pki.other_ca, "unrelated test CA")
    server_key = ec.generate_private_key(ec.SECP256R1())
    server = (
        builder(SERVER_NAME, "calculet test CA", server_key.public_key())
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(SERVER_NAME)]), critical=False)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    pki.server_cert.write_bytes(server.public_bytes(serialization.Encoding.PEM))
    pki.server_key.write_bytes(key_pem(server_key))
    client_key = ec.generate_private_key(ec.SECP256R1())
    client = (
        builder("calculet test client", "calculet test CA", client_key.public_key())
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    pki.client_cert.write_bytes(client.public_bytes(serialization.Encoding.PEM))
    pki.client_key.write_bytes(key_pem(client_key))


def _with_openssl(directory: Path, pki: Pki) -> None:
    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=directory, check=True, capture_output=True, timeout=60)

    ec_key = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes")
    for ca, cn in ((pki.ca, "calculet test CA"), (pki.other_ca, "unrelated test CA")):
        run("req", "-x509", *ec_key, "-keyout", f"{ca.stem}.key", "-out", ca.name, "-days", "1",
            "-subj", f"/CN={cn}", "-addext", "basicConstraints=critical,CA:TRUE",
            "-addext", "keyUsage=critical,keyCertSign,cRLSign")  # fmt: skip
    leaves = (
        (pki.server_cert, pki.server_key, SERVER_NAME, f"subjectAltName=DNS:{SERVER_NAME}\n"
         "extendedKeyUsage=serverAuth\n"),
        (pki.client_cert, pki.client_key, "calculet test client", "extendedKeyUsage=clientAuth\n"),
    )  # fmt: skip
    for serial, (cert, key, cn, extensions) in enumerate(leaves, start=2):
        (directory / f"{cert.stem}.ext").write_text(extensions + "basicConstraints=CA:FALSE\n")
        run("req", *ec_key, "-keyout", key.name, "-out", f"{cert.stem}.csr", "-subj", f"/CN={cn}")
        run("x509", "-req", "-in", f"{cert.stem}.csr", "-CA", pki.ca.name, "-CAkey", f"{pki.ca.stem}.key",
            "-set_serial", str(serial), "-days", "1", "-sha256", "-extfile", f"{cert.stem}.ext",
            "-out", cert.name)  # fmt: skip
