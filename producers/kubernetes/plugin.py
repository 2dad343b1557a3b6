"""``gpugap produce kubernetes``: declared here, built from ``producers.REGISTRY``."""

from gpugap.groundfloor.plugin import Option, Plugin

from .settings import KubernetesSettings

PLUGIN = Plugin(
    name="kubernetes",
    help="watch pods that request GPUs: bound, running, ended, with owner, team and class",
    extra="kubernetes",
    target="gpugap.producers.kubernetes.producer:KubernetesProducer",
    settings=KubernetesSettings,
    requires=("kubernetes",),
    options=(
        Option(
            "--namespace",
            "namespaces",
            "watch this namespace (repeat; default all)",
            {"action": "append", "metavar": "NS"},
        ),
        Option(
            "--kubeconfig",
            "kubeconfig",
            "kubeconfig (default in-cluster, $KUBECONFIG)",
            {"metavar": "FILE"},
        ),
    ),
)
