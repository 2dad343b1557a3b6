"""gpugap checked against the scheduler's own count (v_scheduler_drift), hand-computed, written
through the sink: at slurmctld's latest poll (10:30) gpugap holds job 1 (2 GPUs, partition gpu,
account ml, alice) and job 2 (4 GPUs, partition big, account cv, bob) running; job 3 ended at
10:20 and job 4 starts at 10:40. Slurm's gauges agree, except that account cv holds 5 by its
count: one GPU of cv's gpugap never saw."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from gpugap.groundfloor.settings import ClickHouseSettings
from gpugap.report import build_report, render
from gpugap.report.models import Report
from gpugap.schemas import NodeGpus, Record, SlurmJobEvent
from gpugap.schemas.models import SchedulerGpuCount
from gpugap.warehouse.client import connect
from tests.harness.warehouse import metric_samples
from tests.warehouse.test_stranded import query
from tests.warehouse.test_views import store

T0 = datetime(2026, 11, 2, 10, 0, tzinfo=UTC)


def job(
    job_id: str, gpus: int, where: tuple[str, str, str], start_min: int, end_min: int | None
) -> list[Record]:
    """Job ``job_id`` of ``where`` = (partition, account, user) holding ``gpus`` GPUs on n1."""
    partition, account, user = where
    common = {
        "source": "jobcomp", "cluster": "c", "job_id": job_id, "user": user,
        "account": account, "partition": partition, "gpus_total": gpus,
        "nodes": (NodeGpus(node="n1", gpu_indices=tuple(range(gpus))),),
        "start_time": T0 + timedelta(minutes=start_min),
    }  # fmt: skip
    out: list[Record] = [
        SlurmJobEvent(
            event_id=f"slurm/c/{job_id}/start",
            kind="start",
            state="RUNNING",
            time=T0 + timedelta(minutes=start_min),
            **common,
        )
    ]
    if end_min is not None:
        end = T0 + timedelta(minutes=end_min)
        out.append(
            SlurmJobEvent(
                event_id=f"slurm/c/{job_id}/end",
                kind="end",
                time=end,
                end_time=end,
                state="COMPLETED",
                **common,
            )
        )
    return out


def counts(at: datetime, **by_scope: dict[str, float]) -> list[Record]:
    return [
        SchedulerGpuCount(cluster="c", time=at, interval_s=60.0, scheduler="slurm",
                          source="slurmctld_metrics", scope=scope,
                          name=None if scope == "cluster" else name, gpus_allocated=gpus)
        for scope, named in by_scope.items()
        for name, gpus in named.items()
    ]  # fmt: skip


def estate() -> list[Record]:
    at = T0 + timedelta(minutes=30)
    return [
        *job("1", 2, ("gpu", "ml", "alice"), 0, None),
        *job("2", 4, ("big", "cv", "bob"), 5, 50),
        *job("3", 1, ("gpu", "ml", "alice"), 0, 20),
        *job("4", 8, ("big", "cv", "bob"), 40, None),
        # an earlier poll that disagreed everywhere: only the latest counts
        *counts(T0 + timedelta(minutes=29), cluster={"": 60.0}, partition={"gpu": 9.0}),
        *counts(at, cluster={"": 7.0}, partition={"gpu": 2.0, "big": 5.0},
                account={"ml": 2.0, "cv": 5.0}, user={"alice": 2.0, "bob": 5.0},
                node={"n1": 7.0}),
    ]  # fmt: skip


def test_drift_is_gpugaps_count_less_the_schedulers_at_its_latest_poll(
    clickhouse: ClickHouseSettings,
) -> None:
    rows = estate()
    store(clickhouse, rows)
    store(clickhouse, rows[-8:])  # a re-delivered poll changes nothing
    got = query(
        clickhouse,
        "SELECT scope, name, toString(time), scheduler_gpus, gpugap_gpus, drift_gpus "
        "FROM v_scheduler_drift WHERE cluster = 'c' ORDER BY scope, name",
    )
    at = "2026-11-02 10:30:00.000"
    assert got == [
        ("account", "cv", at, 5.0, 4.0, -1.0),
        ("account", "ml", at, 2.0, 2.0, 0.0),
        ("cluster", "", at, 7.0, 6.0, -1.0),
        ("partition", "big", at, 5.0, 4.0, -1.0),
        ("partition", "gpu", at, 2.0, 2.0, 0.0),
        ("user", "alice", at, 2.0, 2.0, 0.0),
        ("user", "bob", at, 5.0, 4.0, -1.0),
    ]
    drift = {
        (s["scope"], s["name"]): v
        for name, s, v in metric_samples(clickhouse, "gpugap_scheduler_gpu_drift")
    }
    assert drift[("partition", "big")] == -1.0 and drift[("account", "ml")] == 0.0
    report = _report(clickhouse)
    assert [(d.scope, d.name, d.drift_gpus) for d in report.scheduler_drift] == [
        ("account", "cv", -1.0), ("cluster", "(all)", -1.0), ("partition", "big", -1.0),
        ("user", "bob", -1.0),
    ]  # fmt: skip
    text = render(report, "table")
    assert "c partition big: gpugap counts 1 GPUs fewer than the scheduler (4 vs 5" in text


def _report(settings: ClickHouseSettings) -> Report:
    client = connect(settings)
    try:
        return build_report(client, T0, T0 + timedelta(hours=1))
    finally:
        client.close()


def test_agreement_prints_nothing(clickhouse: ClickHouseSettings) -> None:
    at = T0 + timedelta(minutes=30)
    store(clickhouse, [*job("1", 2, ("gpu", "ml", "alice"), 0, None),
                       *counts(at, cluster={"": 2.0}, partition={"gpu": 2.0})])  # fmt: skip
    report = _report(clickhouse)
    assert report.scheduler_drift == []
    assert "Checked against the scheduler" not in render(report, "table")
