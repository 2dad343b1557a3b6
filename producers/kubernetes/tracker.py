"""The per-pod state machine: pod objects in, K8sPodEvents out, only when something that
matters for GPU accounting changed.

Level-triggered: every object version is read for the transitions it shows (bound to a node,
running, terminated, deleted), and each one not emitted yet is emitted, in that order. So a
pod seen for the first time after it finished (a relist after 410 Gone, a restarted producer)
still yields its bound/running/terminated events, nothing is emitted twice, and nothing is
emitted that the object does not show. Event ids are ``k8s/<cluster>/<uid>/<kind>`` and event
times come from the object (PodScheduled, container start/finish, deletion request), so a
restarted producer re-emits the same ids with the same times: downstream dedupes by id.

One pod's object never stops the others (``observe``): values over the schema's bounds are
truncated (``bounds.py``); an object version that still cannot become records is a dead
letter (``take_dead``) and nothing of it is emitted. A pod refused before anything of it was
reported is left alone from then on (one dead letter per pod, however often it changes); one
already reported is tried again at its next change, so that its end can still be reported.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from gpugap.producers.kubernetes import bounds, resources
from gpugap.schemas import DeadLetter, K8sPodEvent, utc_now
from gpugap.schemas.types import (
    MAX_GPUS_PER_NODE,
    EventSource,
    PodEventKind,
    PodPhase,
    TerminationReason,
    WorkloadClass,
)

log = logging.getLogger(__name__)

ORDER = (PodEventKind.BOUND, PodEventKind.RUNNING, PodEventKind.TERMINATED, PodEventKind.DELETED)
BIT = {kind: 1 << i for i, kind in enumerate(ORDER)}
PHASES = {p.value: p for p in PodPhase}
#: distinct enrichments kept for sharing between pods (a cache: clearing it loses nothing)
SHARED_MAX = 10_000


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
    #: the carried labels (GPUGAP_K8S_CARRY_LABELS), sorted (key, value) pairs
    labels: tuple[tuple[str, str], ...] = ()
    #: its queue manager's queue (queues.pod_queue: already a valid Name or None)
    queue: str | None = None

    def bounded(self) -> Enrichment:
        """Within the schema's bounds: long values truncated with a marker (``bounds.fit``),
        a gang size no gang has dropped. Kept so in the tracker, too."""
        longest = max(
            len(self.owner_kind or ""), len(self.owner_name or ""), len(self.owner or ""),
            len(self.team or ""), len(self.gang_id or ""),
        )  # fmt: skip
        if longest <= bounds.SHORTEST and bounds.gang_size(self.gang_size) == self.gang_size:
            return self  # nearly every pod: no copy
        return dataclasses.replace(
            self,
            owner_kind=bounds.fit("owner_kind", self.owner_kind),
            owner_name=bounds.fit("owner_name", self.owner_name),
            owner=bounds.fit("owner", self.owner),
            team=bounds.fit("team", self.team),
            gang_id=bounds.fit("gang_id", self.gang_id),
            gang_size=bounds.gang_size(self.gang_size),
        )


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
    created: datetime | None = None  # metadata.creationTimestamp: the wait for a node starts
    rejected: bool = False  # dead-lettered before anything was reported: ignored from now on

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
        rule: resources.GpuRule,
        enrich: Enricher,
        now: Callable[[], datetime] = utc_now,
    ) -> None:
        self.cluster, self.rule, self.enrich, self.now = cluster, rule, enrich, now
        self.pods: dict[str, PodState] = {}
        self._shared: dict[Enrichment, Enrichment] = {}
        self._listed: set[str] | None = None
        self._dead: list[DeadLetter] = []
        self.rejected = 0  # object versions (and unreadable watch events) dead-lettered

    def take_dead(self) -> list[DeadLetter]:
        """Dead letters made since the last call (the watcher hands them over with records)."""
        dead, self._dead = self._dead, []
        return dead

    def reject(
        self,
        what: str,
        exc: BaseException,
        *,
        pod: object = None,
        raw: bytes | None = None,
        uid: object = None,
    ) -> None:
        """Dead-letter what could not be read or published; the watch goes on."""
        kind, reason = bounds.why(exc)
        log.warning("%s: dead-lettered (%s): %s", what, kind.value, bounds.clip(reason, 300))
        self.rejected += 1
        dead = bounds.dead_letter(self.cluster, what, kind, reason, pod=pod, raw=raw, uid=uid)
        self._dead.append(dead)

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
            st.created = e.created_time
            st.enrichment = Enrichment(
                e.owner_kind, e.owner_name, e.workload_class, e.owner, e.team, e.gang_id,
                e.gang_size, tuple(sorted(e.labels.items())), e.queue,
            )  # fmt: skip
            self.pods[e.uid] = st

    # --- watch events ---------------------------------------------------------------------
    def observe(self, kind: str, pod: Mapping[str, Any]) -> list[K8sPodEvent]:
        """One watch event (ADDED, MODIFIED, DELETED) or one listed object (ADDED): its
        records; or none, and a dead letter (see the module docstring)."""
        meta = pod.get("metadata") if isinstance(pod, Mapping) else None
        if not isinstance(meta, Mapping) or not isinstance(uid := meta.get("uid"), str) or not uid:
            return []  # nothing to key it by (the API server always sets it)
        if self._listed is not None:
            self._listed.add(uid)
        st = self.pods.get(uid)
        if st is not None and st.rejected:
            if kind == "DELETED":
                del self.pods[uid]
            return []
        emitted = st.emitted if st is not None else 0
        try:
            if st is None:
                if kind == "DELETED":
                    return []
                st = self._track(uid, meta, pod)
                if st is None:
                    return []  # not a GPU pod: never tracked
            return self._advance(st, pod, deleted=kind == "DELETED")
        except Exception as exc:  # this pod's object only: every other pod goes on
            ns, name = bounds.clip(meta.get("namespace")), bounds.clip(meta.get("name"))
            self.reject(f"pod {ns}/{name} (uid {bounds.clip(uid)})", exc, pod=pod, uid=uid)
            if st is None:  # refused on sight: remembered, so that its changes say nothing
                st = self.pods[uid] = PodState(uid, "", "", 0, None)
            st.emitted = emitted  # nothing of this version was emitted, so none of it is marked
            st.rejected = not st.has(PodEventKind.BOUND)
            if kind == "DELETED":
                self.pods.pop(uid, None)
            return []

    def _track(self, uid: str, meta: Mapping[str, Any], pod: Mapping[str, Any]) -> PodState | None:
        gpus, resource = resources.gpu_summary(self.rule.pod_gpus(pod.get("spec") or {}))
        if not gpus:
            return None
        if gpus > MAX_GPUS_PER_NODE:  # a pod runs on one node: not a number to truncate
            raise bounds.Rejected(
                f"{gpus} GPUs requested, more than one node has ({MAX_GPUS_PER_NODE}, "
                "gpugap.schemas.types.MAX_GPUS_PER_NODE)"
            )
        ns = meta.get("namespace", "")
        st = PodState(uid, ns, meta["name"], gpus, bounds.fit("gpu_resource", resource))
        self.pods[uid] = st
        return st

    def _advance(self, st: PodState, pod: Mapping[str, Any], *, deleted: bool) -> list[K8sPodEvent]:
        meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
        status = pod.get("status") or {}
        st.node = spec.get("nodeName") or st.node
        st.phase = PHASES.get(status.get("phase", ""), PodPhase.UNKNOWN)
        st.resource_version = meta.get("resourceVersion")
        st.created = st.created or resources.parse_time(meta.get("creationTimestamp"))
        st.deletion_requested = resources.deletion_requested(pod) or st.deletion_requested
        out: list[K8sPodEvent] = []
        if st.node is not None:
            if not st.has(PodEventKind.BOUND):
                out.append(self._event(st, PodEventKind.BOUND, resources.bound_time(pod), pod))
            if not st.has(PodEventKind.RUNNING) and resources.has_run(pod):
                out.append(self._event(st, PodEventKind.RUNNING, resources.started_time(pod), pod))
            terminal = st.phase in (PodPhase.SUCCEEDED, PodPhase.FAILED)
            if not st.has(PodEventKind.TERMINATED) and terminal:
                st.reason, st.ended = resources.termination(pod)
                out.append(self._event(st, PodEventKind.TERMINATED, st.ended, pod))
        if deleted:
            self.pods.pop(st.uid, None)
            if st.has(PodEventKind.BOUND):
                if st.reason is None:
                    st.reason = resources.disruption_reason(pod) or TerminationReason.DELETED
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
            e = self.enrich(pod).bounded() if pod is not None else Enrichment()
            if len(self._shared) >= SHARED_MAX:
                self._shared.clear()
            st.enrichment = self._shared.setdefault(e, e)  # pods of one owner share theirs
        e = st.enrichment
        event = K8sPodEvent(
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
            created_time=st.created,
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
            queue=e.queue,
            resource_version=st.resource_version,
            labels=dict(e.labels),
        )
        st.mark(kind)  # once the record exists: one that could not be made is not taken as sent
        return event
