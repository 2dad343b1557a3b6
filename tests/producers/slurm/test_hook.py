"""The hook and the poller on recorded Slurm output, against a real Kafka broker: what they
send, what they spool, and that unreadable output becomes a dead letter and one log line."""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpugap.groundfloor.kafka.consume import DeadLetters
from gpugap.groundfloor.kafka.publish import KafkaPublisher
from gpugap.groundfloor.settings import KafkaSettings, Settings
from gpugap.producers import run_producer
from gpugap.producers.slurm import spool
from gpugap.producers.slurm.drain import drain_once
from gpugap.producers.slurm.hook import HookConfig
from gpugap.producers.slurm.hook_command import run
from gpugap.producers.slurm.producer import SlurmProducer
from gpugap.producers.slurm.settings import SlurmSettings
from gpugap.schemas.topics import DEAD_LETTER, SLURM_JOBS
from tests.harness.topics import read_topic
from tests.producers.slurm.test_parse import FIX, env_file

pytestmark = pytest.mark.kafka


def replay(tmp_path: Path, fixture: str) -> str:
    """A stand-in for squeue/scontrol that prints what the real one printed (recorded); asked
    for job ids (``squeue -o %A``), the ids of the jobs in scontrol_all.txt."""
    ids = tmp_path / "ids.txt"
    found = re.findall(r"^JobId=(\d+) ", (FIX / "scontrol_all.txt").read_text(), re.M)
    ids.write_text("\n".join(found) + "\n")
    script = tmp_path / f"replay-{fixture}"
    script.write_text(f'#!/bin/sh\ncase "$*" in *%A*) cat {ids};; *) cat {FIX / fixture};; esac\n')
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
    producer = SlurmProducer(Settings(kafka=kafka), s)
    with caplog.at_level(logging.WARNING, "gpugap.producers.slurm.producer"):
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
    for heavy in (
        "pydantic",
        "aiokafka",
        "asyncio",
        "gpugap.schemas",
        "gpugap.groundfloor.settings",
        "dataclasses",
    ):
        assert heavy not in loaded, heavy
    assert json.dumps  # (the hook itself needs only the standard library)


# --- hostile and undecodable input, bad config, the spool's permissions ------------------------
HOSTILE_NAME = (
    "x UserId=victim(2000) Account=victim-acct TRES=cpu=1,gres/gpu=16 NodeList=gpu[01-02]"
)


def test_prolog_reports_the_real_owner_of_a_job_named_like_fields(
    kafka: KafkaSettings, tmp_path: Path
) -> None:
    """Recorded on Slurm 22.05: the name says victim, 16 GPUs, gpu[01-02]; the job is root's,
    with 1 GPU on vm. The event says what the job is."""
    scontrol = replay(tmp_path, "scontrol_prolog_hostile_name.txt")
    env = {
        **env_file("env_prolog_hostile_name.env"),
        **hook_env(kafka, tmp_path, GPUGAP_SLURM_SCONTROL=scontrol),
    }
    assert run(env) == "sent"
    (ev,) = asyncio.run(read_topic(kafka, SLURM_JOBS, 1, settle_s=1))
    assert (ev.user, ev.account, ev.partition, ev.gpus_total) == ("root", "root", "debug", 1)
    assert [(n.node, n.gpu_indices) for n in ev.nodes] == [("vm", (0,))]
    assert ev.job_name == HOSTILE_NAME and ev.job_id == "11"


