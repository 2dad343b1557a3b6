"""A Slurm job run is (cluster, job id, run), the run being Slurm's restart count: every
source says the same run of the same job, the first run keeps the ids of before runs
existed, a requeue's run gets its own (docs/architecture.md#slurm-job-runs). Recorded Slurm
22.05 output (tests/fixtures/slurm/) where it has the field; known answers throughout."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest

from gpugap.producers.slurm import show, spool, squeue
from gpugap.producers.slurm.event import JobInfo, events_for, job_event
from gpugap.producers.slurm.hook import HookConfig, on_end, on_prolog
from gpugap.producers.slurm.parse import jobcomp_env, scontrol_job
from gpugap.schemas import SlurmJobEvent
from gpugap.schemas.models import slurm_allocation_id
from tests.producers.slurm.test_parse import FIX, env_file, valid

T0 = 1_795_983_105  # the recorded job 17's start (epoch seconds)


def _run(run: int, state: str, start: int, end: int | None) -> JobInfo:
    return JobInfo(
        "17", run=run, state=state, start=start, end=end, nodes=["vm"],
        gpu_indices={"vm": (0, 1)}, gpus=2, user="root", name="two", batch=True,
    )  # fmt: skip


def test_a_requeued_job_is_two_runs_with_their_own_ids_and_run_0_keeps_todays() -> None:
    first = _run(0, "NODE_FAIL", T0, T0 + 600)
    second = _run(1, "COMPLETED", T0 + 2000, T0 + 2600)
    a = [valid(e) for e in events_for(first, "probe", "hook")]
    b = [valid(e) for e in events_for(second, "probe", "hook")]
    # run 0: the ids every event had before runs (existing data and old events dedupe)
    assert [e.event_id for e in a] == ["slurm/probe/17/start", "slurm/probe/17/end"]
    assert (
        {e.allocation_id for e in a} == {"slurm/probe/17"} == {slurm_allocation_id("probe", "17")}
    )
    assert all(e.run is None for e in a) and "run" not in job_event(first, "end", "probe", "hook")
    # run 1: its own allocation and event ids, its own start and end
    assert [e.event_id for e in b] == ["slurm/probe/17#1/start", "slurm/probe/17#1/end"]
    assert {e.allocation_id for e in b} == {"slurm/probe/17#1"}
    assert [(e.run, e.job_id) for e in b] == [(1, "17"), (1, "17")]
    assert (a[1].state, b[1].state) == ("NODE_FAIL", "COMPLETED")
    assert (a[0].start_time, a[1].end_time) != (b[0].start_time, b[1].end_time)


def test_every_live_source_reads_the_restart_count_as_the_run() -> None:
    # scontrol -o show job -d (the prolog, the poller's fallback): Restarts=
    text = (FIX / "scontrol_prolog_2gpu.txt").read_text()
    assert "Restarts=0 " in text and scontrol_job(text).run == 0
    assert scontrol_job(text.replace("Restarts=0 ", "Restarts=2 ")).run == 2
    # squeue --json (the poller): restart_cnt
    doc = json.loads((FIX / "squeue.json").read_text())
    doc["jobs"][0]["restart_cnt"] = 3
    jobs, bad = squeue.jobs(json.dumps(doc))
    assert not bad and jobs[0].run == 3 and {j.run for j in jobs[1:]} == {0}
    # PrologSlurmctld's environment: SLURM_JOB_RESTART_COUNT (22.05's name, recorded)
    env = env_file("env_prolog_2gpu.env")
    assert env["SLURM_JOB_RESTART_COUNT"] == "0" and show.restart_count(env) == 0
    assert show.restart_count({**env, "SLURM_JOB_RESTART_COUNT": "1"}) == 1
    assert show.restart_count({"SLURM_RESTART_COUNT": "4"}) == 4
    assert show.restart_count({}) is None


def test_jobcomp_at_a_requeue_ends_the_run() -> None:
    """jobcomp/script fires when a run is requeued, with the state the job is left in:
    PENDING after `scontrol requeue` (REQUEUED to us), NODE_FAIL, PREEMPTED."""
    env = env_file("env_jobcomp_completed.env")
    for jobstate, state in (("PENDING", "REQUEUED"), ("NODE_FAIL", "NODE_FAIL")):
        info = jobcomp_env({**env, "JOBSTATE": jobstate})
        (end,) = [valid(e) for e in events_for(info, "probe", "hook") if e["kind"] == "end"]
        assert (end.state, end.start_time is not None, end.nodes[0].node) == (state, True, "vm")
    cancelled = jobcomp_env(env_file("env_jobcomp_cancelled_pending.env"))
    assert cancelled.state == "CANCELLED" and not cancelled.started  # never ran: no requeue


def _scontrol(tmp_path: Path, restarts: int) -> str:
    text = (FIX / "scontrol_prolog_2gpu.txt").read_text()
    fixture = tmp_path / f"scontrol-{restarts}.txt"
    fixture.write_text(text.replace("Restarts=0 ", f"Restarts={restarts} "))
    script = tmp_path / f"scontrol-{restarts}"
    script.write_text(  # 22.05: no --json (what the prolog asks first)
        '#!/bin/sh\ncase "$*" in *--json*) echo "scontrol: unrecognized option \'--json\'" >&2;'
        f" exit 1;; *) cat {fixture};; esac\n"
    )
    script.chmod(0o755)
    return str(script)


def test_the_hook_gives_each_run_of_a_requeued_job_its_ids(tmp_path: Path) -> None:
    """The prolog reads the run from slurmctld's environment and scontrol; the end
    (jobcomp/script, which has no restart count) takes it from the start it kept. Run 0
    ends NODE_FAIL, Slurm requeues the job, run 1 completes."""
    base = {
        **env_file("env_prolog_2gpu.env"),
        "GPUGAP_SLURM_SPOOL_DIR": str(tmp_path / "spool"),
        "GPUGAP_SLURM_CLUSTER": "probe",
    }
    ends = {0: ("NODE_FAIL", T0 + 600), 1: ("COMPLETED", T0 + 2600)}
    got = []
    for restarts, (state, end) in ends.items():
        env = {
            **base,
            "SLURM_JOB_RESTART_COUNT": str(restarts),
            "GPUGAP_SLURM_SCONTROL": _scontrol(tmp_path, restarts),
        }
        cfg = HookConfig(env)
        (start,) = on_prolog(cfg, env, time.monotonic() + 5)
        end_env = {**env_file("env_jobcomp_completed.env"), "JOBSTATE": state, "END": str(end)}
        (stop,), raw = on_end(cfg, end_env, epilog=False)
        spool.forget_start(cfg.spool_dir, raw)  # as hook_command does after an end
        got += [SlurmJobEvent.model_validate(e["value"]) for e in (start, stop)]
    assert [e.event_id for e in got] == [
        "slurm/probe/17/start", "slurm/probe/17/end",  # run 0: today's ids
        "slurm/probe/17#1/start", "slurm/probe/17#1/end",
    ]  # fmt: skip
    assert [e.allocation_id for e in got] == ["slurm/probe/17"] * 2 + ["slurm/probe/17#1"] * 2
    assert [e.state for e in got[1::2]] == ["NODE_FAIL", "COMPLETED"]
    assert all(e.nodes[0].gpu_indices == (0, 1) for e in got)  # the end: from the kept start


def test_an_end_that_comes_after_the_next_runs_start_is_not_that_runs_end(
    tmp_path: Path,
) -> None:
    """The start kept for run 1 cannot give its run to run 0's late end (ended before it)."""
    cfg = HookConfig({"GPUGAP_SLURM_SPOOL_DIR": str(tmp_path / "spool")})
    later = job_event(_run(1, "RUNNING", T0 + 2000, None), "start", "probe", "hook")
    spool.private_dir(cfg.spool_dir)
    spool.save_start(cfg.spool_dir, "17", later)
    end_env = {**env_file("env_jobcomp_completed.env"), "JOBSTATE": "NODE_FAIL"}
    (end,), _ = on_end(cfg, end_env, epilog=False)
    assert end["value"]["event_id"] == "slurm/probe/17/end"  # run 0's, START..END its own


