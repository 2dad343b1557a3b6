"""``gpugap produce slurm-jobcomp``: Slurm's own job records (jobcomp/kafka) -> ``slurm.jobs.v1``.

slurmctld publishes a record when a job starts (``enable_job_start``, 25.05+) and when it ends,
on topics the site names. This consumes both and publishes the events the hook and the poller
publish for the same jobs: the same event ids (cluster, job id, run), fields and times; only
``source`` says ``jobcomp``. Nothing is installed in slurmctld, and nothing is asked of Slurm
but ``scontrol show job`` (read-only) when a job starts:

- **which GPUs**: a record counts GPUs (``gres/gpu=2``) and never says which. While the job runs
  slurmctld does (``gres_detail``, from scontrol or, configured, slurmrestd with a JWT); the
  start event carries them, and the end event takes them from the start. Where slurmctld cannot
  tell (the job already ended, slurmctld unreachable), the event carries the count per node
  without indices, as sacct's history does: the pipeline counts those GPUs as allocated on the
  node and joins no GPU's use to them.
- **which run**: records name a run by its SLUID; ``jobcomp_runs.RunLedger`` turns it into the
  restart count the other sources use.
- **duplicates**: slurmctld re-sends what it purged at shutdown; an event id already published
  is not published again (and downstream deduplicates by event id anyway).
- **an end without a start** (slurmctld restarted with start records off, or lost): the end
  record holds the start time and nodes; both events are published from it.
- **a start without an end**: after ``end_check_s`` the run is checked with scontrol; an end
  slurmctld reports is published (source ``poller``: it is what the poller would say). A job
  slurmctld no longer knows stays open: ``gpugap produce slurm --since`` backfills it from sacct.

Offsets are committed only after the events are flushed to Kafka and the ledger is written.
A record that cannot be read is a dead letter (``dead-letter.v1``) with the reason.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, ClassVar

from gpugap.groundfloor.settings import Settings, read_secret
from gpugap.producers.base import Producer
from gpugap.producers.slurm import event, jobcomp, squeue
from gpugap.producers.slurm.event import JobInfo
from gpugap.producers.slurm.jobcomp_runs import RunLedger
from gpugap.producers.slurm.jobcomp_settings import SlurmJobcompSettings
from gpugap.producers.slurm.parse import ParseError
from gpugap.producers.slurm.slurmrestd import RestError, SlurmRestd
from gpugap.producers.slurm.sources import CommandError, run
from gpugap.schemas import DeadLetter, Topic, decode
from gpugap.schemas.errors import ConfigError
from gpugap.schemas.topics import DEAD_LETTER, SLURM_JOBS

log = logging.getLogger(__name__)
SOURCE = "jobcomp"
#: records read per poll (each start asks scontrol once)
MAX_RECORDS = 500


class SlurmJobcompProducer(Producer):
    name: ClassVar[str] = "slurm-jobcomp"

    def __init__(self, settings: Settings, config: SlurmJobcompSettings | None = None) -> None:
        super().__init__(settings)
        self.cfg = config or SlurmJobcompSettings()
        explicit = "cluster" in settings.model_fields_set
        self.cluster = self.cfg.cluster or (settings.cluster if explicit else None)
        topic = self.cfg.topic or self.cluster
        if topic is None:
            raise ConfigError(
                "slurm-jobcomp: set GPUGAP_SLURM_JOBCOMP_TOPIC to slurm.conf's JobCompParams "
                "topic= (or GPUGAP_SLURM_JOBCOMP_CLUSTER to Slurm's ClusterName, its default)"
            )
        self.topics = (self.cfg.start_topic or f"{topic}-job-start", topic)
        self.group = self.cfg.group or f"gpugap-slurm-jobcomp-{self.cluster or topic}"
        self.ledger = RunLedger(self.cfg.state_file)
        self.dead_letters = 0
        self._checked_at = time.monotonic()
        self.rest: SlurmRestd | None = None
        if self.cfg.slurmrestd_url is not None:
            token = read_secret(
                self.cfg.slurmrestd_token, self.cfg.slurmrestd_token_file, "the slurmrestd token"
            )
            if token is None:
                raise ConfigError(
                    "slurm-jobcomp: GPUGAP_SLURM_JOBCOMP_SLURMRESTD_URL needs a JWT: set "
                    "GPUGAP_SLURM_JOBCOMP_SLURMRESTD_TOKEN_FILE (or _TOKEN)"
                )
            self.rest = SlurmRestd(
                str(self.cfg.slurmrestd_url), token, self.cfg.slurmrestd_api,
                self.cfg.command_timeout_s,
            )  # fmt: skip

    @classmethod
    def default_topic(cls) -> Topic[Any]:
        return SLURM_JOBS

    async def run(self, stop: asyncio.Event, once: bool = False) -> None:
        from aiokafka import AIOKafkaConsumer

        assert self.publisher is not None
        kafka = self.settings.kafka
        consumer = AIOKafkaConsumer(
            *self.topics,
            **kafka.client_options(),
            group_id=self.group,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            # slurmctld creates its topics with its first record, maybe after we subscribe:
            # look again every few seconds rather than the default five minutes
            metadata_max_age_ms=5000,
        )
        await consumer.start()
        try:
            while not stop.is_set():
                batches = await consumer.getmany(timeout_ms=500, max_records=MAX_RECORDS)
                for messages in batches.values():
                    for message in messages:
                        await self.handle(
                            message.topic, message.value, message.partition, message.offset
                        )
                ended = 0
                if time.monotonic() - self._checked_at >= min(self.cfg.end_check_s, 60.0):
                    ended = await self.check_open()
                if batches or ended:
                    await self.publisher.flush()
                    self.ledger.save()
                if batches:
                    await consumer.commit()  # only what is stored: a crash re-reads, never skips
                    self.ticks += 1
                elif once:
                    return
        finally:
            await consumer.stop()

    async def close(self) -> None:
        if self.rest is not None:
            await self.rest.close()

    async def handle(
        self,
        topic: str,
        value: bytes | None,
        partition: int | None = None,
        offset: int | None = None,
    ) -> None:
        try:
            record = jobcomp.parse(value)
            cluster = self.cluster or record.info.cluster
            if cluster is None:
                raise ParseError(
                    "jobcomp: the record names no cluster (Slurm adds it only with slurmdbd): "
                    "set GPUGAP_SLURM_JOBCOMP_CLUSTER"
                )
            await self._publish(record, cluster)
        except (ParseError, ValueError) as exc:
            await self.dead_letter(topic, value, str(exc), partition, offset)

    async def _publish(self, record: jobcomp.Record, cluster: str) -> None:
        info = record.info
        known = self.ledger.known(info.raw_id, record.sluid)
        # slurmctld is asked when a job starts (which GPUs) and about a run not seen before
        ask = record.kind == "start" or known is None
        current = await self._slurmctld_view(info.raw_id) if ask else None
        now = (current.sluid or "", current.run) if current is not None else None
        info.run = self.ledger.run_of(info.raw_id, record.sluid, now)
        same_run = current is not None and (record.sluid is None or current.sluid == record.sluid)
        key = info.run_id
        events: list[dict[str, Any]] = []
        if record.kind == "start":
            if same_run and current is not None and current.gpu_indices is not None:
                info.gpu_indices = {n: current.gpu_indices.get(n, ()) for n in info.nodes}
            started = event.job_event(info, "start", cluster, SOURCE)
            self.ledger.open[key] = started
            events.append(started)
        else:
            start = self.ledger.open.pop(key, None)
            if start is not None:
                info.merge_start(start)
            events += event.events_for(info, cluster, SOURCE)
        for ev in events:
            await self._emit(ev)

    async def _emit(self, ev: dict[str, Any], source: str = SOURCE) -> None:
        if ev["event_id"] in self.ledger.emitted:
            return  # a re-sent record (slurmctld's purge at shutdown), or the end's own start
        ev = {**ev, "source": source}
        await self.emit(decode(SLURM_JOBS, event.encode(ev)))
        self.ledger.emitted[ev["event_id"]] = time.time()

    async def _slurmctld_view(self, job_id: str) -> JobInfo | None:
        """The job as slurmctld holds it now (its current run, SLUID, GPUs), or None. ``job_id``:
        the raw id, or as printed (``12_3``, ``11+1``)."""
        jobs = await self._slurmctld_jobs(job_id)
        return next((j for j in jobs or () if job_id in (j.raw_id, j.job_id)), None)

    async def _slurmctld_jobs(self, job_id: str | None = None) -> list[JobInfo] | None:
        """One job (and a het job's other parts), or with None every job slurmctld holds, in
        one call; None when it cannot be asked."""
        try:
            if self.rest is not None:
                text = await self.rest.job(job_id) if job_id else await self.rest.jobs()
            else:
                argv = [self.cfg.scontrol, "--json", "-d", "show", "job"]
                text = await run([*argv, job_id] if job_id else argv, self.cfg.command_timeout_s)
            return squeue.jobs(text)[0]
        except (CommandError, RestError, ParseError, OSError) as exc:
            log.debug("slurmctld's view of %s: %s", job_id or "every job", exc)
            return None

    async def check_open(self) -> int:
        """Runs started longer than ``end_check_s`` ago with no end record: if slurmctld says
        the run ended, publish that end. One listing of every job, however many are open.
        Returns how many ends it published."""
        self._checked_at = time.monotonic()
        cutoff = time.time() - self.cfg.end_check_s
        due = {k: s for k, s in self.ledger.open.items()
               if event.iso_ms(s["start_time"]) / 1000 <= cutoff}  # fmt: skip
        jobs = await self._slurmctld_jobs() if due else None
        if not jobs:
            return 0
        now = {j.job_id: j for j in jobs}
        ended = 0
        for key, start in due.items():
            current = now.get(start["job_id"])
            if current is None or current.run != int(start.get("run") or 0) or not current.ended:
                continue
            current.merge_start(start)
            end = event.job_event(current, "end", start["cluster"], "poller")
            del self.ledger.open[key]
            await self._emit(end, "poller")
            ended += 1
        return ended

    async def dead_letter(
        self,
        topic: str,
        value: bytes | None,
        reason: str,
        partition: int | None = None,
        offset: int | None = None,
    ) -> None:
        import base64

        self.dead_letters += 1
        if self.dead_letters == 1 or self.dead_letters % 100 == 0:
            log.warning("slurm-jobcomp: dead-lettered %d record(s), the latest: %s",
                        self.dead_letters, reason[:300])  # fmt: skip
        raw = value or b""
        letter = DeadLetter.model_validate(
            {
                "time": event.utc_ms(time.time()),
                "source_topic": topic,
                "partition": partition,
                "offset": offset,
                "value_b64": base64.b64encode(raw[: jobcomp.MAX_RECORD_BYTES]).decode(),
                "kind": "malformed",
                "reason": reason[:4000],
                "consumer": f"{self.name}:{self.group}",
            }
        )
        await self.emit(letter, DEAD_LETTER)
