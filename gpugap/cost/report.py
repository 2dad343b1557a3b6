"""The report's cost section (``gpugap report --cost``), built (``render.py`` shows it):
currency, energy and CO2 per workload class and cluster beside the GPU-hours, egress beside
compute, boundary transfers, and the rate card it used, all read from the views of migrations
008 and later (as a BI tool would).

A figure that a missing rate makes unknown is ``None`` ("no rate"), never 0; ``unrated_gpu_h``
says how many GPU-hours had no rate.
"""

# ruff: noqa: S608  (the SQL is assembled from this module's constants only; values are bound)
from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from gpugap.report import sections
from gpugap.report.queries import window_parameters
from gpugap.warehouse.client import run_query

NO_RATE = "no rate"
WIDTH = 100
_T = "DateTime('UTC')"


def _guarded(expr: str, alias: str) -> str:
    """A sum that is NULL when any of its rows is NULL (no rate): a partial sum reads as whole."""
    return f"if(countIf(({expr}) IS NULL) > 0, NULL, sum({expr})) AS {alias}"


_COMMON = ", ".join(
    [
        "multiIf(countIf(c.rate_status != 'rated') = 0, 'rated', countIf(c.rate_status = "
        "'rated') = 0, any(c.rate_status), 'partly rated') AS rate_status",
        "sum(c.allocated_gpu_h) AS allocated_gpu_h",
        "sum(c.consumed_gpu_h) AS consumed_gpu_h",
        "sum(c.gap_gpu_h) AS gap_gpu_h",
        "sum(c.unmetered_gpu_h) AS unmetered_gpu_h",
        _guarded("c.allocated_cost", "allocated_cost"),
        _guarded("c.consumed_cost", "consumed_cost"),
        _guarded("c.gap_cost", "gap_cost"),
        _guarded("c.gap_co2_kg", "gap_co2_kg"),
    ]
)
_HOURS = f"c.hour >= {{since:{_T}}} AND c.hour < {{until:{_T}}}"
_TIMES = f"t.time >= {{since:{_T}}} AND t.time < {{until:{_T}}}"
BY_CLASS = (
    f"SELECT c.workload_class AS key, {_COMMON}, "
    "sumIf(c.allocated_gpu_h, c.rate_status != 'rated') AS unrated_gpu_h, "
    f"{_guarded('c.allocated_kwh', 'energy_kwh')}, {_guarded('c.allocated_co2_kg', 'co2_kg')} "
    f"FROM v_cost_hourly AS c WHERE {_HOURS} AND c.allocation_id != '' "
    "GROUP BY key ORDER BY key"
)


def by_cluster_sql(narrow: str = "") -> str:
    """Per cluster (alias ``c`` on v_cost_hourly), ``narrow``: more conditions ("AND ...")."""
    return (
        "SELECT c.cluster AS key, anyIf(c.environment, c.environment != '') AS environment, "
        f"{_COMMON}, sum(c.unallocated_gpu_h) AS unallocated_gpu_h, "
        "sumIf(c.allocated_gpu_h + c.unallocated_gpu_h, c.rate_status != 'rated') "
        "AS unrated_gpu_h, "
        f"{_guarded('c.unallocated_cost', 'unallocated_cost')}, "
        f"{_guarded('c.allocated_kwh + c.unallocated_kwh', 'energy_kwh')}, "
        f"{_guarded('c.allocated_co2_kg + c.unallocated_co2_kg', 'co2_kg')} "
        f"FROM v_cost_hourly AS c WHERE {_HOURS} {narrow} GROUP BY key ORDER BY key"
    )


def transfers_sql(narrow: str = "") -> str:
    """Per cluster and direction (alias ``t`` on v_transfers), ``narrow`` as above."""
    return (
        "SELECT t.cluster AS cluster, t.from_env AS from_env, t.to_env AS to_env, "
        "count() AS transfers, sum(t.gib) AS gib, multiIf(countIf(NOT t.rated) = 0, 'rated', "
        "countIf(t.rated) = 0, 'no rate', 'partly rated') AS rate_status, "
        f"{_guarded('t.cost', 'cost')}, {_guarded('t.billed_cost', 'billed_cost')}, "
        "arraySort(groupUniqArray(t.source)) AS sources "
        f"FROM v_transfers AS t WHERE {_TIMES} {narrow} "
        "GROUP BY cluster, from_env, to_env ORDER BY cluster, from_env, to_env"
    )


