"""Idle-GPU alerts from the core: open, update, resolve, against hand-computed episodes."""

from __future__ import annotations

import json

from gpugap.schemas.models import Alert
from gpugap.schemas.types import AlertState, WorkloadClass
from gpugap.streams.core import CoreConfig, NodeCore, Output
from gpugap.streams.detect_idle import IdleConfig
from tests.streams.helpers import CLUSTER, NODE, T, gpu, sample, slurm


def by_minute(acts: dict[int, list[float]], first: str = "10:00") -> list:
    """Samples every 10 s; acts[gpu][k] is the activity during minute k after ``first``."""
    h, m = (int(x) for x in first.split(":"))
    out = []
    n = len(next(iter(acts.values())))
    for k in range(n):
        for s in range(10, 61, 10):
            mm, ss = m + k + s // 60, s % 60
            out.append(sample(f"{h:02d}:{mm:02d}:{ss:02d}", {g: a[k] for g, a in acts.items()}))
    return out


CFG = CoreConfig(idle=IdleConfig(minutes=3))
# GPU 0 idle 10:01-10:05 (4 min), GPU 1 below 0.05 10:04-10:07 (3 min): one episode
ACTS = {
    0: [0.5, 0.0, 0.0, 0.0, 0.0, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5],
    1: [0.5, 0.5, 0.5, 0.5, 0.01, 0.01, 0.01, 0.5, 0.5, 0.5, 0.5, 0.5],
}
AID = f"idle_gpu/slurm/{CLUSTER}/1/{NODE}/2026-11-02T10:01:00.000Z"


def run(core: NodeCore, items: list) -> Output:
    out = Output()
    for it in items:
        out.extend(core.allocation(it) if hasattr(it, "event_id") else core.sample(it))
    return out


def summary(alerts: list[Alert]) -> list[tuple]:
    return [
        (
            a.alert_id,
            a.state,
            a.time.strftime("%H:%M"),
            a.opened_at.strftime("%H:%M"),
            a.resolved_at.strftime("%H:%M") if a.resolved_at else None,
            a.gpus,
            a.idle_minutes,
            round(a.idle_gpu_hours * 3600),
        )
        for a in alerts
    ]


EXPECTED = [
    (AID, AlertState.OPEN, "10:04", "10:04", None, (gpu(0),), 3, 180),
    (AID, AlertState.UPDATE, "10:07", "10:04", None, (gpu(0), gpu(1)), 6, 420),
    (AID, AlertState.RESOLVED, "10:08", "10:04", "10:07", (gpu(0), gpu(1)), 6, 420),
]


def items() -> list:
    return [slurm("1", "start", "10:00:00", (0, 1)), *by_minute(ACTS)]


def test_overlapping_runs_on_one_allocation_are_one_alert() -> None:
    core = NodeCore.new(CLUSTER, NODE, CFG)
    out = run(core, items())
    out.extend(core.advance(T("10:12:00")))
    assert summary(out.alerts) == EXPECTED
    a = out.alerts[0]
    assert (a.owner, a.team, a.workload_class, a.scheduler, a.nodes) == (
        "alice",
        "vision",
        WorkloadClass.BATCH,
        "slurm",
        (NODE,),
    )


def test_a_restart_from_saved_state_never_opens_the_alert_twice() -> None:
    core = NodeCore.new(CLUSTER, NODE, CFG)
    its = items()
    cut = 40  # after the alert opened (10:04 closes once samples reach 10:06)
    first = run(core, its[:cut])
    assert [a.state for a in first.alerts] == [AlertState.OPEN]
    restored = NodeCore(json.loads(json.dumps(core.state)), CFG)
    rest = run(restored, its[cut:])
    rest.extend(restored.advance(T("10:12:00")))
    assert summary(first.alerts + rest.alerts) == EXPECTED


def test_short_runs_partial_minutes_and_unknown_minutes_raise_nothing() -> None:
    core = NodeCore.new(CLUSTER, NODE, CFG)
    acts = {0: [0.0, 0.0, 0.5, 0.0, 0.0, 0.5, 0.0, 0.0, 0.0, 0.0]}
    # runs of 2 minutes; the 4-minute run from 10:06 is cut by the end at 10:08:30
    its = [slurm("1", "start", "10:00:00"), *by_minute(acts), slurm("1", "end", "10:08:30")]
    out = run(core, sorted(its, key=lambda r: r.time))
    out.extend(core.advance(T("10:14:00")))
    assert out.alerts == []


def test_threshold_and_minutes_per_class() -> None:
    cfg = CoreConfig(
        idle=IdleConfig(
            minutes=3, per_class_threshold={"interactive": 0.2}, per_class_minutes={"batch": 30}
        )
    )
    acts = {0: [0.1] * 6}
    for cls, opens in ((WorkloadClass.INTERACTIVE, True), (WorkloadClass.BATCH, False)):
        core = NodeCore.new(CLUSTER, NODE, cfg)
        out = run(core, [slurm("1", "start", "10:00:00", cls=cls), *by_minute(acts)])
        assert [a.state for a in out.alerts][:1] == ([AlertState.OPEN] if opens else [])


