"""The in-process parts of ``python -m benchmarks worker``: the estate the worker reads, and what
the
codec alone and the core alone make of it (no Kafka).

The estate is the ``scale`` scenario with every node at 8 GPUs (1,350 nodes, 10,800 GPUs,
Slurm and Kubernetes, its duplicates, late and malformed records), every allocation starting
around the window's start.
"""

from __future__ import annotations

import asyncio
import gc
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from gpugap.schemas import NodeSample, Record, by_name, decode
from gpugap.schemas.errors import InvalidRecord
from gpugap.schemas.topics import SAMPLES
from gpugap.streams.core import ms
from gpugap.streams.join import tune_gc
from gpugap.streams.process import Processor
from tests.harness.capture import Capture, Msg

START = (-120, 600)  # allocations start within this span around the window's start (s)


def estate(samples: int) -> tuple[list[Msg], str]:
    """The ``scale`` scenario with 8 GPUs on every node, long enough for ``samples`` node
    samples: the messages in publishing order, and a line saying what they are."""
    from gpugap.simulator import build, scenario
    from gpugap.simulator.emit import Emitter

    sc = scenario.load("scale")
    # every allocation starts around the window's start: the shipped estate runs jobs since
    # hours (inference replicas since days) before it, and the first minutes would emit
    # that history for every GPU (allocated, no samples) instead of the steady state
    clusters = [
        c.model_copy(
            update={
                "node_groups": [g.model_copy(update={"gpus": 8}) for g in c.node_groups],
                "workloads": [w.model_copy(update={"start_within": START}) for w in c.workloads],
            }
        )
        for c in sc.clusters
    ]
    sc = sc.model_copy(update={"clusters": clusters})
    nodes = sum(g.count for c in sc.clusters for g in c.node_groups)
    interval = sc.scenario.sample_interval
    window = max(1, -(-samples // nodes)) * interval
    cap = Capture()
    asyncio.run(Emitter(sc, build(sc, window), window).run(cap))
    n = sum(1 for m in cap.messages if m[0] == SAMPLES.name)
    what = (
        f"scale estate, 8 GPUs per node ({nodes:,} nodes, {nodes * 8:,} GPUs), "
        f"{window // 60} min {window % 60} s of event time: {len(cap.messages):,} messages, "
        f"{n:,} node samples"
    )
    return cap.messages, what


@dataclass
class Rate:
    label: str
    node_msgs: list[float]
    gpu_samples: list[float]
    cpu: list[float] = field(default_factory=list)  # CPU time / wall time of the process

    def row(self) -> str:
        med = statistics.median
        cpu = f"{med(self.cpu):>7.0%}" if self.cpu else f"{'':>7}"
        return (
            f"{self.label:<34} {med(self.node_msgs):>14,.0f} {med(self.gpu_samples):>15,.0f}" + cpu
        )


def decoded(messages: Sequence[Msg]) -> list[Record]:
    out = []
    for topic, _, value, _ in messages:
        try:
            out.append(decode(by_name(topic), value))
        except InvalidRecord:  # the estate's malformed records: dead letters in the worker
            continue
    return out


def bench_decode(messages: Sequence[Msg], repeats: int) -> Rate:
    values = [m[2] for m in messages if m[0] == SAMPLES.name]
    rate = Rate("decode alone (codec, node samples)", [], [])
    for _ in range(repeats):
        gpus = n = 0
        t = time.perf_counter()
        for v in values:
            try:
                rec = decode(SAMPLES, v)
            except InvalidRecord:
                continue
            n += 1
            gpus += len(rec.gpus)
        secs = time.perf_counter() - t
        rate.node_msgs.append(n / secs)
        rate.gpu_samples.append(gpus / secs)
    return rate


def bench_core(records: Sequence[Record], repeats: int, batch: int = 5000) -> Rate:
    """The core in event-time order, advanced once per ``batch`` records (one worker poll)."""
    ordered = sorted(records, key=lambda r: ms(r.time))  # type: ignore[attr-defined]
    nodes = sum(1 for r in ordered if isinstance(r, NodeSample))
    gpus = sum(len(r.gpus) for r in ordered if isinstance(r, NodeSample))
    rate = Rate("core alone (in-process)", [], [])
    thresholds = gc.get_threshold()
    tune_gc()  # as in the worker (the inputs held here become permanent: never scanned)
    for _ in range(repeats):
        proc = Processor()
        t = time.perf_counter()
        for i, r in enumerate(ordered):
            proc.handle(r)
            if i % batch == batch - 1:
                proc.advance()
        proc.advance()
        secs = time.perf_counter() - t
        rate.node_msgs.append(nodes / secs)
        rate.gpu_samples.append(gpus / secs)
    gc.unfreeze()
    gc.set_threshold(*thresholds)
    return rate
