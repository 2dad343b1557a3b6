"""The worker's state is bounded (docs/worker.md#state-bounds): silent nodes, GPUs, pod
attributions and gangs are forgotten after the expiry (in event time, never while something of
them is open or an allocation runs there), and the nodes, GPUs per node and allocations per
node held are capped, one more being a dead letter with the reason. Pure core, no Kafka."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any

import pytest

from gpugap.groundfloor.kafka.consume import RawMessage
from gpugap.schemas import encode
from gpugap.schemas.models import (
    AllocationEvent,
    GpuMinute,
    GpuSample,
    K8sPodEvent,
    NodeSample,
    Record,
)
from gpugap.schemas.types import (
    MAX_GPUS_PER_NODE,
    DeadLetterKind,
    EventSource,
    PodEventKind,
    PodPhase,
    SampleSource,
)
from gpugap.streams import process
from gpugap.streams.allocate import GangTracker
from gpugap.streams.checkpoint import unpack
from gpugap.streams.core import EVENTS_KEPT, CoreConfig, state_bounds
from gpugap.streams.join import Join
from gpugap.streams.process import Processor, Result
from gpugap.streams.settings import WorkerSettings
from tests.streams.helpers import CLUSTER, Null, T, gpu, pod, sample, samples, slurm

MIN = 60_000
EXPIRY = 10 * MIN
CFG = CoreConfig(node_expiry_ms=EXPIRY)
N1, N2, N3 = f"{CLUSTER}/n1", f"{CLUSTER}/n2", f"{CLUSTER}/n3"


def by_time(*parts: Iterable[Record]) -> list[Record]:
    return sorted((r for p in parts for r in p), key=lambda r: r.time)  # type: ignore[attr-defined]


def run(proc: Processor, recs: Iterable[Record], watch: str | None = None) -> tuple[Result, Any]:
    """Each record, then the worker's advance; ``watch``: (record time, held?) per record."""
    out, seen = Result(), []
    for r in recs:
        out.add(proc.handle(r))
        out.add(proc.advance())
        if watch is not None:
            seen.append((r.time, watch in proc.cores))  # type: ignore[attr-defined]
    return out, seen


def rows_of(out: Result, node: str) -> list[GpuMinute]:
    return [m for m in out.minutes if m.node == node]


def minutes(rows: list[GpuMinute]) -> list[str]:
    return sorted({r.minute.strftime("%H:%M") for r in rows})


def clock(start: str, end: str) -> list[NodeSample]:
    """Node n2 keeps reporting: the shard's watermark moves on."""
    return samples(start, end, {0: 0.9}, node="n2")


# --- the node expiry -------------------------------------------------------------------


def test_a_silent_node_is_dropped_after_the_expiry_and_not_before() -> None:
    proc = Processor(CFG)
    n1 = samples("10:00:10", "10:05:00", {0: 0.5, 1: 0.5})
    out, seen = run(proc, by_time(n1, clock("10:00:10", "10:30:00")), watch=N1)
    last = T("10:05:00")
    # held while the watermark (max event time - 120 s lateness) is within the expiry of
    # its last record; dropped at the first sweep after that (within the next minute)
    for t, held in seen:
        if t - timedelta(seconds=120) < last + timedelta(milliseconds=EXPIRY):
            assert held, t
    gone = [t for t, held in seen if not held]
    assert gone and gone[0] <= last + timedelta(milliseconds=EXPIRY + 120_000 + 70_000)
    assert N1 not in proc.state["nodes"] and N2 in proc.cores
    # every minute of n1 up to its drop was emitted once per GPU, nothing after
    rows = rows_of(out, "n1")
    assert len(rows) == len({(r.gpu_uuid, r.minute) for r in rows})
    assert minutes(rows)[0] == "10:00" and max(r.minute for r in rows) < gone[0]
    assert {r.no_samples for r in rows if r.minute >= T("10:06:00")} == {True}
    assert out.alerts == [] and out.refused == []
    counts = proc.counts()
    assert counts["nodes_expired"] == 1
    assert counts["samples"] == len(n1) + len(clock("10:00:10", "10:30:00"))  # totals stay


