"""The backfill model against the real Slurm (sched/backfill, bf_interval=1, one node of 4
GPUs): the same three jobs submitted with an honest and with a padded limit start in the order
the model says, and the padding changes that order."""

from __future__ import annotations

import getpass
import time

import pytest

from gpugap.queue.backfill import Partition, QueuedJob, replay
from tests.harness.slurm_cluster import SlurmCluster

pytestmark = pytest.mark.slurm

RUN_S = 15  # each job sleeps this long
DONE = {"COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY"}


def _num(v: object) -> float:
    """squeue --json numbers: a bare number, or {"set": .., "number": ..}."""
    return float(v["number"] if isinstance(v, dict) else v)  # type: ignore[arg-type]


def _states(job: dict[str, object]) -> set[str]:
    """squeue --json's job_state: a string (Slurm 23) or a list of flags (24 and later)."""
    s = job["job_state"]
    return set(s) if isinstance(s, list) else {str(s)}


def _idle(slurm: SlurmCluster) -> None:
    """No job left from earlier tests on the node: they would hold its GPUs."""
    slurm.cmd("scancel", "--user", getpass.getuser(), check=False)
    slurm.wait(
        lambda jobs: all(_states(j) & DONE for j in jobs.values()),
        "the earlier tests' jobs to be cancelled",
        timeout=60,
    )


def _submit_mix(slurm: SlurmCluster, third_limit_min: int) -> dict[str, str]:
    """a: 2 GPUs for 2 min; once it runs, b: all 4 GPUs, then c: 2 GPUs with the given limit."""
    ids = {"a": slurm.submit("--gres=gpu:2", "-t", "2", "-J", "qa", wrap=f"sleep {RUN_S}")}
    slurm.wait(lambda jobs: "RUNNING" in _states(jobs[ids["a"]]), "job a to start", 60)
    ids["b"] = slurm.submit("--gres=gpu:4", "-t", "2", "-J", "qb", wrap=f"sleep {RUN_S}")
    ids["c"] = slurm.submit(
        "--gres=gpu:2", "-t", str(third_limit_min), "-J", "qc", wrap=f"sleep {RUN_S}"
    )
    return ids


def _slurm_order(slurm: SlurmCluster, ids: dict[str, str]) -> tuple[list[str], dict[str, float]]:
    jobs = slurm.wait(
        lambda js: all("COMPLETED" in _states(js[i]) for i in ids.values()),
        "the three jobs to complete",
        timeout=180,
    )
    starts = {k: _num(jobs[i]["start_time"]) for k, i in ids.items()}
    submits = {k: _num(jobs[i]["submit_time"]) for k, i in ids.items()}
    return sorted(starts, key=lambda k: (starts[k], int(ids[k]))), submits


def _model_order(
    submits: dict[str, float], limits_min: dict[str, int], gpus: dict[str, int]
) -> list[str]:
    jobs = [
        QueuedJob(k, submits[k], 1, gpus[k], limits_min[k] * 60.0, float(RUN_S)) for k in submits
    ]
    return [s.id for s in replay(jobs, Partition(nodes=1, gpus_per_node=4))]


@pytest.mark.parametrize(
    ("third_limit_min", "expected"),
    [(1, ["a", "c", "b"]), (10, ["a", "b", "c"])],
    ids=["honest-limit-backfills", "padded-limit-waits"],
)
def test_jobs_start_in_the_order_the_model_says(
    slurm: SlurmCluster, third_limit_min: int, expected: list[str]
) -> None:
    _idle(slurm)
    started = time.monotonic()
    ids = _submit_mix(slurm, third_limit_min)
    order, submits = _slurm_order(slurm, ids)
    model = _model_order(submits, {"a": 2, "b": 2, "c": third_limit_min}, {"a": 2, "b": 4, "c": 2})
    assert order == expected, (
        f"Slurm started {order} (ids {ids}), in {time.monotonic() - started:.0f} s"
    )
    assert model == order
