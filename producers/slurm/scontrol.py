"""``scontrol -o show job -d`` -> ``JobInfo``, where text the job's owner wrote stays data.

Slurm 22.05 prints a job as ``Key=Value`` pairs on one line and escapes nothing: a job name,
comment, work dir or output path can hold `` UserId=victim(2000) TRES=cpu=1,gres/gpu=16``,
or a newline and then a whole forged record. Splitting the line on every ``Key=`` lets the
owner of a job write its attribution, so a record is read by its known layout instead::

    JobId=N [ArrayJobId= ArrayTaskId= [ArrayTaskThrottle=]] [HetJobId= HetJobOffset=]
    JobName=<name> [HetJobIdSet=] UserId=u(uid) GroupId=g(gid) MCS_label= Priority= Nice=
    Account=<account> QOS= JobState= ... NodeList= ... TRES= ... [Nodes= CPU_IDs= Mem= GRES=]...
    MinCPUsNode= ... Features= ... Command= WorkDir= Comment= StdErr= StdIn= StdOut= ...

- The name ends where the real ``UserId=`` begins. The prolog knows the name (slurmctld sets
  SLURM_JOB_NAME): the record must carry exactly it. Without it (the poller's fallback), the
  ``UserId=u(uid) GroupId=g(gid) ... Account=`` run must occur once only, else the record is
  refused: which one is real cannot be told.
- Every field read lies between the name and the first ``MinCPUsNode=``, and slurmctld writes
  all of them, except the account, which it keeps as given where accounts are not enforced.
  The prolog knows the account too (SLURM_JOB_ACCOUNT). Without it, a forged copy inside the
  account would leave the real ``QOS= JobState= Reason=`` run after ``MinCPUsNode=``: a record
  with that run there is refused.
- Command, WorkDir, Comment, StdErr, StdOut... come after ``MinCPUsNode=``: never read.
- A newline in a name splits a record over two lines, the second forged. The poller passes
  squeue's job ids (``known_ids``): a record whose id is not among them, or appears twice,
  is refused, and so is the record before it (whose text held the newline).

A refused record is a ParseError (a dead letter and one log line), never a guess.
"""

from __future__ import annotations

import re
from collections.abc import Collection

from gpugap.producers.slurm.event import JobInfo
from gpugap.producers.slurm.fields import (
    ParseError,
    base_state,
    epoch,
    exit_pair,
    gres_indices,
    name_or_none,
    number,
    pairs,
    set_array,
    set_het,
    time_limit,
    tres_gpus,
)
from gpugap.producers.slurm.hostlist import expand

_HEAD = re.compile(
    r"JobId=(\d+)(?: ArrayJobId=(\d+) ArrayTaskId=(\S+)(?: ArrayTaskThrottle=\d+)?)?"
    r"(?: HetJobId=(\d+) HetJobOffset=(\d+))? JobName="
)
_OWNER = re.compile(
    r"(?: HetJobIdSet=\S+)? UserId=(\S*?)\(\d+\) GroupId=\S*?\(\d+\) MCS_label=\S* "
    r"Priority=\d+ Nice=-?\d+ Account="
)
_ACCOUNT = re.compile(r"(\S*)(?= QOS=)")
_REAL_RUN = re.compile(r" QOS=\S* (?:WCKey=\S* )?JobState=[A-Z_]+ Reason=")
_END = " MinCPUsNode="
_GROUP_KEYS = frozenset({"Nodes", "CPU_IDs", "Mem", "GRES"})  # -d: once per node group


