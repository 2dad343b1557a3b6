"""``python -m benchmarks warehouse``: insert throughput through the endpoint beside chDB
in-process,
view latency over millions of synthetic GPU-minutes, and bytes on disk per row."""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from typing import Any

from gpugap.groundfloor.settings import ClickHouseSettings
from gpugap.warehouse.client import client_options, connect
from gpugap.warehouse.migrate import migrations
from gpugap.warehouse.rows import DAILY, ROLLUP

START = datetime(2026, 1, 1, tzinfo=UTC)

# Synthetic but shaped like an estate: whole nodes allocated in staggered 4-hour slots (one in
# five slots free), a per-job activity level with per-minute noise, checkpoint dips, memory and
# power following activity; values vary minute to minute so compression is not flattered.
SYNTHETIC = """
WITH
    number % {gpus:UInt32} AS g,
    intDiv(number, {gpus:UInt32}) + {first_minute:UInt64} AS m,
    intDiv(g, 8) AS nd,
    intDiv(m + nd * 53, 240) AS slot,
    cityHash64(nd, slot) AS job,
    job % 5 != 0 AS held,
    greatest(0, least(1, (job % 100) / 100 + ((cityHash64(g, m) % 11) - 5) / 100
        - if(m % 60 < 5, 1, 0))) AS activity
SELECT
    'c1', concat('node', leftPad(toString(nd), 4, '0')),
    concat('GPU-', lower(substring(hex(MD5(toString(g))), 1, 8)), '-',
           lower(substring(hex(MD5(toString(g))), 9, 4)), '-',
           lower(substring(hex(MD5(toString(g))), 13, 4)), '-',
           lower(substring(hex(MD5(toString(g))), 17, 4)), '-',
           lower(substring(hex(MD5(toString(g))), 21, 12))),
    toDateTime({start:DateTime}, 'UTC') + m * 60,
    if(held, concat(if(job % 2 = 0, 'slurm/c1/', 'k8s/c1/'), toString(job % 100000000)), ''),
    if(held, if(job % 2 = 0, 'slurm', 'kubernetes'), ''),
    if(held, ['batch', 'service', 'interactive'][1 + job % 3], ''),
    if(held, concat('user', toString(job % 50)), ''),
    if(held, concat('team', toString(job % 8)), ''),
    '',
    if(held, 60000, 0), if(held, 0, 60000),
    toUInt16(if(held, 60000 * activity, if(cityHash64(g, m) % 200 = 0, 30000, 0))),
    toUInt16(least(10000, activity * 10000 + 500)), 'sm_active',
    if(held, 20000 + job % 60000, 0),
    toUInt16((60 + 600 * activity) * 10 + cityHash64(g, m) % 50),
    6, 0,
    0, 0,  -- idle_threshold_bp, idle_after_minutes (migration 007): 0 = judged by the class
    now64(3)
FROM numbers({rows:UInt64})
"""
GENERATE = "INSERT INTO gpu_minutes " + SYNTHETIC

VIEWS = {
    "gap by class, all time": "SELECT workload_class, sum(allocated_gpu_h), sum(consumed_gpu_h), "
    "sum(gap_gpu_h) FROM v_capacity_gap_daily GROUP BY workload_class",
    "gap by team, last 7 days": "SELECT team, sum(allocated_gpu_h), sum(gap_gpu_h) "
    "FROM v_capacity_gap_daily WHERE day >= toDate({since:DateTime}) GROUP BY team",
    "gap by class, last 24 h (hourly)": "SELECT workload_class, sum(gap_gpu_h) "
    "FROM v_capacity_gap WHERE hour >= {since:DateTime} + INTERVAL 6 DAY GROUP BY workload_class",
    "top 10 allocations by waste": "SELECT * FROM v_top_waste LIMIT 10",
    "metadata of 10 allocations": "SELECT * FROM v_allocations WHERE cluster = 'c1' AND "
    "allocation_id IN ('slurm/c1/1', 'slurm/c1/10', 'slurm/c1/100', 'slurm/c1/1000', "
    "'slurm/c1/5', 'slurm/c1/50', 'slurm/c1/500', 'slurm/c1/5000', 'slurm/c1/7', 'slurm/c1/70')",
    "top 10 owners by waste": "SELECT owner, sum(gap_gpu_h) AS g FROM v_capacity_gap_daily "
    "GROUP BY owner ORDER BY g DESC LIMIT 10",
    "unallocated capacity": "SELECT sum(unallocated_gpu_h), sum(unattributed_gpu_h) "
    "FROM v_unallocated",
    "unattributed use by node": "SELECT node, sum(unattributed_gpu_h) AS u FROM v_unattributed "
    "GROUP BY node ORDER BY u DESC LIMIT 10",
    "slurm padding by user": "SELECT user, quantile(0.5)(limit_ratio), sum(padding_gpu_h) "
    "FROM v_slurm_padding GROUP BY user",
    "idle allocations now": "SELECT * FROM v_idle_now ORDER BY allocated_gpu_h DESC LIMIT 20",
}


