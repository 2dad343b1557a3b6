"""``gpugap produce slurm-metrics``: declared here, built from ``producers.REGISTRY``."""

from gpugap.groundfloor.plugin import Plugin

from .poll_settings import SlurmMetricsSettings

PLUGIN = Plugin(
    name="slurm-metrics",
    help="poll slurmctld's own OpenMetrics (Slurm 26.05+): the GPUs its running jobs hold per "
    "partition, account, user and node (scheduler-gpu-counts.v1), to check gpugap against",
    extra="slurm",
    target="gpugap.producers.slurm.metrics_producer:SlurmMetricsProducer",
    settings=SlurmMetricsSettings,
)
