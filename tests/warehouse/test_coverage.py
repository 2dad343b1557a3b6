"""Coverage by the second, end to end against hand-computed figures: 57 s scrapes, one lost
sample, a job bound mid-minute. The stream's rows, the hourly rollup, the views and the report
agree to the second; the seconds the lost sample would have covered are unmeasured, never zero
use (docs/architecture.md#coverage-by-the-second)."""

from __future__ import annotations

from datetime import timedelta

import pytest

from gpugap.groundfloor.settings import ClickHouseSettings
from gpugap.report.build import build_report
from gpugap.schemas import GpuMinute, Record
from gpugap.streams.core import CoreConfig, NodeCore, Output
from gpugap.streams.detect_idle import IdleConfig
from gpugap.warehouse.client import connect
from gpugap.web.params import filters
from gpugap.web.queries import buckets, timeseries
from tests.streams.helpers import CLUSTER, T, sample, slurm
from tests.warehouse.test_views import store

ACTIVITY = 0.08  # above the 0.05 idle threshold everywhere it is measured
LOST = T("10:04:45")
JOB = f"slurm/{CLUSTER}/7"
# samples every 57 s from 10:00:00 (interval 57 s): the one at 10:04:45 is lost, so
# (10:03:48, 10:04:45] is covered by nothing; the job holds GPU 0 over [10:01:03, 10:09:30)
HELD, UNMEASURED = 507.0, 57.0
# per minute of the job: (allocated, measured) seconds
PER_MINUTE = {
    "10:01": (57.0, 57.0),  # bound at 10:01:03
    "10:02": (60.0, 60.0),
    "10:03": (60.0, 48.0),  # covered to 10:03:48
    "10:04": (60.0, 15.0),  # from 10:04:45, by the sample at 10:05:42
    "10:05": (60.0, 60.0),
    "10:06": (60.0, 60.0),
    "10:07": (60.0, 60.0),
    "10:08": (60.0, 60.0),
    "10:09": (30.0, 30.0),  # ended at 10:09:30
}


def stream() -> Output:
    core = NodeCore.new(CLUSTER, "n1", CoreConfig(idle=IdleConfig(minutes=1)))
    out = Output()
    t, events = T("10:00:00"), [("start", "10:01:03"), ("end", "10:09:30")]
    while t <= T("10:13:00"):
        if events and t >= T(events[0][1]):  # each event as it happens
            kind, hms = events.pop(0)
            out.extend(core.allocation(slurm("7", kind, hms, (0,))))
        if t != LOST:
            out.extend(core.sample(sample(t.strftime("%H:%M:%S"), {0: ACTIVITY}, interval=57.0)))
        t += timedelta(seconds=57)
    out.extend(core.advance(T("10:20:00")))
    assert not out.refused
    return out


def job_rows(out: Output) -> list[GpuMinute]:
    return [m for m in out.minutes if m.allocation_id == JOB]


def test_the_stream_counts_coverage_by_the_second() -> None:
    out = stream()
    rows = job_rows(out)
    got = {m.minute.strftime("%H:%M"): (m.allocated_s, round(m.measured, 9)) for m in rows}
    assert got == PER_MINUTE
    for m in rows:  # consumption over the measured seconds only: the activity, exactly
        assert m.consumed_gpu_s == pytest.approx(ACTIVITY * m.measured)
        assert m.activity_avg == pytest.approx(ACTIVITY)
        assert not m.no_samples
    # 10:04 has 15 s at 0.08 and 45 s nobody measured: not an idle minute, and no alert (a
    # minute-grain count read 1.2 GPU-s over 60 s, 0.02: idle)
    assert out.alerts == []


def test_rollups_views_and_report_agree_to_the_second(clickhouse: ClickHouseSettings) -> None:
    out = stream()
    records: list[Record] = [*out.minutes]
    store(clickhouse, records)
    measured = HELD - UNMEASURED
    consumed = ACTIVITY * measured
    c = connect(clickhouse)
    try:
        hours = c.query(
            "SELECT sum(allocated_s), sum(unmeasured_s), sum(consumed_gpu_s), "
            "sum(idle_minutes) FROM gpu_hours FINAL WHERE allocation_id = {a:String}",
            parameters={"a": JOB},
        ).result_rows
        assert hours == [pytest.approx((HELD, UNMEASURED, consumed, 0))]
        for view in ("v_capacity_gap", "v_capacity_gap_daily", "v_cost_hourly"):
            got = c.query(
                f"SELECT sum(allocated_gpu_h), sum(measured_gpu_h), sum(gap_gpu_h), "
                f"sum(unmeasured_gpu_h) FROM {view} WHERE allocation_id = {{a:String}}",
                parameters={"a": JOB},
            ).result_rows
            want = (HELD / 3600, measured / 3600, (measured - consumed) / 3600, UNMEASURED / 3600)
            assert got == [pytest.approx(want)], view
        grains = c.query(
            "SELECT DISTINCT coverage_grain FROM gpu_minutes WHERE allocation_id = {a:String}",
            parameters={"a": JOB},
        ).result_rows
        assert grains == [("second",)]
        report = build_report(c, T("10:00:00"), T("11:00:00"), by="allocation")
        # the page's per-minute chart (an hour's range: minute buckets) sums to the same
        f = filters({"from": [str(int(T("10:00:00").timestamp()))],
                     "to": [str(int(T("11:00:00").timestamp()))]}, T("11:00:00"))  # fmt: skip
        assert buckets(f).grain == "minute"
        q = timeseries(f)
        chart = c.query(q.sql, parameters=q.params).named_results()
        sums = [0.0, 0.0, 0.0]
        for r in chart:
            sums = [sums[0] + r["allocated"], sums[1] + r["gap"], sums[2] + r["unmeasured"]]
        assert sums == pytest.approx([HELD / 3600, (measured - consumed) / 3600, UNMEASURED / 3600])
    finally:
        c.close()
    (row,) = [g for g in report.breakdown if g.key == JOB]
    in_report = pytest.approx  # the report prints GPU-hours to 4 decimals
    assert row.allocated_gpu_h == in_report(HELD / 3600, abs=5e-5)
    assert row.unmeasured_gpu_h == in_report(UNMEASURED / 3600, abs=5e-5)
    assert row.gap_gpu_h == in_report((measured - consumed) / 3600, abs=5e-5)
    assert row.idle_gpu_h == 0


def test_rows_from_before_keep_their_minute_grain(clickhouse: ClickHouseSettings) -> None:
    """A record without measured_s (a worker from before) is measured whole unless it had no
    samples, as then, and says so: coverage_grain 'minute'."""
    old = job_rows(stream())[3].model_copy(update={"measured_s": None})  # 10:04
    assert old.measured == 60.0
    store(clickhouse, [old])
    c = connect(clickhouse)
    try:
        got = c.query("SELECT measured_ms, coverage_grain FROM gpu_minutes FINAL").result_rows
        hours = c.query("SELECT unmeasured_s, idle_minutes FROM gpu_hours FINAL").result_rows
    finally:
        c.close()
    assert got == [(60_000, "minute")]
    assert hours == [(0.0, 1)]  # 1.2 GPU-s over a whole measured minute: idle, as it was
