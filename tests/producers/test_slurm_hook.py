"""The hook and the poller on recorded Slurm output, against a real Kafka broker: what they
send, what they spool, and that unreadable output becomes a dead letter and one log line."""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpugap.consume import DeadLetters
from gpugap.publish import KafkaPublisher
from gpugap.settings import KafkaSettings, Settings, SlurmSettings
from producers import run_producer
from producers.slurm import SlurmProducer
from producers.slurm_drain import drain_once
from producers.slurm_hook import run
from producers.slurmlib import spool
from producers.slurmlib.hook import HookConfig
from schemas.topics import DEAD_LETTER, SLURM_JOBS
from tests.conftest import read_topic

from .test_slurm_parse import FIX, env_file

pytestmark = pytest.mark.kafka


def replay(tmp_path: Path, fixture: str) -> str:
    """A stand-in for squeue/scontrol that prints what the real one printed (recorded)."""
    script = tmp_path / f"replay-{fixture}"
    script.write_text(f"#!/bin/sh\ncat {FIX / fixture}\n")
    script.chmod(0o755)
    return str(script)


def hook_env(kafka: KafkaSettings, tmp_path: Path, **extra: str) -> dict[str, str]:
    return {
        "GPUGAP_KAFKA_BOOTSTRAP": kafka.bootstrap,
        "GPUGAP_KAFKA_TOPIC_PREFIX": kafka.topic_prefix,
        "GPUGAP_SLURM_SPOOL_DIR": str(tmp_path / "spool"),
        "GPUGAP_SLURM_CLUSTER": "probe",
        **extra,
    }


def test_hook_config_reads_what_settings_read(monkeypatch: pytest.MonkeyPatch) -> None:
    """The hook reads the environment without pydantic: same names, same defaults."""
    for k in list(os.environ):
        if k.startswith("GPUGAP_"):
            monkeypatch.delenv(k)
    s, k, h = SlurmSettings(), KafkaSettings(), HookConfig(os.environ)
    assert (h.spool_dir, h.timeout_s, h.scontrol, h.end_hook) == (
        str(s.spool_dir),
        s.hook_timeout_s,
        s.scontrol,
        s.end_hook,
    )
    assert (h.bootstrap, h.topic_prefix, h.plaintext) == (k.bootstrap, k.topic_prefix, True)
    env = {
        "GPUGAP_SLURM_SPOOL_DIR": "/x",
        "GPUGAP_SLURM_HOOK_TIMEOUT_S": "0.5",
        "GPUGAP_SLURM_END_HOOK": "epilog",
        "GPUGAP_KAFKA_TOPIC_PREFIX": "p.",
    }
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    s, h = SlurmSettings(), HookConfig(os.environ)
    assert (str(h.spool_dir), h.timeout_s, h.end_hook) == (
        str(s.spool_dir),
        s.hook_timeout_s,
        s.end_hook,
    )


def test_jobcomp_hook_sends_the_end_and_ignores_other_contexts(
    kafka: KafkaSettings, tmp_path: Path
) -> None:
    env = {**env_file("env_jobcomp_failed.env"), **hook_env(kafka, tmp_path)}
    assert run(env) == "sent"
    assert run({**env_file("env_epilog_failed.env"), **hook_env(kafka, tmp_path)}) == "ignored"
    assert run({**env_file("env_prolog_slurmd.env"), **hook_env(kafka, tmp_path)}) == "ignored"
    (ev,) = asyncio.run(read_topic(kafka, SLURM_JOBS, 1, settle_s=1))
    assert (ev.event_id, ev.state, ev.exit_code, ev.source) == (
        "slurm/probe/7/end",
        "FAILED",
        3,
        "hook",
    )


def test_epilog_mode_reports_ends_from_the_epilog(kafka: KafkaSettings, tmp_path: Path) -> None:
    env = hook_env(kafka, tmp_path, GPUGAP_SLURM_END_HOOK="epilog")
    assert run({**env_file("env_epilog_failed.env"), **env}) == "sent"
    assert run({**env_file("env_jobcomp_failed.env"), **env}) == "sent"  # jobcomp still counts
    events = asyncio.run(read_topic(kafka, SLURM_JOBS, 2, settle_s=1))
    assert {(e.event_id, e.state.value, e.exit_code) for e in events} == {
        ("slurm/probe/7/end", "FAILED", 3)
    }


