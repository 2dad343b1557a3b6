"""The pipeline on a 3-broker Kafka cluster (tests/harness/kafka_cluster.py) through broker faults.

The demo scenario's first 75 minutes are published at 22x (about 205 s) by ``gpugap simulate``
while ``gpugap worker`` and ``gpugap sink clickhouse`` run, each a process of its own as a
site runs them. Mid-stream, in sequence:

(a) the leader of the samples topic is killed (SIGKILL) and started again a few seconds later;
(b) a broker is stopped (SIGTERM) for 60 s, then started;
(c) the active KRaft controller is killed and started again.

Nothing is restarted by the test but the brokers. Afterwards the warehouse must hold exactly
what the simulator's ground truth says (the end-to-end test's comparison, every alert once),
and one row per GPU-minute key. The time each fault cost (until the producer's records, the
worker's commits and the sink's commits moved past the fault) is printed.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import pytest

from gpugap.groundfloor.settings import ClickHouseSettings, KafkaSettings
from gpugap.schemas import TOPICS
from gpugap.schemas.topics import MINUTES, SAMPLES
from gpugap.services.kafka import free_port
from gpugap.sinks.clickhouse.sink import ClickHouseSink
from gpugap.warehouse.client import connect
from tests.harness.kafka_cluster import KafkaCluster
from tests.harness.services import unavailable
from tests.streams.test_end_to_end import processed, verify

pytestmark = pytest.mark.kafka

GPUGAP = [sys.executable, "-m", "gpugap"]
# of the demo day: 36 nodes, 288 GPUs and MIG slices, both schedulers. Not the first hour
# alone: that window ends while a gang is partial, and even a fault-free replay of it (the
# end-to-end test's pipeline) raises idle alerts for the gang's pods that the truth lacks
DURATION = "1h15m"
SPEED = 22  # event-time seconds per wall second: the 75 minutes take about 205 s to publish
WORKER_GROUP = "gpugap-worker"
SINK_GROUP = f"gpugap-sink-{ClickHouseSink.name}"
#: the worker closes its open minutes after this long without input: longer than any stall
#: a fault causes (a flush mid-stall would make the records after it late)
IDLE_FLUSH_S = 30
#: the worker's allowed lateness, event-time seconds. A site's 120 s is 5.5 s of wall time at
#: 22x: while a killed leader stalls the samples 10 s (220 s of event time), a job's event for
#: the node on another topic moves the node's clock on and its stalled samples arrive late
#: (CI, 2026-12-07: 2 late). 600 s is 27 s of wall time, beyond the stalls measured (10-11 s).
LATENESS_S = 600


@pytest.fixture
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaCluster]:
    c = KafkaCluster(tmp_path_factory.mktemp("kafka3"))
    try:
        c.start()
    except Exception as exc:
        c.stop()
        unavailable(f"could not start a 3-node Kafka cluster: {exc}")
    try:
        yield c
    finally:
        c.stop()


async def create_replicated_topics(kafka: KafkaSettings, names: list[str]) -> None:
    """Like tests/harness/topics.py's ``create_topics`` (one partition each, kept forever), with
    every replica: replication factor 3."""
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic

    admin = AIOKafkaAdminClient(**kafka.client_options())
    await admin.start()
    try:
        await admin.create_topics(
            [
                NewTopic(kafka.topic_prefix + n, 1, 3, topic_configs={"retention.ms": "-1"})
                for n in names
            ]
        )
    finally:
        await admin.close()


@dataclass
class Point:
    t: float
    samples_end: int | None  # acknowledged records of the samples topic (the producer's)
    worker_committed: int | None  # the worker group's committed offset on it
    minutes_end: int | None  # the worker's output the sink reads
    sink_committed: int | None  # the sink group's committed offset on it
    worker_processed: int


@dataclass
class Probe:
    """Samples the pipeline's positions every half second in a thread of its own."""

    kafka: KafkaSettings
    worker_port: int
    points: list[Point] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __post_init__(self) -> None:
        self.samples = SAMPLES.qualified(self.kafka.topic_prefix)
        self.minutes = MINUTES.qualified(self.kafka.topic_prefix)
        self.worker_group = self.kafka.topic_prefix + WORKER_GROUP

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="fault-probe", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)

    def _run(self) -> None:
        asyncio.run(self._loop())

    async def _loop(self) -> None:
        while not self._stop.is_set():
            t = time.monotonic()
            try:
                async with asyncio.timeout(8):
                    ends = await self._ends()
                    worker = await self._committed(self.worker_group, self.samples)
                    sink = await self._committed(SINK_GROUP, self.minutes)
            except Exception as exc:  # a broker is down: this sample knows nothing
                self.errors.append(repr(exc)[:200])
                ends, worker, sink = {}, None, None
            self.points.append(
                Point(
                    t,
                    ends.get(self.samples),
                    worker,
                    ends.get(self.minutes),
                    sink,
                    await asyncio.to_thread(processed, self.worker_port),
                )
            )
            await asyncio.sleep(max(0.0, 0.5 - (time.monotonic() - t)))

    async def _ends(self) -> dict[str, int]:
        from aiokafka import AIOKafkaConsumer, TopicPartition

        consumer = AIOKafkaConsumer(
            **{**self.kafka.client_options(), "request_timeout_ms": 5000},
            enable_auto_commit=False,
        )
        await consumer.start()
        try:
            tps = [TopicPartition(self.samples, 0), TopicPartition(self.minutes, 0)]
            return {tp.topic: off for tp, off in (await consumer.end_offsets(tps)).items()}
        finally:
            await consumer.stop()

    async def _committed(self, group: str, topic: str) -> int | None:
        from aiokafka import TopicPartition
        from aiokafka.admin import AIOKafkaAdminClient

        admin = AIOKafkaAdminClient(**{**self.kafka.client_options(), "request_timeout_ms": 5000})
        await admin.start()
        try:
            offsets = await admin.list_consumer_group_offsets(group)
        finally:
            await admin.close()
        meta = offsets.get(TopicPartition(topic, 0))
        return None if meta is None or meta.offset < 0 else int(meta.offset)

    def at(self, t: float) -> Point:
        """The last point sampled before ``t`` that knew every position."""
        known = [p for p in self.points if p.t <= t and None not in (p.samples_end, p.minutes_end)]
        assert known, "no position known before the fault"
        return known[-1]

    def recovery(self, fault_at: float) -> dict[str, float | None]:
        """Seconds from ``fault_at`` until: the producer's records reach the samples topic
        again; the worker has committed past what the producer had written by then; the sink
        has committed past what the worker had written by then. None: not (yet) seen."""
        before = self.at(fault_at)
        after = [p for p in self.points if p.t > fault_at]
        out: dict[str, float | None] = {"producer": None, "worker": None, "sink": None}
        produced = next(
            (p for p in after if (p.samples_end or -1) > (before.samples_end or 0)), None
        )
        if produced is None:
            return out
        out["producer"] = produced.t - fault_at
        worked = next(
            (
                p
                for p in after
                if p.t >= produced.t and (p.worker_committed or -1) >= (produced.samples_end or 0)
            ),
            None,
        )
        if worked is None:
            return out
        out["worker"] = worked.t - fault_at
        stored = next(
            (
                p
                for p in after
                if p.t >= worked.t and (p.sink_committed or -1) >= (worked.minutes_end or 0)
            ),
            None,
        )
        if stored is not None:
            out["sink"] = stored.t - fault_at
        return out

    def wait_recovered(self, fault_at: float, what: str, timeout_s: float = 90) -> str:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            r = self.recovery(fault_at)
            if None not in r.values():
                worst = max(v for v in r.values() if v is not None)
                return (
                    f"recovered from {what} in {worst:.1f} s (producer {r['producer']:.1f} s, "
                    f"worker {r['worker']:.1f} s, sink {r['sink']:.1f} s)"
                )
            time.sleep(0.5)
        raise AssertionError(
            f"the pipeline did not recover from {what} within {timeout_s:.0f} s: "
            f"{self.recovery(fault_at)}; last positions {self.points[-3:]}; "
            f"probe errors {self.errors[-3:]}"
        )


