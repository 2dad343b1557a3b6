"""The demo day's queue: every Slurm partition shows its wait, and the padding the scenario
gives its batch jobs is replayed (the demo's warehouse, tests/harness/demo_data.py)."""

from __future__ import annotations

from datetime import UTC, timedelta

from gpugap.queue.report import build_queue, render_table
from gpugap.simulator import scenario
from tests.harness.warehouse import DemoWarehouse


def test_the_demo_partitions_show_wait_and_the_paddings_queue_cost(
    demo_warehouse: DemoWarehouse,
) -> None:
    sc = scenario.load("demo").scenario
    start = sc.start.astimezone(UTC)
    q = build_queue(demo_warehouse.admin, start, start + timedelta(seconds=sc.duration))
    print(render_table(q))
    slurm = {r.key: r for r in q.by_queue if r.scheduler == "slurm"}
    assert slurm and all(r.gpu_h_waited > 0 for r in slurm.values()), q.by_queue
    # every partition with waiting work is replayed, and the model, limits as asked, starts
    # jobs on the recorded partition no later on average than they really started
    assert {f"{p.cluster}/{p.partition}" for p in q.partitions} == set(slurm)
    for p in q.partitions:
        assert p.jobs == slurm[f"{p.cluster}/{p.partition}"].jobs
        assert p.asked.jobs == p.jobs and p.measured_gpu_h_waited > 0
    assert any(p.jobs_right_sized > 0 and p.padded_users for p in q.partitions)
