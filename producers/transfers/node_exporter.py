"""``gpugap produce transfers-prometheus``: node interface counters as ``transfers.v1``.

node_exporter exports ``node_network_transmit_bytes_total`` and ``..._receive_bytes_total``
per node and interface; Prometheus keeps their history. For each configured boundary link
(a cluster, the nodes and interfaces that cross the boundary, the two environments) this
producer asks Prometheus's ``/api/v1/query_range`` for the raw counters at every ``step_s``
of the range and turns each step's increase into one ``Transfer`` per node, interface and
direction: transmit is ``from_env -> to_env``, receive the other way.

- Counter resets count as Prometheus's ``increase()`` counts them: a value lower than the one
  before means the counter restarted from 0, so the increase is the new value.
- The step grid is aligned to multiples of ``step_s`` (UTC epoch) and a run covers the
  intervals that *start* in ``[since, until)``: adjacent runs meet without overlap or hole,
  and an event id is a digest of cluster, node, interface, direction and the interval, so
  re-running a range gives the same ids (the warehouse collapses them). Re-run with the same
  step: another step is another set of intervals.
- A step without an increase yields nothing (idle interfaces are not news). Where a series
  has no value for some steps (a scrape gap longer than Prometheus's lookback), the next
  increase is one transfer over the whole gap.
- Bounded: each request asks for at most ``points_per_query`` steps (Prometheus refuses more
  than 11,000 points per series), a response over ``max_response_bytes``, more than
  ``max_series`` series in one answer or more than ``max_points`` values in a run is an
  error, and every request has a timeout (retried ``retries`` times on a connection error,
  a timeout or a 5xx).

Read-only: ``query_range`` and nothing else, with a bearer token if configured.
"""

from __future__ import annotations

import asyncio
import hashlib
import math
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, ClassVar

from gpugap.groundfloor.settings import Settings
from gpugap.groundfloor.timearg import parse_time
from gpugap.producers.base import Producer
from gpugap.producers.prometheus.http import PrometheusError, PrometheusHttp
from gpugap.schemas import Topic
from gpugap.schemas.errors import ConfigError
from gpugap.schemas.models import MAX_TRANSFER_BYTES, MAX_TRANSFER_INTERVAL_S, Transfer
from gpugap.schemas.topics import TRANSFERS

from .prometheus_settings import Link, TransfersPrometheusSettings

SOURCE = "node_exporter"
TRANSMIT = "node_network_transmit_bytes_total"
RECEIVE = "node_network_receive_bytes_total"


def grid(since: datetime, until: datetime, step_s: int) -> tuple[int, int]:
    """The first and last evaluation times (epoch seconds, multiples of the step) of a run
    covering the intervals that start in ``[since, until)``."""
    first = math.ceil(since.timestamp() / step_s) * step_s
    last = math.floor(until.timestamp() / step_s) * step_s
    return first, last


def chunks(first: int, last: int, step_s: int, points: int) -> list[tuple[int, int]]:
    """``[first, last]`` as query ranges of at most ``points`` evaluation times each; a chunk
    starts one step after the one before ended (the counters' last values carry over)."""
    out = []
    start = first
    while start <= last:
        end = min(start + step_s * (points - 1), last)
        out.append((start, end))
        start = end + step_s
    return out


def node_name(value: str, label: str) -> str:
    """The node a series is on: the ``instance`` label without its port (``[::1]:9100``)."""
    if label != "instance":
        return value
    host, sep, port = value.rpartition(":")
    if sep and port.isdigit() and host:
        value = host
    return value[1:-1] if value.startswith("[") and value.endswith("]") else value


def event_id(
    cluster: str, node: str, device: str, *, way: tuple[str, str], span: tuple[int, int]
) -> str:
    """The same node, interface, direction and interval: the same id, run after run."""
    key = "\x1f".join((cluster, node, device, *way, *map(str, span)))
    return "nx-" + hashlib.sha256(key.encode()).hexdigest()[:32]


def increase(before: float, after: float) -> float:
    """A counter's increase between two values, a drop being a reset (as ``increase()``)."""
    return after - before if after >= before else after


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


@dataclass
class _Last:
    t: int
    value: float


