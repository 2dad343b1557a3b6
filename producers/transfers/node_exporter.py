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
import json
import logging
import math
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, ClassVar

import aiohttp

from gpugap.settings import Settings
from producers.base import Producer
from schemas import Topic
from schemas.errors import ConfigError, FatalError, RetriableError
from schemas.models import MAX_TRANSFER_BYTES, MAX_TRANSFER_INTERVAL_S, Transfer
from schemas.topics import TRANSFERS

from .prometheus_settings import Link, TransfersPrometheusSettings

log = logging.getLogger(__name__)

SOURCE = "node_exporter"
TRANSMIT = "node_network_transmit_bytes_total"
RECEIVE = "node_network_receive_bytes_total"
_RELATIVE = re.compile(r"^-(\d+(?:\.\d+)?)\s*(s|m|min|h|d|w)$")
_UNIT_S = {"s": 1, "m": 60, "min": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


class PrometheusError(FatalError):
    """Prometheus refused a query, or its answer is not one this producer can use."""


class _Transient(RetriableError):
    pass


def parse_time(text: str, now: datetime, flag: str) -> datetime:
    """ISO-8601 (no offset = UTC), epoch seconds, ``now`` or relative (``-24h``, ``-7d``)."""
    value = text.strip()
    if value.lower() == "now":
        return now
    m = _RELATIVE.match(value.lower())
    if m:
        return now - timedelta(seconds=float(m.group(1)) * _UNIT_S[m.group(2)])
    try:
        return datetime.fromtimestamp(float(value), UTC)
    except ValueError:
        pass
    try:
        t = datetime.fromisoformat(value)
    except ValueError:
        raise ConfigError(
            f"transfers-prometheus: {flag} {text!r} is not a time (ISO-8601 or -24h)"
        ) from None
    return t.replace(tzinfo=UTC) if t.tzinfo is None else t.astimezone(UTC)


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
        self.since = parse_time(cfg.since, now, "--since")
        self.until = parse_time(cfg.until, now, "--until") if cfg.until else now
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
        self.url = cfg.url.rstrip("/")
        self.api = self.url + "/api/v1"
        self.points = 0
        self.queries = 0
        self.emitted = 0
        self._session: aiohttp.ClientSession | None = None

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
        doc = self._answer(await self._post(form, "query"), form["query"])
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

    def _answer(self, body: bytes, query: str) -> dict[str, Any]:
        try:
            doc = json.loads(body)
        except ValueError as exc:
            raise PrometheusError(f"transfers-prometheus: {self.url}: not JSON ({exc})") from None
        if not isinstance(doc, dict) or doc.get("status") != "success":
            what = doc.get("error") if isinstance(doc, dict) else None
            raise PrometheusError(f"transfers-prometheus: {query}: {what or 'no success'}")
        data = doc.get("data")
        return data if isinstance(data, dict) else {}

    async def query_range(
        self, query: str, start: int, end: int
    ) -> list[tuple[dict[str, str], list[tuple[int, float]]]]:
        """One ``query_range`` (a matrix): [(labels, [(epoch s, value)...])...]."""
        form = {"query": query, "start": str(start), "end": str(end), "step": str(self.cfg.step_s)}
        data = self._answer(await self._post(form, "query_range"), query)
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

    async def _post(self, form: dict[str, str], api: str) -> bytes:
        session = self._open()
        delay = 1.0
        for attempt in range(self.cfg.retries + 1):
            try:
                return await self._fetch(session, f"{self.api}/{api}", form)
            except (aiohttp.ClientError, TimeoutError, _Transient) as exc:
                if attempt == self.cfg.retries:
                    raise PrometheusError(
                        f"transfers-prometheus: {self.url}: {str(exc) or type(exc).__name__} "
                        f"({attempt + 1} tries)"
                    ) from None
                log.warning("transfers-prometheus: %s: %s; again in %.0fs", self.url, exc, delay)
                await asyncio.sleep(delay)
                delay *= 2
        raise AssertionError("unreachable")

    async def _fetch(self, session: aiohttp.ClientSession, url: str, form: dict[str, str]) -> bytes:
        limit = self.cfg.max_response_bytes
        self.queries += 1
        async with session.post(url, data=form) as resp:
            if resp.status >= 500 or resp.status == 429:  # 503: not ready (yet)
                raise _Transient(f"HTTP {resp.status}")
            if resp.content_length is not None and resp.content_length > limit:
                raise PrometheusError(
                    f"transfers-prometheus: an answer of {resp.content_length} bytes > "
                    f"max_response_bytes {limit}: a smaller points_per_query or narrower links"
                )
            chunks_, size = [], 0
            async for chunk in resp.content.iter_chunked(1 << 16):
                size += len(chunk)
                if size > limit:
                    raise PrometheusError(
                        f"transfers-prometheus: an answer larger than max_response_bytes {limit}"
                        ": a smaller points_per_query or narrower links"
                    )
                chunks_.append(chunk)
            body = b"".join(chunks_)
            if resp.status in (401, 403):
                raise PrometheusError(
                    f"transfers-prometheus: {self.url}: HTTP {resp.status} (the bearer token?)"
                )
            if resp.status != 200 and not body.lstrip().startswith(b"{"):
                raise PrometheusError(f"transfers-prometheus: {self.url}: HTTP {resp.status}")
            return body

    def _open(self) -> aiohttp.ClientSession:
        if self._session is None:
            headers = {"Accept": "application/json"}
            if self.cfg.bearer_token is not None:
                headers["Authorization"] = f"Bearer {self.cfg.bearer_token.get_secret_value()}"
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=self.cfg.timeout_s), headers=headers
            )
        return self._session

    async def close(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            await session.close()
