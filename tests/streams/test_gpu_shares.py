"""GPU-hours in physical GPU-equivalents through the worker's pure core (docs/architecture.md), each
shape with a hand-computed answer (samples every 10 s, each the average over (t-10 s, t]):

- **MIG, mixed profiles on one A100** (7 compute slices): a 3g.40gb held by pod a at 0.7, a
  1g.10gb held by pod b and idle, a 2g.20gb nobody holds; 1/7 of the GPU is in no slice.
  Per minute: a 60 x 3/7 s allocated, 0.7 of that consumed; b 60/7 s allocated, nothing
  consumed (idle while its neighbour is busy: its own alert, by its share); 60 x 2/7 s and
  60 x 1/7 s unallocated (the free slice, the unsliced part): 60 s of capacity in all, one GPU.
- **A time-sliced GPU shared by 4 pods** at 0.6: each pod 15 s a minute, 9 s consumed; the
  GPU's 36 s of use counted once. When one pod ends, the other three hold 20 s each.
- **An array job of 10 tasks** and **a heterogeneous job**: each task and each component is an
  allocation of its own, with its own GPU-seconds.
"""

from __future__ import annotations

import json
from collections import defaultdict

import pytest

from gpugap.producers.slurm.event import JobInfo, job_event
from gpugap.schemas import SlurmJobEvent
from gpugap.schemas.models import (
    AllocationEvent,
    Attribution,
    GpuMinute,
    GpuSample,
    MigInstance,
    NodeSample,
    SharingPod,
)
from gpugap.schemas.types import ActivityMetric, AlertKind, SampleSource
from gpugap.streams.core import CoreConfig, NodeCore, Output
from gpugap.streams.detect_idle import IdleConfig
from gpugap.streams.process import Processor
from tests.streams.helpers import CLUSTER, NODE, T, gpu, pod, samples

CFG = CoreConfig(idle=IdleConfig(minutes=3))
PARENT = gpu(0)
A100 = "NVIDIA A100-SXM4-80GB"
#: gpu instance -> (slice uuid, profile, activity, holder pod or None)
SLICES = {
    1: ("MIG-00000000-0000-0000-0001-000000000001", "3g.40gb", 0.7, "a"),
    2: ("MIG-00000000-0000-0000-0001-000000000002", "1g.10gb", 0.0, "b"),
    3: ("MIG-00000000-0000-0000-0001-000000000003", "2g.20gb", 0.0, None),
}
A, B = "k8s/hpc/uid-a", "k8s/hpc/uid-b"


def _node(hms: str, gpus: list[GpuSample]) -> NodeSample:
    return NodeSample(
        cluster=CLUSTER, node=NODE, time=T(hms), source=SampleSource.DCGM, interval_s=10.0,
        gpus=tuple(gpus),
    )  # fmt: skip


def _every_10s(start: str, end: str) -> list[str]:
    return [s.time.strftime("%H:%M:%S") for s in samples(start, end, {})]


def mig_records() -> list[NodeSample | AllocationEvent]:
    recs: list[NodeSample | AllocationEvent] = [pod("uid-a", "start", "10:00:00", name="a")]
    recs.append(pod("uid-b", "start", "10:00:00", name="b"))
    for hms in _every_10s("10:00:10", "10:13:00"):
        gpus = [
            GpuSample(
                uuid=uid,
                index=0,
                model=A100,
                activity=act,
                activity_metric=ActivityMetric.GR_ENGINE_ACTIVE,
                mig=MigInstance(parent_uuid=PARENT, gpu_instance_id=gi, profile=profile),
                attribution=Attribution(namespace="ns", pod=holder) if holder else None,
            )
            for gi, (uid, profile, act, holder) in SLICES.items()
        ]
        recs.append(_node(hms, gpus))
    return sorted(recs, key=lambda r: r.time)


def run(items: list[NodeSample | AllocationEvent], *, restore_at: int | None = None) -> Output:
    core = NodeCore.new(CLUSTER, NODE, CFG)
    out = Output()
    for i, it in enumerate(items):
        if i == restore_at:
            core = NodeCore(json.loads(json.dumps(core.state)), CFG)
        out.extend(core.sample(it) if isinstance(it, NodeSample) else core.allocation(it))
    out.extend(core.advance(T("10:15:00")))  # watermark 10:13:00: minutes to 10:12 closed
    return out


def per_minute(rows: list[GpuMinute]) -> dict[str, dict[tuple[str, str], tuple[float, ...]]]:
    out: dict[str, dict[tuple[str, str], tuple[float, ...]]] = defaultdict(dict)
    for r in rows:
        key = (r.gpu_uuid, r.allocation_id or "")
        out[r.minute.strftime("%H:%M")][key] = (
            round(r.allocated_s, 9), round(r.unallocated_s, 9), round(r.consumed_gpu_s, 9),
            round(r.gpu_share, 9), r.device_s or 0.0,
        )  # fmt: skip
    return out


