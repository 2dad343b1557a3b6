"""The cost section as people and tools read it: a table in the report, ``cost_*`` CSV rows,
and a ``cost`` member of the report's JSON (``report.extend_schema`` is its schema)."""

from __future__ import annotations

import csv
import io

from gpugap.cost.report import NO_RATE, WIDTH, CostReport, CostRow
from gpugap.report.sections import with_section
from gpugap.report.table import Col, cut, table


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
        Col("cluster", max=16),
        Col("env"),
        Col("alloc GPU-h", True),
        Col(f"alloc {cur}", True),
        Col(f"unalloc {cur}", True),
        Col("egress GiB", True),
        Col(f"egress {cur}", True),
        Col(f"total {cur}", True),
    ]
    rows = [
        [
            r.key,
            r.environment or "-",
            _num(r.allocated_gpu_h),
            _money(r.allocated_cost),
            _money(r.unallocated_cost),
            _num(r.egress_gib),
            _money(r.egress_cost),
            _money(r.total_cost),
        ]
        for r in [*c.by_cluster, c.totals]
    ]
    lines += ["  total: allocated + unallocated GPU-hours + egress"]
    lines += table(cluster_cols, rows)
    lines += [""]
    lines += table(
        [Col("cluster", max=16), Col("unalloc GPU-h", True), Col(f"gap {cur}", True),
         Col("kWh", True), Col("kg CO2", True)],
        [[r.key, _num(r.unallocated_gpu_h), _money(r.gap_cost), _num(r.energy_kwh),
          _num(r.co2_kg)] for r in [*c.by_cluster, c.totals]],
    )  # fmt: skip
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
        for t in c.transfers:
            if len(t.sources) > 1:
                lines.append(
                    f"  {t.cluster} {t.from_env} -> {t.to_env}: recorded by "
                    f"{' and '.join(t.sources)}, counted twice if they see the same bytes; "
                    "keep one source per link (docs/cost.md)"
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
    if c.rate_card is not None:
        lines += ["", f"  Egress rates ({cur}/GiB across the boundary)"]
        if c.rate_card.egress:
            lines += table(
                [Col("cluster", max=18), Col("from -> to", max=30), Col(f"{cur}/GiB", True)],
                [[e.cluster, f"{e.from_env} -> {e.to_env}", f"{e.per_gib:g}"]
                 for e in c.rate_card.egress],
            )  # fmt: skip
        else:
            lines.append("  (none: every transfer is 'no rate')")
    return "\n".join(lines)


def render_csv_rows(c: CostReport) -> str:
    """Long-form rows (section,key,field,value) without a header: appended to the report's."""
    buf = io.StringIO()
    out = csv.writer(buf, lineterminator="\n")
    data = c.model_dump(mode="json")
    if data["rate_card"]:
        for k, v in data["rate_card"].items():
            if k not in ("rules", "egress"):
                out.writerow(["cost_rate_card", "", k, ",".join(v) if isinstance(v, list) else v])
        for e in data["rate_card"]["egress"]:
            key = f"{e['cluster']}:{e['from_env']}->{e['to_env']}"
            out.writerow(["cost_egress_rates", key, "per_gib", e["per_gib"]])
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
            shown = ",".join(v) if isinstance(v, list) else v
            out.writerow(["cost_transfers", key, k, "" if shown is None else shown])
    return buf.getvalue().rstrip("\n")


def render_with(report_text: str, c: CostReport, fmt: str) -> str:
    """The report as ``render`` printed it, with the cost section: after the table, as a
    ``cost`` member of the JSON (``extend_schema``), as ``cost_*`` rows after the CSV's."""
    return with_section(
        report_text,
        fmt,
        "cost",
        c,
        csv_rows=lambda: render_csv_rows(c),
        table=lambda: render_table(c),
    )
