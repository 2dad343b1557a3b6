"""Session-scoped real services, per-test topics, and a guard against leaked threads/processes.

Services are chosen in the order DESIGN.md gives: an address in the environment, Docker via
testcontainers when a daemon answers, else local processes. Under CI=true a service that
cannot start fails the tests that need it; elsewhere they are skipped with the reason.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import pytest
from pydantic import SecretStr

from gpugap.services.kafka import LocalKafka, broker_ready
from groundfloor.settings import ClickHouseSettings, KafkaSettings, ServicesSettings
from schemas import Record, Topic, decode
from schemas.errors import GpugapError
from tests.slurm_cluster import SlurmCluster

if TYPE_CHECKING:
    from tests.kafka_tls import TlsBroker
    from tests.kube_apiserver import KubeApiServer

CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
M = TypeVar("M", bound=Record)


def run_gpugap(
    args: list[str], env: dict[str, str], timeout: float = 180
) -> subprocess.CompletedProcess[str]:
    """``gpugap ARGS`` as a user runs it (a child process with ``env``); it must exit 0."""
    done = subprocess.run(
        [sys.executable, "-m", "gpugap", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done


@dataclass(frozen=True)
class WorkerRun:
    """What ``gpugap worker`` said on stopping: records read, records written per output
    topic, dead letters per kind (its last stderr line), and the whole stderr."""

    messages: int
    counts: dict[str, int]
    dead: dict[str, int]
    stderr: str


def run_worker(
    kafka: KafkaSettings,
    *args: str,
    env: dict[str, str] | None = None,
    idle_timeout_s: float = 3.0,
    timeout: float = 600,
) -> WorkerRun:
    """``gpugap worker`` as a site runs it, in a child process, until it has been idle for
    ``idle_timeout_s`` after flushing (events of any age: ``--backfill``)."""
    env = env or {
        **os.environ,
        "GPUGAP_KAFKA_BOOTSTRAP": kafka.bootstrap,
        "GPUGAP_KAFKA_TOPIC_PREFIX": kafka.topic_prefix,
        "GPUGAP_LOG_LEVEL": "WARNING",
    }
    flags = ["--http", "", "--idle-flush", "1", "--idle-timeout", str(idle_timeout_s)]
    done = run_gpugap(["worker", *flags, "--backfill", *args], env, timeout=timeout)
    summary = re.search(
        r"worker: ([\d,]+) messages .*? -> (.*); dead letters \{(.*)\}", done.stderr
    )
    assert summary is not None, done.stderr[-3000:]
    counts = re.findall(r"([\w.-]+): ([\d,]+)", summary[2])
    return WorkerRun(
        messages=int(summary[1].replace(",", "")),
        counts={k: int(v.replace(",", "")) for k, v in counts},
        dead={k: int(v) for k, v in re.findall(r"'(\w+)': (\d+)", summary[3])},
        stderr=done.stderr,
    )


def unavailable(what: str) -> None:
    if CI:
        pytest.fail(f"{what} (CI=true: a service the tests need must start)")
    pytest.skip(what)


def docker_answers() -> bool:
    try:
        import docker

        client = docker.from_env(timeout=3)
        try:
            return bool(client.ping())
        finally:
            client.close()
    except Exception:
        return False


@pytest.fixture(scope="session")
def kafka_bootstrap(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    given = os.environ.get("GPUGAP_KAFKA_BOOTSTRAP")
    if given:
        if not broker_ready(given):
            unavailable(f"GPUGAP_KAFKA_BOOTSTRAP={given} does not answer")
        yield given
        return
    if docker_answers():
        from testcontainers.community.kafka import KafkaContainer

        with KafkaContainer().with_kraft() as container:
            yield container.get_bootstrap_server()
        return
    kafka = LocalKafka.ephemeral(ServicesSettings(), tmp_path_factory.mktemp("kafka"))
    try:
        kafka.up()
    except GpugapError as exc:
        kafka.down()
        unavailable(f"could not start a local Kafka broker: {exc}")
    try:
        yield kafka.bootstrap
    finally:
        kafka.down()


@pytest.fixture
def kafka(kafka_bootstrap: str) -> Iterator[KafkaSettings]:
    """Settings for a broker namespace of this test's own: every topic gets a unique prefix,
    and the test's topics are deleted afterwards."""
    prefix = f"t{uuid.uuid4().hex[:10]}."
    settings = KafkaSettings(bootstrap=kafka_bootstrap, topic_prefix=prefix, linger_ms=5)
    yield settings
    asyncio.run(_delete_topics(kafka_bootstrap, prefix))


