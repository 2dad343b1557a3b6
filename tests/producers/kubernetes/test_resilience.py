"""The producer under the failures a real API server produces: 410 Gone in the middle of a watch
(and on reconnect), an expired list continuation, hung connections, restarts; and its output
through the real Kafka broker."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpugap.groundfloor.kafka.publish import KafkaPublisher
from gpugap.groundfloor.settings import KafkaSettings
from gpugap.schemas import K8sPodEvent, decode, utc_now
from gpugap.schemas.topics import K8S_PODS
from tests.harness.k8s_api import ApiServer, FakeCluster, Scenario
from tests.harness.k8s_run import Running, read_events
from tests.harness.topics import create_topics
from tests.producers.kubernetes.test_kubernetes import check, play

# inference-deployment.yaml steps: 0 add b, 1 add c, 2 bind b, 3 bind c, 4 b creating,
# 5 b running, 6 c running, 7 c ready, 8 c deletion asked, 9 c Succeeded, 10 delete c,
# 11 b deletion asked, 12 b Failed, 13 delete b
BEFORE, GAP, AFTER = range(5), range(5, 10), range(10, 14)


@pytest.fixture
def server() -> Iterator[ApiServer]:
    with ApiServer(FakeCluster()) as srv:
        yield srv


def kinds_by_pod(scenario: Scenario, events: list[K8sPodEvent]) -> dict[str, list[str]]:
    by_uid = {scenario.uid(k): k for k in scenario.pods}
    out: dict[str, list[str]] = {}
    for e in events:
        out.setdefault(by_uid[e.uid], []).append(e.kind.value)
    return out


@pytest.mark.parametrize("how", ["error", "close"])
def test_410_in_the_middle_of_a_watch_loses_no_transition_and_invents_none(
    how: str, server: ApiServer, tmp_path: Path
) -> None:
    """While the watch is held back, b starts running, c runs and terminates, and pod a is
    force-deleted; then the history is compacted (ERROR 410 in the stream, or a closed stream
    and 410 on reconnect). The relist must yield exactly the transitions it shows, plus a's
    deletion, nothing twice; afterwards the watch carries on from the list."""
    sc = Scenario.load("inference-deployment")
    cluster = server.cluster
    sc.setup(cluster)

    async def go() -> list[K8sPodEvent]:
        async with Running(server, tmp_path / "out.jsonl") as run:
            await run.synced()
            for i in BEFORE:
                sc.apply(cluster, sc.steps[i])
            await run.synced()
            cluster.pause()
            for i in GAP:
                sc.apply(cluster, sc.steps[i])
            cluster.delete(sc.namespace, sc.pod_name("a"))
            before_relist = utc_now()
            cluster.expire(how)
            await run.synced()
            assert len(cluster.lists()) == 2, "one relist after the 410"
            relist_rv = int(run.producer.synced_rv[""])
            for i in AFTER:
                sc.apply(cluster, sc.steps[i])
            await run.synced()
            after = cluster.watches()[-1]
            assert int(after.params["resourceVersion"]) >= relist_rv  # resumed from the list
            deleted_a = [e for e in run.events() if e.uid == sc.uid("a") and e.kind == "deleted"]
            assert len(deleted_a) == 1 and before_relist <= deleted_a[0].time <= utc_now()
            assert deleted_a[0].reason == "deleted" and deleted_a[0].node == "gpu-a100-01"
        return run.events()

    events = asyncio.run(go())
    assert kinds_by_pod(sc, events) == {
        "a": ["bound", "running", "deleted"],
        "b": ["bound", "running", "terminated", "deleted"],
        "c": ["bound", "running", "terminated", "deleted"],
    }
    # every other event is exactly the one the uninterrupted run emits (same times, reasons)
    unbroken = {(x["pod"], x["kind"]): x for x in sc.expected}
    for e in events:
        key = next(k for k in sc.pods if sc.uid(k) == e.uid)
        if (key, e.kind.value) == ("a", "deleted"):
            continue
        x = unbroken[key, e.kind.value]
        assert e.time.isoformat().replace("+00:00", "Z") == x["time"], (key, e.kind)
        assert (e.reason.value if e.reason else None) == x.get("reason")
    assert len({e.event_id for e in events}) == len(events)


def test_server_side_timeouts_and_bookmarks_resume_the_watch_without_a_relist(
    server: ApiServer, tmp_path: Path
) -> None:
    """Watches end after timeoutSeconds (1-2 s here); the producer reconnects from the last
    resourceVersion it saw — a bookmark's, since everything that happened meanwhile was in
    another namespace — and never relists."""
    nb, other = Scenario.load("notebook"), Scenario.load("eviction")
    cluster = server.cluster
    other.setup(cluster)

    async def go() -> list[K8sPodEvent]:
        ns = nb.namespace
        async with Running(server, tmp_path / "out.jsonl", namespaces=[ns], watch_timeout_s=1) as r:
            await r.synced(namespace=ns)
            nb.apply(cluster, nb.steps[0])
            nb.apply(cluster, nb.steps[1])
            await r.synced(namespace=ns)
            for step in other.steps:  # changes elsewhere only
                other.apply(cluster, step)
            target = str(cluster.rv)
            async with asyncio.timeout(10):
                while not any(w.params["resourceVersion"] == target for w in cluster.watches()):
                    await asyncio.sleep(0.05)
            nb.apply(cluster, nb.steps[2])
            await r.synced(namespace=ns)
        return r.events()

    events = asyncio.run(go())
    assert [e.kind.value for e in events] == ["bound", "running"]
    assert len(cluster.lists()) == 1
    watches = cluster.watches()
    assert len(watches) >= 2
    for w in watches:
        assert 1 <= int(w.params["timeoutSeconds"]) <= 2
        assert w.params["allowWatchBookmarks"] == "true"


def test_an_expired_list_continuation_restarts_the_list(server: ApiServer, tmp_path: Path) -> None:
    sc = Scenario.load("pytorchjob-partial-gang")
    server.cluster.fail_continue = 1

    async def go() -> list[K8sPodEvent]:
        return await play(server, sc, tmp_path / "out.jsonl", page_size=2)

    check(sc, asyncio.run(go()))
    first_pages = [r for r in server.cluster.lists() if "continue" not in r.params]
    assert len(first_pages) == 2  # the list was started again from scratch


@pytest.mark.parametrize("hang", ["stream", "request"])
def test_a_hung_server_is_detected_within_the_request_timeout_and_the_watch_resumes(
    hang: str, server: ApiServer, tmp_path: Path
) -> None:
    """The watch stream goes silent (connection open, nothing sent) — and with "request" the
    reconnection hangs before answering too. Each is noticed within the read timeout, and the
    watch resumes from the last resourceVersion (no relist), delivering what happened."""
    timeout_s = 1.0
    sc = Scenario.load("notebook")
    cluster = server.cluster

    async def go() -> tuple[float, list[K8sPodEvent]]:
        async with Running(server, tmp_path / "out.jsonl", request_timeout_s=timeout_s) as run:
            await run.synced()
            sc.apply(cluster, sc.steps[0])
            sc.apply(cluster, sc.steps[1])  # bound
            await run.synced()
            rv = run.producer.synced_rv[""]
            watches = len(cluster.watches())
            cluster.hang(streams=True, requests=1 if hang == "request" else 0)
            t0 = time.monotonic()
            sc.apply(cluster, sc.steps[2])  # running: must arrive after the reconnection
            await run.synced(timeout=10)
            took = time.monotonic() - t0
            resumed = cluster.watches()[watches:]
            assert resumed and resumed[0].params["resourceVersion"] == rv
            assert len(cluster.lists()) == 1
            assert run.producer.watchers[0].stats.timeouts == (2 if hang == "request" else 1)
        return took, run.events()

    took, events = asyncio.run(go())
    hangs = 2 if hang == "request" else 1
    assert hangs * timeout_s * 0.9 <= took <= hangs * timeout_s + 2.0
    assert [e.kind.value for e in events] == ["bound", "running"]


def test_an_api_server_that_goes_away_is_retried_with_backoff_until_it_is_back(
    tmp_path: Path,
) -> None:
    """The API server stops (connections refused); the producer keeps retrying with growing,
    jittered delays and, once a server answers on the same address again, resumes the watch
    from where it was — no relist, nothing lost."""
    sc = Scenario.load("notebook")
    cluster = FakeCluster()
    first = ApiServer(cluster)
    port = int(first.url.rsplit(":", 1)[1])

    async def go() -> tuple[list[K8sPodEvent], int]:
        again: ApiServer | None = None
        try:
            async with Running(first, tmp_path / "out.jsonl", backoff_max_s=0.4) as run:
                await run.synced()
                sc.apply(cluster, sc.steps[0])
                sc.apply(cluster, sc.steps[1])
                await run.synced()
                first.close()
                sc.apply(cluster, sc.steps[2])  # happens while nobody can see it
                stats = run.producer.watchers[0].stats
                async with asyncio.timeout(10):
                    while stats.errors < 3:
                        await asyncio.sleep(0.05)
                again = ApiServer(cluster, port=port)
                await run.synced()
                errors = stats.errors
        finally:
            first.close()
            if again is not None:
                again.close()
        return run.events(), errors

    events, errors = asyncio.run(go())
    assert errors >= 3
    assert [e.kind.value for e in events] == ["bound", "running"]
    assert len(cluster.lists()) == 1


def test_backoff_doubles_with_jitter_up_to_the_cap() -> None:
    from gpugap.producers.kubernetes.watcher import backoff_delay

    for failures, step in [(1, 0.2), (2, 0.4), (3, 0.8), (6, 6.4), (8, 10.0), (500, 10.0)]:
        delays = [backoff_delay(failures, 0.2, 10.0) for _ in range(200)]
        assert all(step / 2 <= d <= step for d in delays)
        assert max(delays) - min(delays) > step / 4  # jittered, not in lockstep


def test_a_restarted_producer_re_emits_only_what_downstream_dedupes(
    server: ApiServer, tmp_path: Path
) -> None:
    """Stateless restart: the first list re-emits what it shows, with the same event ids and
    the same content (times come from the pod objects), so a consumer deduplicating by
    event_id counts each transition once. With the ledger (GPUGAP_K8S_STATE_FILE) a restart
    sends nothing already sent, and reports what changed while it was down — including a pod
    deleted meanwhile, which a stateless restart cannot know about."""
    sc = Scenario.load("inference-deployment")
    cluster = server.cluster
    sc.setup(cluster)
    ledger = tmp_path / "state" / "k8s-ledger.json"

    async def run(out: str, **k8s: object) -> list[K8sPodEvent]:
        async with Running(server, tmp_path / out, **k8s) as r:
            await r.synced()
        return r.events()

    for i in range(8):  # a, b, c running
        sc.apply(cluster, sc.steps[i])
    first = asyncio.run(run("first.jsonl", state_file=ledger))
    assert len(first) == 6 and ledger.exists()
    again = asyncio.run(run("stateless.jsonl"))
    assert sorted(e.model_dump_json() for e in again) == sorted(e.model_dump_json() for e in first)
    assert asyncio.run(run("ledger.jsonl", state_file=ledger)) == []

    # while it is down: c is asked to go and finishes; a is force-deleted
    for i in (8, 9):
        sc.apply(cluster, sc.steps[i])
    cluster.delete(sc.namespace, sc.pod_name("a"))
    resumed = asyncio.run(run("resumed.jsonl", state_file=ledger))
    assert [(e.name, e.kind.value) for e in resumed] == [
        (sc.pod_name("c"), "terminated"),
        (sc.pod_name("a"), "deleted"),
    ]
    stateless = asyncio.run(run("stateless2.jsonl"))
    everything = first + again + resumed + stateless
    distinct = {e.event_id: e for e in everything}
    # what a consumer keeps after deduplicating by event_id: each transition once
    assert sorted((e.name, e.kind.value) for e in distinct.values()) == sorted(
        [(sc.pod_name(k), "bound") for k in "abc"]
        + [(sc.pod_name(k), "running") for k in "abc"]
        + [(sc.pod_name("c"), "terminated"), (sc.pod_name("a"), "deleted")]
    )
    for e in everything:  # a repeated id always carries the same transition and time
        assert (e.kind, e.time, e.node, e.gpus) == (
            distinct[e.event_id].kind,
            distinct[e.event_id].time,
            distinct[e.event_id].node,
            distinct[e.event_id].gpus,
        )


@pytest.mark.kafka
def test_events_reach_kafka_keyed_by_pod_with_event_time(
    kafka: KafkaSettings, server: ApiServer, tmp_path: Path
) -> None:
    sc = Scenario.load("cronjob-oom-retry")

    async def go() -> list[tuple[bytes, int, K8sPodEvent]]:
        from aiokafka import AIOKafkaConsumer

        await create_topics(kafka, [K8S_PODS.name], partitions=2)
        sc.setup(server.cluster)
        async with Running(server, tmp_path / "unused.jsonl", publisher=KafkaPublisher(kafka)) as r:
            await r.synced()
            for step in sc.steps:
                sc.apply(server.cluster, step)
            await r.synced()
        consumer = AIOKafkaConsumer(
            kafka.topic_prefix + K8S_PODS.name,
            bootstrap_servers=kafka.bootstrap,
            auto_offset_reset="earliest",
        )
        await consumer.start()
        try:
            got: list[tuple[bytes, int, K8sPodEvent]] = []
            async with asyncio.timeout(30):
                while len(got) < len(sc.expected):
                    for batch in (await consumer.getmany(timeout_ms=500)).values():
                        got += [(m.key, m.timestamp, decode(K8S_PODS, m.value)) for m in batch]
            return got
        finally:
            await consumer.stop()

    got = asyncio.run(go())
    assert not read_events(tmp_path / "unused.jsonl")
    # one partition per pod key: per-pod order holds, across pods the partitions interleave
    for key in ("first", "retry"):
        mine = [e for _, _, e in got if e.uid == sc.uid(key)]
        want = [x for x in sc.expected if x["pod"] == key]
        assert [e.kind.value for e in mine] == [x["kind"] for x in want]
    for k, ts, e in got:
        assert k == f"test/{e.uid}".encode()
        assert ts == int(e.time.timestamp() * 1000)
