"""How the prolog reads the job it runs for: ``scontrol --json -d show job`` where this Slurm
has it (23.02 and later), else ``scontrol -o show job -d`` read by its layout (scontrol.py),
and who the job is from the environment slurmctld gives the prolog.

PrologSlurmctld's environment has the job's user, account, partition, node list and name,
set by slurmctld from the job record: values, not text to split, so they are taken as they
are. scontrol adds what the environment lacks (the GPU indices per node, the time limit, the
start and submit times, QOS, batch or not) and must agree with the environment on the rest.
Whether ``--json`` works is asked once per scontrol binary and kept in the spool directory,
so a 22.05 prolog does not pay for a refused option on every job start.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Mapping

from gpugap.producers.slurm.event import JobInfo
from gpugap.producers.slurm.fields import ParseError
from gpugap.producers.slurm.hostlist import expand
from gpugap.producers.slurm.scontrol import scontrol_job

SEARCH = ("/usr/bin", "/usr/local/bin", "/opt/slurm/bin", "/usr/sbin")  # slurmctld strips PATH
RESERVE_S = 0.3  # of the hook's deadline, left for the send or the spool after scontrol
JSON_CACHE = "scontrol-json"  # in the spool directory: "<path> <mtime_ns> <size> <0|1>"


class ReadError(ParseError):
    """The job could not be read; ``text``: what scontrol printed (the dead letter keeps it)."""

    def __init__(self, msg: str, text: str = "") -> None:
        super().__init__(msg)
        self.text = text


def find_tool(name: str, env: Mapping[str, str]) -> str:
    if "/" in name:
        return name
    for d in [*(env.get("PATH") or "").split(os.pathsep), *SEARCH]:
        if d and os.access(os.path.join(d, name), os.X_OK):
            return os.path.join(d, name)
    return name


def read_job(
    scontrol: str, spool_dir: str, env: Mapping[str, str], job: str, deadline: float
) -> tuple[JobInfo, str]:
    """(the job, the text scontrol printed). Raises ParseError (the text is then the dead
    letter's content) when scontrol fails, is late, or disagrees with the environment."""
    tool = find_tool(scontrol, env)
    text = ""
    try:
        if _json_known(spool_dir, tool) is not False:
            ok, text = _run([tool, "--json", "-d", "show", "job", job], env, deadline)
            if ok and text.lstrip().startswith("{"):
                _json_remember(spool_dir, tool, True)
                return _from_env(_json_job(text, job), env), text
            if ok or "unrecognized option" in text or "invalid option" in text:
                _json_remember(spool_dir, tool, False)  # Slurm before 23.02
            else:
                raise ParseError(f"scontrol --json: {text.strip()[-300:]}")
        ok, text = _run([tool, "-o", "show", "job", "-d", job], env, deadline)
        if not ok:
            raise ParseError(f"scontrol: {text.strip()[-300:]}")
        # this job's record comes first (a het leader's id shows every component after it)
        if not text.startswith(f"JobId={job} "):
            raise ParseError(f"scontrol: the output does not start with JobId={job}")
        name, account = env.get("SLURM_JOB_NAME"), env.get("SLURM_JOB_ACCOUNT")
        return _from_env(scontrol_job(text, name=name, account=account), env), text
    except ParseError as exc:
        raise ReadError(str(exc), text) from None


def _run(argv: list[str], env: Mapping[str, str], deadline: float) -> tuple[bool, str]:
    """(exited 0, stdout, else stderr). Late: ParseError."""
    import subprocess  # only the prolog runs a command (~10 ms of imports the others skip)

    run_env = dict(env)
    run_env["SLURM_TIME_FORMAT"] = "%s"  # epoch seconds: no guessing slurmctld's time zone
    budget = max(0.05, deadline - time.monotonic() - RESERVE_S)
    try:
        out = subprocess.run(argv, capture_output=True, timeout=budget, env=run_env, check=False)
    except subprocess.TimeoutExpired:  # slurmctld busy
        raise ParseError(
            f"{os.path.basename(argv[0])} did not answer within {budget:.2f}s, what the hook's "
            "deadline (GPUGAP_SLURM_HOOK_TIMEOUT_S) left it"
        ) from None
    except OSError as exc:
        raise ParseError(f"cannot run {argv[0]}: {exc} (set GPUGAP_SLURM_SCONTROL)") from None
    if out.returncode != 0:
        return False, out.stderr.decode(errors="replace")
    # bytes as they are: a job name need not be UTF-8, and it is compared with the environment's
    return True, out.stdout.decode("utf-8", "surrogateescape")


def _json_job(text: str, job: str) -> JobInfo:
    from gpugap.producers.slurm import squeue  # the OpenAPI job object, as squeue --json has it

    jobs, bad = squeue.jobs(text)
    for info in jobs:
        if info.raw_id == job:
            return info
    why = f" ({bad[0][1]})" if bad else ""
    raise ParseError(f"scontrol --json: no readable record of job {job}{why}")


def _from_env(info: JobInfo, env: Mapping[str, str]) -> JobInfo:
    """Who the job is, from slurmctld's environment; scontrol must say the same."""
    try:
        nodes = expand(env.get("SLURM_JOB_NODELIST"))
    except ValueError:
        nodes = []
    theirs = {
        "user": env.get("SLURM_JOB_USER"),
        "account": env.get("SLURM_JOB_ACCOUNT"),
        "partition": env.get("SLURM_JOB_PARTITION"),
    }
    for field, value in theirs.items():
        if value and getattr(info, field) not in (None, value):
            raise ParseError(f"scontrol says {field} {getattr(info, field)!r}, slurmctld {value!r}")
        if value:
            setattr(info, field, value)
    if nodes and info.nodes and nodes != info.nodes:
        raise ParseError(f"scontrol says nodes {info.nodes}, slurmctld {nodes}")
    info.nodes = nodes or info.nodes
    if "SLURM_JOB_NAME" in env:
        info.name = env["SLURM_JOB_NAME"]
    count = restart_count(env)
    if count is not None:
        info.run = count  # scontrol's Restarts= says the same (the env is slurmctld's own)
    return info


def restart_count(env: Mapping[str, str]) -> int | None:
    """The run of the job a slurmctld hook runs for: SLURM_JOB_RESTART_COUNT (what 22.05 gives
    PrologSlurmctld and EpilogSlurmctld; SLURM_RESTART_COUNT is the name inside the job's
    own environment, read too). None: neither is there, or not a number."""
    for name in ("SLURM_JOB_RESTART_COUNT", "SLURM_RESTART_COUNT"):
        value = env.get(name, "")
        if value.isdigit():
            return int(value)
    return None


def _stamp(tool: str) -> str | None:
    try:
        st = os.stat(tool)
    except OSError:
        return None
    return f"{tool} {st.st_mtime_ns} {st.st_size}"


def _json_known(spool_dir: str, tool: str) -> bool | None:
    """What an earlier prolog found out about this scontrol (None: not asked yet)."""
    stamp = _stamp(tool)
    try:
        with open(os.path.join(spool_dir, JSON_CACHE)) as fh:
            kept = fh.read().strip()
    except (OSError, ValueError):
        return None
    if stamp is None or not kept.startswith(stamp + " "):
        return None  # another binary (an upgrade): ask again
    return kept.endswith(" 1")


def _json_remember(spool_dir: str, tool: str, works: bool) -> None:
    from gpugap.producers.slurm import spool

    stamp = _stamp(tool)
    if stamp is not None:
        with contextlib.suppress(OSError):  # then asked again next time
            spool.write_small(os.path.join(spool_dir, JSON_CACHE), f"{stamp} {int(works)}\n")
