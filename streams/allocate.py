"""Scheduler events -> per-node allocation events (``gpu.allocations.v1``), and partial gangs.

Pure functions (no I/O). A Slurm job becomes one allocation event per node that holds GPUs
(with the GPU indices Slurm gave on that node); a Kubernetes pod becomes a start when it is
bound (or first seen running) and an end when it terminates or is deleted. Allocation ids
are ``schemas.models.slurm_allocation_id`` / ``k8s_allocation_id`` (the warehouse's ids).

Partial gangs (``GangTracker``): pods of one gang (``gang_id``, ``gang_size``) where some hold
GPUs while others are still Pending. The alert opens at the event time the first pod of an
incomplete gang binds, and resolves when every pod is bound or none holds GPUs any more
(the gang was deleted or finished). State is a plain JSON-able dict keyed by gang.

Workload classes: the class an event carries wins, else groundfloor.classify's built-in rules
(configured rules are the Kubernetes producer's: it publishes the class they give).
"""

from __future__ import annotations

from gpugap.groundfloor.classify import Owner, classify_pod, classify_slurm
from gpugap.schemas.clock import HOUR_MS, HOUR_S, MINUTE_MS, SECOND_MS, at, ms, parse_utc
from gpugap.schemas.models import Alert, AllocationEvent, K8sPodEvent, SlurmJobEvent
from gpugap.schemas.types import (
    MAX_GPUS_PER_NODE,
    AlertKind,
    AlertState,
    LifecycleKind,
    PodEventKind,
    Scheduler,
    WorkloadClass,
    format_utc,
)
from gpugap.streams.state import Gang, GangAlert, GangsState

#: how long a finished gang is remembered, so its pods' late events raise nothing
DONE_RETAIN_MS = HOUR_MS
#: gangs watched at most per shard: a pod of one more is an allocation like any other, its
#: gang is not watched (counted: gangs_refused)
MAX_GANGS = 100_000


def from_slurm(ev: SlurmJobEvent) -> list[AllocationEvent]:
    """One allocation event per node of the job that holds GPUs.

    A job whose source knew how many GPUs it had but not which (sacct: a count in its TRES,
    no indices) still holds them: its count is spread over its nodes, with no indices, so the
    core allocates stand-in GPUs flagged ``no_samples`` (allocated, consumption unknown)."""
    cls = classify_slurm(
        interactive=ev.interactive,
        override=ev.workload_class,
        partition=ev.partition,
        account=ev.account,
        qos=ev.qos,
        user=ev.user,
        name=ev.job_name,
    )
    when = ev.start_time if ev.kind is LifecycleKind.START else ev.end_time
    held: list[tuple[str, int, tuple[int, ...] | None]] = [
        (n.node, len(n.gpu_indices), n.gpu_indices) for n in ev.nodes if n.gpu_indices
    ] or [(node, gpus, None) for node, gpus in _counted_only(ev)]
    return [
        AllocationEvent(
            event_id=f"{ev.event_id}/{node}",
            kind=ev.kind,
            time=when or ev.time,
            cluster=ev.cluster,
            node=node,
            scheduler=Scheduler.SLURM,
            allocation_id=ev.allocation_id,
            gpus=gpus,
            gpu_indices=indices,
            workload_class=cls,
            owner=ev.user,
            team=ev.account,
            name=ev.job_name,
            time_limit_s=ev.time_limit_s,
            partition=ev.partition,
            labels=slurm_labels(ev),
        )
        for node, gpus, indices in held
    ]


def _counted_only(ev: SlurmJobEvent) -> list[tuple[str, int]]:
    """(node, GPUs) of a job with a GPU count and no index on any node (sacct), the count
    split evenly over its nodes (the first nodes take the remainder); [] otherwise."""
    if not ev.nodes or ev.gpus_total == 0 or any(n.gpu_indices for n in ev.nodes):
        return []
    each, extra = divmod(ev.gpus_total, len(ev.nodes))
    split = [(n.node, each + (i < extra)) for i, n in enumerate(ev.nodes)]
    return [(node, min(gpus, MAX_GPUS_PER_NODE)) for node, gpus in split if gpus]


def slurm_labels(ev: SlurmJobEvent) -> dict[str, str]:
    """What the idle policy's rules may match of a job besides its fields."""
    pairs = (("slurm.account", ev.account), ("slurm.qos", ev.qos))
    return {k: v for k, v in pairs if v is not None}


