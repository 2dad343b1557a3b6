"""A local broker that authenticates every client (SASL/SCRAM-SHA-512) and authorizes every
request (Kafka's StandardAuthorizer, nothing allowed without an ACL), for the cluster-trust
tests (tests/streams/test_cluster_trust.py).

The broker is the project's own (gpugap.services.kafka.LocalKafka, from the release jars):

- ``SASL://127.0.0.1:<port>`` (SASL_PLAINTEXT, SCRAM-SHA-512) for every client, and for the
  broker itself (the inter-broker listener, as ``admin``);
- ``CONTROLLER`` over SASL/PLAIN as ``admin``, the only super user;
- ``PLAINTEXT`` stays for LocalKafka's readiness probe: its clients are ``User:ANONYMOUS``,
  which no ACL names, so they can read metadata and nothing else
  (``allow.everyone.if.no.acl.found=false``).

SCRAM users are bootstrapped into the metadata log when the storage is formatted
(``kafka-storage format --add-scram``, how KRaft learns them before it starts). ACLs are
created by the Java AdminClient from the release jars (aiokafka has no CreateAcls), from lines
``PRINCIPAL OPERATION RESOURCE_TYPE NAME PATTERN_TYPE`` as ``deploy/kafka-acls/kafka-acls.sh
--list`` prints them.
"""

from __future__ import annotations

import secrets
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from gpugap.groundfloor.settings import KafkaSettings, ServicesSettings
from gpugap.schemas.errors import ServiceError
from gpugap.services.kafka import LocalKafka, free_port, jar_dir

MECHANISM = "SCRAM-SHA-512"
#: the principals the tests log in as (User:<name>); ``admin`` is the super user
USERS = ("admin", "cluster-a", "cluster-b", "gpugap-worker", "gpugap-sink", "gpugap-notify")

ACLS_JAVA = """
import java.io.*;
import java.util.*;
import org.apache.kafka.clients.admin.*;
import org.apache.kafka.common.acl.*;
import org.apache.kafka.common.resource.*;

/** CreateAcls BOOTSTRAP USER PASSWORD < lines "PRINCIPAL OPERATION TYPE NAME PATTERN" */
public class CreateAcls {
    public static void main(String[] args) throws Exception {
        Properties p = new Properties();
        p.put("bootstrap.servers", args[0]);
        p.put("security.protocol", "SASL_PLAINTEXT");
        p.put("sasl.mechanism", "SCRAM-SHA-512");
        p.put("sasl.jaas.config", "org.apache.kafka.common.security.scram.ScramLoginModule "
            + "required username=\\"" + args[1] + "\\" password=\\"" + args[2] + "\\";");
        List<AclBinding> acls = new ArrayList<>();
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in));
        for (String line; (line = in.readLine()) != null; ) {
            line = line.trim();
            if (line.isEmpty() || line.startsWith("#")) continue;
            String[] f = line.split("\\\\s+");
            if (f.length != 5) throw new IllegalArgumentException("not an ACL: " + line);
            // kafka-acls.sh's names: Write, DescribeConfigs, Prefixed, TransactionalId
            ResourceType type = ResourceType.valueOf(constant(f[2]));
            PatternType pattern = PatternType.valueOf(constant(f[4]));
            AclOperation op = AclOperation.valueOf(constant(f[1]));
            acls.add(new AclBinding(new ResourcePattern(type, f[3], pattern),
                new AccessControlEntry(f[0], "*", op, AclPermissionType.ALLOW)));
        }
        try (Admin admin = Admin.create(p)) {
            admin.createAcls(acls).all().get();
            // the broker answers DescribeAcls from its authorizer: once it lists them all,
            // they are in force
            long deadline = System.currentTimeMillis() + 30_000;
            while (true) {
                Collection<AclBinding> now =
                    admin.describeAcls(AclBindingFilter.ANY).values().get();
                if (now.containsAll(acls)) break;
                if (System.currentTimeMillis() > deadline) {
                    throw new IllegalStateException("ACLs not in force after 30 s");
                }
                Thread.sleep(100);
            }
        }
        System.out.println(acls.size() + " ACL(s) in force");
    }

    static String constant(String name) {
        return name.replaceAll("([a-z])([A-Z])", "$1_$2").toUpperCase(Locale.ROOT);
    }
}
"""


