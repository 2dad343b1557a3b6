"""A mixed estate in one small scenario, and its truth by share (issue 53; docs/architecture.md
#one-busy-scale): what every agent and scraper of every vendor must agree with.

Three nodes, ten minutes, a sample every 10 s, everything held by Kubernetes pods:

- ``nv-01``, NVIDIA H100s: GPU 0 whole (``train-0``, 0.8 then 0.4 busy by turns); GPU 1 in
  MIG (a 3g.40gb held by ``mig-a`` at 0.5, a 1g.10gb held by ``mig-b`` idle, 3/7 in no
  slice); GPU 2 time-sliced by ``inf-a`` and ``inf-b`` whose processes keep it busy 0.3 and
  0.1 (``inf-a`` 0.6 from minute 5), and a process of no pod 0.05.
- ``amd-01``, AMD Instinct MI300X: GPU 0 whole (``amd-train`` at 0.7); GPU 1 in CPX, 8
  partitions of 1/8, partition 2 held by ``amd-p2`` at 0.5 and partition 5 by ``amd-p5`` at
  0.25.
- ``xpu-01``, Intel Data Center GPU Max 1550: card 0 (2 tiles at 0.8 and 0.2: the card 0.5)
  held by ``xpu-train``.

Busy fractions are whole percents, so every tool's integer percent carries them exactly.

The truth follows the definitions, from what each process did: a holder consumes its own
processes' busy time; where a path measures use per process, a shared GPU's unused time is
split by holding and the busy time of processes no holder owns is unattributed; where it does
not, every holder gets an equal share of the GPU and of its use; where a path reads no activity
for a device (NVML on a MIG slice) its seconds are unmeasured. Every second counts its device's
share of a physical GPU (a 3g.40gb 3/7, a CPX partition 1/8).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from fractions import Fraction

from gpugap.schemas.shares import mig_share, slices_of

CLUSTER = "mixed"
MINUTES = 10
INTERVAL_S = 10
#: minute -> busy, for a pattern that alternates
TURNS = tuple(Fraction(80 if m % 2 == 0 else 40, 100) for m in range(MINUTES))


def _flat(percent: int) -> tuple[Fraction, ...]:
    return (Fraction(percent, 100),) * MINUTES


def raw_uuid(*parts: object) -> str:
    """A vendor's own UUID (no gpugap prefix), deterministic per scenario part."""
    return str(uuid.uuid5(uuid.NAMESPACE_DNS, "gpugap-mixed/" + "/".join(map(str, parts))))


@dataclass(frozen=True)
class Pod:
    name: str
    node: str
    team: str
    owner: str
    namespace: str = "ml"

    @property
    def uid(self) -> str:
        return raw_uuid("pod", self.name)

    @property
    def allocation_id(self) -> str:
        return f"k8s/{CLUSTER}/{self.uid}"


@dataclass(frozen=True)
class Use:
    """Processes of one pod (None: of no pod) on one device: busy per minute."""

    pod: str | None
    busy: tuple[Fraction, ...]
    pid: int


@dataclass(frozen=True)
class Device:
    node: str
    vendor: str  # nvidia, amd, intel
    index: int  # as the vendor's tool numbers it on the node
    uuid: str  # the vendor's own UUID of the physical device (partition 0's for AMD)
    model: str
    memory_total_mib: float
    holders: tuple[str, ...] = ()
    uses: tuple[Use, ...] = ()
    #: NVIDIA MIG: (gpu instance id, profile); the uuid is then the slice's own
    mig: tuple[int, str] | None = None
    parent_uuid: str | None = None
    #: AMD compute partition: (partition id, mode, partitions of the device)
    partition: tuple[int, str, int] | None = None
    #: Intel: each tile's busy per minute (the card's busy is their mean)
    tiles: tuple[tuple[Fraction, ...], ...] | None = None
    serial: str = ""

    @property
    def share(self) -> Fraction:
        if self.mig is not None:
            share = mig_share(self.mig[1], self.model)
            assert share is not None, self.mig
            return Fraction(round(share * slices_of(self.model)), slices_of(self.model))
        if self.partition is not None:
            return Fraction(1, self.partition[2])
        return Fraction(1)

    def busy(self, minute: int) -> Fraction:
        if self.tiles is not None:
            return sum((t[minute] for t in self.tiles), Fraction(0)) / len(self.tiles)
        return sum((u.busy[minute] for u in self.uses), Fraction(0))


@dataclass
class Scenario:
    pods: dict[str, Pod]
    devices: list[Device]
    mig_parents: dict[str, str] = field(default_factory=dict)  # parent uuid -> node


