"""``gpugap produce slurm``: the poller that reconciles the hooks with what Slurm reports.

Every ``interval_s`` it lists the jobs slurmctld remembers (pyslurm when it imports and
matches the site's Slurm, else ``squeue --json``, else ``scontrol -o show job -d`` with
``squeue -o %A``) and
emits a start for every job that started and an end for every job that ended, once each.
Event ids are those the hooks use (``slurm/<cluster>/<job>[#<run>]/<kind>``, the run being
Slurm's restart count: squeue's ``restart_cnt``, scontrol's ``Restarts=``), so a job both saw
is one job after dedupe, and a job the hooks missed (hook not configured, slurmctld restarted
mid-hook, spool lost) is still reported. GPU indices show only while a job runs, so the
poller remembers them from the ticks that saw the job running. A requeued job shows as
pending with a higher restart count: the run before it ends then (its end from sacct).

History: ``--since`` (and, after a restart, the gap since the last poll recorded in the
state file) is read from ``sacct -P`` when slurmdbd is there. sacct knows how many GPUs a
job had but not which: those events carry node names without indices.

Read-only: it runs show/query commands only. Output it cannot read becomes a dead letter
(``dead-letter.v1``) and one log line; the rest of the tick goes on.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from datetime import datetime
from pathlib import Path
from typing import Any, ClassVar

from pydantic import ValidationError

from gpugap.groundfloor.settings import Settings
from gpugap.producers.base import Producer
from gpugap.producers.slurm import sources
from gpugap.producers.slurm.event import ACTIVE_STATES, JobInfo, event_id, events_for, job_event
from gpugap.producers.slurm.parse import ParseError
from gpugap.producers.slurm.sacct import assign_runs
from gpugap.producers.slurm.settings import SlurmSettings
from gpugap.schemas import DeadLetter, SlurmJobEvent, Topic, utc_now
from gpugap.schemas.topics import DEAD_LETTER, SLURM_JOBS
from gpugap.schemas.types import DeadLetterKind

log = logging.getLogger(__name__)
KEEP_IDS_S = 7 * 86400  # an id is remembered this long (slurmctld forgets jobs much sooner)
MAX_RUNS_BACK = 8  # requeues between two polls that the poller closes the runs of
REQUEUE_LOOKBACK_S = 30 * 86400  # how far back the catch-up asks sacct for requeued runs


class Ledger:
    """Event ids already emitted, GPU indices of running jobs, the last poll: in memory, and
    in ``state_file`` when given (written after each flushed tick)."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.emitted: dict[str, float] = {}
        self.gpus: dict[str, dict[str, list[int]]] = {}
        #: the start time (epoch s) of each running job run this poller saw: a requeued
        #: run's end, when only the poller saw it, needs it
        self.starts: dict[str, int] = {}
        self.last_poll: float | None = None
        if path is not None and path.exists():
            data = json.loads(path.read_text())
            self.emitted, self.gpus = data.get("emitted", {}), data.get("gpus", {})
            self.starts = data.get("starts", {})
            self.last_poll = data.get("last_poll")

    def save(self) -> None:
        cutoff = time.time() - KEEP_IDS_S
        self.emitted = {k: t for k, t in self.emitted.items() if t >= cutoff}
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        state = {
            "emitted": self.emitted,
            "gpus": self.gpus,
            "starts": self.starts,
            "last_poll": self.last_poll,
        }
        tmp.write_text(json.dumps(state))
        tmp.replace(self.path)


