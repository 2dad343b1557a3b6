"""GPUGAP_IDLE_RULES: per cluster, partition, user, labels..., over the class's policy; the
rows and the alerts carry the policy the detector judged by (one source of truth)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from gpugap.schemas.types import AlertState
from gpugap.streams.core import CoreConfig, NodeCore
from gpugap.streams.idle_policy import IdleConfig, Rule
from tests.streams.helpers import CLUSTER, NODE, T, slurm
from tests.streams.test_idle import by_minute, run

# one GPU below 0.05 from 10:00 for 8 minutes, then busy; a second allocation's GPU alike
ACTS = {0: [0.02] * 8 + [0.5] * 4}


def job(partition: str | None = None, qos: str | None = None):  # type: ignore[no-untyped-def]
    ev = slurm("1", "start", "10:00:00", (0,))
    labels = {"slurm.qos": qos} if qos else {}
    return ev.model_copy(update={"partition": partition, "labels": labels})


def judged(cfg: IdleConfig, ev) -> tuple[list, list]:  # type: ignore[no-untyped-def]
    core = NodeCore.new(CLUSTER, NODE, CoreConfig(idle=cfg))
    out = run(core, [ev, *by_minute(ACTS)])
    out.extend(core.advance(T("10:20:00")))
    return out.alerts, out.minutes


def test_a_rule_sets_the_minutes_of_the_allocations_it_matches_the_rest_keep_the_class() -> None:
    cfg = IdleConfig(minutes=6, rules=(Rule(id="debug", partition="debug*", minutes=2),))
    alerts, _ = judged(cfg, job("debug-a100"))
    opened = [a for a in alerts if a.state is AlertState.OPEN]
    assert [a.opened_at.strftime("%H:%M") for a in opened] == ["10:02"]
    assert opened[0].policy is not None
    assert (opened[0].policy.minutes, opened[0].policy.rule) == (2, "debug")
    alerts, _ = judged(cfg, job("batch"))  # no match: the class's 6 minutes
    opened = [a for a in alerts if a.state is AlertState.OPEN]
    assert [a.opened_at.strftime("%H:%M") for a in opened] == ["10:06"]
    assert opened[0].policy is not None and opened[0].policy.rule is None
    alerts, _ = judged(cfg, job(None))  # a job with no partition matches no partition rule
    assert [a.opened_at.strftime("%H:%M") for a in alerts if a.state is AlertState.OPEN] == [
        "10:06"
    ]


def test_a_rule_on_labels_sets_the_threshold_and_the_rows_carry_what_judged_them() -> None:
    """Activity 0.02: idle under 0.05, busy under a rule's 0.01; every allocated row says the
    threshold and minutes the detector used, for the warehouse to judge alike."""
    relaxed = Rule(id="relaxed", labels=(("slurm.qos", "scav*"),), threshold=0.01)
    cfg = IdleConfig(minutes=3, rules=(relaxed,))
    alerts, minutes = judged(cfg, job(qos="scavenger"))
    assert alerts == []
    held = [m for m in minutes if m.allocation_id]
    assert held and {(m.idle_threshold, m.idle_after_minutes) for m in held} == {(0.01, 3)}
    alerts, minutes = judged(cfg, job(qos="normal"))
    assert [a.state for a in alerts][:1] == [AlertState.OPEN]
    assert {m.idle_threshold for m in minutes if m.allocation_id} == {0.05}


def test_the_first_matching_rule_wins_and_what_it_leaves_unset_stays_the_classs() -> None:
    cfg = IdleConfig(
        minutes=5,
        per_class_threshold={"batch": 0.1},
        remind_minutes=(60,),
        rules=(
            Rule(id="a", owner="alice", minutes=2),
            Rule(id="b", team="vision", minutes=4, threshold=0.3, remind_minutes=(30, 90)),
        ),
    )
    alerts, _ = judged(cfg, job())
    p = alerts[0].policy
    assert p is not None and (p.rule, p.minutes, p.threshold, p.remind_minutes) == (
        "a", 2, 0.1, (60,)
    )  # fmt: skip


def test_rules_from_settings_are_checked_and_reach_the_worker(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from gpugap.groundfloor.settings import IdleRule, IdleSettings, load
    from gpugap.schemas.errors import ConfigError
    from gpugap.streams.cli import idle_config

    with pytest.raises(ValidationError, match="apply to every allocation"):
        IdleRule(minutes=3)
    with pytest.raises(ValidationError, match="sets threshold, minutes or remind_minutes"):
        IdleRule(partition="debug")
    monkeypatch.setenv(
        "GPUGAP_IDLE_RULES",
        '[{"partition": "debug", "minutes": 30}, {"labels": {"gpugap.io/idle": "relaxed"},'
        ' "threshold": 0.01, "remind_minutes": [120]}]',
    )
    idle = load().idle
    assert [r.partition for r in idle.rules] == ["debug", None]
    cfg = idle_config(idle)
    assert [(r.id, r.minutes, r.threshold, r.labels) for r in cfg.rules] == [
        ("rules[0]", 30, None, ()),
        ("rules[1]", None, 0.01, (("gpugap.io/idle", "relaxed"),)),
    ]
    monkeypatch.setenv("GPUGAP_IDLE_RULES", '[{"partition": "debug", "minutes": 0}]')
    with pytest.raises(ConfigError, match="GPUGAP_IDLE_RULES_0_MINUTES"):
        load()
    monkeypatch.delenv("GPUGAP_IDLE_RULES")
    assert IdleSettings().rules == []
