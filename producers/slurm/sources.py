"""Where the poller reads jobs: pyslurm (when it imports and matches the site's Slurm), else
``squeue --json``, else ``scontrol -o show job -d`` checked against squeue's list of job ids
(a newline in a job's name can forge a record in scontrol's text, see scontrol.py); history
from ``sacct -P``. Read-only: only show/query commands are ever run. Each returns
(jobs, [(bad raw text, reason)])."""

from __future__ import annotations

import asyncio
import logging
import os
from typing import Any

from gpugap.producers.slurm import squeue as squeue_parse
from gpugap.producers.slurm.event import JobInfo
from gpugap.producers.slurm.hostlist import indices
from gpugap.producers.slurm.parse import SACCT_FIELDS, ParseError, sacct_jobs
from gpugap.producers.slurm.scontrol import scontrol_jobs

log = logging.getLogger(__name__)
Result = tuple[list[JobInfo], list[tuple[str, str]]]
#: sacct --state: every state a job can be in after it was eligible. With no state filter
#: sacct leaves out jobs that were never eligible in the window (e.g. cancelled while held
#: with --begin in the future); with one, it reports jobs "in that state during the window".
SACCT_STATES = "CA,CD,F,TO,NF,PR,OOM,BF,DL,R,RQ,S"
#: the end states a requeue leaves on a run's record (producers.slurm.sacct.REQUEUE_ENDS)
REQUEUE_STATES = "RQ,NF,PR,BF"


class CommandError(Exception):
    pass


async def run(argv: list[str], timeout_s: float) -> str:
    env = dict(os.environ, SLURM_TIME_FORMAT="%s")  # epoch seconds, no time zone guessing
    proc = await asyncio.create_subprocess_exec(
        *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout_s)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise CommandError(f"{argv[0]} did not answer within {timeout_s:.0f}s") from None
    if proc.returncode != 0:
        raise CommandError(f"{' '.join(argv)} exited {proc.returncode}: {err.decode()[-300:]}")
    return out.decode(errors="replace")


async def squeue_json(squeue: str, timeout_s: float) -> Result:
    # every job slurmctld still remembers (MinJobAge), ended ones too: 22.05 ignores -t with
    # --json and lists them all; 23.02 and later list only pending and running jobs unless
    # told "-t all" (Slurm 26.05: without it the poller never saw an end)
    return squeue_parse.jobs(await run([squeue, "--json", "-a", "-t", "all"], timeout_s))


async def scontrol_all(scontrol: str, squeue: str, timeout_s: float) -> Result:
    text = await run([scontrol, "-o", "show", "job", "-d"], timeout_s)
    # after scontrol: a job it printed is still one squeue lists (until MinJobAge purges it)
    ids = await run([squeue, "-h", "-a", "-t", "all", "-o", "%A"], timeout_s)
    return scontrol_jobs(text, known_ids=ids.split())


async def sacct_fields(sacct: str, timeout_s: float) -> str:
    """SACCT_FIELDS, plus Restarts where this sacct has it (24.11 and later: the run's
    restart count, exact even where a record's earlier runs are outside the window)."""
    try:
        known = (await run([sacct, "--helpformat"], timeout_s)).split()
    except (CommandError, OSError):
        return SACCT_FIELDS  # the query itself says what is wrong
    if "Restarts" not in known:
        return SACCT_FIELDS
    return SACCT_FIELDS.replace(",JobName", ",Restarts,JobName")  # JobName stays last


async def sacct_since(
    sacct: str, start: int, end: int | None, timeout_s: float, fields: str = SACCT_FIELDS
) -> Result:
    """Every record (``-D``: each run of a requeued job, not only its last) that was
    eligible or ran in the window, with its steps, runs assigned within what sacct printed
    (``assign_runs`` again with the requeued records before the window makes them exact)."""
    argv = [sacct, "-a", "-D", "-P", "--state", SACCT_STATES, "-o", fields]
    argv += ["-S", _sacct_time(start), "-E", _sacct_time(end) if end else "now"]
    return sacct_jobs(await run(argv, timeout_s))


