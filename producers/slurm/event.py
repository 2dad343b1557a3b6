"""One job as any Slurm source describes it (``JobInfo``), and the ``slurm.jobs.v1`` event it
becomes. Hooks, poller and backfill all go through ``job_event`` so that the same job gives
the same event (same ``event_id``, same fields; only ``source`` says who saw it).

Plain dicts, no pydantic: the hook builds events on every job start and end and must stay
fast. The dict has the fields of ``schemas.models.SlurmJobEvent`` in its field order and is
encoded the way ``schemas.encode`` does (``None`` left out); tests check that every event
built here decodes to a valid ``SlurmJobEvent``.
"""

from __future__ import annotations

import json
import time

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (hook start-up)

if TYPE_CHECKING:
    from typing import Any

TOPIC = "slurm.jobs.v1"
DEAD_LETTER_TOPIC = "dead-letter.v1"

#: final states the schema knows (SlurmJobState); anything else is not an end we can report
FINAL_STATES = frozenset(
    {
        "COMPLETED",
        "FAILED",
        "CANCELLED",
        "TIMEOUT",
        "NODE_FAIL",
        "PREEMPTED",
        "OUT_OF_MEMORY",
        "BOOT_FAIL",
        "DEADLINE",
        "REQUEUED",  # the run ended by a requeue; the job's next run is another allocation
    }
)
#: states in which the program ended by itself: its exit status means something. In the
#: others Slurm stopped it, and the sources disagree on what they report (jobcomp says 0:0
#: for a cancelled job, squeue says signal 15), so the exit code is left out.
SELF_ENDED = frozenset({"COMPLETED", "FAILED", "OUT_OF_MEMORY"})
#: states that hold resources (the job started and has not ended yet)
ACTIVE_STATES = frozenset(
    {"RUNNING", "CONFIGURING", "COMPLETING", "SUSPENDED", "STOPPED", "SIGNALING", "RESIZING"}
)


#: characters of a job name an event keeps (Slurm accepts 1024; the schema's Text, 4096)
NAME_MAX = 256
#: characters of a user, account, partition, QOS or cluster (the schema's Name)
LABEL_MAX = 253


def clean(value: str | None, limit: int = NAME_MAX) -> str | None:
    """Text a user wrote, made valid UTF-8 and bounded: bytes that are not UTF-8 (which
    os.environ and surrogateescape decoding hand over as lone surrogates) become U+FFFD, and
    at most ``limit`` characters are kept."""
    if value is None:
        return None
    try:
        value.encode()
    except UnicodeEncodeError:
        try:
            raw = value.encode("utf-8", "surrogateescape")  # back to the bytes Slurm had
        except UnicodeEncodeError:
            raw = value.encode("utf-8", "surrogatepass")
        value = raw.decode("utf-8", "replace")
    return value[:limit]


#: Slurm's backfill scheduler stores a year as the limit of a job it starts without one
#: (UNLIMITED when the main scheduler starts the same job): read it as unlimited.
YEAR_S = 365 * 86400