def _say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def insert_throughput(settings: ClickHouseSettings, rows: int, repeats: int) -> dict[str, float]:
    """Rows/s for the same Native bytes straight into chDB in-process and through the
    endpoint: with clickhouse-connect (lz4, its default, and plain) and with a bare HTTP POST;
    plus the endpoint's own time per insert (its X-ClickHouse-Summary), to separate what the
    endpoint costs from what the client library costs."""
    import json

    import chdb
    import clickhouse_connect
    import requests

    client = connect(settings)
    # through a table: Native input matches columns by name, and the SELECT's columns are
    # named after their expressions (the rows landed as defaults and collapsed into one)
    client.command("CREATE TABLE IF NOT EXISTS bench_source AS gpu_minutes")
    client.command(
        "INSERT INTO bench_source " + SYNTHETIC,
        parameters={"gpus": 1000, "first_minute": 0, "start": START, "rows": rows},
    )
    native = client.raw_query("SELECT * FROM bench_source FORMAT Native")
    client.command("DROP TABLE bench_source")
    cols = [
        c
        for (c,) in client.query(
            "SELECT name FROM system.columns WHERE database = currentDatabase() "
            "AND table = 'gpu_minutes' ORDER BY position"
        ).result_rows
    ]
    client.command("CREATE TABLE IF NOT EXISTS bench_insert AS gpu_minutes")
    plain = clickhouse_connect.get_client(**{**client_options(settings), "compress": False})
    statement = f"INSERT INTO bench_insert ({', '.join(cols)})"
    pw = settings.password.get_secret_value() if settings.password else ""
    rates: dict[str, list[float]] = {
        "chDB in-process": [],
        "clickhouse-connect, lz4": [],
        "clickhouse-connect, plain": [],
        "HTTP POST, plain": [],
        "endpoint's own time": [],
    }

    def post() -> None:
        r = requests.post(
            settings.url,
            data=native,
            auth=(settings.user, pw),
            timeout=600,
            params={"database": settings.database, "query": statement + " FORMAT Native"},
        )
        r.raise_for_status()
        elapsed = int(json.loads(r.headers["X-ClickHouse-Summary"])["elapsed_ns"]) / 1e9
        rates["endpoint's own time"].append(rows / elapsed)

    with tempfile.TemporaryDirectory(prefix="gpugap-chdb-") as tmp:
        conn = chdb.connect(tmp)
        ddl = next(s for s in migrations()[0].statements() if "EXISTS gpu_minutes" in s)
        conn.query(ddl.replace("gpu_minutes", "bench_insert"))
        for _ in range(repeats):
            t = time.perf_counter()
            with conn.send_insert(statement, "Native") as ins:
                ins.append(native)
                ins.finish()
            rates["chDB in-process"].append(rows / (time.perf_counter() - t))
            for name, send in (
                (
                    "clickhouse-connect, lz4",
                    lambda: client.raw_insert(
                        "bench_insert", cols, insert_block=native, fmt="Native"
                    ),
                ),
                (
                    "clickhouse-connect, plain",
                    lambda: plain.raw_insert(
                        "bench_insert", cols, insert_block=native, fmt="Native"
                    ),
                ),
                ("HTTP POST, plain", post),
            ):
                t = time.perf_counter()
                send()
                rates[name].append(rows / (time.perf_counter() - t))
        conn.close()
    client.command("DROP TABLE bench_insert")
    client.close()
    plain.close()
    return {name: statistics.median(r) for name, r in rates.items()}


