"""``python -m benchmarks state-memory``: the worker's state against distinct nodes (no Kafka).

Feeds one ``Processor`` (the pure core the worker runs, in-process) one 8-GPU node sample
(``--gpus``) for each of N distinct fake nodes, N growing through ``--steps`` (1k, 10k, 50k,
100k, 200k), and prints the process's RSS (``VmRSS`` from /proc/self/status, after a full
garbage collection) and the nodes held at each step. Every node sample is decoded from its
JSON bytes, as the worker does, so the strings the state keeps are the ones a worker would.

Then the second phase: those nodes go silent while ``--live`` other nodes keep reporting
every 10 s, and event time moves on past the node expiry (``--expiry``, default 60 s here so
that the run stays short: the silent nodes' minutes are closed, and their unallocated
``no_samples`` rows made, until they expire; the worker's default is
``GPUGAP_WORKER_NODE_IDLE_EXPIRY_S``). RSS and nodes held are printed as event time passes,
then after the expiry; then a second wave of as many new nodes shows whether the memory freed
is reused (CPython and malloc keep freed memory, so RSS falls less than the state does: the
"blocks" column counts the objects alive). Last, a table of what one node costs by kind (one
sample of 1, 8 or 256 GPUs; a live node with a job; a job on a node that never reports),
each kind measured in a process of its own.

The default run (200k nodes of 8 GPUs, then the kinds) takes about 4.5 minutes on one core.
"""

from __future__ import annotations

import argparse
import gc
import json
import subprocess
import sys
import time
import tracemalloc
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from typing import Any

from gpugap.schemas import decode
from gpugap.schemas.clock import SECOND_MS
from gpugap.schemas.topics import ALLOCATIONS, SAMPLES
from gpugap.streams.core import CoreConfig
from gpugap.streams.join import tune_gc
from gpugap.streams.process import Processor

T0 = datetime(2026, 11, 2, 8, 0, tzinfo=UTC)


def rss_mib() -> float:
    """This process's resident set (VmRSS), after a full collection."""
    gc.collect()
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def node_sample(cluster: str, n: int, t: datetime, gpus: int, act: float) -> bytes:
    """One node sample's JSON bytes: node ``n`` with ``gpus`` distinct GPUs."""
    return json.dumps(
        {
            "cluster": cluster,
            "node": f"node-{n:07d}",
            "time": t.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "source": "simulator",
            "interval_s": 10.0,
            "gpus": [
                {
                    "uuid": f"GPU-{n:08x}-{g:04x}-0000-0000-{cluster.encode().hex()[:12]:0>12}",
                    "index": g,
                    "activity": act,
                    "activity_metric": "sm_active",
                    "memory_used_mib": 1000.0,
                    "power_w": 200.0,
                }
                for g in range(gpus)
            ],
        }
    ).encode()


def advancing(proc: Processor) -> Iterable[Any]:
    """What the worker's drain does after each poll: every node to the latest event time,
    its output delivered in parts (where this release has them)."""
    parts = getattr(proc, "advancing", None)
    return parts() if parts is not None else [proc.advance(merge=False)]


def held(proc: Processor) -> int:
    return len(proc.state["nodes"])


def config(expiry_s: float | None, max_nodes: int | None, max_gpus: int | None) -> CoreConfig:
    """The core's configuration; the bounds where this release has them (no cap unless
    given: the run measures the state, tests/streams/test_state_bounds.py the caps)."""
    fields = CoreConfig.__dataclass_fields__
    kw: dict[str, Any] = {}
    if "node_expiry_ms" in fields:
        kw["node_expiry_ms"] = round(expiry_s * SECOND_MS) if expiry_s else None
    if "max_nodes" in fields:
        kw["max_nodes"] = max_nodes or None
    if "max_gpus" in fields:
        kw["max_gpus"] = max_gpus or None
    if "max_allocs" in fields:
        kw["max_allocs"] = None
    return CoreConfig(**kw)


