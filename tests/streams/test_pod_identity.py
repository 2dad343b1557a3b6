"""A pod is its UID, never its name: a pod deleted and recreated under the same name (a
StatefulSet's web-0, a Deployment replica with a fixed name) on another GPU of the same node is
a new allocation, and the samples' attribution (namespace/pod on a GPU at an instant, with no
UID: kubelet PodResources and dcgm-exporter labels carry none) belongs to the pod that held
that name at that instant.

The scenario, hand-computed (samples every 10 s, each the average over (t-10 s, t]):

- pod A (uid-1, ns/web-0) holds GPU 0 from 10:00:00 to 10:05:30 (deleted), GPU 0 at 0.8
  while A runs and 0.0 after it; samples name web-0 on GPU 0 from 10:00:10 to 10:05:30;
- pod B (uid-2, ns/web-0 again) holds GPU 1 from 10:05:40 to 10:10:00, GPU 1 at 0.6 all along;
  samples name web-0 on GPU 1 from 10:05:50 to 10:10:00.

A: 5 x 60 s + 30 s = 330 s on GPU 0, none on GPU 1; B: 20 s + 4 x 60 s = 260 s on GPU 1, none
on GPU 0; GPU 0 unallocated from 10:05:30, GPU 1 until 10:05:40 and from 10:10:00. GPU 0 is
idle after A, but nobody holds it: no idle alert (the bug billed B on GPU 0 from 10:05:40, and
its 4 idle minutes opened one with N = 3).
"""

from __future__ import annotations

import asyncio
import json
import random
from collections import defaultdict
from datetime import datetime, timedelta
from typing import Any

import pytest

from gpugap.groundfloor.kafka.consume import RawMessage
from gpugap.schemas import decode, encode
from gpugap.schemas.models import Alert, AllocationEvent, GpuMinute, K8sPodEvent, NodeSample
from gpugap.schemas.topics import ALERTS, K8S_PODS, MINUTES, SAMPLES
from gpugap.schemas.types import EventSource, PodEventKind, PodPhase
from gpugap.streams.core import SPANS_KEPT, CoreConfig, NodeCore, Output, see
from gpugap.streams.detect_idle import IdleConfig
from gpugap.streams.join import Join, partition_for
from gpugap.streams.process import Processor
from gpugap.streams.rows import node_minutes, placeholder_uuid
from tests.harness.capture import Capture
from tests.harness.commands import run_gpugap
from tests.streams.helpers import CLUSTER, NODE, T, pod, sample, samples

Item = NodeSample | AllocationEvent
CFG = CoreConfig(idle=IdleConfig(minutes=3))
A, B, C = "k8s/hpc/uid-1", "k8s/hpc/uid-2", "k8s/hpc/uid-3"
END = "10:13:00"  # the last sample; minutes up to 10:12 are closed at the end
GPU0, GPU1 = (f"GPU-00000000-0000-0000-0000-{i:012d}" for i in (0, 1))


def web(uid: str, kind: str, hms: str) -> AllocationEvent:
    return pod(uid, kind, hms, name="web-0")


def scenario() -> list[Item]:
    items: list[Item] = [
        web("uid-1", "start", "10:00:00"),
        web("uid-1", "end", "10:05:30"),
        web("uid-2", "start", "10:05:40"),
        web("uid-2", "end", "10:10:00"),
    ]
    items += samples("10:00:10", "10:05:30", {0: 0.8, 1: 0.6}, attrib={0: ("ns", "web-0")})
    items += [sample("10:05:40", {0: 0.0, 1: 0.6})]  # (10:05:30, 10:05:40]: nobody named
    items += samples("10:05:50", "10:10:00", {0: 0.0, 1: 0.6}, attrib={1: ("ns", "web-0")})
    items += samples("10:10:10", END, {0: 0.0, 1: 0.6})
    return sorted(items, key=lambda r: r.time)


def feed(core: NodeCore, items: list[Item]) -> Output:
    out = Output()
    for it in items:
        out.extend(core.sample(it) if isinstance(it, NodeSample) else core.allocation(it))
    return out


