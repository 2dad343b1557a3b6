"""A shared GPU split by what each pod's processes measured, and devices that are parts of
another (AMD compute partitions, Intel tiles), through the worker's pure core; each shape with
a hand-computed answer (samples every 10 s, each the average over (t-10 s, t]):

- **Measured shares**: GPU 0 time-sliced by pods a and b at 0.6 busy; a's processes measured
  0.4, b's 0.1, a process of no pod 0.1 (proportions of the device's 0.6). Per minute: a's busy
  part is 0.4 of the time, b's 0.1, the stranger's 0.1; the unused 0.4 is split by holding
  (0.2 each). a: 36 s allocated, 24 consumed; b: 18 and 6; 6 s of unattributed use on a row of
  nobody's. 60 s in all: the GPU counted once.
- **Nothing measured** (``measured_use`` None) keeps the even split, and says so.
- **A process measured on a GPU its pod does not hold** is unattributed, never the holder's.
- **An AMD MI300X in CPX**: 8 partitions, each 1/8 of the GPU; a pod holding partition 3 at
  0.5 gets 60/8 s allocated, 0.5 of that consumed; the rest unallocated, and no part of the
  GPU counts as "in no partition".
"""

from __future__ import annotations

from collections import defaultdict

import pytest

from gpugap.schemas.models import (
    AllocationEvent,
    Attribution,
    DevicePartition,
    GpuMinute,
    GpuSample,
    MeasuredUse,
    NodeSample,
    SharingPod,
)
from gpugap.schemas.types import (
    ActivityMetric,
    PartitionKind,
    SampleSource,
    ShareSource,
    Vendor,
)
from gpugap.streams.core import CoreConfig, NodeCore, Output
from gpugap.streams.detect_idle import IdleConfig
from tests.streams.helpers import CLUSTER, NODE, T, gpu, pod, samples

CFG = CoreConfig(idle=IdleConfig(minutes=3))
A, B = f"k8s/{CLUSTER}/uid-a", f"k8s/{CLUSTER}/uid-b"
MI300X = "AMD Instinct MI300X"
AMD_PARENT = "AMD-6cff74a1-0000-1000-80ee-32bb20bfae28"


def _every_10s(start: str, end: str) -> list[str]:
    return [s.time.strftime("%H:%M:%S") for s in samples(start, end, {})]


def _node(hms: str, gpus: list[GpuSample], source: SampleSource = SampleSource.NVML) -> NodeSample:
    return NodeSample(
        cluster=CLUSTER, node=NODE, time=T(hms), source=source, interval_s=10.0,
        gpus=tuple(gpus),
    )  # fmt: skip


def run(items: list[NodeSample | AllocationEvent]) -> Output:
    core = NodeCore.new(CLUSTER, NODE, CFG)
    out = Output()
    for it in sorted(items, key=lambda r: r.time):
        out.extend(core.sample(it) if isinstance(it, NodeSample) else core.allocation(it))
    out.extend(core.advance(T("10:08:00")))  # minutes to 10:05 closed
    return out


def by_minute(rows: list[GpuMinute]) -> dict[str, dict[tuple[str, str], GpuMinute]]:
    out: dict[str, dict[tuple[str, str], GpuMinute]] = defaultdict(dict)
    for r in rows:
        out[r.minute.strftime("%H:%M")][(r.gpu_uuid, r.allocation_id or "")] = r
    return out


def _shared(
    use: tuple[MeasuredUse, ...] | None, holders: tuple[str, ...] = ("a", "b")
) -> GpuSample:
    return GpuSample(
        uuid=gpu(0), index=0, activity=0.6, activity_metric=ActivityMetric.SM_ACTIVE,
        attribution=Attribution(
            namespace="ns", pod=holders[0],
            shared=tuple(SharingPod(namespace="ns", pod=p) for p in holders[1:]) or None,
        ),
        measured_use=use,
    )  # fmt: skip


MEASURED = (
    MeasuredUse(pod_uid="UID-A", pod="a", namespace="ns", activity=0.4),
    MeasuredUse(pod_uid="uid-b", activity=0.1),
    MeasuredUse(activity=0.1),  # a process of no pod
)


def _records(use: tuple[MeasuredUse, ...] | None) -> list[NodeSample | AllocationEvent]:
    recs: list[NodeSample | AllocationEvent] = [
        pod("uid-a", "start", "10:00:00", name="a"),
        pod("uid-b", "start", "10:00:00", name="b"),
    ]
    recs += [_node(hms, [_shared(use)]) for hms in _every_10s("10:00:10", "10:06:00")]
    return recs


def test_a_shared_gpu_is_split_by_what_each_pods_processes_measured() -> None:
    out = run(_records(MEASURED))
    assert not out.refused
    minutes = by_minute(out.minutes)
    assert sorted(minutes) == [f"10:0{m}" for m in range(6)]
    for m, rows in minutes.items():
        assert set(rows) == {(gpu(0), A), (gpu(0), B), (gpu(0), "")}, m
        a, b, nobody = rows[gpu(0), A], rows[gpu(0), B], rows[gpu(0), ""]
        assert (a.allocated_s, a.consumed_gpu_s) == pytest.approx((36.0, 24.0)), m
        assert (b.allocated_s, b.consumed_gpu_s) == pytest.approx((18.0, 6.0)), m
        assert (nobody.unallocated_s, nobody.consumed_gpu_s) == pytest.approx((6.0, 6.0)), m
        assert a.share_source is b.share_source is ShareSource.MEASURED
        assert (a.measured_s, b.measured_s) == pytest.approx((36.0, 18.0))  # all covered
        # the GPU's 60 s once, and its 36 s of use once
        assert sum(r.allocated_s + r.unallocated_s for r in rows.values()) == pytest.approx(60)
        assert sum(r.consumed_gpu_s for r in rows.values()) == pytest.approx(36.0)
        assert a.gpu_share == pytest.approx(0.6) and a.vendor is Vendor.NVIDIA


