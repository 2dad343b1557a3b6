"""One node's rows for one minute: per GPU, one row per allocation holding it (split at
allocation boundaries) and one for the seconds nobody held it (pure, reads the core's state).

Rows are built without validation (``schemas.fast.trusted``, ~2 us instead of ~25 us a row):
every value comes from validated records, seconds lie within the minute and consumption is at
most the span, as the model requires; tests/streams/test_fast_paths.py validates such rows
again and compares.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from datetime import datetime
from enum import StrEnum
from itertools import pairwise

from gpugap.schemas.clock import MINUTE_MS, SECOND_MS, at
from gpugap.schemas.fast import trusted
from gpugap.schemas.models import GpuMinute, IdlePolicy
from gpugap.schemas.types import ActivityMetric, Scheduler, ShareSource, WorkloadClass, vendor_of
from gpugap.streams import measured, window
from gpugap.streams.state import AllocState, NodeState, Span

#: enum members by value (the state holds values)
ENUMS: dict[str, StrEnum] = {
    **{e.value: e for e in ActivityMetric},
    **{f"s:{e.value}": e for e in Scheduler},
    **{f"c:{e.value}": e for e in WorkloadClass},
}


def placeholder_uuid(cluster: str, node: str, key: str) -> str:
    """A stable stand-in for a GPU no telemetry has named (``GPU-`` + uuid5)."""
    return "GPU-" + str(uuid.uuid5(uuid.NAMESPACE_URL, f"gpugap:unknown/{cluster}/{node}/{key}"))


def pod_key(a: AllocState) -> str:
    """The name the samples' attribution gives the pod of ``a``: "namespace/pod"."""
    return f"{a['namespace'] or ''}/{a['name']}"


def learns(a: AllocState) -> bool:
    """Whether ``a``'s GPUs come from the samples' attribution (a pod: neither Slurm's
    indices nor UUIDs in its events)."""
    return a["indices"] is None and not a["uuids"]


def seen_in_life(spans: list[Span], start: int | None, end: int | None) -> tuple[int, int] | None:
    """How long ``spans`` ([first, last] sample times, oldest first) lie in [start, end), and
    from when; None if they never do."""
    lo = start if start is not None else -(1 << 62)  # known by its end only
    hi = end if end is not None else 1 << 62
    since: int | None = None
    lived = 0
    for first, last in spans:
        if first >= hi:
            break
        if last >= lo:
            b = max(first, lo)
            since = b if since is None else since
            lived += min(last, hi) - b
    return None if since is None else (lived, since)


def in_life(spans: list[Span], start: int | None, end: int | None) -> bool:
    """Whether one of ``spans`` lies in [start, end)."""
    return seen_in_life(spans, start, end) is not None


def held(s: NodeState, a: AllocState) -> list[str]:
    """The GPUs (uuids) allocation ``a`` holds on the node whose state is ``s``.

    A pod holds the GPUs the samples named it on (namespace/pod: the attribution carries no
    UID) within its own lifetime, [start, end): a pod deleted and recreated under the same
    name is another allocation, and neither holds the other's GPUs. A pod's GPUs are fixed
    for its life and its events give their count: if the name was seen on more GPUs than
    that in its life (its end not known yet while a successor's samples come, or a
    predecessor's name still on a sample or two after the successor started), it holds those
    seen longest in its life (then first). Until a sample names a GPU, stable placeholders
    stand in for the count its events gave."""
    cluster, node = s["cluster"], s["node"]
    if a["uuids"]:
        return list(a["uuids"])
    if a["indices"] is not None:
        return [
            s["index"].get(str(i)) or placeholder_uuid(cluster, node, str(i)) for i in a["indices"]
        ]
    learned: list[str] = []
    if seen := s["attrib"].get(pod_key(a)):
        start, end, n = a["start"], a["end"], a["gpus"]
        found = []
        for u, spans in seen.items():
            if (x := seen_in_life(spans, start, end)) is not None:
                found.append((-x[0], x[1], u))  # the longest seen first, then the earliest
        if 0 < n < len(found):
            found = sorted(found)[:n]
        learned = sorted(u for _, _, u in found)
    missing = max(0, a["gpus"] - len(learned))
    fill = [placeholder_uuid(cluster, node, f"{a['id']}/{i}") for i in range(missing)]
    return learned + fill


