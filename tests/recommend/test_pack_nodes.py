"""Pack on fewer nodes (packing.py) against hand-computed runs written through the sink.
Three days, T0 to T0 + 72 h (savings x 7/3 a week), on eight-GPU nodes s1..s6:

- erin's ``ddp``: a 6 h run a day of 4 GPUs, one on each of s1..s4, half busy: 24 GPU-hours
  a run; one node of 8 holds them (3 extra): 24 x 3/4 = 18 GPU-hours a run on the extra
  nodes, 54 in all -> --nodes=1 --gpus-per-node=4, 126 GPU-hours a week; confidence
  (3/4 history) x (3 runs / 5) x (no spread) = 0.45;
- frank's ``big``: a 1 h run a day of 16 GPUs on two full nodes (s5, s6): not spread, nothing;
- gina's ``once``: one 4-GPU run over s1..s4: one run is no pattern, nothing.
"""

from __future__ import annotations

from datetime import timedelta

import pytest

from gpugap.groundfloor.settings import ClickHouseSettings
from gpugap.schemas import Record
from tests.recommend.estate import GIB, T0, gpu_minutes, job, polls, recommend
from tests.warehouse.test_views import store

END = T0 + timedelta(hours=72)
SPREAD = {"s1": 1, "s2": 1, "s3": 1, "s4": 1}


def records(*, erin: bool = True) -> list[Record]:
    out: list[Record] = []
    for node in ("s1", "s2", "s3", "s4", "s5", "s6"):
        out += polls("hpc", node, model="H100", memory_per_gpu=80 * GIB, hours=1 / 6)
    for d in range(3):
        day = T0 + timedelta(days=d)
        runs = [(f"{20 + d}", ("frank", "phys", "big"), day + timedelta(hours=10), 1,
                 {"s5": 8, "s6": 8}, 1.0)]  # fmt: skip
        if erin:
            runs.append((f"{10 + d}", ("erin", "nlp", "ddp"), day, 6,
                         SPREAD, 0.5))  # fmt: skip
        if d == 2:
            runs.append(("30", ("gina", "nlp", "once"), day + timedelta(hours=12), 2, SPREAD,
                         0.5))  # fmt: skip
        for job_id, who, start, hours, nodes, busy in runs:
            out += job("hpc", job_id, who, start, hours, nodes)
            out += gpu_minutes("hpc", f"slurm/hpc/{job_id}", who[0], start, hours * 60, nodes,
                               busy)  # fmt: skip
    return out


def test_repeated_spread_runs_are_asked_to_pack(clickhouse: ClickHouseSettings) -> None:
    store(clickhouse, records())
    w, recs = recommend(clickhouse, "pack_nodes", END)
    assert w.history_days == pytest.approx(3.0)
    assert len(recs) == 1  # frank (not spread) and gina (one run): nothing
    r = recs[0]
    assert r.kind == "pack_nodes"
    assert r.id.startswith("pack-")
    assert (r.target.user, r.target.account, r.target.job_name, r.target.partition) == (
        "erin", "nlp", "ddp", "gpu",
    )  # fmt: skip
    assert (r.change.parameter, r.change.from_value, r.change.to_value) == (
        "nodes", "4 GPUs on 4 nodes", "4 GPUs on 1 node (4 per node)",
    )  # fmt: skip
    assert r.saved_gpu_hours_per_week == pytest.approx(54 * 7 / 3)
    assert r.confidence == pytest.approx(round(0.75 * 3 / 5, 3))
    assert r.evidence.samples == 3
    assert r.evidence.gpu_hours == pytest.approx(72.0)
    assert r.evidence.figures["extra_node_gpu_h"] == pytest.approx(54.0)
    assert r.evidence.figures["consumed_gpu_h"] == pytest.approx(36.0)
    assert "#SBATCH --nodes=1\n#SBATCH --gpus-per-node=4" in r.apply
    assert "frees none of their own GPU-hours" in r.rationale


def test_runs_that_fill_their_nodes_or_happen_once_get_nothing(
    clickhouse: ClickHouseSettings,
) -> None:
    store(clickhouse, records(erin=False))
    _, recs = recommend(clickhouse, "pack_nodes", END)
    assert recs == []
