"""Who may publish for a cluster (docs/kafka-trust.md): the broker lets each cluster's producer
principal write its own topics only, and ``GPUGAP_KAFKA_CLUSTER_TOPICS`` tells the consumers
which cluster each topic speaks for. A record that claims another cluster is a dead letter
(kind ``untrusted``) and counts nowhere; without the setting nothing changes.

The broker test runs on a broker that authenticates (SASL/SCRAM) and authorizes every request
(tests/harness/kafka_sasl.py), with the ACLs ``deploy/kafka-acls/kafka-acls.sh`` ships, and the
worker logged in as its own principal with only those rights.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
import uuid
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from gpugap.groundfloor.kafka.consume import DeadLetters, RawMessage
from gpugap.groundfloor.kafka.trust import ClusterTrust
from gpugap.groundfloor.settings import KafkaSettings, load
from gpugap.schemas import DeadLetter, GpuMinute, NodeSample, Record, encode
from gpugap.schemas.errors import ConfigError, FatalError, GpugapError
from gpugap.schemas.models import AllocationEvent, GpuSample, SlurmJobEvent, Transfer
from gpugap.schemas.topics import (
    ALERTS,
    ALLOCATIONS,
    DEAD_LETTER,
    K8S_PODS,
    MINUTES,
    SAMPLES,
    SLURM_JOBS,
    Topic,
)
from gpugap.schemas.types import ActivityMetric, DeadLetterKind, SampleSource
from gpugap.streams.join import Join, check_copartitioned
from tests.harness.commands import run_gpugap
from tests.streams.helpers import Recording, gpu

ROOT = Path(__file__).resolve().parents[2]
ACLS = ROOT / "deploy" / "kafka-acls"
MAPPING = {"cluster-a.*": "cluster-a", "cluster-b.*": "cluster-b"}
T0 = datetime(2026, 11, 2, 10, tzinfo=UTC)


def sample(cluster: str, node: str, t: datetime, activity: float) -> NodeSample:
    return NodeSample(
        cluster=cluster,
        node=node,
        time=t,
        source=SampleSource.SIMULATOR,
        interval_s=10.0,
        gpus=(
            GpuSample(
                uuid=gpu(0), index=0, activity=activity, activity_metric=ActivityMetric.UTILIZATION
            ),
        ),
    )


def samples(
    cluster: str, node: str, t0: datetime, activity: float, n: int = 18
) -> list[NodeSample]:
    """Every 10 s for ``n`` ticks (3 minutes)."""
    return [sample(cluster, node, t0 + timedelta(seconds=10 * i), activity) for i in range(n)]


def slurm_start(cluster: str, job: str, node: str, t: datetime) -> SlurmJobEvent:
    return SlurmJobEvent.model_validate(
        {
            "event_id": f"slurm/{cluster}/{job}/start", "kind": "start", "time": t,
            "source": "hook", "cluster": cluster, "job_id": job, "state": "RUNNING",
            "start_time": t, "nodes": [{"node": node, "gpu_indices": [0]}], "gpus_total": 1,
            "user": "mallory",
        }
    )  # fmt: skip


def trust(prefix: str = "", mapping: dict[str, Any] | None = None) -> ClusterTrust:
    found = ClusterTrust.from_settings(
        KafkaSettings(topic_prefix=prefix, cluster_topics=mapping or MAPPING)
    )
    assert found is not None
    return found


# --- the setting -------------------------------------------------------------------------------


def test_the_setting_comes_from_the_environment_and_a_bad_one_names_the_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(
        "GPUGAP_KAFKA_CLUSTER_TOPICS",
        '{"cluster-a.*": "cluster-a", "gpu.samples.v1.lab": ["lab1", "lab2"]}',
    )
    monkeypatch.setenv("GPUGAP_KAFKA_TOPIC_PREFIX", "ns.")
    mapped = load().kafka.cluster_topic_map()
    assert mapped == {
        "ns.cluster-a.gpu.samples.v1": ("gpu.samples.v1", frozenset({"cluster-a"})),
        "ns.cluster-a.slurm.jobs.v1": ("slurm.jobs.v1", frozenset({"cluster-a"})),
        "ns.cluster-a.k8s.pods.v1": ("k8s.pods.v1", frozenset({"cluster-a"})),
        "ns.cluster-a.transfers.v1": ("transfers.v1", frozenset({"cluster-a"})),
        "ns.gpu.samples.v1.lab": ("gpu.samples.v1", frozenset({"lab1", "lab2"})),
    }
    for bad, why in [
        ('{"cluster-a": "cluster-a"}', "a cluster topic's name is a producer topic"),
        ('{"cluster-a.gpu.minutes.v1": "a"}', "a cluster topic's name is a producer topic"),
        ('{"cluster-a.*": []}', "no cluster"),
        ('{"cluster-*.gpu.samples.v1": "a"}', "'*' only at the end"),
        ('{"a.gpu.samples.v1": "a/b"}', "not a cluster name"),
        ('{"a.*": "a", "a.gpu.samples.v1": "b"}', "mapped twice"),
        # a PREFIXED ACL on "lab." covers "lab.gpu.*" (kafka-acls.sh refuses it too)
        ('{"lab.*": "lab", "lab.gpu.*": "lab-gpu"}', "covers"),
        ('{"lab.*": "lab", "lab.gpu.gpu.samples.v1": "x"}', "covers"),
        ('{"a.*": "cluster a"}', "not a cluster name"),
        ('{"a.*": "-a"}', "not a cluster name"),
    ]:
        monkeypatch.setenv("GPUGAP_KAFKA_CLUSTER_TOPICS", bad)
        with pytest.raises(ConfigError, match="GPUGAP_KAFKA_CLUSTER_TOPICS") as exc:
            load()
        assert why in str(exc.value)
    monkeypatch.delenv("GPUGAP_KAFKA_CLUSTER_TOPICS")
    assert ClusterTrust.from_settings(load().kafka) is None  # the default: no mapping


def test_each_consumer_reads_the_clusters_topics_of_the_kinds_it_reads() -> None:
    from gpugap.sinks.clickhouse.sink import ClickHouseSink
    from gpugap.streams.join import GLOBAL_INPUTS, INPUTS, input_topics

    t = trust("ns.", {**MAPPING, "gpu.samples.v1": ["cluster-c"]})
    assert input_topics("ns.", t) == [
        "ns.gpu.samples.v1", "ns.slurm.jobs.v1", "ns.k8s.pods.v1",
        "ns.cluster-a.gpu.samples.v1", "ns.cluster-a.k8s.pods.v1", "ns.cluster-a.slurm.jobs.v1",
        "ns.cluster-b.gpu.samples.v1", "ns.cluster-b.k8s.pods.v1", "ns.cluster-b.slurm.jobs.v1",
    ]  # fmt: skip
    assert input_topics("ns.", None) == [x.qualified("ns.") for x in INPUTS]
    join = Join(Recording(), "ns.", trust=t)
    assert join.samples_topics == {
        "ns.gpu.samples.v1", "ns.cluster-a.gpu.samples.v1", "ns.cluster-b.gpu.samples.v1"
    }  # fmt: skip
    assert join.global_topics == {x.qualified("ns.") for x in GLOBAL_INPUTS} | {
        f"ns.{c}.{k}" for c in ("cluster-a", "cluster-b") for k in ("slurm.jobs.v1", "k8s.pods.v1")
    }
    # the sink: scheduler events and transfers, no samples
    assert t.topics_for(ClickHouseSink.topics) == [
        f"ns.{c}.{k}"
        for c in ("cluster-a", "cluster-b")
        for k in ("k8s.pods.v1", "slurm.jobs.v1", "transfers.v1")
    ]


def test_a_clusters_samples_topic_must_be_partitioned_like_the_shared_one() -> None:
    check_copartitioned({"gpu.samples.v1": 6, "cluster-a.gpu.samples.v1": 6}, "")
    with pytest.raises(FatalError, match=r"cluster-a\.gpu\.samples\.v1 has 2"):
        check_copartitioned({"gpu.samples.v1": 6, "cluster-a.gpu.samples.v1": 2}, "")


# --- the check, where every consumer decodes ---------------------------------------------------


def raw(topic: str, record: Record, offset: int, partition: int = 0) -> RawMessage:
    return RawMessage(topic, partition, offset, None, encode(record))


def figures(minutes: list[GpuMinute]) -> list[tuple[Any, ...]]:
    """What the minutes say, in a comparable order."""
    return sorted(
        (m.cluster, m.node, m.gpu_uuid, m.minute, m.sample_count, m.activity_avg, m.allocation_id)
        for m in minutes
    )


def alone(records: Sequence[Record]) -> list[tuple[Any, ...]]:
    """The figures of ``records`` alone (no forged ones), from a worker without a mapping."""
    pub = Recording()
    join = Join(pub, "")

    async def go() -> None:
        for i, r in enumerate(sorted(records, key=lambda r: r.time)):  # type: ignore[attr-defined]
            await join.ingest("p", raw(by_kind(r), r, i))
        await join.flush_all()

    asyncio.run(go())
    return figures(pub.of(GpuMinute))


def by_kind(record: Record) -> str:
    return SAMPLES.name if isinstance(record, NodeSample) else SLURM_JOBS.name


def test_a_record_claiming_another_cluster_is_a_dead_letter_and_counts_nowhere() -> None:
    pub = Recording()
    join = Join(pub, "", trust=trust())
    honest_a = samples("cluster-a", "a1", T0, 0.5)
    honest_b = samples("cluster-b", "b1", T0, 0.25)
    # cluster-a's producer speaks for cluster-b's node, on its own topic and on the shared one
    forged = samples("cluster-b", "b1", T0, 1.0)
    forged_job = slurm_start("cluster-b", "666", "b1", T0)

    async def go() -> None:
        offsets = dict.fromkeys(("a", "b", "shared", "a-jobs"), 0)

        async def feed(name: str, topic: str, recs: list[Any]) -> None:
            for r in recs:
                await join.ingest(topic, raw(topic, r, offsets[name]))
                offsets[name] += 1

        await feed("a", "cluster-a.gpu.samples.v1", honest_a + forged[:9])
        await feed("b", "cluster-b.gpu.samples.v1", honest_b)
        await feed("shared", "gpu.samples.v1", forged[9:])
        await feed("a-jobs", "cluster-a.slurm.jobs.v1", [forged_job])
        await join.flush_all()

    asyncio.run(go())
    dead = pub.of(DeadLetter)
    assert {d.kind for d in dead} == {DeadLetterKind.UNTRUSTED}
    by_topic = {t: [d for d in dead if d.source_topic == t] for t in {d.source_topic for d in dead}}
    assert {t: len(ds) for t, ds in by_topic.items()} == {
        "cluster-a.gpu.samples.v1": 9, "gpu.samples.v1": 9, "cluster-a.slurm.jobs.v1": 1,
    }  # fmt: skip
    assert by_topic["cluster-a.gpu.samples.v1"][0].reason == (
        "cluster trust: records on cluster-a.gpu.samples.v1 may claim cluster 'cluster-a' only "
        "(GPUGAP_KAFKA_CLUSTER_TOPICS); this one claims 'cluster-b'"
    )
    assert by_topic["gpu.samples.v1"][0].reason == (
        "cluster trust: gpu.samples.v1 records of cluster 'cluster-b' are accepted on "
        "cluster-b.gpu.samples.v1 only (GPUGAP_KAFKA_CLUSTER_TOPICS), not on gpu.samples.v1"
    )
    assert dead[0].value_b64  # the original bytes, to replay
    assert join.dl.counts == {"untrusted": 19}
    minutes = pub.of(GpuMinute)
    # not one forged sample counted, nor the forged job (cluster-b's GPU stays unallocated)
    assert figures(minutes) == alone(honest_a + honest_b)
    assert {m.activity_avg for m in minutes if m.cluster == "cluster-b"} == {0.25}
    assert not pub.of(AllocationEvent)


def test_without_the_setting_nothing_changes() -> None:
    pub = Recording()
    join = Join(pub, "")

    async def go() -> None:
        for i, s in enumerate(samples("cluster-b", "b1", T0, 1.0)):
            await join.ingest("p", raw("gpu.samples.v1", s, i))
        await join.flush_all()

    asyncio.run(go())
    assert not pub.of(DeadLetter)
    assert figures(pub.of(GpuMinute)) == alone(samples("cluster-b", "b1", T0, 1.0))


def a_transfer(cluster: str) -> Transfer:
    return Transfer.model_validate(
        {
            "event_id": "t1", "time": T0, "cluster": cluster, "from_env": "onprem",
            "to_env": "cloud", "bytes": 10, "source": "billing_csv",
        }
    )  # fmt: skip


def test_the_sink_decodes_the_clusters_topics_and_refuses_claims_the_same_way() -> None:
    pub = Recording()
    dl = DeadLetters(pub, "sink-test", "ns.", trust("ns."))
    transfer = a_transfer("cluster-b")
    honest = transfer.model_copy(update={"cluster": "cluster-a"})
    unmapped = transfer.model_copy(update={"cluster": "x"})

    async def go() -> list[Record | None]:
        return [
            await dl.decode(raw("ns.cluster-a.transfers.v1", honest, 0)),
            await dl.decode(raw("ns.cluster-a.transfers.v1", transfer, 1)),
            await dl.decode(raw("ns.transfers.v1", transfer, 0)),  # reserved for cluster-b's
            await dl.decode(raw("ns.transfers.v1", unmapped, 1)),
            await dl.decode(raw("ns.gpu.minutes.v1", honest, 0)),
        ]

    got = asyncio.run(go())
    assert got[0] == honest and got[1] is None and got[2] is None
    assert isinstance(got[3], Transfer) and got[3].cluster == "x"  # unmapped: the shared topic
    assert got[4] is None  # a transfer is not a GPU minute: a schema dead letter, as before
    kinds = [(d.source_topic, d.kind.value) for d in pub.of(DeadLetter)]
    assert kinds == [
        ("ns.cluster-a.transfers.v1", "untrusted"),
        ("ns.transfers.v1", "untrusted"),
        ("ns.gpu.minutes.v1", "schema"),
    ]


LOOK_ALIKES = {
    "a trailing space": "cluster-a ",
    "a tab": "cluster-a\t",
    "a newline": "cluster-a\n",
    "a no-break space": "cluster-a\u00a0",
    "a zero-width space": "cluster-a\u200b",
    "a word joiner": "cluster-a\u2060",
    "one inside": "cluster\u200b-a",
    "full-width letters": "\uff43luster-a",
}


@pytest.mark.parametrize("claim", LOOK_ALIKES.values(), ids=LOOK_ALIKES.keys())
def test_a_look_alike_of_a_mapped_cluster_is_that_cluster(claim: str) -> None:
    """A record claiming ``cluster-a`` plus an invisible or look-alike character passed the
    trust check (a cluster nobody mapped) and was shown as cluster-a: names are compared in
    the one form they are shown in, so it is cluster-a, and refused on the shared topic."""
    pub = Recording()
    dl = DeadLetters(pub, "sink-test", "ns.", trust("ns."))
    honest = a_transfer("cluster-a")
    forged = encode(honest).replace(b'"cluster-a"', json.dumps(claim).encode())
    assert forged != encode(honest)

    async def go() -> list[Record | None]:
        return [
            await dl.decode(RawMessage("ns.transfers.v1", 0, 0, None, forged)),
            await dl.decode(RawMessage("ns.cluster-a.transfers.v1", 0, 0, None, forged)),
        ]

    shared, own = asyncio.run(go())
    assert shared is None, f"{claim!r} passed on the shared topic as {shared}"
    assert isinstance(own, Transfer) and own.cluster == "cluster-a"
    assert [d.kind.value for d in pub.of(DeadLetter)] == ["untrusted"]


def test_the_sink_subscribes_to_the_clusters_topics_of_its_kinds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import gpugap.sinks.base
    from gpugap.sinks.clickhouse.sink import ClickHouseSink

    seen: dict[str, Any] = {}

    async def consume(settings: KafkaSettings, group: str, *args: Any, **kw: Any) -> None:
        seen.update(kw)

    class Sink(gpugap.sinks.base.BatchingSink):
        name = "test"
        topics = ClickHouseSink.topics

        async def write(self, batch: Any) -> None:
            pass

    monkeypatch.setattr(gpugap.sinks.base, "consume", consume)
    kafka = KafkaSettings(topic_prefix="ns.")
    for dl, extra in [
        (DeadLetters(Recording(), "sink", "ns."), []),
        (DeadLetters(Recording(), "sink", "ns.", trust("ns.", {"cluster-a.*": "cluster-a"})), [
            "cluster-a.k8s.pods.v1", "cluster-a.slurm.jobs.v1", "cluster-a.transfers.v1",
        ]),
    ]:  # fmt: skip
        asyncio.run(Sink().run(kafka, dl))
        # names without the namespace: consume() prefixes them
        assert seen["topics"] == [t.name for t in ClickHouseSink.topics] + extra


# --- the shipped ACLs ------------------------------------------------------------------------


def acl_lines(clusters: str, prefix: str = "") -> list[str]:
    env = {"PATH": "/usr/bin:/bin", "CLUSTERS": clusters, "GPUGAP_KAFKA_TOPIC_PREFIX": prefix}
    done = subprocess.run(
        ["bash", str(ACLS / "kafka-acls.sh"), "--list"],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def test_the_strimzi_users_grant_what_the_script_grants() -> None:
    import yaml  # type: ignore[import-untyped]

    got = []
    for path in sorted((ACLS / "strimzi").glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc is None or doc.get("kind") != "KafkaUser":
                continue
            assert doc["spec"]["authentication"]["type"] == "scram-sha-512", path
            user = doc["metadata"]["name"]
            for rule in doc["spec"]["authorization"]["acls"]:
                res = rule["resource"]
                pattern = {"literal": "Literal", "prefix": "Prefixed"}[res["patternType"]]
                got += [
                    f"User:{user} {op} {res['type'].capitalize()} {res['name']} {pattern}"
                    for op in rule["operations"]
                ]
    assert sorted(got) == sorted(acl_lines("cluster-a cluster-b"))
    assert not any(" Write " in line and "minutes" in line for line in got if "worker" not in line)


def test_the_script_refuses_cluster_names_whose_topics_would_overlap() -> None:
    done = subprocess.run(
        ["bash", str(ACLS / "kafka-acls.sh"), "--list"],
        env={"PATH": "/usr/bin:/bin", "CLUSTERS": "lab lab.gpu"},
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 2 and "would include cluster lab.gpu's" in done.stderr


# --- on a broker that authenticates and authorizes ---------------------------------------------


@pytest.fixture(scope="module")
def sasl_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """Always the local broker (its users and authorizer are the test's own); one that cannot
    start fails the tests, in CI or not."""
    from tests.harness.kafka_sasl import start_sasl_broker

    started = time.monotonic()
    try:
        broker = start_sasl_broker(tmp_path_factory.mktemp("kafka-sasl"))
    except (GpugapError, OSError) as exc:
        pytest.fail(f"could not start a local Kafka broker with SASL and ACLs: {exc}")
    print(f"SASL broker up in {time.monotonic() - started:.1f} s")
    try:
        yield broker
    finally:
        broker.kafka.down()


async def _create_topics(admin: KafkaSettings, names: dict[str, int]) -> None:
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic

    from gpugap.groundfloor.kafka.admin import _wait_for_leaders, _wait_for_offsets

    client = AIOKafkaAdminClient(**admin.client_options())
    await client.start()
    try:
        await client.create_topics([NewTopic(n, p, 1) for n, p in names.items()])
        leaders = await _wait_for_leaders(client, list(names))
    finally:
        await client.close()
    await _wait_for_offsets(admin, leaders)


async def _delete_topics(admin: KafkaSettings, prefix: str) -> None:
    from aiokafka.admin import AIOKafkaAdminClient

    client = AIOKafkaAdminClient(**admin.client_options())
    await client.start()
    try:
        mine = [t for t in await client.list_topics() if t.startswith(prefix)]
        if mine:
            await client.delete_topics(mine)
    finally:
        await client.close()


async def _send(kafka: KafkaSettings, topic: Topic[Any], records: list[Any]) -> None:
    from gpugap.groundfloor.kafka.publish import KafkaPublisher

    async with KafkaPublisher(kafka) as pub:
        for r in records:
            await pub.send(topic, r)


@pytest.mark.kafka
def test_producers_write_their_own_topics_only_and_the_worker_refuses_a_forged_cluster(
    sasl_broker: Any,
) -> None:
    from aiokafka import AIOKafkaProducer
    from aiokafka.errors import TopicAuthorizationFailedError

    from gpugap.groundfloor.kafka.consume import read_topic

    prefix = f"t{uuid.uuid4().hex[:10]}."
    admin = sasl_broker.settings("admin", topic_prefix=prefix)
    # what an administrator does before anyone publishes: the ACLs the script ships, the topics
    sasl_broker.create_acls(acl_lines("cluster-a cluster-b", prefix))
    shared: list[Topic[Any]] = [SAMPLES, SLURM_JOBS, K8S_PODS]
    shared += [ALLOCATIONS, MINUTES, ALERTS, DEAD_LETTER]  # the worker's outputs
    topics = {t.qualified(prefix): 2 if t is SAMPLES else 1 for t in shared}
    for c in ("cluster-a", "cluster-b"):
        topics |= {
            f"{prefix}{c}.{t.name}": 2 if t is SAMPLES else 1
            for t in (SAMPLES, SLURM_JOBS, K8S_PODS)
        }
    now = datetime.now(UTC).replace(second=0, microsecond=0) - timedelta(minutes=10)
    # each cluster's producers publish under their own prefix (GPUGAP_KAFKA_TOPIC_PREFIX)
    as_a = sasl_broker.settings("cluster-a", topic_prefix=f"{prefix}cluster-a.")
    as_b = sasl_broker.settings("cluster-b", topic_prefix=f"{prefix}cluster-b.")
    honest_a = samples("cluster-a", "a1", now, 0.5)
    honest_b = samples("cluster-b", "b1", now, 0.25)
    forged = samples("cluster-b", "b1", now, 1.0)

    async def publish() -> None:
        await _create_topics(admin, topics)
        # the broker refuses cluster-a's producer everywhere but its own topics
        for where in (f"{prefix}cluster-b.", prefix):  # cluster-b's topics, the shared ones
            other = sasl_broker.settings("cluster-a", topic_prefix=where)
            with pytest.raises(TopicAuthorizationFailedError):
                await asyncio.wait_for(_send(other, SAMPLES, forged[:1]), 60)
        producer = AIOKafkaProducer(**as_a.client_options())
        await producer.start()
        try:
            with pytest.raises(TopicAuthorizationFailedError):  # only the worker writes minutes
                await producer.send_and_wait(MINUTES.qualified(prefix), b"{}")
        finally:
            await producer.stop()
        # ...but on its own topic, it can still claim any cluster: the worker must refuse that
        await _send(as_a, SAMPLES, honest_a + forged)
        await _send(as_a, SLURM_JOBS, [slurm_start("cluster-b", "666", "b1", now)])
        await _send(as_b, SAMPLES, honest_b)
        # and whoever may still write the shared topics (here the super user) cannot speak
        # for a mapped cluster there
        await _send(admin, SAMPLES, forged[:1])

    asyncio.run(asyncio.wait_for(publish(), 120))

    started = time.monotonic()
    # as ``gpugap worker`` runs it, from the environment
    import json
    import os

    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("GPUGAP_")},
        **sasl_broker.env("gpugap-worker"),
        "GPUGAP_KAFKA_TOPIC_PREFIX": prefix,
        "GPUGAP_KAFKA_CLUSTER_TOPICS": json.dumps(MAPPING),
        "GPUGAP_LOG_LEVEL": "WARNING",
    }
    run_gpugap(["worker", "--http", "", "--idle-flush", "1", "--idle-timeout", "3"], env)
    print(f"the worker ran {time.monotonic() - started:.1f} s")

    minutes = asyncio.run(read_topic(admin, MINUTES))
    dead = asyncio.run(read_topic(admin, DEAD_LETTER))
    asyncio.run(_delete_topics(admin, prefix))
    assert {d.kind for d in dead} == {DeadLetterKind.UNTRUSTED}
    by_topic = {t: [d for d in dead if d.source_topic == t] for t in {d.source_topic for d in dead}}
    assert {t: len(ds) for t, ds in by_topic.items()} == {
        f"{prefix}cluster-a.gpu.samples.v1": len(forged),  # every forged sample
        f"{prefix}cluster-a.slurm.jobs.v1": 1,  # the forged job
        f"{prefix}gpu.samples.v1": 1,
    }
    own = (
        by_topic[f"{prefix}cluster-a.gpu.samples.v1"] + by_topic[f"{prefix}cluster-a.slurm.jobs.v1"]
    )
    assert all("this one claims 'cluster-b'" in d.reason for d in own)
    assert "accepted on" in by_topic[f"{prefix}gpu.samples.v1"][0].reason
    # cluster-b's figures are its own producer's: none of the forged samples, no forged job
    assert figures(minutes) == alone(honest_a + honest_b)
    assert {m.activity_avg for m in minutes if m.cluster == "cluster-b"} == {0.25}
