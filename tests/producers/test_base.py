"""The producer seam: --once, JSONL or Kafka output, clean shutdown with flush on signals."""

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

from gpugap import producers
from gpugap.cli import main
from gpugap.groundfloor.kafka.publish import JsonlPublisher, KafkaPublisher
from gpugap.groundfloor.plugin import Plugin
from gpugap.groundfloor.settings import KafkaSettings, Settings, load
from gpugap.producers import Producer, run_producer
from gpugap.schemas import NodeSample, Record, Topic, decode
from gpugap.schemas.errors import ConfigError
from gpugap.schemas.examples import node_samples
from gpugap.schemas.topics import SAMPLES
from tests.harness.topics import create_topics


class Ticker(Producer):
    """Emits the next two example samples each tick."""

    name = "ticker"
    interval_s = 0.05

    def __init__(self, settings: Settings) -> None:
        super().__init__(settings)
        self.source = node_samples(10_000, nodes=2)
        self.closed = False

    @classmethod
    def default_topic(cls) -> Topic[Any]:
        return SAMPLES

    async def poll(self) -> Iterable[Record]:
        return [next(self.source), next(self.source)]

    async def close(self) -> None:
        self.closed = True


def lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.parametrize("torn", [b"", b'{"topic":"gpu.samples.v1","key":"c1/n', b"x" * 200_000])
def test_appending_after_a_killed_run_cuts_off_its_half_written_line(
    tmp_path: Path, torn: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    out = tmp_path / "out.jsonl"
    asyncio.run(run_producer(Ticker(load()), JsonlPublisher(out), once=True))
    whole = out.read_bytes()
    out.write_bytes(whole + torn)  # what a SIGKILL mid-write leaves
    asyncio.run(run_producer(Ticker(load()), JsonlPublisher(out), once=True))
    rows = lines(out)  # every line parses
    assert len(rows) == 4 and out.read_bytes().startswith(whole)
    assert ("half-written" in caplog.text) == bool(torn)


def test_a_file_that_is_one_half_written_line_is_emptied(tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    out.write_bytes(b'{"topic":"gpu.samples')
    asyncio.run(run_producer(Ticker(load()), JsonlPublisher(out), once=True))
    assert len(lines(out)) == 2


def test_once_writes_one_tick_as_jsonl_in_the_replay_envelope(tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    p = Ticker(load())
    assert asyncio.run(run_producer(p, JsonlPublisher(out), once=True)) == 2
    assert p.ticks == 1 and p.closed
    rows = lines(out)
    assert [r["topic"] for r in rows] == ["gpu.samples.v1"] * 2
    assert [r["key"] for r in rows] == ["bench/node000", "bench/node001"]
    assert decode(SAMPLES, json.dumps(rows[0]["value"])) == next(node_samples(1, nodes=2))


TICKER = Plugin(
    name="ticker", help="two example samples a tick", extra="all", target=f"{__name__}:Ticker"
)


def test_cli_runs_a_registered_producer_once_to_stdout(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(producers.REGISTRY, "ticker", f"{__name__}:TICKER")
    assert main(["produce", "ticker", "--once", "--out", "-"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 2 and json.loads(out[1])["value"]["node"] == "node001"


def test_unknown_producer_is_a_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit:
        main(["produce", "nope", "--once"])
    assert exit.value.code == 2
    err = capsys.readouterr().err
    assert "invalid choice: 'nope'" in err and "nvml" in err  # the known ones are listed
    known = r"unknown producer 'nope' \(known: amd-exporter, amdsmi, dcgm, kubernetes"
    with pytest.raises(ConfigError, match=known):
        producers.plugin("nope")


def test_stop_ends_the_loop_and_everything_sent_is_flushed(tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"

    async def scenario() -> int:
        stop = asyncio.Event()
        asyncio.get_running_loop().call_later(0.3, stop.set)
        return await run_producer(Ticker(load()), JsonlPublisher(out), stop=stop)

    sent = asyncio.run(scenario())
    assert sent >= 4 and len(lines(out)) == sent


SIGNAL_SCRIPT = """
import asyncio, sys
from gpugap.groundfloor.kafka.publish import JsonlPublisher
from gpugap.groundfloor.settings import load
from gpugap.producers import run_producer
from tests.producers.test_base import Ticker
sent = asyncio.run(run_producer(Ticker(load()), JsonlPublisher(sys.argv[1])))
print("sent", sent, flush=True)
"""


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_shuts_down_cleanly_with_a_flush(tmp_path: Path, sig: signal.Signals) -> None:
    out = tmp_path / "out.jsonl"
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.Popen(
        [sys.executable, "-c", SIGNAL_SCRIPT, str(out)],
        cwd=root,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(root)},
    )
    try:
        deadline = time.monotonic() + 30
        # count finished lines only: the producer may be half-way through writing one
        while (not out.exists() or out.read_text().count("\n") < 4) and time.monotonic() < deadline:
            time.sleep(0.05)
        proc.send_signal(sig)
        stdout, stderr = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, stderr
    sent = int(stdout.split()[1])
    assert sent >= 4 and len(lines(out)) == sent


@pytest.mark.kafka
def test_kafka_output_is_keyed_per_the_topic_registry(kafka: KafkaSettings) -> None:
    async def scenario() -> list[tuple[bytes, NodeSample]]:
        from aiokafka import AIOKafkaConsumer

        await create_topics(kafka, [SAMPLES.name])
        await run_producer(Ticker(load()), KafkaPublisher(kafka), once=True)
        consumer = AIOKafkaConsumer(
            kafka.topic_prefix + SAMPLES.name,
            bootstrap_servers=kafka.bootstrap,
            auto_offset_reset="earliest",
        )
        await consumer.start()
        try:
            msgs = []
            async with asyncio.timeout(30):
                while len(msgs) < 2:
                    for batch in (await consumer.getmany(timeout_ms=500)).values():
                        msgs += [(m.key, decode(SAMPLES, m.value)) for m in batch]
            return msgs
        finally:
            await consumer.stop()

    got = asyncio.run(scenario())
    assert [k for k, _ in got] == [b"bench/node000", b"bench/node001"]