@dataclass
class SaslBroker:
    kafka: LocalKafka
    sasl_bootstrap: str
    passwords: dict[str, str]
    scratch: Path
    acls: list[str] = field(default_factory=list)

    def settings(self, user: str, **overrides: object) -> KafkaSettings:
        """Client settings for the SASL listener, logged in as ``user``."""
        values: dict[str, object] = {
            "bootstrap": self.sasl_bootstrap,
            "security_protocol": "SASL_PLAINTEXT",
            "sasl_mechanism": MECHANISM,
            "sasl_username": user,
            "sasl_password": self.passwords[user],
            "linger_ms": 5,
            **overrides,
        }
        return KafkaSettings(**values)  # type: ignore[arg-type]

    def env(self, user: str) -> dict[str, str]:
        """The same login as GPUGAP_KAFKA_* variables (for a ``gpugap`` subprocess)."""
        return {
            "GPUGAP_KAFKA_BOOTSTRAP": self.sasl_bootstrap,
            "GPUGAP_KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
            "GPUGAP_KAFKA_SASL_MECHANISM": MECHANISM,
            "GPUGAP_KAFKA_SASL_USERNAME": user,
            "GPUGAP_KAFKA_SASL_PASSWORD": self.passwords[user],
        }

    def create_acls(self, lines: list[str], timeout_s: float = 120.0) -> None:
        """Create these ACLs (``PRINCIPAL OPERATION RESOURCE_TYPE NAME PATTERN_TYPE`` lines)
        as the super user, and return once the broker enforces them."""
        libs = jar_dir(ServicesSettings())
        src = self.scratch / "CreateAcls.java"
        src.write_text(ACLS_JAVA)
        cmd = [shutil.which("java") or "java", "-cp", f"{libs}/*", str(src)]
        cmd += [self.sasl_bootstrap, "admin", self.passwords["admin"]]
        done = subprocess.run(
            cmd,
            input="\n".join(lines) + "\n",
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
        if done.returncode != 0:
            raise ServiceError(f"creating ACLs failed:\n{done.stdout}{done.stderr[-3000:]}")
        self.acls += lines


def _jaas(module: str, user: str, password: str, users: dict[str, str] | None = None) -> str:
    extra = "".join(f' user_{u}="{p}"' for u, p in (users or {}).items())
    return f'{module} required username="{user}" password="{password}"{extra};'


def start_sasl_broker(root: Path) -> SaslBroker:
    """Start the broker; raises GpugapError (or OSError) when it cannot."""
    passwords = {u: secrets.token_hex(12) for u in USERS}
    admin_pw = passwords["admin"]
    kafka = LocalKafka.ephemeral(ServicesSettings(), root / "state")
    s = kafka.settings
    sasl_port = free_port()
    plain = "org.apache.kafka.common.security.plain.PlainLoginModule"
    scram = "org.apache.kafka.common.security.scram.ScramLoginModule"
    kafka.extra_properties = {
        "listeners": (
            f"PLAINTEXT://127.0.0.1:{s.kafka_port},CONTROLLER://127.0.0.1:"
            f"{s.kafka_controller_port},SASL://127.0.0.1:{sasl_port}"
        ),
        "advertised.listeners": f"PLAINTEXT://127.0.0.1:{s.kafka_port},SASL://127.0.0.1:{sasl_port}",
        "listener.security.protocol.map": (
            "CONTROLLER:SASL_PLAINTEXT,PLAINTEXT:PLAINTEXT,SASL:SASL_PLAINTEXT"
        ),
        "inter.broker.listener.name": "SASL",
        "sasl.mechanism.inter.broker.protocol": MECHANISM,
        "sasl.mechanism.controller.protocol": "PLAIN",
        "listener.name.controller.sasl.enabled.mechanisms": "PLAIN",
        "listener.name.controller.plain.sasl.jaas.config": _jaas(
            plain, "admin", admin_pw, {"admin": admin_pw}
        ),
        "listener.name.sasl.sasl.enabled.mechanisms": MECHANISM,
        f"listener.name.sasl.{MECHANISM.lower()}.sasl.jaas.config": _jaas(scram, "admin", admin_pw),
        "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        "super.users": "User:admin",
        "allow.everyone.if.no.acl.found": "false",
    }
    for user, pw in passwords.items():
        kafka.format_args += ["--add-scram", f"{MECHANISM}=[name={user},password={pw}]"]
    try:
        kafka.up()
    except BaseException:
        kafka.down()
        raise
    scratch = root / "scratch"
    scratch.mkdir(parents=True, exist_ok=True)
    return SaslBroker(kafka, f"127.0.0.1:{sasl_port}", passwords, scratch)