def test_no_expiry_keeps_every_node() -> None:
    proc = Processor(CoreConfig(node_expiry_ms=None))
    n1 = samples("10:00:10", "10:05:00", {0: 0.5})
    run(proc, by_time(n1, clock("10:00:10", "10:40:00")))
    assert N1 in proc.cores and "nodes_expired" not in proc.counts()


def test_a_node_with_a_running_allocation_is_kept_however_long_it_is_silent() -> None:
    proc = Processor(CFG)
    recs = by_time(
        [slurm("7", "start", "01:00:00", (0,))],
        samples("01:00:10", "01:05:00", {0: 0.0}),
        # a job on a node that never reports: allocated, consumption unknown
        [slurm("8", "start", "01:00:00", (0, 1), node="n3")],
        samples("01:00:00", "23:00:00", {0: 0.9}, node="n2", interval=600.0)[::60],
    )
    out, _ = run(proc, recs)
    assert N1 in proc.cores and N3 in proc.cores  # 22 hours silent: long jobs, not garbage
    last = max(r.minute for r in rows_of(out, "n1"))
    assert last > T("22:00:00")
    [row] = [r for r in rows_of(out, "n1") if r.minute == last]
    assert (row.allocation_id, row.allocated_s, row.no_samples) == ("slurm/hpc/7", 60.0, True)
    n3 = [r for r in rows_of(out, "n3") if r.minute == last]
    assert len(n3) == 2 and all(r.allocated_s == 60.0 and r.no_samples for r in n3)
    # the jobs end: the nodes go once silent for the expiry after that
    ends = [slurm("7", "end", "23:00:00", (0,)), slurm("8", "end", "23:00:00", (0, 1), node="n3")]
    out, _ = run(proc, by_time(ends, clock("23:00:00", "23:20:00")))
    assert N1 not in proc.cores and N3 not in proc.cores and N2 in proc.cores
    assert out.refused == []


def test_an_open_idle_episode_or_a_minute_still_open_keeps_a_node() -> None:
    from gpugap.streams.process import kept

    proc = Processor(CFG)
    run(proc, samples("10:00:10", "10:02:00", {0: 0.5}))
    s = proc.cores[N1].state
    assert kept(s, process.last_input(s) or 0) == "open"  # its minutes are not closed yet
    s["closed_ms"] = process.last_input(s) + MIN  # type: ignore[operator]
    assert kept(s, process.last_input(s) or 0) is None
    s["idle"]["episodes"] = {"x": {}}  # type: ignore[typeddict-item]
    assert kept(s, process.last_input(s) or 0) == "open"


def test_a_node_back_after_its_expiry_starts_afresh_with_the_right_minutes() -> None:
    before = samples("10:00:10", "10:05:00", {0: 0.5})
    back = by_time(
        samples("10:40:00", "10:46:00", {0: 0.25}),
        [slurm("9", "start", "10:41:00", (0,)), slurm("9", "end", "10:44:00", (0,))],
    )
    proc = Processor(CFG)
    run(proc, by_time(before, clock("10:00:10", "10:39:50")))
    assert N1 not in proc.cores
    out, _ = run(proc, by_time(back, clock("10:40:00", "10:50:00")))
    fresh = Processor(CFG)
    want, _ = run(fresh, by_time(back, clock("10:40:00", "10:50:00")))

    def table(o: Result) -> list[tuple[Any, ...]]:
        return sorted(
            (r.minute, r.allocation_id or "", r.allocated_s, r.unallocated_s, r.consumed_gpu_s)
            for r in rows_of(o, "n1")
        )

    got = table(out)
    assert got == table(want) and got
    assert not [r for r in rows_of(out, "n1") if T("10:20:00") <= r.minute < T("10:39:00")]
    by_minute = {(m.strftime("%H:%M"), a): (al, un, c) for m, a, al, un, c in got}
    assert by_minute["10:40", ""] == (0.0, 60.0, 15.0)  # 0.25 x 60 s, nobody holds it
    assert by_minute["10:42", "slurm/hpc/9"] == (60.0, 0.0, 15.0)
    assert ("10:42", "") not in by_minute  # held the whole minute
    assert by_minute["10:44", ""] == (0.0, 60.0, 15.0)  # the job ended at 10:44:00


