"""``python -m benchmarks recommend``: ``gpugap recommend compute`` and ``list`` over millions
of synthetic GPU-minutes (benchmarks/warehouse.py's generator: 1,000 GPUs, 100,000 finished
Slurm jobs), plus 10,000 alerts (half partial gangs, benchmarks/report.py)."""

from __future__ import annotations

import statistics
import sys
import time

DATABASE = "gpugap_bench_recommend"


def _say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def main(row_counts: list[int], repeats: int, url: str | None) -> int:
    from benchmarks.database import bench_database
    from benchmarks.report import ALERTS, settle
    from benchmarks.warehouse import START, load
    from gpugap.recommend.engine import compute, listing
    from gpugap.warehouse.rows import RECOMMENDATION_COLUMNS, recommendation_row

    with bench_database(url, DATABASE) as (_, client):
        client.command(ALERTS, parameters={"start": START})
        loaded = 0
        for target in sorted(row_counts):
            _say(f"loading {target:,} rows...")
            t = time.perf_counter()
            load(client, loaded, target - loaded)
            loaded = target
            waited = settle(client)
            _say(f"  loaded in {time.perf_counter() - t:.0f} s (merges {waited:.0f} s)")
            totals: list[float] = []
            stages: dict[str, list[float]] = {}
            lists: list[float] = []
            n = 0
            for _ in range(repeats):
                timings: dict[str, float] = {}
                t = time.perf_counter()
                _, recs = compute(client, timings=timings)
                # what the sink does with the published records
                rows = [recommendation_row(r) for r in recs]
                client.insert("recommendations", rows, column_names=RECOMMENDATION_COLUMNS)
                totals.append((time.perf_counter() - t) * 1000)
                for k, v in timings.items():
                    stages.setdefault(k, []).append(v)
                t = time.perf_counter()
                listing(client, 20)
                lists.append((time.perf_counter() - t) * 1000)
                n = len(recs)
            print(
                f"{loaded:,} GPU-minute rows (1,000 GPUs, {loaded / 1000 / 1440:.0f} days, "
                f"14 days read), median of {repeats}:"
            )
            print(f"  recommend compute (+ sink insert) {statistics.median(totals):>8.1f} ms"
                  f"  ({n} recommendations)")  # fmt: skip
            for k, v in stages.items():
                print(f"    {k:<30} {statistics.median(v):>8.1f} ms")
            print(f"  recommend list (top 20)          {statistics.median(lists):>8.1f} ms")
            sys.stdout.flush()
    return 0
