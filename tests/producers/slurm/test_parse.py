"""What real Slurm 22.05 printed (recorded under tests/fixtures/slurm/) -> jobs and events.

Every event built here must be a valid SlurmJobEvent, and the same job seen by different
sources (hook environment + scontrol, squeue --json, sacct -P) must give the same event.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpugap.producers.slurm import squeue
from gpugap.producers.slurm.event import JobInfo, encode, events_for, iso_ms, job_event, utc_ms
from gpugap.producers.slurm.hostlist import expand, indices
from gpugap.producers.slurm.parse import (
    ParseError,
    jobcomp_env,
    sacct_jobs,
    scontrol_job,
    scontrol_jobs,
    time_limit,
)
from gpugap.producers.slurm.wire import crc32c, murmur2, partition_for, record_batch
from gpugap.schemas import SlurmJobEvent, decode
from gpugap.schemas.topics import SLURM_JOBS

FIX = Path(__file__).resolve().parents[2] / "fixtures" / "slurm"


def env_file(name: str) -> dict[str, str]:
    out = {}
    for line in (FIX / name).read_text().splitlines():
        k, _, v = line.partition("=")
        out[k] = v
    return out


def valid(ev: dict[str, object]) -> SlurmJobEvent:
    """The hand-built dict decodes to the schema's record, field for field."""
    record = decode(SLURM_JOBS, encode(ev))
    assert record.model_dump(mode="json", exclude_none=True) == ev
    return record


def test_hostlists_and_indices() -> None:
    assert expand("vm") == ["vm"]
    assert expand("gpu[01-03,07],login1") == ["gpu01", "gpu02", "gpu03", "gpu07", "login1"]
    assert expand("a[1-2]b[3-4]") == ["a1b3", "a1b4", "a2b3", "a2b4"]
    assert expand("") == expand("None assigned") == expand("(null)") == []
    assert indices("0-1,3") == (0, 1, 3)
    for bad in ("gpu[1-", "n[3-1]", "n[a-b]"):
        with pytest.raises(ValueError):
            expand(bad)


def test_time_limits() -> None:
    assert time_limit("00:05:00") == 300
    assert time_limit("1-02:00:00") == 93600
    assert time_limit("05:30") == 330
    assert time_limit("90") == 5400
    assert time_limit("UNLIMITED") is None
    assert time_limit("Partition_Limit") is None


def test_times_round_trip() -> None:
    for t in (0, 1795982497, 1795982497.123, 4102444800):
        assert iso_ms(utc_ms(t)) == round(t * 1000)


def test_prolog_scontrol_start_event() -> None:
    info = scontrol_job((FIX / "scontrol_prolog_2gpu.txt").read_text())
    assert info.state == "CONFIGURING" and info.started
    assert info.gpu_indices == {info.nodes[0]: (0, 1)} and info.time_limit_s == 300
    ev = job_event(info, "start", "probe", "hook")
    rec = valid(ev)
    assert rec.event_id == f"slurm/probe/{info.raw_id}/start"
    assert rec.gpus_total == 2 and rec.nodes[0].gpu_indices == (0, 1)
    assert rec.start_time is not None and rec.time == rec.start_time and not rec.interactive


def test_array_ids() -> None:
    """A task runs under its own raw id; the last task keeps the array's (the master record)."""
    master = scontrol_jobs((FIX / "scontrol_prolog_array_master.txt").read_text())[0]
    assert [(j.raw_id, j.job_id) for j in master] == [("18", "18_2"), ("19", "18_1")]
    # the prolog of task 18_2 (raw id 18, the master's): scontrol shows every task after it
    text = (FIX / "scontrol_prolog_array_master.txt").read_text()
    assert scontrol_job(text, name="arr", account="root").job_id == "18_2"
    task = scontrol_job((FIX / "scontrol_prolog_array_task.txt").read_text())
    assert (task.array_job_id, task.array_task_id, task.job_id) == (18, 1, "18_1")
    comp = jobcomp_env(env_file("env_jobcomp_array_task.env"))
    assert comp.job_id == "18_2"
    pending = jobcomp_env(env_file("env_jobcomp_array_pending.env"))
    assert (pending.job_id, pending.array_task_id, pending.started) == ("10", None, False)
    het = jobcomp_env(env_file("env_jobcomp_het_pending.env"))
    assert (het.job_id, het.het_job_id, het.het_job_offset) == ("11+1", 11, 1)


@pytest.mark.parametrize(
    ("fixture", "state", "exit_code", "started"),
    [
        ("env_jobcomp_completed.env", "COMPLETED", 0, True),
        ("env_jobcomp_failed.env", "FAILED", 3, True),
        ("env_jobcomp_cancelled_running.env", "CANCELLED", None, True),
        ("env_jobcomp_cancelled_pending.env", "CANCELLED", None, False),
        ("env_jobcomp_timeout.env", "TIMEOUT", None, True),
    ],
)
def test_jobcomp_end_events(fixture: str, state: str, exit_code: int | None, started: bool) -> None:
    info = jobcomp_env(env_file(fixture))
    assert info.started is started
    (end,) = [e for e in events_for(info, "probe", "hook") if e["kind"] == "end"]
    rec = valid(end)
    assert (rec.state, rec.exit_code) == (state, exit_code)
    assert rec.end_time is not None and rec.time == rec.end_time
    assert (rec.start_time is not None) is started and (rec.nodes != ()) is started
    if not started:  # never held anything
        assert rec.gpus_total == 0 and len(events_for(info, "probe", "hook")) == 1


