"""Apache Kafka's own broker in KRaft combined mode, as a local process on loopback.

The jars come from Maven Central (resolved once by ``mvn`` into a cache outside the repo) or
from an unpacked release in ``KAFKA_HOME``. The broker is started detached, tracked by a PID
file in the state directory, and stopped by that PID.
"""

from __future__ import annotations

import base64
import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from gpugap.groundfloor.settings import KafkaSettings, ServicesSettings
from gpugap.schemas.errors import ServiceError

POM = """<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>gpugap.local</groupId><artifactId>kafka-broker</artifactId><version>1</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency><groupId>org.apache.kafka</groupId><artifactId>kafka_2.13</artifactId>
      <version>{version}</version></dependency>
    <dependency><groupId>org.slf4j</groupId><artifactId>slf4j-api</artifactId>
      <version>2.0.17</version></dependency>
    <dependency><groupId>org.apache.logging.log4j</groupId>
      <artifactId>log4j-slf4j2-impl</artifactId><version>2.24.3</version></dependency>
  </dependencies>
</project>
"""

LOG4J2 = """status = error
appender.file.type = File
appender.file.name = file
appender.file.fileName = {log}
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = WARN
rootLogger.appenderRef.file.ref = file
"""

SERVER = """process.roles=broker,controller
node.id=1
controller.quorum.voters=1@{host}:{cport}
listeners=PLAINTEXT://{host}:{port},CONTROLLER://{host}:{cport}
advertised.listeners=PLAINTEXT://{host}:{port}
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT
log.dirs={data}
num.partitions=1
offsets.topic.replication.factor=1
offsets.topic.num.partitions=8
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
group.initial.rebalance.delay.ms=0
auto.create.topics.enable=true
delete.topic.enable=true
# Records carry their event time as Kafka timestamp, and replays and simulations publish
# history weeks old: time-based retention would delete them at its next check. The local
# broker keeps everything (a real cluster chooses per topic, or LogAppendTime).
log.retention.ms=-1
log.retention.bytes=-1
"""

MARKER = ".complete"


def java_major(java: str = "java") -> int:
    """The major version of the Java runtime, or a clear error if there is none."""
    exe = shutil.which(java)
    if exe is None:
        raise ServiceError(
            "Java 17+ is required to run the local Kafka broker and no `java` is on PATH: "
            "install a JDK/JRE 17 or newer (Debian: apt-get install openjdk-17-jre-headless), "
            "or point GPUGAP_KAFKA_BOOTSTRAP at an existing broker"
        )
    out = subprocess.run([exe, "-version"], capture_output=True, text=True, timeout=30, check=False)
    found = re.search(r'version "(\d+)(?:\.(\d+))?', out.stderr + out.stdout)
    if not found:
        raise ServiceError(f"could not tell the Java version from `java -version`: {out.stderr!r}")
    major = int(found.group(1))
    if major == 1 and found.group(2):  # "1.8.0" style
        major = int(found.group(2))
    if major < 17:
        raise ServiceError(f"Java 17+ is required to run Kafka 4.x; found Java {major} at {exe}")
    return major


def jar_dir(settings: ServicesSettings) -> Path:
    """Where the broker's jars are: KAFKA_HOME/libs, else the Maven-resolved cache."""
    if settings.kafka_home is not None:
        libs = settings.kafka_home / "libs"
        if not any(libs.glob("kafka_2.13-*.jar")):
            raise ServiceError(f"KAFKA_HOME={settings.kafka_home} holds no libs/kafka_2.13-*.jar")
        return libs
    return settings.cache_dir / f"kafka-{settings.kafka_version}" / "libs"