@pytest.mark.parametrize("restore_at", [None, 40])
def test_mig_slices_count_their_share_and_the_gpu_counts_once(restore_at: int | None) -> None:
    out = run(mig_records(), restore_at=restore_at)
    assert not out.refused
    minutes = per_minute(out.minutes)
    assert sorted(minutes) == [f"10:{m:02d}" for m in range(13)]
    s1, s2, s3 = (SLICES[i][0] for i in (1, 2, 3))
    r = lambda x: round(x, 9)  # noqa: E731
    want = {
        (s1, A): (r(60 * 3 / 7), 0.0, r(0.7 * 60 * 3 / 7), r(3 / 7), 60.0),
        (s2, B): (r(60 / 7), 0.0, 0.0, r(1 / 7), 60.0),
        (s3, ""): (0.0, r(60 * 2 / 7), 0.0, r(2 / 7), 60.0),
        (PARENT, ""): (0.0, r(60 / 7), 0.0, r(1 / 7), 0.0),  # no slice covers it
    }
    for m, rows in minutes.items():
        assert rows == want, m
        assert sum(v[0] + v[1] for v in rows.values()) == pytest.approx(60.0)  # one GPU
    unsliced = [x for x in out.minutes if x.gpu_uuid == PARENT]
    assert all(not x.no_samples and x.physical_uuid is None for x in unsliced)
    assert {x.physical_uuid for x in out.minutes if x.gpu_uuid != PARENT} == {PARENT}
    # the idle 1g.10gb has its own alert (N = 3), its idle time by its share; a is busy
    alerts = [x for x in out.alerts if x.kind is AlertKind.IDLE_GPU]
    assert alerts and {x.allocation_id for x in alerts} == {B}
    assert alerts[0].idle_gpu_hours == pytest.approx(3 * 60 / 7 / 3600)
    assert max(x.idle_gpu_hours for x in alerts) == pytest.approx(13 * 60 / 7 / 3600)


def test_a_mig_slice_of_an_unknown_profile_counts_whole_and_is_counted() -> None:
    core = NodeCore.new(CLUSTER, NODE, CFG)
    odd = GpuSample(
        uuid=SLICES[1][0], index=0, activity=0.5, activity_metric=ActivityMetric.GR_ENGINE_ACTIVE,
        mig=MigInstance(parent_uuid=PARENT, gpu_instance_id=1, profile=None),
    )  # fmt: skip
    for hms in _every_10s("10:00:10", "10:02:00"):
        core.sample(_node(hms, [odd]))
    out = core.advance(T("10:05:00"))
    rows = [x for x in out.minutes if x.minute == T("10:00:00")]
    assert [(x.gpu_uuid, x.unallocated_s, x.gpu_share) for x in rows] == [(SLICES[1][0], 60.0, 1.0)]
    assert core.state["counts"]["mig_share_unknown"] > 0


def sliced_records() -> list[NodeSample | AllocationEvent]:
    """GPU 0 time-sliced between p1..p4 (the kubelet names p1, the others share it); p4 is
    deleted at 10:05:00 and the samples stop naming it from then on."""
    recs: list[NodeSample | AllocationEvent] = [
        pod(f"uid-{i}", "start", "10:00:00", name=f"p{i}") for i in (1, 2, 3, 4)
    ]
    recs.append(pod("uid-4", "end", "10:05:00", name="p4"))
    for hms in _every_10s("10:00:10", "10:13:00"):
        others = ("p2", "p3", "p4") if T(hms) <= T("10:05:00") else ("p2", "p3")
        shared = tuple(SharingPod(namespace="ns", pod=p) for p in others)
        g = GpuSample(
            uuid=gpu(0), index=0, activity=0.6, activity_metric=ActivityMetric.UTILIZATION,
            attribution=Attribution(namespace="ns", pod="p1", shared=shared),
        )  # fmt: skip
        recs.append(_node(hms, [g]))
    return sorted(recs, key=lambda r: r.time)


@pytest.mark.parametrize("restore_at", [None, 33])
def test_a_time_sliced_gpu_is_divided_between_its_pods_and_counted_once(
    restore_at: int | None,
) -> None:
    out = run(sliced_records(), restore_at=restore_at)
    assert not out.refused
    minutes = per_minute(out.minutes)
    ids = [f"k8s/hpc/uid-{i}" for i in (1, 2, 3, 4)]
    for m, rows in minutes.items():
        holders = ids if m < "10:05" else ids[:3]
        k = len(holders)
        assert set(rows) == {(gpu(0), a) for a in holders}, m  # no unallocated time
        for a in holders:
            allocated, _, consumed, share, device = rows[(gpu(0), a)]
            assert (allocated, consumed) == (round(60 / k, 9), round(0.6 * 60 / k, 9)), (m, a)
            assert (share, device) == (round(1 / k, 9), 60.0)
        assert sum(v[2] for v in rows.values()) == pytest.approx(36.0)  # used once
    assert not out.alerts  # busy at 0.6: nobody is idle


