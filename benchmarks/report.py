"""``python -m benchmarks report``: the whole report (every query it runs) over millions of
synthetic
GPU-minutes, built by the warehouse benchmark's generator (benchmarks/warehouse.py), plus alerts."""

from __future__ import annotations

import statistics
import sys
import time
from datetime import UTC, datetime, timedelta
from typing import Any

from gpugap.report.build import build_report

DATABASE = "gpugap_bench_report"

# 10,000 alerts, half of them partial gangs; three in four resolved, the rest still open
ALERTS = """
INSERT INTO alerts (alert_id, kind, state, time, opened_at, cluster, scheduler, gang_id,
    owner, team, workload_class, nodes, idle_minutes, idle_gpu_hours, pending_pods,
    running_pods, message)
SELECT concat('bench/', toString(a)), if(a % 2 = 0, 'partial_gang', 'idle_gpu'),
    ['open', 'update', 'resolved'][1 + s], {start:DateTime64(3, 'UTC')} + a * 600 + s * 60,
    {start:DateTime64(3, 'UTC')} + a * 600, 'c1', 'kubernetes', concat('gang', toString(a)),
    concat('user', toString(a % 50)), concat('team', toString(a % 8)), 'batch',
    ['node0001', 'node0002'], 10 + s, (a % 97) / 10, 1, 3, 'bench alert'
FROM (SELECT intDiv(number, 3) AS a, number % 3 AS s FROM numbers(30000))
WHERE s < 2 OR a % 4 != 0
"""


def _say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def cases(end: datetime) -> dict[str, dict[str, Any]]:
    """The report as people would ask for it: all time, the last day, the last week."""
    return {
        "all time, by class": {"since": None, "until": None, "by": "class"},
        "last 24 h, by team": {"since": end - timedelta(hours=24), "until": end, "by": "team"},
        "last 7 days, by allocation": {
            "since": end - timedelta(days=7),
            "until": end,
            "by": "allocation",
        },
    }


def settle(client: Any, limit_s: float = 900.0) -> float:
    """Wait for the background merges a bulk load leaves behind (a live warehouse merges small
    inserts as they come): measured during them, every query competes with merges of tens of
    millions of rows on the same two cores. Returns the seconds waited."""
    start = time.perf_counter()
    while time.perf_counter() - start < limit_s:
        merging = client.query(
            "SELECT count() FROM system.merges WHERE database = currentDatabase()"
        ).result_rows[0][0]
        if not merging:
            break
        time.sleep(2)
    return time.perf_counter() - start


def measure(client: Any, repeats: int, end: datetime) -> list[str]:
    lines = []
    for label, kw in cases(end).items():
        totals: list[float] = []
        per_query: dict[str, list[float]] = {}
        for _ in range(repeats):
            timings: dict[str, float] = {}
            t = time.perf_counter()
            build_report(client, kw["since"], kw["until"], kw["by"], 10, timings=timings)
            totals.append((time.perf_counter() - t) * 1000)
            for name, ms in timings.items():
                per_query.setdefault(name, []).append(ms)
        lines.append(f"  report, {label:<30} {statistics.median(totals):>8.1f} ms total")
        lines += [
            f"    {name:<34} {statistics.median(ms):>8.1f} ms" for name, ms in per_query.items()
        ]
    return lines


def main(row_counts: list[int], repeats: int, url: str | None) -> int:
    from benchmarks.database import bench_database
    from benchmarks.warehouse import START, load

    with bench_database(url, DATABASE) as (_, client):
        client.command(ALERTS, parameters={"start": START})
        loaded = 0
        for target in sorted(row_counts):
            _say(f"loading {target:,} rows...")
            load(client, loaded, target - loaded)
            loaded = target
            end = START + timedelta(minutes=loaded // 1000)
            waited = settle(client)
            print(
                f"{loaded:,} GPU-minute rows (1,000 GPUs, {loaded / 1000 / 1440:.0f} days; "
                f"after {waited:.0f} s of background merges), median of {repeats}:"
            )
            print("\n".join(measure(client, repeats, end.astimezone(UTC))), flush=True)
    return 0