async def sacct_requeued(
    sacct: str, start: int, end: int | None, timeout_s: float, fields: str = SACCT_FIELDS
) -> Result:
    """The records that ended in the window in a state a requeue leaves (REQUEUED,
    NODE_FAIL, PREEMPTED, BOOT_FAIL): the earlier runs a window's records may follow."""
    argv = [sacct, "-a", "-D", "-X", "-P", "--state", REQUEUE_STATES, "-o", fields]
    argv += ["-S", _sacct_time(start), "-E", _sacct_time(end) if end else "now"]
    return sacct_jobs(await run(argv, timeout_s))


async def sacct_job(
    sacct: str, raw_id: str, timeout_s: float, fields: str = SACCT_FIELDS
) -> Result:
    """Every record of one job id (``-j`` reaches back to the epoch; ``-D``: all runs)."""
    argv = [sacct, "-D", "-X", "-P", "-j", raw_id, "-o", fields]
    return sacct_jobs(await run(argv, timeout_s))


def _sacct_time(epoch_s: int) -> str:
    import time

    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(epoch_s))  # sacct reads local time


# --- pyslurm --------------------------------------------------------------------------------


def pyslurm_module() -> Any | None:
    """pyslurm, if it imports and was built for this Slurm (its version tracks Slurm's)."""
    try:
        import pyslurm  # type: ignore[import-not-found]
    except Exception:  # not installed, or built against other Slurm libraries
        return None
    return pyslurm if hasattr(pyslurm, "Jobs") else None


def pyslurm_jobs(pyslurm: Any) -> Result:
    """pyslurm >= 23 (``pyslurm.Jobs.load()``). Not exercised by the test suite: PyPI's
    pyslurm builds only against the matching Slurm (25.11), and the test cluster is 22.05."""
    jobs, bad = [], []
    loaded = pyslurm.Jobs.load()
    for job in getattr(loaded, "values", lambda: [])():
        try:
            jobs.append(_from_pyslurm(job))
        except (ParseError, ValueError, TypeError, AttributeError) as exc:
            bad.append((repr(job), f"pyslurm: {exc}"))
    return jobs, bad


def _from_pyslurm(job: Any) -> JobInfo:
    from gpugap.producers.slurm.hostlist import expand
    from gpugap.producers.slurm.parse import base_state

    info = JobInfo(raw_id=str(job.id))
    if job.array_id:
        info.array_job_id, info.array_task_id = job.array_id, job.array_task_id
    if job.heterogeneous_id:
        info.het_job_id, info.het_job_offset = job.heterogeneous_id, job.heterogeneous_offset
    info.user, info.account = job.user_name, job.account
    info.partition, info.qos, info.name = job.partition, job.qos, job.name or ""
    info.state = base_state(job.state)
    info.exit_status, info.exit_signal = job.exit_code, job.exit_code_signal or 0
    limit = job.time_limit  # minutes, None when unlimited
    info.time_limit_s = limit * 60 if isinstance(limit, int) else None
    info.submit, info.start = job.submit_time or None, job.start_time or None
    info.eligible = getattr(job, "eligible_time", None) or None
    if info.state not in ("PENDING", "RUNNING", "CONFIGURING"):
        info.end = job.end_time or None
    info.nodes = expand(job.allocated_nodes)
    info.batch = bool(job.is_batch_job)
    info.cluster = job.cluster
    info.run = int(getattr(job, "restart_cnt", 0) or 0)  # the run: Slurm's restart count
    gpus: dict[str, tuple[int, ...]] = {}
    for node, layout in (job.get_resource_layout_per_node() or {}).items():
        found: list[int] = []
        for name, spec in (layout.get("gres") or {}).items():
            if str(name).split(":")[0] == "gpu" and isinstance(spec, dict):
                found += indices(str(spec.get("indexes") or ""))
        gpus[node] = tuple(sorted(found))
    info.gpu_indices = gpus if any(gpus.values()) else None
    return info
