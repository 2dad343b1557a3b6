"""A smaller GPU model (model.py) against a hand-computed estate written through the sink.

Cluster hpc, two days (T0 to T0 + 48 h, so the window holds 2 days of history and savings
are x 7/2 a week):

- nodes: big1 and big2 (H100, 80 GiB, partition gpu), l4n1 (L4, 24 GiB, partition
  inference), a40n1 (A100-40GB, 40 GiB, partition a100), a2n1 (A2, 7 GiB, partition tiny);
- alice's ``embed``: two 24 h jobs on one H100 GPU, 10 % busy in 6,000 MiB: 48 GPU-hours.
  It needs 6,000 x 1.25 = 7,500 MiB: the A2 (7,168) is too small by the margin, the L4 and
  the A100-40GB hold it; without a rate card the least memory wins: the L4. Saved 48 x 7/2 =
  168 GPU-hours a week; confidence (2/3 history) x (2 GPU-days / 7) x (no spread) = 0.19;
- bob's ``train``: the same, 50 % busy: nothing;
- carol's ``big``: 10 % busy in 30,000 MiB: nothing (over 10 GiB);
- dave's ``short``: 10 % busy, 6,000 MiB, 12 GPU-hours: nothing (under 24).
"""

from __future__ import annotations

from datetime import timedelta

import pytest

from gpugap.groundfloor.ratecard import validate_card, write_rate_card
from gpugap.groundfloor.settings import ClickHouseSettings
from gpugap.schemas import Record
from gpugap.schemas.examples import gpu_uuid
from gpugap.warehouse.client import connect
from tests.recommend.estate import GIB, T0, gpu_minutes, job, polls, recommend
from tests.warehouse.test_views import store

END = T0 + timedelta(hours=48)
H100, L4, A100, A2 = 80 * GIB, 24 * GIB, 40 * GIB, 7 * GIB


def estate(*, smaller: bool = True) -> list[Record]:
    out: list[Record] = []
    nodes = [("big1", "H100", H100, "gpu"), ("big2", "H100", H100, "gpu")]
    if smaller:
        nodes += [("l4n1", "L4", L4, "inference"), ("a40n1", "A100-40GB", A100, "a100"),
                  ("a2n1", "A2", A2, "tiny")]  # fmt: skip
    else:  # only a bigger model beside the H100s
        nodes += [("h200n1", "H200", 141 * GIB, "h200")]
    for node, model, memory, pool in nodes:
        out += polls("hpc", node, model=model, memory_per_gpu=memory, pool=pool, hours=1.0)
    return out


def families() -> list[Record]:
    out: list[Record] = []
    cases = [  # (user, name, node, activity, memory, hours per job)
        ("alice", "embed", "big1", 0.10, 6000.0, 24),
        ("bob", "train", "big2", 0.50, 6000.0, 24),
        ("carol", "big", "big1", 0.10, 30000.0, 24),
        ("dave", "short", "big2", 0.10, 6000.0, 6),
    ]
    for n, (user, name, node, activity, memory, hours) in enumerate(cases):
        for d in range(2):
            job_id = f"{10 * n + d}"
            start = T0 + timedelta(hours=24 * d)
            out += job("hpc", job_id, (user, "acct", name), start, hours, {node: 1})
            # one GPU each: alice and carol on big1, bob and dave on big2 (GPU n of it)
            for m in gpu_minutes("hpc", f"slurm/hpc/{job_id}", user, start, hours * 60,
                                 {node: 1}, activity, memory):  # fmt: skip
                out.append(m.model_copy(update={"gpu_uuid": gpu_uuid(node, n)}))
    return out


@pytest.fixture
def stored(clickhouse: ClickHouseSettings) -> ClickHouseSettings:
    store(clickhouse, estate() + families())
    return clickhouse


def test_a_nearly_idle_small_family_moves_to_the_smallest_model_that_holds_it(
    stored: ClickHouseSettings,
) -> None:
    w, recs = recommend(stored, "gpu_model", END)
    assert w.history_days == pytest.approx(2.0)
    assert len(recs) == 1  # bob (50 %), carol (30,000 MiB), dave (12 GPU-hours): nothing
    r = recs[0]
    assert r.kind == "gpu_model"
    assert r.id.startswith("model-")
    assert (r.target.scheduler.value, r.target.cluster, r.target.user, r.target.account,
            r.target.job_name, r.target.partition) == ("slurm", "hpc", "alice", "acct",
                                                       "embed", "gpu")  # fmt: skip
    assert (r.change.parameter, r.change.from_value, r.change.to_value) == (
        "gpu_model", "1 x H100", "1 x L4 (inference)",
    )  # fmt: skip
    assert r.saved_gpu_hours_per_week == pytest.approx(48 * 7 / 2)
    assert r.confidence == pytest.approx(round((2 / 3) * (2 / 7), 3))
    assert r.evidence.samples == 2
    assert r.evidence.allocations == 2
    assert r.evidence.gpu_hours == pytest.approx(48.0)
    assert r.evidence.figures["utilisation"] == pytest.approx(0.1)
    assert r.evidence.figures["peak_memory_mib"] == 6000.0
    assert r.evidence.figures["to_memory_mib"] == L4
    assert "saved_cost_per_week" not in r.evidence.figures
    assert "#SBATCH --partition=inference\n#SBATCH --gres=gpu:L4:1" in r.apply
    assert "less memory" in r.rationale


def test_the_rate_card_decides_what_is_smaller_and_prices_the_move(
    stored: ClickHouseSettings,
) -> None:
    # the A100-40GB priced below the L4: the rate, not the memory, picks it
    card = {
        "name": "t", "currency": "USD",
        "clusters": {"hpc": {
            "environment": "cloud",
            "nodes": [{"pattern": "big*", "gpu_model": "H100"},
                      {"pattern": "l4n*", "gpu_model": "L4"},
                      {"pattern": "a40n*", "gpu_model": "A100-40GB"},
                      {"pattern": "a2n*", "gpu_model": "A2"}],
            "cloud": {"H100": {"on_demand": 4.0}, "L4": {"on_demand": 2.0},
                      "A100-40GB": {"on_demand": 1.5}, "A2": {"on_demand": 0.5}},
        }},
    }  # fmt: skip
    client = connect(stored)
    try:
        write_rate_card(client, validate_card(card, "t"), "t")
    finally:
        client.close()
    _, recs = recommend(stored, "gpu_model", END)
    assert [(r.target.user, r.change.to_value) for r in recs] == [("alice", "1 x A100-40GB (a100)")]
    r = recs[0]
    assert r.saved_gpu_hours_per_week == pytest.approx(168.0)
    assert r.evidence.figures["from_rate"] == 4.0
    assert r.evidence.figures["to_rate"] == 1.5
    # 48 GPU-hours x (4.0 - 1.5) over 2/7 of a week
    assert r.evidence.figures["saved_cost_per_week"] == pytest.approx(420.0)
    assert "the rate decides what is smaller" in r.rationale
    assert "420.00 USD a week less" in r.rationale


def test_no_smaller_model_in_the_estate_no_recommendation(
    clickhouse: ClickHouseSettings,
) -> None:
    # only H100s and an H200 (more memory): alice would fit a MIG slice, which is fit.py's
    store(clickhouse, estate(smaller=False) + families())
    _, recs = recommend(clickhouse, "gpu_model", END)
    assert recs == []
