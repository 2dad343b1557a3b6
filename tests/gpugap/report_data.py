"""A small estate with a known answer, for the report's tests, written through the real sink.

Two hours from 23:00 UTC (so the data crosses midnight and the daily and hourly views both
matter), two clusters:

- Slurm cluster ``c``, node n1 (4 GPUs): job 101 ``train-resnet`` (alice/vision, 2 GPUs, 75% and
  0%, limit 8 h, ends after 2 h); job 102 ``salloc`` (bob/nlp, interactive, 1 GPU at 1%, still
  running: idle now); job 103 ``sweep-7`` (alice/vision, 1 GPU at 50% for 1 h, limit 2 h); then
  that GPU is free, with 50% unattributed use for 30 minutes.
- Kubernetes cluster ``k``, node n2 (3 GPUs): notebook ``notebooks/jupyter-carol`` (carol/vision,
  2%: idle now), ``search/inference-7d9f`` (dave/search, service, 40%), one GPU nobody holds;
  a partial gang ``llm-pretrain`` (erin/research, 3 running, 1 pending) still open.

In GPU-hours: allocated 11, consumed 2.86, gap 8.14; unallocated 3, unattributed 0.25;
padding: job 101 12 (limit 4x elapsed), job 103 1 (2x).
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

from gpugap.groundfloor.settings import ClickHouseSettings
from gpugap.schemas import Alert, GpuMinute, K8sPodEvent, NodeGpus, Record, SlurmJobEvent
from gpugap.schemas.examples import gpu_uuid
from gpugap.sinks.clickhouse.sink import ClickHouseSink

T0 = datetime(2026, 11, 2, 23, 0, tzinfo=UTC)
MINUTES = 120
N1, N2 = ("c", "n1"), ("k", "n2")


def _job(job_id: str, kind: str, gpus: tuple[int, ...], end: int | None, **kw: object) -> Record:
    end_time = T0 + timedelta(minutes=end) if end is not None else None
    return SlurmJobEvent(
        event_id=f"slurm/c/{job_id}/{kind}",
        kind=kind,
        time=end_time or T0,
        source="hook",
        cluster="c",
        job_id=job_id,
        nodes=(NodeGpus(node="n1", gpu_indices=gpus),),
        gpus_total=len(gpus),
        start_time=T0,
        end_time=end_time,
        state="COMPLETED" if end_time else "RUNNING",
        exit_code=0 if end_time else None,
        partition="gpu",
        **kw,
    )


def _pod(uid: str, namespace: str, name: str, *, cls: str, owner: str, team: str) -> Record:
    return K8sPodEvent(
        event_id=f"k8s/k/{uid}/bound",
        kind="bound",
        time=T0,
        source="watch",
        cluster="k",
        uid=uid,
        namespace=namespace,
        name=name,
        node="n2",
        phase="Running",
        gpus=1,
        gpu_resource="nvidia.com/gpu",
        workload_class=cls,
        owner=owner,
        team=team,
    )


def _minute(
    where: tuple[str, str], gpu: int, m: int, consumed_s: float, alloc: tuple[str, ...] | None
) -> GpuMinute:
    cluster, node = where
    scheduler, cls, owner, team = (None, None, None, None)
    if alloc:
        scheduler, cls, owner, team = alloc[1:]
    return GpuMinute(
        cluster=cluster,
        node=node,
        gpu_uuid=gpu_uuid(node, gpu),
        minute=T0 + timedelta(minutes=m),
        allocated_s=60.0 if alloc else 0.0,
        unallocated_s=0.0 if alloc else 60.0,
        consumed_gpu_s=consumed_s,
        activity_avg=consumed_s / 60,
        activity_max=consumed_s / 60,
        activity_metric="sm_active",
        sample_count=6,
        no_samples=False,
        allocation_id=alloc[0] if alloc else None,
        scheduler=scheduler,
        workload_class=cls,
        owner=owner,
        team=team,
    )


def records() -> list[Record]:
    j101 = ("slurm/c/101", "slurm", "batch", "alice", "vision")
    j102 = ("slurm/c/102", "slurm", "interactive", "bob", "nlp")
    j103 = ("slurm/c/103", "slurm", "batch", "alice", "vision")
    carol = ("k8s/k/u-carol", "kubernetes", "interactive", "carol", "vision")
    dave = ("k8s/k/u-dave", "kubernetes", "service", "dave", "search")
    who = {"user": "alice", "account": "vision"}
    out: list[Record] = [
        _job("101", "start", (0, 1), None, job_name="train-resnet", time_limit_s=8 * 3600, **who),
        _job("101", "end", (0, 1), 120, job_name="train-resnet", time_limit_s=8 * 3600, **who),
        _job("103", "start", (2,), None, job_name="sweep-7", time_limit_s=2 * 3600, **who),
        _job("103", "end", (2,), 60, job_name="sweep-7", time_limit_s=2 * 3600, **who),
        _job(
            "102", "start", (3,), None, job_name="salloc", time_limit_s=86400, user="bob",
            account="nlp", interactive=True,
        ),
        _pod("u-carol", "notebooks", "jupyter-carol", cls="interactive", owner="carol",
             team="vision"),
        _pod("u-dave", "search", "inference-7d9f", cls="service", owner="dave", team="search"),
    ]  # fmt: skip
    for m in range(MINUTES):
        out += [
            _minute(N1, 0, m, 45.0, j101),
            _minute(N1, 1, m, 0.0, j101),
            _minute(N1, 2, m, 30.0, j103)
            if m < 60
            else _minute(N1, 2, m, 30.0 if m < 90 else 0.0, None),
            _minute(N1, 3, m, 0.6, j102),
            _minute(N2, 0, m, 1.2, carol),
            _minute(N2, 1, m, 24.0, dave),
            _minute(N2, 2, m, 0.0, None),
        ]
    for state, minutes in (("open", 30), ("update", 100)):
        out.append(
            Alert(
                alert_id="partial_gang/k/llm-pretrain/1",
                kind="partial_gang",
                state=state,
                time=T0 + timedelta(minutes=minutes),
                opened_at=T0 + timedelta(minutes=30),
                cluster="k",
                scheduler="kubernetes",
                gang_id="llm-pretrain",
                owner="erin",
                team="research",
                workload_class="batch",
                nodes=("n3", "n4"),
                idle_gpu_hours=3.5 if state == "update" else 0.0,
                running_pods=3,
                pending_pods=1,
            )
        )
    return out


def store(settings: ClickHouseSettings) -> None:
    async def run() -> None:
        sink = ClickHouseSink(settings)
        await sink.start()
        await sink.write(records())
        await sink.close()

    asyncio.run(run())