def _spawn(args: list[str], env: dict[str, str], log: IO[bytes]) -> subprocess.Popen[bytes]:
    return subprocess.Popen([*GPUGAP, *args], env=env, stdout=log, stderr=subprocess.STDOUT)


def _tail(path: Path, n: int = 40) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-n:])


def test_pipeline_survives_broker_faults(
    cluster: KafkaCluster, clickhouse: ClickHouseSettings, tmp_path: Path
) -> None:
    t_begin = time.monotonic()
    kafka = KafkaSettings(
        bootstrap=cluster.bootstrap, topic_prefix=f"t{uuid.uuid4().hex[:10]}.", linger_ms=5
    )
    asyncio.run(create_replicated_topics(kafka, list(TOPICS)))
    truth = tmp_path / "truth.json"
    env = {
        **os.environ,
        "GPUGAP_KAFKA_BOOTSTRAP": kafka.bootstrap,
        "GPUGAP_KAFKA_TOPIC_PREFIX": kafka.topic_prefix,
        "GPUGAP_LOG_LEVEL": os.environ.get("E2E_LOG_LEVEL", "WARNING"),
        "GPUGAP_CLICKHOUSE_URL": clickhouse.url,
        "GPUGAP_CLICKHOUSE_USER": clickhouse.user,
        "GPUGAP_CLICKHOUSE_DATABASE": clickhouse.database,
        "GPUGAP_CLICKHOUSE_PASSWORD": (
            clickhouse.password.get_secret_value() if clickhouse.password else ""
        ),
    }
    worker_port = free_port()
    logs = {name: tmp_path / f"{name}.log" for name in ("worker", "sink", "simulate")}
    files = {name: open(path, "wb") for name, path in logs.items()}  # noqa: SIM115
    procs: dict[str, subprocess.Popen[bytes]] = {}
    probe = Probe(kafka, worker_port)

    def say(line: str) -> None:  # the lines the fault report quotes (pytest -s)
        print(line, flush=True)

    def check_running() -> None:
        for name, p in procs.items():
            if name != "simulate" and p.poll() is not None:
                raise AssertionError(
                    f"{name} exited ({p.returncode}) mid-run:\n{_tail(logs[name])}"
                )
        sim = procs.get("simulate")
        if sim is not None and sim.poll() not in (None, 0):
            raise AssertionError(
                f"the simulator failed ({sim.returncode}):\n{_tail(logs['simulate'])}"
            )

    try:
        procs["sink"] = _spawn(["sink", "clickhouse"], env, files["sink"])
        procs["worker"] = _spawn(
            [
                "worker",
                "--backfill",
                *("--lateness", str(LATENESS_S)),
                *("--http", f"127.0.0.1:{worker_port}"),
                *("--idle-flush", str(IDLE_FLUSH_S), "--idle-timeout", "5"),
            ],
            env,
            files["worker"],
        )
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and not probe_ready(worker_port):
            check_running()
            time.sleep(0.5)
        procs["simulate"] = _spawn(
            [
                "simulate",
                *("--scenario", "demo", "--duration", DURATION, "--speed", str(SPEED)),
                *("--truth", str(truth)),
            ],
            env,
            files["simulate"],
        )
        probe.start()
        t_publish = time.monotonic()

        def flowing() -> None:
            """Wait until records go all the way through (the sink commits the worker's)."""
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                check_running()
                last = probe.points[-1] if probe.points else None
                if last is not None and (last.sink_committed or 0) > 0:
                    return
                time.sleep(0.5)
            raise AssertionError(f"no minutes reached the sink: {probe.points[-3:]}")

        flowing()
        time.sleep(5)

        # (a) the samples partition's leader, killed, back after a few seconds
        samples = SAMPLES.qualified(kafka.topic_prefix)
        leader = cluster.leader_of(samples)
        fault = time.monotonic()
        cluster.kill_node(leader)
        time.sleep(4)
        check_running()
        cluster.start_node(leader)
        say(probe.wait_recovered(fault, f"leader kill (node {leader} of {samples})"))
        cluster.wait_fully_replicated()
        say(f"  every partition fully replicated again {time.monotonic() - fault:.1f} s after it")
        check_running()

        # (b) a broker stopped for 60 s (the samples leader again: a controlled shutdown
        # moves its leaderships first)
        stopped = cluster.leader_of(samples)
        fault = time.monotonic()
        took = cluster.stop_node(stopped)
        say(f"broker {stopped} stopped (SIGTERM) in {took:.1f} s")
        say(probe.wait_recovered(fault, f"broker stop (node {stopped}, 60 s)"))
        while time.monotonic() - fault < 60:
            check_running()
            time.sleep(0.5)
        cluster.start_node(stopped)
        say(f"  cluster fully replicated {cluster.wait_fully_replicated():.1f} s after the restart")
        check_running()

        # (c) the active KRaft controller, killed, back after a few seconds
        controller = cluster.controller_id()
        fault = time.monotonic()
        cluster.kill_node(controller)
        time.sleep(4)
        check_running()
        new_controller = cluster.controller_id()
        cluster.start_node(controller)
        say(
            probe.wait_recovered(
                fault, f"controller kill (node {controller}; node {new_controller} took over)"
            )
        )
        cluster.wait_fully_replicated()
        say(f"  every partition fully replicated again {time.monotonic() - fault:.1f} s after it")
        faults_done = time.monotonic()
        assert procs["simulate"].poll() is None, (
            "the simulator finished before the faults did: they were not mid-stream"
        )

        # the end: the simulator's last record, the worker idle (it flushes and exits), the
        # sink caught up with everything the worker wrote
        assert procs["simulate"].wait(timeout=300) == 0, _tail(logs["simulate"])
        t_published = time.monotonic()
        assert procs["worker"].wait(timeout=IDLE_FLUSH_S + 120) == 0, _tail(logs["worker"])
        wait_sink_caught_up(kafka, cluster)
        procs["sink"].send_signal(signal.SIGTERM)
        assert procs["sink"].wait(timeout=60) == 0, _tail(logs["sink"])
    finally:
        probe.stop()
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()
        for f in files.values():
            f.close()

    worker_log = logs["worker"].read_text(errors="replace")
    summary = re.search(r"worker: ([\d,]+) messages .*dead letters \{(.*)\}", worker_log)
    assert summary is not None, worker_log[-3000:]
    dead = {k: int(v) for k, v in re.findall(r"'(\w+)': (\d+)", summary[2])}
    say(
        f"published in {t_published - t_publish:.0f} s (faults done after "
        f"{faults_done - t_publish:.0f} s), whole test {time.monotonic() - t_begin:.0f} s; "
        f"worker: {summary[1]} messages, dead letters {dead}"
    )
    # what the faults must not cost: records judged late (they were not, before the faults)
    assert dead.get("late", 0) == 0, dead

    try:
        verify(clickhouse, json.loads(truth.read_text()), alerts_exactly_once=True)
        assert_one_row_per_minute(clickhouse)
    except AssertionError as exc:  # CI keeps only the output: what the processes said
        said = "\n".join(f"--- {n} log ---\n{_tail(path, 60)}" for n, path in logs.items())
        raise AssertionError(f"{exc}\n{said}") from exc
    replicas = {
        d["topic"]: len(d["partitions"][0]["replicas"])
        for d in cluster.describe()
        if d["topic"].startswith(kafka.topic_prefix) and d.get("partitions")
    }
    # every topic the pipeline made survives a lost broker (Faust's leader topic had 1)
    assert not [t for t, n in replicas.items() if n < 3], replicas