def load(client: Any, first: int, rows: int, gpus: int = 1000, chunk: int = 20_000_000) -> None:
    """Rows ``first`` .. ``first + rows`` of the synthetic estate, then their rollups."""
    done = first
    while done < first + rows:
        n = min(chunk, first + rows - done)
        t = time.perf_counter()
        client.command(
            GENERATE,
            parameters={"gpus": gpus, "first_minute": done // gpus, "start": START, "rows": n},
        )
        done += n
        rate = n / (time.perf_counter() - t)
        _say(f"  generated {done:,}/{first + rows:,} GPU-minutes ({rate:,.0f}/s)")
    end = START + timedelta(minutes=done // gpus + 60)
    day = (START + timedelta(minutes=first // gpus)).replace(hour=0, minute=0)
    while day < end:
        client.command(ROLLUP, parameters={"start": day, "end": day + timedelta(days=7)})
        client.command(DAILY, parameters={"start": day, "end": day + timedelta(days=7)})
        day += timedelta(days=7)
        _say(f"  rolled up to {min(day, end):%Y-%m-%d}")
    if first:
        return
    client.command(
        "INSERT INTO allocations (cluster, allocation_id, scheduler, owner, team, gpus_requested,"
        " time_limit_s, start_time, end_time, final_state) SELECT 'c1', concat('slurm/c1/', "
        "toString(number)), 'slurm', concat('user', toString(number % 50)), concat('team', "
        "toString(number % 8)), 8, 86400, toDateTime64({start:DateTime}, 3, 'UTC') + number * 60,"
        " toDateTime64({start:DateTime}, 3, 'UTC') + number * 60 + 3600 + number % 20000, "
        "'COMPLETED' FROM numbers(100000)",
        parameters={"start": START},
    )


def view_latency(client: Any, repeats: int, since: datetime) -> dict[str, float]:
    out = {}
    for name, sql in VIEWS.items():
        times = []
        for _ in range(repeats):
            t = time.perf_counter()
            client.query(sql, parameters={"since": since})
            times.append((time.perf_counter() - t) * 1000)
        out[name] = statistics.median(times)
    return out


def bytes_per_row(client: Any) -> tuple[float, int]:
    rows, size = client.query(
        "SELECT sum(rows), sum(bytes_on_disk) FROM system.parts WHERE active "
        "AND database = currentDatabase() AND table = 'gpu_minutes'"
    ).result_rows[0]
    hours = client.query(
        "SELECT sum(bytes_on_disk) FROM system.parts WHERE active "
        "AND database = currentDatabase() AND table = 'gpu_hours'"
    ).result_rows[0][0]
    return (size + hours) / max(rows, 1), int(rows)


def main(row_counts: list[int], repeats: int, url: str | None) -> int:
    from benchmarks.database import bench_database

    with bench_database(url, "gpugap_bench") as (_, client):
        loaded = 0
        for target in sorted(row_counts):
            _say(f"loading {target:,} rows...")
            load(client, loaded, target - loaded)
            loaded = target
            minutes = loaded // 1000
            since = START + timedelta(minutes=minutes) - timedelta(days=7)
            per_row, rows = bytes_per_row(client)
            lat = view_latency(client, repeats, since)
            print(
                f"{rows:,} GPU-minute rows (1,000 GPUs, {minutes / 1440:.0f} days): "
                f"{per_row:.1f} bytes/row on disk (minutes + hourly rollup)"
            )
            for name, ms in lat.items():
                print(f"  {name:<30} {ms:>8.1f} ms (median of {repeats})")
            sys.stdout.flush()
    return 0
