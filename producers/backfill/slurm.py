"""``gpugap backfill slurm``: Slurm's accounting (``sacct``, slurmdbd) -> job start/end events.

The events are the poller's and the hooks' (``producers.slurm.event.events_for``: same ids
``slurm/<cluster>/<job>[#<run>]/<start|end>``, same fields), so a job the live path also
reported is one job after dedupe. sacct is read with ``-P -D`` (``SLURM_TIME_FORMAT=%s``,
JobName last, a ``|`` in a name cannot shift a field; ``producers.slurm.sacct``): every
record, so each run of a requeued job is an allocation of its own (docs/architecture.md
#slurm-job-runs), keyed by (cluster, JobIDRaw, run). ``--json`` carries nothing more for
this (its ``tres.allocated`` has the same GPU count, no indices).

**Runs.** sacct before 24.11 has no restart count: a record's run is its place among the
records of its job id. A run's record follows the one of the run before, which ended
REQUEUED, NODE_FAIL or PREEMPTED, perhaps before ``--since`` or the chunk: sacct is asked
once for those (``--requeue-lookback``, 30 days before ``--since``), and each chunk's
records are numbered after them. Where sacct has ``Restarts`` (24.11+) it is used too.

**A saved dump** (``--sacct-file``) is read as sites keep it: with or without its header,
epoch or ISO times (naive ones in ``--timezone``; none given: refused, with the fix), one
cluster or several (each record keeps its Cluster; ``--cluster`` with several is refused).
A dump of which nothing can be read is refused whole (exit 2), never "published" as dead
letters only.

Each chunk asks sacct for the jobs of its window (padded by a minute at each end) and emits
the events whose time falls in the chunk, so a job that spans chunks is reported once; the
first chunk also emits the start of jobs already running at ``--since`` (their real start
time, before the range). Read-only: ``sacct`` and nothing else.

**GPU indices.** sacct knows how many GPUs a job had (``AllocTRES gres/gpu=N``), not which.
Where dcgm-exporter's history in Prometheus carries the ``hpc_job`` label (its HPC job
mapping, written by the prolog), ``--prometheus URL`` reads which GPUs of which node showed
the job, and the event names those indices when they are exactly the job's count on the
job's nodes. Otherwise the event says the count without indices: the worker allocates
stand-in GPUs, flagged ``no_samples`` (allocated, consumption unknown).
"""

from __future__ import annotations

import json
import logging
from collections import defaultdict
from pathlib import Path
from typing import Any, ClassVar

from pydantic import ValidationError

from gpugap.groundfloor.settings import Settings
from gpugap.producers.slurm import sources
from gpugap.producers.slurm.event import JobInfo, job_event
from gpugap.producers.slurm.fields import SACCT_FIELDS, ParseError
from gpugap.producers.slurm.sacct import NeedsTimezone, assign_runs, sacct_jobs
from gpugap.schemas import DeadLetter, SlurmJobEvent, Topic, utc_now
from gpugap.schemas.errors import ConfigError, ServiceError
from gpugap.schemas.topics import DEAD_LETTER, SLURM_JOBS
from gpugap.schemas.types import DeadLetterKind

from .plan import Chunk
from .promql import PromClient, node_of
from .runner import Backfill, Published
from .settings import BackfillSettings, SlurmBackfillSettings

log = logging.getLogger(__name__)

MAX_DUMP_BYTES = 2 << 30  # a saved sacct dump is read whole: millions of jobs fit
PAD_S = 60  # sacct's window around a chunk: its edges are seconds, ours milliseconds
_ACTIVITY = "DCGM_FI_PROF_SM_ACTIVE|DCGM_FI_PROF_GR_ENGINE_ACTIVE|DCGM_FI_DEV_GPU_UTIL"
_LOOKAHEAD_MS = 600_000  # a job that starts late in a chunk shows in telemetry just after


