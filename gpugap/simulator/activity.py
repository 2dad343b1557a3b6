"""The activity model: what each held GPU does, as a function of time.

A *program* is a list of phases ``(from_s, level, jitter)`` in thousandths (0..1000): from
``from_s`` on the GPU runs at ``level`` give or take ``jitter``. The value of a sample slot
``(T - interval, T]`` is the phase in force at the slot's midpoint plus a jitter drawn from a
fixed noise table indexed by the device and ``T``: a pure function of (device, holding, T),
so the event emitter and the ground truth compute exactly the same numbers independently.

Activity is only non-zero in slots that lie wholly inside one holding (``start <= T -
interval`` and ``T < end``): a slot that straddles an allocation boundary is 0, so every
GPU-second consumed belongs to exactly one owner however a consumer splits boundary slots.
"""

from __future__ import annotations

import math
import random
from bisect import bisect_right
from dataclasses import dataclass, field
from datetime import datetime

_NOISE_BITS = 12
NOISE_MASK = (1 << _NOISE_BITS) - 1
#: a fixed uniform noise table in [-1000, 1000]; never depends on the scenario seed, so the
#: same program gives the same activity whatever else the scenario contains
NOISE: list[int] = [random.Random(7919).randint(-1000, 1000) for _ in range(1 << _NOISE_BITS)]


def milli(x: float) -> int:
    return round(x * 1000)


@dataclass(slots=True)
class Program:
    #: phase starts, doubled: slots are looked up by their midpoint t - interval/2, which
    #: stays an integer when everything is doubled
    starts2: list[int] = field(default_factory=list)
    levels: list[int] = field(default_factory=list)
    jitters: list[int] = field(default_factory=list)

    def add(self, at: int, level: int, jitter: int = 0) -> None:
        if self.starts2 and 2 * at <= self.starts2[-1]:
            # a phase that starts no later than the previous one replaces it
            self.levels[-1], self.jitters[-1] = level, jitter
            return
        self.starts2.append(2 * at)
        self.levels.append(level)
        self.jitters.append(jitter)


def value(p: Program, noise_base: int, quantum: int, t: int, interval: int) -> int:
    """Activity in thousandths of the slot ``(t - interval, t]`` (the caller checks that the
    slot lies inside the holding)."""
    i = bisect_right(p.starts2, 2 * t - interval) - 1
    if i < 0:
        return 0
    a = p.levels[i]
    j = p.jitters[i]
    if j:
        a += j * NOISE[(noise_base + t) & NOISE_MASK] // 1000
    if a <= 0:
        return 0
    if a >= 1000:
        return 1000
    if quantum != 1:
        a = (a + quantum // 2) // quantum * quantum
    return a


# --- program builders (all times in seconds relative to the scenario start) ----------------

IDLE = 6  # an idle GPU that holds a context: 0.6 % give or take as much


def constant(start: int, level: int, jitter: int = 0) -> Program:
    p = Program()
    p.add(start, level, jitter)
    return p


def busy(rng: random.Random, start: int, busy: tuple[float, float]) -> Program:
    p = Program()
    p.add(start, milli(rng.uniform(*busy)), 50)
    return p


def training(
    rng: random.Random,
    start: int,
    end: int,
    *,
    busy: tuple[float, float],
    every: tuple[int, int],
    checkpoint: tuple[int, int],
    nodes: int,
    straggler_rate: float = 0.0,
    barrier: tuple[int, int] = (0, 0),
    warmup: int = 300,
) -> list[Program]:
    """One program per node of a synchronous job: warm-up, then compute phases separated by
    checkpoint writes (every GPU idle) and, now and then, a barrier where all nodes but one
    straggler wait idle."""
    programs = [Program() for _ in range(nodes)]
    level = milli(rng.uniform(*busy))
    t = start
    for p in programs:
        p.add(t, 150, 60)  # loading data, building the model
    t += warmup
    while t < end:
        for p in programs:
            p.add(t, level, 60)
        t += rng.randint(*every)
        if nodes > 1 and rng.random() < straggler_rate and t < end:
            slow = rng.randrange(nodes)
            wait = rng.randint(*barrier)
            for n, p in enumerate(programs):
                if n != slow:
                    p.add(t, IDLE, IDLE)
            t += wait
            for p in programs:
                p.add(t, level, 60)
            t += rng.randint(*every) // 2
        if t >= end:
            break
        for p in programs:
            p.add(t, IDLE, IDLE)
        t += rng.randint(*checkpoint)
    return programs


def bursty(
    rng: random.Random,
    start: int,
    end: int,
    *,
    bursts: tuple[int, int],
    burst: tuple[int, int],
    busy: tuple[float, float],
) -> Program:
    """Idle, held, with a few busy bursts: a notebook or an interactive session."""
    p = Program()
    spans = []
    for _ in range(rng.randint(*bursts)):
        length = rng.randint(*burst)
        if end - start > length + 60:
            at = rng.randint(start + 60, end - length)
            spans.append((at, length))
    p.add(start, IDLE, IDLE)
    t = start
    for at, length in sorted(spans):
        if at < t:
            continue  # overlapping bursts merge
        p.add(at, milli(rng.uniform(*busy)), 80)
        t = at + length
        p.add(t, IDLE, IDLE)
    return p


def diurnal(
    start: int,
    until: int,
    origin: datetime,
    *,
    peak: float,
    trough: float,
    peak_hour: float,
    step: int = 900,
) -> Program:
    """Demand that follows the day: ``trough`` at night, ``peak`` at ``peak_hour`` UTC."""
    p = Program()
    t = max(start, -step)  # what happened days before the window is never sampled
    day0 = origin.hour * 3600 + origin.minute * 60
    while t < until:
        hour = ((day0 + t + step / 2) / 3600) % 24
        shape = 0.5 + 0.5 * math.cos(2 * math.pi * (hour - peak_hour) / 24)
        p.add(t, milli(trough + (peak - trough) * shape), 30)
        t = (t // step + 1) * step
    return p
