"""``gpugap slurm-hook`` and ``gpugap produce slurm --since``, registered into gpugap's parser.

``gpugap slurm-hook ...`` never reaches this parser when slurmctld runs it: gpugap.cli.main
hands it straight to producers.slurm.hook_command (no parser, no heavy imports). The subcommand is
registered so that it shows in ``gpugap --help`` and behaves the same when called from here.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from typing import Any

Cmd = Callable[..., argparse.ArgumentParser]


def register(sub: Any, cmd: Cmd) -> None:
    hook = cmd(
        "slurm-hook",
        _hook,
        "the Slurm hook (PrologSlurmctld, jobcomp/script, EpilogSlurmctld): job start/end "
        "events to Kafka, spooled when Kafka is unreachable; 'drain' ships the spool",
    )
    hook.add_argument("action", nargs="?", choices=["run", "drain"], default="run")
    hook.add_argument("rest", nargs=argparse.REMAINDER, help="options of drain")
    prod = sub.choices.get("produce")
    if prod is not None:
        prod.add_argument(
            "--since",
            metavar="TIME",
            help="slurm: first backfill history from sacct since TIME "
            "(ISO 8601; same as GPUGAP_SLURM_SINCE)",
        )
        produce = prod.get_default("func")
        prod.set_defaults(func=lambda args: _with_since(args, produce))


def _with_since(args: argparse.Namespace, produce: Callable[[argparse.Namespace], int]) -> int:
    if getattr(args, "since", None):
        os.environ["GPUGAP_SLURM_SINCE"] = args.since  # read by SlurmSettings like any setting
    return produce(args)


def _hook(args: argparse.Namespace) -> int:
    from producers.slurm.hook_command import main

    argv = [] if args.action == "run" else [args.action]
    return main([*argv, *args.rest])