class SlurmHistory(Backfill):
    source: ClassVar[str] = "slurm"

    def __init__(
        self,
        settings: Settings,
        config: BackfillSettings,
        *,
        sacct_file: Path | None = None,
        **kw: Any,
    ) -> None:
        super().__init__(settings, config, **kw)
        # the poller's rule, so that both give a job the same event ids: the name given,
        # else Slurm's ClusterName as sacct prints it
        explicit = config.cluster or ("cluster" in settings.model_fields_set and settings.cluster)
        self.explicit_cluster: str | None = explicit or None
        self.sacct_file = sacct_file
        self.client = PromClient(config) if config.prometheus_url else None
        self.timezone = config.timezone if isinstance(config, SlurmBackfillSettings) else None
        self.lookback_s = (
            config.requeue_lookback_s if isinstance(config, SlurmBackfillSettings) else 30 * 86400
        )
        self._file_jobs: list[JobInfo] | None = None
        self._bad: list[tuple[str, str]] = []
        self._earlier: list[JobInfo] = []  # requeued runs before --since (live sacct)
        self._fields = SACCT_FIELDS
        self.dead_letters = 0
        self.events = 0
        self.indices_found = 0
        self.indices_unknown = 0

    @classmethod
    def default_topic(cls) -> Topic[Any]:
        return SLURM_JOBS

    def checkpoint_key(self) -> dict[str, str]:
        key = {**super().checkpoint_key(), "sacct": str(self.sacct_file or self.cfg.sacct)}
        if self.client is not None:
            key["prometheus"] = self.client.url
        if self.timezone is not None:
            key["timezone"] = self.timezone
        return key

    async def prepare(self) -> None:
        if self.sacct_file is not None:  # a saved `sacct -P` dump: read once, cut per chunk
            try:
                size = self.sacct_file.stat().st_size
                if size > MAX_DUMP_BYTES:
                    raise ServiceError(
                        f"backfill slurm: {self.sacct_file} has {size:,} bytes, more than "
                        f"{MAX_DUMP_BYTES:,}: dump a shorter range (-S/-E) per file"
                    )
                text = self.sacct_file.read_text(errors="replace")
            except OSError as exc:
                raise ServiceError(
                    f"backfill slurm: cannot read {self.sacct_file}: {exc}"
                ) from None
            self._file_jobs, self._bad = self._read_dump(text)
            return
        # live: the requeued runs before the range, that records in it may follow
        t = self.cfg.sacct_timeout_s
        self._fields = await sources.sacct_fields(self.cfg.sacct, t)
        lo = self.since_ms // 1000 - self.lookback_s
        try:
            self._earlier, bad = await sources.sacct_requeued(
                self.cfg.sacct, lo, self.until_ms // 1000 + PAD_S, t, self._fields
            )
        except (sources.CommandError, OSError) as exc:
            raise ServiceError(
                f"backfill slurm: sacct failed: {exc} (is slurmdbd there?)"
            ) from None
        self._bad = bad

    def _read_dump(self, text: str) -> tuple[list[JobInfo], list[tuple[str, str]]]:
        """The dump's records, or a ConfigError that names the fix when it cannot be used."""
        name = self.sacct_file
        try:
            jobs, bad = sacct_jobs(text, self.timezone)
        except NeedsTimezone as exc:
            raise ConfigError(f"backfill slurm: {name}: {exc}") from None
        except ParseError as exc:
            raise ConfigError(f"backfill slurm: {name}: {exc}") from None
        if bad and not jobs:
            raise ConfigError(
                f"backfill slurm: {name}: none of its {len(bad):,} lines can be read "
                f"(the first: {bad[0][1][:300]}); dump with `SLURM_TIME_FORMAT=%s sacct -a "
                f"-D -P --state {sources.SACCT_STATES} -o {SACCT_FIELDS} -S ... -E ...` "
                "(docs/backfill.md)"
            )
        clusters = sorted({j.cluster for j in jobs if j.cluster})
        if self.explicit_cluster and len(clusters) > 1:
            raise ConfigError(
                f"backfill slurm: {name} holds the jobs of {len(clusters)} clusters "
                f"({', '.join(clusters[:5])}): each record keeps its Cluster; --cluster (or "
                "GPUGAP_CLUSTER) names one, so give a dump of one cluster per run, or no "
                "cluster name"
            )
        return jobs, bad

    async def _jobs(self, chunk: Chunk) -> tuple[list[JobInfo], list[tuple[str, str]]]:
        if self._file_jobs is not None:
            bad, self._bad = self._bad, []  # the dump's bad lines: once, with the first chunk
            return self._file_jobs, bad
        lo, hi = chunk[0] // 1000 - PAD_S, chunk[1] // 1000 + PAD_S
        try:
            jobs, bad = await sources.sacct_since(
                self.cfg.sacct, lo, hi, self.cfg.sacct_timeout_s, self._fields
            )
        except (sources.CommandError, OSError) as exc:
            raise ServiceError(
                f"backfill slurm: sacct failed: {exc} (is slurmdbd there?)"
            ) from None
        assign_runs(jobs, self._earlier)  # a run after a requeue before the chunk: its number
        bad, self._bad = [*self._bad, *bad], []  # the lookback's bad lines: with the first
        return jobs, bad

    async def fetch(self, chunk: Chunk) -> Published:
        jobs, bad = await self._jobs(chunk)
        out: list[tuple[Topic[Any], Any]] = [
            (DEAD_LETTER, self._dead_letter(r, why)) for r, why in bad
        ]
        first = chunk[0] == self.since_ms
        wanted: list[tuple[JobInfo, str]] = []
        for info in jobs:
            start_ms = info.start * 1000 if info.start else None
            end_ms = info.end * 1000 if info.end and info.ended else None
            if info.started and start_ms is not None:
                running_at_since = (
                    first and start_ms < chunk[0] and (end_ms or chunk[0] + 1) > chunk[0]
                )
                if chunk[0] <= start_ms < chunk[1] or running_at_since:
                    wanted.append((info, "start"))
            if end_ms is not None and chunk[0] <= end_ms < chunk[1]:
                wanted.append((info, "end"))
        if self.client is not None:
            await self._resolve(chunk, [i for i, kind in wanted if kind == "start"])
        events = []
        for info, kind in wanted:
            cluster = self.explicit_cluster or info.cluster or "default"
            ev = job_event(info, kind, cluster, "poller")
            try:
                events.append(SlurmJobEvent.model_validate(ev))
            except ValidationError as exc:
                out.append(
                    (DEAD_LETTER, self._dead_letter(json.dumps(ev), f"job {info.run_id}: {exc}"))
                )
        events.sort(key=lambda e: (e.time, e.job_id, e.run or 0, e.kind))
        self.events += len(events)
        return out + [(SLURM_JOBS, e) for e in events]

    def problem(self) -> str | None:
        """Why the run should exit non-zero: it published dead letters and no event."""
        if self.events or not self.dead_letters:
            return None
        return (
            f"backfill slurm: no job event published, {self.dead_letters:,} unreadable "
            "records dead-lettered (dead-letter.v1 has them with the reason): read sacct with "
            f"SLURM_TIME_FORMAT=%s and -o {SACCT_FIELDS} (docs/backfill.md)"
        )

    async def _resolve(self, chunk: Chunk, starting: list[JobInfo]) -> None:
        """GPU indices of the jobs starting in this chunk, from the ``hpc_job`` label."""
        todo = [i for i in starting if i.gpu_indices is None and i.gpus]
        if not todo or self.client is None:
            return
        lo = max(chunk[0], self.since_ms)
        hi = min(chunk[1] + _LOOKAHEAD_MS, self.until_ms)
        extra = f",{self.cfg.matchers.strip()}" if self.cfg.matchers.strip() else ""
        sel = f'{{__name__=~"{_ACTIVITY}",hpc_job!=""{extra}}}'
        query = (
            "count by (hpc_job, Hostname, hostname, instance, gpu) "
            f"(count_over_time({sel}[{hi - lo}ms]))"
        )
        seen: dict[str, dict[str, set[int]]] = defaultdict(lambda: defaultdict(set))
        for labels, _ in await self.client.instant(query, hi - 1):
            gpu = labels.get("gpu", "")
            if gpu.isdigit():
                seen[labels["hpc_job"]][node_of(labels)].add(int(gpu))
        for info in todo:
            found = seen.get(info.raw_id) or seen.get(info.job_id) or {}
            if (
                found
                and set(found) <= set(info.nodes)
                and sum(len(ix) for ix in found.values()) == info.gpus
            ):
                info.gpu_indices = {n: tuple(sorted(found.get(n, ()))) for n in info.nodes}
                self.indices_found += 1
            else:
                self.indices_unknown += 1

    def _dead_letter(self, raw: str, reason: str) -> DeadLetter:
        import base64

        self.dead_letters += 1
        log.warning("backfill slurm: unreadable sacct output, dead-lettered: %s", reason[:300])
        return DeadLetter(
            time=utc_now(),
            source_topic=SLURM_JOBS.name,
            value_b64=base64.b64encode(raw.encode()[:262_144]).decode(),
            kind=DeadLetterKind.MALFORMED,
            reason=reason[:4000],
            consumer="backfill-slurm",
        )

    async def close(self) -> None:
        if self.client is not None:
            await self.client.close()
