"""``gpugap monthly-report``, registered into ``gpugap``'s parser: each team's (and user's)
month by mail, or into files. Its own command rather than ``gpugap report monthly``:
``report`` takes flags and no subcommand, and a positional word there would be read as one
more argument of the gap report (docs/commands.md#gpugap-monthly-report)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from gpugap.cli_report import _clickhouse_flag

Cmd = Callable[..., argparse.ArgumentParser]


def register(sub: Any, cmd: Cmd) -> None:
    mon = cmd(
        "monthly-report",
        _monthly,
        "mail each team (and with --users each user) their month: GPU-hours allocated, "
        "consumed and gap, the rank by waste, the most wasteful jobs, open recommendations, "
        "queue time and a daily chart (GPUGAP_EMAIL_* settings, team addresses in "
        "GPUGAP_MONTHLY_TEAM_ADDRESSES; run on the 1st)",
    )
    mon.add_argument("--month", metavar="YYYY-MM", help="the UTC month (default: the last one)")
    mon.add_argument(
        "--team",
        dest="teams",
        action="extend",
        nargs="+",
        metavar="T",
        help="only these teams, exact names (default: every team with allocations)",
    )
    mon.add_argument(
        "--users", action="store_true", help="also mail each user of those teams their own"
    )
    mon.add_argument("--top", type=int, default=5, metavar="N", help="jobs listed per report (5)")
    mon.add_argument(
        "--dry-run",
        metavar="DIR",
        type=Path,
        help="write each report into DIR (.eml, .html + .png, .txt), send and record nothing",
    )
    mon.add_argument(
        "--sent-by",
        metavar="NAME",
        help="who sends, recorded with each mail in report_sends (default: the OS user)",
    )
    mon.add_argument(
        "--resend", action="store_true", help="send again what report_sends says was sent"
    )
    _clickhouse_flag(mon)


def _monthly(args: argparse.Namespace) -> int:
    from gpugap.groundfloor.plugin import require

    require("gpugap monthly-report", "clickhouse", ("clickhouse_connect",))
    from gpugap.groundfloor.settings import load
    from gpugap.report.monthly import Month
    from gpugap.report.monthly_send import send_monthly, who_sends
    from gpugap.warehouse.client import client_options

    # every argument is checked before connecting: a typo fails fast
    month = Month.parse(args.month) if args.month else Month.before(datetime.now(UTC).date())
    sent_by = who_sends(args.sent_by)
    settings = load()
    if args.clickhouse:
        ch = settings.clickhouse.model_copy(update={"url": args.clickhouse})
        client_options(ch)  # a malformed URL is a ConfigError before any connection
        settings = settings.model_copy(update={"clickhouse": ch})
    out = send_monthly(
        settings,
        month,
        teams=args.teams,
        users=args.users,
        top=args.top,
        sent_by=sent_by,
        dry_run=args.dry_run,
        resend=args.resend,
    )
    for line in out.skipped:
        print(f"not mailed: {line}", file=sys.stderr)
    for line in out.failed:
        print(f"gpugap: error (retry may help): {line}", file=sys.stderr)
    if args.dry_run is not None:
        print(f"monthly report {month.label}: {len(out.written)} file(s) in {args.dry_run}")
    else:
        print(
            f"monthly report {month.label}: {len(out.sent)} mail(s) sent by {sent_by}, "
            f"{len(out.failed)} failed",
            file=sys.stderr,
        )
    return 1 if out.failed else 0
