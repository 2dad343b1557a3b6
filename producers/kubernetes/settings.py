"""``GPUGAP_K8S_*``: the Kubernetes pod producer's settings."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, field_validator

from gpugap.groundfloor.classify import CLASS_LABEL, ClassRule
from gpugap.groundfloor.settings import CommaList, comma_list, env_config
from gpugap.producers.kubernetes.gpu_resources import GpuResourceSettings


class KubernetesSettings(GpuResourceSettings):
    """The Kubernetes pod producer (``gpugap produce kubernetes``)."""

    model_config = env_config("GPUGAP_K8S_")

    namespaces: CommaList = Field(default_factory=list, description="empty: all namespaces")
    kubeconfig: Path | None = Field(default=None, description="default: in-cluster, KUBECONFIG")
    context: str | None = None
    cluster: str | None = Field(default=None, description="cluster name (default GPUGAP_CLUSTER)")
    connect_timeout_s: float = Field(default=10.0, gt=0)
    request_timeout_s: float = Field(
        default=60.0, gt=0, description="read timeout: a connection silent this long is hung"
    )
    watch_timeout_s: int = Field(default=300, ge=1, description="server-side, jittered up to 2x")
    page_size: int = Field(default=500, ge=1, description="pods per list page")
    backoff_initial_s: float = Field(default=0.2, gt=0)
    backoff_max_s: float = Field(default=30.0, gt=0)
    owner_labels: CommaList = Field(
        default_factory=lambda: [
            "gpugap.io/owner",
            "owner",
            "user",
            "hub.jupyter.org/username",
            "notebooks.kubeflow.org/creator",
        ],
        description="labels (then annotations) naming the owner, pod first, then its owners",
    )
    team_labels: CommaList = Field(default_factory=lambda: ["gpugap.io/team", "team"])
    carry_labels: CommaList = Field(
        default_factory=lambda: ["gpugap.io/*"],
        description="pod labels (shell-style keys) carried on the pod's records, for the idle "
        "policy's rules (GPUGAP_IDLE_RULES labels); at most 32 a pod",
    )
    team_from_namespace: bool = Field(default=True, description="no team label: the namespace")
    class_label: str = CLASS_LABEL
    class_rules: list[ClassRule] = Field(default_factory=list, description="JSON list of rules")
    owner_cache_size: int = Field(default=10_000, ge=1)
    owner_cache_ttl_s: float = Field(default=600.0, gt=0)
    state_file: Path | None = Field(
        default=None, description="ledger of reported pods: a restart re-sends nothing"
    )

    _lists = field_validator(
        "namespaces", "owner_labels", "team_labels", "carry_labels", mode="before",
    )(comma_list)  # fmt: skip
