"""v_queue_wait against hand-computed waits: Slurm jobs from eligibility (else submit) to
start, pods from creation to binding, a gang from its first creation to its last binding."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import pytest

from gpugap.groundfloor.settings import ClickHouseSettings
from gpugap.schemas import K8sPodEvent, NodeGpus, Record, SlurmJobEvent
from gpugap.sinks.clickhouse.sink import ClickHouseSink
from gpugap.warehouse.client import connect

T0 = datetime(2026, 11, 2, 10, 0, tzinfo=UTC)


def at(minutes: float) -> datetime:
    return T0 + timedelta(minutes=minutes)


def slurm(
    job_id: str, gpus: int, submit: float, start: float, eligible: float | None = None
) -> SlurmJobEvent:
    return SlurmJobEvent(
        event_id=f"slurm/c/{job_id}/start",
        kind="start",
        time=at(start),
        source="hook",
        cluster="c",
        job_id=job_id,
        user="alice",
        account="vision",
        partition="gpu",
        nodes=(NodeGpus(node="n1", gpu_indices=tuple(range(gpus))),),
        gpus_total=gpus,
        time_limit_s=3600,
        submit_time=at(submit),
        eligible_time=at(eligible) if eligible is not None else None,
        start_time=at(start),
        state="RUNNING",
    )


def pod(uid: str, created: float | None, bound: float, gang: str | None = None) -> K8sPodEvent:
    return K8sPodEvent(
        event_id=f"k8s/k/{uid}/bound",
        kind="bound",
        time=at(bound),
        source="watch",
        cluster="k",
        uid=uid,
        namespace="ml",
        name=f"p-{uid}",
        node="k1",
        phase="Pending",
        created_time=at(created) if created is not None else None,
        gpus=2,
        gpu_resource="nvidia.com/gpu",
        team="research",
        gang_id=gang,
        gang_size=3 if gang else None,
    )


def records() -> list[Record]:
    return [
        slurm("1", 2, submit=0, start=30),  # 30 min x 2 GPUs
        slurm("2", 4, submit=0, start=90, eligible=60),  # --begin: waits from 60, 30 min x 4
        pod("a", created=0, bound=10),  # 10 min x 2
        pod("g1", created=0, bound=5, gang="train"),
        pod("g2", created=2, bound=20, gang="train"),  # 2 of 3 bound: not complete
        pod("old", created=None, bound=3),  # an older producer: no creation time, left out
    ]


def test_waits_per_job_pod_and_gang(clickhouse: ClickHouseSettings) -> None:
    async def store() -> None:
        sink = ClickHouseSink(clickhouse)
        await sink.start()
        await sink.write(records())
        await sink.write(records())  # re-delivered: nothing changes
        await sink.close()

    asyncio.run(store())
    c = connect(clickhouse)
    try:
        rows = c.query(
            "SELECT scheduler, queue, allocation_id, gang_id, members, gang_size, gpus, wait_s, "
            "gpu_h_waited, held_gpu_h FROM v_queue_wait ORDER BY cluster, allocation_id, gang_id"
        ).result_rows
    finally:
        c.close()
    assert [tuple(r) for r in rows] == [
        ("slurm", "gpu", "slurm/c/1", "", 1, 0, 2, 1800.0, pytest.approx(1.0), 0.0),
        ("slurm", "gpu", "slurm/c/2", "", 1, 0, 4, 1800.0, pytest.approx(2.0), 0.0),
        ("kubernetes", "ml", "", "train", 2, 3, 4, 1200.0, pytest.approx(4 / 3),
         pytest.approx(2 * 15 / 60)),  # g1 held 2 GPUs from 5 to 20 min
        ("kubernetes", "ml", "k8s/k/a", "", 1, 0, 2, 600.0, pytest.approx(1 / 3), 0.0),
    ]  # fmt: skip
