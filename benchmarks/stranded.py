"""``python -m benchmarks stranded``: the stranded-GPU views at an estate's size.

Loads ``--nodes`` 8-GPU nodes polled every minute for ``--days`` into ``node_capacity`` (made
by ClickHouse itself, one row per node and poll, as the sink stores node-capacity.v1), each
holding a CPU-heavy job (1 GPU, 24 of 64 cores), a 4-GPU job at its share and, on every
fourth node, a CPU-only job (8 cores), and times the queries the report, the page and
/metrics run on them: the week's split of free GPUs, who stranded them, where, and the
latest poll. ``--clickhouse URL`` runs on a server instead of the embedded endpoint.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from datetime import UTC, datetime, timedelta
from typing import Any

from benchmarks.database import bench_database
from gpugap.report.beyond import STRANDED, STRANDED_BY_ALLOCATION, STRANDED_BY_NODE
from gpugap.web import metrics

START = datetime(2026, 11, 1, tzinfo=UTC)
LOAD = """
INSERT INTO node_capacity (cluster, node, time, interval_s, scheduler, source, pool, gpu_model,
    gpu_memory_mib, gpus, cpus, memory_mib, schedulable, allocation_ids, allocation_gpus,
    allocation_cpus, allocation_memory_mib, ingested_at)
SELECT 'c1', concat('n', toString(number % {nodes:UInt32})),
    toDateTime64({start:DateTime}, 3, 'UTC') + intDiv(number, {nodes:UInt32}) * 60, 60,
    'slurm', 'slurm_scontrol', 'gpu', 'h100', 81559, 8, 64, 524288, 1,
    if(number % 4 = 0,
        [concat('slurm/c1/', toString(number % {nodes:UInt32})),
         concat('slurm/c1/w', toString(number % {nodes:UInt32})), 'slurm/c1/cpu'],
        [concat('slurm/c1/', toString(number % {nodes:UInt32})),
         concat('slurm/c1/w', toString(number % {nodes:UInt32}))]),
    if(number % 4 = 0, [1., 4., 0.], [1., 4.]),
    if(number % 4 = 0, [24., 32., 8.], [24., 32.]),
    if(number % 4 = 0, [65536., 262144., 8192.], [65536., 262144.]),
    now64(3)
FROM numbers({first:UInt64}, {rows:UInt64})
"""
QUERIES = {
    "week's free GPUs split (report)": STRANDED,
    "who stranded them, top 10 (report)": STRANDED_BY_ALLOCATION,
    "where, top 10 nodes (report)": STRANDED_BY_NODE,
}


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks stranded", description=__doc__)
    ap.add_argument("--nodes", type=int, default=500)
    ap.add_argument("--days", type=float, default=7.0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--clickhouse", default=None, help="a server's URL (default: embedded)")
    args = ap.parse_args(argv)
    polls = round(args.days * 1440)
    rows = args.nodes * polls
    with bench_database(args.clickhouse, "gpugap_bench_stranded") as (_, client):
        _say(f"loading {rows:,} node polls ({args.nodes:,} nodes, {args.days:g} days)...")
        started = time.perf_counter()
        chunk = 5_000_000
        for first in range(0, rows, chunk):
            n = min(chunk, rows - first)
            client.command(LOAD, parameters={"nodes": args.nodes, "start": START,
                                             "first": first, "rows": n})  # fmt: skip
        loaded = time.perf_counter() - started
        params: dict[str, Any] = {
            "since": START + timedelta(days=args.days) - timedelta(days=7),
            "until": START + timedelta(days=args.days),
            "top": 10,
        }
        print(f"{rows:,} node polls ({args.nodes:,} 8-GPU nodes, one a minute, "
              f"{args.days:g} days) loaded in {loaded:.1f} s")  # fmt: skip
        first_answer = client.query(STRANDED, parameters=params).result_rows[0]
        print("  week: allocated, usable, by CPU, by memory, unavailable GPU-h = "
              + ", ".join(f"{float(x):,.1f}" for x in first_answer))  # fmt: skip
        queries = {**QUERIES, "/metrics stranded now": metrics._STRANDED}
        for name, sql in queries.items():
            took = []
            for _ in range(args.repeats):
                t0 = time.perf_counter()
                client.query(sql, parameters=params if "{" in sql else None)
                took.append((time.perf_counter() - t0) * 1000)
            print(f"  {name:<40} {statistics.median(took):>9.1f} ms (median of {args.repeats})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
