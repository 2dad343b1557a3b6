"""What Slurm prints -> ``JobInfo``: ``scontrol -o show job -d``, ``sacct -P``, the jobcomp/script
environment. Times are epoch seconds (callers set ``SLURM_TIME_FORMAT=%s``, which avoids
guessing the time zone slurmctld formatted them in). A record that cannot be read raises
``ParseError`` naming what is wrong; multi-record parsers return the bad ones beside the good.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from .event import JobInfo
from .hostlist import expand, indices

NO_VAL = 4294967294  # Slurm's "not set" for 32-bit ids (ARRAYTASKID of a pending meta record)
_KEY = re.compile(r"(?:^|\s)([A-Za-z][A-Za-z0-9_:/]*)=")
_GPU = re.compile(r"(?:^|,)gpu(?::[^:(,]+)?:(\d+)\(IDX:([^)]*)\)")
_LIMIT = re.compile(r"^(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?$")


class ParseError(ValueError):
    """A record Slurm printed that this parser cannot read; the message says why."""


def pairs(line: str) -> list[tuple[str, str]]:
    """``Key=Value Key2=Value with spaces`` -> ordered pairs (keys may repeat: ``-d`` prints
    ``Nodes= CPU_IDs= Mem= GRES=`` once per node group)."""
    found = list(_KEY.finditer(line))
    out = []
    for i, m in enumerate(found):
        end = found[i + 1].start() if i + 1 < len(found) else len(line)
        out.append((m.group(1), line[m.end() : end].strip()))
    return out


def _int(value: str | None, what: str) -> int | None:
    if value is None or value in ("", "Unknown", "None", "N/A", "(null)"):
        return None
    try:
        return int(value)
    except ValueError:
        raise ParseError(f"{what}: not a number: {value!r}") from None


def epoch(value: str | None, what: str) -> int | None:
    """A time printed with SLURM_TIME_FORMAT=%s (0 and 'Unknown' mean not set)."""
    n = _int(value, what)
    return n if n else None


def time_limit(value: str | None) -> int | None:
    """``[D-]HH:MM:SS`` / ``MM:SS`` / minutes -> seconds; UNLIMITED, Partition_Limit -> None."""
    if value is None or not value or not value[0].isdigit():
        return None
    m = _LIMIT.match(value)
    if m is None:
        raise ParseError(f"time limit: cannot read {value!r}")
    days, a, b, c = (int(g) if g else None for g in m.groups())
    if b is None:  # plain minutes
        secs = (a or 0) * 60
    elif c is None:  # MM:SS
        secs = (a or 0) * 60 + b
    else:
        secs = (a or 0) * 3600 + b * 60 + c
    return secs + (days or 0) * 86400


def exit_pair(value: str | None) -> tuple[int | None, int | None]:
    """``"3:0"`` -> (3, 0): exit status and signal."""
    if not value:
        return None, None
    status, _, sig = value.partition(":")
    return _int(status, "exit code"), _int(sig or "0", "exit signal")


def base_state(value: str | None) -> str | None:
    """``CANCELLED by 0`` / ``CANCELLED+`` -> ``CANCELLED``."""
    if not value:
        return None
    return value.split()[0].rstrip("+").upper()


def tres_gpus(tres: str | None) -> int | None:
    """``cpu=1,gres/gpu=2,node=1`` -> 2 (typed ``gres/gpu:a100=2`` counts if untyped is absent)."""
    if not tres:
        return None
    plain, typed = None, 0
    for item in tres.split(","):
        key, _, val = item.partition("=")
        if key == "gres/gpu":
            plain = _int(val, "gres/gpu")
        elif key.startswith("gres/gpu:"):
            typed += _int(val, key) or 0
    return plain if plain is not None else (typed or None)


def gres_indices(gres: str) -> tuple[int, ...]:
    """``gpu:2(IDX:0-1)`` / ``gpu:a100:1(IDX:3),nic:1(IDX:0)`` -> GPU indices."""
    out: list[int] = []
    for m in _GPU.finditer(gres):
        if m.group(2) not in ("", "N/A"):
            try:
                out += indices(m.group(2))
            except ValueError as exc:
                raise ParseError(f"GRES {gres!r}: {exc}") from None
    return tuple(sorted(out))


def _array(info: JobInfo, job_id: str | None, task: str | None) -> None:
    aj = _int(job_id, "array job id")
    if aj:
        info.array_job_id = aj
        t = task if task and task.isdigit() else None  # "2-3": the pending meta record
        info.array_task_id = None if t is None or int(t) == NO_VAL else int(t)


def _het(info: JobInfo, het_id: str | None, offset: str | None) -> None:
    h = _int(het_id, "het job id")
    if h:
        info.het_job_id = h
        o = _int(offset, "het job offset")
        info.het_job_offset = None if o is None or o == NO_VAL else o


def _name(value: str | None) -> str | None:
    return None if value in (None, "", "(null)") else value


def scontrol_job(line: str) -> JobInfo:
    """One line of ``scontrol -o show job -d`` (run with SLURM_TIME_FORMAT=%s)."""
    kv = pairs(line.strip())
    if not kv or kv[0][0] != "JobId":
        raise ParseError("scontrol: record does not start with JobId=")
    first = dict(reversed(kv))  # the first occurrence of each key wins
    raw = first["JobId"]
    if not raw.isdigit():
        raise ParseError(f"scontrol: JobId is not a number: {raw!r}")
    info = JobInfo(raw_id=raw)
    _array(info, first.get("ArrayJobId"), first.get("ArrayTaskId"))
    _het(info, first.get("HetJobId"), first.get("HetJobOffset"))
    info.user = _name(first.get("UserId", "").split("(")[0])
    info.account = _name(first.get("Account"))
    info.partition = _name(first.get("Partition"))
    info.qos = _name(first.get("QOS"))
    info.name = first.get("JobName")
    info.state = base_state(first.get("JobState"))
    if info.state is None:
        raise ParseError(f"scontrol: job {raw}: no JobState")
    info.exit_status, info.exit_signal = exit_pair(first.get("ExitCode"))
    info.time_limit_s = time_limit(first.get("TimeLimit"))
    info.submit = epoch(first.get("SubmitTime"), "SubmitTime")
    info.start = epoch(first.get("StartTime"), "StartTime")
    info.end = epoch(first.get("EndTime"), "EndTime") if info.state != "PENDING" else None
    try:
        info.nodes = expand(first.get("NodeList"))
    except ValueError as exc:
        raise ParseError(f"scontrol: job {raw}: {exc}") from None
    info.gpus = tres_gpus(first.get("TRES"))
    info.batch = first.get("BatchFlag") == "1" if "BatchFlag" in first else None
    # -d: "Nodes=<hostlist> CPU_IDs=.. Mem=.. GRES=gpu:2(IDX:0-1)" per node group
    gpus: dict[str, tuple[int, ...]] = {}
    group: list[str] = []
    for key, value in kv:
        if key == "Nodes":
            try:
                group = expand(value)
            except ValueError as exc:
                raise ParseError(f"scontrol: job {raw}: {exc}") from None
        elif key == "GRES" and group:
            for node in group:
                gpus[node] = gres_indices(value)
            group = []
    if gpus and any(gpus.values()):
        info.gpu_indices = gpus
    elif info.state == "PENDING" or not info.gpus:
        info.gpu_indices = {}  # holds no GPUs: nothing unknown about it
    return info


def scontrol_jobs(text: str) -> tuple[list[JobInfo], list[tuple[str, str]]]:
    """Every line of ``scontrol -o show job -d``: (jobs, [(bad line, reason)])."""
    jobs, bad = [], []
    for line in text.splitlines():
        if not line.strip() or line.startswith("No jobs in the system"):
            continue
        try:
            jobs.append(scontrol_job(line))
        except ParseError as exc:
            bad.append((line, str(exc)))
    return jobs, bad


def jobcomp_env(env: Mapping[str, str]) -> JobInfo:
    """The environment jobcomp/script gives its script at every job end."""
    raw = env.get("JOBID", "")
    if not raw.isdigit():
        raise ParseError(f"jobcomp: JOBID is not a number: {raw!r}")
    info = JobInfo(raw_id=raw)
    _array(info, env.get("ARRAYJOBID"), env.get("ARRAYTASKID"))
    _het(info, env.get("HETJOBID") or env.get("PACKJOBID"), env.get("HETJOBOFFSET"))
    info.user = _name(env.get("USERNAME"))
    info.account = _name(env.get("ACCOUNT"))
    info.partition = _name(env.get("PARTITION"))
    info.qos = _name(env.get("QOS"))
    info.name = env.get("JOBNAME")
    info.state = base_state(env.get("JOBSTATE"))
    if info.state is None:
        raise ParseError(f"jobcomp: job {raw}: no JOBSTATE")
    info.exit_status, info.exit_signal = exit_pair(env.get("EXITCODE"))
    info.time_limit_s = time_limit(env.get("LIMIT"))
    info.submit = epoch(env.get("SUBMIT"), "SUBMIT")
    info.start = epoch(env.get("START"), "START")
    info.end = epoch(env.get("END"), "END")
    try:
        info.nodes = expand(env.get("NODES"))
    except ValueError as exc:
        raise ParseError(f"jobcomp: job {raw}: {exc}") from None
    info.batch = env["BATCH"] == "yes" if env.get("BATCH") else None
    info.cluster = _name(env.get("CLUSTER"))
    return info


#: sacct -P fields, JobName last: a '|' inside a job name then only lengthens the last field
SACCT_FIELDS = (
    "JobID,JobIDRaw,User,Account,Partition,QOS,State,ExitCode,Timelimit,"
    "Submit,Start,End,NodeList,AllocTRES,Cluster,JobName"
)
_SACCT_ID = re.compile(r"^(\d+)(?:_(\d+|\[[^\]]*\])|\+(\d+))?(?:\.(.+))?$")


def sacct_jobs(text: str) -> tuple[list[JobInfo], list[tuple[str, str]]]:
    """``sacct -P -n -o SACCT_FIELDS`` (with steps: a ``.batch`` step marks a batch job)."""
    n = len(SACCT_FIELDS.split(","))
    jobs: dict[str, JobInfo] = {}
    batch: set[str] = set()
    bad = []
    for line in text.splitlines():
        if not line.strip():
            continue
        f = line.split("|", n - 1)
        m = _SACCT_ID.match(f[0]) if len(f) == n else None
        if m is None:
            bad.append((line, f"sacct: expected {n} '|'-separated fields starting with a job id"))
            continue
        raw = f[1].split(".")[0]
        if m.group(4) is not None:  # a step: "4.batch", "3_1.0"
            if m.group(4) == "batch":
                batch.add(raw)
            continue
        try:
            info = JobInfo(raw_id=raw)
            if m.group(2) is not None:
                task = m.group(2)
                info.array_job_id = int(m.group(1))
                info.array_task_id = int(task) if task.isdigit() else None
            elif m.group(3) is not None:
                info.het_job_id, info.het_job_offset = int(m.group(1)), int(m.group(3))
            info.user, info.account = _name(f[2]), _name(f[3])
            info.partition, info.qos = _name(f[4]), _name(f[5])
            info.state = base_state(f[6])
            info.exit_status, info.exit_signal = exit_pair(f[7])
            info.time_limit_s = time_limit(f[8])
            info.submit = epoch(f[9], "Submit")
            info.start = epoch(f[10], "Start")
            info.end = epoch(f[11], "End") if info.state not in ("RUNNING", "PENDING") else None
            info.nodes = expand(f[12])
            info.gpus = tres_gpus(f[13])
            info.cluster = _name(f[14])
            info.name = f[15]
        except (ParseError, ValueError) as exc:
            bad.append((line, f"sacct: job {f[0]}: {exc}"))
            continue
        jobs[raw] = info
    for raw, info in jobs.items():
        info.batch = raw in batch if info.started else None
        if not info.gpus:
            info.gpu_indices = {}  # no GPUs: nothing unknown
    return list(jobs.values()), bad