def test_a_late_record_of_a_dropped_node_is_late_not_a_minute_emitted_twice() -> None:
    proc = Processor(CFG)
    out, _ = run(
        proc, by_time(samples("10:00:10", "10:05:00", {0: 0.5}), clock("10:00:10", "10:25:00"))
    )
    assert N1 not in proc.cores
    emitted = {(r.gpu_uuid, r.minute) for r in rows_of(out, "n1")}
    assert (gpu(0), T("10:03:00")) in emitted
    late, _ = run(proc, [sample("10:03:30", {0: 1.0}), slurm("5", "start", "10:03:00", (0,))])
    kinds = [r.kind for r in late.refused]
    assert kinds[0] is DeadLetterKind.LATE and DeadLetterKind.LATE in kinds[1:]
    later, _ = run(proc, clock("10:25:10", "10:30:00"))
    again = {(r.gpu_uuid, r.minute) for r in rows_of(late, "n1") + rows_of(later, "n1")}
    assert not again & emitted  # no minute of n1 a second time


# --- the node cap ----------------------------------------------------------------------


def test_the_cap_refuses_a_new_node_beyond_it_and_the_others_go_on() -> None:
    proc = Processor(CoreConfig(node_expiry_ms=EXPIRY, max_nodes=2))
    out, _ = run(
        proc,
        by_time(
            samples("10:00:10", "10:03:00", {0: 0.5}),
            clock("10:00:10", "10:03:00"),
            [sample("10:01:00", {0: 0.5}, node="n3"), slurm("4", "start", "10:01:00", node="n4")],
        ),
    )
    assert sorted(proc.cores) == [N1, N2]
    refused = [r for r in out.refused]
    assert [type(r.record) for r in refused] == [NodeSample, AllocationEvent]
    for r in refused:
        assert r.kind is DeadLetterKind.REJECTED and "GPUGAP_WORKER_MAX_NODES" in r.reason
    assert {m.node for m in out.minutes} == {"n1", "n2"}
    assert proc.counts()["nodes_refused"] == 2
    # n1 goes silent and expires: a new node is taken again
    run(proc, clock("10:03:10", "10:20:00"))
    assert N1 not in proc.cores
    out, _ = run(proc, [sample("10:20:00", {0: 0.5}, node="n3")])
    assert out.refused == [] and N3 in proc.cores


def test_the_cap_counts_every_shard_of_a_worker_and_refusals_are_dead_letters() -> None:
    cfg = CoreConfig(max_nodes=2)
    join = Join(Null(), "", cfg, partitions=2)
    s0, s1 = join.shards[0], join.shards[1]
    assert s0.step(sample("10:00:10", {0: 0.5}, node="a")).refused == []
    assert s1.step(sample("10:00:10", {0: 0.5}, node="b")).refused == []
    [r] = s0.step(sample("10:00:20", {0: 0.5}, node="c")).refused
    assert "holds 2 nodes already" in r.reason and join.nodes_held() == 2

    one = Join(Null(), "", cfg)  # through ingest and drain: the dead letter is routed

    async def go() -> None:
        for i, n in enumerate(["a", "b", "c", "a"]):
            value = encode(sample(f"10:00:{10 + i}", {0: 0.5}, node=n))
            await one.ingest("tp", RawMessage("gpu.samples.v1", 0, i, None, value))
        await one.drain(float("inf"))

    asyncio.run(go())
    assert one.dl.counts[DeadLetterKind.REJECTED.value] == 1
    assert one.nodes_held() == 2
    one.snapshot({0: {}})
    assert one.stats.nodes == 2 and one.stats.core["nodes_refused"] == 1
    assert "gpugap_worker_nodes 2" in one.stats.prometheus(one.dl.counts)


