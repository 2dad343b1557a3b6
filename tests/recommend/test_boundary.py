"""A placement weighs its own egress: the data it would send across the boundary, at the
move's rate, against the compute it saves at the source cluster's rate (docs/cost.md)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from gpugap.recommend.base import HistoryWindow
from gpugap.recommend.boundary import GIB, Boundary, movement, with_movement
from gpugap.recommend.placement import PartialGang, placement
from gpugap.schemas.models import Recommendation, RecommendationTarget

NOW = datetime(2026, 11, 30, tzinfo=UTC)
WEEK = HistoryWindow(NOW - timedelta(days=7), NOW, 7.0)
TARGET = RecommendationTarget(
    kind="k8s_workload", scheduler="kubernetes", cluster="k8s", namespace="ml",
    owner_kind="PyTorchJob", owner_name="trainer",
)  # fmt: skip


def gang_move() -> Recommendation:
    """15 GPU-hours a week in partial gangs: a move from k8s (cloud) to Slurm (onprem)."""
    gangs = [PartialGang(TARGET, "ml/trainer", f"a{i}", 3.0, 4, 2, 2) for i in range(5)]
    rec = placement(TARGET, gangs, WEEK, NOW)
    assert rec is not None and rec.saved_gpu_hours_per_week == pytest.approx(15.0)
    return rec


def boundary(gib_a_week: dict[str, float], per_gib: float | None) -> Boundary:
    """The workload's transfers in the week, per direction; k8s at 4.0 an hour (cloud),
    hpc (onprem) the busiest Slurm cluster; ``per_gib`` the cloud->onprem egress rate."""
    flows = {d: [g * GIB, 0.0, 0.0] for d, g in gib_a_week.items()}
    rates = {} if per_gib is None else {("k8s", "cloud", "onprem"): per_gib}
    return Boundary(
        by_alloc={"k8s/pod-1": flows}, by_team={}, allocs={TARGET: {"k8s/pod-1"}}, teams={},
        clusters={"k8s": {"env": "cloud", "rate": 4.0}, "hpc": {"env": "onprem", "rate": 1.0}},
        busiest={"slurm": "hpc"}, rates=rates, currency="USD",
    )  # fmt: skip


@pytest.mark.parametrize(
    ("traffic", "per_gib", "egress", "net", "pays"),
    [
        # saved 15 GPU-h x 4.0 = 60/week; 500 GiB at 0.09 = 45: the move pays 15
        ({"cloud->onprem": 500.0}, 0.09, 45.0, 15.0, True),
        # 1,000 GiB, half of it the other way: it follows the workload all the same, 90 > 60
        ({"cloud->onprem": 500.0, "onprem->cloud": 500.0}, 0.09, 90.0, -30.0, False),
    ],
)
def test_a_move_weighs_its_own_egress_against_its_saving(
    traffic: dict[str, float], per_gib: float, egress: float, net: float, pays: bool
) -> None:
    rec = gang_move()
    m = movement(rec, WEEK, boundary(traffic, per_gib))
    assert (m.src_env, m.dst_env, m.move_per_gib) == ("cloud", "onprem", per_gib)
    assert m.move_gib_per_week == pytest.approx(sum(traffic.values()))
    assert m.move_cost_per_week == pytest.approx(egress)
    assert m.saved_cost_per_week == pytest.approx(60.0)
    assert m.net_per_week == pytest.approx(net) and m.pays is pays
    out = with_movement(rec, m)
    f = out.evidence.figures
    assert f["move_egress_cost_per_week"] == pytest.approx(egress)
    assert f["net_saved_cost_per_week"] == pytest.approx(net)
    # the move's own direction, volume, rate, egress, saving and net, in that order
    said = out.rationale
    assert f"crosses cloud->onprem at {per_gib:g} USD/GiB: {sum(traffic.values()):,.1f} GiB" in said
    assert f"{egress:,.2f} USD/week of egress" in said
    assert "worth 60.00 USD/week at k8s's rate" in said and f"net {net:,.2f} USD/week" in said
    assert said.startswith("Not worth moving: ") is (not pays)


def test_a_move_that_cannot_be_weighed_is_still_proposed_and_says_so() -> None:
    rec = gang_move()
    unmeasured = movement(rec, WEEK, boundary({}, 0.09))  # no transfers recorded
    assert unmeasured.move_gib_per_week is None and unmeasured.net_per_week is None
    assert unmeasured.pays and "not measured" in with_movement(rec, unmeasured).rationale
    unrated = movement(rec, WEEK, boundary({"cloud->onprem": 5000.0}, None))  # no rate
    assert unrated.move_cost_per_week is None and unrated.pays
    assert "at no known rate" in with_movement(rec, unrated).rationale


def test_a_move_that_does_not_pay_is_left_out_of_the_recommendations_and_their_total(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from gpugap.recommend import boundary as boundary_module

    rec = gang_move()
    costly = boundary({"cloud->onprem": 1000.0}, 0.09)  # 90/week of egress, 60 saved
    monkeypatch.setattr(boundary_module, "read", lambda client, w: costly)
    not_worth: list[Recommendation] = []
    kept = boundary_module.annotate(object(), WEEK, [rec], not_worth)
    assert kept == [] and [r.id for r in not_worth] == [rec.id]
    assert not_worth[0].evidence.figures["net_saved_cost_per_week"] == pytest.approx(-30.0)
    cheap = boundary({"cloud->onprem": 100.0}, 0.09)
    monkeypatch.setattr(boundary_module, "read", lambda client, w: cheap)
    assert [r.id for r in boundary_module.annotate(object(), WEEK, [rec], [])] == [rec.id]