def test_episodes_of_one_allocation_on_two_nodes_are_one_alert() -> None:
    from gpugap.streams.process import Processor

    p = Processor(CFG)
    out = []
    for node in ("n1", "n2"):
        out += p.handle(slurm("1", "start", "10:00:00", (0,), node=node)).alerts
    # n1 idle 10:01-10:05, n2 idle 10:03-10:06: one episode 10:01-10:06, 4 + 3 idle minutes
    a1 = [0.5, 0.0, 0.0, 0.0, 0.0, 0.5, 0.5, 0.5, 0.5, 0.5]
    a2 = [0.5, 0.5, 0.5, 0.0, 0.0, 0.0, 0.5, 0.5, 0.5, 0.5]
    s1, s2 = by_minute({0: a1}), by_minute({0: a2})
    for x, y in zip(s1, s2, strict=True):
        out += p.handle(x).alerts
        out += p.handle(y.model_copy(update={"node": "n2"})).alerts
    out += p.advance(120_000).alerts
    aid = f"idle_gpu/slurm/{CLUSTER}/1/2026-11-02T10:01:00.000Z"
    assert {a.alert_id for a in out} == {aid}
    assert out[0].state is AlertState.OPEN
    last = out[-1]
    assert last.state is AlertState.RESOLVED
    assert last.nodes == ("n1", "n2")
    assert last.resolved_at == T("10:06:00")
    assert round(last.idle_gpu_hours * 3600) == (4 + 3) * 60


def test_alerts_are_judged_after_the_alert_lateness_minutes_after_the_full_lateness() -> None:
    # the idle run reaches 3 minutes at 10:04; with 30 s of alert lateness the alert opens
    # with the sample at 10:04:30, while the 10:03 minute rows wait for 10:06:00 (120 s)
    core = NodeCore.new(CLUSTER, NODE, CFG)
    opened_by = closed_by = None
    for it in items():
        out = core.allocation(it) if hasattr(it, "event_id") else core.sample(it)
        if opened_by is None and any(a.state is AlertState.OPEN for a in out.alerts):
            opened_by = it.time.strftime("%H:%M:%S")
        if closed_by is None and any(m.minute == T("10:03:00") for m in out.minutes):
            closed_by = it.time.strftime("%H:%M:%S")
    assert (opened_by, closed_by) == ("10:04:30", "10:06:00")
    # with the alert lateness equal to the lateness, alerts wait as long as the minutes
    slow = NodeCore.new(CLUSTER, NODE, CoreConfig(idle=CFG.idle, alert_lateness_ms=120_000))
    first = None
    for it in items():
        out = slow.allocation(it) if hasattr(it, "event_id") else slow.sample(it)
        if first is None and out.alerts:
            first = it.time.strftime("%H:%M:%S")
    assert first == "10:06:00"


def test_the_alert_lateness_cannot_exceed_the_lateness() -> None:
    import pytest

    with pytest.raises(ValueError, match="alert lateness"):
        CoreConfig(lateness_ms=60_000, alert_lateness_ms=90_000)


def test_open_minutes_counts_seen_minutes_not_closed_and_none_after_a_flush() -> None:
    from gpugap.streams.process import Processor

    p = Processor(CoreConfig())  # 120 s lateness
    p.handle(slurm("1", "start", "10:00:00", (0,)))
    for s in by_minute({0: [0.5] * 6}):  # samples 10:00:10 .. 10:06:00
        p.handle(s)
    # watermark 10:04:00: 10:04 and 10:05 are seen and not closed (10:06 has only begun)
    assert p.open_minutes() == 2
    p.advance(120_000)  # the worker's idle flush: every minute seen closes
    assert p.open_minutes() == 0


def test_the_workers_idle_policy_comes_from_the_idle_settings_and_its_flags() -> None:
    from gpugap.groundfloor.settings import IdleSettings
    from gpugap.streams.cli import idle_config

    idle = IdleSettings(class_thresholds={"interactive": 0.2}, class_minutes={"batch": 30})
    cfg = idle_config(idle)
    assert cfg.for_class("interactive") == (0.2, 10)
    assert cfg.for_class("batch") == (0.05, 30)
    assert cfg.for_class(None) == (0.05, 10)
    flagged = idle_config(idle, threshold=0.1, minutes=3)
    assert flagged.for_class("service") == (0.1, 3)
    assert flagged.for_class("interactive") == (0.2, 3)
    assert idle.policy()["interactive"] == (0.2, 10)


def test_exempt_allocations_open_no_alert_and_short_sessions_only_while_short() -> None:
    """GPUGAP_IDLE_EXEMPT: a matching allocation's idle GPUs open nothing; one exempt while
    younger than N minutes opens its alert once it is older, with the whole run counted."""
    from gpugap.streams.detect_idle import Exemption

    def alerts(*exempt: Exemption) -> list[tuple]:
        cfg = CoreConfig(idle=IdleConfig(minutes=3, exempt=exempt))
        core = NodeCore.new(CLUSTER, NODE, cfg)
        out = run(core, items())
        out.extend(core.advance(T("10:12:00")))
        return summary(out.alerts)

    assert alerts() == EXPECTED
    assert alerts(Exemption(owner="ali*")) == []
    assert alerts(Exemption(owner="ali*", team="vision"), Exemption(namespace="dev-*")) == []
    assert alerts(Exemption(owner="ali*", team="nlp")) == EXPECTED  # every field must match
    assert alerts(Exemption(namespace="dev-*")) == EXPECTED  # a Slurm job has no namespace
    # exempt for its first 5 minutes: the 10:01-10:05 run qualifies at 10:04 but is exempt;
    # at 10:05 (the job is 5 minutes old) it opens, idle since 10:01
    late = alerts(Exemption(workload_class="batch", younger_than_minutes=5))
    assert [(a[1], a[2], a[3], a[6]) for a in late] == [
        (AlertState.OPEN, "10:05", "10:05", 4),
        (AlertState.UPDATE, "10:07", "10:05", 6),
        (AlertState.RESOLVED, "10:08", "10:05", 6),
    ]
