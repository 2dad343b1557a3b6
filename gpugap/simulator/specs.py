"""Value types and workload patterns of scenario files (see scenario.py): durations as
seconds or ``"1h30m"``, ``[low, high]`` ranges, activity levels 0..1, and one model per
pattern whose fields are that pattern's knobs."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, model_validator

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_DURATION = re.compile(r"(\d+)([smhd])")
#: MIG profile -> (slices per GPU, memory per slice in MiB), A100/H100 80 GB and 40 GB parts.
MIG_PROFILES: dict[str, tuple[int, float]] = {
    "1g.10gb": (7, 9856.0),
    "2g.20gb": (3, 19968.0),
    "3g.40gb": (2, 40192.0),
    "7g.80gb": (1, 80896.0),
    "1g.5gb": (7, 4864.0),
    "2g.10gb": (3, 9856.0),
    "3g.20gb": (2, 19968.0),
}
#: What a name may contain: it ends up in JSON written by hand on the hot path, and in keys.
SAFE_NAME = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"
SAFE_TEXT = r"^[A-Za-z0-9 ._()-]+$"


def parse_duration(value: Any) -> int:
    """Seconds from an int or a string like '1h30m'; anything else is a clear error."""
    if isinstance(value, bool):
        raise ValueError("a duration is seconds or a string like '10m'")
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str):
        text = value.strip().lower()
        sign = -1 if text.startswith("-") else 1
        text = text.removeprefix("-")
        parts = _DURATION.findall(text)
        if parts and "".join(n + u for n, u in parts) == text:
            return sign * sum(int(n) * _UNITS[u] for n, u in parts)
        if text.isdigit():
            return sign * int(text)
    raise ValueError(f"not a duration: {value!r} (use seconds or e.g. '90s', '10m', '2h', '1d')")


def _as_range(value: Any) -> Any:
    return [value, value] if not isinstance(value, list | tuple) else value


def _ordered(value: tuple[Any, Any]) -> tuple[Any, Any]:
    if value[0] > value[1]:
        raise ValueError(f"range low > high: {list(value)}")
    return value


Seconds = Annotated[int, BeforeValidator(parse_duration)]
Span = Annotated[tuple[Seconds, Seconds], BeforeValidator(_as_range), AfterValidator(_ordered)]
PosInt = Annotated[int, Field(ge=1)]
IntRange = Annotated[tuple[PosInt, PosInt], BeforeValidator(_as_range), AfterValidator(_ordered)]
PosFloat = Annotated[float, Field(gt=0.0)]
FloatRange = Annotated[
    tuple[PosFloat, PosFloat], BeforeValidator(_as_range), AfterValidator(_ordered)
]
Level = Annotated[float, Field(ge=0.0, le=1.0)]
LevelRange = Annotated[tuple[Level, Level], BeforeValidator(_as_range), AfterValidator(_ordered)]
Rate = Annotated[float, Field(ge=0.0, le=1.0)]
Ident = Annotated[str, Field(pattern=SAFE_NAME, max_length=63)]
States = dict[Literal["COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"], Annotated[float, Field(ge=0)]]


class Spec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Workload(Spec):
    """Fields every pattern has: how many, where, who, when they arrive."""

    count: int = Field(ge=0)
    group: Ident | None = Field(default=None, description="node group; default: any")
    teams: list[Ident] | None = Field(default=None, description="default: every team")
    start_within: Span | None = Field(
        default=None, description="arrival window relative to the start; default the scenario"
    )
    #: what each allocation holds beside a GPU (drawn per allocation from a stream of its own,
    #: so the other draws stay as they were); default: its node's per-GPU share
    cpus_per_gpu: FloatRange | None = None
    memory_gib_per_gpu: FloatRange | None = None


class Padded(Workload):
    duration: Span
    busy: LevelRange = (0.75, 0.95)
    limit_factor: tuple[float, float] = Field(default=(1.5, 4.0), description="limit/elapsed")
    states: States = {"COMPLETED": 0.85, "FAILED": 0.07, "CANCELLED": 0.05, "TIMEOUT": 0.03}

    @model_validator(mode="after")
    def _check(self) -> Padded:
        lo, hi = self.limit_factor
        if not 1.0 <= lo <= hi:
            raise ValueError("limit_factor must be [low, high] with 1 <= low <= high")
        if not any(self.states.values()):
            raise ValueError("states: at least one weight must be positive")
        return self


class Checkpointed(Spec):
    checkpoint_every: Span = (1800, 3600)
    checkpoint: Span = (180, 900)


class SlurmTraining(Padded, Checkpointed):
    kind: Literal["slurm_training"]
    nodes: IntRange = (2, 4)
    gpus_per_node: PosInt | None = Field(default=None, description="default: the whole node")
    straggler_rate: Rate = 0.3
    barrier: Span = (120, 720)


class SlurmBatch(Padded):
    kind: Literal["slurm_batch"]
    gpus: list[PosInt] = [1, 2, 4, 8]
    use: PosInt | None = Field(default=None, description="GPUs actually used (over-request)")


class SlurmInteractive(Padded):
    kind: Literal["slurm_interactive"]
    gpus: list[PosInt] = [1]
    bursts: IntRange = (1, 4)
    burst: Span = (120, 1200)


class SlurmArray(Padded):
    kind: Literal["slurm_array"]
    tasks: IntRange = (8, 24)
    gpus: PosInt = 1
    stagger: Span = (0, 300)


class K8sInference(Workload):
    kind: Literal["k8s_inference"]
    replicas: IntRange = (2, 4)
    gpus: PosInt = 1
    peak: LevelRange = (0.5, 0.7)
    trough: LevelRange = (0.08, 0.15)
    peak_hour: float = Field(default=15.0, ge=0, lt=24, description="UTC hour of peak demand")
    namespace: Ident = "inference"


class K8sNotebook(Workload):
    kind: Literal["k8s_notebook"]
    hold: Span = (14400, 43200)
    bursts: IntRange = (1, 4)
    burst: Span = (120, 900)
    busy: LevelRange = (0.4, 0.9)
    mig: bool = Field(default=False, description="request a MIG slice of the group's profile")
    namespace: Ident = "notebooks"


class K8sJob(Workload):
    kind: Literal["k8s_job"]
    gpus: list[PosInt] = [1, 2]
    duration: Span
    busy: LevelRange = (0.6, 0.95)
    failure_rate: Rate = 0.1
    ttl: Span = (300, 3600)
    namespace: Ident = "batch"


class K8sGang(Workload, Checkpointed):
    kind: Literal["k8s_gang"]
    pods: Annotated[int, Field(ge=2)] = 4
    gpus_per_pod: PosInt = 8
    pending: Span = (900, 5400)
    give_up: Rate = 0.5
    duration: Span = (3600, 14400)
    busy: LevelRange = (0.75, 0.95)
    namespace: Ident = "training"


class K8sSweep(Workload):
    kind: Literal["k8s_sweep"]
    trials: IntRange = (8, 24)
    parallel: PosInt = 4
    gpus: PosInt = 1
    duration: Span = (600, 3600)
    busy: LevelRange = (0.6, 0.95)
    namespace: Ident = "sweeps"


class Unattributed(Workload):
    kind: Literal["unattributed"]
    duration: Span = (300, 1800)
    level: LevelRange = (0.2, 0.6)


class CpuOnly(Workload):
    """Jobs or pods on GPU nodes that hold CPUs and memory and no GPU (capacity polls only:
    no scheduler events, no samples)."""

    kind: Literal["cpu_only"]
    cpus: FloatRange = (8.0, 32.0)
    memory_gib: FloatRange = (16.0, 128.0)
    duration: Span = (600, 3600)


AnyWorkload = Annotated[
    SlurmTraining
    | SlurmBatch
    | SlurmInteractive
    | SlurmArray
    | K8sInference
    | K8sNotebook
    | K8sJob
    | K8sGang
    | K8sSweep
    | Unattributed
    | CpuOnly,
    Field(discriminator="kind"),
]
