"""Lost node samples: scrapes that never happened (``faults.sample_loss_rate``).

Real telemetry misses a few percent of its scrapes; the seconds a missed sample would have
covered, ``(T - interval, T]``, are then *unmeasured* (DESIGN.md "Coverage is by the second"),
and the next sample still covers only its own interval. The emitter (emit.py) leaves these
samples out and the ground truth (truth.py) leaves their slots out of every measured and
consumed figure, so both must agree exactly on which samples are lost: both call
:func:`lost_samples` here.

Which samples are lost is a pure function of (seed, cluster, node, sample time): a hash, not the
emitter's random stream, so losing samples neither shifts the emitter's other faults (late,
duplicate, malformed) nor depends on the order in which anything is computed.

Two kinds of sample are never lost. A node's first sample: the stream counts a GPU's capacity
from its first report, and the truth from the window's start (a real agent's first scrape that
never came would start its GPUs' capacity late, which no truth here models). And the first
sample that names a pod on a device. Kubernetes pod
events say how many GPUs a pod holds, not which; the stream learns that from the samples'
``attribution``. A short pod whose every naming sample was lost would be placed on a placeholder
GPU by the stream and its per-GPU figures would no longer match the truth. Keeping the first
naming sample of every (pod, device) holding guarantees each one is named at least once.
"""

from __future__ import annotations

import hashlib

from gpugap.simulator.estate import Node


def loss_draw(seed: int, cluster: str, node: str, t: int) -> float:
    """A uniform number in [0, 1) fixed by (seed, cluster, node, sample time ``t``)."""
    key = f"{seed}/lost/{cluster}/{node}/{t}".encode()
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "big") / 2**64


def first_sample(node: Node) -> int:
    """The node's first sample time (s after the start): its grid is ``offset + k x interval``,
    from the first point after 0 (as the emitter's ``_nodes``)."""
    return node.offset if node.offset > 0 else node.interval


def naming_samples(node: Node) -> set[int]:
    """The sample times that must not be lost: the node's first, and for every pod holding on
    a device of ``node``, the first sample that names it. A sample at ``T`` names a holding
    when ``start <= T < end`` (emit.node_state), so that is the first grid point at or after
    the start (and after 0), if it comes before the end; a pod that ends before any sample
    names it has nothing to keep."""
    interval, off = node.interval, node.offset
    first = first_sample(node)
    keep: set[int] = {first}  # the node's GPUs count as capacity from their first report
    for d in node.devices:
        for h in d.timeline:
            if not h.attribution:  # Slurm jobs are mapped by GPU index, unattributed use by none
                continue
            lo = max(h.start, first)
            t = off + -(-(lo - off) // interval) * interval
            if t < h.end:
                keep.add(t)
    return keep


def lost_samples(seed: int, rate: float, node: Node, window: int) -> frozenset[int]:
    """The sample times of ``node`` the emitter never sends, over every sample it would emit
    for the window (``T - interval < window``)."""
    if rate <= 0:
        return frozenset()
    keep = naming_samples(node)
    lost = set()
    t, interval = first_sample(node), node.interval
    while t - interval < window:
        if t not in keep and loss_draw(seed, node.cluster, node.name, t) < rate:
            lost.add(t)
        t += interval
    return frozenset(lost)
