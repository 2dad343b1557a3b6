"""Session-scoped real services, per-test topics, and a guard against leaked threads/processes.

Services are chosen in the order DESIGN.md gives: an address in the environment, Docker via
testcontainers when a daemon answers, else local processes. Under CI=true a service that
cannot start fails the tests that need it; elsewhere they are skipped with the reason.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from pydantic import SecretStr

from gpugap.groundfloor.settings import ClickHouseSettings, KafkaSettings, ServicesSettings
from gpugap.schemas.errors import GpugapError
from gpugap.services.kafka import LocalKafka, broker_ready
from tests.harness.services import docker_answers, unavailable
from tests.harness.slurm_cluster import SlurmCluster
from tests.harness.warehouse import CLICKHOUSE_PASSWORD, READER_PASSWORD, DemoWarehouse

if TYPE_CHECKING:
    from tests.harness.kafka_tls import TlsBroker
    from tests.harness.kube_apiserver import KubeApiServer


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
    """A local broker with a mutual-TLS listener and the test PKI (harness/kafka_tls.py). Always
    the local one (the listener and its certificates are the test's own); a broker that
    cannot start fails the tests that need it, in CI or not."""
    from tests.harness.kafka_tls import start_tls_broker

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
    from tests.harness.embedded_clickhouse import EmbeddedClickHouse

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
    from tests.harness.embedded_clickhouse import answers

    return answers(settings.url)


@pytest.fixture
def clickhouse(clickhouse_server: ClickHouseSettings) -> Iterator[ClickHouseSettings]:
    """A database of this test's own, with the migrations applied; dropped afterwards."""
    from gpugap.warehouse.client import connect
    from gpugap.warehouse.migrate import migrate

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
def no_leaks(request: pytest.FixtureRequest) -> Iterator[None]:
    """Fail a test that leaves threads or child processes running (but those its module says
    it keeps across tests: a module-level ``module_children()``)."""
    threads, children = set(threading.enumerate()), _children()
    yield
    kept = getattr(request.module, "module_children", None)
    children |= kept() if kept is not None else set()
    deadline = time.monotonic() + 5
    while True:
        extra_threads = [t for t in threading.enumerate() if t not in threads and t.is_alive()]
        extra_children = _children() - children
        if not (extra_threads or extra_children) or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert not extra_threads, f"test left threads running: {[t.name for t in extra_threads]}"
    assert not extra_children, f"test left child processes running: {sorted(extra_children)}"


# --- a real Slurm (tests/harness/slurm_cluster.py), for the tests marked ``slurm``: installed
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


# the demo's day (tests/harness/demo_data.py, ~100 s), loaded once for the tests that read it
@pytest.fixture(scope="session")
def demo_warehouse(clickhouse_server: ClickHouseSettings) -> Iterator[DemoWarehouse]:
    from gpugap.warehouse.client import connect
    from gpugap.warehouse.migrate import migrate
    from tests.harness.demo_data import load

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


# --- a real kube-apiserver + etcd (harness/kube_apiserver.py), for tests/producers and tests/deploy


@pytest.fixture(scope="session")
def kube(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KubeApiServer]:
    """etcd + kube-apiserver for the session, with deploy/kubernetes-producer-rbac.yaml applied
    and a token of the producer's ServiceAccount (``kube.kubeconfig(path)``); the test's own
    requests go through ``kube.admin`` (system:masters). The first session builds the binaries
    (minutes); a build or start that fails fails the tests under CI=true."""
    from tests.harness.kube_apiserver import ApiError, KubeApiServer, KubeUnavailable, build

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
        "tests/gpugap/test_job_demo.py",
        "tests/gpugap/test_report_monthly_demo.py",
        "tests/queue/test_demo_queue.py",
        "tests/web/test_api.py",
        "tests/web/test_demo_page.py",
        "tests/web/test_job_page.py",
        "tests/web/test_metrics.py",
        "tests/web/test_page.py",
    }
)


# files that run for minutes, started first so that no worker begins one when the others are
# done (from `pytest --durations`; a file missing here only runs in collection order)
SLOW_FIRST = (
    "tests/streams/test_kafka_faults.py",
    *sorted(DEMO_FILES),
    "tests/producers/backfill/test_slurm.py",
    "tests/producers/slurm/test_live.py",
    "tests/producers/slurm/test_jobcomp_live.py",
    "tests/sinks/test_clickhouse_sink.py",
    "tests/backfill/test_backfill_history.py",
    "tests/streams/test_end_to_end.py",
    "tests/streams/test_scale_out.py",
    "tests/sinks/test_alertmanager.py",
    "tests/queue/test_slurm_order.py",
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    rank = {file: i for i, file in enumerate(SLOW_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.relative_to(config.rootpath).as_posix(), 99))
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

    # xdist hands out the files with the most tests first; the order above (SLOW_FIRST) is
    # what keeps a four-minute single test from starting last
    config.option.loadscopereorder = False

    class FilesAndTheDemo(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            file = nodeid.split("::", 1)[0]
            return "the demo's warehouse" if file in DEMO_FILES else file

    return FilesAndTheDemo(config, log)