class JobInfo:
    """What one source says about one job (every field optional except the raw id)."""

    raw_id: str  # the number slurmctld gave this record (SLURM_JOB_ID, JobIDRaw)
    array_job_id: int | None = None
    array_task_id: int | None = None  # None for an array's pending meta record
    het_job_id: int | None = None
    het_job_offset: int | None = None
    user: str | None = None
    account: str | None = None
    partition: str | None = None
    qos: str | None = None
    name: str | None = None
    state: str | None = None  # base state, upper case, flags stripped
    exit_status: int | None = None  # X of Slurm's "X:Y"
    exit_signal: int | None = None  # Y of Slurm's "X:Y"
    time_limit_s: int | None = None  # None: unlimited or unknown
    submit: int | None = None  # epoch seconds
    eligible: int | None = None  # EligibleTime: --begin, holds and dependencies behind it
    start: int | None = None
    end: int | None = None
    nodes: list[str]
    #: node -> GPU indices; None when this source cannot tell (ended jobs, sacct)
    gpu_indices: dict[str, tuple[int, ...]] | None = None
    gpus: int | None = None  # GPU count from TRES, when known
    batch: bool | None = None
    cluster: str | None = None
    #: the run: Slurm's restart count (SLURM_JOB_RESTART_COUNT, Restarts=, restart_cnt; for
    #: sacct before 24.11, the incarnation's place among the job id's ``-D`` records)
    run: int = 0
    #: sacct's Restarts column as printed (24.11 and later), before the runs are assigned
    restarts: int | None = None
    #: sacct's SubmitLine, when the dump has it (evidence of the class)
    submit_line: str | None = None
    #: the run's SLUID (Slurm 26.05 and later: cluster-unique, a requeued run gets a new one)
    sluid: str | None = None

    def __init__(self, raw_id: str, **fields: Any) -> None:
        # a plain class, not a dataclass: importing dataclasses costs the hook ~10 ms
        self.raw_id = raw_id
        self.nodes = []
        for k, v in fields.items():
            if k not in JobInfo.__annotations__:
                raise TypeError(f"JobInfo has no field {k!r}")
            setattr(self, k, v)

    def __repr__(self) -> str:
        return f"JobInfo({self.run_id}, {self.state}, nodes={self.nodes}, gpus={self.gpu_indices})"

    @property
    def job_id(self) -> str:
        """The id as Slurm prints it: ``12``, ``10_3`` (array task), ``11+1`` (het component).

        An array's pending meta record (no task yet) keeps its raw id: every source can say
        that one without another call (jobcomp does not give the pending task range).
        """
        if self.het_job_id and self.het_job_offset is not None:
            return f"{self.het_job_id}+{self.het_job_offset}"
        if self.array_job_id and self.array_task_id is not None:
            return f"{self.array_job_id}_{self.array_task_id}"
        return self.raw_id

    @property
    def run_id(self) -> str:
        """The job id and its run (``12``, ``12#1``), as in allocation and event ids."""
        return run_id(self.job_id, self.run)

    @property
    def started(self) -> bool:
        """Did it ever hold nodes? (A job cancelled while pending has a start time = end.)"""
        return bool(self.start) and bool(self.nodes) and self.state != "PENDING"

    @property
    def ended(self) -> bool:
        return self.state in FINAL_STATES

    @property
    def exit_code(self) -> int | None:
        if self.state not in SELF_ENDED or self.exit_status is None:
            return None
        return 128 + self.exit_signal if self.exit_signal else self.exit_status

    def merge_start(self, start: dict[str, Any]) -> None:
        """Fill what an end-time source lacks (GPU indices, limit, the run) from the start
        event of the run that ends."""
        self.run = int(start.get("run") or 0)
        if self.gpu_indices is None and start.get("nodes") is not None:
            known = {n["node"]: tuple(n.get("gpu_indices", ())) for n in start["nodes"]}
            # a start that counted its GPUs without indices (jobcomp, sacct) says no more
            # than the end does: keep the count
            if any(known.values()) or not start.get("gpus_total"):
                self.gpu_indices = known
            self.nodes = self.nodes or [n["node"] for n in start["nodes"]]
        if self.gpus is None:
            self.gpus = start.get("gpus_total")
        if self.time_limit_s is None:
            self.time_limit_s = start.get("time_limit_s")
        if self.eligible is None and start.get("eligible_time"):
            self.eligible = iso_ms(start["eligible_time"]) // 1000