class SlurmProducer(Producer):
    name: ClassVar[str] = "slurm"

    def __init__(self, settings: Settings, config: SlurmSettings | None = None) -> None:
        super().__init__(settings)
        self.slurm = config or SlurmSettings()
        self.interval_s = self.slurm.interval_s
        explicit = "cluster" in settings.model_fields_set
        self.cluster = self.slurm.cluster or (settings.cluster if explicit else None)
        self.since: datetime | None = self.slurm.since  # backfill from sacct on the first tick
        self.ledger = Ledger(self.slurm.state_file)
        self.source: str | None = None if self.slurm.source == "auto" else self.slurm.source
        self.dead_letters = 0

    @classmethod
    def default_topic(cls) -> Topic[Any]:
        return SLURM_JOBS

    async def run(self, stop: asyncio.Event, once: bool = False) -> None:
        """Like Producer.run, but the ledger is written only after the tick's events are
        flushed: a crash in between re-sends (same ids), it never skips."""
        assert self.publisher is not None
        loop = asyncio.get_running_loop()
        while not stop.is_set():
            started = loop.time()
            await self.tick()
            await self.publisher.flush()
            self.ledger.save()
            self.ticks += 1
            if once:
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(
                    stop.wait(), max(0.0, self.interval_s - (loop.time() - started))
                )

    async def tick(self) -> None:
        now = time.time()
        since = self.since.timestamp() if self.since else None
        if since is None and self.ledger.last_poll and now - self.ledger.last_poll > 60:
            since = self.ledger.last_poll - 60  # catch up on what ended while we were down
        if since is not None:
            await self.backfill(int(since))
            self.since = None
        try:
            jobs, bad = await self._list()
        except (sources.CommandError, OSError) as exc:
            log.warning("slurm: cannot list jobs (%s); next try in %.0fs", exc, self.interval_s)
            return
        for raw, reason in bad:
            await self.dead_letter(raw, reason)
        for info in jobs:
            await self.report(info)
        self.ledger.last_poll = now
        await self._drain_spool()

    async def _list(self) -> sources.Result:
        s, t = self.slurm, self.slurm.command_timeout_s
        if self.source in (None, "pyslurm"):
            mod = sources.pyslurm_module()
            if mod is not None:
                self.source = "pyslurm"
                return await asyncio.to_thread(sources.pyslurm_jobs, mod)
            if self.source == "pyslurm":
                log.warning("slurm: pyslurm does not import here; using squeue --json")
            self.source = "squeue"
        if self.source == "squeue":
            try:
                return await sources.squeue_json(s.squeue, t)
            except ParseError as exc:  # this tick falls back; the next tries squeue again
                await self.dead_letter("", str(exc), "squeue")
            except sources.CommandError as exc:
                log.warning("slurm: squeue --json failed (%s); using scontrol from now on", exc)
                self.source = "scontrol"
        return await sources.scontrol_all(s.scontrol, s.squeue, t)

    async def backfill(self, since: int) -> None:
        """Every job sacct knows that ran or ended since ``since`` (epoch seconds)."""
        try:
            jobs, bad = await sources.sacct_since(
                self.slurm.sacct, since, None, self.slurm.command_timeout_s * 4
            )
        except (sources.CommandError, OSError) as exc:
            log.warning("slurm: no history from sacct (%s): is slurmdbd there?", exc)
            return
        try:  # the runs before the window a requeued job's records in it follow
            earlier, _ = await sources.sacct_requeued(
                self.slurm.sacct, since - REQUEUE_LOOKBACK_S, None, self.slurm.command_timeout_s * 4
            )
            assign_runs(jobs, earlier)
        except (sources.CommandError, OSError) as exc:
            log.warning("slurm: no requeued runs from sacct (%s): runs numbered in the window", exc)
        for raw, reason in bad:
            await self.dead_letter(raw, reason, "sacct")
        for info in jobs:
            await self.report(info)

    async def report(self, info: JobInfo) -> None:
        """Emit what this job's current view shows and was not emitted yet."""
        cluster = self.cluster or info.cluster or "default"
        if info.ended and not info.nodes and info.start and info.end and info.end > info.start:
            # it ran (a job cancelled while pending has start = end), but its record lists no
            # node: Slurm 26.05 shows a job so for a moment while it releases them. The next
            # poll reads it whole (else the end would say it never held a GPU)
            return
        if info.run:
            await self._requeued(info, cluster)
        key = f"{cluster}/{info.raw_id}" + (f"#{info.run}" if info.run else "")
        if info.gpu_indices and info.state in ACTIVE_STATES:
            self.ledger.gpus[key] = {n: list(ix) for n, ix in info.gpu_indices.items()}
            if info.start:
                self.ledger.starts[key] = info.start
        elif info.gpu_indices is None and key in self.ledger.gpus:
            info.gpu_indices = {n: tuple(ix) for n, ix in self.ledger.gpus[key].items()}
        for ev in events_for(info, cluster, "poller"):
            if ev["event_id"] in self.ledger.emitted:
                continue
            if info.gpu_indices is None and info.state in ACTIVE_STATES:
                break  # GPUs not shown yet (e.g. CONFIGURING): a later tick will have them
            try:
                record = SlurmJobEvent.model_validate(ev)
            except ValidationError as exc:
                await self.dead_letter(json.dumps(ev), f"job {info.job_id}: {exc}", "event")
                continue
            await self.emit(record)
            self.ledger.emitted[ev["event_id"]] = time.time()
        if info.ended:
            self.ledger.gpus.pop(key, None)
            self.ledger.starts.pop(key, None)

    async def _requeued(self, info: JobInfo, cluster: str) -> None:
        """The job runs again (its restart count went up): the runs before whose start this
        poller emitted and whose end it never saw end now. Their end is sacct's (the hook's
        jobcomp says the same); without slurmdbd, the time Slurm requeued the job (it resets
        the submit time then, once the run's nodes are released), state REQUEUED."""
        open_runs = [
            r
            for r in range(max(0, info.run - MAX_RUNS_BACK), info.run)
            if event_id(cluster, info.job_id, "start", r) in self.ledger.emitted
            and event_id(cluster, info.job_id, "end", r) not in self.ledger.emitted
        ]
        if not open_runs:
            return
        records: dict[int, JobInfo] = {}
        try:
            found, _ = await sources.sacct_job(
                self.slurm.sacct, info.raw_id, self.slurm.command_timeout_s
            )
            for rec in found:  # sacct -j: this cluster's records of the job id
                if rec.ended and rec.end and rec.job_id == info.job_id:
                    records[rec.run] = rec
        except (sources.CommandError, OSError) as exc:
            log.info("slurm: no sacct for requeued job %s (%s)", info.job_id, exc)
        for r in open_runs:
            run_key = f"{cluster}/{info.raw_id}" + (f"#{r}" if r else "")
            ended = records.get(r)
            if ended is None:
                if not info.submit or run_key not in self.ledger.starts:
                    continue
                ended = JobInfo(
                    info.raw_id,
                    array_job_id=info.array_job_id,
                    array_task_id=info.array_task_id,
                    het_job_id=info.het_job_id,
                    het_job_offset=info.het_job_offset,
                    user=info.user,
                    account=info.account,
                    partition=info.partition,
                    qos=info.qos,
                    name=info.name,
                    state="REQUEUED",
                    start=self.ledger.starts[run_key],
                    end=info.submit,
                    run=r,
                    cluster=info.cluster,
                    time_limit_s=info.time_limit_s,
                    batch=info.batch,
                )
            ended.run = r
            gpus = self.ledger.gpus.pop(run_key, None)
            self.ledger.starts.pop(run_key, None)
            if gpus is not None and not ended.gpu_indices:
                ended.gpu_indices = {n: tuple(ix) for n, ix in gpus.items()}
                ended.nodes = ended.nodes or list(gpus)
            await self._emit_end(ended, cluster)

    async def _emit_end(self, info: JobInfo, cluster: str) -> None:
        ev = job_event(info, "end", cluster, "poller") if info.end else None
        if ev is None or ev["event_id"] in self.ledger.emitted:
            return
        try:
            record = SlurmJobEvent.model_validate(ev)
        except ValidationError as exc:
            await self.dead_letter(json.dumps(ev), f"job {info.run_id}: {exc}", "event")
            return
        await self.emit(record)
        self.ledger.emitted[ev["event_id"]] = time.time()

    async def dead_letter(self, raw: str, reason: str, what: str | None = None) -> None:
        import base64

        what = what or self.source or "slurm"
        log.warning("slurm: unreadable %s output, dead-lettered: %s", what, reason[:300])
        self.dead_letters += 1
        record = DeadLetter(
            time=utc_now(),
            source_topic=SLURM_JOBS.name,
            value_b64=base64.b64encode(raw.encode()[:262_144]).decode(),
            kind=DeadLetterKind.MALFORMED,
            reason=reason[:4000],
            consumer=f"slurm-poller:{what}",
        )
        await self.emit(record, DEAD_LETTER)

    async def _drain_spool(self) -> None:
        """Ship what the hook spooled, when the hook's spool directory is on this host."""
        root = self.slurm.spool_dir
        if not self.slurm.drain_spool or not (root / "events").is_dir():
            return
        from gpugap.groundfloor.kafka.consume import DeadLetters
        from gpugap.producers.slurm.drain import drain_once

        assert self.publisher is not None
        prefix = self.settings.kafka.topic_prefix
        try:
            await drain_once(
                root, self.publisher, DeadLetters(self.publisher, "slurm-poller", prefix)
            )
        except OSError as exc:
            log.warning("slurm: cannot drain the hook spool %s: %s", root, exc)