BY_CLUSTER = by_cluster_sql()
TRANSFERS = transfers_sql()
TRANSFER_TEAMS = (
    f"SELECT t.team AS team, sum(t.gib) AS gib, {_guarded('t.cost', 'cost')} "
    f"FROM v_transfers AS t WHERE {_TIMES} GROUP BY team "
    "ORDER BY gib DESC, team LIMIT {top:UInt32}"
)
CARD = "SELECT * FROM v_rate_card_info"
#: the egress rates of the card in the warehouse (the one v_transfers prices with)
EGRESS_RATES = (
    "SELECT cluster, from_env, to_env, per_gib FROM transfer_rate "
    "WHERE updated_at = (SELECT max(updated_at) FROM rate_card) "
    "ORDER BY cluster, from_env, to_env"
)
RULES = (
    "SELECT cluster, priority, node_pattern, gpu_model, environment, pricing, gpu_hour_rate, "
    "kwh_price, pue, emission_g_per_kwh, mig_share FROM v_rate_card ORDER BY cluster, priority"
)


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class CostRow(_Model):
    key: str = Field(description="the class or cluster ('all' for the totals)")
    environment: str | None = Field(default=None, description="clusters: cloud or onprem")
    rate_status: str = Field(description="rated, partly rated, no rate, no MIG share")
    allocated_gpu_h: float
    consumed_gpu_h: float
    gap_gpu_h: float
    unallocated_gpu_h: float | None = Field(default=None, description="clusters only")
    unrated_gpu_h: float = Field(description="GPU-hours no rate applies to")
    unmetered_gpu_h: float = Field(description="GPU-hours without a power reading")
    allocated_cost: float | None = Field(description="null: no rate for some of it")
    consumed_cost: float | None
    gap_cost: float | None
    unallocated_cost: float | None = None
    egress_gib: float | None = Field(
        default=None, description="clusters and totals: GiB moved across the boundary"
    )
    egress_cost: float | None = Field(
        default=None, description="clusters and totals: that egress at the card's rates"
    )
    total_cost: float | None = Field(
        default=None,
        description="clusters and totals: allocated + unallocated GPU-hours + egress",
    )
    energy_kwh: float | None = Field(description="measured at the GPUs (before PUE)")
    co2_kg: float | None = Field(description="energy x PUE x the emission factor")
    gap_co2_kg: float | None


class RateRule(_Model):
    cluster: str
    priority: int
    node_pattern: str
    gpu_model: str
    environment: str
    pricing: str
    gpu_hour_rate: float = Field(description="currency per GPU-hour before power")
    kwh_price: float
    pue: float
    emission_g_per_kwh: float | None
    mig_share: float | None


class EgressRate(_Model):
    cluster: str
    from_env: str
    to_env: str
    per_gib: float = Field(description="currency per GiB across the boundary")


class RateCardUsed(_Model):
    card_id: str
    name: str
    source: str
    currency: str
    loaded_at: datetime
    clusters: list[str]
    rules: list[RateRule]
    egress: list[EgressRate] = Field(default_factory=list)


class TransferRow(_Model):
    cluster: str
    from_env: str
    to_env: str
    transfers: int
    gib: float
    rate_status: str
    cost: float | None
    billed_cost: float | None = Field(description="what the bill said, where it says")
    sources: list[str] = Field(
        default_factory=list,
        description="what recorded them (billing_csv, node_exporter...): two on one link count "
        "the same bytes twice (docs/cost.md)",
    )


class TeamTransfer(_Model):
    team: str
    gib: float
    cost: float | None


class CostReport(_Model):
    """What the GPU-hours cost, in the rate card's currency, energy and CO2."""

    rate_card: RateCardUsed | None = Field(description="null: no rate card in the warehouse")
    currency: str | None
    by_class: list[CostRow]
    by_cluster: list[CostRow]
    totals: CostRow
    transfers: list[TransferRow]
    transfers_by_team: list[TeamTransfer]


def _r(v: Any, digits: int = 4) -> float | None:
    return None if v is None else round(float(v), digits)


def _row(r: dict[str, Any]) -> CostRow:
    return CostRow(
        key=str(r["key"]),
        environment=r.get("environment"),
        rate_status=r["rate_status"],
        allocated_gpu_h=_r(r["allocated_gpu_h"]) or 0.0,
        consumed_gpu_h=_r(r["consumed_gpu_h"]) or 0.0,
        gap_gpu_h=_r(r["gap_gpu_h"]) or 0.0,
        unallocated_gpu_h=_r(r.get("unallocated_gpu_h")),
        unrated_gpu_h=_r(r["unrated_gpu_h"]) or 0.0,
        unmetered_gpu_h=_r(r["unmetered_gpu_h"]) or 0.0,
        allocated_cost=_r(r["allocated_cost"]),
        consumed_cost=_r(r["consumed_cost"]),
        gap_cost=_r(r["gap_cost"]),
        unallocated_cost=_r(r.get("unallocated_cost")),
        energy_kwh=_r(r["energy_kwh"]),
        co2_kg=_r(r["co2_kg"]),
        gap_co2_kg=_r(r["gap_co2_kg"]),
    )


def _total(rows: list[CostRow]) -> CostRow:
    def add(field: str) -> float | None:
        return _sum_known([getattr(r, field) for r in rows])

    statuses = {r.rate_status for r in rows}
    status = statuses.pop() if len(statuses) == 1 else "partly rated"
    return CostRow(
        key="all",
        rate_status=status if rows else "rated",
        **{
            f: add(f) or 0.0
            for f in ("allocated_gpu_h", "consumed_gpu_h", "gap_gpu_h", "unrated_gpu_h")
        },
        unmetered_gpu_h=add("unmetered_gpu_h") or 0.0,
        unallocated_gpu_h=add("unallocated_gpu_h"),
        **{
            f: add(f)
            for f in (
                "allocated_cost",
                "consumed_cost",
                "gap_cost",
                "unallocated_cost",
                "energy_kwh",
                "co2_kg",
                "gap_co2_kg",
            )
        },
    )


