"""Rows of job_queries.py into the per-job report's parts (job_models.py): times as UTC (the
epoch is ClickHouse's "none"), GPU-hours to 4 decimals as the report rounds them."""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import UTC, date, datetime, timedelta
from typing import Any

from gpugap.job import queries as jq
from gpugap.job.models import (
    Allocation,
    Candidate,
    Figures,
    GpuFigures,
    GpuSeries,
    Idle,
    Padding,
    QueueWait,
    Series,
    Stretch,
)
from gpugap.recommend.batch import GPU_IDLE_LIFE

Rows = tuple[list[str], list[Sequence[Any]]]
EPOCH = datetime(1970, 1, 2, tzinfo=UTC)
_NICE_STEPS_MIN = (1, 2, 5, 10, 15, 30, 60, 120, 180, 360, 720, 1440)


def records(rows: Rows) -> list[dict[str, Any]]:
    columns, data = rows
    return [dict(zip(columns, r, strict=True)) for r in data]


def utc(t: Any) -> datetime | None:
    """ClickHouse's naive UTC times; its epoch is 'none'."""
    if t is None:
        return None
    if not isinstance(t, datetime):
        t = datetime(t.year, t.month, t.day)
    t = t.replace(tzinfo=UTC) if t.tzinfo is None else t.astimezone(UTC)
    return None if t < EPOCH else t


def _day(d: Any) -> date | None:
    t = utc(d)
    return t.date() if t else None


def gpu_h(v: Any) -> float:
    """GPU-hours to 4 decimals (0.36 s), as the report rounds them."""
    return round(float(v or 0.0), 4)


def job_label(meta: dict[str, Any]) -> str:
    """The id as its user knows it: Slurm's job id (with its run), a pod's namespace/name."""
    if meta["scheduler"] == "kubernetes" and meta["name"]:
        return str(meta["name"])
    return str(meta["allocation_id"]).split("/", 2)[-1]


def candidate(m: dict[str, Any]) -> Candidate:
    return Candidate(
        cluster=m["cluster"], allocation_id=m["allocation_id"], job=job_label(m),
        scheduler=m["scheduler"], name=m["name"], owner=m["owner"],
        gpus_requested=int(m["gpus_requested"]), start_time=utc(m["start_time"]),
        end_time=utc(m["end_time"]), final_state=m["final_state"],
    )  # fmt: skip


def allocation(m: dict[str, Any]) -> Allocation:
    return Allocation(
        cluster=m["cluster"], allocation_id=m["allocation_id"], job=job_label(m),
        scheduler=m["scheduler"], name=m["name"], owner=m["owner"], team=m["team"],
        workload_class=m["workload_class"], partition=m["partition"], qos=m["qos"],
        namespace=m["namespace"], queue=m["queue"], gang_id=m["gang_id"],
        gpus_requested=int(m["gpus_requested"]), nodes=sorted(m["nodes"]),
        time_limit_s=int(m["time_limit_s"]) or None, submit_time=utc(m["submit_time"]),
        eligible_time=utc(m["eligible_time"]), start_time=utc(m["start_time"]),
        end_time=utc(m["end_time"]),
        elapsed_s=None if m["elapsed_s"] is None else float(m["elapsed_s"]),
        final_state=m["final_state"], exit_code=m["exit_code"],
    )  # fmt: skip


def figures(t: dict[str, Any]) -> Figures:
    measured = gpu_h(t["measured_gpu_h"])
    gap = gpu_h(t["gap_gpu_h"])
    return Figures(
        allocated_gpu_h=gpu_h(t["allocated_gpu_h"]), measured_gpu_h=measured,
        consumed_gpu_h=gpu_h(t["consumed_gpu_h"]), gap_gpu_h=gap,
        gap_pct=round(100 * gap / measured, 2) if measured > 0 else None,
        unmeasured_gpu_h=gpu_h(t["unmeasured_gpu_h"]), idle_gpu_h=gpu_h(t["idle_gpu_h"]),
        first_day=_day(t["first_day"]) if t["days"] else None,
        last_day=_day(t["last_day"]) if t["days"] else None,
    )  # fmt: skip


