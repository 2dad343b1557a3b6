"""The ``gpugap`` console script. ``gpugap slurm-hook`` is dispatched before anything else is
imported: slurmctld runs it on every job start and end and waits for it, and gpugap.cli's own
imports (argparse, logging, typing...) would be a good part of the hook's run time."""

import sys


def main() -> int:
    if sys.argv[1:2] == ["slurm-hook"]:
        from gpugap.producers.slurm.hook_command import main as slurm_hook

        return slurm_hook(sys.argv[2:])
    from gpugap.cli import main as cli_main

    return cli_main()
