"""The report's cost section (``gpugap report --cost``): currency, energy and CO2 per workload
class and cluster beside the GPU-hours, boundary transfers, and the rate card it used, all
read from the views of migration 008 (as a BI tool would).

A figure that a missing rate makes unknown is ``None`` ("no rate"), never 0; ``unrated_gpu_h``
says how many GPU-hours had no rate.
"""

# ruff: noqa: S608  (the SQL is assembled from this module's constants only; values are bound)
from __future__ import annotations

import csv
import io
from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from gpugap.report.queries import window_parameters
from gpugap.report.table import Col, cut, table
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
BY_CLUSTER = (
    "SELECT c.cluster AS key, anyIf(c.environment, c.environment != '') AS environment, "
    f"{_COMMON}, sum(c.unallocated_gpu_h) AS unallocated_gpu_h, "
    "sumIf(c.allocated_gpu_h + c.unallocated_gpu_h, c.rate_status != 'rated') AS unrated_gpu_h, "
    f"{_guarded('c.unallocated_cost', 'unallocated_cost')}, "
    f"{_guarded('c.allocated_kwh + c.unallocated_kwh', 'energy_kwh')}, "
    f"{_guarded('c.allocated_co2_kg + c.unallocated_co2_kg', 'co2_kg')} "
    f"FROM v_cost_hourly AS c WHERE {_HOURS} GROUP BY key ORDER BY key"
)
TRANSFERS = (
    "SELECT t.cluster AS cluster, t.from_env AS from_env, t.to_env AS to_env, "
    "count() AS transfers, sum(t.gib) AS gib, multiIf(countIf(NOT t.rated) = 0, 'rated', "
    "countIf(t.rated) = 0, 'no rate', 'partly rated') AS rate_status, "
    f"{_guarded('t.cost', 'cost')}, {_guarded('t.billed_cost', 'billed_cost')} "
    f"FROM v_transfers AS t WHERE {_TIMES} "
    "GROUP BY cluster, from_env, to_env ORDER BY cluster, from_env, to_env"
)
TRANSFER_TEAMS = (
    f"SELECT t.team AS team, sum(t.gib) AS gib, {_guarded('t.cost', 'cost')} "
    f"FROM v_transfers AS t WHERE {_TIMES} GROUP BY team "
    "ORDER BY gib DESC, team LIMIT {top:UInt32}"
)
CARD = "SELECT * FROM v_rate_card_info"
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


class RateCardUsed(_Model):
    card_id: str
    name: str
    source: str
    currency: str
    loaded_at: datetime
    clusters: list[str]
    rules: list[RateRule]


class TransferRow(_Model):
    cluster: str
    from_env: str
    to_env: str
    transfers: int
    gib: float
    rate_status: str
    cost: float | None
    billed_cost: float | None = Field(description="what the bill said, where it says")


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
        values = [getattr(r, field) for r in rows]
        return None if any(v is None for v in values) else round(sum(values), 4)

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
        )
    by_cluster = [_row(r) for r in rows(BY_CLUSTER)]
    return CostReport(
        rate_card=card,
        currency=card.currency if card else None,
        by_class=[_row({**r, "environment": None}) for r in rows(BY_CLASS)],
        by_cluster=by_cluster,
        totals=_total(by_cluster),
        transfers=[
            TransferRow(**{**r, "gib": _r(r["gib"]), "cost": _r(r["cost"])})
            for r in rows(TRANSFERS)
        ],
        transfers_by_team=[
            TeamTransfer(team=r["team"], gib=_r(r["gib"]) or 0.0, cost=_r(r["cost"]))
            for r in rows(TRANSFER_TEAMS)
        ],
    )


# --- rendering ----------------------------------------------------------------------------


def _money(v: float | None) -> str:
    return NO_RATE if v is None else f"{v:,.2f}"


def _num(v: float | None, fmt: str = "{:,.1f}") -> str:
    return "-" if v is None else fmt.format(v)


