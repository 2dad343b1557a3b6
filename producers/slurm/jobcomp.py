"""One record Slurm's own jobcomp/kafka plugin wrote (Slurm >= 23.02; start records >= 25.05)
-> ``JobInfo``. Written against Slurm 26.05.3's serializer (src/plugins/jobcomp/common/
jobcomp_common.c) and records seen from it (../shared/reference/slurm-26.md):

- one JSON object, no key; a start record (``topic_job_start``) has ``state`` null and no
  ``@end``; an end record has both;
- times ``@submit @eligible @start @end`` are UTC without an offset, whatever the daemon's zone;
- ``time_limit`` is seconds (absent: unlimited); ``tres_alloc`` counts GPUs (``gres/gpu=2``),
  never which ones, and only where slurmdbd runs (``AccountingStorageTRES=gres/gpu``);
- the run a requeue ended says ``state: "PENDING"`` (sacct calls it REQUEUED); the next run
  has a new ``sluid`` (a cluster-unique id, in time order) and the same ``jobid``;
- a job cancelled while pending has an end record only, with no nodes.

Pure: no I/O. A record this cannot read raises ParseError saying why (a dead letter).
"""

from __future__ import annotations

import calendar
import json
import re
import time
from typing import Any

from gpugap.producers.slurm.event import FINAL_STATES, JobInfo
from gpugap.producers.slurm.hostlist import expand
from gpugap.producers.slurm.parse import ParseError, tres_gpus

#: the largest record accepted (Slurm's are ~2 KiB; a job script, if a site sends it, more)
MAX_RECORD_BYTES = 1 << 20
_TIME = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d")
_SLUID = re.compile(r"[sS][0-9A-Za-z]{13}")
_EXIT = re.compile(r"(\d+):(\d+)")


class Record:
    """A parsed record: the job as JobInfo, whether it is a start or an end, its SLUID."""

    __slots__ = ("info", "kind", "sluid")

    def __init__(self, info: JobInfo, kind: str, sluid: str | None) -> None:
        self.info, self.kind, self.sluid = info, kind, sluid


def parse(raw: bytes | None) -> Record:
    if raw is None:
        raise ParseError("jobcomp: an empty message (no value)")
    if len(raw) > MAX_RECORD_BYTES:
        raise ParseError(f"jobcomp: a record of {len(raw)} bytes (at most {MAX_RECORD_BYTES})")
    try:
        obj = json.loads(raw)
    except ValueError as exc:
        raise ParseError(f"jobcomp: not JSON ({exc})") from None
    if not isinstance(obj, dict):
        raise ParseError("jobcomp: the record is not a JSON object")
    jobid = _int(obj, "jobid")
    if jobid is None or jobid <= 0:
        raise ParseError("jobcomp: no jobid")
    state = _text(obj, "state")
    end = _time(obj, "@end")
    kind = "start" if state is None and end is None else "end"
    if kind == "end":
        if state is None or end is None:
            raise ParseError(f"jobcomp: job {jobid}: an end record needs both state and @end")
        state = state.split()[0].upper()
        if state == "PENDING":  # the run a requeue ended (the job waits to run again)
            state = "REQUEUED"
        if state not in FINAL_STATES:
            raise ParseError(f"jobcomp: job {jobid}: state {state!r} is not a final state")
    info = _job(obj, jobid, state, end)
    if kind == "start" and not info.nodes:
        raise ParseError(f"jobcomp: job {jobid}: a start record without nodes")
    sluid = _text(obj, "sluid")
    if sluid is not None and not _SLUID.fullmatch(sluid):
        raise ParseError(f"jobcomp: job {jobid}: sluid {sluid!r} is not a SLUID")
    return Record(info, kind, sluid.upper() if sluid else None)


def _job(obj: dict[str, Any], jobid: int, state: str | None, end: int | None) -> JobInfo:
    info = JobInfo(str(jobid))
    info.state = state
    info.user = _text(obj, "username")
    info.account = _text(obj, "account")
    info.partition = _text(obj, "partition")
    info.qos = _text(obj, "qos")
    info.name = _text(obj, "job_name")
    info.cluster = _text(obj, "cluster")
    info.submit = _time(obj, "@submit")
    info.eligible = _time(obj, "@eligible")
    info.start = _time(obj, "@start")
    info.end = end
    info.time_limit_s = _int(obj, "time_limit")
    info.array_job_id = _int(obj, "array_job_id") or None
    info.array_task_id = _int(obj, "array_task_id") if info.array_job_id else None
    info.het_job_id = _int(obj, "het_job_id") or None
    info.het_job_offset = _int(obj, "het_job_offset") if info.het_job_id else None
    nodes = _text(obj, "nodes")
    try:
        info.nodes = expand(nodes) if nodes and (_int(obj, "total_nodes") or 0) > 0 else []
    except ValueError as exc:
        raise ParseError(f"jobcomp: job {jobid}: nodes {nodes!r}: {exc}") from None
    info.gpus = tres_gpus(_text(obj, "tres_alloc"))
    if not info.gpus or not info.nodes:
        info.gpu_indices = {}  # holds no GPU: nothing unknown about it
    exit_code = _text(obj, "exit_code")
    if exit_code is not None:
        match = _EXIT.fullmatch(exit_code)
        if match is None:
            raise ParseError(f"jobcomp: job {jobid}: exit_code {exit_code!r} is not X:Y")
        info.exit_status, info.exit_signal = int(match[1]), int(match[2])
    return info


def _int(obj: dict[str, Any], key: str) -> int | None:
    value = obj.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ParseError(f"jobcomp: {key} must be a non-negative integer, got {value!r}")
    return value


def _text(obj: dict[str, Any], key: str) -> str | None:
    value = obj.get(key)
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise ParseError(f"jobcomp: {key} must be a string, got {value!r}")
    return value


def _time(obj: dict[str, Any], key: str) -> int | None:
    """Slurm's UTC time without an offset -> epoch seconds (None when absent)."""
    value = _text(obj, key)
    if value is None:
        return None
    if not _TIME.fullmatch(value):
        raise ParseError(f"jobcomp: {key} {value!r} is not YYYY-MM-DDTHH:MM:SS")
    try:
        return calendar.timegm(time.strptime(value, "%Y-%m-%dT%H:%M:%S"))
    except ValueError as exc:
        raise ParseError(f"jobcomp: {key} {value!r}: {exc}") from None
