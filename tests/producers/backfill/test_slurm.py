"""``gpugap backfill slurm`` against a real Slurm (harness/slurm_cluster.py: slurmctld, slurmd,
slurmdbd on MariaDB, so ``sacct`` answers from the accounting database): jobs run, then are
backfilled from sacct into the poller's events, each exactly once across chunks, with the
GPU count and no indices (sacct has none), and the worker allocates them as GPUs whose
consumption is unknown. The same from a saved ``sacct -P`` dump."""

from __future__ import annotations

import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest

from gpugap.producers.slurm.parse import SACCT_FIELDS
from gpugap.producers.slurm.sources import SACCT_STATES
from gpugap.schemas import SlurmJobEvent
from gpugap.schemas.types import LifecycleKind
from gpugap.streams.allocate import from_slurm
from gpugap.streams.core import NodeCore
from tests.backfill.history import read_jsonl
from tests.harness.slurm_cluster import SlurmCluster

pytestmark = pytest.mark.slurm
CLUSTER = "hist"


def backfill(slurm: SlurmCluster, since: float, out: Path, *more: str, named: bool = True) -> str:
    cluster = ["--cluster", CLUSTER] if named else []
    cmd = [
        sys.executable, "-m", "gpugap", "backfill", "slurm", *cluster,
        "--since", datetime.fromtimestamp(since, UTC).isoformat(), "--until", "now",
        "--out", str(out), "--checkpoint-dir", str(out.parent / "cp"), *more,
    ]  # fmt: skip
    env = {**slurm.env, "GPUGAP_BACKFILL_SACCT": slurm.tool("sacct")}
    done = subprocess.run(cmd, check=False, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stderr


def test_jobs_run_then_backfilled_from_sacct(slurm: SlurmCluster, tmp_path: Path) -> None:
    slurm.set_hook_env({"GPUGAP_TEST_HOOKS_OFF": "1"})
    since = time.time() - 1
    ids = {
        "two": slurm.submit("--gres=gpu:2", "-J", "bf-two", wrap="sleep 4"),
        "failed": slurm.submit("--gres=gpu:1", "-J", "bf-fail", wrap="sleep 1; exit 3"),
        "nogpu": slurm.submit("-J", "bf-cpu", wrap="sleep 1"),
        "pending": slurm.submit("--gres=gpu:1", "--begin=now+1hour", wrap="true"),
    }
    slurm.cmd("scancel", ids["pending"])
    final = ("COMPLETED", "FAILED", "CANCELLED")
    slurm.wait(lambda j: all(j[i]["job_state"] in final for i in ids.values()), "jobs to end", 90)
    # slurmdbd records a job's end a moment after slurmctld: wait until sacct has them all,
    # and say so if it never does, rather than fail later on a missing event. By id (-j): a
    # job cancelled before its --begin is outside any -S window (it was never eligible), so
    # a windowed query never lists it and the wait used to run out its time on every run
    deadline = time.monotonic() + 120
    while True:
        text = slurm.cmd(
            "sacct", "-X", "-n", "-P", "-o", "JobID,State", "-j", ",".join(ids.values())
        ).stdout
        if all(
            f"{i}|" in text and "RUNNING" not in text.split(f"{i}|")[1][:10] for i in ids.values()
        ):
            break
        assert time.monotonic() < deadline, f"slurmdbd has not recorded {ids} ending:\n{text}"
        time.sleep(0.5)

    stderr = backfill(slurm, since, tmp_path / "a" / "events.jsonl", "--chunk", "60")
    assert "ETA" in stderr
    events = [e for _, e in read_jsonl(tmp_path / "a" / "events.jsonl")]
    assert all(isinstance(e, SlurmJobEvent) for e in events)
    mine = [e for e in events if isinstance(e, SlurmJobEvent) and e.job_id in ids.values()]
    got = {(e.job_id, e.kind.value): e for e in mine}
    assert len(got) == len(mine), "an event twice (jobs span chunks: each once)"
    two_s, two_e = got[(ids["two"], "start")], got[(ids["two"], "end")]
    assert two_s.event_id == f"slurm/{CLUSTER}/{ids['two']}/start"
    assert (two_s.gpus_total, two_s.job_name, two_e.state.value) == (2, "bf-two", "COMPLETED")
    assert [n.gpu_indices for n in two_s.nodes] == [()]  # sacct knows how many, not which
    failed = got[(ids["failed"], "end")]
    assert (failed.state.value, failed.exit_code, failed.gpus_total) == ("FAILED", 3, 1)
    assert got[(ids["nogpu"], "start")].gpus_total == 0
    assert (ids["pending"], "start") not in got  # cancelled while pending: an end only
    assert got[(ids["pending"], "end")].state.value == "CANCELLED"
    assert two_e.end_time and two_s.start_time and (two_e.end_time - two_s.start_time).seconds >= 4

    # the worker's view: 2 GPUs allocated for the job's time, consumption unknown
    [start] = from_slurm(two_s)
    [end] = from_slurm(two_e)
    assert (start.kind, start.gpus, start.gpu_indices) == (LifecycleKind.START, 2, None)
    core = NodeCore.new(CLUSTER, start.node)
    core.allocation(start)
    core.allocation(end)
    rows = core.advance(datetime.fromtimestamp(time.time() + 600, UTC)).minutes
    held = [r for r in rows if r.allocation_id == start.allocation_id]
    assert {r.no_samples for r in held} == {True} and len({r.gpu_uuid for r in held}) == 2
    allocated = sum(r.allocated_s for r in held)
    assert allocated == pytest.approx(2 * (two_e.end_time - two_s.start_time).total_seconds())

    # the same from a dump made with the documented command (another host, no slurmdbd)
    dump = tmp_path / "sacct.txt"
    start_text = datetime.fromtimestamp(since - 60).strftime("%Y-%m-%dT%H:%M:%S")
    argv = [slurm.tool("sacct"), "-a", "-P", "-n", "--state", SACCT_STATES, "-o", SACCT_FIELDS]
    dumped_text = subprocess.run(
        [*argv, "-S", start_text, "-E", "now"],
        env={**slurm.env, "SLURM_TIME_FORMAT": "%s"},
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    assert dumped_text.strip(), "sacct printed nothing"
    dump.write_text(dumped_text)
    backfill(slurm, since, tmp_path / "b" / "events.jsonl", "--sacct-file", str(dump))
    from_dump = [e for _, e in read_jsonl(tmp_path / "b" / "events.jsonl")]
    dumped = {(e.job_id, e.kind.value): e for e in from_dump if isinstance(e, SlurmJobEvent)}
    for k, e in got.items():
        assert dumped[k] == e, k
    # no --cluster: Slurm's ClusterName, as the poller names it (the same event ids)
    backfill(
        slurm, since, tmp_path / "unnamed" / "events.jsonl", "--sacct-file", str(dump), named=False
    )
    names = {line.split("|")[14] for line in dumped_text.splitlines() if line}
    unnamed = [e for _, e in read_jsonl(tmp_path / "unnamed" / "events.jsonl")]
    assert len(names) == 1 and {e.cluster for e in unnamed if isinstance(e, SlurmJobEvent)} == names


def sacct_records(slurm: SlurmCluster, job: str, *more: str) -> list[list[str]]:
    """``sacct -X -P`` rows of one job id (epoch times): JobID, State, Submit, Start, End."""
    fields = "JobID,JobIDRaw,State,Submit,Start,End,NodeList,AllocTRES"
    argv = [slurm.tool("sacct"), "-X", "-n", "-P", "-o", fields, "-j", job, *more]
    env = {**slurm.env, "SLURM_TIME_FORMAT": "%s"}
    out = subprocess.run(argv, env=env, capture_output=True, text=True, check=True, timeout=60)
    return [row.split("|") for row in out.stdout.splitlines() if row.strip()]


def test_a_requeued_job_is_two_runs_in_sacct_and_in_the_backfill(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    """`scontrol requeue` of a running job: slurmdbd closes its record REQUEUED and opens
    another (submit time reset); scontrol's Restarts= and squeue's restart_cnt say 1; sacct
    without -D shows the last record only. The backfill makes two allocations of it."""
    slurm.set_hook_env({"GPUGAP_TEST_HOOKS_OFF": "1"})
    since = time.time() - 1
    job = slurm.submit("--gres=gpu:1", "-J", "bf-requeue", wrap="sleep 5")
    slurm.wait(lambda j: j[job]["job_state"] == "RUNNING", "the first run", 60)
    time.sleep(1.5)
    slurm.cmd("scontrol", "requeue", job)
    slurm.wait(lambda j: j[job]["restart_cnt"] == 1, "the requeue", 30)
    shown = slurm.cmd("scontrol", "-o", "show", "job", job).stdout
    assert " Restarts=1 " in shown, shown
    # Slurm holds a requeued batch job back for its job credential's lifetime (AuthInfo
    # cred_expire, 120 s): started earlier (scontrol update StartTime=now), its batch step is
    # refused the revoked credential and the run FAILS at once. So wait: about 2-3 minutes
    slurm.wait(lambda j: j[job]["job_state"] == "COMPLETED", "the second run", 330)
    deadline = time.monotonic() + 60
    while len(rows := sacct_records(slurm, job, "-D")) < 2 or rows[-1][2] != "COMPLETED":
        assert time.monotonic() < deadline, rows
        time.sleep(0.5)
    print("sacct -D -X of the requeued job:\n" + "\n".join("|".join(r) for r in rows))
    assert [r[2] for r in rows] == ["REQUEUED", "COMPLETED"], rows
    assert int(rows[1][3]) > int(rows[0][3]), "the submit time is reset at the requeue"
    assert int(rows[0][5]) <= int(rows[1][4]), "the first run ends before the second starts"
    assert sacct_records(slurm, job) == rows[1:], "without -D: the newest record alone"

    backfill(slurm, since, tmp_path / "r" / "events.jsonl", "--chunk", "60")
    events = [e for _, e in read_jsonl(tmp_path / "r" / "events.jsonl")]
    mine = [e for e in events if isinstance(e, SlurmJobEvent) and e.job_id == job]
    got = {e.event_id: (e.allocation_id, e.run, e.state.value, e.gpus_total) for e in mine}
    base = f"slurm/{CLUSTER}/{job}"
    assert got == {
        f"{base}/start": (base, None, "RUNNING", 1),  # run 0: the ids of before runs
        f"{base}/end": (base, None, "REQUEUED", 1),
        f"{base}#1/start": (f"{base}#1", 1, "RUNNING", 1),
        f"{base}#1/end": (f"{base}#1", 1, "COMPLETED", 1),
    }
    times = {e.event_id: int(e.time.timestamp()) for e in mine}
    assert times[f"{base}/end"] == int(rows[0][5]) and times[f"{base}#1/start"] == int(rows[1][4])
