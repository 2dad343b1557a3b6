"""The pure rules: confidence, ids, the culling timeout, the quantile."""

from __future__ import annotations

import pytest

from gpugap.recommend import logic
from schemas.models import RecommendationChange


def test_confidence_is_history_times_amount_times_steadiness() -> None:
    c = logic.confidence
    assert c("slurm_time_limit", 10, 1.0, 0.0) == 0.5  # VPA: 1 + 1/days with 1 day
    assert c("slurm_time_limit", 10, 7.0, 0.0) == pytest.approx(0.875)
    assert c("slurm_time_limit", 5, 7.0, 0.0) == pytest.approx(0.4375, abs=1e-3)  # half the jobs
    assert c("slurm_time_limit", 10, 7.0, 1.0) == pytest.approx(0.875 / 2, abs=1e-3)  # cv 1
    assert c("slurm_time_limit", 0, 7.0, 0.0) == 0.0
    grows = [c("gpu_count", 5, d, 0.1) for d in (1, 2, 7, 14, 30)]
    assert grows == sorted(grows) and grows[-1] < 1


def test_the_same_target_and_change_get_the_same_id() -> None:
    t = logic.slurm_target("hpc", "alice", "vision", "train", "gpu")
    ch = RecommendationChange(parameter="time_limit_s", from_value="28800", to_value="9000")
    rid = logic.recommendation_id("slurm_time_limit", t, ch)
    assert rid == logic.recommendation_id("slurm_time_limit", t.model_copy(), ch.model_copy())
    assert rid.startswith("time-") and len(rid) == 17
    other = ch.model_copy(update={"to_value": "9900"})
    assert logic.recommendation_id("slurm_time_limit", t, other) != rid


def test_the_culling_timeout_sits_above_the_pauses() -> None:
    assert logic.culling_minutes([216, 216]) == 30  # no pauses: the floor
    assert logic.culling_minutes([5] * 9 + [40, 300]) == 30  # p90 of the pauses 8.5 -> 30
    assert logic.culling_minutes([35] * 10) == 45  # 35 rounded up to 15 min
    assert logic.culling_minutes([59] * 10) == 60


def test_quantile_interpolates_like_numpy() -> None:
    assert logic.quantile([1, 2, 3, 4], 0.5) == 2.5
    assert logic.quantile([7320.0] * 2 + [7080.0] * 12, 0.95) == 7320.0
    assert logic.hms(9000) == "2:30:00" and logic.hms(30 * 3600) == "30:00:00"


def test_k8s_workload_of_a_replicaset_is_its_deployment() -> None:
    t = logic.k8s_target("k8s", "serving", "ReplicaSet", "llm-chat-7f9c8d", "llm-chat-7f9c8d-x")
    assert (t.owner_kind, t.owner_name) == ("Deployment", "llm-chat")
    assert logic.k8s_target("k8s", "ns", "", "", "solo").owner_name == "solo"
