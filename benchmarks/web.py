"""``python -m benchmarks web``: the capacity-gap page (``gpugap web``) loaded in headless
Chromium over millions of synthetic GPU-minutes (the warehouse benchmark's generator, plus
the report benchmark's alerts), from navigation to every chart and table drawn; and each of
its API calls on its own. ``--screenshot PATH`` also saves the page (the README's picture:
``python -m benchmarks web --demo --screenshot docs/web.png``, on the demo's day)."""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import SecretStr

from gpugap.groundfloor.settings import ClickHouseSettings

DATABASE = "gpugap_bench_web"
READER_PASSWORD = "bench-reader"  # the endpoint's read-only user, which the page queries as
API = ("summary", "timeseries", "split", "top_waste", "idle_now", "partial_gangs", "alerts",
       "unallocated", "padding")  # fmt: skip


def _say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _load_synthetic(settings: ClickHouseSettings, rows: int) -> None:
    from benchmarks.report import ALERTS, settle
    from benchmarks.warehouse import START, load
    from gpugap.warehouse.client import connect

    client = connect(settings)
    try:
        client.command(ALERTS, parameters={"start": START})
        load(client, 0, rows)
        _say(f"waited {settle(client):.0f} s for background merges")
    finally:
        client.close()


def _load_demo(settings: ClickHouseSettings) -> None:
    from tests.harness.demo_data import load

    _say("loading the demo's day (simulator -> worker's join -> sink, ~100 s)")
    load(settings)


def browser(exe: str) -> tuple[Any, Any, str]:
    from playwright.sync_api import sync_playwright

    from tests.harness.chromium import CHROMIUM_ARGS

    profile = tempfile.mkdtemp(prefix="gpugap-bench-chromium-")
    pw = sync_playwright().start()
    ctx = pw.chromium.launch_persistent_context(
        profile, executable_path=exe, headless=True, args=CHROMIUM_ARGS,
        viewport={"width": 1400, "height": 1000},
    )  # fmt: skip
    return pw, ctx, profile


def load_page(ctx: Any, url: str) -> tuple[float, float]:
    """(ms from navigation to everything drawn, ms of the page's own data load and drawing)."""
    page = ctx.new_page()
    try:
        t = time.perf_counter()
        page.goto(url)
        page.wait_for_function(  # a function: the page's CSP forbids eval
            "() => document.body.dataset.state === 'error' || "
            "(document.body.dataset.state === 'ready' && "
            "Number(document.body.dataset.generation) > 0)",
            timeout=120_000,
        )
        wall = (time.perf_counter() - t) * 1000
        if page.get_attribute("body", "data-state") != "ready":
            raise SystemExit(f"the page failed: {page.text_content('#status')}")
        load_page.last = page.evaluate(  # type: ignore[attr-defined]
            "() => [performance.getEntriesByType('navigation')[0].domContentLoadedEventEnd, "
            "performance.getEntriesByType('resource').map((e) => "
            "[e.name.split('/').slice(3).join('/').split('?')[0], e.startTime, e.duration])]"
        )
        return wall, float(page.evaluate("window.gpugapLoadMs"))
    finally:
        page.close()


def api_times(url: str, repeats: int, query: str) -> dict[str, float]:
    import requests

    out = {}
    for name in API:
        times = []
        for _ in range(repeats):
            t = time.perf_counter()
            requests.get(f"{url}api/{name}?{query}", timeout=120).raise_for_status()
            times.append((time.perf_counter() - t) * 1000)
        out[name] = statistics.median(times)
    return out


def screenshot(ctx: Any, url: str, path: Path) -> None:
    page = ctx.new_page()
    try:
        page.goto(url)
        page.wait_for_function("() => document.body.dataset.state === 'ready'", timeout=120_000)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(page.screenshot(full_page=True))
        _say(f"screenshot: {path}")
    finally:
        page.close()


def measure(settings: ClickHouseSettings, args: argparse.Namespace, label: str) -> None:
    import requests

    from tests.harness.chromium import chromium_path
    from tests.harness.web_page import Background

    exe = chromium_path()
    if exe is None:
        raise SystemExit("Chromium is not installed (apt-get install chromium)")
    server = Background(settings)
    pw, ctx, profile = browser(exe)
    try:
        extent = requests.get(server.url + "api/extent", timeout=60).json()
        end = -(-(extent["latest"] + 60) // 3600) * 3600
        cases = {"all the data": "", "last 24 h": "?preset=24"}
        print(f"{label}; the page in headless Chromium, median of {args.repeats} (first: cold):")
        for name, query in cases.items():
            first = load_page(ctx, server.url + query)
            runs = [load_page(ctx, server.url + query) for _ in range(args.repeats)]
            wall = statistics.median(r[0] for r in runs)
            own = statistics.median(r[1] for r in runs)
            print(f"  page load, {name:<14} {wall:>8.0f} ms (data and drawing {own:.0f} ms; "
                  f"first {first[0]:.0f} ms)", flush=True)  # fmt: skip
            dom, entries = load_page.last  # type: ignore[attr-defined]
            slow = sorted(entries, key=lambda e: -(e[1] + e[2]))[:4]
            print(f"    last run: DOMContentLoaded at {dom:.0f} ms; last to answer: "
                  + ", ".join(f"{n} {t:.0f}+{d:.0f} ms" for n, t, d in slow))  # fmt: skip
        since = max(extent["first"], end - 400 * 86400)
        for name, ms in api_times(server.url, args.repeats, f"from={since}&to={end}").items():
            print(f"    /api/{name:<22} {ms:>8.1f} ms")
        if args.screenshot:
            screenshot(ctx, server.url, args.screenshot)
    finally:
        ctx.close()
        pw.stop()
        server.stop()
        import shutil

        shutil.rmtree(profile, ignore_errors=True)


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks web", description=__doc__)
    p.add_argument("--rows", default="10e6", help="synthetic GPU-minute rows (10e6)")
    p.add_argument("--repeats", type=int, default=5, help="page loads per figure (median)")
    p.add_argument("--clickhouse", metavar="URL", help="an existing ClickHouse (its reader)")
    p.add_argument("--demo", action="store_true", help="the demo's day instead of synthetic rows")
    p.add_argument("--screenshot", type=Path, metavar="PNG", help="also save the page here")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    from benchmarks.database import bench_database

    args = parse(argv)
    rows = int(float(args.rows))
    embedded = args.clickhouse is None
    env = {"GPUGAP_CLICKHOUSE_READONLY_PASSWORD": READER_PASSWORD}
    with bench_database(args.clickhouse, DATABASE, env=env) as (created, _):
        # the page reads as the embedded endpoint's read-only user
        reader = {"readonly_password": SecretStr(READER_PASSWORD)} if embedded else {}
        settings = created.model_copy(update=reader)
        if args.demo:
            _load_demo(settings)
            label = "the demo's day"
        else:
            _say(f"loading {rows:,} rows...")
            _load_synthetic(settings, rows)
            label = f"{rows:,} GPU-minute rows (1,000 GPUs, {rows / 1000 / 1440:.0f} days)"
        measure(settings, args, label)
    return 0


if __name__ == "__main__":
    sys.exit(main())
