"""slurmctld's own GPU gauges -> SchedulerGpuCount, on pages recorded from a real Slurm 26.05.3
(tests/fixtures/slurm/metrics/README.md: one job of 2 GPUs on n2)."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from gpugap.producers.slurm.metrics import PAGES, gpu_counts
from gpugap.producers.slurm.parse import ParseError

PAGES_DIR = Path(__file__).parents[2] / "fixtures" / "slurm" / "metrics"
T = datetime(2026, 12, 7, 8, 25, tzinfo=UTC)


def recorded() -> list[str]:
    return [(PAGES_DIR / f"{page}.txt").read_text() for page in PAGES]


def test_recorded_pages_become_one_count_per_scope_and_name() -> None:
    counts = gpu_counts(recorded(), cluster="c", time=T, interval_s=60.0)
    got = {(c.scope.value, c.name): (c.gpus_allocated, c.gpus_total) for c in counts}
    assert got == {
        ("cluster", None): (2.0, None),
        ("partition", "gpu"): (2.0, 8.0),
        ("account", "ml-team"): (2.0, None),
        ("user", "root"): (2.0, None),
        ("node", "n2"): (2.0, 4.0),
        ("node", "vm"): (0.0, 4.0),
    }
    assert {c.source for c in counts} == {"slurmctld_metrics"}


@pytest.mark.parametrize(
    ("page", "reason"),
    [
        ('slurm_partition_jobs_gpus_alloc{partition=""} 2\n', "without its partition label"),
        ("slurm_jobs_gpus_alloc -1\n", "= -1.0"),
        ("slurm_jobs_gpus_alloc two\n", "not the text format"),
    ],
)
def test_a_page_that_cannot_be_read_says_why(page: str, reason: str) -> None:
    with pytest.raises(ParseError, match=reason):
        gpu_counts([page], cluster="c", time=T, interval_s=60.0)


def test_an_older_slurm_without_gpu_gauges_gives_nothing_to_compare() -> None:
    pages = ["slurm_jobs_running 3\n", 'slurm_partition_jobs{partition="gpu"} 1\n']
    assert gpu_counts(pages, cluster="c", time=T, interval_s=60.0) == []
