"""``sacct -P`` -> ``JobInfo``: one per run of a job (docs/architecture.md#slurm-job-runs).

**What is read.** A dump as sites keep it: with its header line (``sacct -P`` without ``-n``:
any fields, in any order, found by name) or without one (``-n``: the fields of
``SACCT_FIELDS``, in that order). Times as epoch seconds (``SLURM_TIME_FORMAT=%s``) or ISO
8601 (sacct's default ``2024-05-01T10:00:00``, or with ``Z``/``+02:00``). sacct prints local
time without an offset: a naive time needs the zone sacct ran in (``tz``), else the whole
dump is refused (``NeedsTimezone``), never read in a guessed zone.

**Runs.** A requeued job keeps its job id; slurmdbd closes the run's record (state
REQUEUED, NODE_FAIL or PREEMPTED; Slurm resets the job's submit time) and opens a new one.
``sacct -D`` lists every record ("incarnation"); without ``-D`` only the last. A record's run
is Slurm's restart count: sacct's ``Restarts`` column where sacct has it (24.11 and later),
else the record's place in the chain of the same (cluster, JobIDRaw) records, in submit
order, each after one that ended by a requeue (``REQUEUE_ENDS``) of the same user. A record
after one that ended otherwise (COMPLETED...) is a reused job id: its chain starts again.

**Class.** A started job with a ``.batch`` step is a batch job. Without steps in the dump at
all (``sacct -X``), or with a ``SubmitLine`` column, the job's own evidence decides: its
submit line (``sbatch`` / ``salloc``, ``srun``), else a job named like a shell is
interactive, else unknown (the class defaults to batch), never "interactive" for lack of
steps.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable

from gpugap.producers.slurm.event import JobInfo
from gpugap.producers.slurm.fields import (
    SACCT_FIELDS,
    ParseError,
    base_state,
    exit_pair,
    name_or_none,
    number,
    time_limit,
    tres_gpus,
)
from gpugap.producers.slurm.hostlist import expand

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (the hook imports this)
if TYPE_CHECKING:
    from datetime import tzinfo

#: sacct 24.11 and later: how many times the job was requeued before this run
RESTARTS = "Restarts"
_SACCT_ID = re.compile(r"^(\d+)(?:_(\d+|\[[^\]]*\])|\+(\d+))?(?:\.(.+))?$")
#: what sacct (or a site's tool) prints for a run ended by a requeue -> the events' state
_REQUEUED = {"REQUEUED", "REQUEUE_FED", "REQUEUE_HOLD", "SPECIAL_EXIT"}
#: a record that ended so may be followed by the same job's next run (NODE_FAIL,
#: PREEMPTED, BOOT_FAIL: when the job may be requeued, which sacct does not say)
REQUEUE_ENDS = frozenset({"REQUEUED", "NODE_FAIL", "PREEMPTED", "BOOT_FAIL"})
#: columns of user text: a '|' in one shifts the fields after it, unless it is the last
_FREE_TEXT = frozenset(
    {"jobname", "submitline", "workdir", "comment", "admincomment", "systemcomment",
     "constraints", "extra", "stdout", "stderr", "stdin"}
)  # fmt: skip
_REQUIRED = ("state", "start", "end", "nodelist")
#: job names of interactive shells (``salloc`` / ``srun --pty bash`` name the job after it)
_SHELLS = frozenset({"bash", "sh", "zsh", "fish", "tcsh", "csh", "ksh", "interactive"})


class NeedsTimezone(ParseError):
    """The dump's times have no offset and no zone was given: refused whole."""