def _sacct_job(tmp_path: Path, works: bool) -> str:
    """A stand-in for ``sacct -D -X -P -j 17``: job 17's first run, ended NODE_FAIL, and its
    second, pending after the requeue (Slurm reset its submit time)."""
    rows = [
        "JobID|JobIDRaw|User|Account|Partition|QOS|State|ExitCode|Timelimit|Submit|Start|End|"
        "NodeList|AllocTRES|Cluster|JobName",
        f"17|17|root|root|debug|normal|NODE_FAIL|0:0|00:05:00|{T0 - 5}|{T0}|{T0 + 600}|vm|"
        "billing=1,cpu=1,gres/gpu=2,node=1|probe|two",
        f"17|17|root|root|debug|normal|PENDING|0:0|00:05:00|{T0 + 610}|Unknown|Unknown|"
        "None assigned||probe|two",
    ]
    (tmp_path / "sacct.txt").write_text("\n".join(rows) + "\n")
    script = tmp_path / "sacct"
    body = f"cat {tmp_path / 'sacct.txt'}" if works else "echo 'no slurmdbd' >&2; exit 1"
    script.write_text(f"#!/bin/sh\n{body}\n")
    script.chmod(0o755)
    return str(script)


@pytest.mark.parametrize("sacct_works", [True, False], ids=["sacct", "no-slurmdbd"])
def test_the_poller_ends_the_run_it_saw_when_the_job_shows_requeued(
    tmp_path: Path, sacct_works: bool
) -> None:
    """squeue shows run 0 running, then the job pending with restart count 1: run 0 ended.
    Its end comes from sacct; without slurmdbd, at the time Slurm requeued it (the submit
    time it reset), state REQUEUED. Run 1 starts later under its own ids."""
    from gpugap.groundfloor.settings import Settings
    from gpugap.producers.slurm.producer import SlurmProducer
    from gpugap.producers.slurm.settings import SlurmSettings
    from tests.streams.helpers import Recording

    settings = SlurmSettings(sacct=_sacct_job(tmp_path, sacct_works), cluster="probe")
    poller = SlurmProducer(Settings(), settings)
    poller.publisher = pub = Recording()
    running = _run(0, "RUNNING", T0, None)
    pending = JobInfo("17", run=1, state="PENDING", submit=T0 + 610, user="root", name="two")
    again = _run(1, "RUNNING", T0 + 2000, None)
    for view in (running, running, pending, pending, again):
        asyncio.run(poller.report(view))
    got = [(e.event_id, e.state, int(e.time.timestamp())) for e in pub.of(SlurmJobEvent)]
    end = (T0 + 600, "NODE_FAIL") if sacct_works else (T0 + 610, "REQUEUED")
    assert got == [
        ("slurm/probe/17/start", "RUNNING", T0),
        ("slurm/probe/17/end", end[1], end[0]),
        ("slurm/probe/17#1/start", "RUNNING", T0 + 2000),
    ]
    (stop,) = [e for e in pub.of(SlurmJobEvent) if e.kind.value == "end"]
    assert stop.nodes[0].gpu_indices == (0, 1)  # what the poller saw while it ran


