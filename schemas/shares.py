"""What part of a physical GPU a device counts for (docs/architecture.md, GPU-equivalents).

A MIG slice counts its compute slices over its GPU's total: ``1g.10gb`` of an H100 = 1/7,
``3g.40gb`` of an A100 = 3/7, ``2g.12gb`` of an A30 = 2/4. A compute-instance profile
(``1c.3g.40gb``) counts its own compute slices (1/7). The profile is what NVML names a MIG
device (``NVIDIA H100 80GB HBM3 MIG 1g.10gb``) and what dcgm-exporter labels ``GPU_I_PROFILE``.
"""

from __future__ import annotations

import re

#: '[<c>c.]<g>g.<memory>gb[+<engines>]': 1g.10gb, 1g.10gb+me, 1c.3g.40gb, 7g.141gb
_PROFILE = re.compile(r"^(?:(\d)c\.)?(\d)g\.\d+gb(?:\+[a-z]+)*$")
#: GPUs whose MIG has 4 compute slices, not 7 (NVIDIA's MIG user guide, supported GPUs)
_FOUR_SLICE_MODELS = re.compile(r"\bA30\b")
MAX_SLICES = 7


def slices_of(model: str | None) -> int:
    """A GPU model's MIG compute slices: 4 for the A30, 7 for the A100, H100, H200, B200..."""
    return 4 if model and _FOUR_SLICE_MODELS.search(model) else MAX_SLICES


def mig_share(profile: str | None, model: str | None = None) -> float | None:
    """A MIG profile's share of its physical GPU, or None when the profile is not one
    (missing, or more slices than the model has)."""
    if not profile:
        return None
    m = _PROFILE.match(profile.strip().lower())
    if m is None:
        return None
    total = slices_of(model)
    compute = int(m.group(1) or m.group(2))
    if not 0 < compute <= int(m.group(2)) <= total:
        return None
    return compute / total


# AMD Instinct compute partitions (ROCm docs, conceptual/partition.md; tests/fixtures/amd/
# NOTES.md section 1): a mode divides a GPU's XCDs (compute dies) into equal partitions. SPX
# keeps one, DPX makes 2, TPX 3, QPX 4 and CPX one per XCD, so CPX's count is the model's.
_AMD_MODE_PARTITIONS = {"SPX": 1, "DPX": 2, "TPX": 3, "QPX": 4}
#: XCDs per model, matched in a market name ("AMD Instinct MI300X OAM", "Aqua Vanjaram
#: [Instinct MI300X VF]"): MI300A has 6, the MI300X, MI325X and MI350 series 8
_AMD_XCDS = (
    (re.compile(r"\bMI300A\b", re.IGNORECASE), 6),
    (re.compile(r"\bMI3(?:00X|25X|50X|55X)\b", re.IGNORECASE), 8),
)


def amd_xcds_of(model: str | None) -> int | None:
    """An AMD Instinct model's XCDs, or None for a model not known here."""
    for pattern, xcds in _AMD_XCDS:
        if model and pattern.search(model):
            return xcds
    return None


def amd_partition_count(mode: str | None, model: str | None = None) -> int | None:
    """How many equal compute partitions an AMD GPU in ``mode`` (``SPX``, ``DPX``, ``TPX``,
    ``QPX``, ``CPX``; any case) has: each counts 1/count of the GPU. None when it cannot be
    told: an unknown mode, CPX of a model whose XCDs are not known, or a mode the model's
    XCDs do not divide into (TPX of an 8-XCD MI300X, QPX of a 6-XCD MI300A)."""
    name = (mode or "").strip().upper()
    xcds = amd_xcds_of(model)
    if name == "CPX":
        return xcds
    count = _AMD_MODE_PARTITIONS.get(name)
    if count is None or (xcds is not None and xcds % count):
        return None
    return count
