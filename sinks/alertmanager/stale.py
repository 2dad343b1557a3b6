"""Resolves that must outlive a stale POST (pure bookkeeping, no I/O).

A POST of an active alert that got no answer (timed out, connection dropped) may still be
handled by Alertmanager later, after the resolve, and its merge keeps the later ``endsAt``
(v0.35 ``provider/mem/mem.go``, ``alert/alert.go``): the alert would fire again and end at the
wrong time. So an accepted end (a resolve, or the end of an alert's old labels) of an alert
with such a POST behind it is kept and re-posted, the same object, until that POST's
``endsAt`` has passed: 4 re-send intervals and the timeout after it was sent. Both maps are
bounded, the oldest forgotten first.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)

#: at most this many alerts tracked for an unanswered POST, and as many ends re-posted
MAX_TRACKED = 10_000
#: the longest wait between re-posts of an end (shorter than a re-send interval: the alert
#: fires again from when a stale POST is handled until the next re-post)
REPOST_S = 5.0


def labels_key(obj: dict[str, Any]) -> str:
    """What Alertmanager tells an alert by: its labels."""
    return json.dumps(obj["labels"], sort_keys=True)


@dataclass
class Ended:
    """An accepted end re-posted as it was until no stale POST can be handled after it."""

    obj: dict[str, Any]  # the postable alert, its endsAt fixed
    until: float  # loop time: re-post no more after this
    due: float  # loop time of the next re-post


class StalePosts:
    """The alerts whose active state went unanswered, and the ends kept for them."""

    def __init__(self, interval_s: float, timeout_s: float) -> None:
        self.interval_s, self.timeout_s = interval_s, timeout_s
        #: alert id -> loop time its active state last went unanswered
        self.unanswered: dict[str, float] = {}
        #: (alert id, labels) -> an accepted end to re-post
        self.ended: dict[tuple[str, str], Ended] = {}

    @property
    def repost_s(self) -> float:
        return min(self.interval_s, REPOST_S)

    def _horizon(self, since: float) -> float:
        """When a POST sent at ``since`` can no longer end later than what came after it."""
        return since + 4 * self.interval_s + self.timeout_s

    def note_unanswered(self, ids: Iterable[str], now: float) -> None:
        for aid in ids:
            self.unanswered.pop(aid, None)  # re-inserted: oldest first
            self.unanswered[aid] = now
        while len(self.unanswered) > MAX_TRACKED:
            del self.unanswered[next(iter(self.unanswered))]

    def resolved(self, aid: str) -> None:
        """A resolve of ``aid`` was delivered (its end is kept in ``ended`` if needed)."""
        self.unanswered.pop(aid, None)

    def accepted(
        self, aid: str, payload: Sequence[dict[str, Any]], resolve: bool, now: float
    ) -> None:
        """A POST of ``aid`` was accepted: ``payload[0]`` its state, then the end of its old
        labels, if any. An active state is the truth now, not an end kept before it; the ends
        are kept while a POST of the active state may still be handled after them."""
        if not resolve:
            self.ended.pop((aid, labels_key(payload[0])), None)
        since = self.unanswered.get(aid)
        if since is not None:
            for obj in payload if resolve else payload[1:]:
                self.keep(aid, obj, since, now)

    def keep(self, aid: str, obj: dict[str, Any], since: float, now: float) -> None:
        """Re-post ``obj`` (an end) until a POST left unanswered at ``since`` is over."""
        key = (aid, labels_key(obj))
        self.ended.pop(key, None)  # re-inserted: the dict stays oldest first
        while len(self.ended) >= MAX_TRACKED:
            oldest = next(iter(self.ended))
            del self.ended[oldest]
            log.warning(
                "alertmanager: more than %d resolves to re-post; no longer re-posting that of "
                "alert %s (Alertmanager may keep a later end for it)",
                MAX_TRACKED,
                oldest[0],
            )
        # first soon: a stale POST is most likely handled as Alertmanager comes back
        first = min(1.0, self.repost_s / 4)
        self.ended[key] = Ended(obj, self._horizon(since), now + first)

    def due(self, now: float) -> list[Ended]:
        """The ends to re-post now, once those no stale POST can follow any more are gone,
        and the unanswered POSTs whose endsAt has passed forgotten (handled now, they end
        at once)."""
        while self.unanswered and self._horizon(next(iter(self.unanswered.values()))) < now:
            del self.unanswered[next(iter(self.unanswered))]
        for key in [k for k, e in self.ended.items() if e.until < now]:
            del self.ended[key]
        return [e for e in self.ended.values() if e.due <= now]

    def reposted(self, ends: Iterable[Ended], now: float) -> None:
        for e in ends:
            e.due = now + self.repost_s