@pytest.fixture(scope="session")
def kafka_tls_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsBroker]:
    """A local broker with a mutual-TLS listener and the test PKI (tests/kafka_tls.py). Always
    the local one (the listener and its certificates are the test's own); a broker that
    cannot start fails the tests that need it, in CI or not."""
    from tests.kafka_tls import start_tls_broker

    try:
        broker = start_tls_broker(tmp_path_factory.mktemp("kafka-tls"))
    except (GpugapError, OSError) as exc:
        pytest.fail(f"could not start a local Kafka broker with a TLS listener: {exc}")
    try:
        yield broker
    finally:
        broker.kafka.down()


@pytest.fixture
def kafka_tls(kafka_tls_broker: TlsBroker) -> Iterator[KafkaSettings]:
    """Like ``kafka``, on the broker's SSL listener: security_protocol=SSL, the test CA, a
    client certificate and its encrypted key."""
    prefix = f"t{uuid.uuid4().hex[:10]}."
    yield kafka_tls_broker.settings(topic_prefix=prefix, linger_ms=5)
    asyncio.run(_delete_topics(kafka_tls_broker.plain_bootstrap, prefix))


async def create_topics(settings: KafkaSettings, names: list[str], partitions: int = 1) -> None:
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic

    admin = AIOKafkaAdminClient(**settings.client_options())
    await admin.start()
    try:
        await admin.create_topics(
            [NewTopic(settings.topic_prefix + n, partitions, 1) for n in names]
        )
    finally:
        await admin.close()


async def read_topic(
    kafka: KafkaSettings, topic: Topic[M], expected: int, settle_s: float = 0.0
) -> list[M]:
    """Every record of one of the test's topics from the start: at least ``expected`` of them
    (and whatever else arrives within ``settle_s`` after, to catch extras)."""
    from aiokafka import AIOKafkaConsumer

    consumer = AIOKafkaConsumer(
        topic.qualified(kafka.topic_prefix),
        **kafka.client_options(),
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        # a topic a producer just auto-created may answer "leader not available" on the
        # first metadata request; the default refresh (5 min) would outlast the timeout
        metadata_max_age_ms=2000,
    )
    await consumer.start()
    out: list[M] = []
    try:
        async with asyncio.timeout(60 + settle_s):
            while len(out) < expected:
                for msgs in (await consumer.getmany(timeout_ms=500)).values():
                    out += [decode(topic, m.value) for m in msgs]
            if settle_s:
                await asyncio.sleep(settle_s)
                for msgs in (await consumer.getmany(timeout_ms=500)).values():
                    out += [decode(topic, m.value) for m in msgs]
    finally:
        await consumer.stop()
    return out


async def _delete_topics(bootstrap: str, prefix: str) -> None:
    from aiokafka.admin import AIOKafkaAdminClient

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        mine = [t for t in await admin.list_topics() if t.startswith(prefix)]
        if mine:
            await admin.delete_topics(mine)
    finally:
        await admin.close()


# --- ClickHouse ------------------------------------------------------------------------------

CLICKHOUSE_PASSWORD = "test-password-1"
READER_PASSWORD = "reader-password-1"