def sacct_time(value: str | None, what: str, tz: str | None) -> int | None:
    """Epoch seconds, or ISO 8601 (naive: in ``tz``) -> epoch seconds; unset -> None."""
    if value is None or value in ("", "Unknown", "None", "N/A", "(null)"):
        return None
    if value.isdigit():
        return int(value) or None
    from datetime import datetime

    try:
        t = datetime.fromisoformat(value)
    except ValueError:
        raise ParseError(f"{what}: neither epoch seconds nor an ISO time: {value!r}") from None
    if t.tzinfo is None:
        if tz is None:
            raise NeedsTimezone(
                f"{what} {value!r} has no UTC offset: sacct printed local time. Give the zone "
                "sacct ran in (gpugap backfill slurm --timezone Europe/Berlin, or UTC), or dump "
                "with SLURM_TIME_FORMAT=%s (epoch seconds, no zone to guess)"
            )
        t = t.replace(tzinfo=zone(tz))
    return int(t.timestamp())


def zone(tz: str) -> tzinfo:
    """UTC or an IANA zone name (datetime and zoneinfo imported only when a time needs it)."""
    from datetime import UTC
    from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

    if tz.upper() in ("UTC", "Z"):
        return UTC
    try:
        return ZoneInfo(tz)
    except (ZoneInfoNotFoundError, ValueError):
        raise ParseError(f"time zone {tz!r}: not a zone name (e.g. UTC, Europe/Berlin)") from None


def _columns(line: str) -> list[str] | None:
    """The header's column names (lower case), if ``line`` is sacct's header."""
    names = [c.strip().lower() for c in line.split("|")]
    if names and names[0] in ("jobid", "jobidraw") and all(c.isalnum() for c in names):
        return names
    return None


def sacct_jobs(text: str, tz: str | None = None) -> tuple[list[JobInfo], list[tuple[str, str]]]:
    """Every job record of a ``sacct -P`` dump (runs assigned), and the lines it cannot read.

    Raises ``NeedsTimezone`` for a naive time without ``tz``, and ParseError for a header
    without a column every record needs."""
    lines = [ln for ln in text.splitlines() if ln.strip()]
    cols, lines = _header(lines)
    at = {c: i for i, c in enumerate(cols)}
    # the same record twice (overlapping dumps): the last one counts, in the first's place
    records: dict[tuple[str, str, int | None, int | None], JobInfo] = {}
    last: dict[tuple[str, str], JobInfo] = {}  # the latest record of (cluster, raw): its steps
    stepped: set[tuple[str, str]] = set()  # steps before any record of theirs
    has_steps = False
    bad: list[tuple[str, str]] = []
    for line in lines:
        f = _split(line, cols)
        if isinstance(f, str):
            bad.append((line, f))
            continue

        def col(name: str, f: list[str] = f) -> str | None:
            i = at.get(name)
            return f[i] if i is not None else None

        job_id = col("jobid") or col("jobidraw") or ""
        m = _SACCT_ID.match(job_id)
        if m is None:
            bad.append((line, f"sacct: {job_id!r} is not a job id (fields: {','.join(cols)})"))
            continue
        raw = (col("jobidraw") or job_id).split(".")[0]
        key = (name_or_none(col("cluster")) or "", raw)
        if m.group(4) is not None:  # a step: "4.batch", "3_1.0"
            has_steps = True
            if m.group(4) == "batch" and key in last:
                last[key].batch = True
            elif m.group(4) == "batch":
                stepped.add(key)
            continue
        try:
            info = _record(raw, m, col, tz)
        except NeedsTimezone:
            raise
        except (ParseError, ValueError) as exc:
            bad.append((line, f"sacct: job {job_id}: {exc}"))
            continue
        info.batch = key in stepped or None  # its .batch step, when it comes, sets True
        stepped.discard(key)
        records[(*key, info.submit, info.start)] = last[key] = info
    jobs = list(records.values())
    for info in jobs:
        info.batch = _batch(info, has_steps) if info.started else None
        if not info.gpus:
            info.gpu_indices = {}  # no GPUs: nothing unknown
    assign_runs(jobs)
    return jobs, bad


def _header(lines: list[str]) -> tuple[list[str], list[str]]:
    """(the column names, the data lines): the dump's header, else SACCT_FIELDS."""
    cols = _columns(lines[0]) if lines else None
    if cols is None:
        return SACCT_FIELDS.lower().split(","), lines
    missing = [c for c in _REQUIRED if c not in cols]
    if missing:
        raise ParseError(
            f"sacct dump: its header has no {', '.join(missing)} column: dump with "
            f"-o {SACCT_FIELDS} (docs/backfill.md)"
        )
    return cols, lines[1:]


