"""The ``--time`` rule: a Slurm job family's limit from its completed jobs' elapsed times.
One rule for the recommender (gpugap.recommend.batch) and the queue replay
(gpugap.queue.cost), which right-sizes the limits the way the recommendation would."""

from __future__ import annotations

import math
from collections.abc import Sequence

from gpugap.stats import quantile

#: --time: this quantile of the completed jobs' elapsed times, plus the margin, rounded up
TIME_QUANTILE = 0.95
TIME_MARGIN = 0.20  # jobstats / Job Defense Shield: needed time + 20 %
TIME_GRANULE_S = 900
#: a new limit must cut the current one by at least this much to be worth a change
TIME_MIN_CUT = 0.25
#: completed jobs a family needs before the rule says anything
MIN_JOBS = 3


def right_sized_limit(
    elapsed_s: Sequence[float],
    limit_s: Sequence[float],
    timeouts: int,
    *,
    min_jobs: int = MIN_JOBS,
) -> int | None:
    """p95 elapsed + 20 %, rounded up to 15 minutes; None where the rule leaves the limit
    alone (a TIMEOUT in the window, fewer than ``min_jobs`` completed jobs, a cut under a
    quarter). ``gpugap job`` asks it of one job (min_jobs=1) where its family is too small."""
    if timeouts or not elapsed_s or len(elapsed_s) < min_jobs:
        return None
    q = quantile(elapsed_s, TIME_QUANTILE)
    new = max(TIME_GRANULE_S, math.ceil(q * (1 + TIME_MARGIN) / TIME_GRANULE_S) * TIME_GRANULE_S)
    return None if new > (1 - TIME_MIN_CUT) * max(limit_s) else new