# --- the other per-key maps --------------------------------------------------------------


def test_a_gpu_that_stops_reporting_is_forgotten_and_one_a_job_holds_is_not() -> None:
    proc = Processor(CFG)
    recs = by_time(
        samples("10:00:10", "10:02:00", {0: 0.5, 1: 0.5, 2: 0.5}),
        samples("10:02:10", "10:30:00", {0: 0.5}),  # GPUs 1 and 2 go quiet
        [slurm("3", "start", "10:01:00", (2,))],  # a job holds GPU 2
    )
    out, _ = run(proc, recs)
    s = proc.cores[N1].state
    assert sorted(s["known"]) == [gpu(0), gpu(2)] and sorted(s["samples"]) == [gpu(0), gpu(2)]
    assert proc.counts()["gpus_expired"] == 1
    late = [r.minute for r in out.minutes if r.gpu_uuid == gpu(1)]
    assert max(late) < T("10:16:00")  # no capacity from it after the expiry
    assert max(r.minute for r in out.minutes if r.gpu_uuid == gpu(2)) >= T("10:26:00")


def test_a_node_holds_at_most_its_gpus_the_sample_that_would_add_more_is_refused() -> None:
    def many(hms: str, first: int, n: int) -> NodeSample:
        gpus = tuple(GpuSample(uuid=gpu(first + i), index=i, power_w=100.0) for i in range(n))
        return NodeSample(
            cluster=CLUSTER, node="n1", time=T(hms), source=SampleSource.SIMULATOR, gpus=gpus
        )

    proc = Processor(CFG)
    assert proc.handle(many("10:00:10", 0, 200)).refused == []
    [r] = proc.handle(many("10:00:20", 1000, 100)).refused
    assert r.kind is DeadLetterKind.REJECTED and f"at most {MAX_GPUS_PER_NODE}" in r.reason
    assert len(proc.cores[N1].state["known"]) == 200
    assert proc.handle(many("10:00:30", 0, 200)).refused == []  # the known ones go on


def test_the_gpus_a_worker_holds_are_capped_over_its_shards_and_counted_back() -> None:
    join = Join(Null(), "", CoreConfig(node_expiry_ms=EXPIRY, max_gpus=3), partitions=2)
    s0, s1 = join.shards[0], join.shards[1]
    assert s0.step(sample("10:00:10", {0: 0.5, 1: 0.5})).refused == []
    [r] = s1.step(sample("10:00:10", {0: 0.5, 1: 0.5}, node="n2")).refused
    assert r.kind is DeadLetterKind.REJECTED and "GPUGAP_WORKER_MAX_GPUS" in r.reason
    assert N2 not in s1.cores  # refused before the node was taken
    assert s1.step(sample("10:00:10", {0: 0.5}, node="n2")).refused == []
    assert (join.gpus_held(), join.nodes_held()) == (3, 2)
    assert s0.step(sample("10:00:20", {0: 0.5, 1: 0.5})).refused == []  # known: goes on
    # n1's GPU 1 goes quiet and expires, then n1 itself: the GPUs are counted back
    run(s0, by_time(samples("10:00:30", "10:14:00", {0: 0.5})))
    assert join.gpus_held() == 2
    run(s0, samples("10:00:10", "10:40:00", {0: 0.9}, node="n5"))  # shard 0's clock
    assert N1 not in s0.cores
    assert join.gpus_held() == 2  # n2's (shard 1), n5's (shard 0)
    assert s1.counts()["gpus_refused"] == 1


