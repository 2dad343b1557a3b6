"""On a real Slurm 26.05 whose slurmctld publishes its own job records (jobcomp/kafka) to a real
broker: ``gpugap produce slurm-jobcomp`` turns them into the events the hook and the poller
publish for the same jobs (same ids, GPUs, times, states), with slurmctld restarted mid-run and
the broker down for 30 s, nothing lost and nothing doubled.

The broker is this module's own (one KRaft node the test can stop); the 1-minute time limit
(enforced after ~80 s) runs alongside the rest, so the first test stays near two minutes.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpugap.groundfloor.kafka.admin import ensure_topics
from gpugap.groundfloor.kafka.publish import KafkaPublisher
from gpugap.groundfloor.settings import ClickHouseSettings, KafkaSettings, Settings
from gpugap.producers.slurm.jobcomp_producer import SlurmJobcompProducer
from gpugap.producers.slurm.jobcomp_settings import SlurmJobcompSettings
from gpugap.producers.slurm.parse import gres_indices
from gpugap.schemas import Record
from gpugap.schemas.topics import DEAD_LETTER, SLURM_JOBS
from tests.harness.kafka_cluster import KafkaCluster
from tests.harness.services import unavailable
from tests.harness.slurm26_cluster import ACCOUNT, Slurm26Cluster
from tests.harness.topics import read_topic
from tests.producers.slurm.test_live import Poller, by_job, content, hook_env

# on a fresh machine the module's first test waits for the Slurm build .ci/run started in the
# background (~9 min alone, ~20 beside the tests): longer than the suite's 600 s per test
pytestmark = [pytest.mark.slurm, pytest.mark.kafka, pytest.mark.timeout(2400)]
CLUSTER = "live"  # test_live.hook_env's


#: this module's broker: its process, restarted by a test, outlives the test (module_children)
BROKERS: list[KafkaCluster] = []


def module_children() -> set[int]:
    """Child processes this module keeps across tests (tests/conftest.py no_leaks)."""
    return {n.proc.pid for b in BROKERS for n in b.nodes.values() if n.proc is not None}


@pytest.fixture(scope="module")
def broker() -> Iterator[KafkaCluster]:
    root = Path(tempfile.mkdtemp(prefix="gpugap-jobcomp-kafka-"))
    cluster = KafkaCluster(root, size=1)
    try:
        cluster.start()
    except Exception as exc:
        cluster.stop()
        unavailable(f"could not start a Kafka broker for Slurm 26.05: {exc}")
    BROKERS.append(cluster)
    yield cluster
    BROKERS.remove(cluster)
    cluster.stop()
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def slurm26(broker: KafkaCluster) -> Iterator[Slurm26Cluster]:
    if os.geteuid() != 0:
        unavailable("a test Slurm needs root (slurmd, mknod, apt-get)")
    root = Path(tempfile.mkdtemp(prefix="gpugap-slurm26-"))
    root.chmod(0o755)
    try:
        cluster = Slurm26Cluster(root, broker.bootstrap)
        # as a site does (Strimzi KafkaTopics): after an outage slurmctld drops the records of
        # a topic the broker does not know yet ("Unknown topic or partition"), auto-creation
        # or not
        topics = [cluster.end_topic, cluster.start_topic]
        asyncio.run(ensure_topics(KafkaSettings(bootstrap=broker.bootstrap), topics))
        cluster.start()
    except Exception as exc:
        if "cluster" in locals():
            cluster.stop()
        unavailable(f"could not build or start Slurm 26.05: {exc}")
    os.environ["SLURM_CONF"] = str(cluster.conf)  # for the scontrol the consumer runs
    yield cluster
    cluster.stop()
    shutil.rmtree(root, ignore_errors=True)


class Jobcomp:
    """``gpugap produce slurm-jobcomp`` in this process until stopped."""

    def __init__(
        self, slurm: Slurm26Cluster, kafka: KafkaSettings, state: Path, **settings: Any
    ) -> None:
        cfg = SlurmJobcompSettings(
            cluster=CLUSTER,
            topic=slurm.end_topic,
            start_topic=slurm.start_topic,
            group=f"{kafka.topic_prefix}jobcomp",
            scontrol=slurm.tool("scontrol"),
            state_file=state,
        ).model_copy(update=settings)
        self.producer = SlurmJobcompProducer(Settings(kafka=kafka), cfg)
        self.publisher = KafkaPublisher(kafka)
        self.stop = asyncio.Event()

    async def __aenter__(self) -> Jobcomp:
        from gpugap.producers import run_producer

        self.task = asyncio.create_task(run_producer(self.producer, self.publisher, stop=self.stop))
        return self

    async def __aexit__(self, *exc: object) -> None:
        await asyncio.sleep(2.0)  # the last records
        self.stop.set()
        await self.task


def own_topics(slurm: Slurm26Cluster, broker: KafkaCluster) -> KafkaSettings:
    """gpugap's topics under a prefix of the test's own on the module's broker; the hook off
    (only the first test compares it)."""
    slurm.set_hook_env({"GPUGAP_TEST_HOOKS_OFF": "1"})
    prefix = f"t{uuid.uuid4().hex[:8]}.jc."
    return KafkaSettings(bootstrap=broker.bootstrap, topic_prefix=prefix, linger_ms=5)


async def ready(slurm: Slurm26Cluster, jobcomp: Jobcomp) -> str:
    """Once the consumer has read a first job's end: its group has its partitions, and what
    follows is read as it happens (a start read after its job ended has no GPU indices)."""
    job = slurm.submit("-A", ACCOUNT, wrap="true")
    deadline = time.monotonic() + 60
    while f"slurm/{CLUSTER}/{job}/end" not in jobcomp.producer.ledger.emitted:
        if time.monotonic() > deadline:
            raise AssertionError("the jobcomp consumer read nothing within 60 s")
        await asyncio.sleep(0.2)
    return job


def state(job: dict[str, Any]) -> str:
    value = job["job_state"]
    return str(value[0] if isinstance(value, list) else value)


def running(slurm: Slurm26Cluster, job: str) -> None:
    slurm.wait(lambda j: job in j and state(j[job]) == "RUNNING", f"job {job} to run", 90)


def settled(jobs: dict[str, dict[str, Any]], mine: set[str]) -> bool:
    return all(
        state(j) not in ("PENDING", "RUNNING", "COMPLETING", "CONFIGURING")
        for raw, j in jobs.items()
        if raw in mine
    )


HET_SCRIPT = """#!/bin/bash
#SBATCH --gres=gpu:1
#SBATCH hetjob
#SBATCH --gres=gpu:2
sleep 3
"""
#: runs until requeued, then ends at once
REQUEUE_WRAP = '[ "${SLURM_RESTART_COUNT:-0}" -ge 1 ] && exit 0; sleep 300'


def submit_all(slurm: Slurm26Cluster, tmp: Path) -> dict[str, str]:
    het = tmp / "het.sh"
    het.write_text(HET_SCRIPT)
    account = ("-A", ACCOUNT)
    ids = {
        "timeout": slurm.submit(*account, "--gres=gpu:1", "-t", "1", "-J", "tmo", wrap="sleep 300"),
        "normal": slurm.submit(*account, "--gres=gpu:2", "-t", "5", "-J", "two", wrap="sleep 4"),
        "failed": slurm.submit(*account, "--gres=gpu:1", "-J", "fail", wrap="sleep 2; exit 3"),
        "cancel": slurm.submit(*account, "--gres=gpu:1", "-J", "canrun", wrap="sleep 300"),
        "requeue": slurm.submit(
            *account, "--gres=gpu:1", "--requeue", "-J", "rq", wrap=REQUEUE_WRAP
        ),
        "held": slurm.submit(*account, "--hold", "--gres=gpu:1", "-J", "held", wrap="sleep 2"),
        "array": slurm.submit(*account, "--gres=gpu:1", "-a", "0-2", "-J", "arr", wrap="sleep 2"),
    }
    out = slurm.cmd("sbatch", "--parsable", "-o", "/dev/null", *account, str(het))
    ids["het"] = out.stdout.strip().split(";")[0]
    return ids


def test_jobcomp_records_become_the_events_the_hook_and_poller_publish(
    slurm26: Slurm26Cluster, broker: KafkaCluster, tmp_path: Path
) -> None:
    prefix = f"t{uuid.uuid4().hex[:8]}."
    kafka = KafkaSettings(bootstrap=broker.bootstrap, topic_prefix=prefix + "jc.", linger_ms=5)
    hook_kafka = kafka.model_copy(update={"topic_prefix": prefix + "hook."})
    poll_kafka = kafka.model_copy(update={"topic_prefix": prefix + "poll."})
    slurm26.set_hook_env(
        hook_env(
            hook_kafka,
            tmp_path / "spool",
            GPUGAP_SLURM_END_HOOK="epilog",
            GPUGAP_SLURM_SCONTROL=slurm26.tool("scontrol"),
        )
    )

    async def scenario() -> dict[str, str]:
        poller = Poller(
            slurm26,
            poll_kafka,
            squeue=slurm26.tool("squeue"),
            scontrol=slurm26.tool("scontrol"),
            sacct=slurm26.tool("sacct"),
        )
        async with Jobcomp(slurm26, kafka, tmp_path / "jobcomp.json") as jobcomp, poller:
            warmup = await ready(slurm26, jobcomp)
            ids = await asyncio.to_thread(submit_all, slurm26, tmp_path)
            ids["warmup"] = warmup
            await asyncio.to_thread(running, slurm26, ids["cancel"])
            await asyncio.sleep(1.0)
            slurm26.cmd("scancel", ids["cancel"])
            await asyncio.to_thread(running, slurm26, ids["requeue"])
            await asyncio.sleep(1.0)
            slurm26.cmd("scontrol", "requeue", ids["requeue"])
            await asyncio.sleep(2.0)
            slurm26.cmd("scontrol", "release", ids["held"])
            await asyncio.to_thread(
                slurm26.wait, lambda j: settled(j, set(j)), "every job to end", 240
            )
            await asyncio.sleep(3.0)
        return ids

    ids = asyncio.run(scenario())
    # 7 allocations of plain jobs (the requeued one twice), 3 array tasks, 2 het components
    expected = 2 * (7 + 3 + 2)
    got = asyncio.run(read_topic(kafka, SLURM_JOBS, expected + 2, settle_s=2))
    got = [e for e in got if e.job_id != ids["warmup"]]
    # what the others published by now (a shortfall shows in the comparisons below)
    hooks = asyncio.run(read_topic(hook_kafka, SLURM_JOBS, 0, settle_s=3))
    polled = asyncio.run(read_topic(poll_kafka, SLURM_JOBS, 0, settle_s=3))
    dead = asyncio.run(read_topic(kafka, DEAD_LETTER, 0, settle_s=1))
    assert not dead, [d.reason for d in dead]
    assert Counter(e.event_id for e in got).most_common(1)[0][1] == 1  # nothing twice
    assert len(got) == expected and {e.source.value for e in got} == {"jobcomp"}
    jobs = by_job(got)
    rq = ids["requeue"]
    assert {e.event_id for e in got if e.job_id == rq} == {
        f"slurm/{CLUSTER}/{rq}/start", f"slurm/{CLUSTER}/{rq}/end",
        f"slurm/{CLUSTER}/{rq}#1/start", f"slurm/{CLUSTER}/{rq}#1/end",
    }  # fmt: skip
    ends = {e.event_id: e for e in got if e.kind.value == "end"}
    assert ends[f"slurm/{CLUSTER}/{rq}/end"].state.value == "REQUEUED"
    assert ends[f"slurm/{CLUSTER}/{ids['timeout']}/end"].state.value == "TIMEOUT"
    assert ends[f"slurm/{CLUSTER}/{ids['failed']}/end"].exit_code == 3
    assert ends[f"slurm/{CLUSTER}/{ids['cancel']}/end"].state.value == "CANCELLED"
    het = ids["het"]
    assert {f"{het}+0", f"{het}+1"} <= set(jobs)
    assert {j for j in jobs if j.startswith(f"{ids['array']}_")} == {
        f"{ids['array']}_{t}" for t in range(3)
    }
    # every start names the GPUs slurmctld gave (jobcomp counts them only)
    for e in got:
        if e.kind.value == "start":
            assert sum(len(n.gpu_indices) for n in e.nodes) == e.gpus_total > 0, e.event_id

    # the poller (squeue --json, sacct) says exactly the same, but of the requeued job: its
    # second run ends before a poll sees it, and the first run's end is sacct's, which names
    # no GPU indices and no eligible time (jobcomp and the hook both have them)
    mine = {e.event_id for e in got}
    from_poller = {e.event_id: content(e) for e in polled if e.event_id in mine}
    assert set(from_poller) == mine
    diff = {
        (e.event_id, k): (v, from_poller[e.event_id].get(k))
        for e in got
        if e.job_id != rq
        for k, v in content(e).items()
        if from_poller[e.event_id].get(k) != v
    }
    assert not diff, diff
    # the hook's starts are the same; its ends (EpilogSlurmctld: jobcomp/script cannot run
    # beside jobcomp/kafka) take the time the epilog ran and cannot tell a time-out apart
    from_hook = {e.event_id: e for e in hooks if e.event_id in mine}
    assert set(from_hook) == mine
    loose = {"source", "time", "end_time", "state", "exit_code"}
    for e in got:
        h = from_hook[e.event_id]
        assert h.model_dump(mode="json", exclude=loose) == e.model_dump(mode="json", exclude=loose)
        if e.end_time is not None:
            assert abs((h.end_time - e.end_time).total_seconds()) <= 1.5, e.event_id  # type: ignore[operator]


def test_slurmctld_restarted_and_the_broker_down_30s_lose_and_double_nothing(
    slurm26: Slurm26Cluster, broker: KafkaCluster, tmp_path: Path
) -> None:
    """Jobs start and end while slurmctld restarts (it saves jobcomp/kafka's queue and sends it
    again) and while the broker is down for 30 s (messages time out after 10 s and are
    produced again): every allocation has exactly one start and one end."""
    kafka = own_topics(slurm26, broker)
    account = ("-A", ACCOUNT)

    def outage() -> list[str]:
        ids = [slurm26.submit(*account, "--gres=gpu:1", wrap="sleep 6") for _ in range(2)]
        for job in ids:
            running(slurm26, job)
        slurm26.stop_controller()  # the two end while it is down
        time.sleep(8)
        slurm26.start_controller()
        broker.stop_node(1)
        try:
            ids += [slurm26.submit(*account, "--gres=gpu:1", wrap="sleep 4") for _ in range(2)]
            time.sleep(30)  # they start and end with the broker down
        finally:
            broker.start_node(1)
        ids.append(slurm26.submit(*account, "--gres=gpu:1", wrap="sleep 1"))
        slurm26.wait(lambda j: settled(j, set(j)), "every job to end", 120)
        return ids

    # the consumer is not running meanwhile: it reads what slurmctld delivered in the end
    ids = outage()
    time.sleep(25)  # slurmctld re-produces timed-out messages every ~11 s

    async def consume() -> None:
        async with Jobcomp(slurm26, kafka, tmp_path / "jobcomp.json"):
            await asyncio.sleep(8)

    asyncio.run(consume())
    got = asyncio.run(read_topic(kafka, SLURM_JOBS, 0, settle_s=3))
    mine = [e for e in got if e.job_id in ids]
    counts = Counter((e.job_id, e.kind.value) for e in mine)
    assert counts == {(job, kind): 1 for job in ids for kind in ("start", "end")}, counts
    # a second consumer from the same state re-reads nothing new; replaying the topics from
    # the start (a new group) publishes nothing twice: the ids were published already
    asyncio.run(consume())
    again = asyncio.run(read_topic(kafka, SLURM_JOBS, len(got), settle_s=2))
    assert len(again) == len(got)


def test_drift_reads_zero_until_a_job_is_hidden_from_gpugap(
    slurm26: Slurm26Cluster, broker: KafkaCluster, clickhouse: ClickHouseSettings, tmp_path: Path
) -> None:
    from gpugap.producers.slurm.metrics_producer import SlurmMetricsProducer
    from gpugap.producers.slurm.poll_settings import SlurmMetricsSettings
    from tests.warehouse.test_stranded import query
    from tests.warehouse.test_views import store

    kafka = own_topics(slurm26, broker)
    account = ("-A", ACCOUNT)
    seen = [slurm26.submit(*account, f"--gres=gpu:{n}", wrap="sleep 300") for n in (1, 2)]
    for job in seen:
        running(slurm26, job)

    async def consume() -> None:
        async with Jobcomp(slurm26, kafka, tmp_path / "jobcomp.json"):
            await asyncio.sleep(4)

    asyncio.run(consume())
    events = asyncio.run(read_topic(kafka, SLURM_JOBS, 2, settle_s=1))
    store(clickhouse, [e for e in events if e.job_id in seen])
    settings = SlurmMetricsSettings(cluster=CLUSTER, url=slurm26.metrics_url)

    async def poll() -> list[Record]:
        metrics = SlurmMetricsProducer(Settings(), settings)
        try:
            return await metrics.poll()
        finally:
            await metrics.close()

    def drift() -> dict[tuple[str, str], tuple[float, float]]:
        store(clickhouse, asyncio.run(poll()))
        rows = query(
            clickhouse,
            "SELECT scope, name, scheduler_gpus, drift_gpus FROM v_scheduler_drift "
            f"WHERE cluster = '{CLUSTER}' AND time = (SELECT max(time) FROM scheduler_gpu_counts)",
        )
        return {(str(s), str(n)): (float(g), float(d)) for s, n, g, d in rows}  # type: ignore[arg-type]

    try:
        agreed = drift()
        assert agreed[("cluster", "")] == (3.0, 0.0)
        assert agreed[("partition", "gpu")] == (3.0, 0.0)
        assert agreed[("account", ACCOUNT)] == (3.0, 0.0)
        assert agreed[("user", "root")] == (3.0, 0.0)
        hidden = slurm26.submit(*account, "--gres=gpu:2", wrap="sleep 300")  # gpugap never hears
        running(slurm26, hidden)
        after = drift()
        assert after[("partition", "gpu")] == (5.0, -2.0)
        assert after[("cluster", "")] == (5.0, -2.0)
    finally:
        for job in [*seen, *locals().get("hidden", "").split()]:
            slurm26.cmd("scancel", job, check=False)


def test_gpu_indices_from_slurmrestd_with_a_token(
    slurm26: Slurm26Cluster, broker: KafkaCluster, tmp_path: Path
) -> None:
    """A site that runs slurmrestd instead of handing out scontrol: the consumer asks it, with
    a JWT from a file, which GPUs a starting job holds (scontrol is absent here)."""
    url = slurm26.start_slurmrestd()
    token = tmp_path / "jwt"
    token.write_text(slurm26.token())
    kafka = own_topics(slurm26, broker)
    seen: dict[str, Any] = {}

    async def scenario() -> None:
        consumer = Jobcomp(
            slurm26, kafka, tmp_path / "jobcomp.json", scontrol=str(tmp_path / "no-scontrol"),
            slurmrestd_url=url, slurmrestd_token_file=token,
        )  # fmt: skip
        async with consumer:
            await ready(slurm26, consumer)
            job = seen["job"] = slurm26.submit("-A", ACCOUNT, "--gres=gpu:3", wrap="sleep 5")
            await asyncio.to_thread(running, slurm26, job)
            seen["gres"] = slurm26.jobs()[job]["gres_detail"]  # what squeue says it holds
            await asyncio.sleep(2)

    asyncio.run(scenario())
    events = asyncio.run(read_topic(kafka, SLURM_JOBS, 0, settle_s=2))
    (start,) = [e for e in events if e.event_id == f"slurm/{CLUSTER}/{seen['job']}/start"]
    assert start.gpus_total == 3
    assert [n.gpu_indices for n in start.nodes] == [gres_indices(g) for g in seen["gres"]]
    slurm26.cmd("scancel", seen["job"], check=False)


def test_a_start_whose_end_never_comes_is_ended_from_slurmctld(
    slurm26: Slurm26Cluster, broker: KafkaCluster, tmp_path: Path
) -> None:
    """The end record lost (here: the consumer reads another end topic): after end_check_s the
    open run is checked with scontrol, and the end slurmctld reports is published, as the
    poller would say it."""
    kafka = own_topics(slurm26, broker)
    seen: dict[str, Any] = {}

    async def scenario() -> None:
        consumer = Jobcomp(
            slurm26, kafka, tmp_path / "jobcomp.json", topic=f"{kafka.topic_prefix}no-ends",
            end_check_s=10.0,
        )  # fmt: skip
        async with consumer:
            await asyncio.sleep(3)  # its group joins (the start topic exists)
            job = seen["job"] = slurm26.submit("-A", ACCOUNT, "--gres=gpu:1", wrap="sleep 2")
            await asyncio.to_thread(running, slurm26, job)
            deadline = time.monotonic() + 60
            while f"slurm/{CLUSTER}/{job}/end" not in consumer.producer.ledger.emitted:
                assert time.monotonic() < deadline, "no end published for the open run"
                await asyncio.sleep(0.5)
            seen["slurm"] = slurm26.jobs()[job]

    asyncio.run(scenario())
    events = asyncio.run(read_topic(kafka, SLURM_JOBS, 2, settle_s=1))
    by_kind = {e.kind.value: e for e in events if e.job_id == seen["job"]}
    start, end = by_kind["start"], by_kind["end"]
    assert (start.source.value, end.source.value) == ("jobcomp", "poller")
    assert end.state.value == "COMPLETED" and end.exit_code == 0
    assert end.nodes == start.nodes and end.gpus_total == 1
    assert int(end.end_time.timestamp()) == seen["slurm"]["end_time"]["number"]  # type: ignore[union-attr]
