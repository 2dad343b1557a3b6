"""A partition's recorded Slurm jobs, read from the warehouse as the queue model's input.

What the model is given (docs/queue.md):

- a job waits from its EligibleTime (else its submit time) and really ran from its start to
  its end; a job still running at the window's end ran at least until then;
- it asked for ``len(nodes)`` whole nodes and ceil(GPUs / nodes) GPUs on each;
- the partition is the nodes its jobs ran on in the window, each with the most GPUs seen on
  any of them (the GPUs the samples saw, or the most a job took on one node): the model's
  partition is homogeneous, and nodes shared with another partition count for both;
- at most ``MAX_JOBS`` jobs per partition (the latest by start time): the replay's time and
  memory stay bounded whatever the window.
"""

# ruff: noqa: S608  (the SQL is assembled from this module's constants only; values are bound)
from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from gpugap.queue.backfill import Partition, QueuedJob
from gpugap.warehouse.client import run_query

#: jobs replayed per partition, the latest by start time (50,000 replay in about 3 s)
MAX_JOBS = 100_000

_T = "DateTime64(3, 'UTC')"
_WINDOW = f"start_time >= {{since:{_T}}} AND start_time < {{until:{_T}}}"
_JOBS = (
    "SELECT cluster, partition, allocation_id, owner, team, name, gpus_requested, nodes, "
    "time_limit_s, coalesce(eligible_time, submit_time) AS waiting_since, start_time, "
    "end_time, final_state FROM v_allocations "
    f"WHERE scheduler = 'slurm' AND {_WINDOW} AND gpus_requested > 0 "
    "AND coalesce(eligible_time, submit_time) IS NOT NULL "
    "ORDER BY cluster, partition, start_time DESC, allocation_id "
    "LIMIT {max_jobs:UInt32} BY cluster, partition"
)
_COUNTS = (
    "SELECT cluster, partition, count() AS jobs FROM v_allocations "
    f"WHERE scheduler = 'slurm' AND {_WINDOW} AND gpus_requested > 0 "
    "AND coalesce(eligible_time, submit_time) IS NOT NULL GROUP BY cluster, partition"
)
# the physical GPUs the samples saw per node (a duplicate row does not change a count)
_GPUS_SEEN = (
    "SELECT cluster, node, uniqExact(physical_uuid) AS gpus FROM gpu_hours "
    "WHERE hour >= toStartOfHour({since:DateTime64(3, 'UTC')}) AND hour < {until:"
    f"{_T}}} GROUP BY cluster, node"
)


@dataclass
class RecordedPartition:
    """One partition's jobs as the model replays them, and what it measured."""

    cluster: str
    partition: str
    shape: Partition
    jobs: list[QueuedJob] = field(default_factory=list)
    jobs_in_window: int = 0  # before MAX_JOBS
    #: the wait each job really had (its start minus its eligible or submit time), by id
    measured_wait_s: dict[str, float] = field(default_factory=dict)

    @property
    def truncated(self) -> bool:
        return self.jobs_in_window > len(self.jobs)


def _epoch(t: datetime) -> float:
    return (t if t.tzinfo else t.replace(tzinfo=UTC)).timestamp()


def family(r: dict[str, Any]) -> str:
    """The recommender's job family: cluster, user, account, name and partition."""
    return "\x1f".join(str(r[k]) for k in ("cluster", "owner", "team", "name", "partition"))


def to_job(r: dict[str, Any], until_s: float) -> QueuedJob:
    nodes = max(len(r["nodes"]), 1)
    start = _epoch(r["start_time"])
    end = _epoch(r["end_time"]) if r["end_time"] is not None else max(until_s, start)
    limit = float(r["time_limit_s"]) if r["time_limit_s"] else math.inf
    return QueuedJob(
        id=str(r["allocation_id"]),
        submit_s=min(_epoch(r["waiting_since"]), start),
        nodes=nodes,
        gpus_per_node=math.ceil(int(r["gpus_requested"]) / nodes),
        limit_s=limit,
        run_s=min(end - start, limit),
        user=str(r["owner"]),
        family=family(r),
        timed_out=r["final_state"] == "TIMEOUT",
    )


def partitions(
    rows: Iterable[dict[str, Any]],
    counts: dict[tuple[str, str], int],
    gpus_seen: dict[tuple[str, str], int],
    until_s: float,
) -> list[RecordedPartition]:
    """Group the job rows by partition and size each partition (module docstring)."""
    jobs: dict[tuple[str, str], list[QueuedJob]] = {}
    nodes: dict[tuple[str, str], dict[str, int]] = {}
    waits: dict[tuple[str, str], dict[str, float]] = {}
    for r in rows:
        key = (str(r["cluster"]), str(r["partition"]))
        job = to_job(r, until_s)
        jobs.setdefault(key, []).append(job)
        waits.setdefault(key, {})[job.id] = _epoch(r["start_time"]) - job.submit_s
        per_node = nodes.setdefault(key, {})
        for n in r["nodes"] or ("",):
            per_node[n] = max(per_node.get(n, 0), job.gpus_per_node)
    out = []
    for key in sorted(jobs):
        cluster = key[0]
        sizes = [max(g, gpus_seen.get((cluster, n), 0)) for n, g in nodes[key].items()]
        shape = Partition(nodes=len(sizes), gpus_per_node=max(sizes))
        members = sorted(jobs[key], key=lambda j: (j.submit_s, j.id))
        out.append(
            RecordedPartition(
                cluster, key[1], shape, members, counts.get(key, len(members)), waits[key]
            )
        )
    return out


def recorded_partitions(
    client: Any, since: datetime, until: datetime, max_jobs: int = MAX_JOBS
) -> list[RecordedPartition]:
    """Every Slurm partition with jobs that started in [since, until)."""
    params = {"since": since, "until": until, "max_jobs": max_jobs}

    def rows(sql: str) -> list[dict[str, Any]]:
        return list(run_query(client, sql, params).named_results())

    counts = {(r["cluster"], r["partition"]): int(r["jobs"]) for r in rows(_COUNTS)}
    if not counts:
        return []
    seen = {(r["cluster"], r["node"]): int(r["gpus"]) for r in rows(_GPUS_SEEN)}
    return partitions(rows(_JOBS), counts, seen, min(_epoch(until), datetime.now(UTC).timestamp()))
