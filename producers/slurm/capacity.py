"""``scontrol -o show node`` + ``scontrol -o show job -d`` -> one ``NodeCapacity`` per GPU node.

Pure: text in, records out (capacity_producer.py runs the commands), so every
rule here is tested on what a real Slurm printed (tests/fixtures/slurm/capacity/).

- A node offers its ``Gres=`` GPUs (``gpu:a100:8(S:0-1)``: 8, model ``a100``), its effective
  CPUs (``CPUEfctv=``, 22.05+: CPUTot less specialized cores, else ``CPUTot=``) and
  ``RealMemory=`` less ``MemSpecLimit=`` (memory kept for the OS is not schedulable).
- A job holds, on each node, what its ``-d`` group for that node says: ``CPU_IDs=`` (counted),
  ``Mem=`` (MiB) and ``GRES=gpu...:N(IDX:..)``. Every job that holds a node counts, GPU or
  not: a job's CPUs or memory strand the GPUs nobody else can then use.
- ``schedulable`` is False when slurmctld would start no new job there (down, drained or
  draining, failing, not responding, powered down, in a MAINT reservation, not registered
  yet): its free GPUs are unavailable, which an admin fixes, not stranded, which a job's
  shape causes. A node in an ordinary reservation stays schedulable: its users can use it.

Job records are read through scontrol.py's layout check (a job name cannot forge fields), and
squeue's ids must list each record once: a refused record is reported, never guessed at.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from datetime import datetime

from gpugap.producers.slurm.event import ACTIVE_STATES, JobInfo
from gpugap.producers.slurm.fields import _GPU, ParseError, number, pairs
from gpugap.producers.slurm.hostlist import _split_top, expand, indices
from gpugap.producers.slurm.scontrol import _ACCOUNT, _END, _HEAD, _OWNER, scontrol_jobs
from gpugap.schemas.models import NodeAllocation, NodeCapacity, slurm_allocation_id
from gpugap.schemas.types import Scheduler

SOURCE = "slurm_scontrol"
#: node state words (``MIXED+DRAIN``, ``IDLE+CLOUD+POWERED_DOWN``) under which slurmctld
#: starts no new job on the node
UNSCHEDULABLE = frozenset(
    {
        "DOWN",
        "DRAIN",
        "DRAINING",
        "DRAINED",
        "FAIL",
        "FAILING",
        "NOT_RESPONDING",
        "NO_RESPOND",
        "POWERED_DOWN",
        "POWERING_DOWN",
        "POWER_DOWN",
        "POWERING_UP",
        "MAINT",
        "REBOOT_ISSUED",
        "FUTURE",
        "UNKNOWN",
        "INVAL",
        "INVALID_REG",
    }
)
_UNITS = {"K": 1 / 1024, "M": 1.0, "G": 1024.0, "T": 1024.0**2, "P": 1024.0**3}
_MEM = re.compile(r"^(\d+(?:\.\d+)?)([KMGTP]?)$")

Bad = list[tuple[str, str]]


@dataclass
class Node:
    name: str
    pool: str | None
    gpu_model: str | None
    gpus: int
    cpus: int
    memory_mib: float
    schedulable: bool


@dataclass
class Held:
    """What one run of a job holds of one node."""

    job_id: str
    run: int
    gpus: float
    cpus: float
    memory_mib: float


def cluster_name(config: str) -> str | None:
    """ClusterName from ``scontrol show config`` (the name the job poller's squeue uses)."""
    for line in config.splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "ClusterName" and value.strip():
            return value.strip()
    return None


def gres_gpus(gres: str | None) -> tuple[int, str | None]:
    """A node's ``Gres=``: ``gpu:a100:8(S:0-1),nic:1`` -> (8, 'a100'); ``gpu:4`` -> (4, None).
    Several GPU types: their counts summed, their names comma-joined."""
    if not gres or gres == "(null)":
        return 0, None
    count, models = 0, []
    for item in _split_top(gres.replace("(", "[").replace(")", "]")):
        parts = item.split("[", 1)[0].split(":")
        if parts[0] != "gpu":
            continue
        n = number(parts[-1], f"Gres {gres!r}") if len(parts) > 1 else 1
        count += n or 0
        if len(parts) == 3 and parts[1] not in models:
            models.append(parts[1])
    return count, ",".join(models) or None


def schedulable(state: str) -> bool:
    """``MIXED+DRAIN`` -> False; ``IDLE*`` (``*``: not responding) -> False; ``MIXED`` -> True."""
    if "*" in state:
        return False
    return not any(word in UNSCHEDULABLE for word in state.rstrip("~#%!$@^-").split("+"))


def parse_nodes(text: str) -> tuple[list[Node], Bad]:
    """Every ``NodeName=`` line of ``scontrol -o show node``: (nodes, [(bad line, reason)])."""
    nodes, bad = [], []
    for line in text.split("\n"):
        if not line.startswith("NodeName="):
            continue
        # Reason= (and the admin's free text after it) is last: never read as fields
        cut = line.find(" Reason=")
        kv: dict[str, str] = {}
        for key, value in pairs(line if cut < 0 else line[:cut]):
            kv.setdefault(key, value)
        try:
            gpus, model = gres_gpus(kv.get("Gres"))
            cpus = number(kv.get("CPUEfctv"), "CPUEfctv") or number(kv.get("CPUTot"), "CPUTot")
            real = number(kv.get("RealMemory"), "RealMemory")
            if cpus is None or real is None or not kv.get("State"):
                raise ParseError("no CPUTot, RealMemory or State")
            spec = number(kv.get("MemSpecLimit"), "MemSpecLimit") or 0
        except ParseError as exc:
            bad.append((line, f"scontrol show node {kv.get('NodeName')}: {exc}"))
            continue
        partitions = kv.get("Partitions") or ""
        nodes.append(
            Node(
                name=kv["NodeName"],
                pool=partitions if partitions not in ("", "(null)") else None,
                gpu_model=model,
                gpus=gpus,
                cpus=cpus,
                memory_mib=float(max(real - spec, 0)),
                schedulable=schedulable(kv["State"]),
            )
        )
    return nodes, bad


def parse_holdings(
    text: str, known_ids: Collection[str] | None = None
) -> tuple[dict[str, list[Held]], Bad]:
    """``scontrol -o show job -d`` -> {node: what each job holding it holds}, bad records.
    ``known_ids``: squeue's raw job ids (see scontrol.scontrol_jobs: forged records)."""
    jobs, bad = scontrol_jobs(text, known_ids)
    by_id = {info.raw_id: info for info in jobs if info.state in ACTIVE_STATES}
    out: dict[str, list[Held]] = {}
    for line in text.split("\n"):
        head = _HEAD.match(line)
        info = by_id.pop(head.group(1), None) if head else None
        if info is None:
            continue
        try:
            for node, held in _node_shares(info, _detail(line)):
                out.setdefault(node, []).append(held)
        except (ParseError, ValueError) as exc:
            bad.append((line, f"scontrol: job {info.raw_id}: {exc}"))
    return out, bad


def _detail(line: str) -> list[tuple[str, str]]:
    """The pairs slurmctld wrote between the account and MinCPUsNode= (where ``-d`` puts its
    node groups), found as scontrol.scontrol_job found them: no job-owned text in them."""
    head = _HEAD.match(line)
    assert head is not None
    rest = line[head.end() :]
    owner = next(_OWNER.finditer(rest))  # scontrol_job refused records with more than one
    account = _ACCOUNT.match(rest, owner.end())
    assert account is not None
    return pairs(rest[account.end() : rest.find(_END, account.end())])


def _node_shares(info: JobInfo, kv: list[tuple[str, str]]) -> Iterable[tuple[str, Held]]:
    def held(gpus: float, cpus: float, mem: float) -> Held:
        return Held(info.job_id, info.run, gpus, cpus, mem)

    group: list[str] = []
    cpus = mem = 0.0
    seen = False
    for key, value in kv:
        if key == "Nodes":
            group, cpus, mem = expand(value), 0.0, 0.0
        elif key == "CPU_IDs":
            cpus = float(len(indices(value)))
        elif key == "Mem":
            mem = float(number(value, "Mem") or 0)
        elif key == "GRES" and group:
            gpus = float(sum(int(m.group(1)) for m in _GPU.finditer(value)))
            for node in group:
                yield node, held(gpus, cpus, mem)
            group, seen = [], True
    if seen or not info.nodes:
        return
    # no -d groups (a record printed without -d): an even share of the job's totals
    kv_all = dict(kv)
    n = len(info.nodes)
    total_cpus = number(kv_all.get("NumCPUs"), "NumCPUs") or 0
    tres = dict(item.partition("=")[::2] for item in (kv_all.get("TRES") or "").split(","))
    for node in info.nodes:
        yield node, held((info.gpus or 0) / n, total_cpus / n, mib(tres.get("mem")) / n)


def mib(value: str | None) -> float:
    """A TRES memory amount (``62.50G``, ``8000M``) in MiB; none -> 0."""
    if not value:
        return 0.0
    m = _MEM.match(value)
    if m is None:
        raise ParseError(f"memory {value!r}")
    return float(m.group(1)) * _UNITS[m.group(2) or "M"]


def node_capacities(
    nodes: Iterable[Node],
    holdings: dict[str, list[Held]],
    *,
    cluster: str,
    time: datetime,
    interval_s: float,
) -> list[NodeCapacity]:
    """One record per node that offers GPUs (ValidationError: the schema refuses one)."""
    return [
        node_capacity(
            n, holdings.get(n.name, []), cluster=cluster, time=time, interval_s=interval_s
        )
        for n in nodes
        if n.gpus > 0
    ]


def node_capacity(
    node: Node, held: Iterable[Held], *, cluster: str, time: datetime, interval_s: float
) -> NodeCapacity:
    """The node's record, with every job run that holds part of it."""
    merged: dict[str, NodeAllocation] = {}
    for h in held:
        aid = slurm_allocation_id(cluster, h.job_id, h.run)
        gpus, cpus, mem = h.gpus, h.cpus, h.memory_mib
        prev = merged.get(aid)
        if prev is not None:  # one run listed twice for a node: its shares add up
            gpus, cpus, mem = gpus + prev.gpus, cpus + prev.cpus, mem + prev.memory_mib
        merged[aid] = NodeAllocation(allocation_id=aid, gpus=gpus, cpus=cpus, memory_mib=mem)
    return NodeCapacity(
        cluster=cluster,
        node=node.name,
        time=time,
        interval_s=interval_s,
        scheduler=Scheduler.SLURM,
        source=SOURCE,
        pool=node.pool,
        gpu_model=node.gpu_model,
        gpus=node.gpus,
        cpus=node.cpus,
        memory_mib=node.memory_mib,
        schedulable=node.schedulable,
        allocations=tuple(merged[k] for k in sorted(merged)),
    )