def test_nothing_measured_per_process_keeps_the_even_split_and_says_so() -> None:
    minutes = by_minute(run(_records(None)).minutes)
    for m, rows in minutes.items():
        assert set(rows) == {(gpu(0), A), (gpu(0), B)}, m
        for aid in (A, B):
            r = rows[gpu(0), aid]
            assert (r.allocated_s, r.consumed_gpu_s) == pytest.approx((30.0, 18.0))
            assert r.share_source is ShareSource.EVEN


def test_measured_idle_and_busy_without_any_process_measured() -> None:
    """Measured, no process used it, device idle: each holder half, nothing consumed. Busy
    while no process is measured: nothing to split by, so the even split."""
    recs: list[NodeSample | AllocationEvent] = [
        pod("uid-a", "start", "10:00:00", name="a"),
        pod("uid-b", "start", "10:00:00", name="b"),
    ]
    for hms in _every_10s("10:00:10", "10:06:00"):
        busy = T(hms) > T("10:03:00")
        g = _shared(()).model_copy(update={"activity": 0.5 if busy else 0.0})
        recs.append(_node(hms, [g]))
    minutes = by_minute(run(recs).minutes)
    for m, rows in minutes.items():
        a = rows[gpu(0), A]
        want = (30.0, 15.0 if m >= "10:03" else 0.0)
        assert (a.allocated_s, a.consumed_gpu_s) == pytest.approx(want), m
        assert a.share_source is (ShareSource.EVEN if m >= "10:03" else ShareSource.MEASURED)


def test_use_of_a_pod_that_does_not_hold_the_gpu_is_unattributed() -> None:
    """Pod a alone holds GPU 0; pod b's processes (b holds no GPU here) use a third of its
    busy time: a is billed its own part only, b's is unattributed use."""
    recs: list[NodeSample | AllocationEvent] = [
        pod("uid-a", "start", "10:00:00", name="a"),
        pod("uid-b", "start", "10:00:00", name="b", gpus=0),
    ]
    use = (MeasuredUse(pod_uid="uid-a", activity=0.4), MeasuredUse(pod_uid="uid-b", activity=0.2))
    recs += [_node(h, [_shared(use, ("a",))]) for h in _every_10s("10:00:10", "10:06:00")]
    minutes = by_minute(run(recs).minutes)
    for m, rows in minutes.items():
        a, nobody = rows[gpu(0), A], rows[gpu(0), ""]
        assert (a.allocated_s, a.consumed_gpu_s) == pytest.approx((48.0, 24.0)), m
        assert (nobody.unallocated_s, nobody.consumed_gpu_s) == pytest.approx((12.0, 12.0)), m
        assert a.share_source is ShareSource.MEASURED  # held beside unattributed use
        assert (gpu(0), B) not in rows


def _partition(i: int, act: float | None) -> GpuSample:
    return GpuSample(
        uuid=f"{AMD_PARENT}/{i}", index=i, model=MI300X, vendor=Vendor.AMD,
        activity=act, activity_metric=ActivityMetric.GFX_BUSY_INST if act is not None else None,
        partition=DevicePartition(
            parent_uuid=AMD_PARENT, partition_id=i, kind=PartitionKind.AMD_COMPUTE, count=8,
            mode="CPX",
        ),
        attribution=Attribution(namespace="ns", pod="a") if i == 3 else None,
    )  # fmt: skip


def test_an_amd_cpx_partition_counts_its_eighth_and_the_gpu_counts_once() -> None:
    recs: list[NodeSample | AllocationEvent] = [pod("uid-a", "start", "10:00:00", name="a")]
    for hms in _every_10s("10:00:10", "10:06:00"):
        parts = [_partition(i, 0.5 if i == 3 else 0.0) for i in range(8)]
        recs.append(_node(hms, parts, SampleSource.AMDSMI))
    out = run(recs)
    assert not out.refused
    for m, rows in by_minute(out.minutes).items():
        assert len(rows) == 8, m  # the partitions, and no row for "in no partition"
        a = rows[f"{AMD_PARENT}/3", A]
        assert (a.allocated_s, a.consumed_gpu_s) == pytest.approx((7.5, 3.75)), m
        assert a.gpu_share == pytest.approx(1 / 8) and a.physical_uuid == AMD_PARENT
        assert a.vendor is Vendor.AMD and a.activity_metric is ActivityMetric.GFX_BUSY_INST
        assert sum(r.allocated_s + r.unallocated_s for r in rows.values()) == pytest.approx(60)


def test_a_partition_that_stops_reporting_leaves_no_made_up_capacity() -> None:
    """Only partition 0 reports (DME#495 lists only gpu_partition_id 0 on MI355X DPX): its
    eighth is capacity; the others are unknown, never counted as a part in no partition."""
    recs: list[NodeSample | AllocationEvent] = []
    for hms in _every_10s("10:00:10", "10:03:00"):
        recs.append(_node(hms, [_partition(0, 0.0)], SampleSource.AMD_EXPORTER))
    rows = [r for r in run(recs).minutes if r.minute == T("10:01:00")]
    assert [(r.gpu_uuid, r.unallocated_s) for r in rows] == [(f"{AMD_PARENT}/0", 7.5)]
