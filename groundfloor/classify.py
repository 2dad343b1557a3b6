"""Workload class, owner/team and gang: the rules of DESIGN.md, shared by producers and streams.

Pure functions over plain data (labels, annotations, the owner chain a producer resolved):
no I/O, no client objects, so the Kubernetes producer, the Slurm side and the stream step all
classify the same way.

Workload class, first match wins:
1. the override label or annotation (``gpugap.io/workload-class``) on the pod, then on its owners;
2. configured rules (``GPUGAP_K8S_CLASS_RULES``), in order;
3. notebook pods by their labels (Kubeflow ``notebook-name``, JupyterHub single-user servers);
4. the owner chain, top owner first: Job/CronJob and training operators -> batch,
   Deployment/StatefulSet/ReplicaSet/KServe -> service, Notebook -> interactive;
5. a bare pod (no controller) -> interactive (someone's hand-made pod); anything else -> batch.
Slurm: ``sbatch`` -> batch, ``salloc``/``srun --pty`` (interactive) -> interactive, then rules.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from fnmatch import fnmatchcase

from pydantic import BaseModel, ConfigDict

from gpugap.schemas.types import Scheduler, WorkloadClass

CLASS_LABEL = "gpugap.io/workload-class"
GANG_LABEL = "gpugap.io/gang"
GANG_SIZE_LABEL = "gpugap.io/gang-size"

BATCH_KINDS = frozenset(
    {
        "Job",  # batch/v1 and Volcano (batch.volcano.sh) alike
        "CronJob",
        "PyTorchJob",
        "TFJob",
        "MPIJob",
        "XGBoostJob",
        "PaddleJob",
        "JAXJob",
        "TrainJob",
        "JobSet",
        "RayJob",
        "Workflow",
        "SparkApplication",
    }
)
SERVICE_KINDS = frozenset(
    {
        "Deployment",
        "StatefulSet",
        "ReplicaSet",
        "ReplicationController",
        "DaemonSet",
        "InferenceService",
        "LeaderWorkerSet",
        "RayService",
    }
)
INTERACTIVE_KINDS = frozenset({"Notebook"})
#: labels (key, value or None for any value) that mark a notebook server pod
INTERACTIVE_LABELS: tuple[tuple[str, str | None], ...] = (
    ("notebook-name", None),  # Kubeflow Notebook controller
    ("component", "singleuser-server"),  # JupyterHub (zero-to-jupyterhub, KubeSpawner)
    ("app.kubernetes.io/component", "singleuser-server"),
)
TRAINING_OPERATOR_KINDS = frozenset(
    {"PyTorchJob", "TFJob", "MPIJob", "XGBoostJob", "PaddleJob", "JAXJob"}
)


@dataclass(frozen=True)
class Owner:
    """One link of a pod's owner chain (nearest first), as far as the producer resolved it."""

    kind: str
    name: str
    api_version: str = ""
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    #: GPU pods this owner expects when all of it runs (from its spec), if known
    gpu_pods: int | None = None


