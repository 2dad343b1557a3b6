"""Scenario files: what estate to simulate and which workload patterns run on it.

A scenario is TOML (stdlib ``tomllib``) or YAML with the same structure; every key is
validated here and an error names the key that is wrong (``clusters.0.workloads.2.gpus``),
so a typo fails loudly instead of silently simulating something else. Durations are
seconds or strings such as ``"90s"``, ``"10m"``, ``"2h"``, ``"1d"``, ``"1h30m"``; ranges are
``[low, high]`` (a single value means exactly that value). Activity levels are ratios 0..1.
"""

from __future__ import annotations

import tomllib
from datetime import datetime
from importlib import resources
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, ValidationError, field_validator, model_validator

from gpugap.schemas.errors import ConfigError
from gpugap.schemas.types import ActivityMetric
from gpugap.simulator.specs import (
    MIG_PROFILES,
    SAFE_TEXT,
    AnyWorkload,
    CpuOnly,
    Ident,
    K8sGang,
    K8sInference,
    K8sJob,
    K8sNotebook,
    K8sSweep,
    Level,
    Padded,
    PosInt,
    Rate,
    Seconds,
    SlurmArray,
    SlurmBatch,
    SlurmInteractive,
    SlurmTraining,
    Spec,
    Unattributed,
    Workload,
    parse_duration,
)

__all__ = [
    "CpuOnly",
    "K8sGang",
    "K8sInference",
    "K8sJob",
    "K8sNotebook",
    "K8sSweep",
    "Padded",
    "Scenario",
    "SlurmArray",
    "SlurmBatch",
    "SlurmInteractive",
    "SlurmTraining",
    "Unattributed",
    "Workload",
    "load",
    "parse",
    "parse_duration",
]


class NodeGroup(Spec):
    name: Ident
    count: PosInt
    gpus: Annotated[int, Field(ge=1, le=16)] = 8
    model: Annotated[str, Field(pattern=SAFE_TEXT)]
    memory_mib: Annotated[float, Field(gt=0)] = 81559.0
    power_w: tuple[Annotated[float, Field(ge=0)], Annotated[float, Field(gt=0)]] = (70.0, 700.0)
    mig_profile: str | None = Field(default=None, description="partition every GPU (MIG)")
    spare: int = Field(
        default=0,
        ge=0,
        description="nodes no scheduler places work on (drained: their capacity polls say "
        "not schedulable)",
    )
    cpus: PosInt | None = Field(default=None, description="per node; default 8 per GPU")
    memory_gib: Annotated[float, Field(gt=0)] | None = Field(
        default=None, description="per node; default 64 GiB per GPU"
    )

    @property
    def node_cpus(self) -> int:
        return self.cpus if self.cpus is not None else 8 * self.gpus

    @property
    def node_memory_mib(self) -> float:
        return (self.memory_gib if self.memory_gib is not None else 64.0 * self.gpus) * 1024

    @model_validator(mode="after")
    def _check(self) -> NodeGroup:
        if self.mig_profile is not None and self.mig_profile not in MIG_PROFILES:
            raise ValueError(
                f"mig_profile: unknown {self.mig_profile!r} ({', '.join(MIG_PROFILES)})"
            )
        if self.spare >= self.count and self.spare:
            raise ValueError("spare: must leave at least one schedulable node")
        return self


class Cluster(Spec):
    name: Ident
    scheduler: Literal["slurm", "kubernetes"]
    activity_metric: ActivityMetric = ActivityMetric.SM_ACTIVE
    sample_interval: Seconds | None = Field(default=None, description="default: the scenario's")
    node_groups: list[NodeGroup] = Field(min_length=1)
    workloads: list[AnyWorkload] = []


class Meta(Spec):
    name: Ident
    description: str = ""
    start: datetime
    duration: Seconds = Field(gt=0)
    sample_interval: Seconds = Field(default=10, ge=1, le=600)
    seed: int = 1
    idle_threshold: Level = 0.05
    idle_minutes: PosInt = 10
    capacity_interval: Seconds = Field(
        default=0,
        ge=0,
        le=3600,
        description="node capacity polls (node-capacity.v1) every so often; 0: none",
    )

    @field_validator("start")
    @classmethod
    def _start(cls, start: datetime) -> datetime:
        if start.tzinfo is None:
            raise ValueError("must carry a timezone, e.g. 2026-11-02T00:00:00Z")
        if start.second or start.microsecond:
            raise ValueError("must be on a whole minute (idle minutes are UTC minutes)")
        return start


class Faults(Spec):
    event_duplicate_rate: Rate = 0.0
    event_late_rate: Rate = Field(default=0.0, description="delivered after later records")
    event_max_delay: Seconds = Field(default=120, ge=1)
    sample_duplicate_rate: Rate = 0.0
    sample_late_rate: Rate = 0.0
    sample_max_delay: Seconds = Field(default=30, ge=1)
    sample_loss_rate: Rate = Field(
        default=0.0,
        description="node samples never sent, as a missed scrape: the seconds they covered "
        "are unmeasured",
    )
    malformed_rate: Rate = 0.0