def fetch(settings: ServicesSettings, *, log: bool = True) -> tuple[Path, bool]:
    """Make sure the jars are there; returns (directory, whether anything was downloaded)."""
    libs = jar_dir(settings)
    if settings.kafka_home is not None or (libs / MARKER).exists():
        return libs, False
    mvn = shutil.which("mvn")
    if mvn is None:
        raise ServiceError(
            "Maven (`mvn`) is needed once to fetch the Kafka jars from Maven Central; install it "
            "(Debian: apt-get install maven) or set KAFKA_HOME to an unpacked Kafka release"
        )
    if log:
        print(
            f"fetching Apache Kafka {settings.kafka_version} jars from Maven Central "
            f"into {libs} (once)...",
            file=sys.stderr,
            flush=True,
        )
    libs.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=libs.parent, prefix=".fetch-") as tmp:
        Path(tmp, "pom.xml").write_text(POM.format(version=settings.kafka_version))
        out = Path(tmp, "libs")
        proc = subprocess.run(
            [
                mvn,
                "-q",
                "-B",
                "dependency:copy-dependencies",
                f"-DoutputDirectory={out}",
                "-DincludeScope=runtime",
            ],
            cwd=tmp,
            capture_output=True,
            text=True,
            timeout=1200,
            check=False,
        )
        if proc.returncode != 0 or not any(out.glob("kafka_2.13-*.jar")):
            tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-15:])
            raise ServiceError(
                f"mvn could not resolve org.apache.kafka:kafka_2.13:"
                f"{settings.kafka_version}:\n{tail}"
            )
        (out / MARKER).write_text(settings.kafka_version + "\n")
        shutil.rmtree(libs, ignore_errors=True)
        out.rename(libs)  # atomic: a half-fetched directory is never taken for a complete one
    return libs, True


@dataclass(frozen=True)
class Status:
    running: bool
    pid: int | None
    bootstrap: str
    state_dir: Path
    log: Path


