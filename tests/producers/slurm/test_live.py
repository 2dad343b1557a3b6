"""Against a real Slurm and a real Kafka broker: the hooks (as slurmctld runs them) and the
poller report every job exactly once, with the GPUs, state, exit code and times Slurm gave.

The slow job (a 1-minute limit is enforced after ~80 s) runs alongside everything else in
one test, so the whole file stays near two minutes.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from gpugap.groundfloor.kafka.publish import KafkaPublisher
from gpugap.groundfloor.settings import KafkaSettings, Settings
from gpugap.producers.slurm.parse import gres_indices
from gpugap.producers.slurm.producer import SlurmProducer
from gpugap.producers.slurm.settings import SlurmSettings
from gpugap.schemas import SlurmJobEvent
from gpugap.schemas.topics import DEAD_LETTER, SLURM_JOBS
from tests.harness.slurm_cluster import GPUGAP, SlurmCluster
from tests.harness.topics import read_topic

pytestmark = [pytest.mark.slurm, pytest.mark.kafka]
CLUSTER = "live"


def hook_env(kafka: KafkaSettings, spool: Path, **extra: str) -> dict[str, str]:
    return {
        "GPUGAP_KAFKA_BOOTSTRAP": kafka.bootstrap,
        "GPUGAP_KAFKA_TOPIC_PREFIX": kafka.topic_prefix,
        "GPUGAP_SLURM_SPOOL_DIR": str(spool),
        "GPUGAP_SLURM_CLUSTER": CLUSTER,
        **extra,
    }


class Poller:
    """The poller (``gpugap produce slurm``) running in this process until stopped."""

    def __init__(self, slurm: SlurmCluster, kafka: KafkaSettings, **opts: Any) -> None:
        os.environ["SLURM_CONF"] = str(slurm.conf)  # for the squeue/sacct it runs
        s = SlurmSettings(cluster=CLUSTER, interval_s=0.5, drain_spool=False, **opts)
        self.producer = SlurmProducer(Settings(kafka=kafka), s)
        self.publisher = KafkaPublisher(kafka)
        self.stop = asyncio.Event()

    async def __aenter__(self) -> Poller:
        from gpugap.producers import run_producer

        self.task = asyncio.create_task(run_producer(self.producer, self.publisher, stop=self.stop))
        return self

    async def __aexit__(self, *exc: object) -> None:
        await asyncio.sleep(1.5)  # one more tick: the last ends
        self.stop.set()
        await self.task


def by_job(events: list[SlurmJobEvent]) -> dict[str, dict[str, list[SlurmJobEvent]]]:
    out: dict[str, dict[str, list[SlurmJobEvent]]] = {}
    for e in events:
        out.setdefault(e.job_id, {}).setdefault(e.kind.value, []).append(e)
    return out


def content(e: SlurmJobEvent) -> dict[str, Any]:
    return e.model_dump(mode="json", exclude={"source"})


def wait_running(slurm: SlurmCluster, job: str) -> list[str]:
    jobs = slurm.wait(lambda j: j[job]["job_state"] == "RUNNING", f"job {job} to run", 60)
    return list(jobs[job]["gres_detail"])  # type: ignore[arg-type]


def test_hooks_and_poller_report_every_job(
    slurm: SlurmCluster, kafka: KafkaSettings, tmp_path: Path
) -> None:
    slurm.set_hook_env(hook_env(kafka, tmp_path / "spool"))
    poller_kafka = kafka.model_copy(update={"topic_prefix": kafka.topic_prefix + "poller."})
    seen: dict[str, list[str]] = {}
    # jobs of earlier tests that slurmctld still remembers (MinJobAge): the poller rightly
    # reports those that ended just before it started; they are not this test's
    earlier = set(slurm.jobs())

    async def scenario() -> dict[str, str]:
        async with Poller(slurm, poller_kafka):
            ids = {
                "timeout": slurm.submit("--gres=gpu:1", "-t", "1", "-J", "tmo", wrap="sleep 300"),
                "two": slurm.submit("--gres=gpu:2", "-t", "5", "-J", "two", wrap="sleep 6"),
                "one": slurm.submit("--gres=gpu:1", "-J", "one", wrap="sleep 6"),
                "pending": slurm.submit("--gres=gpu:1", "--begin=now+1hour", wrap="true"),
                "running": slurm.submit("--gres=gpu:1", "-J", "canrun", wrap="sleep 300"),
                "failed": slurm.submit("--gres=gpu:1", "-J", "fail", wrap="sleep 3; exit 3"),
                "array": slurm.submit("--gres=gpu:1", "-a", "1-3", "-J", "arr", wrap="sleep 2"),
            }
            # blocking waits go to a thread: the poller keeps polling meanwhile
            seen["two"] = await asyncio.to_thread(wait_running, slurm, ids["two"])
            seen["one"] = await asyncio.to_thread(wait_running, slurm, ids["one"])
            slurm.cmd("scancel", ids["pending"])
            await asyncio.to_thread(wait_running, slurm, ids["running"])
            await asyncio.sleep(1.0)  # a poll sees it running
            slurm.cmd("scancel", ids["running"])
            await asyncio.to_thread(
                slurm.wait, lambda j: all_ended(j, ids), "every job to end", 200
            )
        return ids

    ids = asyncio.run(scenario())
    final = slurm.jobs()
    hooks = asyncio.run(read_topic(kafka, SLURM_JOBS, 17, settle_s=2))
    polled = asyncio.run(read_topic(poller_kafka, SLURM_JOBS, 17, settle_s=1))
    hooks = [e for e in hooks if e.job_id not in earlier]
    polled = [e for e in polled if e.job_id not in earlier]
    arr = ids["array"]
    array_ids = {f"{arr}_{t}" for t in (1, 2, 3)}
    expect = {ids[k] for k in ("timeout", "two", "one", "pending", "running", "failed")} | array_ids

    for name, events in (("hooks", hooks), ("poller", polled)):
        jobs = by_job(events)
        assert set(jobs) == expect, name
        for job, kinds in jobs.items():  # exactly one start (if it started) and one end each
            assert len(kinds["end"]) == 1, (name, job)
            assert len(kinds.get("start", [])) == (0 if job == ids["pending"] else 1), (name, job)
        assert all(e.source.value == ("hook" if name == "hooks" else "poller") for e in events)

    jobs = by_job(hooks)

    def end(key: str) -> SlurmJobEvent:
        return jobs[ids[key]]["end"][0]

    def start(key: str) -> SlurmJobEvent:
        return jobs[ids[key]]["start"][0]

    assert (end("two").state, end("two").exit_code, end("one").state) == (
        "COMPLETED",
        0,
        "COMPLETED",
    )
    assert (end("failed").state, end("failed").exit_code) == ("FAILED", 3)
    assert (end("running").state, end("running").exit_code) == ("CANCELLED", None)
    assert (end("timeout").state, end("timeout").time_limit_s) == ("TIMEOUT", 60)
    pend = end("pending")
    assert (pend.state, pend.start_time, pend.nodes, pend.gpus_total) == ("CANCELLED", None, (), 0)
    # GPUs: what squeue showed while they ran; the 2-GPU and the 1-GPU job shared the node
    two, one = start("two"), start("one")
    assert two.gpus_total == 2 and one.gpus_total == 1 and start("timeout").gpus_total == 1
    assert [gres_indices(g) for g in seen["two"]] == [two.nodes[0].gpu_indices]
    assert [gres_indices(g) for g in seen["one"]] == [one.nodes[0].gpu_indices]
    assert not set(two.nodes[0].gpu_indices) & set(one.nodes[0].gpu_indices)
    assert two.start_time < end("one").end_time and one.start_time < end("two").end_time  # type: ignore[operator]
    assert end("two").nodes == two.nodes and end("two").time_limit_s == 300
    # times are Slurm's own (squeue after the end), start and end events agree
    for job_id, kinds in jobs.items():
        raw = next(r for r, j in final.items() if _printed(j) == job_id)
        e = kinds["end"][0]
        assert int(e.end_time.timestamp()) == final[raw]["end_time"], job_id  # type: ignore[union-attr]
        assert int(e.submit_time.timestamp()) == final[raw]["submit_time"], job_id  # type: ignore[union-attr]
        if "start" in kinds:
            s = kinds["start"][0]
            assert int(s.start_time.timestamp()) == final[raw]["start_time"], job_id  # type: ignore[union-attr]
            # the wait for GPUs starts at EligibleTime (v_queue_wait)
            assert int(s.eligible_time.timestamp()) == final[raw]["eligible_time"], job_id  # type: ignore[union-attr]
            assert (
                s.start_time == e.start_time
                and s.nodes == e.nodes
                and s.event_id.endswith("/start")
            )
    assert {e.job_id for e in hooks if e.array_job_id == int(arr)} == array_ids

    # the poller alone saw the same events; together, dedupe by event_id leaves one of each
    from_hooks = {e.event_id: content(e) for e in hooks}
    diff = {
        (i, k): (v, from_hooks.get(i, {}).get(k))
        for i, c in ((e.event_id, content(e)) for e in polled)
        for k, v in c.items()
        if from_hooks.get(i, {}).get(k) != v
    }
    assert not diff and len(polled) == len(hooks), diff
    union = Counter(e.event_id for e in hooks + polled)
    assert set(union.values()) == {2} and len(union) == 17
    # slurmctld's wait for the hooks: the prolog (start) and the no-op epilog
    times = [t for ctx, job, t in slurm.timings() if job in final and ctx != "jobcomp"]
    assert times and max(times) < 2.5


def all_ended(jobs: dict[str, dict[str, Any]], ids: dict[str, str]) -> bool:
    arr = int(ids["array"])
    mine = [j for r, j in jobs.items() if r in ids.values() or j.get("array_job_id") == arr]
    tasks = {j["array_task_id"] for j in mine if j.get("array_job_id") == arr}
    final = all(j["job_state"] not in ("PENDING", "RUNNING", "COMPLETING") for j in mine)
    return final and tasks == {1, 2, 3}


def _printed(job: dict[str, Any]) -> str:
    if job.get("array_job_id") and job.get("array_task_id") is not None:
        return f"{job['array_job_id']}_{job['array_task_id']}"
    return str(job["job_id"])


SLOW_ONCE = """#!/bin/sh
# the first `scontrol -o show job` of the burst answers late, as a loaded slurmctld does
case " $* " in *" -o "*) mkdir "{lock}" 2>/dev/null && sleep 2;; esac
exec {scontrol} "$@"
"""


def test_kafka_down_spools_and_drain_ships(
    slurm: SlurmCluster, kafka: KafkaSettings, tmp_path: Path
) -> None:
    """A broker that accepts connections and never answers (the worst case: every hook waits
    out its deadline) during a burst of 20 jobs, then `gpugap slurm-hook drain`.

    One prolog's scontrol answers after the hook's deadline (as it did in CI under load): that
    hook spools a dead letter where the start event would be. The drainer must ship exactly
    what the spool held, each record to its topic, and say so."""
    hang = socket.socket()
    hang.bind(("127.0.0.1", 0))
    hang.listen(128)  # never accepted: requests sit in the backlog unanswered
    spool = tmp_path / "spool"
    dead = KafkaSettings(
        bootstrap=f"127.0.0.1:{hang.getsockname()[1]}", topic_prefix=kafka.topic_prefix
    )
    slow = tmp_path / "scontrol"
    slow.write_text(SLOW_ONCE.format(lock=tmp_path / "slow.once", scontrol=slurm.tool("scontrol")))
    slow.chmod(0o755)
    timeout = 1.0
    slurm.set_hook_env(
        hook_env(
            dead, spool, GPUGAP_SLURM_HOOK_TIMEOUT_S=str(timeout), GPUGAP_SLURM_SCONTROL=str(slow)
        )
    )
    try:
        t0 = time.monotonic()
        ids = [slurm.submit("--gres=gpu:1", "-J", f"burst{i}", wrap="true") for i in range(20)]

        def done(jobs: dict[str, dict[str, Any]]) -> bool:
            spooled = len(list((spool / "events").glob("*.json")))
            return all(jobs[i]["job_state"] == "COMPLETED" for i in ids) and spooled == 40

        slurm.wait(done, "the burst to complete and spool", 120)
        burst_s = time.monotonic() - t0
    finally:
        hang.close()
    runs = {(ctx, job): t for ctx, job, t in slurm.timings() if job in ids}
    prologs = [t for (ctx, _), t in runs.items() if ctx == "prolog_slurmctld"]
    assert len(prologs) == 20
    # a job waits for its prolog: never longer than the hook timeout (+ the wrapper's shell)
    assert max(prologs) < timeout + 0.5, sorted(prologs)
    assert max(t for (ctx, _), t in runs.items() if ctx == "jobcomp") < timeout + 0.5
    assert "spooled" in (spool / "hook.log").read_text()
    held = Counter(json.loads(p.read_bytes())["topic"] for p in (spool / "events").glob("*.json"))
    assert held == {"slurm.jobs.v1": 39, "dead-letter.v1": 1}, held
    # Kafka is back: the drainer ships every spooled event, and says to which topic
    env = dict(
        os.environ,
        GPUGAP_KAFKA_BOOTSTRAP=kafka.bootstrap,
        GPUGAP_KAFKA_TOPIC_PREFIX=kafka.topic_prefix,
    )
    out = subprocess.run(
        [str(GPUGAP), "slurm-hook", "drain", "--spool-dir", str(spool)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    said = out.stdout + out.stderr
    assert out.returncode == 0, said
    assert (
        "shipped 40 spooled event(s)" in said and "39 to slurm.jobs.v1, 1 to dead-letter.v1" in said
    ), said
    events = asyncio.run(read_topic(kafka, SLURM_JOBS, 39, settle_s=1))
    (letter,) = asyncio.run(read_topic(kafka, DEAD_LETTER, 1, settle_s=1))
    assert len(events) == 39 and len({e.event_id for e in events}) == 39
    assert {e.job_id for e in events} == set(ids) and not list((spool / "events").glob("*"))
    starts = {e.job_id: e for e in events if e.kind.value == "start"}
    (late,) = set(ids) - set(starts)  # the job whose scontrol answered late: its dead letter
    assert letter.consumer == "slurm-hook:scontrol" and f"job {late}:" in letter.reason
    assert "scontrol" in letter.reason
    assert all(e.gpus_total == 1 and e.nodes[0].gpu_indices for e in starts.values())
    ends = [e for e in events if e.kind.value == "end"]
    assert all(e.gpus_total == 1 and e.nodes[0].gpu_indices for e in ends if e.job_id != late)
    print(f"burst of 20 jobs with Kafka hanging: {burst_s:.1f}s; prolog max {max(prologs):.2f}s")


HOSTILE_NAME = (
    "x UserId=victim(2000) Account=victim-acct TRES=cpu=1,gres/gpu=16 NodeList=gpu[01-02]"
)


def test_hostile_and_undecodable_job_names_are_data(
    slurm: SlurmCluster, kafka: KafkaSettings, tmp_path: Path
) -> None:
    """Real jobs whose name, comment and output path read as scontrol fields, and one whose
    name is not UTF-8: the hooks report their real owner, account, GPUs and nodes."""
    slurm.set_hook_env(hook_env(kafka, tmp_path / "spool"))
    workdir = tmp_path / "w UserId=victim(2000) Nodes=gpu01 CPU_IDs=0 Mem=0 GRES=gpu:4(IDX:0-3)"
    workdir.mkdir()
    undecodable = os.fsdecode(b"caf\xe9 \xff\xfe name")
    ids = {
        "name": slurm.submit("--gres=gpu:1", "-J", HOSTILE_NAME, wrap="sleep 2"),
        "fields": slurm.submit(
            "--gres=gpu:1",
            "--comment",
            "c Account=victim-acct TRES=cpu=1,gres/gpu=16 UserId=victim(2000)",
            "-D",
            str(workdir),
            "-e",
            str(workdir / "e NodeList=gpu[01-02]"),
            wrap="sleep 2",
        ),
        "bytes": slurm.submit("--gres=gpu:1", "-J", undecodable, wrap="sleep 2"),
    }
    final = ("COMPLETED", "FAILED", "CANCELLED")
    slurm.wait(lambda j: all(j[i]["job_state"] in final for i in ids.values()), "the jobs", 60)
    events = asyncio.run(read_topic(kafka, SLURM_JOBS, 6, settle_s=1))
    jobs = by_job(events)
    assert set(jobs) == set(ids.values())
    for key, job in ids.items():
        for kind in ("start", "end"):
            (e,) = jobs[job][kind]
            assert (e.user, e.account, e.partition, e.gpus_total) == ("root", "root", "debug", 1)
            assert [n.node for n in e.nodes] == [slurm.node] and len(e.nodes[0].gpu_indices) == 1
            assert e.state.value == ("RUNNING" if kind == "start" else "COMPLETED"), (key, e)
    assert {e.job_name for e in events if e.job_id == ids["name"]} == {HOSTILE_NAME}
    assert {e.job_name for e in events if e.job_id == ids["bytes"]} == {
        "caf\ufffd \ufffd\ufffd name"
    }
    log = tmp_path / "spool" / "hook.log"
    assert not log.exists() or "no start event" not in log.read_text(errors="replace")


def test_poller_alone_and_sacct_backfill(
    slurm: SlurmCluster, kafka: KafkaSettings, tmp_path: Path
) -> None:
    """Hooks off: the poller reports the jobs; later, --since from sacct gives the same ids."""
    slurm.set_hook_env({"GPUGAP_TEST_HOOKS_OFF": "1"})
    since = time.time() - 1

    async def scenario() -> list[str]:
        async with Poller(slurm, kafka):
            ids = [
                slurm.submit("--gres=gpu:2", "-J", "p2", wrap="sleep 3"),
                slurm.submit("--gres=gpu:1", "-J", "p1", wrap="sleep 2; exit 3"),
                slurm.submit("--gres=gpu:1", "--begin=now+1hour", wrap="true"),
            ]
            slurm.cmd("scancel", ids[2])
            final = ("COMPLETED", "FAILED", "CANCELLED")
            ended = lambda j: all(j[i]["job_state"] in final for i in ids)  # noqa: E731
            await asyncio.to_thread(slurm.wait, ended, "jobs to end", 60)
        return ids

    ids = asyncio.run(scenario())
    # (the poller reports every job slurmctld remembers: earlier tests' jobs too)
    everything = asyncio.run(read_topic(kafka, SLURM_JOBS, 5, settle_s=1))
    polled = [e for e in everything if e.job_id in ids]
    jobs = by_job(polled)
    assert set(jobs) == set(ids) and len(polled) == 5
    assert [e.nodes[0].gpu_indices.__len__() for e in jobs[ids[0]]["start"]] == [2]
    assert (jobs[ids[1]]["end"][0].state, jobs[ids[1]]["end"][0].exit_code) == ("FAILED", 3)
    assert "start" not in jobs[ids[2]] and jobs[ids[2]]["end"][0].state == "CANCELLED"

    # backfill: a fresh poller (empty ledger) reading sacct since the test began
    back = kafka.model_copy(update={"topic_prefix": kafka.topic_prefix + "back."})

    async def backfill() -> None:
        os.environ["SLURM_CONF"] = str(slurm.conf)
        from datetime import UTC, datetime

        s = SlurmSettings(
            cluster=CLUSTER, drain_spool=False, since=datetime.fromtimestamp(since, UTC)
        )
        producer = SlurmProducer(Settings(kafka=back), s)
        producer.source = "none"  # history only: sacct, not the live queue
        async with KafkaPublisher(back) as pub:
            producer.publisher = pub
            await producer.backfill(int(since))

    asyncio.run(backfill())
    history = [
        e for e in asyncio.run(read_topic(back, SLURM_JOBS, 5, settle_s=1)) if e.job_id in ids
    ]
    assert {e.event_id for e in history} == {e.event_id for e in polled}
    live = {e.event_id: e for e in polled}
    for e in history:  # sacct knows how many GPUs, not which
        p = live[e.event_id]
        assert (e.state, e.exit_code, e.start_time, e.end_time, e.gpus_total) == (
            p.state,
            p.exit_code,
            p.start_time,
            p.end_time,
            p.gpus_total,
        )
        assert [n.node for n in e.nodes] == [n.node for n in p.nodes]
