"""``gpugap produce slurm-quotas``: declared here, built from ``producers.REGISTRY``."""

from gpugap.groundfloor.plugin import Plugin

from .poll_settings import SlurmQuotaSettings

PLUGIN = Plugin(
    name="slurm-quotas",
    help="poll sacctmgr: every QOS and association whose GrpTRES caps GPUs (queue-quotas.v1)",
    extra="slurm",
    target="gpugap.producers.slurm.quotas_producer:SlurmQuotaProducer",
    settings=SlurmQuotaSettings,
)
