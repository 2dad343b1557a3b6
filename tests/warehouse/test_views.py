"""The warehouse views against hand-computed answers (records written through the sink)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import pytest

from gpugap.groundfloor.settings import ClickHouseSettings
from gpugap.schemas import Alert, AlertDelivery, GpuMinute, NodeGpus, Record, SlurmJobEvent
from gpugap.schemas.examples import gpu_uuid
from gpugap.sinks.clickhouse.sink import ClickHouseSink
from gpugap.warehouse.client import connect
from tests.harness.warehouse import store

T0 = datetime(2026, 11, 2, 10, 0, tzinfo=UTC)
G = [gpu_uuid("n1", i) for i in range(4)]


def job(job_id: str, kind: str, gpus: int, end_min: int | None, limit_s: int) -> SlurmJobEvent:
    end = T0 + timedelta(minutes=end_min) if end_min is not None else None
    return SlurmJobEvent(
        event_id=f"slurm/c/{job_id}/{kind}",
        kind=kind,
        time=end or T0,
        source="hook",
        cluster="c",
        job_id=job_id,
        user="alice",
        account="vision",
        partition="gpu",
        nodes=(NodeGpus(node="n1", gpu_indices=tuple(range(gpus))),),
        gpus_total=gpus,
        time_limit_s=limit_s,
        start_time=T0,
        end_time=end,
        state="COMPLETED" if end else "RUNNING",
        exit_code=0 if end else None,
    )


def minute(gpu: int, m: int, alloc: str | None, consumed: float) -> GpuMinute:
    return GpuMinute(
        cluster="c",
        node="n1",
        gpu_uuid=G[gpu],
        minute=T0 + timedelta(minutes=m),
        allocated_s=60.0 if alloc else 0.0,
        unallocated_s=0.0 if alloc else 60.0,
        consumed_gpu_s=consumed,
        activity_avg=consumed / 60,
        activity_max=consumed / 60,
        activity_metric="sm_active",
        sample_count=6,
        no_samples=False,
        allocation_id=alloc,
        scheduler="slurm" if alloc else None,
        workload_class="batch" if alloc else None,
        owner="alice" if alloc else None,
        team="vision" if alloc else None,
    )


def alert(alert_id: str, state: str, minutes: int) -> Alert:
    return Alert(
        alert_id=alert_id,
        kind="idle_gpu",
        state=state,
        time=T0 + timedelta(minutes=minutes),
        opened_at=T0,
        cluster="c",
        scheduler="slurm",
        allocation_id="slurm/c/2",
        gpus=(G[3],),
        idle_minutes=minutes,
        idle_gpu_hours=minutes / 60,
    )


def records() -> list[Record]:
    out: list[Record] = [
        job("1", "start", 2, None, 28_800),
        job("1", "end", 2, 120, 28_800),
        job("1", "end", 2, 120, 28_800),  # duplicate from the poller
        job("2", "start", 1, None, 3_600),
    ]
    for m in range(120):
        out += [
            minute(0, m, "slurm/c/1", 30.0),
            minute(1, m, "slurm/c/1", 0.0),
            minute(2, m, None, 6.0 if m < 10 else 0.0),
            minute(3, m, "slurm/c/2", 0.5),
        ]
    out += [
        alert("a1", "open", 10),
        alert("a1", "resolved", 20),
        alert("a2", "open", 30),
        alert("a2", "update", 40),
    ]
    return out


def test_views_answer_the_capacity_questions(clickhouse: ClickHouseSettings) -> None:
    async def store() -> None:
        sink = ClickHouseSink(clickhouse)
        await sink.start()
        await sink.write(records())
        await sink.write(records()[:50])  # re-delivered: must change nothing
        await sink.close()

    asyncio.run(store())
    c = connect(clickhouse)
    try:

        def q(sql: str) -> list[tuple[object, ...]]:
            return [tuple(r) for r in c.query(sql).result_rows]

        gap = q(
            "SELECT allocation_id, allocated_gpu_h, consumed_gpu_h, gap_gpu_h, idle_gpu_h "
            "FROM v_capacity_gap_daily ORDER BY allocation_id"
        )
        assert gap == [
            ("slurm/c/1", 4.0, 1.0, 3.0, 2.0),
            ("slurm/c/2", 2.0, pytest.approx(1 / 60), pytest.approx(2 - 1 / 60), 2.0),
        ]
        hourly = q("SELECT sum(allocated_gpu_h), sum(gap_gpu_h) FROM v_capacity_gap")
        assert hourly == [(6.0, pytest.approx(3 + 2 - 1 / 60))]
        top = q("SELECT allocation_id, gap_gpu_h FROM v_top_waste")
        assert [t[0] for t in top] == ["slurm/c/1", "slurm/c/2"]  # by absolute gap
        meta = q(
            "SELECT allocation_id, final_state, gpus_requested FROM v_allocations "
            "WHERE allocation_id IN (SELECT allocation_id FROM v_top_waste LIMIT 10) "
            "ORDER BY allocation_id"
        )
        assert meta == [("slurm/c/1", "COMPLETED", 2), ("slurm/c/2", None, 1)]
        assert q("SELECT sum(unallocated_gpu_h), sum(unattributed_gpu_h) FROM v_unallocated") == [
            (2.0, pytest.approx(60 / 3600))
        ]
        assert q("SELECT node, unattributed_gpu_h FROM v_unattributed") == [
            ("n1", pytest.approx(60 / 3600))
        ]
        pad = q(
            "SELECT allocation_id, user, account, limit_ratio, padding_gpu_h FROM v_slurm_padding"
        )
        assert pad == [("slurm/c/1", "alice", "vision", 4.0, 12.0)]  # 2 GPUs x (8 h - 2 h)
        idle = q("SELECT allocation_id, gpus, last_minute FROM v_idle_now")
        assert idle == [("slurm/c/2", 1, (T0 + timedelta(minutes=119)).replace(tzinfo=None))]
        assert q("SELECT alert_id, state, idle_gpu_hours FROM v_alerts_open") == [
            ("a2", "update", pytest.approx(40 / 60))
        ]
        assert q("SELECT count() FROM gpu_minutes FINAL") == [(480,)]
    finally:
        c.close()


def test_a_resolve_at_the_same_time_as_the_update_before_it_reads_back_resolved(
    clickhouse: ClickHouseSettings,
) -> None:
    """The merged alert's RESOLVED record can carry the UPDATE's time: the views break the tie
    by the state's order (argMax on time alone answered either, filtered and unfiltered)."""
    ids = [f"tie{i}" for i in range(12)]
    batches: list[list[Record]] = [[], []]
    for i, aid in enumerate(ids):
        kind = "partial_gang" if i % 2 else "idle_gpu"
        rows = [
            Alert.model_validate({**alert(aid, state, m).model_dump(), "kind": kind})
            for state, m in (("open", 10), ("update", 20), ("resolved", 20))
        ]
        # the resolve lands in its own part, before or after the update's
        batches[0] += rows[:2] if i % 3 else [rows[0], rows[2]]
        batches[1] += [rows[2]] if i % 3 else [rows[1]]

    async def store() -> None:
        sink = ClickHouseSink(clickhouse)
        await sink.start()
        for batch in batches:
            await sink.write(batch)
        await sink.close()

    asyncio.run(store())
    c = connect(clickhouse)
    try:
        every = dict(c.query("SELECT alert_id, state FROM v_alerts").result_rows)
        assert {aid: every[aid] for aid in ids} == dict.fromkeys(ids, "resolved")
        for aid in ids:
            one = c.query(
                "SELECT state FROM v_alerts WHERE alert_id = {a:String}", parameters={"a": aid}
            ).result_rows
            assert one == [("resolved",)], aid
        assert c.query("SELECT count() FROM v_alerts_open").result_rows == [(0,)]
        assert c.query("SELECT count() FROM v_partial_gangs_now").result_rows == [(0,)]
    finally:
        c.close()


