"""``gpugap produce slurm-capacity``: declared here, built from ``producers.REGISTRY``."""

from gpugap.groundfloor.plugin import Plugin

from .poll_settings import SlurmCapacitySettings

PLUGIN = Plugin(
    name="slurm-capacity",
    help="poll scontrol: each GPU node's GPUs, CPUs, memory and what every running job holds "
    "of them (node-capacity.v1)",
    extra="slurm",
    target="gpugap.producers.slurm.capacity_producer:SlurmCapacityProducer",
    settings=SlurmCapacitySettings,
)