def _job(info: JobInfo, kind: str) -> SlurmJobEvent:
    return SlurmJobEvent.model_validate(job_event(info, kind, CLUSTER, "hook"))


def _through_the_worker(
    jobs: list[SlurmJobEvent], acts: dict[int, float | None]
) -> list[GpuMinute]:
    records: list[SlurmJobEvent | NodeSample] = [*jobs, *samples("10:00:10", "10:15:00", acts)]
    records.sort(key=lambda r: r.time)
    proc = Processor()
    rows: list[GpuMinute] = []
    for r in records:
        rows += proc.handle(r).minutes
    return rows + proc.advance(proc.cfg.lateness_ms).minutes


def _sums(rows: list[GpuMinute]) -> dict[str | None, tuple[float, float]]:
    got: dict[str | None, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for row in rows:
        got[row.allocation_id][0] += row.allocated_s
        got[row.allocation_id][1] += row.consumed_gpu_s
    return {k: (round(v[0], 6), round(v[1], 6)) for k, v in got.items()}


def test_an_array_job_of_10_tasks_is_10_allocations() -> None:
    """Array 500, tasks 0..9 (JobIDRaw 500..509), two at a time on GPUs 0 and 1, one minute
    each: task t runs [10:00 + t//2 min, +1 min) on GPU t % 2."""
    jobs = []
    for t in range(10):
        start = f"10:{t // 2:02d}:00"
        end = f"10:{t // 2 + 1:02d}:00"
        info = JobInfo(
            str(500 + t), user="alice", account="vision", name="sweep", state="RUNNING",
            start=int(T(start).timestamp()), nodes=[NODE], gpu_indices={NODE: (t % 2,)}, gpus=1,
            batch=True, array_job_id=500, array_task_id=t,
        )  # fmt: skip
        jobs.append(_job(info, "start"))
        info.state, info.end = "COMPLETED", int(T(end).timestamp())
        jobs.append(_job(info, "end"))
    ids = [f"slurm/hpc/500_{t}" for t in range(10)]
    assert sorted({e.allocation_id for e in jobs}) == sorted(ids)
    got = _sums(_through_the_worker(jobs, {0: 0.5, 1: 0.25}))
    for t in range(10):
        assert got[ids[t]] == (60.0, 30.0 if t % 2 == 0 else 15.0), t


def test_a_heterogeneous_job_is_an_allocation_per_component() -> None:
    """Het job 700: component 0 (JobIDRaw 700) on GPUs 0-1 and component 1 (JobIDRaw 701) on
    GPU 2, both 10:00-10:04."""
    jobs = []
    for offset, raw, idx in ((0, "700", (0, 1)), (1, "701", (2,))):
        info = JobInfo(
            raw, user="bob", account="nlp", name="het", state="RUNNING",
            start=int(T("10:00:00").timestamp()), nodes=[NODE], gpu_indices={NODE: idx},
            gpus=len(idx), batch=True, het_job_id=700, het_job_offset=offset,
        )  # fmt: skip
        jobs.append(_job(info, "start"))
        info.state, info.end = "COMPLETED", int(T("10:04:00").timestamp())
        jobs.append(_job(info, "end"))
    assert sorted({e.allocation_id for e in jobs}) == ["slurm/hpc/700+0", "slurm/hpc/700+1"]
    got = _sums(_through_the_worker(jobs, {0: 1.0, 1: 0.5, 2: 0.1}))
    assert got["slurm/hpc/700+0"] == (480.0, 360.0)  # 2 GPUs x 240 s, at 1.0 and 0.5
    assert got["slurm/hpc/700+1"] == (240.0, 24.0)


def test_a_mig_slice_nvml_samples_without_activity_is_unmeasured_not_idle() -> None:
    """NVML has no utilization for a MIG device: its samples carry memory and power only.
    Such minutes are unmeasured (they used to read as measured with nothing consumed, and a
    notebook on a slice got an idle alert every 3 minutes)."""
    uid, profile, _, _ = SLICES[2]
    core = NodeCore.new(CLUSTER, NODE, CFG)
    out = core.allocation(pod("uid-b", "start", "10:00:00", name="b"))
    for hms in _every_10s("10:00:10", "10:08:00"):
        g = GpuSample(
            uuid=uid, index=0, model=A100, memory_used_mib=5000.0, power_w=80.0,
            unsupported=("utilization",),
            mig=MigInstance(parent_uuid=PARENT, gpu_instance_id=2, profile=profile),
            attribution=Attribution(namespace="ns", pod="b"),
        )  # fmt: skip
        out.extend(core.sample(_node(hms, [g])))
    out.extend(core.advance(T("10:10:00")))
    held = [x for x in out.minutes if x.allocation_id == B]
    assert len(held) == 8 and all(x.no_samples and x.sample_count == 6 for x in held)
    assert all(x.allocated_s == pytest.approx(60 / 7) for x in held)
    assert not out.alerts
