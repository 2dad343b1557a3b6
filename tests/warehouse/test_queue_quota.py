"""Quota held but unused (v_queue_quota_hourly) against a hand-computed estate: a Kueue
ClusterQueue holding its 8 GPUs at 10 % use while its sibling waits with 3 workloads pending,
a Slurm QOS and an association with GrpTRES gres/gpu, written through the sink."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from gpugap.groundfloor.settings import ClickHouseSettings
from gpugap.report import build_report, render
from gpugap.schemas import K8sPodEvent, NodeGpus, Record, SlurmJobEvent
from gpugap.schemas.models import QueueQuota
from gpugap.warehouse.client import connect
from gpugap.web import queries
from gpugap.web.params import Filters
from tests.harness.warehouse import metric_samples
from tests.warehouse.test_lost_work import minutes
from tests.warehouse.test_stranded import query
from tests.warehouse.test_views import store

T0 = datetime(2026, 11, 2, 10, 0, tzinfo=UTC)


def quota_polls(kind: str, queue: str, **fields: object) -> list[QueueQuota]:
    """Sixty polls a minute apart (an hour) of one queue's record."""
    return [
        QueueQuota.model_validate(
            {
                "cluster": "c",
                "time": T0 + timedelta(minutes=i),
                "interval_s": 60.0,
                "kind": kind,
                "queue": queue,
                "resource": "gres/gpu" if kind.startswith("slurm") else "nvidia.com/gpu",
                **fields,
            }
        )
        for i in range(60)
    ]


def pod_events() -> list[Record]:
    """One pod of LocalQueue ml-a/lq-a with 8 GPUs on k1 from 10:00, created at 09:30."""
    common = {
        "source": "watch", "cluster": "c", "uid": "uid-a", "namespace": "ml-a", "name": "train",
        "node": "k1", "gpus": 8, "gpu_resource": "nvidia.com/gpu", "queue": "lq-a",
        "created_time": T0 - timedelta(minutes=30), "workload_class": "service",
        "owner": "carol", "team": "research",
    }  # fmt: skip
    return [
        K8sPodEvent(event_id="k8s/c/uid-a/bound", kind="bound", time=T0, phase="Pending", **common),
        K8sPodEvent(
            event_id="k8s/c/uid-a/running", kind="running", time=T0, phase="Running", **common
        ),
    ]


def slurm_job() -> list[Record]:
    """Job 77 of account vision, user alice, QOS gpu-small: 2 GPUs on n1, busy, 10:00-11:00."""
    return [
        SlurmJobEvent(
            event_id=f"slurm/c/77/0/{kind}",
            kind=kind,
            time=T0 + timedelta(hours=1 if kind == "end" else 0),
            source="hook",
            cluster="c",
            job_id="77",
            user="alice",
            account="vision",
            partition="gpu",
            qos="gpu-small",
            nodes=(NodeGpus(node="n1", gpu_indices=(0, 1)),),
            gpus_total=2,
            start_time=T0,
            end_time=T0 + timedelta(hours=1) if kind == "end" else None,
            state="COMPLETED" if kind == "end" else "RUNNING",
        )
        for kind in ("start", "end")
    ]


def estate() -> list[Record]:
    return [
        *quota_polls("kueue_cluster_queue", "team-a", parent="research", flavor="a100",
                     entitled_gpus=8.0, limit_gpus=12.0, held_gpus=8.0, borrowed_gpus=0.0,
                     pending_workloads=0, admitted_workloads=1),
        *quota_polls("kueue_cluster_queue", "team-b", parent="research", flavor="a100",
                     entitled_gpus=8.0, limit_gpus=12.0, held_gpus=0.0, borrowed_gpus=0.0,
                     pending_workloads=3, admitted_workloads=0),
        # their sibling, entitled to 4, holding 6: 2 borrowed, from team-b's unused 8
        *quota_polls("kueue_cluster_queue", "team-c", parent="research", flavor="a100",
                     entitled_gpus=4.0, limit_gpus=12.0, held_gpus=6.0, borrowed_gpus=2.0,
                     pending_workloads=0, admitted_workloads=1),
        *quota_polls("kueue_local_queue", "lq-a", namespace="ml-a", parent="team-a",
                     held_gpus=8.0, pending_workloads=0),
        *quota_polls("kueue_local_queue", "lq-b", namespace="ml-b", parent="team-b",
                     held_gpus=0.0, pending_workloads=3),
        *quota_polls("slurm_qos", "gpu-small", entitled_gpus=4.0, limit_gpus=4.0),
        *quota_polls("slurm_association", "vision", entitled_gpus=16.0, limit_gpus=16.0),
        *pod_events(),
        *minutes("k8s/c/uid-a", tuple(range(8)), 0, 60, busy_s=6.0),
        *slurm_job(),
        *minutes("slurm/c/77", (0, 1), 0, 60, busy_s=60.0),
    ]  # fmt: skip


