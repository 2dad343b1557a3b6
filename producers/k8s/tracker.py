"""The per-pod state machine: pod objects in, K8sPodEvents out, only when something that
matters for GPU accounting changed.

Level-triggered: every object version is read for the transitions it shows (bound to a node,
running, terminated, deleted), and each one not emitted yet is emitted, in that order. So a
pod seen for the first time after it finished (a relist after 410 Gone, a restarted producer)
still yields its bound/running/terminated events, nothing is emitted twice, and nothing is
emitted that the object does not show. Event ids are ``k8s/<cluster>/<uid>/<kind>`` and event
times come from the object (PodScheduled, container start/finish, deletion request), so a
restarted producer re-emits the same ids with the same times: downstream dedupes by id.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from schemas import K8sPodEvent, utc_now
from schemas.types import EventSource, PodEventKind, PodPhase, TerminationReason, WorkloadClass

from . import resources as r

log = logging.getLogger(__name__)

ORDER = (PodEventKind.BOUND, PodEventKind.RUNNING, PodEventKind.TERMINATED, PodEventKind.DELETED)
BIT = {kind: 1 << i for i, kind in enumerate(ORDER)}
PHASES = {p.value: p for p in PodPhase}


@dataclass(frozen=True)
class Enrichment:
    """What a pod's owners and labels say about it; resolved once per pod."""

    owner_kind: str | None = None
    owner_name: str | None = None
    workload_class: WorkloadClass | None = None
    owner: str | None = None
    team: str | None = None
    gang_id: str | None = None
    gang_size: int | None = None


@dataclass(slots=True)
class PodState:
    uid: str
    namespace: str
    name: str
    gpus: int
    gpu_resource: str | None
    node: str | None = None
    phase: PodPhase = PodPhase.PENDING
    emitted: int = 0  # BIT flags of the kinds emitted (no container: tens of thousands live)
    reason: TerminationReason | None = None
    deletion_requested: datetime | None = None
    ended: datetime | None = None
    enrichment: Enrichment | None = None
    resource_version: str | None = None

    def has(self, kind: PodEventKind) -> bool:
        return bool(self.emitted & BIT[kind])

    def mark(self, kind: PodEventKind) -> None:
        self.emitted |= BIT[kind]


Enricher = Callable[[Mapping[str, Any]], Enrichment]


