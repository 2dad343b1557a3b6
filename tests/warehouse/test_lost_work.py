"""Lost GPU-hours by cause (v_lost_work and the report's section) against a hand-computed
estate: runs preempted, requeued, lost to a node, evicted and OOM-killed beside runs that ended
by their own doing (completed, timed out, cancelled, a pod deleted), written through the sink."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from gpugap.groundfloor.settings import ClickHouseSettings
from gpugap.report import build_report, render
from gpugap.schemas import GpuMinute, K8sPodEvent, NodeGpus, Record, SlurmJobEvent
from gpugap.schemas.examples import gpu_uuid
from gpugap.warehouse.client import connect
from tests.warehouse.test_views import store

T0 = datetime(2026, 11, 2, 10, 0, tzinfo=UTC)
HEADING = "Work lost to preemption, requeue, eviction, node failure and OOM"


def at(minutes: float) -> datetime:
    return T0 + timedelta(minutes=minutes)


def minutes(
    alloc: str, gpus: tuple[int, ...], start: int, end: int, *, busy_s: float
) -> list[GpuMinute]:
    """GPU-minutes of ``alloc`` on ``gpus`` (of n1 for a Slurm run, k1 for a pod) over
    [start, end), each ``busy_s`` GPU-seconds consumed."""
    slurm = alloc.startswith("slurm/")
    sched, node = ("slurm", "n1") if slurm else ("kubernetes", "k1")
    return [
        GpuMinute(
            cluster="c",
            node=node,
            gpu_uuid=gpu_uuid(node, g),
            minute=at(m),
            allocated_s=60.0,
            unallocated_s=0.0,
            consumed_gpu_s=busy_s,
            activity_avg=busy_s / 60,
            activity_max=busy_s / 60,
            activity_metric="sm_active",
            sample_count=6,
            no_samples=False,
            measured_s=60.0,
            allocation_id=alloc,
            scheduler=sched,
            workload_class="batch" if slurm else "service",
            owner="alice" if slurm else "carol",
            team="vision" if slurm else "research",
        )
        for m in range(start, end)
        for g in gpus
    ]


def job(
    job_id: str, state: str, gpus: tuple[int, ...], start: int, end: int, *,
    run: int | None = None, user: str = "alice", account: str = "vision", partition: str = "gpu",
    busy_s: float = 0.0,
) -> list[Record]:  # fmt: skip
    """A Slurm run on n1 that started at ``start`` and ended ``state`` at ``end`` (minutes)."""

    def event(kind: str) -> SlurmJobEvent:
        return SlurmJobEvent(
            event_id=f"slurm/c/{job_id}/{run or 0}/{kind}",
            kind=kind,
            time=at(end if kind == "end" else start),
            source="hook",
            cluster="c",
            job_id=job_id,
            run=run,
            user=user,
            account=account,
            partition=partition,
            nodes=(NodeGpus(node="n1", gpu_indices=gpus),),
            gpus_total=len(gpus),
            time_limit_s=7200,
            start_time=at(start),
            end_time=at(end) if kind == "end" else None,
            state=state if kind == "end" else "RUNNING",
            exit_code=0 if kind == "end" else None,
        )

    first = event("start")
    alloc = first.allocation_id
    return [first, event("end"), *minutes(alloc, gpus, start, end, busy_s=busy_s)]


def pod(
    uid: str, reason: str, gpus: tuple[int, ...], start: int, end: int, *, busy_s: float = 0.0
) -> list[Record]:
    """A pod in namespace ml on k1, bound at ``start``, terminated ``reason`` at ``end``."""

    def event(kind: str, t: int) -> K8sPodEvent:
        return K8sPodEvent(
            event_id=f"k8s/c/{uid}/{kind}",
            kind=kind,
            time=at(t),
            source="watch",
            cluster="c",
            uid=uid,
            namespace="ml",
            name=f"p-{uid}",
            node="k1",
            phase="Running" if kind == "bound" else "Failed",
            gpus=len(gpus),
            gpu_resource="nvidia.com/gpu",
            reason=reason if kind == "terminated" else None,
            workload_class="service",
            owner="carol",
            team="research",
        )

    first = event("bound", start)
    alloc = first.allocation_id
    return [first, event("terminated", end), *minutes(alloc, gpus, start, end, busy_s=busy_s)]


def estate() -> list[Record]:
    return [
        # preempted after 30 min on 2 GPUs, one at 50%: 1.0 lost, 0.25 consumed
        *job("11", "PREEMPTED", (0,), 0, 30, busy_s=30.0),
        *minutes("slurm/c/11", (1,), 0, 30, busy_s=0.0),
        # requeued after 15 min on 1 busy GPU: 0.25 lost; its next run completed: not lost
        *job("12", "REQUEUED", (2,), 0, 15, busy_s=60.0),
        *job("12", "COMPLETED", (2,), 20, 80, run=1, busy_s=60.0),
        # the node failed after 45 min on 4 GPUs at 25%: 3.0 lost, 0.75 consumed
        *job(
            "13",
            "NODE_FAIL",
            (3, 4, 5, 6),
            0,
            45,
            user="bob",
            account="nlp",
            partition="big",
            busy_s=15.0,
        ),
        # out of memory after 12 min on 1 busy GPU: 0.2 lost, 0.2 consumed
        *job("16", "OUT_OF_MEMORY", (1,), 30, 42, user="bob", account="nlp", busy_s=60.0),
        # the job's own doing: not lost
        *job("14", "COMPLETED", (7,), 0, 60, busy_s=60.0),
        *job("15", "TIMEOUT", (0,), 30, 90, busy_s=60.0),
        *job("17", "CANCELLED", (1,), 42, 50),
        # an evicted pod, 20 min on 1 GPU at 10%: 1/3 lost, 1/30 consumed
        *pod("ev", "evicted", (0,), 0, 20, busy_s=6.0),
        # OOM-killed after 30 min on 2 GPUs at 50%: 1.0 lost, 0.5 consumed
        *pod("oom", "oom_killed", (1, 2), 0, 30, busy_s=30.0),
        # preempted after 6 min on 1 GPU: 0.1 lost, nothing consumed
        *pod("pre", "preempted", (4,), 0, 6),
        # its node gone after 9 min on 1 GPU (the pod GC): 0.15 lost, a node failure
        *pod("gone", "node_lost", (6,), 0, 9),
        # deleted (a scale-down) and completed: not lost
        *pod("del", "deleted", (3,), 0, 40, busy_s=60.0),
        *pod("done", "completed", (5,), 0, 10, busy_s=60.0),
    ]


# (allocation_id, cause, queue, team, gpus, lost, consumed), by hand
ROWS = [
    ("k8s/c/ev", "evicted", "ml", "research", 1, 1 / 3, 1 / 30),
    ("k8s/c/gone", "node_failure", "ml", "research", 1, 0.15, 0.0),
    ("k8s/c/oom", "oom_killed", "ml", "research", 2, 1.0, 0.5),
    ("k8s/c/pre", "preempted", "ml", "research", 1, 0.1, 0.0),
    ("slurm/c/11", "preempted", "gpu", "vision", 2, 1.0, 0.25),
    ("slurm/c/12", "requeued", "gpu", "vision", 1, 0.25, 0.25),
    ("slurm/c/13", "node_failure", "big", "nlp", 4, 3.0, 0.75),
    ("slurm/c/16", "oom_killed", "gpu", "nlp", 1, 0.2, 0.2),
]
# cause -> (runs, lost, consumed)
BY_CAUSE = {
    "node_failure": (2, 3.15, 0.75),
    "oom_killed": (2, 1.2, 0.7),
    "preempted": (2, 1.1, 0.25),
    "evicted": (1, 0.3333, 0.0333),
    "requeued": (1, 0.25, 0.25),
}
BY_TEAM = {
    "nlp": (2, 3.2, 0.95),
    "research": (4, 1.5833, 0.5333),
    "vision": (2, 1.25, 0.5),
}


@pytest.fixture
def warehouse(clickhouse: ClickHouseSettings) -> ClickHouseSettings:
    store(clickhouse, estate())
    return clickhouse


def query(settings: ClickHouseSettings, sql: str) -> list[tuple[Any, ...]]:
    c = connect(settings)
    try:
        return [tuple(r) for r in c.query(sql).result_rows]
    finally:
        c.close()


def test_view_has_one_row_per_lost_run(warehouse: ClickHouseSettings) -> None:
    rows = query(
        warehouse,
        "SELECT allocation_id, cause, queue, team, gpus, lost_gpu_h, consumed_gpu_h "
        "FROM v_lost_work ORDER BY allocation_id",
    )
    assert rows == [
        (a, cause, q, team, gpus, pytest.approx(lost), pytest.approx(used))
        for a, cause, q, team, gpus, lost, used in ROWS
    ]
    times = query(
        warehouse,
        "SELECT scheduler, start_time, end_time, owner, workload_class, final_state "
        "FROM v_lost_work WHERE allocation_id IN ('slurm/c/12', 'k8s/c/ev') ORDER BY scheduler",
    )
    naive = [(s, a.replace(tzinfo=UTC), b.replace(tzinfo=UTC), *rest) for s, a, b, *rest in times]
    assert naive == [
        ("kubernetes", at(0), at(20), "carol", "service", "evicted"),
        ("slurm", at(0), at(15), "alice", "batch", "REQUEUED"),
    ]


def test_sums_by_cause(warehouse: ClickHouseSettings) -> None:
    got = query(
        warehouse,
        "SELECT cause, count(), sum(lost_gpu_h), sum(consumed_gpu_h) FROM v_lost_work "
        "GROUP BY cause ORDER BY cause",
    )
    assert got == [
        (cause, runs, pytest.approx(lost, abs=5e-5), pytest.approx(used, abs=5e-5))
        for cause, (runs, lost, used) in sorted(BY_CAUSE.items())
    ]


def test_the_report_section(warehouse: ClickHouseSettings) -> None:
    c = connect(warehouse)
    try:
        report = build_report(c, T0, T0 + timedelta(hours=1))
        later = build_report(c, T0 + timedelta(hours=1), T0 + timedelta(hours=2))
    finally:
        c.close()
    lost = report.lost_work
    assert (lost.runs, lost.lost_gpu_h, lost.consumed_gpu_h) == (8, 6.0333, 1.9833)
    assert [(r.key, r.runs, r.lost_gpu_h, r.consumed_gpu_h) for r in lost.by_cause] == [
        (k, *v) for k, v in BY_CAUSE.items()
    ]  # most lost first
    assert [(r.key, r.runs, r.lost_gpu_h, r.consumed_gpu_h) for r in lost.by_team] == [
        (k, *v) for k, v in BY_TEAM.items()
    ]
    # Slurm runs are batch (their events name no class), pods service; queues per cluster
    assert [(r.key, r.runs, r.lost_gpu_h, r.consumed_gpu_h) for r in lost.by_class] == [
        ("batch", 4, 4.45, 1.45),
        ("service", 4, 1.5833, 0.5333),
    ]
    assert [(r.key, r.runs, r.lost_gpu_h) for r in lost.by_queue] == [
        ("c/big", 1, 3.0),
        ("c/ml", 4, 1.5833),
        ("c/gpu", 3, 1.45),
    ]  # most lost first
    doc = json.loads(render(report, "json"))
    assert doc["lost_work"]["by_cause"][0] == {
        "key": "node_failure", "runs": 2, "lost_gpu_h": 3.15, "consumed_gpu_h": 0.75,
    }  # fmt: skip
    text = render(report, "table")
    assert max(len(line) for line in text.splitlines()) <= 100
    section = text[text.index(HEADING) :]
    assert "8 runs, 6.03 GPU-h lost (all they held), 1.98 GPU-h of it consumed" in section
    for line in ("node_failure", "2", "3.15", "0.75"), ("research", "4", "1.58", "0.53"):
        assert any(line == tuple(row.split()) for row in section.splitlines()), line
    # every lost run ended before 11:00: the next hour lost nothing
    assert later.lost_work.runs == 0 and later.lost_work.by_cause == []
    later_text = render(later, "table")
    assert f"{HEADING} (runs that ended in the window)\n  nothing lost: no run" in later_text
    rows = render(report, "csv").splitlines()
    assert "lost_work_by_cause,oom_killed,lost_gpu_h,1.2" in rows
    assert "lost_work_by_queue,c/big,runs,1" in rows
    assert "lost_work_by_class,service,lost_gpu_h,1.5833" in rows


def test_the_page_table_is_the_view_by_cause_and_queue(warehouse: ClickHouseSettings) -> None:
    """The web page's "Work lost" table (/api/lost_work): the view summed by cause and queue,
    narrowed by the page's filters and range."""
    from gpugap.web.params import filters
    from gpugap.web.queries import lost_work

    def page(**given: str) -> list[tuple[Any, ...]]:
        span = {
            "from": str(int(T0.timestamp())),
            "to": str(int((T0 + timedelta(hours=1)).timestamp())),
        }
        f = filters({k: [v] for k, v in {**span, **given}.items()}, T0 + timedelta(hours=1))
        q = lost_work(f)
        c = connect(warehouse)
        try:
            rows = c.query(q.sql, parameters=q.params).named_results()
            return [(r["cause"], r["queue"], r["runs"], r["lost_gpu_h"]) for r in rows]
        finally:
            c.close()

    want: dict[tuple[str, str], list[float]] = {}
    for _, cause, queue, _, _, lost, _ in ROWS:
        sums = want.setdefault((cause, queue), [0, 0.0])
        sums[0] += 1
        sums[1] += lost
    got = page()
    assert sorted((c, q, n, round(h, 4)) for c, q, n, h in got) == sorted(
        (c, q, n, round(h, 4)) for (c, q), (n, h) in want.items()
    )
    assert got[0][:2] == ("node_failure", "big")  # most lost first
    assert {c for c, *_ in page(team="research")} == {
        "evicted",
        "node_failure",
        "oom_killed",
        "preempted",
    }
    assert page(cluster="elsewhere") == []