def gpu(r: dict[str, Any]) -> GpuFigures:
    measured, idle = float(r["measured_gpu_h"]), float(r["idle_gpu_h"])
    return GpuFigures(
        gpu_uuid=r["gpu_uuid"], node=r["node"], physical_uuid=r["physical_uuid"],
        allocated_gpu_h=gpu_h(r["allocated_gpu_h"]), measured_gpu_h=gpu_h(measured),
        consumed_gpu_h=gpu_h(r["consumed_gpu_h"]), gap_gpu_h=gpu_h(r["gap_gpu_h"]),
        unmeasured_gpu_h=gpu_h(r["unmeasured_gpu_h"]), idle_gpu_h=gpu_h(idle),
        utilisation=round(float(r["consumed_gpu_h"]) / measured, 4) if measured > 0 else None,
        idle_share=round(idle / measured, 4) if measured > 0 else None,
        peak_activity=round(float(r["peak"]), 4) if measured > 0 else None,
        peak_memory_mib=float(r["memory_mib"]) or None,
        needed=measured > 0 and idle < GPU_IDLE_LIFE * measured,
    )  # fmt: skip


def series_step(first: datetime, last: datetime, gpus: int) -> tuple[int, int]:
    """(bucket seconds, buckets) for hours [first, last]: at most MAX_POINTS per GPU and
    MAX_SERIES_POINTS in all (never under MIN_POINTS per GPU), a round number of minutes."""
    span_min = int((last - first).total_seconds() // 60) + 60
    per_gpu = max(jq.MIN_POINTS, min(jq.MAX_POINTS, jq.MAX_SERIES_POINTS // max(gpus, 1)))
    need = math.ceil(span_min / per_gpu)
    step = next((s for s in _NICE_STEPS_MIN if s >= need), math.ceil(need / 1440) * 1440)
    return step * 60, math.ceil(span_min / step)


def series(rows: Rows, gpus: list[GpuFigures], first: datetime, step_s: int, n: int) -> Series:
    util: dict[str, list[float | None]] = {g.gpu_uuid: [None] * n for g in gpus}
    memory: dict[str, list[float | None]] = {g.gpu_uuid: [None] * n for g in gpus}
    for uuid, i, u, mem in rows[1]:
        if uuid in util and 0 <= i < n:
            util[uuid][i] = round(min(float(u), 1.0), 4)
            memory[uuid][i] = float(mem) or None
    used = [i for vs in util.values() for i, v in enumerate(vs) if v is not None]
    lo, hi = (min(used), max(used) + 1) if used else (0, 0)
    return Series(
        start=first + timedelta(seconds=lo * step_s), step_s=step_s, points=hi - lo,
        gpus=[GpuSeries(gpu_uuid=g.gpu_uuid, node=g.node, utilisation=util[g.gpu_uuid][lo:hi],
                        memory_mib=memory[g.gpu_uuid][lo:hi]) for g in gpus],
    )  # fmt: skip


def idle(row: dict[str, Any]) -> Idle:
    measured, idle = int(row["measured_minutes"]), int(row["idle_minutes"])
    longest = []
    for first, minutes, held in row["longest"]:
        start = datetime.fromtimestamp(int(first) * 60, UTC)
        end = start + timedelta(minutes=int(minutes))
        longest.append(Stretch(start=start, end=end, minutes=int(minutes), gpu_h=gpu_h(held)))
    return Idle(
        measured_minutes=measured, idle_minutes=idle,
        idle_share=round(idle / measured, 4) if measured else None,
        stretches=int(row["stretches"]), listed_from_minutes=jq.MIN_STRETCH_MIN, longest=longest,
    )  # fmt: skip


def padding(rows: Rows) -> Padding | None:
    """Its row of v_slurm_padding (finished Slurm jobs with a limit)."""
    found = records(rows)
    if not found:
        return None
    p = found[0]
    return Padding(
        time_limit_s=int(p["time_limit_s"]), elapsed_s=float(p["elapsed_s"]),
        limit_ratio=round(float(p["limit_ratio"]), 4), padding_gpu_h=gpu_h(p["padding_gpu_h"]),
    )  # fmt: skip


def queue_wait(rows: Rows, *, gang: bool) -> QueueWait | None:
    """Its row of v_queue_wait (its gang's, for a member of one)."""
    found = records(rows)
    if not found:
        return None
    w = found[0]
    return QueueWait(
        queue=w["queue"], waiting_since=utc(w["waiting_since"]), start_time=utc(w["start_time"]),
        wait_s=float(w["wait_s"]), gpu_h_waited=gpu_h(w["gpu_h_waited"]),
        held_gpu_h=gpu_h(w["held_gpu_h"]), gang=gang,
    )  # fmt: skip