def test_each_queue_beside_what_its_allocations_held_used_and_waited(
    clickhouse: ClickHouseSettings,
) -> None:
    rows = estate()
    store(clickhouse, rows)
    store(clickhouse, rows[:100])  # re-delivered polls change nothing
    got = query(
        clickhouse,
        "SELECT kind, namespace, queue, any(parent), round(sum(entitled_gpu_h), 6), "
        "round(sum(limit_gpu_h), 6), round(sum(reported_held_gpu_h), 6), "
        "round(sum(pending_workload_h), 6), round(sum(allocated_gpu_h), 6), "
        "round(sum(consumed_gpu_h), 6), round(sum(waited_gpu_h), 6), "
        "round(sum(unused_gpu_h), 6), round(sum(borrowed_gpu_h), 6), round(sum(lent_gpu_h), 6) "
        "FROM v_queue_quota_hourly WHERE cluster = 'c' "
        "GROUP BY kind, namespace, queue ORDER BY kind, namespace, queue",
    )
    assert got == [
        # held all 8 GPUs at 10 %: 0.8 of 8 GPU-hours consumed; its pod waited 30 min for 8
        ("kueue_cluster_queue", "", "team-a", "research", 8.0, 12.0, 8.0, 0.0, 8.0, 0.8, 4.0, 0.0,
         0.0, 0.0),
        # entitled to 8 and holding none while 3 workloads waited the hour; team-c borrowed 2
        # GPU-hours of its 8 unused: lent 8 x min(1, 2/8)
        ("kueue_cluster_queue", "", "team-b", "research", 8.0, 12.0, 0.0, 3.0, 0.0, 0.0, 0.0, 8.0,
         0.0, 2.0),
        # no pod of it is stored: what its manager says it holds counts against its entitlement
        ("kueue_cluster_queue", "", "team-c", "research", 4.0, 12.0, 6.0, 0.0, 0.0, 0.0, 0.0, 0.0,
         2.0, 0.0),
        ("kueue_local_queue", "ml-a", "lq-a", "team-a", 0.0, 0.0, 8.0, 0.0, 8.0, 0.8, 4.0, 0.0,
         0.0, 0.0),
        ("kueue_local_queue", "ml-b", "lq-b", "team-b", 0.0, 0.0, 0.0, 3.0, 0.0, 0.0, 0.0, 0.0,
         0.0, 0.0),
        ("slurm_association", "", "vision", "", 16.0, 16.0, 0.0, 0.0, 2.0, 2.0, 0.0, 14.0, 0.0,
         0.0),
        ("slurm_qos", "", "gpu-small", "", 4.0, 4.0, 0.0, 0.0, 2.0, 2.0, 0.0, 2.0, 0.0, 0.0),
    ]  # fmt: skip


def test_the_report_ranks_queues_by_unused_entitlement(clickhouse: ClickHouseSettings) -> None:
    store(clickhouse, estate())
    client = connect(clickhouse)
    try:
        report = build_report(client, T0, T0 + timedelta(hours=1))
    finally:
        client.close()
    queues = [(q.queue, q.entitled_gpu_h, q.allocated_gpu_h, q.consumed_gpu_h, q.unused_gpu_h,
               q.pending_workload_h) for q in report.beyond_idle.queues]  # fmt: skip
    assert queues[:3] == [
        ("c/slurm_association/vision", 16.0, 2.0, 2.0, 14.0, 0.0),
        ("c/kueue_cluster_queue/team-b", 8.0, 0.0, 0.0, 8.0, 3.0),
        ("c/slurm_qos/gpu-small", 4.0, 2.0, 2.0, 2.0, 0.0),
    ]
    assert [q.lent_gpu_h for q in report.beyond_idle.queues if q.queue.endswith("team-b")] == [2.0]
    section = render(report, "table")
    assert max(len(line) for line in section.splitlines()) <= 100
    assert "queues: entitlement beside what their work held and used" in section
    assert any(
        line.split()[:3] == ["c/kueue_cluster_queue/team-a", "8.00", "8.00"]
        for line in section.splitlines()
    )


def test_the_pages_queue_table_takes_the_cluster_filter(clickhouse: ClickHouseSettings) -> None:
    store(clickhouse, estate())
    client = connect(clickhouse)

    def table(**filters: Any) -> list[tuple[object, ...]]:
        q = queries.queue_quotas(Filters(since=T0, until=T0 + timedelta(hours=1), **filters))
        result = client.query(q.sql, parameters=q.params)
        return [tuple(r[:5]) + tuple(round(x, 6) for x in r[5:]) for r in result.result_rows]

    try:
        here, elsewhere = table(clusters=("c",)), table(clusters=("other",))
    finally:
        client.close()
    assert here[:2] == [
        # entitled, held, consumed, unused, borrowed, lent, pending workload-h, waited
        ("c", "slurm_association", "", "vision", "", 16.0, 2.0, 2.0, 14.0, 0.0, 0.0, 0.0, 0.0),
        ("c", "kueue_cluster_queue", "", "team-b", "research", 8.0, 0.0, 0.0, 8.0, 0.0, 2.0, 3.0,
         0.0),
    ]  # fmt: skip
    assert len(here) == 7 and elsewhere == []


def test_metrics_state_each_queue_at_its_latest_poll(clickhouse: ClickHouseSettings) -> None:
    store(clickhouse, estate())
    got = {
        (name, labels["kind"], labels["queue"]): value
        for name, labels, value in metric_samples(clickhouse, "gpugap_queue")
    }
    assert got[("gpugap_queue_entitled_gpus", "kueue_cluster_queue", "team-a")] == 8.0
    assert got[("gpugap_queue_held_gpus", "kueue_cluster_queue", "team-a")] == 8.0
    assert got[("gpugap_queue_pending_workloads", "kueue_cluster_queue", "team-b")] == 3.0
    assert got[("gpugap_queue_entitled_gpus", "slurm_association", "vision")] == 16.0
    assert len({(k, q) for _, k, q in got}) == 7
