"""A throwaway PKI (the ``openssl`` CLI) and a local broker with an mTLS listener, for the
Kafka-over-TLS tests (fixtures ``kafka_tls_broker`` and ``kafka_tls`` in tests/conftest.py).

The broker is the project's own (gpugap.services.kafka.LocalKafka, from the release jars) with
one extra listener: ``SSL://127.0.0.1:<port>``, Kafka's PEM key/trust stores, and
``ssl.client.auth=required`` (a client must present a certificate the test CA signed). Its
PLAINTEXT listener stays for the readiness probe and the per-test topic cleanup only.
"""

from __future__ import annotations

import secrets
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from gpugap.groundfloor.settings import KafkaSettings, ServicesSettings
from gpugap.schemas.errors import ServiceError
from gpugap.services.kafka import LocalKafka, free_port

CA_CONFIG = """[req]
distinguished_name = dn
prompt = no
x509_extensions = v3_ca
[dn]
CN = {cn}
[v3_ca]
basicConstraints = critical,CA:TRUE
keyUsage = critical,keyCertSign,cRLSign
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid:always
"""

LEAF_EXTENSIONS = """[server]
basicConstraints = critical,CA:FALSE
keyUsage = critical,digitalSignature,keyEncipherment
extendedKeyUsage = serverAuth
subjectAltName = IP:127.0.0.1,DNS:localhost
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid
[client]
basicConstraints = critical,CA:FALSE
keyUsage = critical,digitalSignature,keyEncipherment
extendedKeyUsage = clientAuth
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid
"""


@dataclass(frozen=True)
class Pki:
    ca: Path  # the CA that signs the broker and the client
    other_ca: Path  # an unrelated CA: trusting only it must fail
    server_key: Path  # the broker's key (PKCS#8, unencrypted)
    server_cert: Path  # the broker's certificate (the CA signed it directly)
    client_cert: Path
    client_key: Path  # encrypted with key_password
    key_password: str


