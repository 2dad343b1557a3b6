"""The job command, registered into ``gpugap``'s parser: one allocation's report for the person
who ran it (gpugap.job.report). Exit 0 with the report; 1 when the id names nothing; 2 when
it names several (they are listed: ask again by one's allocation id or with --cluster), or on
a bad argument."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from gpugap.cli_report import Cmd, _clickhouse_flag, _settings
from gpugap.schemas.errors import ConfigError

EXIT_UNKNOWN = 1
EXIT_AMBIGUOUS = 2


def register(sub: Any, cmd: Cmd) -> None:
    job = cmd(
        "job",
        _job,
        "one job or pod for the person who ran it: allocated, consumed and the gap, each GPU's "
        "utilisation and memory over time, idle stretches, padding, queue wait, and advice",
    )
    job.add_argument(
        "id",
        help="a Slurm job id (12345), array task (12345_7), run (12345#1), a pod as "
        "namespace/name or its UID, or an allocation id (slurm/CLUSTER/12345)",
    )
    job.add_argument("--cluster", metavar="NAME", help="only this cluster's allocations")
    job.add_argument("--format", default="text", help="text (default) or json")
    _clickhouse_flag(job)


def _job(args: argparse.Namespace) -> int:
    from gpugap.job.models import Ambiguous, Unknown
    from gpugap.job.render import FORMATS, render
    from gpugap.job.report import plan, run
    from gpugap.warehouse.client import connect

    if args.format not in FORMATS:
        raise ConfigError(f"unknown --format {args.format!r}: choose one of {', '.join(FORMATS)}")
    report = plan(args.id, args.cluster)
    next(report)  # checks the id's form before connecting: a typo fails fast
    report.close()
    client = connect(_settings(args))
    try:
        outcome = run(client, plan(args.id, args.cluster))
    finally:
        client.close()
    if isinstance(outcome, Unknown):
        print(f"gpugap: error: {outcome.message}", file=sys.stderr)
        return EXIT_UNKNOWN
    text = render(outcome, args.format)
    if isinstance(outcome, Ambiguous):
        # the candidates are the answer to a script (JSON), a question to a person (text)
        print(text, file=sys.stdout if args.format == "json" else sys.stderr)
        return EXIT_AMBIGUOUS
    print(text)
    return 0