def node_minutes(
    s: NodeState, m0: int, policy: Callable[[AllocState], IdlePolicy]
) -> list[GpuMinute]:
    """Per GPU (or MIG slice): a row per allocation holding it, one for the seconds nobody
    held it; per MIG-partitioned GPU, one for the share no slice covers. Seconds count in
    GPU-equivalents (docs/architecture.md): a slice's share of its GPU, and a GPU held by several
    allocations at once (time-slicing) is divided between them equally."""
    m1 = m0 + MINUTE_MS
    spans: dict[str, list[tuple[str, int, int]]] = {}
    for aid, a in sorted(s["allocs"].items()):
        if a["start"] is None:
            continue
        lo, hi = max(a["start"], m0), min(a["end"] if a["end"] is not None else m1, m1)
        if hi > lo:
            for g in held(s, a):
                spans.setdefault(g, []).append((aid, lo, hi))
    known = s["known"]
    slices = s.get("slices") or {}
    gpus = {g for g, since in known.items() if since < m1} | set(spans)
    rows: list[GpuMinute] = []
    minute = at(m0)
    holders: dict[str, str] | None = None  # pods' holder keys, built once a measure needs them
    for g in sorted(gpus):
        parent, share, *_ = slices.get(g) or (None, 1.0)
        eff = window.effective_in(s["samples"].get(g, ()), m0, m1)
        mine = spans.get(g, ())
        stranger_ms = 0.0
        if mine and measured.has_measures(eff):
            if holders is None:
                holders = measured.holder_of(s["cluster"], s["allocs"])
            parts, stranger_ms = measured.split(mine, eff, holders)
            for aid, lo, hi in mine:
                p = parts[aid]
                a = s["allocs"][aid]
                rows.append(
                    row(
                        s,
                        g,
                        minute,
                        window.usage([(lo, hi)], eff),
                        span_ms=hi - lo,
                        share=share * p.allocated_ms / (hi - lo),
                        consumed_ms=p.consumed_ms * share,
                        measured_ms=p.measured_ms * share,
                        physical=parent,
                        a=a,
                        policy=policy(a),
                        share_source=p.source,
                    )
                )
            mine_plain: Sequence[tuple[str, int, int]] = ()
        else:
            mine_plain = mine
        for (aid, lo, hi), part in zip(mine_plain, shared(mine_plain), strict=True):
            u = window.usage([(lo, hi)], eff)
            consumed: float = u.consumed
            covered: float = u.covered_ms
            held_ms: float = hi - lo
            if part is not None:  # held with others: each its share of each moment
                pieces = [(window.usage([(b, e)], eff), k) for b, e, k in part]
                consumed = sum(p.consumed / k for p, k in pieces)
                covered = sum(p.covered_ms / k for p, k in pieces)
                held_ms = sum((e - b) / k for b, e, k in part)
            a = s["allocs"][aid]
            rows.append(
                row(
                    s,
                    g,
                    minute,
                    u,
                    span_ms=hi - lo,
                    share=share * held_ms / (hi - lo),
                    consumed_ms=consumed * share,
                    measured_ms=covered * share,
                    physical=parent,
                    a=a,
                    policy=policy(a),
                    share_source=ShareSource.EVEN if part is not None else None,
                )
            )
        if g in known or stranger_ms > 0:
            begin = max(m0, known[g]) if g in known else m1
            free = window.complement([(lo, hi) for _, lo, hi in mine], begin, m1)
            if free or stranger_ms > 0:
                # nobody's: the seconds nobody held it, and the use of processes no holder
                # owns while it was held (unattributed, never billed to the holders)
                free_ms = sum(e - b for b, e in free)
                u = window.usage(free, eff) if free else window.usage([(m0, m1)], eff)
                consumed = (u.consumed if free else 0.0) + stranger_ms
                covered = (u.covered_ms if free else 0.0) + stranger_ms
                rows.append(
                    row(
                        s,
                        g,
                        minute,
                        u,
                        span_ms=free_ms + stranger_ms,
                        share=share,
                        consumed_ms=consumed * share,
                        measured_ms=covered * share,
                        physical=parent,
                        a=None,
                        policy=None,
                        share_source=ShareSource.MEASURED if stranger_ms > 0 else None,
                    )
                )
    rows.extend(unsliced_rows(s, m0, minute))
    return rows


