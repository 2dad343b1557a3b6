"""``python -m benchmarks coverage``: what counting coverage by the second changes (no Kafka).

Runs a simulator scenario (``--scenario``, default ``small``; ``--loss`` and ``--interval``
override its lost-sample rate and sample interval) through the worker's Join in-process (as
tests/harness/demo_data.py does) and prints, over the allocations' minutes in the window, the
unmeasured GPU-hours and idle GPU-minutes counted by the second (the stream's rows now) beside
the same rows counted by the minute (a minute with any reading measured whole: what the
rollups did before migration 014), and the simulator's truth of the unmeasured hours. The
difference is seconds nobody measured that a minute-grain count reads as zero use, and idle
minutes that are only missing data.
"""

from __future__ import annotations

import argparse
import time

from gpugap.schemas import GpuMinute
from gpugap.schemas.clock import MINUTE_S
from gpugap.simulator import build, truth
from gpugap.simulator import scenario as scenarios
from tests.harness.demo_data import decoded, edited, emitted, worked


def load(name: str, loss: float | None, interval: int | None) -> scenarios.Scenario:
    sc: scenarios.Scenario = edited(scenarios.load(name), interval=interval, loss=loss)
    return sc


def counts(rows: list[GpuMinute], threshold: float) -> dict[str, float]:
    """Unmeasured GPU-hours and whole idle minutes, by the second and by the minute."""
    held = [m for m in rows if m.allocation_id is not None]
    whole = [m for m in held if (m.device_s or m.allocated_s) >= MINUTE_S]
    return {
        "allocated_gpu_h": sum(m.allocated_s for m in held) / 3600,
        "unmeasured_gpu_h_second": sum(m.allocated_s - m.measured for m in held) / 3600,
        "unmeasured_gpu_h_minute": sum(m.allocated_s for m in held if m.no_samples) / 3600,
        # GPU-equivalent minutes (a whole minute of a slice is its share)
        "idle_minutes_second": sum(
            m.allocated_s / MINUTE_S
            for m in whole
            if m.measured > 0 and m.consumed_gpu_s < threshold * m.measured
        ),
        "idle_minutes_minute": sum(
            m.allocated_s / MINUTE_S
            for m in whole
            if not m.no_samples and m.consumed_gpu_s < threshold * m.allocated_s
        ),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks coverage", description=__doc__)
    ap.add_argument("--scenario", default="small")
    ap.add_argument("--loss", type=float, default=None, help="lost node samples, 0..1")
    ap.add_argument("--interval", type=int, default=None, help="sample interval, seconds")
    args = ap.parse_args(argv)
    sc = load(args.scenario, args.loss, args.interval)
    window = sc.scenario.duration
    started = time.perf_counter()
    published = emitted(sc)
    rows = [r for r in decoded(worked(published)) if isinstance(r, GpuMinute)]
    want = truth.compute(sc, build(sc, window), window)
    seconds = time.perf_counter() - started
    w0, w1 = want["window"]["start"], want["window"]["end"]
    inside = [m for m in rows if w0 <= m.minute.isoformat().replace("+00:00", "Z") < w1]
    got = counts(inside, sc.scenario.idle_threshold)
    print(
        f"{sc.scenario.name}: loss {sc.faults.sample_loss_rate:.0%}, "
        f"{len(published):,} messages, {len(inside):,} rows in the window ({seconds:.1f} s)"
    )
    print(f"{'':22}{'by the second':>15}{'by the minute':>15}{'truth':>10}")
    print(
        f"{'unmeasured GPU-h':22}{got['unmeasured_gpu_h_second']:>15.4f}"
        f"{got['unmeasured_gpu_h_minute']:>15.4f}"
        f"{want['totals']['unmeasured_gpu_s'] / 3600:>10.4f}"
    )
    # every idle minute held whole (what the rollups count), not only those in alert runs
    print(
        f"{'idle GPU-minutes':22}{got['idle_minutes_second']:>15.2f}"
        f"{got['idle_minutes_minute']:>15.2f}{'':>10}"
    )
    print(
        f"allocated GPU-h {got['allocated_gpu_h']:.4f} "
        f"(truth {want['totals']['allocated_gpu_s'] / 3600:.4f})"
    )
    return 0
