"""``python -m benchmarks bi [--rows N] [--repeats N] [--clickhouse URL]``: the report's views
(benchmarks/warehouse.py's VIEWS) over millions of synthetic GPU-minutes, timed inside each
client library BI tools embed (the real drivers tests/harness/bi_drivers.py builds), beside
clickhouse-connect (the project's own client) in the same run.

Measured in rounds (``--repeats``, default 5): in each, every driver is started afresh (a
process of its own; clickhouse-connect, in this process, a client of its own), runs every view
``WARMUP`` times untimed and then once timed, by the driver program itself (from the call into
the driver to the last row read: process, JVM and Node start-up are not in it); the drivers'
order rotates from round to round. Every driver must get the rows clickhouse-connect gets. The
table gives the median per view per driver and its ratio to clickhouse-connect, and the
geometric mean of a driver's ratios."""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from benchmarks.report import settle
from benchmarks.warehouse import START, VIEWS, load, view_latency
from gpugap.groundfloor.settings import ClickHouseSettings

DATABASE = "gpugap_bench_bi"
WARMUP = 1  # untimed runs of each view before the timed ones, per driver process
SINCE = "{since:DateTime}"  # the one server-side parameter the views take
TIMEOUT = 1800.0  # s, one driver process (every view, warm-up and repeats)
REPO = Path(__file__).resolve().parents[1]
JS_SCRIPT = REPO / "tests" / "bi" / "js" / "bicheck.cjs"

# column header -> what is measured
DRIVERS = {
    "connect": "clickhouse-connect (Python, Native, lz4; the project's own client)",
    "go gzip": "clickhouse-go v2.47.0 database/sql over HTTP, gzip (Grafana's HTTP mode)",
    "go lz4": "clickhouse-go v2.47.0 database/sql over HTTP, LZ4 (Grafana's Native-mode codec)",
    "jdbc 0.9.9": "ClickHouse JDBC 0.9.9 (all jar), default properties, PreparedStatement",
    "jdbc 0.10.0": "ClickHouse JDBC 0.10.0, default properties, PreparedStatement",
    "js client": "@clickhouse/client 1.23.1 (Node), JSONEachRow, query_params",
}
BASELINE = "connect"


class DriverError(RuntimeError):
    pass