def run(items: list[Item], *, restore_at: int | None = None) -> Output:
    """The core over ``items`` (restored from its JSON after ``restore_at`` items), then its
    clock moved on so that every minute up to 10:12 closes."""
    core = NodeCore.new(CLUSTER, NODE, CFG)
    out = Output()
    if restore_at is not None:
        out.extend(feed(core, items[:restore_at]))
        core = NodeCore(json.loads(json.dumps(core.state)), CFG)
        items = items[restore_at:]
    out.extend(feed(core, items))
    out.extend(core.advance(T("10:15:00")))  # watermark 10:13:00
    return out


def g(r: GpuMinute) -> int | str:
    u = r.gpu_uuid
    return int(u[-12:]) if u.startswith("GPU-00000000-0000-0000-0000-") else u


def table(rows: list[GpuMinute]) -> list[tuple[Any, ...]]:
    """(minute, GPU, allocation, allocated s, unallocated s, consumed GPU-s, samples)"""
    return sorted(
        (
            r.minute.strftime("%H:%M"),
            g(r),
            r.allocation_id or "",
            round(r.allocated_s, 6),
            round(r.unallocated_s, 6),
            round(r.consumed_gpu_s, 6),
            r.sample_count,
        )
        for r in rows
    )


def expected() -> list[tuple[Any, ...]]:
    rows: list[tuple[Any, ...]] = []
    for m in range(13):  # 10:00 .. 10:12
        hm = f"10:{m:02d}"
        # GPU 0: A's until 10:05:30 (busy 0.8), then nobody's (idle)
        if m < 5:
            rows.append((hm, 0, A, 60.0, 0.0, 48.0, 6))
        elif m == 5:
            rows.append((hm, 0, A, 30.0, 0.0, 24.0, 3))  # samples :10 :20 :30
            rows.append((hm, 0, "", 0.0, 30.0, 0.0, 3))  # samples :40 :50 10:06:00
        else:
            rows.append((hm, 0, "", 0.0, 60.0, 0.0, 6))
        # GPU 1: nobody's until 10:05:40, B's until 10:10:00, then nobody's (0.6 all along)
        if m < 5 or m >= 10:
            rows.append((hm, 1, "", 0.0, 60.0, 36.0, 6))
        elif m == 5:
            rows.append((hm, 1, "", 0.0, 40.0, 24.0, 4))  # samples :10 .. :40
            rows.append((hm, 1, B, 20.0, 0.0, 12.0, 2))  # samples :50, 10:06:00
        else:
            rows.append((hm, 1, B, 60.0, 0.0, 36.0, 6))
    return sorted(rows)


def totals(rows: list[GpuMinute]) -> dict[tuple[Any, str], float]:
    out: dict[tuple[Any, str], float] = defaultdict(float)
    for r in rows:
        out[(g(r), r.allocation_id or "")] += r.allocated_s or r.unallocated_s
    return dict(out)


WANT_TOTALS = {(0, A): 330.0, (0, ""): 450.0, (1, B): 260.0, (1, ""): 520.0}


def check(out: Output) -> None:
    assert table(out.minutes) == expected()
    assert totals(out.minutes) == WANT_TOTALS
    assert not [r for r in out.minutes if (g(r), r.allocation_id) in ((0, B), (1, A))]
    assert out.alerts == []
    assert out.refused == []


def test_a_pod_recreated_under_its_name_on_another_gpu_is_a_new_allocation() -> None:
    check(run(scenario()))


def test_the_same_minutes_whatever_the_order_within_the_lateness() -> None:
    """Pod events 60 s behind, then shuffled in windows of 6 records after the first minute
    (a GPU counts as capacity from its first sample to arrive): the attribution is matched by
    time, not by what the core knew when the sample came. B's first samples on GPU 1 come
    before A's deletion is known, while A's minutes 10:03 and 10:04 are still open: A, of
    one GPU, holds the one its name was seen on first, GPU 0."""

    def delayed_by(r: Item) -> datetime:
        return r.time + timedelta(seconds=60 if isinstance(r, AllocationEvent) else 0)

    delayed = sorted(scenario(), key=delayed_by)
    rng = random.Random(7)
    for i in range(6, len(delayed), 6):
        chunk = delayed[i : i + 6]
        rng.shuffle(chunk)
        delayed[i : i + 6] = chunk
    out = run(delayed)
    assert table(out.minutes) == expected()
    assert out.refused == []
    assert [a for a in out.alerts if a.allocation_id == B] == []


