"""The idle policy of one allocation (pure): its class's threshold, minutes and reminders, a
rule's over them, and whether it is exempt.

One source of truth: the detector judges idle minutes by it, the rows the stream emits carry
it (``GpuMinute.idle_threshold`` / ``idle_after_minutes``, which the warehouse's rollups and
``v_idle_now`` read), and each idle-GPU alert carries it (``Alert.policy``, which the notifier
reminds by). Rules are matched in order, the first match wins, like an Alertmanager route
without ``continue``; what a rule leaves unset stays the class's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from typing import Any

from gpugap.schemas.clock import MINUTE_MS
from gpugap.schemas.models import IdlePolicy
from gpugap.streams.state import AllocState

#: policies remembered before the memo starts again (bounded)
MEMO_LIMIT = 10_000


@dataclass(frozen=True)
class Match:
    """Shell-style patterns (``dev-*``) on an allocation's fields; every one given must match.
    ``labels``: each key must be among the allocation's labels with a value that matches."""

    cluster: str | None = None
    scheduler: str | None = None
    workload_class: str | None = None
    namespace: str | None = None
    partition: str | None = None
    owner: str | None = None
    team: str | None = None
    name: str | None = None
    labels: tuple[tuple[str, str], ...] = ()

    def matches(self, alloc: AllocState) -> bool:
        fields = (
            (self.cluster, alloc["cluster"]),
            (self.scheduler, alloc["scheduler"]),
            (self.workload_class, alloc["cls"]),
            (self.namespace, alloc["namespace"]),
            (self.partition, alloc.get("partition")),
            (self.owner, alloc["owner"]),
            (self.team, alloc["team"]),
            (self.name, alloc["name"]),
        )
        for pattern, value in fields:
            if pattern is not None and (value is None or not fnmatchcase(value, pattern)):
                return False
        have = alloc.get("labels") or {}
        return all(k in have and fnmatchcase(have[k], p) for k, p in self.labels)


@dataclass(frozen=True)
class Exemption(Match):
    """Allocations whose idle GPUs open no alert; with ``younger_than_minutes`` only while the
    allocation is younger than that (a short interactive session). The minutes still count
    as idle in the warehouse: the waste is real, nobody is told of it."""

    younger_than_minutes: int | None = None

    def covers(self, alloc: AllocState, now_ms: int) -> bool:
        if not self.matches(alloc):
            return False
        if self.younger_than_minutes is not None:
            start = alloc["start"]
            return start is not None and now_ms - start < self.younger_than_minutes * MINUTE_MS
        return True


@dataclass(frozen=True)
class Rule(Match):
    """What a matching allocation is judged by instead of its class's values (None: keep)."""

    id: str = ""
    threshold: float | None = None
    minutes: int | None = None
    remind_minutes: tuple[int, ...] | None = None


@dataclass(frozen=True)
class IdleConfig:
    threshold: float = 0.05
    minutes: int = 10
    per_class_threshold: dict[str, float] = field(default_factory=dict)
    per_class_minutes: dict[str, int] = field(default_factory=dict)
    update_every: int = 5  # minutes between update records of an open alert
    exempt: tuple[Exemption, ...] = ()
    remind_minutes: tuple[int, ...] = ()
    per_class_remind: dict[str, tuple[int, ...]] = field(default_factory=dict)
    rules: tuple[Rule, ...] = ()
    #: id() of an allocation's state -> (that state, its policy): the state object itself,
    #: held so its id() is not reused while remembered (not state: rebuilt after a restore)
    _memo: dict[int, tuple[AllocState, IdlePolicy]] = field(
        default_factory=dict, compare=False, repr=False
    )

    def exempted(self, alloc: AllocState | None, now_ms: int) -> bool:
        return alloc is not None and any(e.covers(alloc, now_ms) for e in self.exempt)

    def for_class(self, cls: str | None) -> tuple[float, int]:
        key = cls or ""
        return (
            self.per_class_threshold.get(key, self.threshold),
            self.per_class_minutes.get(key, self.minutes),
        )

    def for_alloc(self, alloc: AllocState | None) -> IdlePolicy:
        """The policy an allocation is judged by (its class's with no allocation known)."""
        if alloc is None:
            return self._policy(None, None)
        seen = self._memo.get(id(alloc))
        if seen is not None and seen[0] is alloc:
            return seen[1]
        rule = next((r for r in self.rules if r.matches(alloc)), None)
        got = self._policy(alloc["cls"], rule)
        if len(self._memo) >= MEMO_LIMIT:
            self._memo.clear()
        self._memo[id(alloc)] = (alloc, got)
        return got

    def _policy(self, cls: str | None, rule: Rule | None) -> IdlePolicy:
        thr, minutes = self.for_class(cls)
        remind = self.per_class_remind.get(cls or "", self.remind_minutes)
        if rule is not None:
            thr = rule.threshold if rule.threshold is not None else thr
            minutes = rule.minutes if rule.minutes is not None else minutes
            remind = rule.remind_minutes if rule.remind_minutes is not None else remind
        return IdlePolicy(
            threshold=thr,
            minutes=minutes,
            remind_minutes=tuple(sorted(set(remind))),
            rule=rule.id if rule is not None else None,
        )


def match_fields(spec: dict[str, Any]) -> dict[str, Any]:
    """A settings model's dump as Match keyword arguments (labels as sorted pairs)."""
    out = {k: v for k, v in spec.items() if k in Match.__dataclass_fields__}
    out["labels"] = tuple(sorted((spec.get("labels") or {}).items()))
    return out
