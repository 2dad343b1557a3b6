"""Which alerts an alert target gets: the settings every target shares (its plugin declaration
imports this, so it stays light: pydantic only)."""

from __future__ import annotations

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings

from gpugap.groundfloor.settings import CommaList, comma_list
from gpugap.schemas import Alert


class TargetSettings(BaseSettings):
    """What every alert target shares: which alerts it gets. Subclasses set the prefix."""

    clusters: CommaList = Field(default_factory=list, description="empty: every cluster")
    teams: CommaList = Field(default_factory=list, description="empty: every team")
    classes: CommaList = Field(default_factory=list, description="workload classes; empty: all")
    schedulers: CommaList = Field(default_factory=list, description="slurm, kubernetes")
    kinds: CommaList = Field(default_factory=list, description="idle_gpu, partial_gang")

    _lists = field_validator("clusters", "teams", "classes", "schedulers", "kinds", mode="before")(
        comma_list
    )

    def routes(self, alert: Alert) -> bool:
        """Whether ``alert`` is for this target."""
        wanted: list[tuple[list[str], str | None]] = [
            (self.clusters, alert.cluster),
            (self.teams, alert.team),
            (self.classes, alert.workload_class.value if alert.workload_class else None),
            (self.schedulers, alert.scheduler.value),
            (self.kinds, alert.kind.value),
        ]
        return all(not allowed or value in allowed for allowed, value in wanted)