class ClassRule(BaseModel):
    """A configured classification rule: every field given must match (globs allowed).

    JSON in the environment, e.g. ``GPUGAP_K8S_CLASS_RULES='[{"namespace": "research-*",
    "owner_kind": "RayCluster", "workload_class": "interactive"}]'``.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    workload_class: WorkloadClass
    scheduler: Scheduler | None = None
    namespace: str | None = None
    name: str | None = None
    owner_kind: str | None = None
    owner_name: str | None = None
    label: str | None = None  # "key" (present) or "key=value" (value may be a glob)
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    user: str | None = None

    def matches(self, facts: Mapping[str, str | None], labels: Mapping[str, str]) -> bool:
        for attr in ("scheduler", "namespace", "name", "owner_kind", "owner_name"):
            if not _glob(getattr(self, attr), facts.get(attr)):
                return False
        for attr in ("partition", "account", "qos", "user"):
            if not _glob(getattr(self, attr), facts.get(attr)):
                return False
        if self.label is not None:
            key, eq, value = self.label.partition("=")
            if key not in labels or (eq and not fnmatchcase(labels[key], value)):
                return False
        return True


def _glob(pattern: str | None, value: str | None) -> bool:
    return pattern is None or (value is not None and fnmatchcase(value, pattern))


def _valid_class(value: str | None) -> WorkloadClass | None:
    try:
        return WorkloadClass(value.strip().lower()) if value else None
    except ValueError:
        return None


def _lookup(key: str, *maps: Mapping[str, str]) -> str | None:
    for m in maps:
        value = m.get(key)
        if value:
            return value
    return None


def classify_pod(
    namespace: str,
    name: str,
    *,
    labels: Mapping[str, str],
    annotations: Mapping[str, str],
    chain: Sequence[Owner],
    rules: Sequence[ClassRule] = (),
    class_label: str = CLASS_LABEL,
) -> WorkloadClass:
    """The workload class of a Kubernetes pod (see the module docstring for the order)."""
    maps: list[Mapping[str, str]] = [labels, annotations]
    for owner in chain:
        maps += [owner.labels, owner.annotations]
    override = _valid_class(_lookup(class_label, *maps))
    if override is not None:
        return override
    top = chain[-1] if chain else None
    facts = {
        "scheduler": Scheduler.KUBERNETES.value,
        "namespace": namespace,
        "name": name,
        "owner_kind": top.kind if top else None,
        "owner_name": top.name if top else None,
    }
    for rule in rules:
        if rule.matches(facts, labels):
            return rule.workload_class
    for key, value in INTERACTIVE_LABELS:
        if key in labels and (value is None or labels[key] == value):
            return WorkloadClass.INTERACTIVE
    for owner in reversed(chain):  # the top owner says what the workload is
        if owner.kind in INTERACTIVE_KINDS:
            return WorkloadClass.INTERACTIVE
        if owner.kind in BATCH_KINDS:
            return WorkloadClass.BATCH
        if owner.kind in SERVICE_KINDS:
            return WorkloadClass.SERVICE
    return WorkloadClass.INTERACTIVE if not chain else WorkloadClass.BATCH


def classify_slurm(
    *,
    interactive: bool,
    override: WorkloadClass | None = None,
    rules: Sequence[ClassRule] = (),
    partition: str | None = None,
    account: str | None = None,
    qos: str | None = None,
    user: str | None = None,
    name: str | None = None,
) -> WorkloadClass:
    """Slurm: an explicit class wins, then rules, then salloc/srun --pty -> interactive."""
    if override is not None:
        return override
    facts = {
        "scheduler": Scheduler.SLURM.value,
        "partition": partition,
        "account": account,
        "qos": qos,
        "user": user,
        "name": name,
    }
    for rule in rules:
        if rule.matches(facts, {}):
            return rule.workload_class
    return WorkloadClass.INTERACTIVE if interactive else WorkloadClass.BATCH


def owner_and_team(
    namespace: str,
    *,
    labels: Mapping[str, str],
    annotations: Mapping[str, str],
    chain: Sequence[Owner],
    owner_keys: Sequence[str],
    team_keys: Sequence[str],
    team_from_namespace: bool = True,
) -> tuple[str | None, str | None]:
    """Owner and team from the first configured key found on the pod, then its owners."""
    maps: list[Mapping[str, str]] = [labels, annotations]
    for link in chain:
        maps += [link.labels, link.annotations]
    owner = next((v for k in owner_keys if (v := _lookup(k, *maps))), None)
    team = next((v for k in team_keys if (v := _lookup(k, *maps))), None)
    if team is None and team_from_namespace:
        team = namespace
    return owner, team


def _int(value: str | None) -> int | None:
    try:
        n = int(value) if value is not None else None
    except ValueError:
        return None
    return n if n is not None and n >= 0 else None


def _owner(chain: Sequence[Owner], kinds: frozenset[str] | set[str]) -> Owner | None:
    return next((o for o in chain if o.kind in kinds), None)


def gang_of(
    namespace: str,
    labels: Mapping[str, str],
    annotations: Mapping[str, str],
    chain: Sequence[Owner],
) -> tuple[str | None, int | None]:
    """(gang id, expected GPU pods in the gang) from the labels the known gang schedulers and
    operators put on pods; the size comes from a label when there is one, else from the owner's
    spec (counting only replicas that request GPUs). Ids are ``<namespace>/<kind>/<name>``."""
    both = {**annotations, **labels}
    if gang := both.get(GANG_LABEL):
        return f"{namespace}/{gang}", _int(both.get(GANG_SIZE_LABEL))
    # LeaderWorkerSet: one gang per group (a leader and its workers)
    if (lws := both.get("leaderworkerset.sigs.k8s.io/name")) is not None:
        index = both.get("leaderworkerset.sigs.k8s.io/group-index", "0")
        size = _int(both.get("leaderworkerset.sigs.k8s.io/size"))
        return f"{namespace}/leaderworkerset/{lws}/{index}", size
    # JobSet: every Job of the set runs together
    if (jobset := both.get("jobset.sigs.k8s.io/jobset-name")) is not None:
        owner = _owner(chain, {"JobSet"})
        return f"{namespace}/jobset/{jobset}", owner.gpu_pods if owner else None
    # Kubeflow training operator (v1.7+ labels; older ones: group-name/job-name)
    job = both.get("training.kubeflow.org/job-name")
    if job is None and both.get("group-name") == "kubeflow.org":
        job = both.get("job-name")
    if job is not None:
        owner = _owner(chain, TRAINING_OPERATOR_KINDS)
        operator = both.get("training.kubeflow.org/operator-name", "")
        kind = owner.kind if owner else operator.removesuffix("-controller") or "trainingjob"
        return f"{namespace}/{kind.lower()}/{job}", owner.gpu_pods if owner else None
    # Volcano Job (its PodGroup is the gang)
    if (vcjob := both.get("volcano.sh/job-name")) is not None:
        owner = _owner(chain, {"Job"})
        volcano = owner is not None and owner.api_version.startswith("batch.volcano.sh")
        size = owner.gpu_pods if owner is not None and volcano else None
        return f"{namespace}/volcano/{vcjob}", size
    # Kueue plain-pod groups
    if (group := both.get("kueue.x-k8s.io/pod-group-name")) is not None:
        return f"{namespace}/kueue/{group}", _int(both.get("kueue.x-k8s.io/pod-group-total-count"))
    # PodGroups of other gang schedulers (Volcano annotation, scheduler-plugins coscheduling)
    for key in ("scheduling.k8s.io/group-name", "scheduling.x-k8s.io/pod-group"):
        if (pg := both.get(key)) is not None:
            return f"{namespace}/podgroup/{pg}", None
    # Indexed Jobs (and Kueue-admitted Jobs) with parallelism > 1 run as one gang
    job_owner = _owner(chain, {"Job"})
    if job_owner is not None and job_owner.api_version.startswith("batch/"):
        indexed = "batch.kubernetes.io/job-completion-index" in both
        kueue = "kueue.x-k8s.io/queue-name" in {**both, **job_owner.labels}
        if (indexed or kueue) and (job_owner.gpu_pods or 0) > 1:
            return f"{namespace}/job/{job_owner.name}", job_owner.gpu_pods
    return None, None