def _moved_data_only(cluster: str) -> CostRow:
    """A cluster with transfers and no GPU-hours in the window (a bill's own cluster)."""
    zero = dict.fromkeys(
        ("allocated_gpu_h", "consumed_gpu_h", "gap_gpu_h", "unallocated_gpu_h",
         "unrated_gpu_h", "unmetered_gpu_h", "allocated_cost", "consumed_cost", "gap_cost",
         "unallocated_cost", "energy_kwh", "co2_kg", "gap_co2_kg"),
        0.0,
    )  # fmt: skip
    return CostRow(key=cluster, rate_status="no GPUs", **zero)


def _sum_known(values: list[float | None]) -> float | None:
    """The sum, or None ("no rate") when any part is unknown: a partial sum reads as whole."""
    known = [v for v in values if v is not None]
    return None if len(known) < len(values) else round(sum(known), 4)


def _with_egress(rows: list[CostRow], transfers: list[TransferRow]) -> list[CostRow]:
    """Each cluster's egress beside its compute, and its total; a cluster that only moved
    data (no GPU-hours in the window) gets a row of its own, so the totals hold all of it."""
    moved: dict[str, list[TransferRow]] = {}
    for t in transfers:
        moved.setdefault(t.cluster, []).append(t)
    known = {r.key for r in rows}
    rows = rows + [_moved_data_only(c) for c in sorted(set(moved) - known)]
    out = []
    for r in rows:
        own = moved.get(r.key, [])
        egress_cost = _sum_known([t.cost for t in own])
        total = _sum_known([r.allocated_cost, r.unallocated_cost, egress_cost])
        egress = {"egress_gib": round(sum(t.gib for t in own), 4), "egress_cost": egress_cost}
        out.append(r.model_copy(update={**egress, "total_cost": total}))
    return out


def by_cluster_with_egress(
    cluster_rows: list[dict[str, Any]], transfer_rows: list[dict[str, Any]]
) -> tuple[list[CostRow], CostRow, list[TransferRow]]:
    """The rows of ``by_cluster_sql`` and ``transfers_sql`` as the report shows them: per
    cluster with its egress and total, the ``all`` row, the transfers (the web page's too)."""
    transfers = [
        TransferRow(**{**r, "gib": _r(r["gib"]), "cost": _r(r["cost"])}) for r in transfer_rows
    ]
    by_cluster = _with_egress([_row(r) for r in cluster_rows], transfers)
    totals = _total(by_cluster).model_copy(
        update={
            "egress_gib": round(sum(r.egress_gib or 0.0 for r in by_cluster), 4),
            "egress_cost": _sum_known([r.egress_cost for r in by_cluster]),
            "total_cost": _sum_known([r.total_cost for r in by_cluster]),
        }
    )
    return by_cluster, totals, transfers


def _aware(t: datetime | None) -> datetime | None:
    if t is None:
        return None
    return t.replace(tzinfo=UTC) if t.tzinfo is None else t.astimezone(UTC)


def build_cost(
    client: Any, since: datetime | None = None, until: datetime | None = None, top: int = 10
) -> CostReport:
    """The cost section for [since, until) (hours, as the report's window) from a client."""
    p = window_parameters(_aware(since), _aware(until))
    params = {"since": p["since"], "until": p["until"], "top": top}

    def rows(sql: str) -> list[dict[str, Any]]:
        return list(run_query(client, sql, params).named_results())

    info = rows(CARD)[0]
    card = None
    if info["card_id"]:
        card = RateCardUsed(
            card_id=info["card_id"],
            name=info["card_name"],
            source=info["source"],
            currency=info["currency"],
            loaded_at=_aware(info["loaded_at"]) or datetime.now(UTC),
            clusters=sorted(info["clusters"]),
            rules=[RateRule(**r) for r in rows(RULES)],
            egress=[EgressRate(**r) for r in rows(EGRESS_RATES)],
        )
    by_cluster, totals, transfers = by_cluster_with_egress(rows(BY_CLUSTER), rows(TRANSFERS))
    return CostReport(
        rate_card=card,
        currency=card.currency if card else None,
        by_class=[_row({**r, "environment": None}) for r in rows(BY_CLASS)],
        by_cluster=by_cluster,
        totals=totals,
        transfers=transfers,
        transfers_by_team=[
            TeamTransfer(team=r["team"], gib=_r(r["gib"]) or 0.0, cost=_r(r["cost"]))
            for r in rows(TRANSFER_TEAMS)
        ],
    )


def extend_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """The report's JSON Schema with the ``cost`` member ``--cost`` adds."""
    return sections.extend_schema(schema, "cost", CostReport)