# --- recorded on Slurm 22.05: job 1 (2 GPUs) requeued with `scontrol requeue` while running,
# then run again to completion (tests/fixtures/slurm/*requeued*) ----------------------------


def test_a_recorded_requeue_is_the_same_two_runs_from_every_source(tmp_path: Path) -> None:
    from gpugap.producers.slurm.parse import sacct_jobs

    text = (FIX / "sacct_requeued.txt").read_text()
    records, bad = sacct_jobs(text)  # sacct -D -P, with its header: REQUEUED, then COMPLETED
    assert not bad and [(r.run, r.state, r.submit) for r in records] == [
        (0, "REQUEUED", 1796310457),
        (1, "COMPLETED", 1796310460),  # Slurm reset the submit time at the requeue
    ]
    iso, bad = sacct_jobs((FIX / "sacct_requeued_iso.txt").read_text(), tz="UTC")  # sacct's
    assert not bad and [(r.run, r.start, r.end) for r in iso] == [  # default: naive, local
        (r.run, r.start, r.end) for r in records
    ]
    sacct = {e["event_id"]: e for r in records for e in events_for(r, "probe", "poller")}
    assert list(sacct) == [
        "slurm/probe/1/start", "slurm/probe/1/end", "slurm/probe/1#1/start", "slurm/probe/1#1/end",
    ]  # fmt: skip
    # jobcomp/script at the requeue: JOBSTATE=PENDING, the first run's START and END
    comp = jobcomp_env(env_file("env_jobcomp_requeued.env"))
    (end,) = [e for e in events_for(comp, "probe", "hook") if e["kind"] == "end"]
    keys = ("event_id", "state", "time", "start_time", "end_time", "gpus_total")
    assert {k: end.get(k) for k in keys if k != "gpus_total"} == {
        k: sacct["slurm/probe/1/end"].get(k) for k in keys if k != "gpus_total"
    }
    # scontrol: Restarts=1 while pending after the requeue (nothing held) and in the 2nd run
    pending = scontrol_job((FIX / "scontrol_requeued_pending.txt").read_text())
    assert (pending.run, pending.state, pending.started) == (1, "PENDING", False)
    assert events_for(pending, "probe", "poller") == []
    second = scontrol_job((FIX / "scontrol_requeued_run1.txt").read_text())
    (start,) = events_for(second, "probe", "poller")
    assert {k: start.get(k) for k in ("event_id", "start_time")} == {
        k: sacct["slurm/probe/1#1/start"].get(k) for k in ("event_id", "start_time")
    }
    assert second.gpu_indices == {"vm": (0, 1)}
    # the hooks' environment: the second run's prolog says 1; the epilog at the requeue
    # says 1 too (Slurm counted the requeue before it ran): the kept start's run wins
    assert show.restart_count(env_file("env_prolog_requeued.env")) == 1
    epilog = env_file("env_epilog_requeued.env")
    assert show.restart_count(epilog) == 1
    cfg = HookConfig({"GPUGAP_SLURM_SPOOL_DIR": str(tmp_path / "spool")})
    spool.private_dir(cfg.spool_dir)
    kept = job_event(records[0], "start", "probe", "hook")
    spool.save_start(cfg.spool_dir, "1", kept)
    (stop,), _ = on_end(cfg, epilog, epilog=True)
    assert stop["value"]["event_id"] == "slurm/probe/1/end"