@pytest.fixture(scope="session")
def clickhouse_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClickHouseSettings]:
    """ClickHouse for the session: GPUGAP_CLICKHOUSE_URL (with GPUGAP_CLICKHOUSE_USER/PASSWORD),
    else testcontainers when Docker answers, else the embedded endpoint on a free port."""
    given = os.environ.get("GPUGAP_CLICKHOUSE_URL")
    if given:
        settings = ClickHouseSettings()
        if not _clickhouse_answers(settings):
            unavailable(f"GPUGAP_CLICKHOUSE_URL={given} does not answer")
        yield settings
        return
    if docker_answers():
        from testcontainers.community.clickhouse import ClickHouseContainer

        with ClickHouseContainer(
            "clickhouse/clickhouse-server:24.8", password=CLICKHOUSE_PASSWORD
        ) as ch:
            port = ch.get_exposed_port(8123)
            yield ClickHouseSettings(
                url=f"http://{ch.get_container_host_ip()}:{port}",
                user=ch.username,
                password=CLICKHOUSE_PASSWORD,
            )
        return
    from gpugap.services.kafka import free_port
    from warehouse.embedded.process import EmbeddedClickHouse

    root = tmp_path_factory.mktemp("clickhouse")
    server = EmbeddedClickHouse(
        root / "data",
        free_port(),
        env={
            "GPUGAP_CLICKHOUSE_PASSWORD": CLICKHOUSE_PASSWORD,
            "GPUGAP_CLICKHOUSE_READONLY_PASSWORD": READER_PASSWORD,
        },
    )
    try:
        server.start()
    except GpugapError as exc:
        unavailable(f"could not start the embedded ClickHouse endpoint: {exc}")
    try:
        yield ClickHouseSettings(url=server.url, password=CLICKHOUSE_PASSWORD)
    finally:
        server.stop()


def _clickhouse_answers(settings: ClickHouseSettings) -> bool:
    from warehouse.embedded.process import answers

    return answers(settings.url)


@pytest.fixture
def clickhouse(clickhouse_server: ClickHouseSettings) -> Iterator[ClickHouseSettings]:
    """A database of this test's own, with the migrations applied; dropped afterwards."""
    from warehouse.client import connect
    from warehouse.migrate import migrate

    settings = clickhouse_server.model_copy(update={"database": f"t{uuid.uuid4().hex[:10]}"})
    migrate(settings)
    yield settings
    admin = connect(settings, database=False)
    try:
        admin.command(f"DROP DATABASE IF EXISTS `{settings.database}`")
    finally:
        admin.close()


def _children() -> set[int]:
    me = str(os.getpid())
    found = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[1] == me and fields[0] != "Z":
            found.add(int(stat.parent.name))
    return found


@pytest.fixture(autouse=True)
def no_leaks() -> Iterator[None]:
    """Fail a test that leaves threads or child processes running."""
    threads, children = set(threading.enumerate()), _children()
    yield
    deadline = time.monotonic() + 5
    while True:
        extra_threads = [t for t in threading.enumerate() if t not in threads and t.is_alive()]
        extra_children = _children() - children
        if not (extra_threads or extra_children) or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert not extra_threads, f"test left threads running: {[t.name for t in extra_threads]}"
    assert not extra_children, f"test left child processes running: {sorted(extra_children)}"


# --- a real Slurm (tests/slurm_cluster.py), for the tests marked ``slurm``: installed
# (apt-get, only when missing), started once per session, stopped by PID at the end


@pytest.fixture(scope="session")
def slurm() -> Iterator[SlurmCluster]:
    if os.geteuid() != 0:
        unavailable("a test Slurm needs root (slurmd, mknod, apt-get)")
    # not under pytest's 0700 tmp: munged and mariadbd run as their own users
    root = Path(tempfile.mkdtemp(prefix="gpugap-slurm-"))
    root.chmod(0o755)
    cluster = SlurmCluster(root)
    try:
        cluster.start()
    except Exception as exc:
        cluster.stop()
        unavailable(f"could not start a test Slurm: {exc}")
    try:
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)


