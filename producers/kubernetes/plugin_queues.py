"""``gpugap produce kubernetes-queues``: declared here, built from ``producers.REGISTRY``."""

from gpugap.groundfloor.plugin import Option, Plugin

from .poll_settings import QueueSettings

PLUGIN = Plugin(
    name="kubernetes-queues",
    help="poll Kueue, KAI and Volcano queues: GPU entitlement, limit and what each holds "
    "(queue-quotas.v1)",
    extra="kubernetes",
    target="gpugap.producers.kubernetes.queues_producer:QueuesProducer",
    settings=QueueSettings,
    requires=("kubernetes",),
    options=(
        Option(
            "--kubeconfig",
            "kubeconfig",
            "kubeconfig (default in-cluster, $KUBECONFIG)",
            {"metavar": "FILE"},
        ),
    ),
)
