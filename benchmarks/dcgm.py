"""``python -m benchmarks dcgm`` (or ``python -m benchmarks dcgm``): 100 dcgm-exporter endpoints
scraped concurrently, round after round.

A child process serves 100 recorded 8-GPU scrapes (tests/fixtures/dcgm/a100x8.txt, each with
its own host name and UUIDs) from 100 aiohttp servers on 127.0.0.1; this process runs the
real ``DcgmProducer`` against them (fetch, parse, build, encode every record). It prints the
wall time of each round, first back to back (the most it can do), then on the 15 s schedule
with this process's CPU time per round (how much of the schedule one round uses).
"""

from __future__ import annotations

import asyncio
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from gpugap.groundfloor.kafka.publish import Publisher
from gpugap.groundfloor.settings import Settings
from gpugap.producers.dcgm.producer import DcgmProducer
from gpugap.producers.dcgm.settings import DcgmSettings
from gpugap.schemas import Record, Topic, encode

FIXTURE = Path(__file__).parents[1] / "tests" / "fixtures" / "dcgm" / "a100x8.txt"


def scrape_text(i: int) -> str:
    text = FIXTURE.read_text().replace('Hostname="dgx-a100-017"', f'Hostname="dgx-{i:03d}"')
    return re.sub(r'UUID="GPU-[0-9a-f]{4}', f'UUID="GPU-{i:04x}', text)  # distinct, same shape


async def _serve(n: int) -> None:
    from aiohttp import web

    runners, ports = [], []
    for i in range(n):
        body = scrape_text(i).encode()

        async def metrics(request: web.Request, body: bytes = body) -> web.Response:
            return web.Response(body=body, content_type="text/plain")

        app = web.Application()
        app.router.add_get("/metrics", metrics)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        runners.append(runner)
        ports.append(runner.addresses[0][1])
    print(" ".join(map(str, ports)), flush=True)
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(None, sys.stdin.read)  # serve until the parent closes stdin
    for runner in runners:
        await runner.cleanup()


class _Encoding(Publisher):
    """Encodes every record as a Kafka publisher would, and keeps only the byte count."""

    def __init__(self) -> None:
        self.bytes = 0

    async def send(self, topic: Topic[Any], record: Record) -> None:
        self.bytes += len(encode(record))
        self.sent += 1

    async def flush(self) -> None:
        pass


async def _rounds(urls: list[str], back_to_back: int, scheduled: int, interval: float) -> None:
    cfg = DcgmSettings(endpoints=urls, interval_s=interval)
    producer = DcgmProducer(Settings(cluster="bench"), cfg)
    producer.publisher = pub = _Encoding()
    loop = asyncio.get_running_loop()

    async def one() -> tuple[float, float, int]:
        cpu, t = time.process_time(), loop.time()
        sent = pub.sent
        for record in await producer.poll():
            await producer.emit(record)
        return loop.time() - t, time.process_time() - cpu, pub.sent - sent

    try:
        await one()  # connections opened, caches warm
        fast = [await one() for _ in range(back_to_back)]
        print(
            f"back to back: {len(fast)} rounds of {len(urls)} endpoints x 8 GPUs, "
            f"{fast[-1][2]} node samples each"
        )
        for wall, cpu, n in fast:
            print(f"  round {wall * 1000:7.0f} ms wall, {cpu * 1000:6.0f} ms CPU, {n} samples")
        walls = [w for w, _, _ in fast]
        print(f"  median {statistics.median(walls) * 1000:.0f} ms per round", flush=True)
        print(f"on the schedule: a round every {interval:.0f} s, {scheduled} rounds")
        worst = 0.0
        for _ in range(scheduled):
            started = loop.time()
            wall, cpu, n = await one()
            worst = max(worst, wall)
            print(
                f"  round {wall * 1000:7.0f} ms wall, {cpu * 1000:6.0f} ms CPU "
                f"({cpu / interval:.1%} of the interval), {n} samples, "
                f"{producer.counts['unreachable']} unreachable, "
                f"{producer.counts['dead_lettered']} refused so far",
                flush=True,
            )
            await asyncio.sleep(max(0.0, interval - (loop.time() - started)))
        failed = producer.counts["unreachable"] + producer.counts["dead_lettered"]
        verdict = "sustained" if worst < interval and not failed else "NOT sustained"
        print(f"worst round {worst:.2f} s of {interval:.0f} s: {verdict}")
    finally:
        await producer.close()


def main(repeats: int = 3, endpoints: int = 100, interval: float = 15.0) -> int:
    server = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.dcgm", "--serve", str(endpoints)],
        cwd=Path(__file__).parents[1],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stdout is not None
        ports = server.stdout.readline().split()
        if len(ports) != endpoints:
            print("dcgm bench: the scrape servers did not start", file=sys.stderr)
            return 1
        urls = [f"http://127.0.0.1:{p}/metrics" for p in ports]
        asyncio.run(_rounds(urls, max(3, repeats), min(repeats, 3), interval))
    finally:
        if server.stdin:
            server.stdin.close()
        try:
            server.wait(10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--serve":
        asyncio.run(_serve(int(sys.argv[2])))
    else:
        sys.exit(main())