class TransfersPrometheus(Producer):
    name: ClassVar[str] = "transfers-prometheus"

    def __init__(
        self,
        settings: Settings,
        config: TransfersPrometheusSettings | None = None,
        now: datetime | None = None,
    ) -> None:
        super().__init__(settings, config)
        self.cfg = cfg = config or TransfersPrometheusSettings()
        if not cfg.url:
            raise ConfigError(
                "transfers-prometheus: no Prometheus (--url URL or GPUGAP_TRANSFERS_PROMETHEUS_URL)"
            )
        if not cfg.links:
            raise ConfigError(
                "transfers-prometheus: no boundary link: set GPUGAP_TRANSFERS_PROMETHEUS_LINKS "
                '(JSON: [{"cluster": "hpc", "node": "hpc-.*", "device": "bond0", '
                '"from_env": "onprem", "to_env": "cloud"}]) or ..._LINKS_FILE'
            )
        if not cfg.since:
            raise ConfigError("transfers-prometheus: no --since (ISO-8601 or relative: -24h)")
        now = now or datetime.now(UTC)
        who = "transfers-prometheus"
        self.since = parse_time(cfg.since, now, "--since", who)
        self.until = parse_time(cfg.until, now, "--until", who) if cfg.until else now
        if self.since >= self.until:
            raise ConfigError(
                f"transfers-prometheus: --since {self.since:%Y-%m-%dT%H:%M:%SZ} is not before "
                f"--until {self.until:%Y-%m-%dT%H:%M:%SZ}"
            )
        self.first, self.last = grid(self.since, self.until, cfg.step_s)
        steps = max(0, (self.last - self.first) // cfg.step_s + 1)
        if steps > cfg.max_points:
            raise ConfigError(
                f"transfers-prometheus: {steps} steps of {cfg.step_s}s > max_points "
                f"{cfg.max_points}: a shorter range or a longer step"
            )
        self.http = PrometheusHttp(
            cfg.url, who="transfers-prometheus", bearer_token=cfg.bearer_token,
            timeout_s=cfg.timeout_s, retries=cfg.retries,
            max_response_bytes=cfg.max_response_bytes,
            too_big="a smaller points_per_query or narrower links",
        )  # fmt: skip
        self.url = self.http.url
        self.points = 0
        self.emitted = 0

    @classmethod
    def default_topic(cls) -> Topic[Any]:
        return TRANSFERS

    async def run(self, stop: asyncio.Event, once: bool = False) -> None:
        for link in self.cfg.links:
            async for record in self.transfers(link):
                if stop.is_set():
                    return
                if self.emitted % 256 == 255:
                    await asyncio.sleep(0)  # let the Kafka client's tasks and signals in
                await self.emit(record)
                self.emitted += 1

    async def transfers(self, link: Link) -> AsyncIterator[Transfer]:
        """The link's transfers over the run's range, both directions."""
        for metric, src, dst in (
            (TRANSMIT, link.from_env, link.to_env),
            (RECEIVE, link.to_env, link.from_env),
        ):
            last: dict[tuple[str, str], _Last] = {}
            for start, end in chunks(
                self.first, self.last, self.cfg.step_s, self.cfg.points_per_query
            ):
                for labels, values in await self.query_range(link.selector(metric), start, end):
                    node = node_name(labels.get(link.node_label, ""), link.node_label)
                    device = labels.get("device", "")
                    if not node or not device:
                        continue
                    key = (node, device)
                    if key not in last and len(last) >= self.cfg.max_series:
                        raise PrometheusError(
                            f"transfers-prometheus: {link.selector(metric)} has more than "
                            f"max_series {self.cfg.max_series} series: narrow the link"
                        )
                    for t, value in values:
                        prev = last.get(key)
                        last[key] = _Last(t, value)
                        if prev is None or t <= prev.t:
                            continue
                        if value < prev.value:  # a reset: the raw samples say how much
                            moved = round(await self.reset_increase(labels, prev, t, value))
                        else:
                            moved = round(value - prev.value)
                        if moved <= 0:
                            continue
                        yield Transfer(
                            event_id=event_id(
                                link.cluster, node, device, way=(src, dst), span=(prev.t, t)
                            ),
                            time=datetime.fromtimestamp(prev.t, UTC),
                            interval_s=min(float(t - prev.t), MAX_TRANSFER_INTERVAL_S),
                            cluster=link.cluster,
                            from_env=src,
                            to_env=dst,
                            bytes=min(moved, MAX_TRANSFER_BYTES),
                            source=SOURCE,
                            node=node,
                            interface=device[:64],
                            description=metric,
                        )

    async def reset_increase(
        self, labels: dict[str, str], prev: _Last, t: int, value: float
    ) -> float:
        """The increase from ``prev`` to ``t`` of a series that reset in between, from its raw
        samples (as ``increase()`` counts: each drop is a restart from 0): the step values
        alone would lose what was counted between ``prev`` and the reset."""
        selector = "{" + ",".join(f'{k}="{_escape(v)}"' for k, v in sorted(labels.items())) + "}"
        form = {"query": f"{selector}[{t - prev.t}s]", "time": str(t)}
        doc = await self.http.query(form)
        result = doc.get("result") or []
        if doc.get("resultType") != "matrix" or len(result) != 1:
            return value  # no raw samples to be had: the step's end value, counted from 0
        total, before = 0.0, prev.value
        for _, v in result[0].get("values") or []:
            sample = float(v)
            if math.isfinite(sample) and sample >= 0:
                total += increase(before, sample)
                before = sample
        return total

    async def query_range(
        self, query: str, start: int, end: int
    ) -> list[tuple[dict[str, str], list[tuple[int, float]]]]:
        """One ``query_range`` (a matrix): [(labels, [(epoch s, value)...])...]."""
        form = {"query": query, "start": str(start), "end": str(end), "step": str(self.cfg.step_s)}
        data = await self.http.query(form, "query_range")
        if data.get("resultType") != "matrix":
            raise PrometheusError(f"transfers-prometheus: {query}: not a matrix answer")
        result = data.get("result") or []
        if len(result) > self.cfg.max_series:
            raise PrometheusError(
                f"transfers-prometheus: {query}: {len(result)} series > max_series "
                f"{self.cfg.max_series}: narrow the link"
            )
        out = []
        for series in result:
            raw = series.get("values") or []
            self.points += len(raw)
            if self.points > self.cfg.max_points:
                raise PrometheusError(
                    f"transfers-prometheus: more than max_points {self.cfg.max_points} values "
                    "in this run: a shorter range, a longer step or narrower links"
                )
            values = []
            for t, v in raw:
                value = float(v)
                if math.isfinite(value) and value >= 0:
                    values.append((round(float(t)), value))
            labels = {str(k): str(x) for k, x in (series.get("metric") or {}).items()}
            out.append((labels, values))
        return out

    @property
    def queries(self) -> int:
        return self.http.queries

    async def close(self) -> None:
        await self.http.close()