class Table:
    def __init__(self) -> None:
        self.base = rss_mib()
        self.t0 = time.perf_counter()
        print(f"RSS with nothing held: {self.base:,.1f} MiB")
        print(
            f"{'phase':<34} {'nodes held':>11} {'RSS MiB':>9} {'over base':>10} "
            f"{'KiB/node':>9} {'blocks k':>9} {'elapsed s':>10}"
        )

    def row(self, phase: str, proc: Processor) -> float:
        rss, n = rss_mib(), held(proc)
        per = f"{(rss - self.base) * 1024 / n:,.1f}" if n >= 1000 else "-"
        print(
            f"{phase:<34} {n:>11,} {rss:>9,.1f} {rss - self.base:>10,.1f} {per:>9} "
            f"{sys.getallocatedblocks() / 1000:>9,.0f} {time.perf_counter() - self.t0:>10.1f}",
            flush=True,
        )
        return rss


def grow(proc: Processor, cluster: str, first: int, last: int, *, t: datetime, gpus: int) -> int:
    """Nodes ``first..last-1`` send one sample each, within one minute of event time; returns
    how many the worker refused (dead letters)."""
    refused = 0
    span = max(1, last - first)
    for n in range(first, last):
        at = t + timedelta(milliseconds=(n - first) * 50_000 // span)
        res = proc.handle(decode(SAMPLES, node_sample(cluster, n, at, gpus, 0.5)))
        refused += len(res.refused)
    return refused


def job_start(n: int, t: datetime, gpus: int) -> bytes:
    """A Slurm job on node ``n`` (all its GPUs), as the allocation event the core takes."""
    return json.dumps(
        {
            "event_id": f"bench/{n}/start",
            "kind": "start",
            "time": t.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "cluster": "fake",
            "node": f"node-{n:07d}",
            "scheduler": "slurm",
            "allocation_id": f"slurm/fake/{n}",
            "gpus": gpus,
            "gpu_indices": list(range(gpus)),
            "workload_class": "batch",
            "owner": f"user{n % 1000}",
            "team": f"team{n % 50}",
            "name": f"job-{n}",
        }
    ).encode()


#: the kinds of node measured on their own (``--kind``): what each holds
KINDS = {
    "1 sample, 1 GPU": ("sample", 1, 10_000),
    "1 sample, 8 GPUs": ("sample", 8, 10_000),
    "1 sample, 256 GPUs (the most a sample has)": ("sample", 256, 1_000),
    "8 GPUs every 10 s for 4 min, a job running": ("live", 8, 2_000),
    "a job on 8 GPUs, no sample ever (4 min)": ("job", 8, 10_000),
}


def one_kind(kind: str, nodes: int, gpus: int, *, traced: bool = False) -> float:
    """KiB of RSS per node of one kind, ``nodes`` of them, in this (fresh) process; or with
    ``traced``, KiB of the Python objects alive (tracemalloc): the state itself, without what
    the allocators keep of the rows made and let go meanwhile."""
    tune_gc()
    proc = Processor(config(None, None, None))
    base = rss_mib()
    if traced:
        tracemalloc.start()
    if kind == "sample":
        grow(proc, "fake", 0, nodes, t=T0, gpus=gpus)
    else:  # a job on every node, then 4 minutes: the node's minutes close
        for n in range(nodes):
            proc.handle(decode(ALLOCATIONS, job_start(n, T0, gpus)))
        for k in range(1, 25):
            t = T0 + timedelta(seconds=10 * k)
            if kind == "live":
                for n in range(nodes):
                    proc.handle(decode(SAMPLES, node_sample("fake", n, t, gpus, 0.5)))
            else:
                proc.handle(decode(SAMPLES, node_sample("clock", 0, t, 1, 0.5)))
            sum(len(part.minutes) for part in advancing(proc))  # (and let them go)
    if traced:
        gc.collect()
        return tracemalloc.get_traced_memory()[0] / 1024 / nodes
    return (rss_mib() - base) * 1024 / nodes


def kinds() -> None:
    """Each kind in a process of its own (RSS keeps what an earlier phase freed)."""
    print(
        f"\n{'node kind':<46} {'nodes':>7} {'RSS KiB/node':>13} {'KiB/GPU':>8} "
        f"{'objects KiB/node':>17}"
    )
    for name, (kind, gpus, nodes) in KINDS.items():
        per = []
        for extra, n in (([], nodes), (["--traced"], nodes // 5)):  # tracemalloc is slow
            cmd = [sys.executable, "-m", "benchmarks", "state-memory", "--kind", kind, *extra]
            cmd += ["--gpus", str(gpus), "--steps", str(n)]
            got = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
            per.append(float(got.split()[-1]))
        print(
            f"{name:<46} {nodes:>7,} {per[0]:>13,.1f} {per[0] / gpus:>8,.2f} {per[1]:>17,.1f}",
            flush=True,
        )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks state-memory", description=__doc__)
    p.add_argument("--steps", default="1000,10000,50000,100000,200000", help="distinct nodes")
    p.add_argument("--gpus", type=int, default=8, help="GPUs per node")
    p.add_argument("--live", type=int, default=100, help="nodes that keep reporting (phase 2)")
    p.add_argument(
        "--expiry", type=float, default=60.0, metavar="S", help="node expiry (event time)"
    )
    p.add_argument("--max-nodes", type=int, default=0, help="the node cap (default: none here)")
    p.add_argument("--max-gpus", type=int, default=0, help="the GPU cap (default: none here)")
    p.add_argument("--no-second-wave", action="store_true")
    p.add_argument("--no-kinds", action="store_true", help="skip the per-kind table")
    p.add_argument("--kind", choices=["sample", "live", "job"], help=argparse.SUPPRESS)
    p.add_argument("--traced", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    steps = [int(float(s)) for s in args.steps.split(",")]
    if args.kind:  # one measurement, for kinds()
        print(f"{one_kind(args.kind, steps[-1], args.gpus, traced=args.traced):.3f}")
        return 0
    tune_gc()  # as the worker does
    proc = Processor(config(args.expiry, args.max_nodes, args.max_gpus))
    table = Table()
    refused, have = 0, 0
    for n in steps:
        refused += grow(proc, "fake", have, n, t=T0, gpus=args.gpus)
        have = n
        table.row(f"{n:,} nodes sent 1 sample", proc)
    if refused:
        print(f"  ({refused:,} samples refused: the cap)")
    peak_nodes = held(proc)

    # phase 2: the fake nodes are silent; live nodes report every 10 s; the worker advances
    # its nodes once per poll (here: once per 10 s of event time)
    live = range(10_000_000, 10_000_000 + args.live)
    lateness_s = proc.cfg.lateness_ms / SECOND_MS
    total_s = args.expiry + lateness_s + 180
    marks = {round(total_s * f / 4 / 10) * 10 for f in (1, 2, 3)}
    t, rows = T0 + timedelta(seconds=60), 0
    started = time.perf_counter()
    elapsed = 0
    while elapsed <= total_s:
        for n in live:
            proc.handle(decode(SAMPLES, node_sample("live", n, t, args.gpus, 0.5)))
        rows += sum(len(part.minutes) for part in advancing(proc))
        if elapsed in marks:
            table.row(f"silent {elapsed:,.0f} s (event time)", proc)
        t += timedelta(seconds=10)
        elapsed += 10
    table.row(f"silent {elapsed - 10:,.0f} s: past expiry", proc)
    secs = time.perf_counter() - started
    print(f"  (phase 2: {rows:,} GPU-minute rows in {secs:.1f} s)")
    if not args.no_second_wave:
        refused = grow(proc, "wave2", 0, steps[-1], t=t, gpus=args.gpus)
        table.row(f"second wave: {steps[-1]:,} new nodes", proc)
        if refused:
            print(f"  ({refused:,} samples refused: the cap)")
    caps = f"node cap {args.max_nodes or 'none'}, GPU cap {args.max_gpus or 'none'}"
    print(
        f"peak: {peak_nodes:,} nodes of {args.gpus} GPU(s); expiry {args.expiry:g} s "
        f"(event time); {caps}; blocks: objects alive (sys.getallocatedblocks)"
    )
    if not args.no_kinds:
        kinds()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
