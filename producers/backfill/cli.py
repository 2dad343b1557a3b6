"""``gpugap backfill SOURCE --since T --until T``, registered into gpugap's parser.

One subcommand per source declared in ``producers.backfill.plugin.SOURCES``, each with the
common flags (range, output, restart) and its own. Everything goes where the live producers
publish (Kafka, or ``--out FILE`` as JSON lines), with the records' event times.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import re
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from gpugap.groundfloor.timearg import HELP, parse_time
from gpugap.schemas.errors import ConfigError

Cmd = Callable[..., argparse.ArgumentParser]


def register(sub: Any, cmd: Cmd) -> None:
    from .plugin import SOURCES

    bf = sub.add_parser(
        "backfill",
        help="publish history (sacct, Prometheus: dcgm-exporter, kube-state-metrics) as the "
        "live producers' records, for the worker to join",
        description="Turn history into the records the live producers emit, with their event "
        "times, chunked, in parallel within a bound, resumable and idempotent "
        "(docs/backfill.md).",
    )
    names = bf.add_subparsers(dest="source", required=True, metavar="SOURCE")
    for name, spec in SOURCES.items():
        sp = names.add_parser(
            name, help=spec.help, description=f"{spec.help} (extra: {spec.extra})"
        )
        sp.set_defaults(func=_backfill, name=name)
        # "--since -30d" reads as a value (argparse otherwise only lets plain negative numbers
        # through), as gpugap report does
        sp._negative_number_matcher = re.compile(r"^-\d+(\.\d+)?\s*(s|m|min|h|d|w)?$")
        sp.add_argument("--since", required=True, metavar="TIME", help=f"start: {HELP}")
        sp.add_argument("--until", default="now", metavar="TIME", help="end (default now)")
        sp.add_argument("--out", metavar="FILE", help="write JSON lines to FILE ('-' = stdout)")
        sp.add_argument(
            "--restart",
            action="store_true",
            help="ignore the checkpoint: publish the whole range again (same ids: harmless)",
        )
        if name == "slurm":
            sp.add_argument(
                "--sacct-file",
                metavar="FILE",
                help="read a saved dump instead of running sacct (docs/backfill.md: the command)",
            )
        spec.add_options(sp)


def _backfill(args: argparse.Namespace) -> int:
    from gpugap.groundfloor.kafka.publish import open_publisher
    from gpugap.groundfloor.settings import load
    from gpugap.producers import run_producer

    from .plugin import SOURCES

    spec = SOURCES[args.name]
    if args.name == "slurm" and getattr(args, "opt_chunk_s", None) is None:
        args.opt_chunk_s = 86_400  # one sacct call a day: slurmdbd answers whole jobs
    cfg = spec.config(args)
    source_cls = spec.load()
    settings = load()
    logging.getLogger().setLevel(settings.log_level)
    now = datetime.now(UTC)
    since = parse_time(args.since, now, "--since", "backfill")
    until = min(parse_time(args.until, now, "--until", "backfill"), now)
    if since >= until:
        raise ConfigError("backfill: --since must be before --until (and before now)")
    more: dict[str, Any] = {}
    if getattr(args, "sacct_file", None):
        more["sacct_file"] = Path(args.sacct_file)
    source = source_cls(settings, cfg, since=since, until=until, restart=args.restart, **more)
    publisher = open_publisher(args.out, settings.kafka)
    asyncio.run(run_producer(source, publisher))
    print(f"backfill {args.name}: {source.published:,} records published", file=sys.stderr)
    problem = source.problem()
    if problem is not None:
        raise ConfigError(problem)  # one line, exit 2
    return 0
