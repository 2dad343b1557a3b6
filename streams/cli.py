"""``gpugap worker``: registered into gpugap's parser (heavy imports stay in the handler)."""

from __future__ import annotations

import argparse
import logging
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
    w.add_argument("--group", default="gpugap-worker", help="consumer group / Faust app id")
    w.add_argument(
        "--engine",
        choices=["faust"],
        default="faust",
        help="the Faust app, the only engine (the asyncio engine was removed: to scale out, "
        "start more workers with the same --group)",
    )
    w.add_argument(
        "--lateness", type=float, default=120.0, metavar="S", help="allowed lateness (seconds)"
    )
    w.add_argument(
        "--alert-lateness",
        type=float,
        default=30.0,
        metavar="S",
        help="alerts judge a minute S seconds after it ends (<= --lateness; default 30)",
    )
    w.add_argument(
        "--max-future",
        type=float,
        default=600.0,
        metavar="S",
        help="a record dated more than S seconds ahead of this worker's clock is a dead letter "
        "(default 600)",
    )
    w.add_argument(
        "--max-past",
        type=float,
        default=7 * 86400.0,
        metavar="S",
        help="a record dated more than S seconds before this worker's clock is a dead letter "
        "(default 7 days); see --backfill",
    )
    w.add_argument(
        "--backfill",
        action="store_true",
        help="accept records of any age (replays, backfills, the simulator's scenarios)",
    )
    w.add_argument(
        "--idle-threshold",
        type=float,
        metavar="X",
        help="activity below X (0..1) is idle (default GPUGAP_IDLE_THRESHOLD, 0.05; per class: "
        "GPUGAP_IDLE_CLASS_THRESHOLDS)",
    )
    w.add_argument(
        "--idle-minutes",
        type=int,
        metavar="N",
        help="idle minutes before an alert opens (default GPUGAP_IDLE_MINUTES, 10; per class: "
        "GPUGAP_IDLE_CLASS_MINUTES)",
    )
    w.add_argument(
        "--idle-flush",
        type=float,
        metavar="S",
        help="after S seconds without input, close every open minute (replays, tests)",
    )
    w.add_argument(
        "--idle-timeout",
        type=float,
        metavar="S",
        help="exit after S seconds without input, counted once --idle-flush has closed every "
        "minute (so it needs --idle-flush)",
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
        "--healthz-stale",
        type=float,
        default=60.0,
        metavar="S",
        help="/healthz answers 503 after S seconds without a poll (default 60)",
    )
    w.add_argument(
        "--http",
        default="127.0.0.1:6066",
        metavar="HOST:PORT",
        help="liveness (/healthz) and Prometheus metrics (/metrics); '' = off",
    )


def _worker(args: argparse.Namespace) -> int:
    from gpugap.groundfloor.plugin import require
    from gpugap.groundfloor.settings import load, read_part

    require("gpugap worker", "worker", ("faust",))
    from gpugap.schemas.clock import SECOND_MS
    from gpugap.schemas.errors import ConfigError
    from gpugap.streams.core import CoreConfig, state_bounds
    from gpugap.streams.settings import WorkerSettings

    settings = load()
    logging.getLogger("gpugap.streams").setLevel(settings.log_level)
    lateness = round(args.lateness * SECOND_MS)
    alert = round(args.alert_lateness * SECOND_MS)
    if not 0 <= alert <= lateness:
        raise ConfigError("--alert-lateness must be between 0 and --lateness")
    if args.idle_timeout is not None and args.idle_flush is None:
        raise ConfigError("--idle-timeout counts from the idle flush: give --idle-flush too")
    config = CoreConfig(
        lateness_ms=lateness,
        alert_lateness_ms=alert,
        idle=idle_config(settings.idle, args.idle_threshold, args.idle_minutes),
        max_future_ms=round(args.max_future * SECOND_MS),
        max_past_ms=None if args.backfill else round(args.max_past * SECOND_MS),
        **state_bounds(read_part(WorkerSettings)),
    )
    web = None
    if args.http:
        host, _, port = args.http.rpartition(":")
        web = (host or "127.0.0.1", int(port))
    from gpugap.streams.join import tune_gc

    tune_gc()
    from gpugap.streams.app import AppOptions, run

    opts = AppOptions(
        group=args.group,
        config=config,
        max_records=args.max_records,
        commit_interval_s=args.commit_interval,
        idle_flush_s=args.idle_flush,
        idle_timeout_s=args.idle_timeout,
        web=web,
        healthz_stale_s=args.healthz_stale,
    )
    join = run(settings, opts, loglevel=settings.log_level).join
    s = join.stats
    print(
        f"worker: {s.messages:,} messages ({s.gpu_samples:,} GPU samples) -> "
        + ", ".join(f"{k}: {v:,}" for k, v in sorted(s.counts.items()))
        + f"; dead letters {dict(join.dl.counts)}",
        file=sys.stderr,
    )
    return 0


def idle_config(idle: Any, threshold: float | None = None, minutes: int | None = None) -> Any:
    """The stream's IdleConfig from the idle settings (IdleSettings), with the flags' overrides
    of the defaults (per-class values stay as configured)."""
    from gpugap.schemas.errors import ConfigError
    from gpugap.streams.idle_policy import Exemption, IdleConfig, Rule, match_fields

    if threshold is not None and not 0.0 <= threshold <= 1.0:
        raise ConfigError(f"--idle-threshold must be between 0 and 1, got {threshold}")
    if minutes is not None and minutes < 1:
        raise ConfigError(f"--idle-minutes must be at least 1, got {minutes}")
    return IdleConfig(
        threshold=idle.threshold if threshold is None else threshold,
        minutes=idle.minutes if minutes is None else minutes,
        per_class_threshold={k.value: v for k, v in idle.class_thresholds.items()},
        per_class_minutes={k.value: v for k, v in idle.class_minutes.items()},
        exempt=tuple(
            Exemption(
                **match_fields(e.model_dump(mode="json")),
                younger_than_minutes=e.younger_than_minutes,
            )
            for e in idle.exempt
        ),
        remind_minutes=tuple(idle.remind_minutes),
        per_class_remind={k.value: tuple(v) for k, v in idle.class_remind_minutes.items()},
        rules=tuple(
            Rule(
                **match_fields(r.model_dump(mode="json")),
                id=r.id or f"rules[{i}]",
                threshold=r.threshold,
                minutes=r.minutes,
                remind_minutes=tuple(r.remind_minutes) if r.remind_minutes is not None else None,
            )
            for i, r in enumerate(idle.rules)
        ),
    )
