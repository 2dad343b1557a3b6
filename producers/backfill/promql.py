"""A read-only Prometheus HTTP API client for history: ``query`` and ``query_range``, bounded.

History is read as raw samples: an instant query of a range selector (``metric[3600s]`` at
the chunk's end) answers every sample Prometheus kept in the chunk, at the time it was
scraped. ``query_range`` would resample onto a step grid instead (each step takes the last
sample before it, so scrape jitter counts one sample twice or skips one, and a sample's time
becomes the step's); raw samples are what the live scraper would have published.

Bounded: the requests are producers/prometheus/http.py's (a timeout, retries, a cap on the
answer's bytes); an answer with more than ``max_series`` series or more than
``points_per_series`` points in one series is an error that says what to change.
"""

from __future__ import annotations

import math
from typing import Any

from gpugap.producers.prometheus.http import PrometheusError, PrometheusHttp

from .settings import BackfillSettings

__all__ = ["PromClient", "PrometheusError", "Series", "escape", "node_of"]

#: labels -> [(epoch ms, value)], as one answer gives them
Series = tuple[dict[str, str], list[tuple[int, float]]]


_NODE_LABELS = ("Hostname", "hostname")


def node_of(labels: dict[str, str]) -> str:
    """``Hostname`` (dcgm-exporter), else the target's ``instance`` without its port."""
    for name in _NODE_LABELS:
        if labels.get(name):
            return labels[name]
    value = labels.get("instance", "")
    host, sep, port = value.rpartition(":")
    if sep and port.isdigit() and host:
        value = host
    return value[1:-1] if value.startswith("[") and value.endswith("]") else value


def escape(value: str) -> str:
    """A label value inside double quotes in PromQL."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


class PromClient:
    def __init__(self, cfg: BackfillSettings) -> None:
        if not cfg.prometheus_url:
            raise PrometheusError(
                "backfill: no Prometheus: --prometheus URL or GPUGAP_BACKFILL_PROMETHEUS_URL"
            )
        self.cfg = cfg
        self.http = PrometheusHttp(
            cfg.prometheus_url, who="backfill", bearer_token=cfg.bearer_token,
            timeout_s=cfg.timeout_s, retries=cfg.retries,
            max_response_bytes=cfg.max_response_bytes,
            too_big="a shorter --chunk or a narrower --match",
        )  # fmt: skip
        self.url = self.http.url
        self.points = 0

    async def raw(self, selector: str, start_ms: int, end_ms: int) -> list[Series]:
        """Every sample of ``selector`` with ``start_ms < t <= end_ms`` (raw, as scraped).

        Half-open at the start because a sample at ``t`` describes the interval before it:
        the samples of ``(start, end]`` are the ones about ``[start, end)``."""
        span_ms = end_ms - start_ms
        # a range selector at t covers (t - span, t] (Prometheus 3; 2.x: [t - span, t]):
        # filtered below, the same either way
        form = {"query": f"{selector}[{span_ms}ms]", "time": f"{end_ms / 1000:.3f}"}
        data = await self.query(form)
        if data.get("resultType") != "matrix":
            raise PrometheusError(f"backfill: {form['query']}: not a matrix answer")
        return self._series(data, form["query"], start_ms + 1, end_ms + 1)

    async def range(self, query: str, first_ms: int, last_ms: int, step_s: float) -> list[Series]:
        """``query_range`` from ``first_ms`` to ``last_ms`` (both evaluated) every ``step_s``:
        for state series (kube-state-metrics), where the value at each step is what counts."""
        points = (last_ms - first_ms) / (step_s * 1000) + 1
        if points > self.cfg.points_per_series:
            raise PrometheusError(
                f"backfill: {query}: {points:,.0f} steps > points_per_series "
                f"{self.cfg.points_per_series} (Prometheus refuses 11,000): a shorter --chunk"
            )
        form = {
            "query": query,
            "start": f"{first_ms / 1000:.3f}",
            "end": f"{last_ms / 1000:.3f}",
            "step": f"{step_s:g}",
        }
        data = await self.query(form, "query_range")
        if data.get("resultType") != "matrix":
            raise PrometheusError(f"backfill: {query}: not a matrix answer")
        return self._series(data, query, first_ms, last_ms + 1)

    async def instant(self, query: str, at_ms: int) -> list[tuple[dict[str, str], float]]:
        """An instant vector: [(labels, value)...]."""
        data = await self.query({"query": query, "time": f"{at_ms / 1000:.3f}"})
        if data.get("resultType") != "vector":
            raise PrometheusError(f"backfill: {query}: not an instant vector answer")
        result = data.get("result") or []
        self._check_size(len(result), query)
        out = []
        for item in result:
            labels = {str(k): str(v) for k, v in (item.get("metric") or {}).items()}
            value = float((item.get("value") or [0, "NaN"])[1])
            if math.isfinite(value):
                out.append((labels, value))
        return out

    def _series(self, data: dict[str, Any], query: str, lo: int, hi: int) -> list[Series]:
        result = data.get("result") or []
        self._check_size(len(result), query)
        out: list[Series] = []
        for item in result:
            raw = item.get("values") or []
            if len(raw) > self.cfg.points_per_series:
                raise PrometheusError(
                    f"backfill: {query}: a series of {len(raw)} points > points_per_series "
                    f"{self.cfg.points_per_series}: a shorter --chunk"
                )
            self.points += len(raw)
            values = []
            for t, v in raw:
                t_ms, value = round(float(t) * 1000), float(v)
                if lo <= t_ms < hi and math.isfinite(value):
                    values.append((t_ms, value))
            labels = {str(k): str(x) for k, x in (item.get("metric") or {}).items()}
            out.append((labels, values))
        return out

    def _check_size(self, n: int, query: str) -> None:
        if n > self.cfg.max_series:
            raise PrometheusError(
                f"backfill: {query}: {n} series > max_series {self.cfg.max_series}: narrow "
                "the selection (--match)"
            )

    async def query(self, form: dict[str, str], api: str = "query") -> dict[str, Any]:
        return await self.http.query(form, api)

    @property
    def queries(self) -> int:
        return self.http.queries

    async def close(self) -> None:
        await self.http.close()
