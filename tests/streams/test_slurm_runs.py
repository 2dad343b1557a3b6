"""Two runs of one Slurm job id on the same GPU (the first ended NODE_FAIL, the job was
requeued and ran again later) are two allocations through the worker's pure core, each with
its own GPU-seconds (docs/architecture.md#slurm-job-runs)."""

from __future__ import annotations

from collections import defaultdict

from gpugap.producers.slurm.event import JobInfo, job_event
from gpugap.schemas import SlurmJobEvent
from gpugap.schemas.models import GpuMinute, Record
from gpugap.streams.process import Processor
from tests.streams.helpers import CLUSTER, NODE, T, samples


def _event(run: int, kind: str, start: str, end: str | None, state: str) -> SlurmJobEvent:
    info = JobInfo(
        "12", run=run, user="alice", account="vision", name="train", state=state,
        start=int(T(start).timestamp()), end=int(T(end).timestamp()) if end else None,
        nodes=[NODE], gpu_indices={NODE: (0,)}, gpus=1, batch=True,
    )  # fmt: skip
    return SlurmJobEvent.model_validate(job_event(info, kind, CLUSTER, "hook"))


def test_two_runs_of_one_job_id_on_one_gpu_are_two_allocations_with_their_seconds() -> None:
    jobs = [
        _event(0, "start", "10:00:00", None, "RUNNING"),
        _event(0, "end", "10:00:00", "10:05:00", "NODE_FAIL"),
        _event(1, "start", "10:08:00", None, "RUNNING"),
        _event(1, "end", "10:08:00", "10:12:00", "COMPLETED"),
    ]
    assert [e.allocation_id for e in jobs] == ["slurm/hpc/12"] * 2 + ["slurm/hpc/12#1"] * 2
    assert len({e.event_id for e in jobs}) == 4  # neither run's events dedupe the other's
    records: list[Record] = [*jobs, *samples("10:00:10", "10:15:00", {0: 0.5})]
    records.sort(key=lambda r: r.time)
    proc = Processor()
    rows: list[GpuMinute] = []
    for r in records:
        rows += proc.handle(r).minutes
    rows += proc.advance(proc.cfg.lateness_ms).minutes
    allocated: dict[str | None, float] = defaultdict(float)
    consumed: dict[str | None, float] = defaultdict(float)
    for row in rows:
        allocated[row.allocation_id] += row.allocated_s
        consumed[row.allocation_id] += row.consumed_gpu_s
    assert allocated["slurm/hpc/12"] == 300.0  # 10:00-10:05, NODE_FAIL
    assert allocated["slurm/hpc/12#1"] == 240.0  # 10:08-10:12, the run after the requeue
    assert consumed["slurm/hpc/12"] == 150.0 and consumed["slurm/hpc/12#1"] == 120.0
    between = [r for r in rows if T("10:05:00") <= r.minute < T("10:08:00")]
    assert between and all(r.allocation_id is None for r in between)  # held by nobody
    assert proc.counts().get("duplicate_events", 0) == 0
