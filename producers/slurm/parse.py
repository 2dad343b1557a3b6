"""What Slurm prints -> ``JobInfo``: the jobcomp/script environment and ``sacct -P`` here,
``scontrol -o show job -d`` in scontrol.py, ``squeue --json`` in squeue.py. Times are epoch
seconds (callers set ``SLURM_TIME_FORMAT=%s``, which avoids guessing the time zone slurmctld
formatted them in). A record that cannot be read raises ``ParseError`` naming what is wrong;
multi-record parsers return the bad ones beside the good.
"""

from __future__ import annotations

from collections.abc import Mapping

from gpugap.producers.slurm.event import JobInfo
from gpugap.producers.slurm.fields import (
    NO_VAL,
    SACCT_FIELDS,
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
from gpugap.producers.slurm.hostlist import expand
from gpugap.producers.slurm.scontrol import scontrol_job, scontrol_jobs

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
    if info.state == "PENDING" and epoch(env.get("START"), "START"):
        # jobcomp/script fires when a run is requeued too (scontrol requeue, RequeueExit),
        # with the base state the job is left in: PENDING, and the run's START and END
        info.state = "REQUEUED"
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


def sacct_jobs(text: str, tz: str | None = None) -> tuple[list[JobInfo], list[tuple[str, str]]]:
    """``sacct -P`` -> one JobInfo per run: producers.slurm.sacct.sacct_jobs (imported when
    called: the hook, which imports this module, never reads sacct)."""
    from gpugap.producers.slurm import sacct

    return sacct.sacct_jobs(text, tz)
