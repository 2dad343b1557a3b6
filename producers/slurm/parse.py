"""What Slurm prints -> ``JobInfo``: the jobcomp/script environment and ``sacct -P`` here,
``scontrol -o show job -d`` in scontrol.py, ``squeue --json`` in squeue.py. Times are epoch
seconds (callers set ``SLURM_TIME_FORMAT=%s``, which avoids guessing the time zone slurmctld
formatted them in). A record that cannot be read raises ``ParseError`` naming what is wrong;
multi-record parsers return the bad ones beside the good.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from producers.slurm.event import JobInfo
from producers.slurm.fields import (
    NO_VAL,
    ParseError,
    base_state,
    epoch,
    exit_pair,
    gres_indices,
    name_or_none,
    pairs,
    set_array,
    set_het,
    time_limit,
    tres_gpus,
)
from producers.slurm.hostlist import expand
from producers.slurm.scontrol import scontrol_job, scontrol_jobs

__all__ = [
    "NO_VAL",
    "SACCT_FIELDS",
    "ParseError",
    "base_state",
    "epoch",
    "exit_pair",
    "gres_indices",
    "jobcomp_env",
    "pairs",
    "sacct_jobs",
    "scontrol_job",
    "scontrol_jobs",
    "time_limit",
    "tres_gpus",
]


def jobcomp_env(env: Mapping[str, str]) -> JobInfo:
    """The environment jobcomp/script gives its script at every job end."""
    raw = env.get("JOBID", "")
    if not raw.isdigit():
        raise ParseError(f"jobcomp: JOBID is not a number: {raw!r}")
    info = JobInfo(raw_id=raw)
    set_array(info, env.get("ARRAYJOBID"), env.get("ARRAYTASKID"))
    set_het(info, env.get("HETJOBID") or env.get("PACKJOBID"), env.get("HETJOBOFFSET"))
    info.user = name_or_none(env.get("USERNAME"))
    info.account = name_or_none(env.get("ACCOUNT"))
    info.partition = name_or_none(env.get("PARTITION"))
    info.qos = name_or_none(env.get("QOS"))
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
    info.cluster = name_or_none(env.get("CLUSTER"))
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
            info.user, info.account = name_or_none(f[2]), name_or_none(f[3])
            info.partition, info.qos = name_or_none(f[4]), name_or_none(f[5])
            info.state = base_state(f[6])
            info.exit_status, info.exit_signal = exit_pair(f[7])
            info.time_limit_s = time_limit(f[8])
            info.submit = epoch(f[9], "Submit")
            info.start = epoch(f[10], "Start")
            info.end = epoch(f[11], "End") if info.state not in ("RUNNING", "PENDING") else None
            info.nodes = expand(f[12])
            info.gpus = tres_gpus(f[13])
            info.cluster = name_or_none(f[14])
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