def test_the_old_name_on_a_sample_after_the_new_pod_started_does_not_move_it() -> None:
    """The sample at 10:05:40 (B's start) still names web-0 on GPU 0 (a label cached by the
    exporter for one more scrape): GPU 0 and GPU 1 both carry B's name in B's life, B holds
    one GPU, and GPU 1 is the one seen longest in it (250 s against 0 s): the same minutes."""
    items = [
        sample("10:05:40", {0: 0.0, 1: 0.6}, attrib={0: ("ns", "web-0")})
        if isinstance(r, NodeSample) and r.time == T("10:05:40")
        else r
        for r in scenario()
    ]
    check(run(items))


def test_restored_mid_stream_it_goes_on_alike() -> None:
    items = scenario()
    cut = next(i for i, r in enumerate(items) if r.time > T("10:07:00"))
    check(run(items, restore_at=cut))


def test_before_any_sample_names_the_new_pod_it_holds_a_placeholder() -> None:
    """B's GPU is known only from its first sample (10:05:50): until then, B holds a stand-in
    (as any pod with no attribution yet), never A's GPU."""
    items = [r for r in scenario() if r.time <= T("10:05:45")]
    core = NodeCore.new(CLUSTER, NODE, CFG)
    feed(core, items)
    rows = node_minutes(core.state, ms("10:05:00"), CFG.idle.for_alloc)
    stand_in = placeholder_uuid(CLUSTER, NODE, f"{B}/0")
    mine = {(g(r), r.allocation_id) for r in rows if r.allocation_id}
    assert mine == {(0, A), (stand_in, B)}
    core.sample(sample("10:05:50", {0: 0.0, 1: 0.6}, attrib={1: ("ns", "web-0")}))
    rows = node_minutes(core.state, ms("10:05:00"), CFG.idle.for_alloc)
    assert {(g(r), r.allocation_id) for r in rows if r.allocation_id} == {(0, A), (1, B)}


def test_a_third_pod_of_the_name_back_on_the_first_gpu_leaves_the_second_its_own() -> None:
    """web-0 on GPU 0 (A), then GPU 1 (B, 10:05:40 to 10:07:00), then GPU 0 again (C, from
    10:07:10): GPU 0's two spells of web-0 are two observations, and B, alive between them,
    holds only GPU 1."""
    items: list[Item] = [
        web("uid-1", "start", "10:00:00"),
        web("uid-1", "end", "10:05:30"),
        web("uid-2", "start", "10:05:40"),
        web("uid-2", "end", "10:07:00"),
        web("uid-3", "start", "10:07:10"),
    ]
    ns = ("ns", "web-0")
    items += samples("10:00:10", "10:05:30", {0: 0.8, 1: 0.6}, attrib={0: ns})
    items += [sample("10:05:40", {0: 0.0, 1: 0.6})]
    items += samples("10:05:50", "10:07:00", {0: 0.0, 1: 0.6}, attrib={1: ns})
    items += [sample("10:07:10", {0: 0.0, 1: 0.6})]
    items += samples("10:07:20", END, {0: 0.9, 1: 0.0}, attrib={0: ns})
    out = run(sorted(items, key=lambda r: r.time))
    held = totals(out.minutes)
    assert held[(0, A)] == 330.0 and (1, A) not in held
    assert held[(1, B)] == 80.0 and (0, B) not in held  # 10:05:40 .. 10:07:00
    assert held[(0, C)] == 350.0 and (1, C) not in held  # 10:07:10 .. 10:13:00
    assert out.alerts == [] and out.refused == []