def _openssl(*args: str, cwd: Path) -> None:
    exe = shutil.which("openssl")
    if exe is None:
        raise ServiceError("the TLS tests need the `openssl` command (apt-get install openssl)")
    out = subprocess.run([exe, *args], cwd=cwd, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise ServiceError(f"openssl {args[0]} failed: {out.stderr[-2000:]}")


def _ca(root: Path, name: str) -> tuple[Path, Path]:
    (root / f"{name}.cnf").write_text(CA_CONFIG.format(cn=f"gpugap test {name}"))
    _openssl(
        "req", "-x509", "-new", "-newkey", "rsa:2048", "-nodes", "-days", "2",
        "-config", f"{name}.cnf", "-keyout", f"{name}.key", "-out", f"{name}.pem",
        cwd=root,
    )  # fmt: skip
    return root / f"{name}.pem", root / f"{name}.key"


def _leaf(root: Path, name: str, cn: str, kind: str, password: str | None = None) -> None:
    enc = ["-aes-256-cbc", "-pass", f"pass:{password}"] if password else []
    _openssl(
        "genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048", *enc,
        "-out", f"{name}.key",
        cwd=root,
    )  # fmt: skip
    passin = ["-passin", f"pass:{password}"] if password else []
    _openssl(
        "req", "-new", "-key", f"{name}.key", *passin, "-subj", f"/CN={cn}",
        "-out", f"{name}.csr",
        cwd=root,
    )  # fmt: skip
    _openssl(
        "x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
        "-set_serial", str(secrets.randbits(63)), "-days", "2",
        "-extfile", "leaf.cnf", "-extensions", kind, "-out", f"{name}.pem",
        cwd=root,
    )  # fmt: skip


def make_pki(root: Path) -> Pki:
    """A CA, a broker certificate for 127.0.0.1/localhost, a client certificate whose key is
    encrypted, and a second CA that signed neither."""
    root.mkdir(parents=True, exist_ok=True)
    ca, _ = _ca(root, "ca")
    other, _ = _ca(root, "other-ca")
    (root / "leaf.cnf").write_text(LEAF_EXTENSIONS)
    _leaf(root, "server", "localhost", "server")
    password = secrets.token_urlsafe(12)
    _leaf(root, "client", "gpugap-client", "client", password)
    return Pki(
        ca,
        other,
        root / "server.key",
        root / "server.pem",
        root / "client.pem",
        root / "client.key",
        password,
    )


def _inline(pem: Path) -> str:
    """A PEM file as one properties value (Kafka's PEM parser ignores the line breaks)."""
    return " ".join(pem.read_text().split())


@dataclass
class TlsBroker:
    kafka: LocalKafka
    pki: Pki
    ssl_bootstrap: str

    @property
    def plain_bootstrap(self) -> str:
        return self.kafka.bootstrap

    def settings(self, **overrides: object) -> KafkaSettings:
        """Client settings for the SSL listener: the test CA, the client certificate and its
        encrypted key (mutual TLS)."""
        values: dict[str, object] = {
            "bootstrap": self.ssl_bootstrap,
            "security_protocol": "SSL",
            "ssl_cafile": self.pki.ca,
            "ssl_certfile": self.pki.client_cert,
            "ssl_keyfile": self.pki.client_key,
            "ssl_key_password": self.pki.key_password,
            **overrides,
        }
        return KafkaSettings(**values)  # type: ignore[arg-type]

    def env(self, key_password_file: Path | None = None) -> dict[str, str]:
        """The same settings as GPUGAP_KAFKA_* variables (the hook, subprocesses)."""
        env = {
            "GPUGAP_KAFKA_BOOTSTRAP": self.ssl_bootstrap,
            "GPUGAP_KAFKA_SECURITY_PROTOCOL": "SSL",
            "GPUGAP_KAFKA_SSL_CAFILE": str(self.pki.ca),
            "GPUGAP_KAFKA_SSL_CERTFILE": str(self.pki.client_cert),
            "GPUGAP_KAFKA_SSL_KEYFILE": str(self.pki.client_key),
        }
        if key_password_file is not None:
            env["GPUGAP_KAFKA_SSL_KEY_PASSWORD_FILE"] = str(key_password_file)
        else:
            env["GPUGAP_KAFKA_SSL_KEY_PASSWORD"] = self.pki.key_password
        return env


def start_tls_broker(root: Path) -> TlsBroker:
    """Start the broker; raises GpugapError (or OSError) when it cannot."""
    pki = make_pki(root / "pki")
    kafka = LocalKafka.ephemeral(ServicesSettings(), root / "state")
    s = kafka.settings
    ssl_port = free_port()
    kafka.extra_properties = {
        "listeners": (
            f"PLAINTEXT://127.0.0.1:{s.kafka_port},CONTROLLER://127.0.0.1:"
            f"{s.kafka_controller_port},SSL://127.0.0.1:{ssl_port}"
        ),
        "advertised.listeners": f"PLAINTEXT://127.0.0.1:{s.kafka_port},SSL://127.0.0.1:{ssl_port}",
        "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT,SSL:SSL",
        # Kafka's PEM stores, given inline (ssl.keystore.location would need an encrypted key)
        "ssl.keystore.type": "PEM",
        # the leaf alone: a flattened value holding two certificates made the broker present
        # the last one (the CA) as its own
        "ssl.keystore.certificate.chain": _inline(pki.server_cert),
        "ssl.keystore.key": _inline(pki.server_key),
        "ssl.truststore.type": "PEM",
        "ssl.truststore.certificates": _inline(pki.ca),
        "ssl.client.auth": "required",
    }
    try:
        kafka.up()
    except BaseException:
        kafka.down()
        raise
    return TlsBroker(kafka, pki, f"127.0.0.1:{ssl_port}")