def test_the_allocations_a_worker_holds_are_capped_and_counted_back() -> None:
    join = Join(Null(), "", CoreConfig(node_expiry_ms=EXPIRY, max_allocs=2), partitions=2)
    s0, s1 = join.shards[0], join.shards[1]
    assert s0.step(slurm("1", "start", "10:00:00", node="a")).refused == []
    assert s1.step(slurm("2", "start", "10:00:00", node="b")).refused == []
    [r] = s1.step(slurm("3", "start", "10:00:00", node="c")).refused
    assert "GPUGAP_WORKER_MAX_ALLOCATIONS" in r.reason and "hpc/c" not in s1.cores
    assert s1.step(slurm("2", "end", "10:01:00", node="b")).refused == []  # held: goes on
    assert s0.step(slurm("1", "start", "10:00:00", node="a")).refused == []  # a duplicate
    # job 2 ended: 10 minutes later it is no longer held, and a new one is taken
    run(s1, samples("10:00:10", "10:15:00", {0: 0.5}, node="n5"))
    assert join.allocations_held() == 1
    assert s1.step(slurm("3", "start", "10:15:00", node="c")).refused == []
    assert s1.counts()["allocations_refused"] == 1


def test_allocations_per_node_are_capped_and_event_ids_kept_are_bounded() -> None:
    proc = Processor(CoreConfig(max_allocs_per_node=2))
    out, _ = run(proc, [pod("u1", "start", "10:00:00"), pod("u2", "start", "10:00:01")])
    assert out.refused == []
    out, _ = run(proc, [pod("u3", "start", "10:00:02")])
    [r] = out.refused
    assert (
        r.kind is DeadLetterKind.REJECTED and "GPUGAP_WORKER_MAX_ALLOCATIONS_PER_NODE" in r.reason
    )
    out, _ = run(proc, [pod("u1", "end", "10:00:03")])  # an end of one held is never refused
    assert out.refused == []
    ev = pod("u2", "start", "10:00:01")
    for i in range(EVENTS_KEPT + 8):
        proc.handle(ev.model_copy(update={"event_id": f"{ev.event_id}/{i}"}))
    assert len(proc.cores[N1].state["allocs"]["k8s/hpc/u2"]["events"]) == EVENTS_KEPT


def test_a_pod_attribution_no_allocation_names_is_forgotten_after_the_expiry() -> None:
    proc = Processor(CFG)
    recs = by_time(
        samples("10:00:10", "10:02:00", {0: 0.5}, attrib={0: ("ns", "gone")}),
        samples("10:00:10", "10:02:00", {1: 0.5}, attrib={1: ("ns", "p")}),
        samples("10:02:10", "10:20:00", {0: 0.5, 1: 0.5}),
        [pod("u1", "start", "10:00:00")],  # pod "p" runs on: its GPUs stay learned
    )
    run(proc, recs)
    assert sorted(proc.cores[N1].state["attrib"]) == ["ns/p"]


def gang_pod(uid: str, hms: str, gang: str, gpus: int) -> K8sPodEvent:
    return K8sPodEvent(
        event_id=f"k8s/kube/{uid}/bound",
        kind=PodEventKind.BOUND,
        time=T(hms),
        source=EventSource.WATCH,
        cluster="kube",
        uid=uid,
        namespace="ml",
        name=f"w-{uid}",
        node="k1",  # a pod of no GPU binds too: its gang holds nothing
        phase=PodPhase.RUNNING,
        gpus=gpus,
        gang_id=gang,
        gang_size=2,
    )


def test_gangs_are_capped_and_one_never_bound_is_forgotten_after_the_expiry() -> None:
    g = GangTracker(lateness_ms=0, expiry_ms=EXPIRY, max_gangs=2)
    g.pod(gang_pod("a", "10:00:00", "never-bound", 0))
    g.pod(gang_pod("b", "10:00:00", "partial", 2))  # 1 of 2 bound: its alert opens
    g.pod(gang_pod("c", "10:00:00", "third", 2))
    assert sorted(g.state["gangs"]) == ["kube/never-bound", "kube/partial"]
    assert g.counts["gangs_refused"] == 1
    g.advance(ms(T("10:09:00")))
    assert len(g.state["gangs"]) == 2
    g.advance(ms(T("10:11:00")))
    assert sorted(g.state["gangs"]) == ["kube/partial"]  # its alert is open: kept
    assert g.counts["gangs_expired"] == 1


