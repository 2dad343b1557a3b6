"""Stranded GPUs and work spread thin (v_stranded, v_stranded_by_allocation, v_spread_work)
against hand-computed nodes, written through the sink as the producers' records arrive."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from gpugap.groundfloor.settings import ClickHouseSettings
from gpugap.report import build_report, render
from gpugap.report.beyond import HEADING
from gpugap.schemas import NodeGpus, Record, SlurmJobEvent
from gpugap.schemas.models import NodeAllocation, NodeCapacity
from gpugap.warehouse.client import connect
from gpugap.web import queries
from gpugap.web.params import Filters
from tests.harness.warehouse import metric_samples
from tests.warehouse.test_lost_work import minutes
from tests.warehouse.test_views import store

T0 = datetime(2026, 11, 2, 10, 0, tzinfo=UTC)
GIB = 1024.0


def polls(
    node: str,
    *,
    gpus: float,
    cpus: float,
    memory_mib: float,
    held: dict[str, tuple[float, float, float]],
    every_s: float = 60.0,
    hours: float = 1.0,
    schedulable: bool = True,
    scheduler: str = "slurm",
) -> list[NodeCapacity]:
    """A node polled every ``every_s`` for ``hours``; ``held``: allocation -> (GPUs, CPUs, MiB)."""
    return [
        NodeCapacity(
            cluster="c",
            node=node,
            time=T0 + timedelta(seconds=i * every_s),
            interval_s=every_s,
            scheduler=scheduler,
            source="slurm_scontrol" if scheduler == "slurm" else "kubernetes",
            pool="gpu",
            gpu_model="a100",
            gpus=gpus,
            cpus=cpus,
            memory_mib=memory_mib,
            schedulable=schedulable,
            allocations=tuple(
                NodeAllocation(allocation_id=a, gpus=g, cpus=c, memory_mib=m)
                for a, (g, c, m) in held.items()
            ),
        )
        for i in range(round(hours * 3600 / every_s))
    ]


def nodes() -> list[Record]:
    return [
        # a job with 1 GPU and all 64 cores of an 8-GPU node: the other 7 GPUs have no CPU
        # beside them -> 7 stranded by CPU, all the job's doing (excess 64 x 8/64 - 1 = 7)
        *polls("n1", gpus=8, cpus=64, memory_mib=512 * GIB,
               held={"slurm/c/1": (1, 64, 64 * GIB)}),
        # a pod with 2 GPUs and 192 of 256 GiB, and a CPU-only pod with 4 cores and 2 GiB:
        # 6 GPUs free; the free 52 cores feed 6.5, the free 62 GiB feed 62 x 8/256 = 1.9375:
        # 4.0625 stranded by memory: the pod's excess 192 x 8/256 - 2 = 4, the CPU-only pod's
        # 2 x 8/256 = 0.0625 (polled every 2 minutes)
        *polls("k1", gpus=8, cpus=64, memory_mib=256 * GIB, every_s=120.0,
               scheduler="kubernetes",
               held={"k8s/c/p": (2, 8, 192 * GIB), "k8s/c/q": (0, 4, 2 * GIB)}),
        # drained, nothing on it: 4 unavailable, not stranded
        *polls("n2", gpus=4, cpus=32, memory_mib=256 * GIB, held={}, schedulable=False),
        # half the GPUs with half the cores: the rest is usable
        *polls("n3", gpus=8, cpus=64, memory_mib=512 * GIB,
               held={"slurm/c/3": (4, 32, 128 * GIB)}),
    ]  # fmt: skip


@pytest.fixture
def stranded(clickhouse: ClickHouseSettings) -> ClickHouseSettings:
    rows = nodes()
    store(clickhouse, rows)
    store(clickhouse, rows[:30])  # a re-delivered batch changes nothing
    return clickhouse


def query(settings: ClickHouseSettings, sql: str) -> list[tuple[object, ...]]:
    client = connect(settings)
    try:
        return [tuple(r) for r in client.query(sql).result_rows]
    finally:
        client.close()


def test_each_nodes_free_gpus_split_into_usable_stranded_and_unavailable(
    stranded: ClickHouseSettings,
) -> None:
    rows = query(
        stranded,
        "SELECT node, round(sum(allocated_gpu_h), 6), round(sum(unallocated_gpu_h), 6), "
        "round(sum(usable_free_gpu_h), 6), round(sum(stranded_cpu_gpu_h), 6), "
        "round(sum(stranded_memory_gpu_h), 6), round(sum(unavailable_gpu_h), 6) "
        "FROM v_stranded WHERE cluster = 'c' AND node IN ('n1', 'k1', 'n2', 'n3') "
        "GROUP BY node ORDER BY node",
    )
    assert rows == [
        ("k1", 2.0, 6.0, 1.9375, 0.0, 4.0625, 0.0),
        ("n1", 1.0, 7.0, 0.0, 7.0, 0.0, 0.0),
        ("n2", 0.0, 4.0, 0.0, 0.0, 0.0, 4.0),
        ("n3", 4.0, 4.0, 4.0, 0.0, 0.0, 0.0),
    ]


def test_stranded_gpu_hours_go_to_the_allocations_beyond_their_share(
    stranded: ClickHouseSettings,
) -> None:
    rows = query(
        stranded,
        "SELECT allocation_id, cause, round(any(excess_gpus), 6), round(sum(stranded_gpu_h), 6) "
        "FROM v_stranded_by_allocation WHERE cluster = 'c' AND node IN ('n1', 'k1', 'n3') "
        "GROUP BY allocation_id, cause ORDER BY allocation_id, cause",
    )
    assert rows == [
        ("k8s/c/p", "memory", 4.0, 4.0),
        ("k8s/c/q", "memory", 0.0625, 0.0625),
        ("slurm/c/1", "cpu", 7.0, 7.0),
    ]


def spread_estate() -> list[Record]:
    out: list[Record] = []
    # one GPU on each of 4 eight-GPU nodes for an hour, half busy: 1 node would do, 3 extra
    for node in ("s1", "s2", "s3", "s4"):
        out += [
            m.model_copy(update={"node": node})
            for m in minutes("slurm/c/9", (0,), 0, 60, busy_s=30.0)
        ]
    # 8 GPUs on each of 2 full nodes: not spread
    for node in ("s5", "s6"):
        out += [
            m.model_copy(update={"node": node})
            for m in minutes("slurm/c/10", tuple(range(8)), 0, 60, busy_s=60.0)
        ]
    for node in ("s1", "s2", "s3", "s4", "s5", "s6"):
        out += polls(node, gpus=8, cpus=64, memory_mib=512 * GIB, held={}, hours=1 / 60)
    return out


def test_work_spread_over_more_nodes_than_it_needs(clickhouse: ClickHouseSettings) -> None:
    store(clickhouse, spread_estate())
    rows = query(
        clickhouse,
        "SELECT allocation_id, nodes, gpus, largest_node_gpus, min_nodes, extra_nodes, "
        "round(allocated_gpu_h, 6), round(consumed_gpu_h, 6) FROM v_spread_work "
        "WHERE cluster = 'c' AND allocation_id IN ('slurm/c/9', 'slurm/c/10')",
    )
    assert rows == [("slurm/c/9", 4, 4.0, 8.0, 1, 3, 4.0, 2.0)]


def test_the_report_names_stranded_gpus_who_stranded_them_and_spread_work(
    clickhouse: ClickHouseSettings,
) -> None:
    store(clickhouse, [*nodes(), *spread_estate()])
    client = connect(clickhouse)
    try:
        report = build_report(client, T0, T0 + timedelta(hours=1))
        later = build_report(client, T0 + timedelta(hours=1), T0 + timedelta(hours=2))
    finally:
        client.close()
    s = report.beyond_idle.stranded
    # n1..n3 and k1 as above, and the six s-nodes polled once, empty (8 x 60 s each: 0.8 h)
    got = (s.allocated_gpu_h, s.usable_free_gpu_h, s.stranded_cpu_gpu_h,
           s.stranded_memory_gpu_h, s.unavailable_gpu_h)  # fmt: skip
    assert got == (7.0, 6.7375, 7.0, 4.0625, 4.0)
    assert [(r.key, r.stranded_cpu_gpu_h, r.stranded_memory_gpu_h) for r in s.by_allocation] == [
        ("c/slurm/c/1", 7.0, 0.0), ("c/k8s/c/p", 0.0, 4.0), ("c/k8s/c/q", 0.0, 0.0625),
    ]  # fmt: skip
    assert [r.key for r in s.by_node] == ["c/n1", "c/k1"]
    assert [(r.unit, r.nodes, r.min_nodes, r.allocated_gpu_h) for r in report.beyond_idle.spread] \
        == [("c/slurm/c/9", 4, 1, 4.0)]  # fmt: skip
    text = render(report, "table")
    assert max(len(line) for line in text.splitlines()) <= 100
    section = text[text.index(HEADING) :]
    assert ("free GPU-h: 6.74 usable, 7.00 stranded by CPU, 4.06 stranded by memory,\n"
            "  4.00 on unschedulable nodes (7.00 GPU-h allocated") in section  # fmt: skip
    assert "no node capacity polled in the window" in render(later, "table")
    doc = json.loads(render(report, "json"))
    assert doc["beyond_idle"]["stranded"]["by_allocation"][0]["stranded_cpu_gpu_h"] == 7.0
    assert (
        "stranded_by_allocation,c/k8s/c/p,stranded_memory_gpu_h,4.0"
        in render(report, "csv").splitlines()
    )


def test_metrics_state_stranded_gpus_at_each_nodes_latest_poll(
    clickhouse: ClickHouseSettings,
) -> None:
    store(clickhouse, nodes())
    samples = {
        tuple(sorted(labels.items())): value
        for _, labels, value in metric_samples(clickhouse, "gpugap_gpus_stranded")
    }
    assert samples == {
        (("cause", "cpu"), ("cluster", "c")): 7.0,
        (("cause", "memory"), ("cluster", "c")): 4.0625,
    }


def test_the_pages_stranded_table_takes_the_team_filter(clickhouse: ClickHouseSettings) -> None:
    job = SlurmJobEvent(
        event_id="slurm/c/1/0/start", kind="start", time=T0, source="hook", cluster="c",
        job_id="1", user="alice", account="vision", nodes=(NodeGpus(node="n1", gpu_indices=(0,)),),
        gpus_total=1, start_time=T0, state="RUNNING",
    )  # fmt: skip
    store(clickhouse, [*nodes(), job])
    client = connect(clickhouse)

    def table(**filters: Any) -> list[tuple[object, ...]]:
        q = queries.stranded(Filters(since=T0, until=T0 + timedelta(hours=1), **filters))
        result = client.query(q.sql, parameters=q.params)
        return [tuple(r[:5]) + tuple(round(x, 6) for x in r[6:]) for r in result.result_rows]

    try:
        everyone, vision = table(), table(teams=("vision",))
    finally:
        client.close()
    assert everyone == [
        ("c", "slurm/c/1", "slurm", "vision", "batch", 7.0, 0.0),
        ("c", "k8s/c/p", "", "", "", 0.0, 4.0),
        ("c", "k8s/c/q", "", "", "", 0.0, 0.0625),
    ]
    assert vision == everyone[:1]


def test_the_page_and_metrics_show_work_spread_thin(clickhouse: ClickHouseSettings) -> None:
    store(clickhouse, spread_estate())
    client = connect(clickhouse)

    def page(since: datetime = T0, **filters: Any) -> list[tuple[object, ...]]:
        q = queries.spread_work(Filters(since=since, until=since + timedelta(hours=1), **filters))
        return [tuple(r[:8]) for r in client.query(q.sql, parameters=q.params).result_rows]

    try:
        everyone, nlp, next_day = page(), page(teams=("nlp",)), page(T0 + timedelta(days=1))
    finally:
        client.close()
    assert everyone == [("c", "slurm/c/9", "slurm", "vision", "batch", 4, 1, 4.0)]
    assert nlp == next_day == []
    samples = {
        (name, labels["team"]): value
        for name, labels, value in metric_samples(clickhouse, "gpugap_spread")
    }
    assert samples == {("gpugap_spread_gpus", "vision"): 4.0,
                       ("gpugap_spread_extra_nodes", "vision"): 3.0}  # fmt: skip
