"""``gpugap notify``: the real command over a real broker. A notifier killed (SIGKILL) in the
middle of an episode and started again loses no open or resolve and tells nobody twice; each
target has its own consumer group; the configuration errors are one line."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest

from gpugap.cli import main
from gpugap.groundfloor.kafka.publish import KafkaPublisher
from gpugap.groundfloor.settings import KafkaSettings
from gpugap.schemas import Alert
from gpugap.schemas.examples import one_of_each
from gpugap.schemas.models import IdlePolicy
from gpugap.schemas.topics import ALERTS, DELIVERIES
from gpugap.schemas.types import AlertState, DeliveryOutcome, WorkloadClass
from tests.harness.topics import read_topic

pytestmark = pytest.mark.kafka
ROOT = Path(__file__).resolve().parents[2]


def alert(aid: str, state: str, minutes: int) -> Alert:
    base = one_of_each()["alerts.v1"]
    assert isinstance(base, Alert)
    return base.model_copy(
        update={
            "alert_id": aid,
            "state": AlertState(state),
            "time": base.opened_at + timedelta(minutes=minutes),
            "owner": f"owner-{aid}",
            "idle_minutes": minutes,
        }
    )


def publish(kafka: KafkaSettings, records: list[Alert]) -> None:
    async def go() -> None:
        async with KafkaPublisher(kafka) as pub:
            for r in records:
                await pub.send(ALERTS, r)

    asyncio.run(go())


class Notifier:
    """``gpugap notify console`` as its own process; its stdout collected line by line."""

    def __init__(self, kafka: KafkaSettings, out: Path, **extra: str) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("GPUGAP_")}
        env |= extra
        env |= {
            "GPUGAP_KAFKA_BOOTSTRAP": kafka.bootstrap,
            "GPUGAP_KAFKA_TOPIC_PREFIX": kafka.topic_prefix,
            "PYTHONUNBUFFERED": "1",
        }
        self.out = out
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gpugap", "notify", "console"],
            cwd=ROOT,
            env=env,
            stdout=out.open("ab"),
            stderr=subprocess.PIPE,
        )

    def lines(self) -> list[str]:
        return [x for x in self.out.read_text().splitlines() if x.startswith("[alert]")]

    def wait_for(self, n: int, timeout_s: float = 60.0) -> list[str]:
        deadline = time.monotonic() + timeout_s
        while len(self.lines()) < n:
            if self.proc.poll() is not None:
                assert self.proc.stderr is not None
                raise AssertionError(f"notify exited: {self.proc.stderr.read().decode()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"{len(self.lines())} of {n} lines: {self.lines()}")
            time.sleep(0.2)
        return self.lines()

    def stop(self, sig: signal.Signals = signal.SIGTERM) -> int:
        self.proc.send_signal(sig)
        code = self.proc.wait(30)
        if self.proc.stderr is not None:
            self.proc.stderr.close()
        return code


def test_killed_mid_episode_and_restarted_nothing_lost_nothing_twice(
    kafka: KafkaSettings, tmp_path: Path
) -> None:
    out = tmp_path / "console.txt"
    publish(kafka, [alert("a1", "open", 10), alert("a2", "open", 10), alert("a1", "update", 15)])
    first = Notifier(kafka, out)
    try:
        lines = first.wait_for(2)
        # the deliveries are on the ledger before the offsets: let them land, then kill -9
        asyncio.run(read_topic(kafka, DELIVERIES, 2))
    finally:
        first.stop(signal.SIGKILL)
    # Kafka may deliver the same records again: the open of a1 repeated, then the resolves
    again = [alert("a1", "open", 10), alert("a1", "resolved", 20), alert("a2", "resolved", 30)]
    publish(kafka, again)
    second = Notifier(kafka, out)
    try:
        lines = second.wait_for(4)
        time.sleep(3)  # anything extra would show up by now
        lines = second.lines()
    finally:
        assert second.stop() == 0
    assert len(lines) == 4, "\n".join(x[:60] for x in lines)
    assert sum("owner-a1" in x for x in lines) == 2 and sum("owner-a2" in x for x in lines) == 2
    assert sum(x.startswith("[alert] Resolved") for x in lines) == 2
    deliveries = asyncio.run(read_topic(kafka, DELIVERIES, 4, settle_s=1.0))
    keys = sorted((d.alert_id, d.state.value) for d in deliveries)
    assert keys == [("a1", "open"), ("a1", "resolved"), ("a2", "open"), ("a2", "resolved")]
    assert {d.outcome for d in deliveries} == {DeliveryOutcome.DELIVERED}
    assert {d.target for d in deliveries} == {"console"}


def test_reminders_once_per_mark_and_only_the_latest_after_an_outage(
    kafka: KafkaSettings, tmp_path: Path
) -> None:
    """GPUGAP_IDLE_REMIND_MINUTES=15,30 (interactive: 20): an update past a mark reminds once;
    one that jumps past two marks reminds once; nothing after the resolve. An alert whose
    policy a rule set (Alert.policy, from the stream) reminds at the rule's marks."""
    out = tmp_path / "console.txt"
    ruled = alert("r1", "open", 10).model_copy(
        update={"policy": IdlePolicy(threshold=0.05, minutes=10, remind_minutes=(25,), rule="r")}
    )
    batch = alert("b1", "open", 10).model_copy(update={"workload_class": WorkloadClass.BATCH})
    notebook = alert("n1", "open", 10).model_copy(
        update={"workload_class": WorkloadClass.INTERACTIVE}
    )

    def step(a: Alert, state: str, minutes: int) -> Alert:
        return a.model_copy(
            update={
                "state": AlertState(state),
                "idle_minutes": minutes,
                "time": a.opened_at + timedelta(minutes=minutes),
            }
        )

    publish(
        kafka,
        [
            batch,
            notebook,
            ruled,
            step(ruled, "update", 16),  # the rule's mark is 25, not the class's 15
            step(batch, "update", 12),  # no mark yet
            step(batch, "update", 16),  # 15: remind
            step(notebook, "update", 16),  # interactive's first mark is 20
            step(batch, "update", 21),
            step(batch, "update", 16),  # re-delivered: already reminded
            step(notebook, "update", 40),  # past 20 (and 15, 30 are not its marks): once
            step(ruled, "update", 26),  # past the rule's 25
            step(batch, "update", 45),  # past 30: remind
            step(batch, "resolved", 50),
            step(batch, "update", 60),  # after the resolve: nothing
        ],
    )
    notifier = Notifier(
        kafka,
        out,
        GPUGAP_IDLE_REMIND_MINUTES="15,30",
        GPUGAP_IDLE_CLASS_REMIND_MINUTES='{"interactive": [20]}',
    )
    try:
        notifier.wait_for(8)
        time.sleep(3)
        lines = notifier.lines()
    finally:
        assert notifier.stop() == 0
    heads = [x.split(" — ")[0] for x in lines]
    assert heads == [
        "[alert] GPUs idle: owner-b1 on prod",
        "[alert] GPUs idle: owner-n1 on prod",
        "[alert] GPUs idle: owner-r1 on prod",
        "[alert] Still, after 16 min: GPUs idle: owner-b1 on prod",
        "[alert] Still, after 40 min: GPUs idle: owner-n1 on prod",
        "[alert] Still, after 26 min: GPUs idle: owner-r1 on prod",
        "[alert] Still, after 45 min: GPUs idle: owner-b1 on prod",
        "[alert] Resolved: GPUs idle: owner-b1 on prod",
    ], heads
    deliveries = asyncio.run(read_topic(kafka, DELIVERIES, 8, settle_s=1.0))
    marks = sorted((d.alert_id, d.state.value, d.reminder_minutes) for d in deliveries)
    assert marks == [
        ("b1", "open", None),
        ("b1", "resolved", None),
        ("b1", "update", 15),
        ("b1", "update", 30),
        ("n1", "open", None),
        ("n1", "update", 20),
        ("r1", "open", None),
        ("r1", "update", 25),
    ]


def test_configuration_errors_are_one_line(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("GPUGAP_NOTIFY_TARGETS", raising=False)
    assert main(["notify"]) == 2
    assert "name the alert targets" in capsys.readouterr().err
    assert main(["notify", "clickhouse"]) == 2
    assert "not alert targets: clickhouse" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["sink", "slack"])  # alert targets are not listed as sinks