def test_squeue_json_matches_other_sources() -> None:
    jobs, bad = squeue.jobs((FIX / "squeue.json").read_text())
    assert not bad
    by_id = {j.job_id: j for j in jobs}
    assert by_id["2"].exit_status == 3 and by_id["2"].state == "FAILED"
    assert by_id["8"].state == "CANCELLED" and by_id["8"].exit_signal == 15
    assert by_id["10"].started is False  # pending array cancelled: one meta record
    running = [j for j in jobs if j.state == "RUNNING"]
    assert running and all(j.gpu_indices for j in running)
    # the same ended jobs from sacct give the same event ids and fields (GPU indices aside)
    hist, bad = sacct_jobs((FIX / "sacct.txt").read_text())
    assert not bad
    sacct_by_id = {j.job_id: j for j in hist}
    assert sacct_by_id["3_1"].raw_id == "4" and sacct_by_id["10"].started is False
    for jid in ("1", "2", "3_1", "6", "7", "8", "9", "13"):
        a = {e["event_id"]: e for e in events_for(by_id[jid], "probe", "poller")}
        b = {e["event_id"]: e for e in events_for(sacct_by_id[jid], "probe", "poller")}
        assert a.keys() == b.keys(), jid
        for k, ev in a.items():
            valid(ev)
            valid(b[k])
            same = (
                "state",
                "exit_code",
                "time",
                "start_time",
                "end_time",
                "gpus_total",
                "job_name",
            )
            assert {f: ev.get(f) for f in same} == {f: b[k].get(f) for f in same}, (jid, k)


def test_jobcomp_and_squeue_agree_on_ends() -> None:
    jobs, _ = squeue.jobs((FIX / "squeue.json").read_text())
    by_raw = {j.raw_id: j for j in jobs}
    for fixture in ("failed", "cancelled_running", "cancelled_pending", "timeout"):
        comp = jobcomp_env(env_file(f"env_jobcomp_{fixture}.env"))
        sq = by_raw[comp.raw_id]
        a = job_event(comp, "end", "probe", "hook")
        b = job_event(sq, "end", "probe", "poller")
        keys = ("event_id", "state", "exit_code", "time", "start_time", "end_time", "job_name")
        assert {k: a.get(k) for k in keys} == {k: b.get(k) for k in keys}, fixture


def test_malformed_squeue() -> None:
    with pytest.raises(ParseError, match="not valid JSON"):
        squeue.jobs((FIX / "squeue_truncated.json").read_text())
    with pytest.raises(ParseError, match="no 'jobs'"):
        squeue.jobs((FIX / "squeue_no_jobs.json").read_text())
    good, bad = squeue.jobs((FIX / "squeue_bad_jobs.json").read_text())
    assert (
        len(bad) == 3
        and len(good) == len(json.loads((FIX / "squeue.json").read_text())["jobs"]) - 3
    )
    reasons = " | ".join(r for _, r in bad)
    assert "job_id" in reasons and "gres_detail" in reasons and "job_state" in reasons


def test_malformed_scontrol_and_sacct() -> None:
    good, bad = scontrol_jobs((FIX / "scontrol_malformed.txt").read_text())
    assert (
        len(bad) == 4 and len(good) == len((FIX / "scontrol_all.txt").read_text().splitlines()) - 3
    )
    with pytest.raises(ParseError):
        scontrol_job("JobId=7 JobName=x")  # no state
    good, bad = sacct_jobs((FIX / "sacct_malformed.txt").read_text())
    assert len(bad) == 2 and all("sacct" in r for _, r in bad)


def test_job_names_with_spaces_and_equals() -> None:
    line = (FIX / "scontrol_prolog_2gpu.txt").read_text().replace("JobName=two", "JobName=my job")
    assert scontrol_job(line).name == "my job"
    info = JobInfo("5", state="COMPLETED", start=10, end=20, nodes=["n1"], name="a|b", gpus=0)
    assert valid(job_event(info, "end", "c", "poller")).job_name == "a|b"


def test_wire_helpers_match_kafka() -> None:
    from aiokafka.partitioner import DefaultPartitioner
    from aiokafka.partitioner import murmur2 as kafka_murmur2

    p = DefaultPartitioner()
    for key in (b"", b"a", b"ab", b"abc", b"probe/12_3", b"cluster-7/123456+1", bytes(range(77))):
        assert murmur2(key) == kafka_murmur2(key)
        assert partition_for(key, 12) == p(key, list(range(12)), list(range(12)))
    assert crc32c(b"123456789") == 0xE3069283  # the CRC-32C check value
    batch = record_batch([(b"k", b"v", 1000), (None, b"w", 1005)])
    assert batch[16] == 2 and int.from_bytes(batch[8:12], "big") == len(batch) - 12


