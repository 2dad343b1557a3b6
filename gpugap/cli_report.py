"""The report and sql commands, registered into ``gpugap``'s parser. Heavy imports stay in
the handlers so ``gpugap --help`` stays fast; every bad input is one line via GpugapError."""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from gpugap.schemas.errors import ConfigError

if TYPE_CHECKING:
    from gpugap.groundfloor.settings import ClickHouseSettings

Cmd = Callable[..., argparse.ArgumentParser]
_DIMENSIONS = "class, scheduler, team, cluster, allocation"
_TIME = "ISO-8601 (2026-11-01T10:00Z; no offset = UTC) or relative (-24h, -7d, -30m, now)"


def register(sub: Any, cmd: Cmd) -> None:
    rep = cmd(
        "report",
        _report,
        "GPU-hours allocated vs consumed and where the gap is: by dimension, top wasters, "
        "unallocated capacity, Slurm padding, idle allocations and partial gangs now, work "
        "lost to preemption, requeue, eviction, node failure and OOM",
    )
    # "--since -24h" reads as a value, not as an unknown option (argparse otherwise only lets
    # plain negative numbers through)
    rep._negative_number_matcher = re.compile(r"^-\d+(\.\d+)?\s*(s|m|min|h|d|w)?$")
    rep.add_argument("--since", metavar="T", help=f"start (default: the first data); {_TIME}")
    rep.add_argument("--until", metavar="T", help="end, exclusive (default: now); same forms")
    rep.add_argument("--by", default="class", help=f"group the gap by: {_DIMENSIONS} (class)")
    rep.add_argument("--top", type=int, default=10, metavar="N", help="rows per ranking (10)")
    rep.add_argument("--format", default="table", help="table (default), json or csv")
    rep.add_argument(
        "--schema", action="store_true", help="print the JSON Schema of --format json and exit"
    )
    rep.add_argument(
        "--cost",
        action="store_true",
        help="add currency, energy and CO2 per class and cluster, boundary transfers, and the "
        "rate card used (docs/cost.md)",
    )
    rep.add_argument(
        "--queue",
        action="store_true",
        help="add how long work waited for GPUs by queue, class, team and GPU count, and what "
        "padded Slurm limits cost the queue (a backfill replay per partition; docs/queue.md)",
    )
    _clickhouse_flag(rep)

    sql = cmd(
        "sql",
        _sql,
        "run one read-only query (SELECT, SHOW, DESCRIBE...) on the warehouse and print it",
    )
    sql.add_argument("query", help='e.g. "SELECT * FROM v_top_waste LIMIT 10"')
    sql.add_argument(
        "--param",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="server-side parameter for {NAME:Type} in the query (repeat)",
    )
    sql.add_argument("--format", default="table", help="table (default), json or csv")
    sql.add_argument(
        "--max-rows", type=int, default=10_000, metavar="N", help="stop after N rows (10000)"
    )
    _clickhouse_flag(sql)
    dig = cmd(
        "digest",
        _digest,
        "mail each owner the day's top idle allocations by absolute waste "
        "(GPUGAP_EMAIL_* settings; run daily)",
    )
    dig.add_argument("--day", metavar="YYYY-MM-DD", help="the UTC day (default: yesterday)")
    dig.add_argument("--top", type=int, default=5, help="allocations per owner (5)")
    dig.add_argument(
        "--min-gap", type=float, default=0.5, metavar="GPU_H", help="leave out smaller (0.5)"
    )
    dig.add_argument("--dry-run", action="store_true", help="print the mails, send nothing")
    _clickhouse_flag(dig)


def _clickhouse_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--clickhouse",
        metavar="URL",
        help="ClickHouse HTTP URL (default GPUGAP_CLICKHOUSE_URL; user, password and "
        "database from GPUGAP_CLICKHOUSE_*)",
    )