def build() -> Scenario:
    pods = {
        p.name: p
        for p in (
            Pod("train-0", "nv-01", "vision", "alice"),
            Pod("mig-a", "nv-01", "vision", "bob"),
            Pod("mig-b", "nv-01", "nlp", "carol"),
            Pod("inf-a", "nv-01", "nlp", "carol"),
            Pod("inf-b", "nv-01", "nlp", "dave"),
            Pod("amd-train", "amd-01", "vision", "alice"),
            Pod("amd-p2", "amd-01", "nlp", "erin"),
            Pod("amd-p5", "amd-01", "nlp", "frank"),
            Pod("xpu-train", "xpu-01", "vision", "grace"),
        )
    }
    h100, mem = "NVIDIA H100 80GB HBM3", 81559.0
    inf_a = tuple(Fraction(30 if m < 5 else 60, 100) for m in range(MINUTES))
    mig_parent = "GPU-" + raw_uuid("nv-01", 1)
    devices = [
        Device("nv-01", "nvidia", 0, raw_uuid("nv-01", 0), h100, mem, ("train-0",),
               (Use("train-0", TURNS, 1001),)),
        Device("nv-01", "nvidia", 1, raw_uuid("nv-01", 1, "mig", 1), h100, 40192.0, ("mig-a",),
               (Use("mig-a", _flat(50), 1101),), mig=(1, "3g.40gb"), parent_uuid=mig_parent),
        Device("nv-01", "nvidia", 1, raw_uuid("nv-01", 1, "mig", 2), h100, 9728.0, ("mig-b",),
               (), mig=(2, "1g.10gb"), parent_uuid=mig_parent),
        Device("nv-01", "nvidia", 2, raw_uuid("nv-01", 2), h100, mem, ("inf-a", "inf-b"),
               (Use("inf-a", inf_a, 1201), Use("inf-b", _flat(10), 1202),
                Use(None, _flat(5), 1203))),
        Device("amd-01", "amd", 0, raw_uuid("amd-01", 0), "AMD Instinct MI300X", 196592.0,
               ("amd-train",), (Use("amd-train", _flat(70), 2001),), serial="0x00A1B2C3D4E5F600"),
    ]  # fmt: skip
    cpx = raw_uuid("amd-01", 1)
    for p in range(8):
        holder = {2: "amd-p2", 5: "amd-p5"}.get(p)
        busy = {2: 50, 5: 25}.get(p, 0)
        devices.append(
            Device(
                "amd-01", "amd", 1 + p, cpx, "AMD Instinct MI300X", 196592.0 / 8,
                (holder,) if holder else (),
                (Use(holder, _flat(busy), 2100 + p),) if holder else (),
                partition=(p, "CPX", 8), serial="0x00A1B2C3D4E5F601",
            )
        )  # fmt: skip
    devices.append(
        Device("xpu-01", "intel", 0, raw_uuid("xpu-01", 0),
               "Intel(R) Data Center GPU Max 1550", 131072.0, ("xpu-train",),
               (Use("xpu-train", _flat(50), 3001),), tiles=(_flat(80), _flat(20)))
    )  # fmt: skip
    return Scenario(pods, devices, {mig_parent: "nv-01"})


@dataclass(frozen=True)
class Path:
    """What one way of reading the estate measures."""

    name: str
    vendors: frozenset[str]
    #: whether it reads activity on MIG slices (DCGM's profiling fields do; NVML does not)
    mig_activity: bool
    #: vendors whose use it measures per process
    per_process: frozenset[str]


AGENTS = Path("agents", frozenset({"nvidia", "amd"}), False, frozenset({"nvidia", "amd"}))
SCRAPERS = Path("scrapers", frozenset({"nvidia", "amd", "intel"}), True, frozenset({"nvidia"}))


@dataclass
class Figures:
    """One allocation's GPU-equivalent seconds (or the unattributed use, key "")."""

    allocated_s: Fraction = Fraction(0)
    consumed_s: Fraction = Fraction(0)
    measured_s: Fraction = Fraction(0)
    unallocated_s: Fraction = Fraction(0)


def truth(sc: Scenario, path: Path, vendor: str | None = None) -> dict[str, Figures]:
    """allocation id (or "" for nobody's) -> its figures over the ten minutes, on ``path``
    (on one vendor's devices only, if given)."""
    out: dict[str, Figures] = {}
    for d in sc.devices:
        if d.vendor not in path.vendors or vendor not in (None, d.vendor):
            continue
        measured = d.mig is None or path.mig_activity
        per_process = d.vendor in path.per_process and d.tiles is None
        holders = [sc.pods[h].allocation_id for h in d.holders]
        for m in range(MINUTES):
            s = 60 * d.share
            busy = d.busy(m)
            if not holders:
                f = out.setdefault("", Figures())
                f.unallocated_s += s
                f.consumed_s += busy * s
                f.measured_s += s
                continue
            k = len(holders)
            stranger = sum((u.busy[m] for u in d.uses if u.pod not in d.holders), Fraction(0))
            for h, aid in zip(d.holders, holders, strict=True):
                f = out.setdefault(aid, Figures())
                if not measured:
                    f.allocated_s += s / k
                    continue
                if per_process:
                    own = sum((u.busy[m] for u in d.uses if u.pod == h), Fraction(0))
                    f.allocated_s += (own + (1 - busy) / k) * s
                    f.consumed_s += own * s
                    f.measured_s += (own + (1 - busy) / k) * s
                else:
                    f.allocated_s += s / k
                    f.consumed_s += busy * s / k
                    f.measured_s += s / k
            if measured and per_process and stranger:
                f = out.setdefault("", Figures())
                f.unallocated_s += stranger * s
                f.consumed_s += stranger * s
                f.measured_s += stranger * s
        if d.mig is not None and d.mig[0] == 1:  # the part of its GPU in no slice: 1 - 3/7 - 1/7
            f = out.setdefault("", Figures())
            rest = 60 * MINUTES * Fraction(3, 7)
            f.unallocated_s += rest
            f.measured_s += rest
    return out
