"""One GPU, one minute: allocated / unallocated seconds and time-weighted consumption.

Pure arithmetic on integer milliseconds. A sample at ``t`` with interval ``dt`` describes
``(t - dt, t]``; where consecutive samples' intervals overlap (an interval longer than the
real gap) the later one starts at the earlier one's time, so no second is counted twice.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass
from operator import itemgetter
from typing import Any, cast

#: one buffered sample of one GPU: [t_ms, dt_ms, activity, metric, memory_mib, power_w], and
#: where the sample measured use per holder, its weights (streams.measured.Weights) seventh
Sample = list[float | int | str | list[list[str | float]] | None]
#: a buffered sample's time, the integer ms the core wrote (the sort key of a GPU's buffer)
sample_time = itemgetter(0)


@dataclass(slots=True)
class Usage:
    """What the samples say about one span of one GPU."""

    sample_count: int = 0
    covered_ms: int = 0  # milliseconds with an activity value
    consumed: float = 0.0  # activity x milliseconds
    activity_max: float | None = None
    metric: str | None = None
    memory: float | None = None  # time-weighted average
    power: float | None = None

    @property
    def activity_avg(self) -> float | None:
        return self.consumed / self.covered_ms if self.covered_ms else None


def usage(spans: Sequence[tuple[int, int]], eff: Sequence[tuple[int, int, Sample]]) -> Usage:
    """Time-weight the samples over the union of ``spans`` (disjoint [start, end) in ms)."""
    count = covered = mem_w = pow_w = 0
    consumed = mem_sum = pow_sum = 0.0
    act_max: float | None = None
    metric_ms: dict[str, int] = {}
    for lo, hi in spans:
        for start, end, s in eff:
            ov = (end if end < hi else hi) - (start if start > lo else lo)
            if ov <= 0:
                continue
            count += 1
            # a number or None each (the core writes them so); the metric a name or None
            v = cast(list[Any], s)
            act, metric, mem, pw = v[2], v[3], v[4], v[5]
            if act is not None:
                a = float(act)
                covered += ov
                consumed += a * ov
                if act_max is None or not act_max > a:  # max(a, act_max or 0.0), a >= 0
                    act_max = a
                if metric is not None:
                    m = cast(str, metric)
                    metric_ms[m] = metric_ms.get(m, 0) + ov
            if mem is not None:
                mem_sum += float(mem) * ov
                mem_w += ov
            if pw is not None:
                pow_sum += float(pw) * ov
                pow_w += ov
    u = Usage(count, covered, consumed, act_max)
    if metric_ms:
        u.metric = max(sorted(metric_ms), key=lambda k: metric_ms[k])
    u.memory = mem_sum / mem_w if mem_w else None
    u.power = pow_sum / pow_w if pow_w else None
    return u


def complement(spans: Sequence[tuple[int, int]], lo: int, hi: int) -> list[tuple[int, int]]:
    """The parts of [lo, hi) that none of ``spans`` covers."""
    out: list[tuple[int, int]] = []
    cur = lo
    for s, e in sorted(spans):
        if s > cur:
            out.append((cur, min(s, hi)))
        cur = max(cur, e)
        if cur >= hi:
            break
    if cur < hi:
        out.append((cur, hi))
    return [(s, e) for s, e in out if e > s]


def effective_in(samples: Sequence[Sample], lo: int, hi: int) -> list[tuple[int, int, Sample]]:
    """(start_ms, end_ms, sample) of the samples (sorted by t) that overlap [lo, hi), each
    interval trimmed to begin no earlier than the previous sample's time. Only the samples
    from the last one at or before ``lo`` on are read: the buffer holds minutes of them."""
    i = bisect_right(samples, lo, key=sample_time)  # the first sample ending after lo
    prev: int | None = cast(int, samples[i - 1][0]) if i > 0 else None
    out: list[tuple[int, int, Sample]] = []
    for k in range(i, len(samples)):
        s = samples[k]
        t, dt = cast(int, s[0]), cast(int, s[1])  # integer ms, as the core writes them
        start = t - dt if prev is None else max(t - dt, prev)
        if start >= hi:  # every later one starts at or after this one's end
            break
        if t > start:
            out.append((start, t, s))
        prev = t
    return out