def test_spans_of_a_pod_name_are_dropped_with_its_pods() -> None:
    """Once A is forgotten (10 minutes after its end), so is what was seen of web-0 in its
    life; B's spans stay while B is held."""
    proc = Processor(CFG)
    for r in scenario():
        proc.handle(r)
    key = f"{CLUSTER}/{NODE}"
    s = proc.cores[key].state
    gpu0, gpu1 = GPU0, GPU1
    assert s["attrib"]["ns/web-0"] == {
        gpu0: [[ms("10:00:10"), ms("10:05:30")]],
        gpu1: [[ms("10:05:50"), ms("10:10:00")]],
    }
    proc.handle(sample("10:18:00", {0: 0.0, 1: 0.0}))  # closed 10:16: A is forgotten
    assert A not in s["allocs"] and B in s["allocs"]
    assert s["attrib"]["ns/web-0"] == {gpu1: [[ms("10:05:50"), ms("10:10:00")]]}
    proc.handle(sample("10:23:00", {0: 0.0, 1: 0.0}))  # and B
    assert "ns/web-0" not in s["attrib"]


def test_a_checkpoint_from_before_spans_restores_and_tells_the_pods_apart() -> None:
    """A checkpoint written before attributions were spans (``{uuid: last sample time}``),
    taken while A runs: restored, A keeps GPU 0 and B, recreated afterwards, is told apart."""
    items = scenario()
    cut = next(i for i, r in enumerate(items) if r.time > T("10:04:00"))
    core = NodeCore.new(CLUSTER, NODE, CFG)
    out = feed(core, items[:cut])
    old: Any = json.loads(json.dumps(core.state))
    old["attrib"] = {
        k: {u: spans[-1][1] for u, spans in pods.items()} for k, pods in old["attrib"].items()
    }
    assert old["attrib"] == {"ns/web-0": {GPU0: ms("10:04:00")}}
    core = NodeCore(old, CFG)
    assert core.state["attrib"] == {"ns/web-0": {GPU0: [[ms("10:00:00"), ms("10:04:00")]]}}
    out.extend(feed(core, items[cut:]))
    out.extend(core.advance(T("10:15:00")))
    check(out)


@pytest.mark.parametrize("seed", range(5))
def test_sightings_of_a_name_on_a_gpu_make_the_same_spans_in_any_order(seed: int) -> None:
    """Sightings within the gap (two sample intervals) of each other are one span, whatever
    the order they come in; past SPANS_KEPT spans the two closest merge."""
    times = [10, 20, 30, 40, 60, 70, 200, 230, 260]  # seconds; gap 20 s
    rng = random.Random(seed)
    rng.shuffle(times)
    pods: dict[str, list[list[int]]] = {}
    for t in times:
        see(pods, GPU0, t * 1000, 20_000)
    assert pods[GPU0] == [
        [10_000, 70_000],
        [200_000, 200_000],
        [230_000, 230_000],
        [260_000, 260_000],
    ]
    far = [[t * 100_000] * 2 for t in range(SPANS_KEPT)]  # 100 s apart
    latest = far[-1][0]
    see({GPU0: far}, GPU0, latest + 50_000, 20_000)  # one more, 50 s after: those two merge
    assert len(far) == SPANS_KEPT and far[-1] == [latest, latest + 50_000]
    assert far[:-1] == [[t * 100_000] * 2 for t in range(SPANS_KEPT - 1)]


def k8s(uid: str, kind: PodEventKind, hms: str) -> K8sPodEvent:
    """The watcher's record of one transition of ns/web-0 (a StatefulSet's pod)."""
    return K8sPodEvent(
        event_id=f"k8s/{CLUSTER}/{uid}/{kind.value}",
        kind=kind,
        time=T(hms),
        source=EventSource.WATCH,
        cluster=CLUSTER,
        uid=uid,
        namespace="ns",
        name="web-0",
        node=NODE,
        phase=PodPhase.RUNNING if kind is PodEventKind.BOUND else PodPhase.SUCCEEDED,
        gpus=1,
        owner_kind="StatefulSet",
        owner_name="web",
        owner="carol",
        team="nlp",
    )


def as_watched() -> list[NodeSample | K8sPodEvent]:
    """The scenario as the producers publish it: pod events, not allocation events."""
    pods = [
        k8s("uid-1", PodEventKind.BOUND, "10:00:00"),
        k8s("uid-1", PodEventKind.DELETED, "10:05:30"),
        k8s("uid-2", PodEventKind.BOUND, "10:05:40"),
        k8s("uid-2", PodEventKind.DELETED, "10:10:00"),
    ]
    recs = [r for r in scenario() if isinstance(r, NodeSample)]
    return sorted([*pods, *recs], key=lambda r: r.time)


