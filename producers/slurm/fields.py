"""The values Slurm prints, read one at a time: numbers, times, limits, exit codes, states,
TRES and GRES strings, array and het job ids. Shared by the parsers of every source."""

from __future__ import annotations

import re

from gpugap.producers.slurm.event import JobInfo
from gpugap.producers.slurm.hostlist import indices

#: the documented ``sacct -P`` dump's fields (``-n``: no header), JobName last: a '|' inside
#: a job name then only lengthens the last field (producers/slurm/sacct.py reads them)
SACCT_FIELDS = (
    "JobID,JobIDRaw,User,Account,Partition,QOS,State,ExitCode,Timelimit,"
    "Submit,Start,End,NodeList,AllocTRES,Cluster,JobName"
)
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


def number(value: str | None, what: str) -> int | None:
    if value is None or value in ("", "Unknown", "None", "N/A", "(null)"):
        return None
    try:
        return int(value)
    except ValueError:
        raise ParseError(f"{what}: not a number: {value!r}") from None


def epoch(value: str | None, what: str) -> int | None:
    """A time printed with SLURM_TIME_FORMAT=%s (0 and 'Unknown' mean not set)."""
    n = number(value, what)
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
    return number(status, "exit code"), number(sig or "0", "exit signal")


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
            plain = number(val, "gres/gpu")
        elif key.startswith("gres/gpu:"):
            typed += number(val, key) or 0
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


def set_array(info: JobInfo, job_id: str | None, task: str | None) -> None:
    aj = number(job_id, "array job id")
    if aj:
        info.array_job_id = aj
        t = task if task and task.isdigit() else None  # "2-3": the pending meta record
        info.array_task_id = None if t is None or int(t) == NO_VAL else int(t)


def set_het(info: JobInfo, het_id: str | None, offset: str | None) -> None:
    h = number(het_id, "het job id")
    if h:
        info.het_job_id = h
        o = number(offset, "het job offset")
        info.het_job_offset = None if o is None or o == NO_VAL else o


def name_or_none(value: str | None) -> str | None:
    return None if value in (None, "", "(null)") else value