def pod_class(ev: K8sPodEvent) -> WorkloadClass:
    if ev.workload_class is not None:
        return ev.workload_class
    chain = [Owner(ev.owner_kind, ev.owner_name or "")] if ev.owner_kind else []
    return classify_pod(ev.namespace, ev.name, labels={}, annotations={}, chain=chain)


def _unset_later_fields(ev: K8sPodEvent) -> set[str]:
    """The pod event's fields added after the checkpoint format was fixed, where unset."""
    return {name for name in ("created_time", "queue") if getattr(ev, name) is None}


def from_pod(ev: K8sPodEvent) -> list[AllocationEvent]:
    """Bound/running -> start, terminated/deleted -> end; pods that never held GPUs -> []."""
    if ev.node is None or ev.gpus == 0:
        return []
    started = ev.kind in (PodEventKind.BOUND, PodEventKind.RUNNING)
    return [
        AllocationEvent(
            event_id=ev.event_id,
            kind=LifecycleKind.START if started else LifecycleKind.END,
            time=ev.time,
            cluster=ev.cluster,
            node=ev.node,
            scheduler=Scheduler.KUBERNETES,
            allocation_id=ev.allocation_id,
            gpus=ev.gpus,
            workload_class=pod_class(ev),
            owner=ev.owner,
            team=ev.team,
            gang_id=ev.gang_id,
            gang_size=ev.gang_size,
            name=ev.name,
            namespace=ev.namespace,
            labels=ev.labels,
        )
    ]


