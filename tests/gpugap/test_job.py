"""``gpugap job ID`` against hand-computed allocations (tests/gpugap/job_data.py, written
through the real sink); the demo's day: test_job_demo.py."""

from __future__ import annotations

import json
import os
from datetime import timedelta

import pytest

from gpugap.cli import main
from gpugap.groundfloor.settings import ClickHouseSettings
from gpugap.job.models import Ambiguous, JobReport, Unknown
from gpugap.job.report import job_report
from tests.gpugap.job_data import T0, records
from tests.recommend.test_gpu_model import estate as gpu_model_estate
from tests.recommend.test_gpu_model import families as gpu_model_families
from tests.warehouse.test_views import store


@pytest.fixture
def jobs(clickhouse: ClickHouseSettings, monkeypatch: pytest.MonkeyPatch) -> ClickHouseSettings:
    """job_data's allocations in a fresh warehouse, and GPUGAP_CLICKHOUSE_* pointing at it."""
    store(clickhouse, records())
    for key in [k for k in os.environ if k.startswith("GPUGAP_CLICKHOUSE_")]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("GPUGAP_CLICKHOUSE_URL", clickhouse.url)
    monkeypatch.setenv("GPUGAP_CLICKHOUSE_USER", clickhouse.user)
    monkeypatch.setenv("GPUGAP_CLICKHOUSE_DATABASE", clickhouse.database)
    if clickhouse.password is not None:
        monkeypatch.setenv("GPUGAP_CLICKHOUSE_PASSWORD", clickhouse.password.get_secret_value())
    return clickhouse


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["job", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def report(settings: ClickHouseSettings, ident: str, cluster: str | None = None) -> JobReport:
    outcome = job_report(settings, ident, cluster)
    assert isinstance(outcome, JobReport), outcome
    return outcome


def test_a_two_gpu_job_that_used_one(jobs: ClickHouseSettings) -> None:
    r = report(jobs, "1")
    a, f = r.allocation, r.figures
    assert (a.allocation_id, a.cluster, a.job, a.name, a.owner) == (
        "slurm/c/1", "c", "1", "train", "alice",
    )  # fmt: skip
    assert (f.allocated_gpu_h, f.consumed_gpu_h, f.gap_gpu_h, f.idle_gpu_h) == pytest.approx(
        (4.0, 1.8, 2.2, 2.0)
    )
    assert f.gap_pct == pytest.approx(55.0)
    assert [(g.utilisation, g.needed) for g in r.gpus] == [(0.9, True), (0.0, False)]
    assert r.gpus[0].peak_memory_mib == 30_000.0
    assert r.padding is not None and r.padding.padding_gpu_h == pytest.approx(12.0)
    assert r.padding.limit_ratio == pytest.approx(4.0)
    assert r.queue is not None and r.queue.wait_s == 600.0
    assert r.queue.gpu_h_waited == pytest.approx(1 / 3, abs=1e-4) and r.queue.queue == "gpu"
    advice = {x.kind: x for x in r.advice}
    assert set(advice) == {"gpu_count", "time_limit"}  # 90 % busy: no slice holds GPU 0
    assert advice["gpu_count"].say == "ask for 1 GPU"
    assert "#SBATCH --gpus=1" in advice["gpu_count"].apply
    assert advice["gpu_count"].saved_gpu_h == pytest.approx(2.0)
    assert advice["time_limit"].say == "--time=2:30:00"
    assert advice["time_limit"].saved_gpu_h == pytest.approx(11.0)
    # minute by minute: 120 one-minute buckets, GPU 0 at 0.9 throughout, GPU 1 at 0
    assert r.series is not None and (r.series.step_s, r.series.points) == (60, 120)
    assert r.series.start == T0
    assert set(r.series.gpus[0].utilisation) == {0.9} and set(r.series.gpus[1].utilisation) == {0}
    assert set(r.series.gpus[0].memory_mib) == {30_000.0}
    assert r.idle is not None and (r.idle.measured_minutes, r.idle.idle_minutes) == (120, 0)


def test_a_slice_would_do(jobs: ClickHouseSettings) -> None:
    r = report(jobs, "slurm/c/3")
    (share,) = [x for x in r.advice if x.kind == "gpu_share"]
    assert share.say == "a 3g.40gb slice would do"
    assert "--gres=gpu:3g.40gb:1" in share.apply and "assumed" in share.why
    assert share.saved_gpu_h == pytest.approx(4 / 7, abs=1e-4)


def test_a_smaller_model_would_do(clickhouse: ClickHouseSettings) -> None:
    """tests/recommend/test_gpu_model.py's estate: alice's embed job, 24 h on one H100 at 10 %
    in 6,000 MiB, fits an L4 (24 GiB, pool inference; the least memory that holds 1.25 x its
    peak, no rate card) and a 1g.10gb slice; bob's, at 50 %, fits no smaller model."""
    store(clickhouse, gpu_model_estate() + gpu_model_families())
    advice = {x.kind: x for x in report(clickhouse, "slurm/hpc/0").advice}
    model = advice["gpu_model"]
    assert (model.say, model.to_value) == ("an L4 would do", "1 x L4 (inference)")
    assert "#SBATCH --partition=inference" in model.apply and "less memory" in model.why
    assert model.saved_gpu_h == pytest.approx(24.0, abs=1e-3)
    assert advice["gpu_share"].say == "a 1g.10gb slice would do"
    assert "gpu_model" not in {x.kind for x in report(clickhouse, "slurm/hpc/10").advice}


def test_a_notebook_idle_most_of_its_life(jobs: ClickHouseSettings) -> None:
    for ident in ("ml/nb-0", "uid-nb", "nb-0", "k8s/k/uid-nb"):
        r = report(jobs, ident)
        assert (r.allocation.allocation_id, r.allocation.job) == ("k8s/k/uid-nb", "ml/nb-0")
    assert r.idle is not None
    assert (r.idle.measured_minutes, r.idle.idle_minutes, r.idle.stretches) == (240, 210, 3)
    assert [(s.start, s.minutes) for s in r.idle.longest] == [
        (T0 + timedelta(minutes=70), 100), (T0 + timedelta(minutes=180), 60),
        (T0 + timedelta(minutes=10), 50),
    ]  # fmt: skip
    assert r.idle.longest[0].gpu_h == pytest.approx(100 / 60, abs=1e-4)
    (cull,) = [x for x in r.advice if x.kind == "idle_culling"]
    assert (cull.say, cull.to_value) == ("end it after 60 idle minutes", "60")
    assert cull.saved_gpu_h == pytest.approx(40 / 60, abs=1e-4)
    assert r.queue is not None and r.queue.wait_s == 120.0 and r.queue.queue == "ml"
    assert r.padding is None


@pytest.mark.parametrize(
    ("ident", "cluster", "want"),
    [
        ("7", None, ["slurm/c/7#1", "slurm/c/7"]),  # a requeued job's runs, newest first
        ("9", None, ["slurm/c/9_4", "slurm/c/9_3"]),  # an array's tasks
        ("5", None, ["slurm/c/5", "slurm/d/5"]),  # one id on two clusters
    ],
)
def test_an_ambiguous_id_lists_the_candidates(
    jobs: ClickHouseSettings, ident: str, cluster: str | None, want: list[str]
) -> None:
    outcome = job_report(jobs, ident, cluster)
    assert isinstance(outcome, Ambiguous)
    assert [c.allocation_id for c in outcome.candidates] == want
    assert outcome.matches == len(want)


@pytest.mark.parametrize(
    ("ident", "cluster", "want"),
    [
        ("7#1", None, "slurm/c/7#1"),
        ("9_3", None, "slurm/c/9_3"),
        ("5", "d", "slurm/d/5"),
        ("slurm/c/7", None, "slurm/c/7"),
    ],
)
def test_each_form_names_one(
    jobs: ClickHouseSettings, ident: str, cluster: str | None, want: str
) -> None:
    assert report(jobs, ident, cluster).allocation.allocation_id == want


def test_the_command(jobs: ClickHouseSettings, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = cli(capsys, "1")
    assert code == 0 and not err
    assert "gpugap job 1 · cluster c · slurm" in out
    assert "ask for 1 GPU" in out and "#SBATCH --time=2:30:00" in out
    code, out, _ = cli(capsys, "1", "--format", "json")
    doc = json.loads(out)
    assert code == 0 and doc["figures"]["gap_gpu_h"] == pytest.approx(2.2)
    assert JobReport.model_validate(doc).allocation.allocation_id == "slurm/c/1"
    # ambiguous: the candidates, exit 2 (JSON on stdout, text on stderr)
    code, out, err = cli(capsys, "7")
    assert code == 2 and not out and "slurm/c/7#1" in err and "--cluster" in err
    code, out, _ = cli(capsys, "7", "--format", "json")
    assert code == 2 and json.loads(out)["match"] == "ambiguous"
    # unknown: one line, exit 1
    code, out, err = cli(capsys, "424242")
    assert code == 1 and not out
    assert err.count("\n") == 1 and "no allocation matches '424242'" in err
    code, _, err = cli(capsys, "5", "--cluster", "e")
    assert code == 1 and "in cluster 'e'" in err


@pytest.mark.parametrize("bad", ["a b", "x/y/z", "", "ns/"])
def test_a_malformed_id_is_one_line(capsys: pytest.CaptureFixture[str], bad: str) -> None:
    code, out, err = cli(capsys, bad)  # checked before connecting: no warehouse needed
    assert code == 2 and not out
    assert err.count("\n") == 1 and err.startswith("gpugap: error: job id")


def test_unknown_ids(jobs: ClickHouseSettings) -> None:
    for ident in ("ml/nothing", "k8s/k/none", "12"):
        outcome = job_report(jobs, ident)
        assert isinstance(outcome, Unknown) and ident in outcome.message
