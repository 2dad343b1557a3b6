# ruff: noqa: PLR0917  (record builders of test scenarios)
"""Records for the estate-shaped recommenders' tests (test_gpu_model.py,
test_cpus_per_gpu.py, test_pack_nodes.py): node polls, multi-node Slurm jobs, GPU-minutes;
written through the ClickHouse sink, read back by the recommenders' own queries."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from gpugap.groundfloor.settings import ClickHouseSettings
from gpugap.recommend import engine
from gpugap.recommend.base import HistoryWindow
from gpugap.recommend.queries import window
from gpugap.schemas import GpuMinute, NodeGpus, Record, SlurmJobEvent
from gpugap.schemas.examples import gpu_uuid
from gpugap.schemas.models import NodeAllocation, NodeCapacity, Recommendation
from gpugap.warehouse.client import connect

T0 = datetime(2026, 11, 2, tzinfo=UTC)
GIB = 1024.0
NOW = datetime(2026, 11, 20, tzinfo=UTC)


def polls(
    cluster: str,
    node: str,
    *,
    model: str,
    memory_per_gpu: float | None,
    gpus: float = 8,
    cpus: float = 64,
    memory_mib: float = 512 * GIB,
    pool: str = "gpu",
    scheduler: str = "slurm",
    start: datetime = T0,
    hours: float = 1.0,
    every_s: float = 600.0,
    held: Mapping[str, tuple[float, float, float]] | None = None,
) -> list[NodeCapacity]:
    """A node polled every ``every_s`` for ``hours`` from ``start``; ``held``: allocation ->
    (GPUs, CPUs, MiB) for every poll."""
    return [
        NodeCapacity(
            cluster=cluster, node=node, time=start + timedelta(seconds=i * every_s),
            interval_s=every_s, scheduler=scheduler,
            source="slurm_scontrol" if scheduler == "slurm" else "kubernetes", pool=pool,
            gpu_model=model, gpu_memory_mib=memory_per_gpu, gpus=gpus, cpus=cpus,
            memory_mib=memory_mib,
            allocations=tuple(
                NodeAllocation(allocation_id=a, gpus=g, cpus=c, memory_mib=m)
                for a, (g, c, m) in (held or {}).items()
            ),
        )
        for i in range(round(hours * 3600 / every_s))
    ]  # fmt: skip


def job(
    cluster: str,
    job_id: str,
    who: tuple[str, str, str],
    start: datetime,
    hours: float,
    nodes: dict[str, int],
    partition: str = "gpu",
) -> list[Record]:
    """A Slurm job's start and end events: ``who`` = (user, account, job name), ``nodes``:
    node -> GPUs on it."""
    end = start + timedelta(hours=hours)
    user, account, name = who
    return [
        SlurmJobEvent(
            event_id=f"slurm/{cluster}/{job_id}/{kind}", kind=kind,
            time=start if kind == "start" else end, source="hook", cluster=cluster,
            job_id=job_id, user=user, account=account, partition=partition, qos="normal",
            job_name=name,
            nodes=tuple(NodeGpus(node=n, gpu_indices=tuple(range(g))) for n, g in nodes.items()),
            gpus_total=sum(nodes.values()), time_limit_s=round(hours * 3600) + 3600,
            submit_time=start, start_time=start, end_time=end if kind == "end" else None,
            state="COMPLETED" if kind == "end" else "RUNNING",
            exit_code=0 if kind == "end" else None,
        )
        for kind in ("start", "end")
    ]  # fmt: skip


def gpu_minutes(
    cluster: str,
    alloc: str,
    user: str,
    start: datetime,
    minutes: int,
    nodes: dict[str, int],
    activity: float,
    memory_mib: float | None = None,
    scheduler: str = "slurm",
) -> list[GpuMinute]:
    """``minutes`` GPU-minutes from ``start`` on every GPU of ``nodes`` (node -> GPUs)."""
    return [
        GpuMinute(
            cluster=cluster, node=node, gpu_uuid=gpu_uuid(node, g),
            minute=start + timedelta(minutes=m), allocated_s=60.0,
            consumed_gpu_s=60.0 * activity, activity_avg=activity, activity_max=activity,
            activity_metric="sm_active", sample_count=6, no_samples=False, allocation_id=alloc,
            scheduler=scheduler, workload_class="batch", owner=user, team="t",
            memory_used_mib_avg=memory_mib,
        )
        for m in range(minutes)
        for node, n in nodes.items()
        for g in range(n)
    ]  # fmt: skip


def recommend(
    settings: ClickHouseSettings, kind: str, until: datetime
) -> tuple[HistoryWindow, list[Recommendation]]:
    """The registered recommender ``kind`` over the 14 days before ``until``."""
    client = connect(settings)
    try:
        w = window(client, 14.0, until)
        recs = [r for r in engine.RECOMMENDERS[kind](client, w, NOW) if r is not None]
    finally:
        client.close()
    return w, sorted(recs, key=lambda r: r.id)


def query(settings: ClickHouseSettings, sql: str) -> list[tuple[Any, ...]]:
    client = connect(settings)
    try:
        return [tuple(r) for r in client.query(sql).result_rows]
    finally:
        client.close()


def flatten(*parts: Iterable[Record]) -> list[Record]:
    return [r for p in parts for r in p]
