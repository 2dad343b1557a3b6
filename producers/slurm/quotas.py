"""``sacctmgr -P -n show qos|assoc`` -> one ``QueueQuota`` per QOS or association that caps GPUs.

Pure: text in, records out (quotas_producer.py runs the commands); tested on what a real
slurmdbd printed (tests/fixtures/slurm/quotas/).

Slurm has no "deserved share" beside its limits: a ``GrpTRES`` GPU limit is both what the
queue is entitled to and the most it may hold (``entitled_gpus = limit_gpus``). What it holds
is left out (``held_gpus`` None): gpugap counts it from the jobs' allocations. Each GPU TRES
is one record: ``gres/gpu=8`` -> resource ``gres/gpu``, ``gres/gpu:a100=2`` -> resource
``gres/gpu:a100``. A typed limit is a part of the untyped one, not in addition to it: where an
entity has both, only the untyped one is published (the warehouse sums an entity's records,
as it sums a Kueue queue's flavors, so the typed ones would count twice).

- a QOS: ``queue`` = its name, kind ``slurm_qos`` (QOS are slurmdbd-wide: no cluster column).
- an association: ``queue`` = its account, or ``account/user`` for a user's, kind
  ``slurm_association`` (the keys the warehouse joins a job's account and user on). A user's
  association limited to one partition names it in ``flavor`` (the slice of resources it
  covers, as a Kueue flavor does), so the queue still joins the user's jobs.

MaxTRESPerUser and other per-job or per-user caps are not entitlements: not read. An entity
without a GPU limit is not published.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from gpugap.producers.slurm.fields import ParseError, number
from gpugap.schemas.models import QueueQuota
from gpugap.schemas.types import QueueKind

QOS_FORMAT = "name,grptres"
ASSOC_FORMAT = "cluster,account,user,partition,grptres"

Bad = list[tuple[str, str]]


@dataclass(frozen=True)
class Limit:
    kind: QueueKind
    queue: str
    partition: str | None
    resource: str
    gpus: int


def gpu_limits(grptres: str) -> list[tuple[str, int]]:
    """``cpu=64,gres/gpu:a100=2`` -> [('gres/gpu:a100', 2)]; no GPU TRES -> []; an untyped
    ``gres/gpu`` limit alone where there is one (the typed ones are parts of it)."""
    out = []
    for item in grptres.split(","):
        key, _, value = item.partition("=")
        if key == "gres/gpu" or key.startswith("gres/gpu:"):
            n = number(value, key)
            if n is not None and n >= 0:  # -1: "no limit" where a tool prints it
                out.append((key, n))
    untyped = [(key, n) for key, n in out if key == "gres/gpu"]
    return untyped or out


def _rows(text: str) -> list[tuple[str, list[str]]]:
    return [(ln, ln.split("|")) for ln in text.split("\n") if ln.strip()]


def parse_qos(text: str) -> tuple[list[Limit], Bad]:
    """``sacctmgr -P -n show qos format=name,grptres``."""
    limits, bad = [], []
    for line, cols in _rows(text):
        if len(cols) < 2:
            bad.append((line, f"sacctmgr qos: {len(cols)} columns, not 2 (name|grptres)"))
            continue
        try:
            for resource, n in gpu_limits(cols[1]):
                limits.append(Limit(QueueKind.SLURM_QOS, cols[0], None, resource, n))
        except ParseError as exc:
            bad.append((line, f"sacctmgr qos {cols[0]}: {exc}"))
    return limits, bad


def parse_associations(text: str, cluster: str | None = None) -> tuple[list[Limit], Bad]:
    """``sacctmgr -P -n show assoc format=cluster,account,user,partition,grptres``;
    ``cluster``: keep only that Slurm cluster's (one slurmdbd may serve several)."""
    limits, bad = [], []
    for line, cols in _rows(text):
        if len(cols) < 5:
            bad.append((line, f"sacctmgr assoc: {len(cols)} columns, not 5"))
            continue
        slurm_cluster, account, user, partition, grptres = cols[:5]
        if cluster is not None and slurm_cluster != cluster:
            continue
        queue = f"{account}/{user}" if user else account
        try:
            for resource, n in gpu_limits(grptres):
                kind = QueueKind.SLURM_ASSOCIATION
                limits.append(Limit(kind, queue, partition or None, resource, n))
        except ParseError as exc:
            bad.append((line, f"sacctmgr assoc {queue}: {exc}"))
    return limits, bad


def queue_quota(limit: Limit, *, cluster: str, time: datetime, interval_s: float) -> QueueQuota:
    return QueueQuota(
        cluster=cluster,
        time=time,
        interval_s=interval_s,
        kind=limit.kind,
        queue=limit.queue,
        flavor=limit.partition,
        resource=limit.resource,
        entitled_gpus=limit.gpus,
        limit_gpus=limit.gpus,
        held_gpus=None,
    )