def test_undecodable_long_job_name_is_spooled_then_sent_replaced_and_cut(
    kafka: KafkaSettings, tmp_path: Path
) -> None:
    """os.environ gives bytes that are not UTF-8 as surrogates: the event is still spooled
    (Kafka down) and sent, with U+FFFD for them and the name cut at 256 characters."""
    name = "caf\udce9 \udcff" + "n" * 1000
    comp = {**env_file("env_jobcomp_failed.env"), "JOBNAME": name}
    assert run({**comp, **hook_env(kafka, tmp_path, GPUGAP_KAFKA_BOOTSTRAP="127.0.0.1:1")}) == (
        "spooled"
    )
    (path,) = spool.pending(str(tmp_path / "spool"))
    assert spool.read(path)["value"]["job_name"].startswith("caf\ufffd \ufffd")
    assert run({**comp, **hook_env(kafka, tmp_path)}) == "sent"  # ships the spooled one too
    events = asyncio.run(read_topic(kafka, SLURM_JOBS, 2, settle_s=1))
    assert {e.job_name for e in events} == {"caf\ufffd \ufffd" + "n" * 250}


def test_bad_config_is_one_log_line_exit_0_and_the_event_is_spooled(
    kafka: KafkaSettings, tmp_path: Path
) -> None:
    env = {
        **env_file("env_jobcomp_failed.env"),
        **hook_env(kafka, tmp_path, GPUGAP_SLURM_HOOK_TIMEOUT_S="2s"),
        "PYTHONPATH": str(Path(__file__).resolve().parents[3]),
    }
    out = subprocess.run(
        [sys.executable, "-S", "-m", "gpugap.producers.slurm.hook_command"],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    (line,) = out.stderr.splitlines()
    assert "GPUGAP_SLURM_HOOK_TIMEOUT_S='2s'" in line and "Traceback" not in out.stderr
    (path,) = spool.pending(str(tmp_path / "spool"))
    assert spool.read(path)["value"]["event_id"] == "slurm/probe/7/end"


def test_spool_is_private_to_the_slurm_user(kafka: KafkaSettings, tmp_path: Path) -> None:
    """Job names, users and accounts: the spool directory is 0700 and its files 0600."""
    down = hook_env(
        kafka,
        tmp_path,
        GPUGAP_KAFKA_BOOTSTRAP="127.0.0.1:1",
        GPUGAP_SLURM_SCONTROL=replay(tmp_path, "scontrol_prolog_hostile_name.txt"),
    )
    assert run({**env_file("env_prolog_hostile_name.env"), **down}) == "spooled"
    root = tmp_path / "spool"
    assert [p.name for p in (root / "jobs").iterdir()] == ["11.json"]  # the kept start event
    for d in (root, root / "events", root / "jobs"):
        assert d.stat().st_mode & 0o777 == 0o700, d
    files = [p for p in root.rglob("*") if p.is_file()]
    assert len(files) >= 3 and all(p.stat().st_mode & 0o777 == 0o600 for p in files), files


def test_drain_says_what_it_shipped_to_each_topic(
    kafka: KafkaSettings,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A prolog that could not read scontrol spools a dead letter where the start event would
    be: the drainer's count says which topic each shipped record went to."""
    from gpugap.producers.slurm.drain import main as drain_main

    down = hook_env(kafka, tmp_path, GPUGAP_KAFKA_BOOTSTRAP="127.0.0.1:1")
    bad = replay(tmp_path, "scontrol_malformed.txt")
    prolog = {**env_file("env_prolog_2gpu.env"), **down, "GPUGAP_SLURM_SCONTROL": bad}
    assert run(prolog) == "spooled"
    for name in ("completed", "failed"):
        assert run({**env_file(f"env_jobcomp_{name}.env"), **down}) == "spooled"
    monkeypatch.setenv("GPUGAP_KAFKA_BOOTSTRAP", kafka.bootstrap)
    monkeypatch.setenv("GPUGAP_KAFKA_TOPIC_PREFIX", kafka.topic_prefix)
    assert drain_main(["--spool-dir", str(tmp_path / "spool")]) == 0
    out = capsys.readouterr().out
    assert "shipped 3 spooled event(s)" in out, out
    assert "2 to slurm.jobs.v1, 1 to dead-letter.v1" in out, out
    assert len(asyncio.run(read_topic(kafka, SLURM_JOBS, 2, settle_s=1))) == 2
    (dl,) = asyncio.run(read_topic(kafka, DEAD_LETTER, 1))
    assert dl.consumer == "slurm-hook:scontrol"


def _fake_scontrol(tmp_path: Path, body: str) -> str:
    """An scontrol that logs its arguments (one call a line) and runs ``body``."""
    script = tmp_path / "scontrol"
    script.write_text(f'#!/bin/sh\necho "$*" >> {tmp_path / "calls"}\n{body}\n')
    script.chmod(0o755)
    return str(script)


def test_prolog_reads_scontrol_json_where_slurm_has_it(
    kafka: KafkaSettings, tmp_path: Path
) -> None:
    """Slurm 23.02 and later: ``scontrol --json -d show job``, where a name is a JSON string.
    (The document has the shapes of OpenAPI v0.0.39+, written for this test: the test
    Slurm is 22.05, whose scontrol has no --json.)"""
    t = 1796114537
    number = lambda n: {"set": True, "infinite": False, "number": n}  # noqa: E731
    doc = {
        "jobs": [
            {
                "job_id": 11,
                "name": HOSTILE_NAME,
                "user_name": "root",
                "account": "root",
                "partition": "debug",
                "qos": "normal",
                "job_state": ["CONFIGURING"],
                "exit_code": {"status": ["SUCCESS"], "return_code": number(0)},
                "time_limit": number(5),
                "submit_time": number(t),
                "start_time": number(t + 1),
                "end_time": number(t + 301),
                "nodes": "vm",
                "tres_alloc_str": "cpu=1,node=1,billing=1,gres/gpu=1",
                "gres_detail": ["gpu:1(IDX:2)"],
                "batch_flag": True,
            }
        ]
    }
    (tmp_path / "job.json").write_text(json.dumps(doc))
    body = f'case " $* " in *" --json "*) cat {tmp_path / "job.json"};; *) exit 1;; esac'
    env = {
        **env_file("env_prolog_hostile_name.env"),
        **hook_env(kafka, tmp_path, GPUGAP_SLURM_SCONTROL=_fake_scontrol(tmp_path, body)),
    }
    assert run(env) == "sent"
    (ev,) = asyncio.run(read_topic(kafka, SLURM_JOBS, 1, settle_s=1))
    assert (ev.user, ev.account, ev.gpus_total, ev.time_limit_s) == ("root", "root", 1, 300)
    assert [(n.node, n.gpu_indices) for n in ev.nodes] == [("vm", (2,))]
    assert ev.job_name == HOSTILE_NAME
    assert (tmp_path / "calls").read_text().splitlines() == ["--json -d show job 11"]


def test_prolog_asks_once_whether_scontrol_has_json(tmp_path: Path) -> None:
    """Slurm 22.05 refuses --json: the first prolog finds out, the next ones do not ask."""
    text = FIX / "scontrol_prolog_hostile_name.txt"
    body = (
        f'case " $* " in *" --json "*) echo "scontrol: unrecognized option \'--json\'" >&2; '
        f"exit 1;; *) cat {text};; esac"
    )
    env = {
        **env_file("env_prolog_hostile_name.env"),
        "GPUGAP_KAFKA_BOOTSTRAP": "127.0.0.1:1",
        "GPUGAP_SLURM_SPOOL_DIR": str(tmp_path / "spool"),
        "GPUGAP_SLURM_SCONTROL": _fake_scontrol(tmp_path, body),
    }
    assert run(env) == run(env) == "spooled"
    calls = (tmp_path / "calls").read_text().splitlines()
    assert calls == ["--json -d show job 11", "-o show job -d 11", "-o show job -d 11"]
    (start,) = [spool.read(p)["value"] for p in spool.pending(str(tmp_path / "spool"))]
    assert (start["user"], start["gpus_total"], start["job_name"]) == ("root", 1, HOSTILE_NAME)
