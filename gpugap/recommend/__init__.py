"""``gpugap recommend``: changes for a person to review, from the warehouse's history.

- the recommenders, pure functions from rows to Recommendation records: ``batch`` (Slurm
  --time per job family, GPU count), ``interactive`` (idle culling for notebooks),
  ``services`` (replicas by hour of day), ``fit`` (MIG / shared GPUs), ``placement``
  (partial-gang batch on Kubernetes -> Slurm, variable services on Slurm -> Kubernetes);
  ``base``: what they share (the confidence rule, deterministic ids, targets);
- ``queries``, ``usage_queries``: the SQL that fetches those rows;
- ``engine``: compute, store, decisions (the append-only audit table), the follow-up;
- ``cli``: the command.

gpugap never changes a scheduler: an accepted recommendation prints what a person applies.
For other parts (the demo)::

    from gpugap.recommend import recommend_for
    window, recs = recommend_for(settings.clickhouse, store=True)
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gpugap.recommend.base import Window
    from groundfloor.settings import ClickHouseSettings
    from schemas.models import Recommendation

__all__ = ["recommend_for"]


def recommend_for(
    settings: ClickHouseSettings,
    days: float = 14.0,
    until: datetime | None = None,
    *,
    store: bool = True,
) -> tuple[Window, list[Recommendation]]:
    """Connect, compute (and store) the recommendations, close."""
    from gpugap.recommend import engine
    from sinks.clickhouse.warehouse import connect

    client = connect(settings)
    try:
        w, recs = engine.compute(client, days=days, until=until)
        if store:
            engine.store(client, recs)
        return w, recs
    finally:
        client.close()