def scontrol_job(text: str, *, name: str | None = None, account: str | None = None) -> JobInfo:
    """The record ``text`` starts with (run with SLURM_TIME_FORMAT=%s). ``name`` and
    ``account``: the job's own, as the hook's environment gives them (exact, not parsed)."""
    head = _HEAD.match(text)
    if head is None:
        raise ParseError("scontrol: record does not start with JobId=<number> ... JobName=")
    raw = head.group(1)
    rest = text[head.end() :]
    if name is not None:
        owner = _OWNER.match(rest, len(name)) if rest.startswith(name) else None
        if owner is None:
            raise ParseError(f"scontrol: job {raw}: its JobName is not SLURM_JOB_NAME {name!r}")
    else:
        found = list(_OWNER.finditer(rest))
        if len(found) != 1:
            raise ParseError(
                f"scontrol: job {raw}: the job name or another field holds text that reads as "
                "scontrol fields (UserId=... Account=): refused, the real ones cannot be told "
                "apart; squeue --json or the hook reports this job"
            )
        owner = found[0]
        name = rest[: owner.start()]
    known_account = account is not None
    if account is not None:
        if not rest.startswith(account + " QOS=", owner.end()):
            raise ParseError(f"scontrol: job {raw}: its Account is not SLURM_JOB_ACCOUNT")
        at = owner.end() + len(account)
    else:
        acct = _ACCOUNT.match(rest, owner.end())
        if acct is None:
            raise ParseError(f"scontrol: job {raw}: no QOS= after Account=")
        account, at = acct.group(1), acct.end()
    cut = rest.find(_END, at)
    if cut < 0:
        raise ParseError(f"scontrol: job {raw}: no MinCPUsNode= (a truncated record?)")
    # (only this line: after it, a het leader's or array's id shows the other records)
    line_end = rest.find("\n", cut)
    if not known_account and _REAL_RUN.search(rest, cut, line_end if line_end >= 0 else len(rest)):
        raise ParseError(
            f"scontrol: job {raw}: its account holds text that reads as scontrol fields: refused"
        )
    info = _fields(raw, pairs(rest[at:cut].strip()))
    set_array(info, head.group(2), head.group(3))
    set_het(info, head.group(4), head.group(5))
    info.user, info.account, info.name = name_or_none(owner.group(1)), name_or_none(account), name
    return info


def _fields(raw: str, kv: list[tuple[str, str]]) -> JobInfo:
    """What slurmctld wrote between the account and MinCPUsNode= (no user text)."""
    seen: dict[str, str] = {}
    for key, value in kv:
        if key in seen and key not in _GROUP_KEYS:
            raise ParseError(f"scontrol: job {raw}: {key}= twice")
        seen.setdefault(key, value)
    info = JobInfo(raw_id=raw)
    info.partition, info.qos = name_or_none(seen.get("Partition")), name_or_none(seen.get("QOS"))
    info.state = base_state(seen.get("JobState"))
    if info.state is None:
        raise ParseError(f"scontrol: job {raw}: no JobState")
    info.exit_status, info.exit_signal = exit_pair(seen.get("ExitCode"))
    info.time_limit_s = time_limit(seen.get("TimeLimit"))
    info.submit = epoch(seen.get("SubmitTime"), "SubmitTime")
    info.eligible = epoch(seen.get("EligibleTime"), "EligibleTime")
    info.start = epoch(seen.get("StartTime"), "StartTime")
    info.end = epoch(seen.get("EndTime"), "EndTime") if info.state != "PENDING" else None
    try:
        info.nodes = expand(seen.get("NodeList"))
    except ValueError as exc:
        raise ParseError(f"scontrol: job {raw}: {exc}") from None
    info.gpus = tres_gpus(seen.get("TRES"))
    info.batch = seen["BatchFlag"] == "1" if "BatchFlag" in seen else None
    info.run = number(seen.get("Restarts"), "Restarts") or 0  # the run: Slurm's restart count
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


def scontrol_jobs(
    text: str, known_ids: Collection[str] | None = None
) -> tuple[list[JobInfo], list[tuple[str, str]]]:
    """Every record of ``scontrol -o show job -d``: (jobs, [(bad line, reason)]).

    ``known_ids``: the raw job ids squeue lists (``squeue -h -t all -o %A``). Without them a
    newline in a job's text can forge a whole record: the poller always passes them."""
    # "\n" only: str.splitlines() also splits at U+2028, U+0085... which a name may hold
    lines = [ln for ln in text.split("\n") if ln.strip() and ln != "No jobs in the system"]
    parsed: list[JobInfo | str] = []
    for line in lines:
        try:
            parsed.append(scontrol_job(line))
        except ParseError as exc:
            parsed.append(str(exc))
    if known_ids is not None:
        known = set(known_ids)
        count: dict[str, int] = {}
        for p in parsed:
            if isinstance(p, JobInfo):
                count[p.raw_id] = count.get(p.raw_id, 0) + 1
        for i, p in enumerate(parsed):
            if isinstance(p, JobInfo) and (p.raw_id not in known or count[p.raw_id] > 1):
                why = "not a job squeue lists" if p.raw_id not in known else "listed twice"
                parsed[i] = f"scontrol: a record claims job id {p.raw_id}, {why}: forged"
            prev = parsed[i - 1] if i else None
            if isinstance(parsed[i], str) and isinstance(prev, JobInfo):
                parsed[i - 1] = (
                    f"scontrol: job {prev.raw_id}: the line after its record is broken or "
                    "forged (a newline in its name or another field): refused"
                )
    jobs = [p for p in parsed if isinstance(p, JobInfo)]
    bad = [(line, p) for line, p in zip(lines, parsed, strict=True) if isinstance(p, str)]
    return jobs, bad
