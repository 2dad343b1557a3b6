"""``gpugap recommend``: changes for a person to review, from the warehouse's history.

- the recommenders, pure functions from rows to Recommendation records: ``batch`` (Slurm
  --time per job family, GPU count), ``interactive`` (idle culling for notebooks),
  ``services`` (replicas by hour of day), ``fit`` (MIG / shared GPUs), ``placement``
  (partial-gang batch on Kubernetes -> Slurm, variable services on Slurm -> Kubernetes),
  ``model`` (a smaller GPU model the estate has), ``stranding`` (fewer cores or less memory
  per GPU), ``packing`` (multi-node runs on fewer nodes);
  ``base``: what they share (the confidence rule, deterministic ids, targets);
- ``queries``, ``usage_queries``, ``capacity_queries``: the SQL that fetches those rows;
- ``engine``: compute, publish (on ``recommendations.v1``: the ClickHouse sink stores them,
  the only way they reach the warehouse), decisions (the append-only audit table);
- ``followup``: the check after an accepted change;
- ``cli``: the command.

gpugap never changes a scheduler: an accepted recommendation prints what a person applies.
For other parts (the demo)::

    from gpugap.recommend import recommend_for
    window, recs = recommend_for(settings.clickhouse, kafka=settings.kafka)  # published
    window, recs = recommend_for(settings.clickhouse)                        # computed only
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gpugap.groundfloor.settings import ClickHouseSettings, KafkaSettings
    from gpugap.recommend.base import HistoryWindow
    from gpugap.schemas.models import Recommendation

__all__ = ["recommend_for"]


def recommend_for(
    settings: ClickHouseSettings,
    days: float = 14.0,
    until: datetime | None = None,
    *,
    kafka: KafkaSettings | None = None,
    out: str | None = None,
) -> tuple[HistoryWindow, list[Recommendation]]:
    """Connect, compute the recommendations, close; with ``kafka`` publish them on
    ``recommendations.v1`` (its topic prefix included) for the ClickHouse sink to store, or
    with ``out`` write them there as JSON lines. Neither: computed only, nothing stored."""
    from gpugap.recommend import engine
    from gpugap.warehouse.client import connect

    client = connect(settings)
    try:
        w, recs = engine.compute(client, days=days, until=until)
    finally:
        client.close()
    if kafka is not None or out:
        from gpugap.groundfloor.settings import KafkaSettings

        engine.publish(recs, kafka or KafkaSettings(), out)
    return w, recs