def shared(mine: Sequence[tuple[str, int, int]]) -> list[list[tuple[int, int, int]] | None]:
    """Per span of ``mine`` (one GPU's allocations in one minute): None if it held the GPU
    alone, else its pieces (start, end, holders at once)."""
    if len(mine) < 2:
        return [None] * len(mine)
    cuts = sorted({t for _, lo, hi in mine for t in (lo, hi)})
    out: list[list[tuple[int, int, int]] | None] = []
    for _, lo, hi in mine:
        pieces = []
        for b, e in pairwise(cuts):
            if lo <= b and e <= hi:
                k = sum(1 for _, lo2, hi2 in mine if lo2 <= b and e <= hi2)
                pieces.append((b, e, k))
        out.append(pieces if any(k > 1 for _, _, k in pieces) else None)
    return out


def unsliced_rows(s: NodeState, m0: int, minute: datetime) -> list[GpuMinute]:
    """Per MIG-partitioned GPU, the share of it no slice covers (capacity nobody can hold
    until the GPU is partitioned again): unallocated, from its first slice's first sample."""
    slices = s.get("slices")
    if not slices:
        return []
    m1 = m0 + MINUTE_MS
    known = s["known"]
    parts: dict[str, list[tuple[float, int]]] = {}
    for u, (parent, share, *kind) in slices.items():
        if kind:  # an AMD partition or Intel tile: every part is a device, none unsliced
            continue
        since = known.get(u)
        if since is not None and since < m1:
            parts.setdefault(parent, []).append((share, since))
    rows = []
    for parent, found in sorted(parts.items()):
        rest = 1.0 - sum(share for share, _ in found)
        if rest <= 1e-9 or parent in known:  # fully partitioned, or sampled whole itself
            continue
        since = max(m0, min(t for _, t in found))
        rows.append(
            row(
                s,
                parent,
                minute,
                window.Usage(),
                span_ms=m1 - since,
                share=rest,
                consumed_ms=0.0,
                measured_ms=(m1 - since) * rest,
                physical=None,
                a=None,
                policy=None,
                unsliced=True,
            )
        )
    return rows


def row(
    s: NodeState,
    g: str,
    minute: datetime,
    u: window.Usage,
    *,
    span_ms: float,
    share: float,
    consumed_ms: float,
    measured_ms: float,
    physical: str | None,
    a: AllocState | None,
    policy: IdlePolicy | None,
    unsliced: bool = False,
    share_source: ShareSource | None = None,
) -> GpuMinute:
    """``span_ms`` of the device counted at ``share`` of a physical GPU, ``consumed_ms`` and
    ``measured_ms`` (the part some sample with an activity reading covered) in GPU-equivalents
    (``u`` says how busy the device was). ``unsliced``: the part of a MIG GPU in no slice, no
    device of its own (device_s 0) and measured whole (it runs nothing). Seconds no sample
    covers are unmeasured, whole minutes or a sample's worth inside one (NVML has no activity
    reading for a MIG slice: its samples say memory and power, not how busy it was)."""
    secs = span_ms / SECOND_MS * share
    measured = min(measured_ms / SECOND_MS, secs)
    device_s = 0.0 if unsliced else span_ms / SECOND_MS
    avg = u.activity_avg
    return trusted(
        GpuMinute,
        {
            "cluster": s["cluster"],
            "node": s["node"],
            "gpu_uuid": g,
            "minute": minute,
            "allocated_s": secs if a is not None else 0.0,
            "consumed_gpu_s": min(consumed_ms / SECOND_MS, measured),
            "unallocated_s": 0.0 if a is not None else secs,
            "device_s": device_s,
            "gpu_share": share,
            "physical_uuid": physical,
            "vendor": vendor_of(g),
            "share_source": share_source,
            "activity_avg": min(avg, 1.0) if avg is not None else None,
            "activity_max": u.activity_max,
            "activity_metric": ENUMS[u.metric] if u.metric is not None else None,
            "memory_used_mib_avg": u.memory,
            "power_w_avg": u.power,
            "sample_count": u.sample_count,
            "no_samples": u.covered_ms == 0 and not unsliced,
            "measured_s": measured,
            "allocation_id": a["id"] if a else None,
            "scheduler": ENUMS["s:" + a["scheduler"]] if a else None,
            "workload_class": ENUMS["c:" + a["cls"]] if a else None,
            "owner": a["owner"] if a else None,
            "team": a["team"] if a else None,
            "gang_id": a["gang_id"] if a else None,
            "idle_threshold": policy.threshold if policy else None,
            "idle_after_minutes": policy.minutes if policy else None,
        },
    )
