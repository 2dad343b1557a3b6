"""``gpugap produce slurm-jobcomp``: declared here, built from ``producers.REGISTRY``."""

from gpugap.groundfloor.plugin import Plugin

from .jobcomp_settings import SlurmJobcompSettings

PLUGIN = Plugin(
    name="slurm-jobcomp",
    help="consume Slurm's own job start and end records (jobcomp/kafka, Slurm 25.05+) and "
    "publish them as slurm.jobs.v1 events, with no hook in slurmctld",
    extra="slurm",
    target="gpugap.producers.slurm.jobcomp_producer:SlurmJobcompProducer",
    settings=SlurmJobcompSettings,
)