# the demo's day (tests/demo_data.py, ~100 s), loaded once for the tests that read it
@dataclass
class DemoWarehouse:
    settings: ClickHouseSettings  # the admin's, on the demo's database
    admin: Any  # a clickhouse-connect client
    loaded: dict[str, Any]  # tests/demo_data.load's counts and timings

    def one(self, sql: str, **params: Any) -> Any:
        return self.admin.query(sql, parameters=params).result_rows[0][0]

    def rows(self, sql: str, **params: Any) -> list[Any]:
        return list(self.admin.query(sql, parameters=params).result_rows)


@pytest.fixture(scope="session")
def demo_warehouse(clickhouse_server: ClickHouseSettings) -> Iterator[DemoWarehouse]:
    from tests.demo_data import load
    from warehouse.client import connect
    from warehouse.migrate import migrate

    settings = clickhouse_server.model_copy(
        update={
            "database": f"web{uuid.uuid4().hex[:10]}",
            "readonly_password": clickhouse_server.readonly_password or SecretStr(READER_PASSWORD),
        }
    )
    migrate(settings)
    loaded = load(settings)
    admin = connect(settings)
    try:
        yield DemoWarehouse(settings, admin, loaded)
    finally:
        admin.command(f"DROP DATABASE IF EXISTS `{settings.database}`")
        admin.close()


# --- a real kube-apiserver + etcd (tests/kube_apiserver.py), for tests/producers and tests/deploy


@pytest.fixture(scope="session")
def kube(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KubeApiServer]:
    """etcd + kube-apiserver for the session, with deploy/kubernetes-producer-rbac.yaml applied
    and a token of the producer's ServiceAccount (``kube.kubeconfig(path)``); the test's own
    requests go through ``kube.admin`` (system:masters). The first session builds the binaries
    (minutes); a build or start that fails fails the tests under CI=true."""
    from tests.kube_apiserver import ApiError, KubeApiServer, KubeUnavailable, build

    try:
        build()
    except (KubeUnavailable, OSError) as exc:
        unavailable(f"could not build kube-apiserver and etcd: {exc}")
    server = KubeApiServer(tmp_path_factory.mktemp("kube"))
    try:
        server.start()
        server.install_producer_identity()
    except (KubeUnavailable, ApiError, OSError) as exc:
        server.stop()
        unavailable(f"could not start kube-apiserver and etcd: {exc}")
    try:
        yield server
    finally:
        server.stop()


# --- pytest-xdist (make test): a file's tests stay on one worker (its module fixtures start
# once), and the files that read the demo's day go to one worker together, so the ~2 minutes of
# loading it are paid once, not once per worker. The scheduler runs in the controller, which
# collects nothing: it goes by this list, and each worker checks the list against what it
# collected. (Not --dist loadgroup: on pytest 9 its marks never reach the scheduler.)

DEMO_FILES = frozenset(
    {
        "tests/bi/test_dashboard.py",
        "tests/queue/test_demo_queue.py",
        "tests/web/test_api.py",
        "tests/web/test_demo_page.py",
        "tests/web/test_metrics.py",
        "tests/web/test_page.py",
    }
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    on_the_demo = {
        item.path.relative_to(config.rootpath).as_posix()
        for item in items
        if "demo_warehouse" in getattr(item, "fixturenames", ())
    }
    if missing := on_the_demo - DEMO_FILES:
        raise pytest.UsageError(
            f"{sorted(missing)} read the demo_warehouse fixture: add them to "
            "tests/conftest.py's DEMO_FILES (so that one xdist worker loads the demo)"
        )


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    from xdist.scheduler import LoadFileScheduling

    class FilesAndTheDemo(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            file = nodeid.split("::", 1)[0]
            return "the demo's warehouse" if file in DEMO_FILES else file

    return FilesAndTheDemo(config, log)