def _say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _run_json(what: str, cmd: list[str], stdin: str,
              env: dict[str, str] | None = None) -> list[dict[str, Any]]:  # fmt: skip
    try:
        proc = subprocess.run(
            cmd, input=stdin, capture_output=True, text=True, timeout=TIMEOUT, check=False,
            env={**os.environ, **(env or {})},
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise DriverError(f"{what}: {exc}") from exc
    try:
        out: list[dict[str, Any]] = json.loads(proc.stdout)
    except json.JSONDecodeError:
        raise DriverError(
            f"{what} exited {proc.returncode} without JSON:\n{proc.stdout[-2000:]}\n"
            f"--- stderr\n{proc.stderr[-2000:]}"
        ) from None
    for step in out:
        if step.get("error"):
            raise DriverError(f"{what}: {step.get('sql') or step.get('arg')!r}: {step['error']}")
    return out


def _timings(what: str, steps: list[dict[str, Any]], runs: int,
             expected: dict[str, int]) -> dict[str, list[float]]:  # fmt: skip
    """Each view's timed runs from the driver's steps (the last len(VIEWS) of them, warm-up
    dropped), after checking that the driver got the rows clickhouse-connect got."""
    steps = steps[-len(VIEWS) :]
    out = {}
    for name, step in zip(VIEWS, steps, strict=True):
        ms = [float(x) for x in step.get("elapsed_ms") or []]
        if len(ms) != WARMUP + runs:
            raise DriverError(f"{what}: {name}: {len(ms)} timings, expected {WARMUP + runs}")
        got = len(step.get("rows") or [])
        if got != expected[name]:
            raise DriverError(
                f"{what}: {name}: {got} rows, clickhouse-connect got {expected[name]}"
            )
        out[name] = ms[WARMUP:]
    return out


def _account(settings: ClickHouseSettings) -> tuple[str, str]:
    return settings.user, settings.password.get_secret_value() if settings.password else ""


def _host_port(settings: ClickHouseSettings) -> tuple[str, int]:
    url = urlparse(settings.url)
    return url.hostname or "127.0.0.1", url.port or 8123


Runner = Callable[[ClickHouseSettings, int, datetime, dict[str, int]], dict[str, list[float]]]


def connect_python(settings: ClickHouseSettings, runs: int, since: datetime,
                   expected: dict[str, int]) -> dict[str, list[float]]:  # fmt: skip
    """clickhouse-connect in this process: a client of its own, warmed up like the others."""
    from gpugap.warehouse.client import connect

    client = connect(settings)
    try:
        view_latency(client, WARMUP, since)
        out: dict[str, list[float]] = {name: [] for name in VIEWS}
        for _ in range(runs):  # view_latency gives medians: one run each
            for name, ms in view_latency(client, 1, since).items():
                out[name].append(ms)
        return out
    finally:
        client.close()


def expected_rows(settings: ClickHouseSettings, since: datetime) -> dict[str, int]:
    from gpugap.warehouse.client import connect

    client = connect(settings)
    try:
        return {
            name: len(client.query(sql, parameters={"since": since}).result_rows)
            for name, sql in VIEWS.items()
        }
    finally:
        client.close()


def _steps(runs: int, since: datetime, *, sql_key: str, params_key: str) -> list[dict[str, Any]]:
    """A ping, then each view warmed up and timed: the script of the Go and the JS harness
    (which name the query and its parameters differently)."""
    param = since.strftime("%Y-%m-%d %H:%M:%S")
    steps: list[dict[str, Any]] = [{"op": "ping"}]
    for sql in VIEWS.values():
        step: dict[str, Any] = {"op": "query", sql_key: sql, "repeat": WARMUP + runs}
        if SINCE in sql:
            step[params_key] = {"since": param}
        steps.append(step)
    return steps


def clickhouse_go(compression: str) -> Runner:
    def run(settings: ClickHouseSettings, runs: int, since: datetime,
            expected: dict[str, int]) -> dict[str, list[float]]:  # fmt: skip
        from tests.harness import bi_drivers as drivers

        host, port = _host_port(settings)
        user, pw = _account(settings)
        steps = _steps(runs, since, sql_key="sql", params_key="params")
        script = {
            "addr": f"{host}:{port}", "user": user, "password": pw,
            "database": settings.database, "compression": compression, "steps": steps,
        }  # fmt: skip
        what = f"clickhouse-go ({compression})"
        out = _run_json(what, [str(drivers.clickhouse_go())], json.dumps(script))
        return _timings(what, out, runs, expected)

    return run


def jdbc(version: str) -> Runner:
    def run(settings: ClickHouseSettings, runs: int, since: datetime,
            expected: dict[str, int]) -> dict[str, list[float]]:  # fmt: skip
        from tests.harness import bi_drivers as drivers

        host, port = _host_port(settings)
        user, pw = _account(settings)
        param = "ts:" + since.strftime("%Y-%m-%d %H:%M:%S")
        lines = ["connect"]
        for sql in VIEWS.values():
            # a JDBC client binds with "?" (setTimestamp): the driver writes the literal
            fields = ["repeat", str(WARMUP + runs), "query", sql.replace(SINCE, "?")]
            lines.append("\t".join(fields + [param] * sql.count(SINCE)))
        cmd = [
            "java", "-Xss4m", "-Duser.timezone=UTC", "-cp", drivers.jdbc(version), "BiCheck",
            "default", f"jdbc:clickhouse://{host}:{port}/{settings.database}", user, pw,
        ]  # fmt: skip
        what = f"ClickHouse JDBC {version}"
        out = _run_json(what, cmd, "".join(line + "\n" for line in lines))
        return _timings(what, out, runs, expected)

    return run


def js_client(settings: ClickHouseSettings, runs: int, since: datetime,
              expected: dict[str, int]) -> dict[str, list[float]]:  # fmt: skip
    from tests.harness import bi_drivers as drivers

    node = shutil.which("node")
    if not node:
        raise DriverError("node is not installed")
    user, pw = _account(settings)
    steps = _steps(runs, since, sql_key="query", params_key="query_params")
    script = {"url": settings.url, "username": user, "password": pw,
              "database": settings.database, "steps": steps}  # fmt: skip
    env = {"NODE_PATH": str(drivers.js_client() / "node_modules")}
    out = _run_json("@clickhouse/client", [node, str(JS_SCRIPT)], json.dumps(script), env)
    return _timings("@clickhouse/client", out, runs, expected)


RUNNERS: dict[str, Runner] = {
    "connect": connect_python,
    "go gzip": clickhouse_go("gzip"),
    "go lz4": clickhouse_go("lz4"),
    "jdbc 0.9.9": jdbc("0.9.9"),
    "jdbc 0.10.0": jdbc("0.10.0"),
    "js client": js_client,
}


def measure(settings: ClickHouseSettings, repeats: int, since: datetime,
            failed: dict[str, str]) -> dict[str, dict[str, float] | None]:  # fmt: skip
    """Median per view per driver over ``repeats`` rounds. Each round starts every driver
    afresh (a process of its own; for clickhouse-connect a client of its own), warms it up and
    times one run of each view; the drivers' order rotates from round to round, so drift on a
    shared machine (merges, other load) lands on all of them alike."""
    expected = expected_rows(settings, since)
    names = [n for n in RUNNERS if n not in failed]
    times: dict[str, dict[str, list[float]]] = {n: {v: [] for v in VIEWS} for n in names}
    for r in range(repeats):
        order = names[r % len(names) :] + names[: r % len(names)] if names else []
        _say(f"round {r + 1}/{repeats}: {', '.join(order)}")
        for name in order:
            if name in failed:
                continue
            t = time.perf_counter()
            try:
                got = RUNNERS[name](settings, 1, since, expected)
            except DriverError as exc:
                failed[name] = str(exc)
                _say(f"  {name} failed: {exc}")
                continue
            for view, ms in got.items():
                times[name][view] += ms
            _say(f"  {name}: {sum(sum(ms) for ms in got.values()):,.0f} ms of queries "
                 f"({time.perf_counter() - t:.1f} s with start-up and warm-up)")  # fmt: skip
    return {
        n: None if n in failed else {v: statistics.median(ms) for v, ms in times[n].items()}
        for n in RUNNERS
    }


def build_drivers() -> dict[str, str]:
    """Build (or find in the cache) every driver first, so no build lands inside a timing;
    returns the drivers that could not be built, with why."""
    from tests.harness import bi_drivers as drivers

    failed = {}
    builds: dict[str, Callable[[], Any]] = {
        "go gzip": drivers.clickhouse_go,
        "jdbc 0.9.9": lambda: drivers.jdbc("0.9.9"),
        "jdbc 0.10.0": lambda: drivers.jdbc("0.10.0"),
        "js client": drivers.js_client,
    }
    for name, build in builds.items():
        t = time.perf_counter()
        try:
            build()
        except drivers.DriverBuildError as exc:
            failed[name] = str(exc)
            if name == "go gzip":
                failed["go lz4"] = str(exc)
        _say(f"  {name}: ready ({time.perf_counter() - t:.1f} s)")
    return failed


def table(results: dict[str, dict[str, float] | None], failed: dict[str, str]) -> list[str]:
    """One line per view: each driver's median in ms and its ratio to clickhouse-connect; then
    the geometric mean of the ratios per driver."""
    base = results.get(BASELINE)
    width = 16
    lines = [f"{'view':<34}" + "".join(f"{d:>{width}}" for d in DRIVERS)]
    logs: dict[str, list[float]] = {d: [] for d in DRIVERS}
    for view in VIEWS:
        cells = []
        for d in DRIVERS:
            got = results.get(d)
            if got is None:
                cells.append(f"{'failed':>{width}}")
                continue
            ms = got[view]
            if d == BASELINE or base is None:
                cells.append(f"{ms:>{width}.1f}")
                continue
            ratio = ms / base[view]
            logs[d].append(math.log(ratio))
            cells.append(f"{ms:>{width - 8}.1f} ({ratio:4.2f}x)")
        lines.append(f"{view:<34}" + "".join(cells))
    geo = []
    for d in DRIVERS:
        if d == BASELINE:
            geo.append(f"{'1.00x':>{width}}")
        elif logs[d]:
            geo.append(f"{math.exp(statistics.fmean(logs[d])):>{width - 1}.2f}x")
        else:
            geo.append(f"{'-':>{width}}")
    lines.append(f"{'geometric mean ratio to connect':<34}" + "".join(geo))
    lines.append("")
    lines += [f"  {d:<12} {what}" for d, what in DRIVERS.items()]
    lines += [f"  {d}: failed: {why.splitlines()[0][:200]}" for d, why in failed.items()]
    return lines


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks bi", description=__doc__)
    p.add_argument("--rows", default="10e6", help="GPU-minute rows to load (default 10e6)")
    p.add_argument("--repeats", type=int, default=5, help="timed runs per view per driver")
    p.add_argument(
        "--clickhouse", metavar="URL",
        help=f"an existing ClickHouse instead of a throwaway embedded endpoint ({DATABASE} there "
        "is dropped and recreated)",
    )  # fmt: skip
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    from benchmarks.database import bench_database

    args = parse(argv)
    rows = int(float(args.rows))
    repeats = max(1, args.repeats)
    _say("building the drivers (cached after the first time)...")
    failed = build_drivers()
    url = args.clickhouse
    with bench_database(url, DATABASE) as (settings, client):
        _say(f"loading {rows:,} rows...")
        t = time.perf_counter()
        load(client, 0, rows)
        _say(f"  loaded in {time.perf_counter() - t:.0f} s; waiting for background merges")
        waited = settle(client)
        minutes = rows // 1000
        since = (START + timedelta(minutes=minutes) - timedelta(days=7)).astimezone(UTC)
        results = measure(settings, repeats, since, failed)
    print(
        f"{rows:,} GPU-minute rows (1,000 GPUs, {minutes / 1440:.1f} days; after {waited:.0f} s "
        f"of background merges): the report's views, ms, median of {repeats} rounds (a fresh "
        f"driver, {WARMUP} warm-up, 1 timed run each), timed inside each driver "
        f"(ratio to clickhouse-connect)"
    )
    print("\n".join(table(results, failed)), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