def test_the_metrics_gauges_sum_the_last_day(warehouse: ClickHouseSettings) -> None:
    """gpugap web's /metrics: lost GPU-hours and runs per cluster, cause and team over the day
    before the newest data (all of this estate's runs)."""
    import asyncio
    import re

    from gpugap.web.metrics import Exporter
    from gpugap.web.queries import Query

    c = connect(warehouse)

    async def run(q: Query) -> tuple[list[str], list[Any]]:
        result = c.query(q.sql, parameters=q.params)
        return list(result.column_names), [list(r) for r in result.result_rows]

    try:
        text = asyncio.run(Exporter(run).text())
    finally:
        c.close()
    series = re.compile(r'^(gpugap_lost_\w+)\{cluster="c",cause="(\w+)",team="(\w+)"\} (\S+)$')
    got: dict[tuple[str, str], list[float]] = {}
    for line in text.splitlines():
        if m := series.match(line):
            sums = got.setdefault((m[2], m[3]), [0.0, 0.0])
            sums[0 if m[1] == "gpugap_lost_gpu_hours_24h" else 1] = float(m[4])
    want: dict[tuple[str, str], list[float]] = {}
    for _, cause, _, team, _, lost, _ in ROWS:
        sums = want.setdefault((cause, team), [0.0, 0.0])
        sums[0] += lost
        sums[1] += 1
    assert got.keys() == want.keys()
    for key, (lost, runs) in want.items():
        assert got[key] == [pytest.approx(lost), runs], key
    assert "gpugap_warehouse_up 1" in text
