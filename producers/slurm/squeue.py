"""``squeue --json`` -> ``JobInfo``. Written against OpenAPI v0.0.38 (Slurm 22.05: plain numbers,
``exit_code`` a raw wait status, ``job_state`` a string) and tolerant of the later shapes
(v0.0.39+: ``{"set", "infinite", "number"}`` numbers, ``job_state`` a list, ``exit_code`` an
object), so a Slurm upgrade degrades to dead letters rather than wrong numbers."""

from __future__ import annotations

import json
from typing import Any

from gpugap.producers.slurm.event import JobInfo
from gpugap.producers.slurm.hostlist import expand
from gpugap.producers.slurm.parse import NO_VAL, ParseError, gres_indices, tres_gpus


def _num(value: Any, what: str) -> int | None:
    """A number in any of the shapes squeue has used; unset/infinite -> None."""
    if value is None or isinstance(value, bool):
        if isinstance(value, bool):
            raise ParseError(f"{what}: expected a number, got {value!r}")
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, dict):
        if not value.get("set", True) or value.get("infinite"):
            return None
        return _num(value.get("number"), what)
    raise ParseError(f"{what}: expected a number, got {value!r}")


def _str(value: Any, what: str) -> str | None:
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise ParseError(f"{what}: expected a string, got {value!r}")
    return value


def _state(value: Any) -> str:
    if isinstance(value, list):
        value = value[0] if value else None
    if not isinstance(value, str) or not value:
        raise ParseError(f"job_state: expected a state name, got {value!r}")
    return value.split()[0].upper()


def _exit(value: Any) -> tuple[int | None, int | None]:
    """Raw wait status (v0.0.38) or ``{"return_code", "signal": {"id"}}`` -> (status, signal)."""
    if isinstance(value, dict):
        sig = value.get("signal") or {}
        sig_id = _num(sig.get("id"), "exit_code.signal") if isinstance(sig, dict) else None
        return _num(value.get("return_code"), "exit_code.return_code"), sig_id or 0
    raw = _num(value, "exit_code")
    if raw is None:
        return None, None
    if raw & 0x7F:  # killed by a signal
        return 0, raw & 0x7F
    return (raw >> 8) & 0xFF, 0


def job(obj: Any) -> JobInfo:
    """One element of ``jobs``."""
    if not isinstance(obj, dict):
        raise ParseError(f"squeue: a job must be an object, got {type(obj).__name__}")
    raw = _num(obj.get("job_id"), "job_id")
    if raw is None:
        raise ParseError("squeue: job without job_id")
    info = JobInfo(raw_id=str(raw))
    aj = _num(obj.get("array_job_id"), "array_job_id")
    if aj:
        info.array_job_id = aj
        task = _num(obj.get("array_task_id"), "array_task_id")
        info.array_task_id = None if task is None or task == NO_VAL else task
    het = _num(obj.get("het_job_id"), "het_job_id")
    if het:
        info.het_job_id = het
        info.het_job_offset = _num(obj.get("het_job_offset"), "het_job_offset")
    info.user = _str(obj.get("user_name"), "user_name")
    info.account = _str(obj.get("account"), "account")
    info.partition = _str(obj.get("partition"), "partition")
    info.qos = _str(obj.get("qos"), "qos")
    info.name = _str(obj.get("name"), "name") or ""
    info.state = _state(obj.get("job_state"))
    info.exit_status, info.exit_signal = _exit(obj.get("exit_code"))
    limit = _num(obj.get("time_limit"), "time_limit")
    info.time_limit_s = None if limit is None or limit >= NO_VAL else limit * 60
    info.submit = _num(obj.get("submit_time"), "submit_time") or None
    info.eligible = _num(obj.get("eligible_time"), "eligible_time") or None
    info.start = _num(obj.get("start_time"), "start_time") or None
    if info.state not in ("PENDING", "RUNNING", "CONFIGURING"):
        info.end = _num(obj.get("end_time"), "end_time") or None
    try:
        info.nodes = expand(_str(obj.get("nodes"), "nodes"))
    except ValueError as exc:
        raise ParseError(f"squeue: job {raw}: {exc}") from None
    alloc = obj.get("tres_alloc_str")
    info.gpus = tres_gpus(_str(alloc, "tres_alloc_str"))
    detail = obj.get("gres_detail") or []
    if not isinstance(detail, list) or not all(isinstance(d, str) for d in detail):
        raise ParseError(f"squeue: job {raw}: gres_detail must be a list of strings")
    if detail and len(detail) == len(info.nodes):
        # one entry per allocated node, in the order of the job's node list
        info.gpu_indices = {n: gres_indices(d) for n, d in zip(info.nodes, detail, strict=True)}
    elif not info.gpus:
        info.gpu_indices = {}
    flag = obj.get("batch_flag")
    info.batch = flag if isinstance(flag, bool) else None
    info.cluster = _str(obj.get("cluster"), "cluster")
    info.run = _num(obj.get("restart_cnt"), "restart_cnt") or 0  # the run: its restart count
    # 26.05 and later: the run's SLUID, in step_id (scontrol --json) or beside it
    step = obj.get("step_id")
    sluid = _str(
        obj.get("sluid") or (step.get("sluid") if isinstance(step, dict) else None), "sluid"
    )
    info.sluid = sluid.upper() if sluid else None
    return info


def jobs(text: str | bytes) -> tuple[list[JobInfo], list[tuple[str, str]]]:
    """The whole document: (jobs, [(bad job as JSON, reason)]). A document that is not JSON,
    or has no ``jobs`` list, raises ParseError."""
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise ParseError(f"squeue --json: not valid JSON ({exc})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("jobs"), list):
        raise ParseError("squeue --json: no 'jobs' list in the document")
    good, bad = [], []
    for obj in doc["jobs"]:
        try:
            good.append(job(obj))
        except ParseError as exc:
            bad.append((json.dumps(obj)[:100_000], str(exc)))
    return good, bad
