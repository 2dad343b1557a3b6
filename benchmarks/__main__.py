"""``python -m benchmarks SUBJECT [options]`` (``make bench``): figures printed side by side with
their baselines. Benchmarks run from a source checkout; nothing in the installed package
imports them. Subjects with their own options (endpoint, fuzz, core, slurm-hook,
kubernetes-real, bi, backfill, state-memory, endpoint-fairness, queue, coverage, stranded) take
them after the subject:
``python -m benchmarks fuzz --hostile 1000``."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from benchmarks.processes import ENGINES, engines

#: subjects whose module parses its own arguments
OWN_OPTIONS = {
    "endpoint": "benchmarks.endpoint",
    # the sink's inserts and the admin's queries while the reader fills its share of slots
    "endpoint-fairness": "benchmarks.endpoint_fairness",
    "fuzz": "benchmarks.fuzz",
    "core": "benchmarks.core",
    "slurm-hook": "benchmarks.slurm_hook",
    # the Kubernetes producer against a real kube-apiserver + etcd, beside the test server
    "kubernetes-real": "benchmarks.kubernetes_real",
    # the report's views through the BI drivers (tests/harness/bi_drivers.py), beside
    # clickhouse-connect
    "bi": "benchmarks.bi",
    "web": "benchmarks.web",  # the web page in headless Chromium
    # gpugap backfill prometheus against a real Prometheus: days of history per minute
    "backfill": "benchmarks.backfill",
    # aiokafka's seek_to_beginning against the consumer's own reset, on 3 brokers
    "seek-race": "benchmarks.seek_race",
    # the worker's state (RSS) against distinct nodes, and the node expiry; no Kafka
    "state-memory": "benchmarks.state_memory",
    # a 30-day partition of 50,000 jobs through the backfill model, as asked and right-sized
    "queue": "benchmarks.queue",
    # unmeasured hours and idle minutes by the second and by the minute, against the truth
    "coverage": "benchmarks.coverage",
    # the stranded-GPU views over an estate's node polls (node_capacity)
    "stranded": "benchmarks.stranded",
}


def _kafka(args: argparse.Namespace) -> int:
    from benchmarks.kafka import main

    return main(args.subject, samples=args.samples, repeats=args.repeats)


def _rows(args: argparse.Namespace) -> list[int]:
    return [int(float(r)) for r in args.rows.split(",")]


def _warehouse(args: argparse.Namespace) -> int:
    from benchmarks.warehouse import main

    return main(_rows(args), args.repeats, args.clickhouse)


def _report(args: argparse.Namespace) -> int:
    from benchmarks.report import main

    return main(_rows(args), args.repeats, args.clickhouse)


def _recommend(args: argparse.Namespace) -> int:
    from benchmarks.recommend import main

    return main(_rows(args), args.repeats, args.clickhouse)


def _kubernetes(args: argparse.Namespace) -> int:
    from benchmarks.kubernetes import main

    return main(repeats=min(args.repeats, 3))


def _nvml(args: argparse.Namespace) -> int:
    from benchmarks.nvml import main

    return main(repeats=args.repeats)


def _dcgm(args: argparse.Namespace) -> int:
    from benchmarks.dcgm import main

    return main(repeats=args.repeats)


def _worker(args: argparse.Namespace) -> int:
    from benchmarks.worker import main

    return main(
        args.samples,
        repeats=args.repeats,
        duration=args.duration,
        live_nodes=args.live_nodes or 200,
        engines=args.engines,
        profile=args.profile,
    )


DEFAULT_DURATION = 300.0

#: the ``scale`` estate's size (1,350 8-GPU nodes), at real time over 2 workers
SCALE_LIVE_NODES = 1350


def _scale(args: argparse.Namespace) -> int:
    """Throughput of 1 and 2 workers beside the pass-through; then, unless ``--duration 0``,
    the latency and lag of 2 workers at the ``scale`` estate's real-time load."""
    from benchmarks.worker_latency import bench_latency
    from benchmarks.worker_scale import main

    code = main(args.samples, min(args.repeats, 3))
    if args.duration:
        nodes = args.live_nodes or SCALE_LIVE_NODES
        bench_latency(args.duration, nodes, "faust", workers=2)
    return code


def _soak(args: argparse.Namespace) -> int:
    """The ``scale`` estate at real time over 2 workers for ``--duration`` (default 30 min
    here), a line a minute: memory, lag, latency, dead letters; PASS or FAIL at the end."""
    from benchmarks.soak import NODES, main

    duration = args.duration if args.duration != DEFAULT_DURATION else 1800.0
    return main(duration, args.live_nodes or NODES)


def _alerts(args: argparse.Namespace) -> int:
    """Idle alert latency to Alertmanager's API beside alerts.v1's, in the same run."""
    from benchmarks.worker_latency import bench_latency

    engine = args.engines[0]
    bench_latency(args.duration, args.live_nodes or 200, engine, alertmanager=True)
    return 0


SUBJECTS: dict[str, Callable[[argparse.Namespace], int]] = {
    "codec": _kafka,
    "kafka": _kafka,
    "simulate": _kafka,
    "all": _kafka,  # codec and kafka
    "warehouse": _warehouse,
    "report": _report,
    "recommend": _recommend,
    "kubernetes": _kubernetes,
    "nvml": _nvml,
    "dcgm": _dcgm,
    "worker": _worker,
    "scale": _scale,
    "alerts": _alerts,
    "soak": _soak,
}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    p.add_argument("subject", choices=[*SUBJECTS, *OWN_OPTIONS], nargs="?", default="all")
    p.add_argument("--samples", type=int, default=20_000, help="node samples per run")
    p.add_argument("--repeats", type=int, default=5, help="runs per figure (median)")
    p.add_argument("--rows", default="10e6,100e6", help="warehouse, report: GPU-minute row counts")
    p.add_argument("--clickhouse", metavar="URL", help="warehouse, report: an existing ClickHouse")
    p.add_argument(
        "--duration",
        type=float,
        default=DEFAULT_DURATION,
        help="worker, alerts, scale: latency run, seconds (0 = none); soak: default 1800",
    )
    p.add_argument(
        "--live-nodes",
        type=int,
        help="worker, alerts: 8-GPU nodes every 10 s (default 200; scale: 1,350 over 2 workers)",
    )
    p.add_argument(
        "--engines",
        type=engines,
        default=list(ENGINES),
        help="worker: engines to measure, faust (the only one; the Faust pass-through is always "
        "measured beside it) (alerts: the first)",
    )
    p.add_argument("--profile", type=Path, metavar="DIR", help="worker: py-spy profiles into DIR")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in OWN_OPTIONS:
        module = importlib.import_module(OWN_OPTIONS[argv[0]])
        code: int = module.main(argv[1:])
        return code
    args = parser().parse_args(argv)
    return SUBJECTS[args.subject](args)


if __name__ == "__main__":
    sys.exit(main())
