"""The per-node core, case by case, against hand-computed minutes."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from gpugap.schemas.models import AllocationEvent, GpuMinute, NodeSample
from gpugap.schemas.types import DeadLetterKind
from gpugap.streams.core import CoreConfig, NodeCore, Output, placeholder_uuid
from gpugap.streams.detect_idle import IdleConfig
from tests.streams.helpers import CLUSTER, NODE, T, pod, sample, samples, slurm

Item = NodeSample | AllocationEvent


def feed(core: NodeCore, items: list[Item]) -> Output:
    out = Output()
    for it in items:
        out.extend(core.sample(it) if isinstance(it, NodeSample) else core.allocation(it))
    return out


def key(r: GpuMinute) -> tuple[Any, ...]:
    return (r.minute, r.gpu_uuid, r.allocation_id or "")


def table(rows: list[GpuMinute]) -> list[tuple[Any, ...]]:
    """(minute HH:MM, gpu i or uuid, allocation, allocated, unallocated, consumed, n, no_samples)"""
    out = []
    for r in sorted(rows, key=key):
        g = r.gpu_uuid
        gi = int(g[-12:]) if g.startswith("GPU-00000000-0000-0000-0000-") else g
        out.append(
            (
                r.minute.strftime("%H:%M"),
                gi,
                r.allocation_id,
                round(r.allocated_s, 6),
                round(r.unallocated_s, 6),
                round(r.consumed_gpu_s, 6),
                r.sample_count,
                r.no_samples,
            )
        )
    return out


JOB = "slurm/hpc/7"

# GPU 0 at 0.5 from 10:00:00 to 10:03:00 (samples at 10:00:10 ... 10:03:00); job 7 holds it
# from 10:00:30 to 10:02:15. Samples (t-10, t] time-weighted.
BASIC: list[Item] = sorted(
    [
        *samples("10:00:10", "10:03:00", {0: 0.5}),
        slurm("7", "start", "10:00:30"),
        slurm("7", "end", "10:02:15"),
    ],
    key=lambda r: r.time,
)
BASIC_EXPECTED = [
    ("10:00", 0, None, 0.0, 30.0, 15.0, 3, False),  # [0,30): samples 10,20,30
    ("10:00", 0, JOB, 30.0, 0.0, 15.0, 3, False),  # [30,60): samples 40,50,60
    ("10:01", 0, JOB, 60.0, 0.0, 30.0, 6, False),
    ("10:02", 0, None, 0.0, 45.0, 22.5, 5, False),  # [15,60): samples 20..60 (10-20 partly)
    ("10:02", 0, JOB, 15.0, 0.0, 7.5, 2, False),  # [0,15): samples 10 and 20
]


def run_basic(items: list[Item]) -> tuple[NodeCore, Output]:
    core = NodeCore.new(CLUSTER, NODE)
    out = feed(core, items)
    out.extend(core.advance(T("10:05:00")))  # watermark 10:03:00: closes 10:00..10:02
    return core, out


def test_minutes_split_at_allocation_boundaries() -> None:
    core, out = run_basic(BASIC)
    assert table(out.minutes) == BASIC_EXPECTED
    row = next(r for r in out.minutes if r.allocation_id == JOB)
    assert row.activity_avg == 0.5 and row.activity_max == 0.5
    assert row.activity_metric == "utilization"
    assert row.memory_used_mib_avg == 1000.0 and row.power_w_avg == 100.0
    assert (row.owner, row.team, row.workload_class, row.scheduler) == (
        "alice",
        "vision",
        "batch",
        "slurm",
    )
    assert out.refused == [] and out.alerts == []
    assert core.state["closed_ms"] is not None


def test_nothing_closes_before_the_watermark() -> None:
    core = NodeCore.new(CLUSTER, NODE)
    out = feed(core, samples("10:00:10", "10:02:00", {0: 0.5}))
    # max 10:02:00 - 120 s = 10:00:00: the 10:00 minute is still open
    assert out.minutes == []
    out = core.sample(sample("10:03:00", {0: 0.5}))
    assert [r.minute for r in out.minutes] == [T("10:00:00")]


def test_out_of_order_within_lateness_gives_the_same_minutes() -> None:
    items = list(BASIC)
    # shuffle within windows of 6 messages (< 120 s of event time apart)
    rng = random.Random(3)
    for i in range(0, len(items), 6):
        chunk = items[i : i + 6]
        rng.shuffle(chunk)
        items[i : i + 6] = chunk
    events = [r for r in items if isinstance(r, AllocationEvent)]
    items = events + [r for r in items if isinstance(r, NodeSample)]  # events well ahead
    _, out = run_basic(items)
    assert table(out.minutes) == BASIC_EXPECTED
    assert out.refused == []


def test_duplicates_change_nothing() -> None:
    items = [*BASIC, BASIC[-1], slurm("7", "start", "10:00:30"), slurm("7", "end", "10:02:15")]
    core, out = run_basic(items)
    assert table(out.minutes) == BASIC_EXPECTED
    assert core.state["counts"]["duplicate_events"] == 2
    assert core.state["counts"]["duplicate_gpu_samples"] == 1


def test_late_sample_is_refused_with_a_reason_and_counted() -> None:
    core, _ = run_basic(BASIC)
    out = core.sample(sample("10:01:30", {0: 0.9}))
    assert out.minutes == []
    [refused] = out.refused
    assert refused.kind is DeadLetterKind.LATE
    assert "already closed" in refused.reason
    assert core.state["counts"]["late_samples"] == 1


def test_late_allocation_event_applies_from_the_frontier_and_is_reported() -> None:
    core = NodeCore.new(CLUSTER, NODE)
    feed(core, samples("10:00:10", "10:04:00", {0: 0.5}))  # closes 10:00 and 10:01
    out = core.allocation(slurm("8", "start", "10:00:30"))
    [refused] = out.refused
    assert refused.kind is DeadLetterKind.LATE and "applied from there on" in refused.reason
    out = core.advance(T("10:05:00"))  # closes 10:02
    assert table(out.minutes) == [("10:02", 0, "slurm/hpc/8", 60.0, 0.0, 30.0, 6, False)]


def test_end_without_start_is_refused_when_its_minute_closes() -> None:
    core = NodeCore.new(CLUSTER, NODE)
    out = feed(core, [*samples("10:00:10", "10:01:00", {0: 0.0}), slurm("9", "end", "10:00:45")])
    assert out.refused == []  # a start may still come within the lateness
    out = core.advance(T("10:03:00"))
    [refused] = out.refused
    assert refused.kind is DeadLetterKind.REJECTED and "no start" in refused.reason
    assert isinstance(refused.record, AllocationEvent)
    assert all(r.allocation_id is None for r in out.minutes)
    assert core.state["counts"]["end_without_start"] == 1


def test_end_before_start_allocates_nothing() -> None:
    core = NodeCore.new(CLUSTER, NODE)
    items: list[Item] = [
        *samples("10:00:10", "10:01:00", {0: 0.0}),
        slurm("9", "end", "10:00:20"),
        slurm("9", "start", "10:00:40"),
    ]
    out = feed(core, items)
    out.extend(core.advance(T("10:03:00")))
    [refused] = out.refused
    assert refused.kind is DeadLetterKind.REJECTED and "ends before it starts" in refused.reason
    assert table(out.minutes) == [("10:00", 0, None, 0.0, 60.0, 0.0, 6, False)]


def test_allocation_on_a_node_without_telemetry_is_flagged_not_idle() -> None:
    core = NodeCore(NodeCore.new(CLUSTER, NODE).state, CoreConfig(idle=IdleConfig(minutes=1)))
    out = feed(
        core, [slurm("5", "start", "10:00:00", (0, 1)), slurm("5", "end", "10:02:00", (0, 1))]
    )
    out.extend(core.advance(T("10:04:00")))
    p0, p1 = (placeholder_uuid(CLUSTER, NODE, str(i)) for i in (0, 1))
    assert table(out.minutes) == sorted(
        [("10:00", p, "slurm/hpc/5", 60.0, 0.0, 0.0, 0, True) for p in (p0, p1)]
        + [("10:01", p, "slurm/hpc/5", 60.0, 0.0, 0.0, 0, True) for p in (p0, p1)]
    )
    assert out.alerts == []  # consumption unknown is never idle


def test_kubernetes_pod_gpus_come_from_sample_attribution() -> None:
    core = NodeCore.new(CLUSTER, NODE)
    attrib = {1: ("ns", "p")}
    items: list[Item] = [
        pod("u1", "start", "10:00:20"),
        *samples("10:00:10", "10:00:20", {0: 0.2, 1: 0.0}),
        *samples("10:00:30", "10:02:00", {0: 0.2, 1: 0.6}, attrib=attrib),
        pod("u1", "end", "10:01:30"),
    ]
    out = feed(core, items)
    out.extend(core.advance(T("10:04:00")))
    assert table(out.minutes) == [
        ("10:00", 0, None, 0.0, 60.0, 12.0, 6, False),  # unattributed use 0.2 x 60
        ("10:00", 1, None, 0.0, 20.0, 0.0, 2, False),
        ("10:00", 1, "k8s/hpc/u1", 40.0, 0.0, 24.0, 4, False),
        ("10:01", 0, None, 0.0, 60.0, 12.0, 6, False),
        ("10:01", 1, None, 0.0, 30.0, 18.0, 3, False),
        ("10:01", 1, "k8s/hpc/u1", 30.0, 0.0, 18.0, 3, False),
    ]


def test_two_allocations_in_one_minute_and_the_gap_between() -> None:
    core = NodeCore.new(CLUSTER, NODE)
    items: list[Item] = [
        *samples("10:00:10", "10:02:00", {0: 1.0}),
        slurm("1", "start", "10:00:00"),
        slurm("1", "end", "10:01:20"),
        slurm("2", "start", "10:01:40"),
    ]
    out = feed(core, items)
    out.extend(core.advance(T("10:04:00")))
    assert table(out.minutes) == [
        ("10:00", 0, "slurm/hpc/1", 60.0, 0.0, 60.0, 6, False),
        ("10:01", 0, None, 0.0, 20.0, 20.0, 2, False),
        ("10:01", 0, "slurm/hpc/1", 20.0, 0.0, 20.0, 2, False),
        ("10:01", 0, "slurm/hpc/2", 20.0, 0.0, 20.0, 2, False),
    ]


def test_minutes_without_samples_are_flagged() -> None:
    core = NodeCore.new(CLUSTER, NODE)
    items: list[Item] = [
        slurm("1", "start", "10:00:00"),
        *samples("10:00:10", "10:01:00", {0: 0.5}),
        *samples("10:02:10", "10:03:00", {0: 0.5}),  # nothing reported for 10:01
    ]
    out = feed(core, items)
    out.extend(core.advance(T("10:06:00")))
    assert table(out.minutes)[:3] == [
        ("10:00", 0, "slurm/hpc/1", 60.0, 0.0, 30.0, 6, False),
        ("10:01", 0, "slurm/hpc/1", 60.0, 0.0, 0.0, 0, True),
        ("10:02", 0, "slurm/hpc/1", 60.0, 0.0, 30.0, 6, False),
    ]


def test_state_survives_a_json_round_trip_mid_stream() -> None:
    _, whole = run_basic(BASIC)
    core = NodeCore.new(CLUSTER, NODE)
    first = feed(core, BASIC[:12])
    restored = NodeCore(json.loads(json.dumps(core.state)))
    rest = feed(restored, BASIC[12:])
    rest.extend(restored.advance(T("10:05:00")))
    assert table(first.minutes + rest.minutes) == table(whole.minutes)


def test_overlapping_sample_intervals_do_not_double_count() -> None:
    core = NodeCore.new(CLUSTER, NODE)
    # interval says 30 s but samples come every 10 s: each covers only since the previous one
    out = feed(core, samples("10:00:10", "10:01:00", {0: 1.0}, interval=30.0))
    out.extend(core.advance(T("10:04:00")))
    assert ("10:00", 0, None, 0.0, 60.0, 60.0, 6, False) in table(out.minutes)


@pytest.mark.parametrize("lateness", [60_000, 120_000])
def test_lateness_is_configurable(lateness: int) -> None:
    core = NodeCore(NodeCore.new(CLUSTER, NODE).state, CoreConfig(lateness_ms=lateness))
    out = feed(core, samples("10:00:10", "10:02:00", {0: 0.5}))
    assert len(out.minutes) == (1 if lateness == 60_000 else 0)
