"""``gpugap produce kubernetes-capacity``: declared here, built from ``producers.REGISTRY``."""

from gpugap.groundfloor.plugin import Option, Plugin

from .poll_settings import CapacitySettings

PLUGIN = Plugin(
    name="kubernetes-capacity",
    help="poll nodes and pods: each GPU node's GPUs, CPUs, memory and what every pod holds "
    "of them (node-capacity.v1)",
    extra="kubernetes",
    target="gpugap.producers.kubernetes.capacity_producer:CapacityProducer",
    settings=CapacitySettings,
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