def test_unreachable_kafka_spools_then_drain_and_next_hook_ship(
    kafka: KafkaSettings, tmp_path: Path
) -> None:
    down = hook_env(kafka, tmp_path, GPUGAP_KAFKA_BOOTSTRAP="127.0.0.1:1")
    t0 = time.monotonic()
    for name in ("completed", "cancelled_running", "cancelled_pending", "timeout"):
        assert run({**env_file(f"env_jobcomp_{name}.env"), **down}) == "spooled"
    assert time.monotonic() - t0 < 1.0  # refused at once, nothing waits
    root = tmp_path / "spool"
    assert len(spool.pending(str(root))) == 4
    (root / "events" / "0000000000000-garbage.json").write_text("{not json")
    # Kafka back: the next hook ships its own event and the backlog; the drainer the rest
    assert run({**env_file("env_jobcomp_failed.env"), **hook_env(kafka, tmp_path)}) == "sent"
    assert [os.path.basename(p) for p in spool.pending(str(root))] == ["0000000000000-garbage.json"]

    async def drain() -> int:
        async with KafkaPublisher(kafka) as pub:
            return await drain_once(root, pub, DeadLetters(pub, "test", kafka.topic_prefix))

    assert asyncio.run(drain()) == 0 and not spool.pending(str(root))
    events = asyncio.run(read_topic(kafka, SLURM_JOBS, 5, settle_s=1))
    assert sorted(e.job_id for e in events) == ["13", "17", "7", "8", "9"]
    (dl,) = asyncio.run(read_topic(kafka, DEAD_LETTER, 1))
    assert dl.kind.value == "malformed" and base64.b64decode(dl.value_b64) == b"{not json"


def test_malformed_scontrol_in_the_prolog_dead_letters(
    kafka: KafkaSettings, tmp_path: Path
) -> None:
    env = {
        **env_file("env_prolog_2gpu.env"),
        **hook_env(
            kafka, tmp_path, GPUGAP_SLURM_SCONTROL=replay(tmp_path, "scontrol_malformed.txt")
        ),
        "SLURM_JOB_ID": "999",
    }
    assert run(env) == "sent"  # the dead letter went out; the job was not held up
    (dl,) = asyncio.run(read_topic(kafka, DEAD_LETTER, 1, settle_s=1))
    assert dl.consumer == "slurm-hook:scontrol" and "JobId" in dl.reason
    assert b"Socket timed out" in base64.b64decode(dl.value_b64)
    assert "no start event" in (tmp_path / "spool" / "hook.log").read_text()
    assert not list((tmp_path / "spool").glob("jobs/*"))


@pytest.mark.parametrize(
    ("fixture", "dead", "good"),
    [
        ("squeue_truncated.json", 1, 0),
        ("squeue_bad_jobs.json", 3, 1),
        ("squeue_no_jobs.json", 1, 0),
    ],
)
def test_malformed_squeue_dead_letters_and_the_poller_goes_on(  # noqa: PLR0917
    kafka: KafkaSettings,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    fixture: str,
    dead: int,
    good: int,
) -> None:
    s = SlurmSettings(
        cluster="probe",
        squeue=replay(tmp_path, fixture),
        scontrol=replay(tmp_path, "scontrol_all.txt"),
        drain_spool=False,
    )
    producer = SlurmProducer(Settings(kafka=kafka, slurm=s))
    with caplog.at_level(logging.WARNING, "producers.slurm"):
        asyncio.run(run_producer(producer, KafkaPublisher(kafka), once=True))
    letters = asyncio.run(read_topic(kafka, DEAD_LETTER, dead, settle_s=1))
    assert len(letters) == dead and all(d.consumer == "slurm-poller:squeue" for d in letters)
    lines = [r for r in caplog.records if "dead-lettered" in r.getMessage()]
    assert len(lines) == dead  # one log line per dead letter
    events = asyncio.run(read_topic(kafka, SLURM_JOBS, 1, settle_s=1))
    assert events  # the tick went on: the good jobs (or scontrol's view of them) are reported
    if good:
        assert {e.job_id for e in events} >= {"13"}


def test_cli_hook_is_fast_to_start(tmp_path: Path) -> None:
    """`gpugap slurm-hook` in a context it ignores: the interpreter plus the light imports only."""
    gpugap = Path(sys.executable).with_name("gpugap")
    env = {"PATH": "/usr/bin:/bin", "SLURM_SCRIPT_CONTEXT": "prolog_slurmd"}
    out = subprocess.run(
        [sys.executable, "-X", "importtime", str(gpugap), "slurm-hook"],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    loaded = {line.split("|")[-1].strip() for line in out.stderr.splitlines() if "|" in line}
    for heavy in ("pydantic", "aiokafka", "asyncio", "schemas", "gpugap.settings", "dataclasses"):
        assert heavy not in loaded, heavy
    assert json.dumps  # (the hook itself needs only the standard library)
