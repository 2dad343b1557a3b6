"""The report's check of gpugap against the scheduler's own count (v_scheduler_drift,
docs/architecture.md#checking-against-the-scheduler): printed only where they disagree."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from gpugap.report.models import DriftRow

DRIFT = (
    "SELECT cluster, scope, name, time, scheduler_gpus, gpugap_gpus, drift_gpus "
    "FROM v_scheduler_drift WHERE drift_gpus != 0 "
    "AND time >= {since:DateTime('UTC')} AND time < {until:DateTime('UTC')} "
    "ORDER BY abs(drift_gpus) DESC, cluster, scope, name LIMIT {top:UInt32}"
)


def scheduler_drift(queries: Any) -> list[DriftRow]:
    return [
        DriftRow(
            cluster=r["cluster"],
            scope=r["scope"],
            name=r["name"] or "(all)",
            time=_utc(r["time"]),
            scheduler_gpus=round(float(r["scheduler_gpus"]), 3),
            gpugap_gpus=round(float(r["gpugap_gpus"]), 3),
            drift_gpus=round(float(r["drift_gpus"]), 3),
        )
        for r in queries.rows("scheduler drift", DRIFT)
    ]


def _utc(value: datetime) -> datetime:
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def text(rows: list[DriftRow]) -> list[str]:
    if not rows:
        return []
    out = ["", "Checked against the scheduler: gpugap and its own count disagree"]
    for r in rows:
        more = "more" if r.drift_gpus > 0 else "fewer"
        out.append(
            f"  {r.cluster} {r.scope} {r.name}: gpugap counts {abs(r.drift_gpus):g} GPUs {more} "
            f"than the scheduler ({r.gpugap_gpus:g} vs {r.scheduler_gpus:g} at "
            f"{r.time:%Y-%m-%d %H:%M} UTC)"
        )
    return [
        *out,
        "  (a start or end gpugap missed: see docs/architecture.md#checking-against-the-scheduler)",
    ]