def test_the_idle_policy_the_sink_writes_is_the_one_rollups_and_v_idle_now_use(
    clickhouse: ClickHouseSettings,
) -> None:
    """Before, the rollup and v_idle_now said 0.05 in their SQL whatever the stream used."""

    store(
        clickhouse,
        records(),
        idle_policy={"": (0.05, 10), "batch": (0.6, 5), "service": (0.05, 10)},
    )
    c = connect(clickhouse)
    try:
        idle = c.query(
            "SELECT allocation_id, idle_minutes, idle_threshold FROM v_idle_now ORDER BY 1"
        ).result_rows
        # slurm/c/1: one GPU at 50 %, one at 0 %: idle under batch's 0.6, not under 0.05;
        # each says the window and threshold it was judged by (its class's here)
        assert idle == [("slurm/c/1", 5, 0.6), ("slurm/c/2", 5, 0.6)]
        gap = c.query(
            "SELECT allocation_id, idle_gpu_h FROM v_capacity_gap_daily ORDER BY allocation_id"
        ).result_rows
        assert gap == [("slurm/c/1", 4.0), ("slurm/c/2", 2.0)]
    finally:
        c.close()


def test_rollups_and_v_idle_now_judge_by_the_policy_stamped_on_each_minute(
    clickhouse: ClickHouseSettings,
) -> None:
    """GPUGAP_IDLE_RULES: the stream stamps each minute with the threshold it judged by; the
    warehouse uses that, not the class's (batch: 0.05 here): slurm/c/1 under a rule's 0.6 is
    idle on both GPUs, slurm/c/2 (activity 0.008) under a rule's 0.001 on none."""
    stamp = {"slurm/c/1": (0.6, 5), "slurm/c/2": (0.001, 10)}
    rows = [
        r.model_copy(
            update={"idle_threshold": stamp[r.allocation_id][0],
                    "idle_after_minutes": stamp[r.allocation_id][1]}
        )
        if isinstance(r, GpuMinute) and r.allocation_id
        else r
        for r in records()
    ]  # fmt: skip

    store(clickhouse, rows)
    c = connect(clickhouse)
    try:
        idle = c.query(
            "SELECT allocation_id, idle_minutes, idle_threshold FROM v_idle_now ORDER BY 1"
        ).result_rows
        assert idle == [("slurm/c/1", 5, 0.6)]  # the rule's window and threshold
        gap = c.query(
            "SELECT allocation_id, idle_gpu_h FROM v_capacity_gap_daily ORDER BY allocation_id"
        ).result_rows
        assert gap == [("slurm/c/1", 4.0), ("slurm/c/2", 0.0)]
        stored = c.query(
            "SELECT DISTINCT allocation_id, idle_threshold_bp, idle_after_minutes FROM gpu_minutes"
            " ORDER BY 1"
        ).result_rows
        assert stored == [("", 0, 0), ("slurm/c/1", 6000, 5), ("slurm/c/2", 10, 10)]
    finally:
        c.close()


