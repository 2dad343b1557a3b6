"""``GPUGAP_K8S_CAPACITY_*`` and ``GPUGAP_K8S_QUEUES_*``: the polled Kubernetes producers'
settings (node capacity, queue quotas). Each has its own prefix, so one process environment can
run the pod watcher and these side by side with different intervals."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, field_validator

from gpugap.groundfloor.settings import CommaList, comma_list, env_config
from gpugap.producers.kubernetes.gpu_resources import MODEL_LABELS, GpuResourceSettings
from gpugap.schemas.types import MAX_INTERVAL_S

#: node labels that name a node pool, first present wins (GKE, EKS, AKS, Karpenter, then the
#: instance type, which at least groups identical machines)
POOL_LABELS = (
    "cloud.google.com/gke-nodepool",
    "eks.amazonaws.com/nodegroup",
    "kubernetes.azure.com/agentpool",
    "karpenter.sh/nodepool",
    "node.kubernetes.io/instance-type",
)


class _PolledKubernetes(GpuResourceSettings):
    kubeconfig: Path | None = Field(default=None, description="default: in-cluster, KUBECONFIG")
    context: str | None = None
    cluster: str | None = Field(default=None, description="cluster name (default GPUGAP_CLUSTER)")
    interval_s: float = Field(default=60.0, ge=1.0, le=MAX_INTERVAL_S, description="between polls")
    connect_timeout_s: float = Field(default=10.0, gt=0)
    request_timeout_s: float = Field(default=60.0, gt=0)
    page_size: int = Field(default=500, ge=1, le=10_000, description="objects per list page")


class CapacitySettings(_PolledKubernetes):
    """Node capacity (``gpugap produce kubernetes-capacity``)."""

    model_config = env_config("GPUGAP_K8S_CAPACITY_")

    pool_labels: CommaList = Field(default_factory=lambda: list(POOL_LABELS))
    #: singular for the settings written before AMD's label: one label or a list
    gpu_model_label: CommaList = Field(
        default_factory=lambda: list(MODEL_LABELS),
        description="node labels naming the GPU model, first present wins",
    )
    #: a list this long is cut there (logged as an error): memory stays bounded on any cluster
    max_nodes: int = Field(default=20_000, ge=1, description="nodes read per poll")
    max_pods: int = Field(default=500_000, ge=1, description="pods read per poll")

    _more = field_validator("pool_labels", "gpu_model_label", mode="before")(comma_list)


class QueueSettings(_PolledKubernetes):
    """Queue quotas (``gpugap produce kubernetes-queues``)."""

    model_config = env_config("GPUGAP_K8S_QUEUES_")

    max_queues: int = Field(default=10_000, ge=1, description="objects read per kind and poll")
