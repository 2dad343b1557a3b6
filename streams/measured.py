"""A shared GPU split by what each holder's processes measured (pure;
docs/architecture.md#measured-shares).

Where a sample carries per-holder use (``GpuSample.measured_use``: NVML process utilization,
dcgm-exporter's per-pod rows, amdsmi's process engine time), each moment of a GPU held by
``k`` allocations is split so:

- the device's busy fraction ``A`` (its own best activity metric, the one busy scale) goes to
  the holders in proportion to what their processes measured: the per-process figures are a
  different scale (NVML's smUtil, engine nanoseconds), so only their proportions are used;
- the busy part of processes no holder owns (a pod not holding the GPU at that moment, or a
  process of no pod) is **unattributed use**: a row of nobody's, never billed to a holder;
- the unused part ``1 - A`` is split by holding: ``1/k`` each.

A holder's allocated seconds are then its busy part plus its share of the unused part, so
what the holders and the unattributed use hold adds up to the GPU's time. Moments no sample
with activity covers are split evenly and unmeasured; moments whose sample measured nothing
per process (``measured_use`` None), or measured no use while the device was busy, are split
evenly (``share_source`` even).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import cast

from gpugap.schemas.models import GpuSample
from gpugap.schemas.types import ShareSource
from gpugap.streams.state import AllocState
from gpugap.streams.window import Sample

#: a sample's measured use, as the core buffers it: [[holder key, weight], ...]; the key is
#: "uid:<pod uid>", "pod:<namespace>/<pod>", or "" for processes of no pod
Weights = list[list[str | float]]
#: below this a device's activity is no use at all (float noise of a 0 reading)
_IDLE = 1e-9


def measured_weights(g: GpuSample) -> Weights:
    """The buffered form of ``g.measured_use``: one weight per holder key, summed."""
    out: dict[str, float] = {}
    for use in g.measured_use or ():
        if use.pod_uid:
            key = f"uid:{use.pod_uid.lower()}"
        elif use.pod:
            key = f"pod:{use.namespace or ''}/{use.pod}"
        else:
            key = ""
        out[key] = out.get(key, 0.0) + use.activity
    return [[k, w] for k, w in sorted(out.items())]


@dataclass(slots=True)
class Split:
    """One holder's part of one GPU-minute, in device milliseconds (before the device's share
    of its physical GPU)."""

    allocated_ms: float = 0.0
    consumed_ms: float = 0.0
    measured_ms: float = 0.0
    #: milliseconds held with others (or beside unattributed use) split by measures / evenly
    by_measure_ms: float = 0.0
    evenly_ms: float = 0.0

    @property
    def source(self) -> ShareSource | None:
        if self.by_measure_ms and self.evenly_ms:
            return ShareSource.MIXED
        if self.by_measure_ms:
            return ShareSource.MEASURED
        return ShareSource.EVEN if self.evenly_ms else None


def has_measures(eff: Sequence[tuple[int, int, Sample]]) -> bool:
    """Whether any of a GPU's effective samples carries measured use."""
    return any(len(s) > 6 for _, _, s in eff)


def holder_of(cluster: str, allocs: dict[str, AllocState]) -> dict[str, str]:
    """Holder key -> allocation id, for the pods among ``allocs``: by UID (the identity), and
    by namespace/pod for a measure that names no UID."""
    out: dict[str, str] = {}
    for aid, a in allocs.items():
        if a["scheduler"] != "kubernetes":
            continue
        uid = aid.removeprefix(f"k8s/{cluster}/")
        if uid != aid:
            out[f"uid:{uid.lower()}"] = aid
        out.setdefault(f"pod:{a['namespace'] or ''}/{a['name']}", aid)
    return out


def split(
    mine: Sequence[tuple[str, int, int]],
    eff: Sequence[tuple[int, int, Sample]],
    holders: dict[str, str],
) -> tuple[dict[str, Split], float]:
    """Per allocation of ``mine`` (its spans on one GPU in one minute) its Split, and the
    milliseconds of unattributed use (busy with processes no holder owns) while it was held."""
    parts = {aid: Split() for aid, _, _ in mine}
    stranger = 0.0
    cuts = sorted(
        {t for _, lo, hi in mine for t in (lo, hi)} | {t for b, e, _ in eff for t in (b, e)}
    )
    for b, e in pairwise(cuts):
        here = [aid for aid, lo, hi in mine if lo <= b and e <= hi]
        if not here:
            continue
        d = e - b
        k = len(here)
        sample = next((s for start, end, s in eff if start <= b and e <= end), None)
        activity = None if sample is None else sample[2]
        if activity is None:  # unmeasured: held evenly, nothing known of its use
            for aid in here:
                parts[aid].allocated_ms += d / k
                if k > 1:
                    parts[aid].evenly_ms += d
            continue
        busy = float(cast(float, activity))
        weights = cast(Weights, sample[6]) if sample is not None and len(sample) > 6 else None
        mine_w = {aid: 0.0 for aid in here}
        others = 0.0
        for key, w in weights or ():
            owner = holders.get(str(key))
            if owner is not None and owner in mine_w:
                mine_w[owner] += float(w)
            else:
                others += float(w)
        total = sum(mine_w.values()) + others
        if weights is None or (total <= 0 and busy > _IDLE):  # nothing to split by
            for aid in here:
                p = parts[aid]
                p.allocated_ms += d / k
                p.measured_ms += d / k
                p.consumed_ms += busy * d / k
                if k > 1:
                    p.evenly_ms += d
            continue
        idle = 1.0 - busy
        shared = k > 1 or others > 0
        for aid in here:
            own = busy * mine_w[aid] / total if total > 0 else 0.0
            p = parts[aid]
            p.allocated_ms += (own + idle / k) * d
            p.measured_ms += (own + idle / k) * d
            p.consumed_ms += own * d
            if shared:
                p.by_measure_ms += d
        if total > 0:
            stranger += busy * others / total * d
    return parts, stranger
