"""``gpugap produce slurm``: declared here, built from ``producers.REGISTRY``. (The hook,
``gpugap slurm-hook``, is its own command: slurmctld runs it, see ``cli.py``.)"""

from gpugap.groundfloor.plugin import Option, Plugin

from .settings import SlurmSettings

PLUGIN = Plugin(
    name="slurm",
    help="poll Slurm (pyslurm, squeue --json or scontrol) for job starts and ends, ship the "
    "hook's spool",
    extra="slurm",
    target="gpugap.producers.slurm.producer:SlurmProducer",
    settings=SlurmSettings,
    options=(
        Option(
            "--since",
            "since",
            "first backfill history from sacct since TIME (ISO 8601; same as GPUGAP_SLURM_SINCE)",
            {"metavar": "TIME"},
        ),
    ),
)
