"""record and replay: captures travel through Kafka and back unchanged, bad lines are
reported by line number and skipped (or stop the replay under --strict)."""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter, defaultdict
from pathlib import Path

import pytest

from gpugap.cli import main
from gpugap.groundfloor.settings import KafkaSettings
from gpugap.schemas import decode, encode
from gpugap.schemas.examples import one_of_each
from gpugap.schemas.topics import K8S_PODS, NODE_CAPACITY, SAMPLES, SLURM_JOBS, by_name
from tests.harness.topics import create_topics

# what the simulator publishes (node capacity polls too, docs/simulator.md)
TOPICS = [SAMPLES.name, SLURM_JOBS.name, K8S_PODS.name, NODE_CAPACITY.name]


def lines(path: Path) -> list[bytes]:
    return path.read_bytes().splitlines()


def simulate(out: Path, *extra: str) -> None:
    args = ["simulate", "--scenario", "small", "--duration", "15m", "--as-fast-as-possible"]
    assert main([*args, "--out", str(out), *extra]) == 0


def test_replay_to_jsonl_keeps_good_lines_and_reports_bad_ones(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = tmp_path / "sim.jsonl"
    simulate(src)
    good = [ln for ln in lines(src) if b'"value_b64"' not in ln]
    raw = [ln for ln in lines(src) if b'"value_b64"' in ln]
    assert raw, "the scenario emits malformed records"
    record = one_of_each()["slurm.jobs.v1"].model_dump(mode="json")
    bad = [
        b"{not json",
        json.dumps({"topic": "gpu.samples.v9", "key": "a/b", "value": {}}).encode(),
        json.dumps(
            {"topic": "slurm.jobs.v1", "key": "k", "value": {**record, "gpus_total": -1}}
        ).encode(),
        b"",  # blank lines are not records and not errors
    ]
    mixed = tmp_path / "mixed.jsonl"
    mixed.write_bytes(b"\n".join(good[:5] + bad + good[5:] + raw) + b"\n")
    out = tmp_path / "out.jsonl"
    capsys.readouterr()
    assert main(["replay", str(mixed), "--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert f"{mixed} line 6: not JSON" in err
    assert "line 7: topic: unknown topic or version 'gpu.samples.v9'" in err
    assert "line 8: slurm.jobs.v1: gpus_total: Input should be greater than or equal to 0" in err
    assert f"skipped {3 + len(raw)} bad lines" in err and "line 9" not in err
    assert lines(out) == good  # valid records come back byte for byte, with their keys


def test_strict_stops_at_the_first_bad_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = tmp_path / "sim.jsonl"
    simulate(src)
    first_bad = next(i for i, ln in enumerate(lines(src), 1) if b'"value_b64"' in ln)
    assert main(["replay", str(src), "--strict", "--out", str(tmp_path / "o.jsonl")]) == 2
    err = capsys.readouterr().err
    assert f"line {first_bad}: " in err and "(--strict)" in err
    assert len(lines(tmp_path / "o.jsonl")) == first_bad - 1


def test_keep_invalid_publishes_the_bytes_verbatim(tmp_path: Path) -> None:
    src = tmp_path / "sim.jsonl"
    simulate(src)
    out = tmp_path / "out.jsonl"
    assert main(["replay", str(src), "--keep-invalid", "--out", str(out)]) == 0
    assert sorted(lines(out)) == sorted(lines(src))


def test_speed_paces_by_event_time(tmp_path: Path) -> None:
    sample = one_of_each()["gpu.samples.v1"]
    src = tmp_path / "three.jsonl"
    with src.open("wb") as fh:
        for k in range(3):
            r = sample.model_copy(update={"time": sample.time.replace(second=10 * k)})
            fh.write(
                b'{"topic":"gpu.samples.v1","key":"prod/node001","value":' + encode(r) + b"}\n"
            )
    started = time.monotonic()
    assert main(["replay", str(src), "--speed", "20", "--out", str(tmp_path / "o.jsonl")]) == 0
    assert 0.9 < time.monotonic() - started < 10  # 20 s of event time at 20x


def test_missing_file_and_unknown_topic_are_clear(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["replay", str(tmp_path / "nope.jsonl"), "--out", "-"]) == 2
    assert "no such file" in capsys.readouterr().err
    assert main(["record", "gpu.samples.v7", "--out", str(tmp_path / "x.jsonl")]) == 2
    assert "unknown topic or version 'gpu.samples.v7'" in capsys.readouterr().err


def _per_key(path: Path) -> dict[tuple[str, str], list[bytes]]:
    order: dict[tuple[str, str], list[bytes]] = defaultdict(list)
    for ln in lines(path):
        env = json.loads(ln)
        order[env["topic"], env["key"]].append(ln)
    return order


async def _timestamps(kafka: KafkaSettings, prefix: str) -> list[tuple[int, int]]:
    """(Kafka timestamp, record event time) of every valid message on the three topics."""
    from aiokafka import AIOKafkaConsumer

    consumer = AIOKafkaConsumer(
        *[prefix + t for t in TOPICS],
        bootstrap_servers=kafka.bootstrap,
        auto_offset_reset="earliest",
    )
    await consumer.start()
    got: list[tuple[int, int]] = []
    try:
        idle = 0
        while idle < 4:
            batches = await consumer.getmany(timeout_ms=500)
            idle = 0 if batches else idle + 1
            for tp, msgs in batches.items():
                topic = by_name(tp.topic, prefix)
                for m in msgs:
                    try:
                        r = decode(topic, m.value)
                    except Exception:
                        continue
                    got.append((m.timestamp, int(r.time.timestamp() * 1000)))  # type: ignore[attr-defined]
    finally:
        await consumer.stop()
    return got


@pytest.mark.kafka
def test_round_trip_through_the_broker(
    kafka: KafkaSettings,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    first, second = kafka.topic_prefix, kafka.topic_prefix + "again."
    for prefix in (first, second):
        asyncio.run(create_topics(kafka.model_copy(update={"topic_prefix": prefix}), TOPICS, 2))
    monkeypatch.setenv("GPUGAP_KAFKA_BOOTSTRAP", kafka.bootstrap)
    monkeypatch.setenv("GPUGAP_KAFKA_TOPIC_PREFIX", first)
    expected, captured, again = (
        tmp_path / "sim.jsonl",
        tmp_path / "cap.jsonl",
        tmp_path / "again.jsonl",
    )
    simulate(expected)
    args = ["simulate", "--scenario", "small", "--duration", "15m", "--as-fast-as-possible"]
    assert main(args) == 0  # into Kafka this time
    assert main(["record", *TOPICS, "--out", str(captured), "--idle-timeout", "3"]) == 0
    # everything came back, malformed bytes included, in order per key
    assert Counter(lines(captured)) == Counter(lines(expected))
    assert _per_key(captured) == _per_key(expected)

    monkeypatch.setenv("GPUGAP_KAFKA_TOPIC_PREFIX", second)
    capsys.readouterr()
    assert main(["replay", str(captured), "--keep-invalid"]) == 0
    err = capsys.readouterr().err
    malformed = sum(b'"value_b64"' in ln for ln in lines(captured))
    assert f"skipped {malformed} bad lines, published {malformed} invalid verbatim" in err
    assert main(["record", *TOPICS, "--out", str(again), "--idle-timeout", "3"]) == 0
    assert _per_key(again) == _per_key(captured)
    stamps = asyncio.run(_timestamps(kafka, second))
    assert len(stamps) == len(lines(captured)) - malformed
    assert all(kafka_ts == event_ms for kafka_ts, event_ms in stamps)