# --- user-controlled fields are data, never structure (recorded on Slurm 22.05) ---------------
HOSTILE_NAME = (
    "x UserId=victim(2000) Account=victim-acct TRES=cpu=1,gres/gpu=16 NodeList=gpu[01-02]"
)


def test_a_job_name_that_reads_as_fields_cannot_claim_another_user() -> None:
    """The record is read by its layout: the name ends where the one real
    ``UserId=u(uid) GroupId=g(gid) ... Account=`` run begins, with or without the name the
    prolog's environment gives."""
    text = (FIX / "scontrol_prolog_hostile_name.txt").read_text()
    env = env_file("env_prolog_hostile_name.env")
    assert env["SLURM_JOB_NAME"] == HOSTILE_NAME
    for info in (scontrol_job(text), scontrol_job(text, name=HOSTILE_NAME, account="root")):
        assert (info.user, info.account, info.nodes, info.gpus) == ("root", "root", ["vm"], 1)
        assert info.gpu_indices == {"vm": (0,)} and info.name == HOSTILE_NAME
    with pytest.raises(ParseError, match="SLURM_JOB_NAME"):
        scontrol_job(text, name="another name")
    with pytest.raises(ParseError, match="SLURM_JOB_ACCOUNT"):
        scontrol_job(text, name=HOSTILE_NAME, account="victim-acct")
    # a name that copies the whole run: without the environment, which is real cannot be
    # told, so the record is refused; the prolog, knowing the name, reads it exactly
    run = "UserId=victim(2000) GroupId=victim(2000) MCS_label=N/A Priority=1 Nice=0 Account=v"
    copied = text.replace("JobName=x UserId=victim(2000)", f"JobName=x {run}", 1)
    with pytest.raises(ParseError, match="job name"):
        scontrol_job(copied)
    name = HOSTILE_NAME.replace("x UserId=victim(2000)", f"x {run}", 1)
    assert scontrol_job(copied, name=name, account="root").user == "root"


def test_comment_workdir_and_stdout_cannot_inject_fields() -> None:
    """Comment, WorkDir, StdErr/StdOut come after the fields read: text in them is ignored."""
    text = (FIX / "scontrol_prolog_hostile_fields.txt").read_text()
    assert "GRES=gpu:4(IDX:0-3)" in text and "Comment=c Account=victim-acct" in text
    for info in (scontrol_job(text), scontrol_job(text, name="wrap", account="root")):
        assert (info.user, info.account, info.nodes, info.gpus) == ("root", "root", ["vm"], 1)
        assert info.gpu_indices == {"vm": (1,)}


def test_a_newline_in_a_job_name_cannot_forge_a_record() -> None:
    """Job 14's name holds a whole record for user victim, a newline, and 'JobId=999': the
    poller's fallback checks every record against squeue's list of job ids."""
    text = (FIX / "scontrol_all_forged.txt").read_text(errors="surrogateescape")
    ids = set((FIX / "squeue_ids_forged.txt").read_text().split())
    jobs, bad = scontrol_jobs(text, known_ids=ids)
    assert {j.raw_id for j in jobs} == {"11", "12", "13"}  # 14 and "999": forged
    assert all(j.user == "root" and j.account == "root" and j.gpus == 1 for j in jobs)
    assert len(bad) == 2 and any("999" in reason for _, reason in bad)
    # without squeue's ids the forged line reads as a record of victim's: why the poller asks
    assert [j.user for j in scontrol_jobs(text)[0] if j.raw_id == "14"] == ["victim"]
    # the prolog knows the name: the same record is read right
    forged = (FIX / "scontrol_prolog_forged.txt").read_text()
    name = forged.split("JobName=", 1)[1].split(" UserId=root(0)")[0]
    info = scontrol_job(forged, name=name, account="root")
    assert (info.raw_id, info.user, info.gpus, info.gpu_indices) == ("14", "root", 1, {"vm": (3,)})


def test_non_utf8_and_long_job_names_are_replaced_and_bounded() -> None:
    """Bytes that are not UTF-8 become U+FFFD; names are cut at NAME_MAX (256) characters."""
    from gpugap.producers.slurm.event import NAME_MAX

    raw = (FIX / "scontrol_prolog_non_utf8.txt").read_bytes()
    info = scontrol_job(raw.decode(errors="surrogateescape"))
    ev = job_event(info, "start", "probe", "hook")
    assert valid(ev).job_name == "caf\ufffd \ufffd\ufffd name"
    info.name = "\udcff" * 1000  # os.environ's view of undecodable bytes
    assert valid(job_event(info, "start", "probe", "hook")).job_name == "\ufffd" * NAME_MAX
    assert NAME_MAX == 256
