"""Stranded GPUs: the simulator's node capacity polls (node-capacity.v1) and their truth
(gpugap/simulator/truth_stranded.py, docs/architecture.md#stranded-gpus). The truth is checked
on hand-computed nodes, then the small scenario goes through Kafka into the ClickHouse sink and
the warehouse's views (v_stranded, v_stranded_by_allocation) must say the same."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest

from gpugap.groundfloor.settings import ClickHouseSettings, KafkaSettings
from gpugap.schemas import decode
from gpugap.schemas.topics import NODE_CAPACITY
from gpugap.simulator import build, scenario
from gpugap.simulator.activity import constant
from gpugap.simulator.estate import build as build_estate
from gpugap.simulator.plan import Allocation, Holding, Plan
from gpugap.simulator.truth_stranded import compute, split
from tests.harness.demo_data import emitted

HOUR = 3600

ONE_NODE = """
[scenario]
name = "one"
start = 2026-11-02T08:00:00Z
duration = "1h"
capacity_interval = "60s"

[teams]
vision = ["alice"]

[[clusters]]
name = "hpc"
scheduler = "slurm"

[[clusters.node_groups]]
name = "h100"
count = 2
gpus = 8
model = "NVIDIA H100 80GB HBM3"
cpus = 64
memory_gib = 512
spare = 1
"""


def one_node(cpus: float, memory_gib: float, gpus: int = 1) -> dict[str, Any]:
    """An hour of one 8-GPU, 64-core, 512 GiB node (and a spare one) with one job holding
    ``gpus`` GPUs, ``cpus`` cores and ``memory_gib`` from 0 to past the end."""
    sc = scenario.parse(ONE_NODE)
    estate = build_estate(sc)
    plan = Plan(estate, 2 * HOUR)
    node = estate.nodes[0]
    a = Allocation("slurm/hpc/1", "slurm", "hpc", "slurm_batch", "batch", "alice", "vision",
                   "job", 0, 2 * HOUR)  # fmt: skip
    for d in node.devices[:gpus]:
        plan.hold(a, d, Holding(d, 0, 2 * HOUR, constant(0, 500), 1024.0, a))
    a.cpus[node.name] = Fraction(cpus)
    a.memory_mib[node.name] = Fraction(memory_gib) * 1024
    plan.allocations.append(a)
    return compute(sc, plan, HOUR)


def test_one_gpu_with_all_the_cores_strands_the_other_seven_by_cpu() -> None:
    t = one_node(cpus=64, memory_gib=64)
    hpc = t["by_cluster"]["hpc"]
    assert t["polls"] == 2 * 60  # two nodes, every 60 s for an hour
    assert hpc["capacity_gpu_h"] == 16
    assert hpc["allocated_gpu_h"] == 1
    assert hpc["stranded_cpu_gpu_h"] == 7  # 7 free GPUs, no free core to feed them
    assert hpc["stranded_memory_gpu_h"] == 0 and hpc["usable_free_gpu_h"] == 0
    assert hpc["unavailable_gpu_h"] == 8  # the spare node: drained
    [row] = t["by_allocation"]
    assert row == {"cluster": "hpc", "allocation_id": "slurm/hpc/1", "cpu_gpu_h": 7.0,
                   "memory_gpu_h": 0.0, "stranded_gpu_h": 7.0}  # fmt: skip


def test_half_a_gpu_is_stranded_by_twelve_cores() -> None:
    # 12 of 64 cores with one GPU: the free 52 feed 6.5 of the 7 free GPUs
    t = one_node(cpus=12, memory_gib=64)
    hpc = t["by_cluster"]["hpc"]
    assert hpc["stranded_cpu_gpu_h"] == 0.5 and hpc["usable_free_gpu_h"] == 6.5
    assert t["by_allocation"][0]["cpu_gpu_h"] == 0.5


def test_memory_strands_after_cpu_and_the_shares_follow_the_excess() -> None:
    # docs/architecture.md's example: an 8-GPU node with 64 cores and 256 GiB; a pod with
    # 2 GPUs, 8 cores and 192 GiB beside a CPU-only pod with 4 cores and 2 GiB
    gib = Fraction(1024)
    first = Allocation("k8s/c/a", "kubernetes", "c", "k8s_job", "batch", "a", "t", "a", 0, 1)
    cpu = Allocation("k8s/c/b", "kubernetes", "c", "cpu_only", "batch", "a", "t", "b", 0, 1)
    held = [
        (first, Fraction(2), Fraction(8), 192 * gib),
        (cpu, Fraction(0), Fraction(4), 2 * gib),
    ]
    fig, who = split(Fraction(8), Fraction(64), 256 * gib, True, held)
    assert fig["free"] == 6 and fig["cpu"] == 0
    assert fig["memory"] == Fraction(65, 16)  # 6 - 62 x 8/256 = 4.0625
    assert fig["usable"] == 6 - Fraction(65, 16)
    assert who == {("k8s/c/a", "memory"): 4, ("k8s/c/b", "memory"): Fraction(1, 16)}
    # not schedulable: the free GPUs are unavailable, none stranded
    fig, who = split(Fraction(8), Fraction(64), 256 * gib, False, held)
    assert fig["unavailable"] == 6 and fig["memory"] == fig["cpu"] == 0 and not who


def test_slices_holding_their_share_strand_nothing() -> None:
    sc = scenario.load("small")
    plan = build(sc)
    mig = [n for n in plan.estate.nodes if n.devices[0].is_mig]
    assert mig
    t = compute(sc, plan, HOUR)
    ids = {a.id for a in plan.allocations if a.holdings[0].device.is_mig}
    assert ids and not ids & {r["allocation_id"] for r in t["by_allocation"]}


# --- the small scenario: its polls, and the warehouse against the truth ---------------------


def test_small_polls_every_node_every_minute_with_its_holders() -> None:
    sc = scenario.load("small")
    assert sc.scenario.capacity_interval == 60
    messages = emitted(sc)
    polls = [decode(NODE_CAPACITY, m[2]) for m in messages if m[0] == NODE_CAPACITY.name]
    plan = build(sc)
    nodes = {n.name: n for n in plan.estate.nodes}
    assert len({(p.node, p.time) for p in polls}) == len(nodes) * 60  # duplicates aside
    ids = {a.id for a in plan.allocations} | {a.id for a in plan.cpu_only}
    assert {a.allocation_id for p in polls for a in p.allocations} <= ids
    for p in polls:
        n = nodes[p.node]
        assert p.schedulable is not n.spare and p.pool == n.group and p.interval_s == 60
        assert p.source == ("slurm_scontrol" if p.scheduler == "slurm" else "kubernetes")
        assert sum(a.gpus for a in p.allocations) <= p.gpus + 1e-9
        assert sum(a.cpus for a in p.allocations) <= p.cpus + 1e-9
        assert sum(a.memory_mib for a in p.allocations) <= p.memory_mib + 1e-9
    # a spare node is drained and empty; a CPU-only job shows up with no GPU
    assert all(not p.allocations for p in polls if nodes[p.node].spare)
    [cpu_job] = plan.cpu_only
    assert any(a.allocation_id == cpu_job.id and a.gpus == 0 for p in polls for a in p.allocations)


def test_capacity_polls_change_no_other_record() -> None:
    sc = scenario.load("small")
    off = sc.model_copy(
        update={"scenario": sc.scenario.model_copy(update={"capacity_interval": 0})}
    )
    with_polls = [m for m in emitted(sc) if m[0] != NODE_CAPACITY.name]
    assert with_polls == emitted(off)
    # and the duplicated polls are byte-equal copies
    counts = Counter(m[2] for m in emitted(sc) if m[0] == NODE_CAPACITY.name)
    assert 0 < sum(c - 1 for c in counts.values()) < len(counts) // 20


def test_small_pins_its_stranded_figures() -> None:
    sc = scenario.load("small")
    t = compute(sc, build(sc), HOUR)
    assert t["polls"] == 8 * 60
    totals = t["totals"]
    assert totals["capacity_gpu_h"] == 46  # 4 x 8 H100 + 3 x 4 L40S + 2 A100
    assert totals["unavailable_gpu_h"] == 8  # the spare H100 node, drained all hour
    assert totals["stranded_cpu_gpu_h"] > 1 and totals["stranded_memory_gpu_h"] > 0.5
    parts = ("allocated_gpu_h", "usable_free_gpu_h", "stranded_gpu_h", "unavailable_gpu_h")
    assert sum(totals[k] for k in parts) == pytest.approx(46, abs=1e-9)
    causes = {(r["allocation_id"].split("/")[0], r["cpu_gpu_h"] > 0) for r in t["by_allocation"]}
    assert causes == {("slurm", True), ("k8s", False)}  # the CPU-heavy job and CPU-only job;
    # the memory-heavy pod


@pytest.mark.kafka
def test_the_warehouse_agrees_with_the_stranded_truth(
    kafka: KafkaSettings, clickhouse: ClickHouseSettings, tmp_path: Path
) -> None:
    from gpugap.groundfloor.kafka.publish import KafkaPublisher
    from gpugap.groundfloor.settings import Settings
    from gpugap.producers.base import run_producer
    from gpugap.schemas import TOPICS
    from gpugap.simulator.simulator import Simulator
    from gpugap.warehouse.client import connect
    from tests.harness.topics import create_topics
    from tests.streams.test_end_to_end import store

    async def pipeline() -> None:
        # node-capacity.v1 goes from the producer to the sink: no worker in between
        await create_topics(kafka, list(TOPICS))
        sim = Simulator(Settings(kafka=kafka), "small", speed=None, truth=tmp_path / "t.json")
        await run_producer(sim, KafkaPublisher(kafka))
        assert sim.stats is not None and sim.stats.duplicates[NODE_CAPACITY.name] > 0
        await store(kafka, clickhouse)

    asyncio.run(pipeline())
    truth = json.loads((tmp_path / "t.json").read_text())["stranded"]
    client = connect(clickhouse)
    try:
        rows = client.query(
            "SELECT cluster, count(), sum(allocated_gpu_h), sum(unallocated_gpu_h), "
            "sum(usable_free_gpu_h), sum(stranded_cpu_gpu_h), sum(stranded_memory_gpu_h), "
            "sum(stranded_gpu_h), sum(unavailable_gpu_h) FROM v_stranded GROUP BY cluster"
        ).result_rows
        by_alloc = client.query(
            "SELECT cluster, allocation_id, cause, sum(stranded_gpu_h) "
            "FROM v_stranded_by_allocation GROUP BY cluster, allocation_id, cause"
        ).result_rows
    finally:
        client.close()
    figures = ("allocated_gpu_h", "unallocated_gpu_h", "usable_free_gpu_h", "stranded_cpu_gpu_h",
               "stranded_memory_gpu_h", "stranded_gpu_h", "unavailable_gpu_h")  # fmt: skip
    got = {r[0]: dict(zip(("polls", *figures), r[1:], strict=True)) for r in rows}
    assert sum(g["polls"] for g in got.values()) == truth["polls"]  # duplicates collapsed
    assert set(got) == set(truth["by_cluster"])
    for cluster, want in truth["by_cluster"].items():
        for k in figures:
            assert got[cluster][k] == pytest.approx(want[k], abs=1e-6), (cluster, k)
    stored: dict[tuple[str, str, str], float] = {(r[0], r[1], r[2]): r[3] for r in by_alloc}
    wanted = {
        (r["cluster"], r["allocation_id"], cause): r[f"{cause}_gpu_h"]
        for r in truth["by_allocation"]
        for cause in ("cpu", "memory")
    }
    for key in stored.keys() | wanted.keys():
        assert stored.get(key, 0.0) == pytest.approx(wanted.get(key, 0.0), abs=1e-6), key
    assert sum(wanted.values()) > 2  # something was stranded: the check can fail
