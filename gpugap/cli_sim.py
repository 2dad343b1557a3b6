"""The simulate / record / replay commands (producers/), registered into ``gpugap``'s parser.
Heavy imports stay inside the handlers so ``gpugap --help`` stays fast."""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpugap.schemas.errors import ConfigError

Cmd = Callable[..., argparse.ArgumentParser]


def _duration(text: str) -> int:
    from gpugap.simulator.scenario import parse_duration

    try:
        seconds = parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if seconds <= 0:
        raise argparse.ArgumentTypeError("must be positive")
    return seconds


def _speed(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError("must be > 0 (simulated seconds per wall second)")
    return value


def _pace(p: argparse.ArgumentParser, default: str) -> None:
    g = p.add_mutually_exclusive_group()
    g.add_argument(
        "--speed",
        type=_speed,
        metavar="X",
        help=f"X event-time seconds per wall second ({default})",
    )
    g.add_argument("--as-fast-as-possible", action="store_true", help="never wait")


def register(sub: Any, cmd: Cmd) -> None:
    sim = cmd(
        "simulate",
        _simulate,
        "publish a synthetic estate (Kafka, or --out JSONL) and its ground truth",
    )
    sim.add_argument(
        "--scenario",
        default="small",
        metavar="NAME|FILE",
        help="small, demo, scale or a TOML/YAML file",
    )
    sim.add_argument("--seed", type=int, help="override the scenario's seed")
    _pace(sim, "default 1: real time")
    sim.add_argument(
        "--duration",
        type=_duration,
        metavar="D",
        help="window to emit, e.g. 2h (default: the scenario's)",
    )
    sim.add_argument(
        "--out", metavar="FILE", help="write JSON lines to FILE ('-' = stdout) instead of Kafka"
    )
    sim.add_argument("--truth", metavar="FILE", help="ground truth JSON (default: next to --out)")

    rec = cmd("record", _record, "capture topics from Kafka into JSONL (the replay envelope)")
    rec.add_argument("topics", nargs="+", metavar="TOPIC", help="e.g. gpu.samples.v1 slurm.jobs.v1")
    rec.add_argument("--out", required=True, metavar="FILE", help="JSONL file ('-' = stdout)")
    rec.add_argument(
        "--idle-timeout",
        type=float,
        metavar="S",
        help="stop after S seconds without messages (default: run until Ctrl-C)",
    )

    rep = cmd("replay", _replay, "publish a JSONL capture back to Kafka, validated")
    rep.add_argument("file", help="JSONL file ('-' = stdin)")
    _pace(rep, "default: as fast as possible")
    rep.add_argument(
        "--strict", action="store_true", help="stop with an error at the first bad line"
    )
    rep.add_argument(
        "--keep-invalid",
        action="store_true",
        help="publish invalid records verbatim (to exercise dead-lettering) instead of skipping",
    )
    rep.add_argument("--out", metavar="FILE", help="write JSON lines to FILE instead of Kafka")


def _simulate(args: argparse.Namespace) -> int:
    from gpugap.groundfloor.kafka.publish import open_publisher
    from gpugap.groundfloor.settings import load
    from gpugap.producers.base import run_producer
    from gpugap.simulator.simulator import Simulator, truth_path_for

    settings = load()
    truth = Path(args.truth) if args.truth else truth_path_for(args.out)
    speed = None if args.as_fast_as_possible else (args.speed or 1.0)
    sim = Simulator(
        settings, args.scenario, seed=args.seed, duration=args.duration, speed=speed, truth=truth
    )
    sent = asyncio.run(run_producer(sim, open_publisher(args.out, settings.kafka)))
    stats = sim.stats
    assert stats is not None
    where = args.out or f"kafka {settings.kafka.bootstrap}"
    print(
        f"simulate {sim.scenario.scenario.name}: {stats.until / 3600:.2f} h simulated, "
        f"{sent:,} messages ({stats.gpu_samples:,} GPU samples) -> {where}"
        + (f"; truth -> {truth}" if truth else "")
        + ("" if stats.complete else " (stopped early)"),
        file=sys.stderr,
    )
    return 0


def _record(args: argparse.Namespace) -> int:
    from gpugap.groundfloor.settings import load
    from gpugap.producers.replay.record import record

    counts = asyncio.run(
        record(load().kafka, args.topics, args.out, idle_timeout_s=args.idle_timeout)
    )
    summary = ", ".join(f"{t}: {n:,}" for t, n in counts.items())
    print(f"recorded {sum(counts.values()):,} messages -> {args.out} ({summary})", file=sys.stderr)
    return 0


def _replay(args: argparse.Namespace) -> int:
    from gpugap.groundfloor.kafka.publish import open_publisher
    from gpugap.groundfloor.settings import load
    from gpugap.producers.base import run_producer
    from gpugap.producers.replay.producer import Replay

    settings = load()
    speed = args.speed if args.speed and not args.as_fast_as_possible else None
    rep = Replay(
        settings, args.file, speed=speed, strict=args.strict, keep_invalid=args.keep_invalid
    )
    try:
        asyncio.run(run_producer(rep, open_publisher(args.out, settings.kafka)))
    except FileNotFoundError:
        raise ConfigError(f"replay: no such file: {args.file}") from None
    print(
        f"replayed {rep.replayed:,} records from {args.file}, skipped {rep.bad:,} bad lines"
        + (f", published {rep.kept:,} invalid verbatim" if rep.kept else ""),
        file=sys.stderr,
    )
    return 0