def utc_ms(epoch_s: float) -> str:
    """Epoch seconds -> the wire format of schemas.types.format_utc."""
    ms = round(epoch_s * 1000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ms // 1000)) + f".{ms % 1000:03d}Z"


def iso_ms(text: str) -> int:
    """The wire format (``2026-01-02T03:04:05.678Z``) back to epoch milliseconds."""
    y, mo, d = int(text[0:4]), int(text[5:7]), int(text[8:10])
    secs = int(text[11:13]) * 3600 + int(text[14:16]) * 60 + int(text[17:19])
    ms = int(text[20:23]) if len(text) > 20 and text[19] == "." else 0
    return (_days(y, mo, d) * 86400 + secs) * 1000 + ms


def _days(y: int, m: int, d: int) -> int:
    """Days since 1970-01-01 of a proleptic Gregorian date (the civil-from-days inverse)."""
    y -= m <= 2
    era = y // 400
    yoe = y - era * 400
    doy = (153 * (m + (-3 if m > 2 else 9)) + 2) // 5 + d - 1
    doe = yoe * 365 + yoe // 4 - yoe // 100 + doy
    return era * 146097 + doe - 719468


def run_id(job_id: str, run: int = 0) -> str:
    """``12`` (the first run), ``12#1`` (after one requeue): schemas.models.slurm_run_id."""
    return f"{job_id}#{run}" if run else job_id


def event_id(cluster: str, job_id: str, kind: str, run: int = 0) -> str:
    """The same for the hook, the poller and the backfill: dedupe downstream is exact. The
    first run keeps the ids of before runs existed (``slurm/<cluster>/<job>/<kind>``); a
    later run's are ``slurm/<cluster>/<job>#<run>/<kind>``."""
    return f"slurm/{cluster}/{run_id(job_id, run)}/{kind}"


def job_event(info: JobInfo, kind: str, cluster: str, source: str) -> dict[str, Any]:
    """A SlurmJobEvent as a dict (field order and None-dropping as schemas.encode does)."""
    cluster = clean(cluster, LABEL_MAX) or cluster  # SLURM_CLUSTER_NAME is bytes too
    started = info.started
    nodes: list[dict[str, Any]] = []
    gpus_total = 0
    if started:
        known = info.gpu_indices or {}
        for node in info.nodes:
            ix = known.get(node, ())
            nodes.append({"node": node, "gpu_indices": list(ix)})
            gpus_total += len(ix)
        if info.gpu_indices is None and info.gpus:
            gpus_total = info.gpus  # sacct: the count, not which GPUs
    state: str | None = "RUNNING"
    when, end, exit_code = info.start, None, None
    if kind == "end":
        when, state, end, exit_code = info.end, info.state, info.end, info.exit_code
    if when is None:
        raise ValueError(f"job {info.job_id}: no {kind} time")
    ev: dict[str, Any] = {
        "event_id": event_id(cluster, info.job_id, kind, info.run),
        "kind": kind,
        "time": utc_ms(when),
        "source": source,
        "cluster": cluster,
        "job_id": info.job_id,
        "run": info.run or None,  # the first run: no field (its events are as they were)
        "array_job_id": info.array_job_id or None,
        "array_task_id": info.array_task_id if info.array_job_id else None,
        "het_job_id": info.het_job_id or None,
        "het_job_offset": info.het_job_offset if info.het_job_id else None,
        "user": clean(info.user, LABEL_MAX) or None,
        "account": clean(info.account, LABEL_MAX) or None,
        "partition": clean(info.partition, LABEL_MAX) or None,
        "qos": clean(info.qos, LABEL_MAX) or None,
        "job_name": clean(info.name),
        "nodes": nodes,
        "gpus_total": gpus_total,
        "time_limit_s": None if info.time_limit_s == YEAR_S else info.time_limit_s,
        "submit_time": utc_ms(info.submit) if info.submit else None,
        # only a run that started waited for resources (a job cancelled before it never
        # did: and only the poller would know its eligible time)
        "eligible_time": utc_ms(info.eligible) if started and info.eligible else None,
        "start_time": utc_ms(info.start) if started and info.start else None,
        "end_time": utc_ms(end) if end is not None else None,
        "state": state,
        "exit_code": exit_code,
        "interactive": info.batch is False,
    }
    return {k: v for k, v in ev.items() if v is not None}


def events_for(info: JobInfo, cluster: str, source: str) -> list[dict[str, Any]]:
    """Start (if it started) and end (if it ended) events for what one source shows now."""
    out = []
    if info.started:
        out.append(job_event(info, "start", cluster, source))
    if info.ended and info.end:
        out.append(job_event(info, "end", cluster, source))
    return out


def key_of(ev: dict[str, Any]) -> str:
    """The topic key (schemas.topics.SLURM_JOBS: cluster/job_id)."""
    return f"{ev['cluster']}/{ev['job_id']}"


def encode(ev: dict[str, Any]) -> bytes:
    # "replace": a lone surrogate that escaped clean() must not cost the event (UnicodeError)
    return json.dumps(ev, separators=(",", ":"), ensure_ascii=False).encode("utf-8", "replace")


def dead_letter(
    raw: bytes, reason: str, consumer: str, now: float, kind: str = "malformed"
) -> dict[str, Any]:
    """A schemas.models.DeadLetter as a dict: unparseable Slurm output, kept to replay."""
    import base64

    return {
        "time": utc_ms(now),
        "source_topic": TOPIC,
        "value_b64": base64.b64encode(raw).decode(),
        "kind": kind,
        "reason": reason[:4000],
        "consumer": consumer,
    }