def _split(line: str, cols: list[str]) -> list[str] | str:
    """A line's fields, or why it cannot be split (a '|' in user text not last)."""
    n = len(cols)
    f = line.split("|", n - 1)
    if len(f) != n:
        return f"sacct: expected {n} '|'-separated fields, got {len(f)}"
    shifts = [c for c in cols[:-1] if c in _FREE_TEXT]
    if shifts and line.count("|") >= n:
        return f"sacct: a '|' in {shifts[0]} shifts the fields: dump that column last"
    return f


def _record(
    raw: str, m: re.Match[str], col: Callable[[str], str | None], tz: str | None
) -> JobInfo:
    """One job record (not a step): ``m`` its JobID matched, ``col`` its fields by name."""
    info = JobInfo(raw_id=raw)
    if m.group(2) is not None:
        task = m.group(2)
        info.array_job_id = int(m.group(1))
        info.array_task_id = int(task) if task.isdigit() else None
    elif m.group(3) is not None:
        info.het_job_id, info.het_job_offset = int(m.group(1)), int(m.group(3))
    info.user, info.account = name_or_none(col("user")), name_or_none(col("account"))
    info.partition, info.qos = name_or_none(col("partition")), name_or_none(col("qos"))
    state = base_state(col("state"))
    info.state = "REQUEUED" if state in _REQUEUED else state
    info.exit_status, info.exit_signal = exit_pair(col("exitcode"))
    info.time_limit_s = time_limit(col("timelimit"))
    info.submit = sacct_time(col("submit"), "Submit", tz)
    # not in SACCT_FIELDS (JobName stays last): read where a dump's header names it
    info.eligible = sacct_time(col("eligible"), "Eligible", tz)
    info.start = sacct_time(col("start"), "Start", tz)
    end = sacct_time(col("end"), "End", tz)
    info.end = end if info.state not in ("RUNNING", "PENDING") else None
    info.nodes = expand(col("nodelist"))
    info.gpus = tres_gpus(col("alloctres"))
    info.cluster = name_or_none(col("cluster"))
    info.name = col("jobname") or ""
    info.restarts = number(col("restarts"), RESTARTS)
    info.submit_line = col("submitline") or None
    return info


def _batch(info: JobInfo, has_steps: bool) -> bool | None:
    """Batch (True), interactive (False) or unknown (None), from the job's own evidence."""
    if info.submit_line:
        cmd = info.submit_line.split()[0].rsplit("/", 1)[-1] if info.submit_line.split() else ""
        if cmd == "sbatch":
            return True
        if cmd in ("salloc", "srun"):
            return False
    if info.batch:
        return True
    if has_steps:
        return False  # steps in the dump, none of them this job's .batch
    return False if (info.name or "").strip() in _SHELLS else None


def assign_runs(jobs: list[JobInfo], earlier: Iterable[JobInfo] = ()) -> None:
    """Set each record's run: its Restarts (sacct 24.11+), else its place in the chain of
    its (cluster, JobIDRaw) records by submit time, ``earlier`` records (e.g. the requeued
    ones before a chunk) included. A record's run is never below its Restarts."""
    groups: dict[tuple[str, str], dict[tuple[int, int], JobInfo]] = {}
    for info in [*earlier, *jobs]:  # the records of ``jobs`` win over their copies
        key = (info.cluster or "", info.raw_id)
        groups.setdefault(key, {})[(info.submit or info.start or 0, info.start or 0)] = info
    for records in groups.values():
        prev: JobInfo | None = None
        chain = 0
        for _, info in sorted(records.items()):
            if prev is not None:
                same_user = None in (prev.user, info.user) or prev.user == info.user
                chain = chain + 1 if prev.state in REQUEUE_ENDS and same_user else 0
            info.run = max(chain, info.restarts or 0)
            chain = info.run
            prev = info