def test_an_idle_minute_counts_only_when_the_allocation_held_it_whole(
    clickhouse: ClickHouseSettings,
) -> None:
    """A pod bound at 10:00:03 holds 57 s of minute 10:00: allocated, measured and consumed
    as they were, but not an idle minute (the alerts and docs/architecture.md count whole
    minutes); 10:01 and 10:02, held whole and as idle, are. The rollup once gave 10:00 60 idle
    seconds."""
    bound = minute(0, 0, "slurm/c/9", 0.0).model_copy(update={"allocated_s": 57.0})
    rows = [bound, minute(0, 1, "slurm/c/9", 0.0), minute(0, 2, "slurm/c/9", 0.6)]

    store(clickhouse, rows)
    c = connect(clickhouse)
    try:
        got = c.query(
            "SELECT sum(allocated_s), sum(idle_minutes), sum(idle_s) FROM gpu_hours FINAL "
            "WHERE allocation_id = 'slurm/c/9'"
        ).result_rows
        assert got == [(177.0, 2, 120.0)]
        gap = c.query(
            "SELECT idle_gpu_h FROM v_capacity_gap_daily WHERE allocation_id = 'slurm/c/9'"
        ).result_rows
        assert gap == [(pytest.approx(2 / 60),)]
    finally:
        c.close()


def test_deliveries_are_the_audit_trail_per_alert_and_target(
    clickhouse: ClickHouseSettings,
) -> None:
    """alerts.deliveries.v1 -> alert_deliveries; v_alert_deliveries says when each target was
    told of the open and the resolve, and what a refusing target answered. A re-delivered
    record (the same row twice) counts once."""
    opened, resolved = alert("d1", "open", 10), alert("d1", "resolved", 30)

    def sent(a: Alert, target: str, outcome: str, m: int, code: int, *, detail: str = "") -> Record:
        return AlertDelivery(
            alert_id=a.alert_id,
            state=a.state,
            target=target,
            outcome=outcome,
            code=code,
            time=T0 + timedelta(minutes=m, seconds=2),
            detail=detail,
            alert=a,
        )

    rows = [
        sent(opened, "slack", "delivered", 10, 200),
        sent(opened, "slack", "delivered", 10, 200),  # Kafka delivered it again
        sent(resolved, "slack", "delivered", 30, 200),
        sent(opened, "email", "refused", 10, 550, detail="mailbox unavailable"),
    ]

    store(clickhouse, rows)
    c = connect(clickhouse)
    try:
        got = c.query(
            "SELECT target, open_delivered_at, resolve_delivered_at, refused, last_outcome,"
            " last_code, last_detail, allocation_id FROM v_alert_deliveries"
            " WHERE alert_id = 'd1' ORDER BY target"
        ).result_rows
        epoch = datetime(1970, 1, 1, tzinfo=UTC)
        assert [(r[0], r[3], r[4], r[5], r[6], r[7]) for r in got] == [
            ("email", 1, "refused", 550, "mailbox unavailable", "slurm/c/2"),
            ("slack", 0, "delivered", 200, "", "slurm/c/2"),
        ]
        email, slack = got
        assert slack[1].replace(tzinfo=UTC) == T0 + timedelta(minutes=10, seconds=2)
        assert slack[2].replace(tzinfo=UTC) == T0 + timedelta(minutes=30, seconds=2)
        assert email[1].replace(tzinfo=UTC) == epoch  # never delivered: minIf's default
        count = c.query("SELECT count() FROM alert_deliveries FINAL WHERE alert_id = 'd1'")
        assert count.result_rows == [(3,)]
    finally:
        c.close()