class Tracker:
    """Pods of one watch (a namespace, or all of them): emits events as objects arrive."""

    def __init__(
        self,
        cluster: str,
        rule: r.GpuRule,
        enrich: Enricher,
        now: Callable[[], datetime] = utc_now,
    ) -> None:
        self.cluster, self.rule, self.enrich, self.now = cluster, rule, enrich, now
        self.pods: dict[str, PodState] = {}
        self._shared: dict[Enrichment, Enrichment] = {}
        self._listed: set[str] | None = None

    # --- restart ledger -------------------------------------------------------------------
    def seed(self, entries: Iterable[tuple[Iterable[PodEventKind], K8sPodEvent]]) -> None:
        """Pods a previous run reported: the kinds it emitted and its last event (ledger.py)."""
        for kinds, e in entries:
            st = PodState(e.uid, e.namespace, e.name, e.gpus, e.gpu_resource, e.node, e.phase)
            for kind in kinds:
                st.mark(kind)
            st.reason = e.reason
            st.ended = e.time if e.kind is PodEventKind.TERMINATED else None
            st.resource_version = e.resource_version
            st.enrichment = Enrichment(
                e.owner_kind, e.owner_name, e.workload_class, e.owner, e.team, e.gang_id,
                e.gang_size,
            )  # fmt: skip
            self.pods[e.uid] = st

    # --- watch events ---------------------------------------------------------------------
    def observe(self, kind: str, pod: Mapping[str, Any]) -> list[K8sPodEvent]:
        """One watch event (ADDED, MODIFIED, DELETED) or one listed object (ADDED)."""
        meta = pod.get("metadata") or {}
        uid = meta.get("uid")
        if not uid:
            return []
        if self._listed is not None:
            self._listed.add(uid)
        st = self.pods.get(uid)
        if st is None:
            if kind == "DELETED":
                return []
            gpus, resource = r.gpu_summary(self.rule.pod_gpus(pod.get("spec") or {}))
            if not gpus:
                return []  # not a GPU pod: never tracked
            ns = meta.get("namespace", "")
            st = self.pods[uid] = PodState(uid, ns, meta["name"], gpus, resource)
        return self._advance(st, pod, deleted=kind == "DELETED")

    def _advance(self, st: PodState, pod: Mapping[str, Any], *, deleted: bool) -> list[K8sPodEvent]:
        meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
        status = pod.get("status") or {}
        st.node = spec.get("nodeName") or st.node
        st.phase = PHASES.get(status.get("phase", ""), PodPhase.UNKNOWN)
        st.resource_version = meta.get("resourceVersion")
        st.deletion_requested = r.deletion_requested(pod) or st.deletion_requested
        out: list[K8sPodEvent] = []
        if st.node is not None:
            if not st.has(PodEventKind.BOUND):
                out.append(self._event(st, PodEventKind.BOUND, r.bound_time(pod), pod))
            if not st.has(PodEventKind.RUNNING) and r.has_run(pod):
                out.append(self._event(st, PodEventKind.RUNNING, r.started_time(pod), pod))
            terminal = st.phase in (PodPhase.SUCCEEDED, PodPhase.FAILED)
            if not st.has(PodEventKind.TERMINATED) and terminal:
                st.reason, st.ended = r.termination(pod)
                out.append(self._event(st, PodEventKind.TERMINATED, st.ended, pod))
        if deleted:
            self.pods.pop(st.uid, None)
            if st.has(PodEventKind.BOUND):
                if st.reason is None:
                    st.reason = r.disruption_reason(pod) or TerminationReason.DELETED
                out.append(self._event(st, PodEventKind.DELETED, self._deleted_at(st), pod))
        return out

    def _deleted_at(self, st: PodState) -> datetime | None:
        """Gone no earlier than its termination and its deletion request (else: now)."""
        times = [t for t in (st.deletion_requested, st.ended) if t is not None]
        return max(times) if times else None

    # --- relists (start, after 410 Gone) --------------------------------------------------
    def begin_list(self) -> None:
        self._listed = set()

    def end_list(self) -> list[K8sPodEvent]:
        """Pods we knew that the new list lacks were deleted meanwhile: say so."""
        listed, self._listed = self._listed or set(), None
        out: list[K8sPodEvent] = []
        for uid in [u for u in self.pods if u not in listed]:
            st = self.pods.pop(uid)
            if st.has(PodEventKind.BOUND) and not st.has(PodEventKind.DELETED):
                st.reason = st.reason or TerminationReason.DELETED
                out.append(self._event(st, PodEventKind.DELETED, self._deleted_at(st), None))
        return out

    # --- records --------------------------------------------------------------------------
    def _event(
        self,
        st: PodState,
        kind: PodEventKind,
        when: datetime | None,
        pod: Mapping[str, Any] | None,
    ) -> K8sPodEvent:
        if st.enrichment is None:
            e = self.enrich(pod) if pod is not None else Enrichment()
            st.enrichment = self._shared.setdefault(e, e)  # pods of one owner share theirs
        e = st.enrichment
        st.mark(kind)
        return K8sPodEvent(
            event_id=f"k8s/{self.cluster}/{st.uid}/{kind.value}",
            kind=kind,
            time=when or self.now(),
            source=EventSource.WATCH,
            cluster=self.cluster,
            uid=st.uid,
            namespace=st.namespace,
            name=st.name,
            node=st.node,
            phase=st.phase,
            gpus=st.gpus,
            gpu_resource=st.gpu_resource,
            reason=st.reason if kind in (PodEventKind.TERMINATED, PodEventKind.DELETED) else None,
            owner_kind=e.owner_kind,
            owner_name=e.owner_name,
            workload_class=e.workload_class,
            owner=e.owner,
            team=e.team,
            gang_id=e.gang_id,
            gang_size=e.gang_size,
            resource_version=st.resource_version,
        )
