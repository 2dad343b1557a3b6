"""``gpugap worker``: registered into gpugap's parser (heavy imports stay in the handler)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from collections.abc import Callable
from typing import Any

Cmd = Callable[..., argparse.ArgumentParser]


def register(sub: Any, cmd: Cmd) -> None:
    w = cmd(
        "worker",
        _worker,
        "join samples with Slurm/Kubernetes allocations into gpu.minutes, allocations and "
        "alerts (event time; commits offsets after the outputs are acknowledged)",
    )
    w.add_argument("--group", default="gpugap-worker", help="consumer group")
    w.add_argument(
        "--lateness", type=float, default=120.0, metavar="S", help="allowed lateness (seconds)"
    )
    w.add_argument(
        "--idle-flush",
        type=float,
        metavar="S",
        help="after S seconds without input, close every open minute (replays, tests)",
    )
    w.add_argument(
        "--idle-timeout", type=float, metavar="S", help="exit after S seconds without input"
    )
    w.add_argument(
        "--max-records", type=int, default=5000, metavar="N", help="records per poll (max)"
    )
    w.add_argument(
        "--commit-interval",
        type=float,
        default=1.0,
        metavar="S",
        help="seconds between state snapshots + offset commits",
    )
    w.add_argument(
        "--http",
        default="127.0.0.1:6066",
        metavar="HOST:PORT",
        help="liveness (/healthz) and Prometheus metrics (/metrics); '' = off",
    )


def _worker(args: argparse.Namespace) -> int:
    from gpugap.publish import KafkaPublisher
    from gpugap.settings import load
    from streams.core import CoreConfig
    from streams.worker import Worker, serve_http

    settings = load()
    logging.getLogger("streams").setLevel(settings.log_level)
    config = CoreConfig(lateness_ms=round(args.lateness * 1000))

    async def run() -> Worker:
        async with KafkaPublisher(settings.kafka) as pub:
            worker = Worker(
                settings.kafka,
                pub,
                group=args.group,
                config=config,
                idle_flush_s=args.idle_flush,
                idle_timeout_s=args.idle_timeout,
                max_records=args.max_records,
                commit_interval_s=args.commit_interval,
            )
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, worker.stop.set)
            server = None
            if args.http:
                host, _, port = args.http.rpartition(":")
                server = await serve_http(worker, host or "127.0.0.1", int(port))
            try:
                await worker.run()
            finally:
                if server is not None:
                    server.close()
                    await server.wait_closed()
            return worker

    worker = asyncio.run(run())
    s = worker.stats
    print(
        f"worker: {s.messages:,} messages ({s.gpu_samples:,} GPU samples) -> "
        + ", ".join(f"{k}: {v:,}" for k, v in sorted(s.counts.items()))
        + f"; dead letters {dict(worker.dl.counts)}",
        file=sys.stderr,
    )
    return 0