def test_a_finished_record_without_its_nodes_waits_for_the_next_poll() -> None:
    """Seen on Slurm 26.05.3 (squeue --json -t all every 0.5 s, a 3-task array): task 3_1 read
    COMPLETED with no node for one poll while slurmctld released them, then COMPLETED on vm.
    The poller reports the end from the whole record, never 'it held nothing'."""
    from gpugap.groundfloor.settings import Settings
    from gpugap.producers.slurm.producer import SlurmProducer
    from gpugap.producers.slurm.settings import SlurmSettings
    from tests.streams.helpers import Recording

    poller = SlurmProducer(Settings(), SlurmSettings(cluster="probe"))
    poller.publisher = pub = Recording()
    common = {"array_job_id": 3, "array_task_id": 1, "start": T0, "submit": T0, "gpus": 1}
    running = JobInfo("5", state="RUNNING", nodes=["vm"], gpu_indices={"vm": (3,)}, **common)
    releasing = JobInfo("5", state="COMPLETED", end=T0 + 2, exit_status=0, **common)
    done = JobInfo("5", state="COMPLETED", end=T0 + 2, exit_status=0, nodes=["vm"], **common)
    for view in (running, releasing, done):
        asyncio.run(poller.report(view))
    events = pub.of(SlurmJobEvent)
    assert [(e.event_id, e.gpus_total) for e in events] == [
        ("slurm/probe/3_1/start", 1),
        ("slurm/probe/3_1/end", 1),
    ]
    assert events[1].nodes[0].gpu_indices == (3,) and events[1].start_time is not None