class Scenario(Spec):
    scenario: Meta
    faults: Faults = Faults()
    teams: dict[Ident, list[Ident]] = Field(min_length=1, description="team -> users")
    clusters: list[Cluster] = Field(min_length=1)

    @model_validator(mode="after")
    def _check(self) -> Scenario:
        names = [c.name for c in self.clusters]
        if len(set(names)) != len(names):
            raise ValueError("clusters: names must be unique")
        for ci, c in enumerate(self.clusters):
            groups = {g.name: g for g in c.node_groups}
            if len(groups) != len(c.node_groups):
                raise ValueError(f"clusters.{ci}.node_groups: names must be unique")
            if c.sample_interval is not None and not 1 <= c.sample_interval <= 600:
                raise ValueError(f"clusters.{ci}.sample_interval: must be 1s..10m")
            for wi, w in enumerate(c.workloads):
                _check_workload(self, c, groups, w, f"clusters.{ci}.workloads.{wi}")
        return self

    def interval(self, cluster: Cluster) -> int:
        return cluster.sample_interval or self.scenario.sample_interval


def _check_workload(
    sc: Scenario, c: Cluster, groups: dict[str, NodeGroup], w: Workload, at: str
) -> None:
    kind: str = getattr(w, "kind", "")
    if kind.startswith("slurm_") and c.scheduler != "slurm":
        raise ValueError(f"{at}.kind: {kind} needs a slurm cluster, {c.name} is {c.scheduler}")
    if kind.startswith("k8s_") and c.scheduler != "kubernetes":
        raise ValueError(f"{at}.kind: {kind} needs a kubernetes cluster, {c.name} is slurm")
    if w.group is not None and w.group not in groups:
        raise ValueError(f"{at}.group: no node group {w.group!r} in cluster {c.name}")
    for team in w.teams or ():
        if team not in sc.teams:
            raise ValueError(f"{at}.teams: unknown team {team!r} (see [teams])")
    pool = [groups[w.group]] if w.group else list(groups.values())
    if isinstance(w, Unattributed) and not any(g.spare for g in pool):
        raise ValueError(f"{at}: unattributed use runs on spare nodes; give the group spare > 0")
    if isinstance(w, K8sNotebook) and w.mig and not any(g.mig_profile for g in pool):
        raise ValueError(f"{at}.mig: no MIG-partitioned node group to place it on")


def load(name_or_path: str | Path) -> Scenario:
    """A shipped scenario by name (``small``, ``demo``, ``scale``) or a TOML/YAML file."""
    path = Path(name_or_path)
    label = str(name_or_path)
    if path.suffix.lower() in (".toml", ".yaml", ".yml") or path.exists():
        try:
            text = path.read_text()
        except OSError as exc:
            raise ConfigError(f"scenario {label}: cannot read it ({exc.strerror})") from None
        suffix = path.suffix.lower()
    else:
        shipped = resources.files("gpugap.simulator.scenarios") / f"{name_or_path}.toml"
        if not shipped.is_file():
            known = sorted(
                p.name.removesuffix(".toml")
                for p in resources.files("gpugap.simulator.scenarios").iterdir()
                if p.name.endswith(".toml")
            )
            raise ConfigError(
                f"scenario {label!r}: no such file, nor a shipped scenario "
                f"(shipped: {', '.join(known)})"
            )
        text, suffix = shipped.read_text(), ".toml"
    return parse(text, label, yaml=suffix in (".yaml", ".yml"))


def parse(text: str, label: str = "scenario", *, yaml: bool = False) -> Scenario:
    try:
        if yaml:
            import yaml as pyyaml  # type: ignore[import-untyped]

            data = pyyaml.safe_load(text)
        else:
            data = tomllib.loads(text)
    except Exception as exc:  # both parsers raise their own error types
        raise ConfigError(
            f"scenario {label}: not valid {'YAML' if yaml else 'TOML'}: {exc}"
        ) from None
    try:
        return Scenario.model_validate(data)
    except ValidationError as exc:
        errors = exc.errors(include_url=False)
        parts = []
        for e in errors[:3]:
            where = ".".join(str(p) for p in e["loc"])
            msg = e["msg"].removeprefix("Value error, ")
            got = e.get("input")
            if e["type"] == "extra_forbidden":
                msg = "unknown key"
            elif isinstance(got, int | float | str) and len(repr(got)) <= 60:
                msg += f" (got {got!r})"
            parts.append(f"{where}: {msg}" if where else msg)
        more = f" (+{len(errors) - 3} more)" if len(errors) > 3 else ""
        raise ConfigError(f"scenario {label}: " + "; ".join(parts) + more) from None