def _settings(args: argparse.Namespace) -> ClickHouseSettings:
    from gpugap.groundfloor.plugin import require

    require(f"gpugap {args.command}", "clickhouse", ("clickhouse_connect",))
    from gpugap.groundfloor.settings import load
    from gpugap.warehouse.client import client_options

    settings = load().clickhouse
    if args.clickhouse:
        settings = settings.model_copy(update={"url": args.clickhouse})
    client_options(settings)  # a malformed URL is a ConfigError before any connection
    return settings


def _report(args: argparse.Namespace) -> int:
    from gpugap.report import (
        BY_COLUMN,
        DIMENSIONS,
        FORMATS,
        build_report,
        parse_window,
        render,
        report_schema,
    )
    from gpugap.warehouse.client import connect

    if args.schema:
        schema = report_schema()
        if args.cost:
            from gpugap.cost.report import extend_schema

            schema = extend_schema(schema)
        if args.queue:
            from gpugap.queue.report import extend_schema as extend_queue

            schema = extend_queue(schema)
        print(json.dumps(schema, indent=2))
        return 0
    # every argument is checked before connecting: a typo fails fast, with or without a server
    if args.by not in BY_COLUMN:
        raise ConfigError(f"unknown --by {args.by!r}: choose one of {', '.join(DIMENSIONS)}")
    if args.format not in FORMATS:
        raise ConfigError(f"unknown --format {args.format!r}: choose one of {', '.join(FORMATS)}")
    if args.top < 1:
        raise ConfigError(f"--top must be at least 1, got {args.top}")
    since, until = parse_window(args.since, args.until, datetime.now(UTC))
    settings = _settings(args)
    client = connect(settings)
    try:
        report = build_report(client, since, until, args.by, args.top)
        text = render(report, args.format)
        if args.cost:
            from gpugap.cost.render import render_with
            from gpugap.cost.report import build_cost

            text = render_with(text, build_cost(client, since, until, args.top), args.format)
        if args.queue:
            from gpugap.queue.report import build_queue
            from gpugap.queue.report import render_with as with_queue

            text = with_queue(text, build_queue(client, since, until, args.top), args.format)
    finally:
        client.close()
    print(text)
    return 0


def _digest(args: argparse.Namespace) -> int:
    from datetime import timedelta

    from gpugap.digest import send_digests
    from gpugap.groundfloor.settings import load

    ch = _settings(args)
    settings = load()
    settings = settings.model_copy(update={"clickhouse": ch})
    try:
        day = (
            datetime.strptime(args.day, "%Y-%m-%d").date()
            if args.day
            else (datetime.now(UTC) - timedelta(days=1)).date()
        )
    except ValueError:
        raise ConfigError(f"--day {args.day!r}: expected YYYY-MM-DD") from None
    sent = send_digests(
        settings, day, top=args.top, min_gap_gpu_h=args.min_gap, dry_run=args.dry_run
    )
    verb = "composed" if args.dry_run else "sent"
    print(f"digest {day.isoformat()}: {len(sent)} mail(s) {verb}", file=sys.stderr)
    return 0


def _sql(args: argparse.Namespace) -> int:
    from gpugap.report import FORMATS
    from gpugap.report.table import results
    from gpugap.warehouse.client import connect, run_query

    if args.format not in FORMATS:
        raise ConfigError(f"unknown --format {args.format!r}: choose one of {', '.join(FORMATS)}")
    if args.max_rows < 1:
        raise ConfigError(f"--max-rows must be at least 1, got {args.max_rows}")
    params = {}
    for item in args.param:
        name, sep, value = item.partition("=")
        if not sep or not name.isidentifier():
            raise ConfigError(f"--param wants NAME=VALUE, got {item!r}")
        params[name] = value
    settings = _settings(args)
    client = connect(settings)
    try:
        # the server stops after about max_rows (whole blocks); the rest is cut here
        limit = {"max_result_rows": args.max_rows, "result_overflow_mode": "break"}
        result = run_query(client, args.query, params or None, limit)
    finally:
        client.close()
    rows = result.result_rows
    if len(rows) > args.max_rows:
        rows = rows[: args.max_rows]
        print(f"gpugap: showing the first {args.max_rows} rows (--max-rows)", file=sys.stderr)
    print(results(list(result.column_names), rows, args.format))
    return 0