class GangTracker:
    """Partial-gang alerts from pod events; ``state`` is JSON-able.

    A gang is partial while some but not all of its ``gang_size`` pods hold GPUs. The alert
    opens once a partial spell has lasted ``grace_ms`` of event time and the watermark (max
    event time seen - ``lateness_ms``) has passed that point, so siblings binding a few
    seconds apart, or reported a little late, raise nothing; ``opened_at`` is the event time
    the grace ran out. It resolves at the event time the gang is complete or holds nothing.
    A gang with no pod event for ``expiry_ms`` of event time and no open alert is forgotten
    (its pods' end events were lost, or it never bound): a later event starts it afresh.
    """

    def __init__(
        self,
        state: GangsState | None = None,
        *,
        grace_ms: int = 30_000,
        lateness_ms: int = 120_000,
        expiry_ms: int | None = None,
        max_gangs: int = MAX_GANGS,
    ) -> None:
        self.state: GangsState = (
            state if state is not None else {"gangs": {}, "done": {}, "max_ms": None}
        )
        self.grace_ms, self.lateness_ms = grace_ms, lateness_ms
        self.expiry_ms, self.max_gangs = expiry_ms, max_gangs
        #: the watermark before which no finished gang expires (not state: recomputed)
        self._expire_at: int | None = None
        #: gang -> the latest event time of its pods (not state: a restored gang's from its
        #: bound pods and first event), and the watermark the expiry last looked at
        self._seen: dict[str, int] = {}
        self._swept: int | None = None
        self.counts: dict[str, int] = {}  # gangs expired, refused (not state)

    def pod(self, ev: K8sPodEvent) -> list[Alert]:
        t = ms(ev.time)
        out = self.advance(t)  # first: spells that outlived their grace before this event
        if ev.gang_id is not None and ev.gang_size and ev.gang_size >= 2:
            out += self._apply(ev, ev.gang_size, t)
        return out

    def _apply(self, ev: K8sPodEvent, size: int, t: int) -> list[Alert]:
        key = f"{ev.cluster}/{ev.gang_id}"
        if key in self.state["done"]:
            return []
        if key not in self.state["gangs"] and len(self.state["gangs"]) >= self.max_gangs:
            self.counts["gangs_refused"] = self.counts.get("gangs_refused", 0) + 1
            return []
        if self.expiry_ms is not None:
            self._seen[key] = max(t, self._seen.get(key, t))
        g: Gang = self.state["gangs"].setdefault(
            key,
            {
                "bound": {},
                "ended": [],
                "events": [],
                "alert": None,
                "since": None,
                "size": size,
                # created_time and queue came later: left out when unknown, so that a
                # checkpoint of the same state is the same bytes as before them (the snapshot
                # topic compacts)
                "meta": ev.model_dump(mode="json", exclude=_unset_later_fields(ev) or None),
            },
        )
        if ev.event_id in g["events"]:
            return []
        g["events"].append(ev.event_id)
        if ev.kind in (PodEventKind.BOUND, PodEventKind.RUNNING):
            if ev.uid in g["ended"] or ev.node is None or ev.gpus == 0:
                return []
            g["bound"].setdefault(ev.uid, [t, ev.node, ev.gpus])
        else:
            g["bound"].pop(ev.uid, None)
            if ev.uid not in g["ended"]:
                g["ended"].append(ev.uid)
        n = len(g["bound"])
        partial = 0 < n < g["size"] and not g["ended"]
        out: list[Alert] = []
        if partial and g["since"] is None:
            g["since"] = t
        elif not partial:
            g["since"] = None
            alert = g["alert"]
            if alert is not None:
                out.append(self._alert(g, alert, AlertState.RESOLVED, t))
                g["alert"] = None
        if (not g["bound"] and g["ended"]) or n >= g["size"]:
            del self.state["gangs"][key]
            self._seen.pop(key, None)
            self.state["done"][key] = t
            if self._expire_at is not None:
                self._expire_at = min(self._expire_at, t + DONE_RETAIN_MS)
        return out

    def advance(self, t: int) -> list[Alert]:
        """Move the event-time clock: open alerts whose grace has run out."""
        s = self.state
        seen = s["max_ms"] = t if s["max_ms"] is None else max(s["max_ms"], t)
        wm = seen - self.lateness_ms
        out: list[Alert] = []
        for g in s["gangs"].values():
            since = g["since"]
            if since is not None and g["alert"] is None and since + self.grace_ms <= wm:
                gpus = sum(int(b[2]) for b in g["bound"].values())
                alert: GangAlert = {"opened": since + self.grace_ms, "since": since, "gpus": gpus}
                g["alert"] = alert
                out.append(self._alert(g, alert, AlertState.OPEN, since + self.grace_ms))
        if self._expire_at is None or self._expire_at < wm:  # not on every sample
            for key, done in list(s["done"].items()):
                if done + DONE_RETAIN_MS < wm:
                    del s["done"][key]
            self._expire_at = min(s["done"].values(), default=wm) + DONE_RETAIN_MS
        expiry = self.expiry_ms
        if expiry is not None and (self._swept is None or wm >= self._swept + MINUTE_MS):
            self._swept = wm
            for key in [k for k, g in s["gangs"].items() if g["alert"] is None]:
                if self._last(key, s["gangs"][key]) + expiry <= wm:
                    del s["gangs"][key]
                    self._seen.pop(key, None)
                    self.counts["gangs_expired"] = self.counts.get("gangs_expired", 0) + 1
        return out

    def _last(self, key: str, g: Gang) -> int:
        t = self._seen.get(key)
        if t is None:  # restored: its first event, or a pod bound since
            times = [ms(parse_utc(g["meta"]["time"]))] + [int(b[0]) for b in g["bound"].values()]
            t = self._seen[key] = max(times)
        return t

    def _alert(self, g: Gang, alert: GangAlert, state: AlertState, t: int) -> Alert:
        ev = K8sPodEvent.model_validate(g["meta"])
        opened = at(alert["opened"])
        nodes = sorted({str(b[1]) for b in g["bound"].values()})
        running = len(g["bound"])
        gpus = sum(int(b[2]) for b in g["bound"].values())
        held_gpu_ms = alert["gpus"] * max(0, t - alert["since"])
        return Alert(
            alert_id=f"partial_gang/{ev.cluster}/{ev.gang_id}/{format_utc(opened)}",
            kind=AlertKind.PARTIAL_GANG,
            state=state,
            time=at(t),
            opened_at=opened,
            resolved_at=at(t) if state is AlertState.RESOLVED else None,
            cluster=ev.cluster,
            scheduler=Scheduler.KUBERNETES,
            gang_id=ev.gang_id,
            owner=ev.owner,
            team=ev.team,
            workload_class=pod_class(ev),
            nodes=tuple(nodes),
            idle_gpu_hours=held_gpu_ms / SECOND_MS / HOUR_S,
            pending_pods=max(0, g["size"] - running),
            running_pods=running,
            message=f"{running} of {g['size']} pods of gang {ev.gang_id} hold {gpus} GPU(s) "
            "while the rest are Pending",
        )