def probe_ready(port: int) -> bool:
    """The worker answers /metrics (its consumer has started)."""
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=1) as r:
            return bool(r.status == 200)
    except OSError:
        return False


def wait_sink_caught_up(
    kafka: KafkaSettings, cluster: KafkaCluster, timeout_s: float = 120
) -> None:
    """The sink group has committed every record of every topic it reads."""
    from aiokafka import AIOKafkaConsumer
    from aiokafka.admin import AIOKafkaAdminClient

    names = {t.qualified(kafka.topic_prefix) for t in ClickHouseSink.topics}

    async def lag() -> dict[Any, int]:
        admin = AIOKafkaAdminClient(**kafka.client_options())
        consumer = AIOKafkaConsumer(**kafka.client_options(), enable_auto_commit=False)
        await admin.start()
        await consumer.start()
        try:
            committed = await admin.list_consumer_group_offsets(SINK_GROUP)
            tps = [tp for tp in (await asyncio.to_thread(_partitions, cluster, sorted(names)))]
            ends = await consumer.end_offsets(tps)
        finally:
            await consumer.stop()
            await admin.close()
        out = {}
        for tp, end in ends.items():
            meta = committed.get(tp)
            done = meta.offset if meta is not None and meta.offset >= 0 else 0
            if end > done:
                out[tp] = end - done
        return out

    deadline = time.monotonic() + timeout_s
    left: dict[Any, int] = {}
    while time.monotonic() < deadline:
        left = asyncio.run(lag())
        if not left:
            return
        time.sleep(0.5)
    raise AssertionError(f"the sink did not catch up within {timeout_s:.0f} s: lag {left}")


def _partitions(cluster: KafkaCluster, names: list[str]) -> list[Any]:
    from aiokafka import TopicPartition

    return [
        TopicPartition(d["topic"], p["partition"])
        for d in cluster.describe(names)
        for p in d.get("partitions") or ()
    ]


def assert_one_row_per_minute(clickhouse: ClickHouseSettings) -> None:
    """One stored row per GPU-minute key (the table's sorting key), not only after FINAL:
    nothing the faults made anyone send again reached the warehouse twice."""
    client = connect(clickhouse)
    try:
        key = "cluster, node, gpu_uuid, minute, allocation_id"
        total, distinct = client.query(
            f"SELECT count(), uniqExact({key}) FROM gpu_minutes"
        ).result_rows[0]
        doubled = client.query(
            f"SELECT {key}, count() AS n FROM gpu_minutes GROUP BY {key} HAVING n > 1 LIMIT 5"
        ).result_rows
    finally:
        client.close()
    assert total > 0
    assert total == distinct and not doubled, (total, distinct, doubled)