class LocalKafka:
    """One broker+controller node whose files all live under ``state_dir/kafka``."""

    def __init__(
        self, settings: ServicesSettings, extra_properties: dict[str, str] | None = None
    ) -> None:
        self.settings = settings
        # appended to server.properties (a later key wins): e.g. an extra SSL listener
        self.extra_properties = dict(extra_properties or {})
        #: more arguments for the first ``kafka-storage format`` (``--add-scram ...``: SCRAM
        #: users a KRaft cluster must know before it starts)
        self.format_args: list[str] = []
        self.home = settings.state_dir / "kafka"
        self.pid_file = self.home / "kafka.pid"
        self.log_file = self.home / "server.log"
        self.bootstrap = f"{settings.kafka_host}:{settings.kafka_port}"

    @classmethod
    def ephemeral(
        cls,
        settings: ServicesSettings,
        state_dir: Path,
        extra_properties: dict[str, str] | None = None,
    ) -> LocalKafka:
        """A broker on free loopback ports with its state in ``state_dir`` (tests, benchmarks)."""
        return cls(
            settings.model_copy(
                update={
                    "state_dir": state_dir,
                    "kafka_host": "127.0.0.1",
                    "kafka_port": free_port(),
                    "kafka_controller_port": free_port(),
                }
            ),
            extra_properties,
        )

    def pid(self) -> int | None:
        try:
            pid = int(self.pid_file.read_text().strip())
        except (OSError, ValueError):
            return None
        return pid if process_alive(pid) else None

    def status(self) -> Status:
        pid = self.pid()
        return Status(
            pid is not None and _answers(self.settings.kafka_host, self.settings.kafka_port),
            pid,
            self.bootstrap,
            self.home,
            self.log_file,
        )

    def up(self) -> tuple[Status, bool]:
        """Start the broker unless it runs; returns (status, whether jars were downloaded)."""
        java_major()
        libs, downloaded = fetch(self.settings)
        if self.pid() is not None:
            self._wait_ready()
            return self.status(), downloaded
        s = self.settings
        for port in (s.kafka_port, s.kafka_controller_port):
            if _answers(s.kafka_host, port):
                raise ServiceError(
                    f"port {s.kafka_host}:{port} is already in use by another "
                    "process; choose others with GPUGAP_SERVICES_KAFKA_PORT / "
                    "GPUGAP_SERVICES_KAFKA_CONTROLLER_PORT"
                )
        data = self.home / "data"
        data.mkdir(parents=True, exist_ok=True)
        props = self.home / "server.properties"
        props.write_text(
            SERVER.format(
                host=s.kafka_host, port=s.kafka_port, cport=s.kafka_controller_port, data=data
            )
            + "".join(f"{k}={v}\n" for k, v in self.extra_properties.items())
        )
        log4j = self.home / "log4j2.properties"
        log4j.write_text(LOG4J2.format(log=self.log_file))
        java = [
            shutil.which("java") or "java",
            f"-Xmx{s.kafka_heap}",
            f"-Xms{s.kafka_heap}",
            "-XX:+UseG1GC",
            "-Djava.awt.headless=true",
            f"-Dlog4j2.configurationFile={log4j}",
            "-cp",
            f"{libs}/*",
        ]
        if not (data / "meta.properties").exists():
            cluster_id = "-"
            while cluster_id.startswith("-"):  # the tool would take it for an option (1 in 64)
                cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
            fmt = subprocess.run(
                [
                    *java,
                    "kafka.tools.StorageTool",
                    "format",
                    "-t",
                    cluster_id,
                    "-c",
                    str(props),
                    "--ignore-formatted",
                    *self.format_args,
                ],
                capture_output=True,
                text=True,
                timeout=120,
                check=False,
            )
            if fmt.returncode != 0:
                raise ServiceError(f"formatting Kafka storage failed:\n{fmt.stdout}{fmt.stderr}")
        with open(self.home / "stdout.log", "ab") as out:
            proc = subprocess.Popen(
                [*java, "kafka.Kafka", str(props)],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        self.pid_file.write_text(f"{proc.pid}\n")
        try:
            self._wait_ready(proc)
        except BaseException:
            self.down()
            raise
        return self.status(), downloaded

    def _wait_ready(self, proc: subprocess.Popen[bytes] | None = None) -> None:
        deadline = time.monotonic() + self.settings.kafka_start_timeout_s
        while time.monotonic() < deadline:
            if proc is not None and proc.poll() is not None:
                raise ServiceError(
                    f"Kafka exited with code {proc.returncode} while starting; "
                    f"last lines of {self.home / 'stdout.log'}:\n"
                    + _tail(self.home / "stdout.log")
                    + _tail(self.log_file)
                )
            if broker_ready(self.bootstrap):
                return
            time.sleep(0.5)
        raise ServiceError(
            f"Kafka did not answer on {self.bootstrap} within "
            f"{self.settings.kafka_start_timeout_s:.0f}s; see {self.log_file}"
        )

    def down(self, timeout_s: float = 30.0) -> bool:
        """Stop the broker by PID (TERM, then KILL); returns whether one was running."""
        pid = self.pid()
        if pid is None:
            self.pid_file.unlink(missing_ok=True)
            return False
        _signal(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        while process_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        if process_alive(pid):
            _signal(pid, signal.SIGKILL)
            while process_alive(pid):
                time.sleep(0.1)
        self.pid_file.unlink(missing_ok=True)
        return True


def _signal(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)


def process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie child of ours is dead: reap it
        done, _ = os.waitpid(pid, os.WNOHANG)
        return done == 0
    except ChildProcessError:  # not our child: a zombie shows state Z in /proc
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return False
        return stat.rsplit(")", 1)[-1].split()[0] != "Z"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _answers(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def broker_ready(target: str | KafkaSettings) -> bool:
    """The broker answers metadata requests and has a controller (not just an open port).
    ``target``: a plaintext bootstrap address, or settings (their TLS/SASL options are used)."""
    if isinstance(target, KafkaSettings):
        bootstrap = target.bootstrap
        options = {**target.client_options(), "request_timeout_ms": 3000}
    else:
        bootstrap = target
        options = {"bootstrap_servers": target, "request_timeout_ms": 3000}
    host, port = bootstrap.split(",")[0].strip().rsplit(":", 1)
    if not _answers(host, int(port)):
        return False
    import asyncio

    from aiokafka.admin import AIOKafkaAdminClient

    async def probe() -> bool:
        admin = AIOKafkaAdminClient(**options)
        try:
            await admin.start()
            cluster = await admin.describe_cluster()
            return bool(cluster.get("brokers")) and cluster.get("controller_id", -1) >= 0
        except Exception:
            return False
        finally:
            await admin.close()

    return asyncio.run(probe())


def _tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) + "\n"
    except OSError:
        return ""
