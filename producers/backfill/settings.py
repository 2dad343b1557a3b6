"""``GPUGAP_BACKFILL_*``: where history is read from and how hard it may be pulled.

One class for every source of ``gpugap backfill``: the Prometheus connection and its bounds
(telemetry and kube-state-metrics), sacct's (Slurm), and the run's chunking, parallelism and
checkpoints. Flags of ``gpugap backfill SOURCE`` override the same fields.
"""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar, Self

from pydantic import Field, SecretStr, model_validator
from pydantic_settings import BaseSettings

from gpugap.groundfloor.settings import env_config, read_secret

#: Prometheus refuses a query_range answer of more points than this per series
PROMETHEUS_POINTS_LIMIT = 11_000


class BackfillSettings(BaseSettings):
    """``gpugap backfill slurm|prometheus|kubernetes``."""

    model_config = env_config("GPUGAP_BACKFILL_")

    cluster: str | None = Field(default=None, description="cluster name (default GPUGAP_CLUSTER)")
    # --- the run -------------------------------------------------------------------------
    chunk_s: int = Field(
        default=3600, ge=60, le=7 * 86400, description="seconds of history per query (a chunk)"
    )
    concurrency: int = Field(default=4, ge=1, le=64, description="chunks fetched at once")
    checkpoint_dir: Path = Field(
        default=Path("~/.local/state/gpugap/backfill").expanduser(),
        description="one checkpoint file per source and range: a re-run resumes",
    )
    # --- Prometheus (telemetry, kube-state-metrics) -----------------------------------------
    prometheus_url: str | None = Field(default=None, description="e.g. http://prometheus:9090")
    bearer_token: SecretStr | None = Field(default=None, description="Authorization: Bearer")
    bearer_token_file: Path | None = None
    matchers: str = Field(
        default="",
        max_length=2048,
        description='PromQL label matchers added to every series selector: job="dcgm",...',
    )
    scrape_interval_s: float = Field(
        default=30.0, ge=1.0, le=3600.0, description="the exporters' scrape interval"
    )
    points_per_series: int = Field(
        default=10_000,
        ge=2,
        le=PROMETHEUS_POINTS_LIMIT,
        description="most points of one series in one answer (Prometheus: 11,000)",
    )
    timeout_s: float = Field(default=120.0, gt=0, description="per Prometheus request")
    retries: int = Field(default=3, ge=0, le=10, description="a failed request, again")
    max_response_bytes: int = Field(
        default=256 << 20, gt=0, description="larger is refused (x concurrency in memory)"
    )
    max_series: int = Field(default=100_000, ge=1, description="per answer; more is an error")
    # --- Slurm ---------------------------------------------------------------------------
    sacct: str = Field(default="sacct", description="the sacct command")
    sacct_timeout_s: float = Field(default=300.0, gt=0, description="per sacct call")

    #: whether the source asks Prometheus for ranges (query_range: its points-per-series
    #: limit bounds a chunk); sacct's chunks are bounded by nothing of Prometheus's
    range_queries: ClassVar[bool] = True

    @model_validator(mode="after")
    def _checks(self) -> Self:
        token = read_secret(self.bearer_token, self.bearer_token_file, "the Prometheus token")
        object.__setattr__(self, "bearer_token", token)
        points = self.chunk_s / self.scrape_interval_s
        if self.range_queries and points > self.points_per_series:
            raise ValueError(
                f"chunk_s {self.chunk_s} holds {points:,.0f} points of a series scraped every "
                f"{self.scrape_interval_s:g}s, more than points_per_series "
                f"{self.points_per_series}: a shorter chunk"
            )
        return self


class SlurmBackfillSettings(BackfillSettings):
    """``gpugap backfill slurm``: the same ``GPUGAP_BACKFILL_*`` variables, and sacct's own.

    Its chunks are sacct calls: Prometheus's points-per-series limit does not bound them
    (``--prometheus`` asks only instant queries of it, one per chunk)."""

    range_queries: ClassVar[bool] = False

    timezone: str | None = Field(
        default=None,
        max_length=64,
        description="the zone sacct printed a dump's times in when they carry no offset "
        "(sacct prints local time); e.g. UTC, Europe/Berlin",
    )
    requeue_lookback_s: int = Field(
        default=30 * 86400,
        ge=0,
        le=366 * 86400,
        description="how far before --since sacct is asked for requeued runs, so that a run "
        "after a requeue gets its run number even when the run before it ended earlier",
    )

    @model_validator(mode="after")
    def _zone(self) -> Self:
        if self.timezone is not None:
            from gpugap.producers.slurm.fields import ParseError
            from gpugap.producers.slurm.sacct import zone

            try:
                zone(self.timezone)
            except ParseError as exc:
                raise ValueError(str(exc)) from None
        return self
