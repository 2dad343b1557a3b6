"""History for the backfill tests: series written as OpenMetrics (loaded into a real
Prometheus with promtool's block import, tests/harness/prometheus.py), and what the backfill
published, read back from its JSON lines."""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from gpugap.schemas import TOPICS, Record, decode
from tests.harness.prometheus import (
    Prometheus,
    PrometheusBuildError,
    ensure_built,
    load_openmetrics,
)

Labels = tuple[tuple[str, str], ...]


class Series:
    """Samples by (metric, labels), in time order per series, as OpenMetrics text."""

    def __init__(self) -> None:
        self.samples: dict[str, dict[Labels, list[tuple[int, float]]]] = defaultdict(
            lambda: defaultdict(list)
        )

    def add(self, name: str, labels: dict[str, str], t_ms: int, value: float) -> None:
        self.samples[name][tuple(sorted(labels.items()))].append((t_ms, value))

    def openmetrics(self) -> str:
        lines = []
        for name in sorted(self.samples):
            lines.append(f"# TYPE {name} gauge")  # every family a gauge: names unchanged
            for labels, points in self.samples[name].items():
                text = ",".join(f'{k}="{_escape(v)}"' for k, v in labels)
                for t, v in sorted(points):
                    lines.append(f"{name}{{{text}}} {v!r} {t / 1000:.3f}")
        return "\n".join([*lines, "# EOF", ""])


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


@contextmanager
def prometheus_with(series: Series, root: Path) -> Iterator[Prometheus]:
    """A real Prometheus holding ``series`` as history; a build or start that fails fails."""
    try:
        exe, promtool = ensure_built()
    except (PrometheusBuildError, OSError) as exc:
        pytest.fail(f"could not build Prometheus: {exc}")
    try:
        load_openmetrics(promtool, series.openmetrics(), root / "tsdb")
        prom = Prometheus(exe, root / "tsdb")
        prom.__enter__()
    except (PrometheusBuildError, RuntimeError) as exc:
        pytest.fail(f"could not start Prometheus on the recorded history: {exc}")
    try:
        yield prom
    finally:
        prom.__exit__(None, None, None)


def read_jsonl(path: Path) -> list[tuple[str, Record]]:
    """(topic, record) of every line a JsonlPublisher wrote."""
    out = []
    for line in path.read_text().splitlines():
        doc: dict[str, Any] = json.loads(line)
        topic = TOPICS[doc["topic"]]
        out.append((doc["topic"], decode(topic, json.dumps(doc["value"]).encode())))
    return out
