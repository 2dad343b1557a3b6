"""``gpugap slurm-hook``, registered into gpugap's parser.

``gpugap slurm-hook ...`` never reaches this parser when slurmctld runs it: the console
script (gpugap.launch) hands it straight to hook_command (no parser, no heavy imports). The
subcommand is registered so that it shows in ``gpugap --help`` and behaves the same when
called from here.
"""

from __future__ import annotations

import argparse
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


def _hook(args: argparse.Namespace) -> int:
    from gpugap.producers.slurm.hook_command import main

    argv = [] if args.action == "run" else [args.action]
    return main([*argv, *args.rest])