def ms(t: datetime) -> int:
    return int(t.timestamp() * 1000)


# --- checkpoints, parts, settings ----------------------------------------------------------


def test_snapshot_and_restore_after_the_expiry_round_trip() -> None:
    first = by_time(samples("10:00:10", "10:05:00", {0: 0.5}), clock("10:00:10", "10:06:00"))
    second = by_time(
        clock("10:06:10", "10:25:00"), samples("10:20:00", "10:22:00", {0: 0.1}, node="n3")
    )
    rest = by_time(clock("10:25:10", "10:45:00"))
    join = Join(Null(), "", CFG)
    topic: dict[bytes, bytes] = {}  # a compacted topic: the latest value per key

    def store(points: int) -> list[tuple[int, bytes, bytes | None]]:
        items = join.snapshot({0: {"in:0": points}})
        for _, k, v in items:
            if v is None:
                topic.pop(k, None)
            else:
                topic[k] = v
        join.snapshot_stored()
        return items

    run(join.proc, first)
    assert b"node:hpc/n1" in {k for _, k, _ in store(1)}
    run(join.proc, second)
    assert N1 not in join.proc.cores
    assert (0, b"node:hpc/n1", None) in store(2)  # the dropped node's tombstone
    assert b"node:hpc/n1" not in topic and "hpc/n1" not in unpack(topic[b"meta"])["node_keys"]

    restored = Join(Null(), "", CFG)
    assert restored.restore(topic) == {0: {"in:0": 2}}
    assert json.loads(json.dumps(restored.proc.state)) == json.loads(json.dumps(join.proc.state))
    a, _ = run(restored.proc, rest)
    b, _ = run(join.proc, rest)
    assert [m.model_dump_json() for m in a.minutes] == [m.model_dump_json() for m in b.minutes]
    assert N3 not in restored.proc.cores and N3 not in join.proc.cores  # expired in both
    assert restored.proc.state == join.proc.state


def test_advancing_in_parts_is_advance() -> None:
    def quiet() -> Processor:
        proc = Processor(CFG)
        for n in range(20):
            proc.handle(sample("10:00:10", {0: 0.5, 1: 0.5}, node=f"q{n}"))
        proc.handle(sample("10:05:00", {0: 0.5}, node="n2"))
        return proc

    a, b = quiet(), quiet()
    whole = a.advance(merge=False)
    old = process.ROWS_PER_PART
    process.ROWS_PER_PART = 7
    try:
        parts = list(b.advancing())
    finally:
        process.ROWS_PER_PART = old
    assert len(parts) > 3
    assert [m for p in parts for m in p.minutes] == whole.minutes and whole.minutes
    assert a.state == b.state


def test_the_worker_settings_set_the_bounds(monkeypatch: pytest.MonkeyPatch) -> None:
    assert state_bounds(WorkerSettings()) == {
        "node_expiry_ms": 3_600_000,
        "max_nodes": 200_000,
        "max_gpus": 1_600_000,
        "max_allocs": 400_000,
        "max_allocs_per_node": 1_024,
    }
    assert CoreConfig() == CoreConfig(**state_bounds(WorkerSettings()))
    monkeypatch.setenv("GPUGAP_WORKER_NODE_IDLE_EXPIRY_S", "0")
    monkeypatch.setenv("GPUGAP_WORKER_MAX_NODES", "0")
    monkeypatch.setenv("GPUGAP_WORKER_MAX_GPUS", "0")
    monkeypatch.setenv("GPUGAP_WORKER_MAX_ALLOCATIONS", "0")
    off = state_bounds(WorkerSettings())
    assert [off[k] for k in ("node_expiry_ms", "max_nodes", "max_gpus", "max_allocs")] == [None] * 4
    monkeypatch.setenv("GPUGAP_WORKER_NODE_IDLE_EXPIRY_S", "30")
    with pytest.raises(ValueError, match="at least 60"):
        WorkerSettings()
    with pytest.raises(ValueError, match="at least a minute"):
        CoreConfig(node_expiry_ms=1000)