async def through_join(partitions: int, restart_at: int) -> tuple[list[GpuMinute], list[Alert]]:
    """The records as bytes through ``Join`` (what the worker runtime hands the messages the
    engine delivers), killed and restored from its checkpoint after ``restart_at``
    records."""
    cfg = CoreConfig(idle=IdleConfig(minutes=3), max_future_ms=None, max_past_ms=None)
    out = Capture()
    join = Join(out, "", cfg, partitions=partitions)
    offsets: dict[tuple[str, int], int] = {}
    for i, rec in enumerate(as_watched()):
        if i == restart_at:
            await join.drain(float("inf"))
            snap = join.snapshot({s: {} for s in join.shards})
            join = Join(out, "", cfg, partitions=partitions)
            join.restore({k: v for _, k, v in snap})
        topic = SAMPLES if isinstance(rec, NodeSample) else K8S_PODS
        key = topic.key_for(rec)
        p = partition_for(key.decode(), partitions) if topic is SAMPLES else 0
        off = offsets[topic.name, p] = offsets.get((topic.name, p), -1) + 1
        raw = RawMessage(topic.name, p, off, key, encode(rec), ms(rec.time))
        await join.ingest((topic.name, p), raw)
        await join.drain(join.frontier([]))
    await join.flush_all()
    minutes = [decode(MINUTES, v) for t, _, v, _ in out.messages if t == MINUTES.name]
    alerts = [decode(ALERTS, v) for t, _, v, _ in out.messages if t == ALERTS.name]
    return minutes, alerts


@pytest.mark.parametrize("partitions", [1, 3])
def test_through_the_join_the_worker_runs_from_pod_events(partitions: int) -> None:
    n = len(as_watched())
    minutes, alerts = asyncio.run(through_join(partitions, restart_at=n // 2))
    closed = [r for r in minutes if r.minute <= T("10:12:00")]
    assert table(closed) == expected()
    assert len(closed) == len({(r.minute, r.gpu_uuid, r.allocation_id) for r in closed})
    assert [a for a in alerts if a.allocation_id in (A, B)] == []


def ms(hms: str | datetime) -> int:
    t = T(hms) if isinstance(hms, str) else hms
    return int(t.timestamp() * 1000)


@pytest.mark.kafka
def test_the_worker_tells_the_pods_apart(kafka: Any) -> None:
    """The scenario's pod events and samples on a real broker, through the worker as it runs:
    the same minutes, and no idle alert (the policy's N = 3 minutes, as above)."""
    import os

    from gpugap.groundfloor.kafka.consume import read_topic
    from gpugap.groundfloor.kafka.publish import KafkaPublisher
    from gpugap.schemas import TOPICS
    from tests.harness.topics import create_topics

    async def publish() -> None:
        await create_topics(kafka, list(TOPICS))  # kept forever: the records are in the past
        async with KafkaPublisher(kafka) as pub:
            for r in as_watched():
                await pub.send(SAMPLES if isinstance(r, NodeSample) else K8S_PODS, r)

    asyncio.run(asyncio.wait_for(publish(), 120))
    # the Faust app, as ``gpugap worker`` runs it
    env = {
        **os.environ,
        "GPUGAP_KAFKA_BOOTSTRAP": kafka.bootstrap,
        "GPUGAP_KAFKA_TOPIC_PREFIX": kafka.topic_prefix,
        "GPUGAP_IDLE_MINUTES": "3",
        "GPUGAP_LOG_LEVEL": "WARNING",
    }
    cmd = ["worker", "--http", "", "--idle-flush", "1"]
    run_gpugap([*cmd, "--idle-timeout", "3", "--backfill"], env, timeout=300)
    minutes = asyncio.run(read_topic(kafka, MINUTES))
    alerts = asyncio.run(read_topic(kafka, ALERTS))
    closed = [r for r in minutes if r.minute <= T("10:12:00")]
    assert table(closed) == expected()
    assert len(closed) == len({(r.minute, r.gpu_uuid, r.allocation_id) for r in closed})
    assert [a for a in alerts if a.allocation_id in (A, B)] == []
