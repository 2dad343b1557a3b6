"""Idle alerts at any scrape interval: 10 s, 30 s, 60 s, irregular scrapes and a lost sample
open and resolve at the same minutes, while other nodes' records move the node's clock on
between its own samples (as the worker's partition clock does)."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest

from gpugap.schemas.models import NodeSample
from gpugap.schemas.types import AlertState
from gpugap.streams.core import CoreConfig, NodeCore, Output
from gpugap.streams.detect_idle import IdleConfig
from tests.streams.helpers import CLUSTER, NODE, T, sample, slurm

BUSY = 0.5
#: GPU 0 idle over [IDLE_FROM, IDLE_TO): whole minutes 10:03..10:13 (11) are idle; 10:02 and
#: 10:14 are three quarters busy. Every schedule below samples at both ends, so each sample's
#: interval is wholly idle or wholly busy and the minutes' activity is exact at any interval.
IDLE_FROM, IDLE_TO = T("10:02:45"), T("10:14:45")
START, END = T("09:59:45"), T("10:25:45")
# 10 minutes: the run reaches them with 10:12 (opened at 10:13:00) and ends with 10:13
WANT = [
    (AlertState.OPEN, "10:13:00", None),
    (AlertState.RESOLVED, "10:13:00", "10:14:00"),
]


def grid(every: int, phase: int = 45) -> list[datetime]:
    first = START.replace(second=phase % 60)
    out, t = [], first
    while t <= END:
        out.append(t)
        t += timedelta(seconds=every)
    return out


def irregular() -> list[datetime]:
    """Gaps of 7 to 60 s in turn, and the two ends of the idle spell."""
    gaps = [7, 23, 60, 41, 13, 36, 52]
    out, t, k = [], START, 0
    while t <= END:
        out.append(t)
        t += timedelta(seconds=gaps[k % len(gaps)])
        k += 1
    return sorted({*out, IDLE_FROM, IDLE_TO})


SCHEDULES = {
    "10s": grid(10, phase=5),
    "30s": grid(30, phase=15),
    "60s": grid(60),
    "60s with a lost sample": [t for t in grid(60) if t != T("10:07:45")],
    "irregular": irregular(),
}


def samples_at(times: list[datetime]) -> list[NodeSample]:
    """Each sample reports its own interval since the one before (60 s for a lost one's
    successor: what it measured); GPU 1 is busy throughout."""
    out, prev = [], times[0] - timedelta(seconds=10)
    for t in times:
        gap = (t - prev).total_seconds()
        if gap > 60:  # after a lost sample the scraper still measured one interval
            gap = 60.0
        idle = IDLE_FROM < t <= IDLE_TO
        out.append(
            sample(t.strftime("%H:%M:%S"), {0: 0.0 if idle else BUSY, 1: BUSY}, interval=gap)
        )
        prev = t
    return out


def feed(times: list[datetime]) -> Output:
    """The node's samples, and between each two the clock of its partition moving on as other
    nodes' records come (55 s past each sample, where that is before the next one)."""
    core = NodeCore.new(CLUSTER, NODE, CoreConfig(idle=IdleConfig(minutes=10)))
    out = Output()
    out.extend(core.allocation(slurm("1", "start", "09:59:00", (0,))))
    items = samples_at(times)
    for s, after in zip(items, [*items[1:], None], strict=True):
        out.extend(core.sample(s))
        nudge = s.time + timedelta(seconds=55)
        if after is not None and nudge < after.time:
            out.extend(core.advance(nudge))
    out.extend(core.advance(END + timedelta(minutes=5)))
    return out


@pytest.mark.parametrize("name", list(SCHEDULES))
def test_idle_alerts_open_and_resolve_at_the_same_minutes_at_any_scrape_interval(
    name: str,
) -> None:
    out = feed(SCHEDULES[name])
    got = [
        (
            a.state,
            a.opened_at.strftime("%H:%M:%S"),
            a.resolved_at.strftime("%H:%M:%S") if a.resolved_at else None,
        )
        for a in out.alerts
        if a.state is not AlertState.UPDATE
    ]
    assert got == WANT, name
    resolved = out.alerts[-1]
    assert resolved.idle_minutes == 11
    # the stored minutes agree: 11 whole idle minutes, each measured
    idle = [
        m.minute.strftime("%H:%M")
        for m in out.minutes
        if m.allocation_id and m.consumed_gpu_s < 0.05 * m.measured and m.allocated_s == 60
    ]
    assert idle == [f"10:{k:02d}" for k in range(3, 14)], name


def test_the_alert_waits_one_observed_interval_bounded_by_the_lateness() -> None:
    cfg = CoreConfig(idle=IdleConfig(minutes=10))
    waits = {}
    for name, every in (("10s", 10), ("60s", 60), ("5min", 300)):
        core = NodeCore.new(CLUSTER, NODE, cfg)
        t = T("10:00:00")
        for _ in range(6):
            core.sample(sample(t.strftime("%H:%M:%S"), {0: BUSY}, interval=float(every)))
            t += timedelta(seconds=every)
        waits[name] = core.alert_wait()
    # the alert lateness (30 s) where samples come sooner, one interval where they come later,
    # never more than the lateness (120 s): a node scraped every 5 minutes is judged on part
    assert waits == {"10s": 30_000, "60s": 60_000, "5min": 120_000}
    # a lost sample lengthens the wait while its gap is among the last four
    core = NodeCore.new(CLUSTER, NODE, cfg)
    for hms in ("10:00:00", "10:01:00", "10:03:00", "10:04:00"):
        core.sample(sample(hms, {0: BUSY}, interval=60.0))
    assert core.alert_wait() == 120_000
    for hms in ("10:05:00", "10:06:00", "10:07:00", "10:08:00"):
        core.sample(sample(hms, {0: BUSY}, interval=60.0))
    assert core.alert_wait() == 60_000
