"""Per-node idle episodes -> one alert per allocation episode (pure, JSON-able state).

The core is per node, so a multi-node allocation idle on several nodes reports one episode
per node; the ground truth (and the person paged) wants one: overlapping episodes of the same
allocation merge. The merged alert opens with the first node's episode, updates as nodes
join or report, and resolves when every node's episode has resolved. Its id is
``idle_gpu/<allocation>/<episode start>``: deterministic, so a replay never opens it twice.
(If a node whose run began earlier reports after the alert opened, the start moves back and
the id stays.)

With the state split over shards, a node's shard and its allocation's merger checkpoint
apart: a node's shard restored from its checkpoint sends its alerts again, which the merger
may already have merged and resolved. The merger keeps the last episodes it resolved per
allocation (``done``); a node episode that starts inside one is that replay, not a new one.
A real one cannot come that late: an episode resolves only once every shard is past the
point where a run starting before its end would have been reported.
"""

from __future__ import annotations

from datetime import datetime

from gpugap.schemas.clock import MINUTE_S, ms, parse_utc
from gpugap.schemas.models import Alert, episode_start
from gpugap.schemas.types import AlertKind, AlertState, format_utc
from gpugap.streams.state import Merged

#: resolved episodes kept per allocation, and for how long (event time) past their end
DONE_KEPT = 4
DONE_KEPT_MS = 24 * 3600 * 1000


class AlertMerger:
    def __init__(
        self, state: dict[str, Merged] | None = None, done: dict[str, list[list[str]]] | None = None
    ) -> None:
        self.state: dict[str, Merged] = state if state is not None else {}
        #: allocation id -> [start, end] of the episodes it last resolved
        self.done: dict[str, list[list[str]]] = done if done is not None else {}

    def feed(self, alert: Alert) -> list[Alert]:
        if alert.kind is not AlertKind.IDLE_GPU or alert.allocation_id is None:
            return [alert]
        aid = alert.allocation_id
        node = alert.nodes[0] if alert.nodes else ""
        start = episode_start(alert)
        if any(s <= start <= e for s, e in self.done.get(aid, ())):
            return []  # a restored node shard sends again what this merger has resolved
        out: list[Alert] = []
        m = self.state.get(aid)
        if m is not None and m["pending"] and start > m["end"]:
            out.append(self._resolve(aid, alert.time))  # the new one cannot merge
            m = None
        if m is None:
            if alert.state is not AlertState.OPEN:
                return out  # the tail of an episode already merged and resolved
            m = self.state[aid] = {
                "start": start,
                "end": start,
                "pending": False,
                "nodes": {},
                "last": alert.model_dump(mode="json"),
            }
            state = AlertState.OPEN
        else:
            state = AlertState.UPDATE
        m["nodes"][node] = {
            "gpus": list(alert.gpus),
            "idle_h": alert.idle_gpu_hours,
            "open": alert.state is not AlertState.RESOLVED,
        }
        if start < m["start"]:
            # a node whose run began earlier reported after the alert opened (its shard ran
            # behind): the episode starts earlier, its alert keeps the id it opened with
            m.setdefault("id", m["start"])
            m["start"] = start
        if alert.resolved_at is not None:
            m["end"] = max(m["end"], format_utc(alert.resolved_at))
        m.setdefault("opened", format_utc(alert.opened_at))
        m["last"] = alert.model_dump(mode="json")
        # every node's episode is over; an idle run on another node that started before the
        # end may still qualify (within N minutes): resolve once the watermark is past that
        m["pending"] = not any(x["open"] for x in m["nodes"].values())
        out.append(self._alert(alert, m, state))
        return out

    def tick(self, watermark_ms: int, need_ms: dict[str, int]) -> list[Alert]:
        """Resolve merged episodes no idle run can join any more (``need_ms``: the idle
        minutes of each allocation's class, in ms)."""
        out = []
        for aid in [
            a for a, d in self.done.items() if ms(parse_utc(d[-1][1])) + DONE_KEPT_MS < watermark_ms
        ]:
            del self.done[aid]
        for aid in sorted(self.state):
            m = self.state[aid]
            end_ms = ms(parse_utc(m["end"]))
            if m["pending"] and watermark_ms >= end_ms + need_ms.get(aid, 0):
                out.append(self._resolve(aid, None))
        return out

    def _resolve(self, aid: str, time: datetime | None) -> Alert:
        m = self.state.pop(aid)
        done = self.done.setdefault(aid, [])
        done.append([m["start"], m["end"]])
        del done[:-DONE_KEPT]
        last = Alert.model_validate(m["last"])
        if time is not None and time > last.time:
            last = last.model_copy(update={"time": time})
        return self._alert(last, m, AlertState.RESOLVED)

    def _alert(self, a: Alert, m: Merged, state: AlertState) -> Alert:
        nodes = m["nodes"]
        gpus = sorted({g for x in nodes.values() for g in x["gpus"]})
        start, end = parse_utc(m["start"]), parse_utc(m["end"])
        resolved = state is AlertState.RESOLVED
        # the merged alert's time never goes back: shards run at different speeds, so a
        # node's report can be older than one merged before it, and a RESOLVED record
        # older than the UPDATE before it would leave the alert open in v_alerts
        time = a.time
        if (prev := m.get("time")) is not None:
            time = max(time, parse_utc(prev))
        m["time"] = format_utc(time)
        minutes = int((end - start).total_seconds() // MINUTE_S) if resolved else a.idle_minutes
        return a.model_copy(
            update={
                "time": time,
                "alert_id": f"idle_gpu/{a.allocation_id}/{m.get('id', m['start'])}",
                "state": state,
                "opened_at": parse_utc(m["opened"]),
                "resolved_at": end if resolved else None,
                "nodes": tuple(sorted(nodes)),
                "gpus": tuple(gpus),
                "idle_minutes": max(minutes, a.idle_minutes),
                "idle_gpu_hours": sum(x["idle_h"] for x in nodes.values()),
                "message": f"{len(gpus)} GPU(s) on {len(nodes)} node(s) idle since {m['start']}",
            }
        )
