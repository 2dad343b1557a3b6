"""``gpugap produce slurm-jobcomp`` against a real broker, fed records recorded from a real
Slurm 26.05.3 (tests/fixtures/slurm/jobcomp) and variations of them: duplicates from
slurmctld's purge, an end without its start, a requeued job's two runs, a record that cannot be
read. No slurmctld answers here (scontrol is missing): GPUs are counted, not indexed, and runs
are numbered by SLUID order. The real Slurm: test_jobcomp_live.py."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from pathlib import Path

import pytest

from gpugap.groundfloor.kafka.publish import KafkaPublisher
from gpugap.groundfloor.settings import KafkaSettings, Settings
from gpugap.producers.slurm.jobcomp_producer import SlurmJobcompProducer
from gpugap.producers.slurm.jobcomp_settings import SlurmJobcompSettings
from gpugap.schemas.topics import DEAD_LETTER, SLURM_JOBS
from tests.harness.topics import read_topic

pytestmark = pytest.mark.kafka
FIXTURES = Path(__file__).parents[2] / "fixtures" / "slurm" / "jobcomp"


def recorded(name: str, **change: object) -> bytes:
    obj = json.loads((FIXTURES / name).read_text())
    obj.update(change)
    return json.dumps(obj).encode()


def end_of(start: bytes, **change: object) -> bytes:
    obj = json.loads(start)
    obj.update({"@end": "2026-12-06T16:11:23", "elapsed": 8, "state": "COMPLETED",
                "exit_code": "0:0", "derived_ec": "0:0"}, **change)  # fmt: skip
    return json.dumps(obj).encode()


START = "start-gres2-n2.json"
#: job 7's two runs: the first ended by a requeue (state PENDING), the second completed
RUN0 = recorded(START, jobid=7, sluid="s48DM961ZBNA07", original_sluid="s48DM961ZBNA07")
RUN1 = recorded(START, jobid=7, sluid="s48DM96Z0000A7", original_sluid="s48DM96Z0000A7",
                **{"@start": "2026-12-06T16:14:30", "@submit": "2026-12-06T16:12:00"})  # fmt: skip


async def send(kafka: KafkaSettings, topic: str, values: list[bytes]) -> None:
    publisher = KafkaPublisher(kafka)
    await publisher.start()
    try:
        for value in values:
            await publisher.send_raw(topic, None, value)
        await publisher.flush()
    finally:
        await publisher.close()


async def consume(kafka: KafkaSettings, cfg: SlurmJobcompSettings, seconds: float) -> None:
    from gpugap.producers import run_producer

    producer = SlurmJobcompProducer(Settings(kafka=kafka), cfg)
    stop = asyncio.Event()
    task = asyncio.create_task(run_producer(producer, KafkaPublisher(kafka), stop=stop))
    await asyncio.sleep(seconds)
    stop.set()
    await task


def test_records_become_events_once_each_and_bad_ones_dead_letters(
    kafka: KafkaSettings, tmp_path: Path
) -> None:
    starts, ends = f"{kafka.topic_prefix}jobstart", f"{kafka.topic_prefix}jobcomp"
    start = recorded(START)
    asyncio.run(send(kafka, starts, [start, RUN0, RUN1, start]))  # a purge re-sends job 1's
    asyncio.run(
        send(kafka, ends, [
            end_of(start), end_of(start),  # re-sent
            (FIXTURES / "end-het-component1.json").read_bytes(),  # its start never came
            end_of(RUN0, state="PENDING", **{"@end": "2026-12-06T16:12:00"}),
            end_of(RUN1, **{"@end": "2026-12-06T16:15:00"}),
            b"{not json",
        ])
    )  # fmt: skip
    cfg = SlurmJobcompSettings(
        topic=ends, start_topic=starts, group=f"{kafka.topic_prefix}g1",
        scontrol=str(tmp_path / "no-scontrol"), state_file=tmp_path / "state.json",
    )  # fmt: skip
    asyncio.run(consume(kafka, cfg, 8))
    events = asyncio.run(read_topic(kafka, SLURM_JOBS, 0, settle_s=3))
    ids = Counter(e.event_id for e in events)
    assert ids == Counter({
        f"slurm/gapprobe/{job}/{kind}": 1
        for job in ("1", "2+1", "7", "7#1") for kind in ("start", "end")
    })  # fmt: skip
    by_id = {e.event_id: e for e in events}
    assert by_id["slurm/gapprobe/7/end"].state.value == "REQUEUED"
    assert by_id["slurm/gapprobe/7#1/end"].state.value == "COMPLETED"
    one = by_id["slurm/gapprobe/1/end"]
    # slurmctld could not say which GPUs: the count on its node, no index guessed
    assert one.gpus_total == 2 and [n.gpu_indices for n in one.nodes] == [()]
    assert one.time_limit_s == 120 and one.eligible_time is not None
    (dead,) = asyncio.run(read_topic(kafka, DEAD_LETTER, 1, settle_s=1))
    assert "not JSON" in dead.reason and dead.source_topic == ends

    # the same topics read again from the start (a new group), the state file kept: nothing
    # is published twice
    again = cfg.model_copy(update={"group": f"{kafka.topic_prefix}g2"})
    asyncio.run(consume(kafka, again, 6))
    assert len(asyncio.run(read_topic(kafka, SLURM_JOBS, 0, settle_s=2))) == len(events)
