"""``gpugap recommend``: compute, list, show, decide, decisions. gpugap stays read-only
towards the schedulers: an accepted recommendation prints what a person applies."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from gpugap.schemas.errors import ConfigError

if TYPE_CHECKING:
    from gpugap.groundfloor.settings import ClickHouseSettings
    from gpugap.schemas.models import Recommendation

Cmd = Callable[..., argparse.ArgumentParser]
FORMATS = ("table", "json", "csv")


def register(sub: Any, cmd: Cmd) -> None:
    rec = sub.add_parser(
        "recommend",
        help="changes for a person to review: Slurm --time, GPU counts and MIG slices, "
        "idle culling, replicas by hour, placement",
        description="Recommendations from the warehouse's history, ranked by GPU-hours saved "
        "per week; decisions (accept/reject/defer, who, why) go to an append-only audit table. "
        "gpugap never changes a scheduler.",
    )
    rsub = rec.add_subparsers(dest="action", required=True, metavar="ACTION")
    comp = cmd(
        "compute",
        _compute,
        "compute the recommendations now and publish them on recommendations.v1, where the "
        "ClickHouse sink stores them",
        rsub,
    )
    comp.add_argument("--days", type=float, default=14.0, help="history to read (14 days)")
    comp.add_argument("--top", type=int, default=10, help="print the top N (10)")
    comp.add_argument(
        "--dry-run", action="store_true", help="compute and print them, publish nothing"
    )
    comp.add_argument(
        "--out",
        metavar="FILE",
        help="JSON lines to FILE or '-' (stdout; the summary goes to stderr) instead of Kafka "
        "(GPUGAP_KAFKA_*): nothing reaches the warehouse",
    )
    ls = cmd("list", _list, "current recommendations by GPU-hours saved per week", rsub)
    ls.add_argument("--top", type=int, default=20, help="rows (20)")
    ls.add_argument("--all", action="store_true", help="with rejected and superseded ones")
    ls.add_argument("--format", default="table", help="table (default), json or csv")
    show = cmd("show", _show, "one recommendation with its evidence", rsub)
    show.add_argument("id")
    show.add_argument("--format", default="table", help="table (default) or json")
    dec = cmd("decide", _decide, "record a decision: accept, reject or defer", rsub)
    dec.add_argument("id")
    dec.add_argument("decision", choices=["accept", "reject", "defer"])
    dec.add_argument("--by", required=True, metavar="WHO", help="who decides")
    dec.add_argument("--why", required=True, metavar="TEXT", help="why (kept for the audit)")
    hist = cmd("decisions", _decisions, "the audit trail: who decided what, when, why", rsub)
    hist.add_argument("id", nargs="?", help="one recommendation's (default: all)")
    hist.add_argument("--format", default="table", help="table (default), json or csv")
    for p in (comp, ls, show, dec, hist):
        p.add_argument(
            "--clickhouse",
            metavar="URL",
            help="ClickHouse HTTP URL (default GPUGAP_CLICKHOUSE_URL; user, password, "
            "database from GPUGAP_CLICKHOUSE_*)",
        )


def _settings(args: argparse.Namespace) -> ClickHouseSettings:
    from gpugap.groundfloor.plugin import require

    require("gpugap recommend", "clickhouse", ("clickhouse_connect",))
    from gpugap.groundfloor.settings import load
    from gpugap.warehouse.client import client_options

    settings = load().clickhouse
    if getattr(args, "clickhouse", None):
        settings = settings.model_copy(update={"url": args.clickhouse})
    client_options(settings)
    return settings


def _client(args: argparse.Namespace) -> Any:
    from gpugap.warehouse.client import connect

    return connect(_settings(args))


def _format(args: argparse.Namespace, allowed: tuple[str, ...] = FORMATS) -> str:
    if args.format not in allowed:
        raise ConfigError(f"unknown --format {args.format!r}: choose one of {', '.join(allowed)}")
    return str(args.format)


def change_text(parameter: str, from_value: str, to_value: str) -> str:
    """A change as people say it: '--time 8:00:00 -> 2:30:00', 'GPUs 4 -> 2'."""
    from gpugap.recommend.base import hms

    if parameter == "time_limit_s":
        return f"--time {hms(float(from_value))} -> {hms(float(to_value))}"
    if parameter == "gpus":
        return f"GPUs {from_value} -> {to_value}"
    if parameter == "idle_cull_minutes":
        return f"cull idle after {to_value} min"
    if parameter == "scheduler":
        return f"move to {to_value}"
    if parameter == "replicas_by_hour":  # '00-08:1,08-16:3,16-24:1'
        counts = [int(r.rpartition(":")[2]) for r in to_value.split(",") if ":" in r] or [0]
        return f"replicas {from_value} -> {min(counts)}-{max(counts)} by hour"
    if parameter == "gpu_profile":
        return f"{from_value} -> {to_value}"
    return f"{parameter} {from_value} -> {to_value}"


def summary_lines(recs: list[Recommendation], top: int) -> list[str]:
    """The top recommendations, one line each (the demo prints these too)."""
    from gpugap.report.table import Col, table
    from gpugap.warehouse.rows import recommendation_target

    cols = [Col("#", right=True), Col("id"), Col("target", max=40), Col("change"),
            Col("GPU-h/wk", right=True), Col("conf", right=True)]  # fmt: skip
    rows = [
        [str(i), r.id, recommendation_target(r),
         change_text(r.change.parameter, r.change.from_value, r.change.to_value),
         f"{r.saved_gpu_hours_per_week:,.1f}", f"{r.confidence:.2f}"]
        for i, r in enumerate(recs[:top], 1)
    ]  # fmt: skip
    return table(cols, rows)


def _compute(args: argparse.Namespace) -> int:
    import sys

    from gpugap.groundfloor.settings import load
    from gpugap.recommend.engine import compute, publish
    from gpugap.schemas.topics import RECOMMENDATIONS

    if args.days <= 0:
        raise ConfigError(f"--days must be positive, got {args.days}")
    if args.dry_run and args.out:
        raise ConfigError("--dry-run publishes nothing: drop --out (or --dry-run)")
    kafka = load().kafka
    client = _client(args)
    not_worth: list[Recommendation] = []  # moves that would cost more egress than they save
    try:
        w, recs = compute(client, days=args.days, not_worth=not_worth)
    finally:
        client.close()
    if args.dry_run:
        verb = "found (not published: --dry-run)"
    elif args.out:
        publish(recs, kafka, args.out)
        where = "stdout" if args.out == "-" else args.out
        verb = f"written to {where} as {RECOMMENDATIONS.name} JSON lines (not published)"
    else:
        publish(recs, kafka)
        verb = f"published on {RECOMMENDATIONS.qualified(kafka.topic_prefix)} at {kafka.bootstrap}"
    say = sys.stderr if args.out == "-" else sys.stdout  # stdout: the JSON lines alone
    total = sum(r.saved_gpu_hours_per_week for r in recs)
    print(
        f"{len(recs)} recommendation(s) {verb} from {w.history_days:.1f} days of history "
        f"({w.since:%Y-%m-%d %H:%M} to {w.until:%Y-%m-%d %H:%M} UTC): "
        f"{total:,.1f} GPU-hours/week if all were applied",
        file=say,
    )
    if not (args.dry_run or args.out):
        print(
            "  the ClickHouse sink (gpugap sink clickhouse) stores them; "
            "gpugap recommend list shows them once stored",
            file=say,
        )
    if recs:
        print("\n".join(summary_lines(recs, args.top)), file=say)
        print(
            "  gpugap recommend show ID  |  gpugap recommend decide ID accept --by WHO --why ...",
            file=say,
        )
    for r in not_worth:  # not published, not in the total: their egress outweighs the saving
        from gpugap.warehouse.rows import recommendation_target

        f = r.evidence.figures
        print(
            f"  not worth moving: {recommendation_target(r)} to {r.change.to_value}: egress "
            f"{f.get('move_egress_cost_per_week', 0):,.2f}/week "
            f"against {f.get('saved_cost_per_week', 0):,.2f}/week saved "
            f"(net {f.get('net_saved_cost_per_week', 0):,.2f}/week)",
            file=say,
        )
    return 0


def _list(args: argparse.Namespace) -> int:
    from gpugap.recommend.engine import listing
    from gpugap.report.table import results

    fmt = _format(args)
    if args.top < 1:
        raise ConfigError(f"--top must be at least 1, got {args.top}")
    client = _client(args)
    try:
        rows = listing(client, args.top, args.all)
    finally:
        client.close()
    if fmt != "table":
        cols = list(rows[0]) if rows else ["id"]
        print(results(cols, [list(r.values()) for r in rows], fmt))
        return 0
    if not rows:
        print(
            "no recommendations (gpugap recommend compute publishes them, the ClickHouse sink "
            "stores them)"
        )
        return 0
    from gpugap.report.table import Col, table

    tcols = [Col("#", right=True), Col("id"), Col("target", max=40), Col("change"),
             Col("GPU-h/wk", right=True), Col("conf", right=True)]  # fmt: skip
    decided = any(r["decision"] for r in rows)
    if decided:
        tcols.append(Col("decision", max=16))
    out = [
        [str(i), r["id"], r["target"], change_text(r["parameter"], r["from_value"], r["to_value"]),
         f"{r['saved_gpu_h_per_week']:,.1f}", f"{r['confidence']:.2f}"]
        + ([f"{r['decision']} ({r['decided_by']})" if r["decision"] else "-"] if decided else [])
        for i, r in enumerate(rows, 1)
    ]  # fmt: skip
    print("\n".join(table(tcols, out)))
    return 0


def show_text(rec: Recommendation, decisions: list[Any]) -> str:
    from gpugap.warehouse.rows import recommendation_target

    e = rec.evidence
    lines = [
        f"{rec.id}  ({rec.kind}, {rec.workload_class.value})",
        f"  target      {recommendation_target(rec)}",
        f"  change      {change_text(rec.change.parameter, rec.change.from_value, rec.change.to_value)}",  # noqa: E501
        *(
            [f"  schedule    {rec.change.to_value} (UTC hours: replicas)"]
            if rec.change.parameter == "replicas_by_hour"
            else []
        ),
        f"  saves       {rec.saved_gpu_hours_per_week:,.1f} GPU-hours per week",
        f"  confidence  {rec.confidence:.2f}  (history {e.history_days:.1f} days, "
        f"{e.samples} samples, spread {e.spread:.2f})",
        f"  why         {rec.rationale}",
        f"  sample      {e.allocations} jobs/pods, {e.hours:,.1f} h, {e.gpu_hours:,.1f} GPU-h, "
        f"{e.since:%Y-%m-%d %H:%M} to {e.until:%Y-%m-%d %H:%M} UTC",
        "  figures     " + ", ".join(f"{k}={v:g}" for k, v in sorted(e.figures.items())),
        '  evidence    (gpugap sql "...")',
        f"    {e.query}",
    ]
    if decisions:
        lines.append("  decisions")
        lines += [f"    {d.decided_at:%Y-%m-%d %H:%M} {d.decision} by {d.decided_by}: {d.reason}"
                  for d in decisions]  # fmt: skip
    return "\n".join(lines)


def _show(args: argparse.Namespace) -> int:
    from gpugap.recommend.engine import decisions, get
    from gpugap.recommend.followup import follow_up

    fmt = _format(args, ("table", "json"))
    client = _client(args)
    try:
        rec = get(client, args.id)
        history = decisions(client, rec.id)
        accepted = [d for d in history if d.decision == "accept"]
        check = follow_up(client, rec, accepted[0].decided_at) if accepted else None
    finally:
        client.close()
    if fmt == "json":
        data = json.loads(rec.model_dump_json())
        data["decisions"] = [
            {"decision": d.decision, "by": d.decided_by, "at": d.decided_at.isoformat(),
             "why": d.reason} for d in history
        ]  # fmt: skip
        print(json.dumps(data, indent=2))
        return 0
    print(show_text(rec, history))
    if history and history[0].decision == "accept":
        print("  apply (a person runs this; gpugap never changes a scheduler)")
        print("\n".join(f"    {line}" for line in rec.apply.splitlines()))
    if check is not None:
        print(
            f"  follow-up   {check.allocations} jobs/pods since {check.since:%Y-%m-%d}: "
            f"{check.measure} {check.measured_per_week:,.1f} GPU-h/week (was "
            f"{check.before_per_week:,.1f}, expected {check.expected_per_week:,.1f})"
        )
    return 0


def _decide(args: argparse.Namespace) -> int:
    from gpugap.recommend.engine import decide
    from gpugap.warehouse.client import connect

    client = connect(_settings(args))
    try:
        rec, d = decide(client, args.id, args.decision, by=args.by, why=args.why)
    finally:
        client.close()
    print(f"{d.decision} {rec.id} by {d.decided_by} at {d.decided_at:%Y-%m-%d %H:%M:%S} UTC")
    if d.decision == "accept":
        print("apply it (gpugap never changes a scheduler: a person runs this):")
        print("\n".join(f"  {line}" for line in rec.apply.splitlines()))
    return 0


def _decisions(args: argparse.Namespace) -> int:
    from gpugap.recommend.engine import decisions
    from gpugap.report.table import results

    fmt = _format(args)
    client = _client(args)
    try:
        rows = decisions(client, args.id)
    finally:
        client.close()
    cols = ["decided_at", "id", "decision", "decided_by", "reason"]
    data = [[d.decided_at, d.id, d.decision, d.decided_by, d.reason] for d in rows]
    if fmt == "table" and not rows:
        print("no decisions yet")
        return 0
    print(results(cols, data, fmt))
    return 0