def render_table(c: CostReport) -> str:
    cur = c.currency or "currency"
    lines = ["", "COST"]
    if c.rate_card is None:
        lines.append(
            "  rate card: none in the warehouse (set GPUGAP_COST_RATE_CARD_FILE, then "
            "`gpugap cost load`): every cost is 'no rate'"
        )
    else:
        k = c.rate_card
        label = f'"{k.name}" ' if k.name else ""
        loaded = k.loaded_at.strftime("%Y-%m-%d %H:%M")
        clusters = ", ".join(k.clusters) or "none"
        lines.append(
            cut(
                f"  rate card {label}{k.card_id}, {cur}, loaded {loaded}Z; clusters: {clusters}",
                WIDTH,
            )
        )
        lines.append(cut(f"  from {k.source or '?'}", WIDTH))
    head = [
        Col("", max=18),
        Col("alloc GPU-h", True),
        Col("gap GPU-h", True),
        Col(f"alloc {cur}", True),
        Col(f"used {cur}", True),
        Col(f"gap {cur}", True),
        Col("kWh", True),
        Col("kg CO2", True),
        Col("gap kgCO2", True),
    ]

    def cells(r: CostRow) -> list[str]:
        return [
            r.key or "(none)",
            _num(r.allocated_gpu_h),
            _num(r.gap_gpu_h),
            _money(r.allocated_cost),
            _money(r.consumed_cost),
            _money(r.gap_cost),
            _num(r.energy_kwh),
            _num(r.co2_kg),
            _num(r.gap_co2_kg),
        ]

    lines += ["", "  By class (allocated GPUs)"]
    lines += table([Col("class", max=18), *head[1:]], [cells(r) for r in c.by_class])
    lines += ["", "  By cluster (kWh and CO2 include unallocated GPUs)"]
    cluster_cols = [
        Col("cluster", max=18),
        Col("env"),
        Col("alloc GPU-h", True),
        Col("unalloc GPU-h", True),
        Col(f"alloc {cur}", True),
        Col(f"gap {cur}", True),
        Col(f"unalloc {cur}", True),
        Col("kWh", True),
        Col("kg CO2", True),
    ]
    rows = [
        [
            r.key,
            r.environment or "-",
            _num(r.allocated_gpu_h),
            _num(r.unallocated_gpu_h),
            _money(r.allocated_cost),
            _money(r.gap_cost),
            _money(r.unallocated_cost),
            _num(r.energy_kwh),
            _num(r.co2_kg),
        ]
        for r in [*c.by_cluster, c.totals]
    ]
    lines += table(cluster_cols, rows)
    unrated = [r for r in c.by_cluster if r.rate_status != "rated"]
    for r in unrated:
        lines.append(f"  {r.key}: {r.rate_status} for {r.unrated_gpu_h:,.1f} GPU-h")
    unmetered = c.totals.unmetered_gpu_h
    if unmetered:
        lines.append(f"  {unmetered:,.1f} GPU-h without a power reading (MIG slices, gaps)")
    lines += ["", "  Boundary transfers"]
    if c.transfers:
        lines += table(
            [
                Col("cluster", max=18),
                Col("from -> to", max=30),
                Col("transfers", True),
                Col("GiB", True),
                Col(cur, True),
                Col("billed", True),
            ],
            [
                [
                    t.cluster,
                    f"{t.from_env} -> {t.to_env}",
                    str(t.transfers),
                    _num(t.gib),
                    _money(t.cost),
                    _num(t.billed_cost, "{:,.2f}"),
                ]
                for t in c.transfers
            ],
        )
    else:
        lines.append("  (none)")
    if c.rate_card is not None and c.rate_card.rules:
        lines += ["", "  Rate card (first matching node pattern per cluster)"]
        lines += table(
            [
                Col("cluster", max=18),
                Col("nodes", max=20),
                Col("model", max=16),
                Col("pricing"),
                Col(f"{cur}/GPU-h", True),
                Col(f"{cur}/kWh", True),
                Col("PUE", True),
                Col("gCO2/kWh", True),
                Col("MIG share", True),
            ],
            [
                [
                    r.cluster,
                    r.node_pattern,
                    r.gpu_model,
                    r.pricing,
                    f"{r.gpu_hour_rate:.4f}",
                    f"{r.kwh_price:.4f}",
                    f"{r.pue:.2f}",
                    _num(r.emission_g_per_kwh, "{:.0f}"),
                    _num(r.mig_share, "{:.3f}"),
                ]
                for r in c.rate_card.rules
            ],
        )
    return "\n".join(lines)


def render_csv_rows(c: CostReport) -> str:
    """Long-form rows (section,key,field,value) without a header: appended to the report's."""
    buf = io.StringIO()
    out = csv.writer(buf, lineterminator="\n")
    data = c.model_dump(mode="json")
    if data["rate_card"]:
        for k, v in data["rate_card"].items():
            if k != "rules":
                out.writerow(["cost_rate_card", "", k, ",".join(v) if isinstance(v, list) else v])
    for section in ("by_class", "by_cluster"):
        for r in data[section]:
            for k, v in r.items():
                if k != "key":
                    out.writerow([f"cost_{section}", r["key"], k, NO_RATE if v is None else v])
    for k, v in data["totals"].items():
        if k != "key":
            out.writerow(["cost_totals", "all", k, NO_RATE if v is None else v])
    for t in data["transfers"]:
        key = f"{t['cluster']}:{t['from_env']}->{t['to_env']}"
        for k, v in t.items():
            out.writerow(["cost_transfers", key, k, "" if v is None else v])
    return buf.getvalue().rstrip("\n")


def extend_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """The report's JSON Schema with the ``cost`` member ``--cost`` adds."""
    cost = CostReport.model_json_schema(mode="serialization", ref_template="#/$defs/{model}")
    defs = {**schema.get("$defs", {}), **cost.pop("$defs", {}), "CostReport": cost}
    out = {**schema, "$defs": defs}
    out["properties"] = {**schema["properties"], "cost": {"$ref": "#/$defs/CostReport"}}
    out["required"] = [*schema.get("required", []), "cost"]
    return out


def render_with(report_text: str, c: CostReport, fmt: str) -> str:
    """The report as ``render`` printed it, with the cost section: after the table, as a
    ``cost`` member of the JSON (``extend_schema``), as ``cost_*`` rows after the CSV's."""
    if fmt == "json":
        import json

        doc = json.loads(report_text)
        doc["cost"] = c.model_dump(mode="json")
        return json.dumps(doc, indent=2)
    if fmt == "csv":
        return report_text + "\n" + render_csv_rows(c)
    return report_text + "\n" + render_table(c)
