"""``gpugap`` as a user runs it, in a child process: any command, and the stream worker until
it has read everything (what it said on stopping, parsed)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass

from gpugap.groundfloor.settings import KafkaSettings


def run_gpugap(
    args: list[str], env: dict[str, str], timeout: float = 180
) -> subprocess.CompletedProcess[str]:
    """``gpugap ARGS`` as a user runs it (a child process with ``env``); it must exit 0."""
    done = subprocess.run(
        [sys.executable, "-m", "gpugap", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done


@dataclass(frozen=True)
class WorkerRun:
    """What ``gpugap worker`` said on stopping: records read, records written per output
    topic, dead letters per kind (its last stderr line), and the whole stderr."""

    messages: int
    counts: dict[str, int]
    dead: dict[str, int]
    stderr: str


def run_worker(
    kafka: KafkaSettings,
    *args: str,
    env: dict[str, str] | None = None,
    idle_timeout_s: float = 3.0,
    timeout: float = 600,
) -> WorkerRun:
    """``gpugap worker`` as a site runs it, in a child process, until it has been idle for
    ``idle_timeout_s`` after flushing (events of any age: ``--backfill``)."""
    env = env or {
        **os.environ,
        "GPUGAP_KAFKA_BOOTSTRAP": kafka.bootstrap,
        "GPUGAP_KAFKA_TOPIC_PREFIX": kafka.topic_prefix,
        "GPUGAP_LOG_LEVEL": "WARNING",
    }
    flags = ["--http", "", "--idle-flush", "1", "--idle-timeout", str(idle_timeout_s)]
    done = run_gpugap(["worker", *flags, "--backfill", *args], env, timeout=timeout)
    summary = re.search(
        r"worker: ([\d,]+) messages .*? -> (.*); dead letters \{(.*)\}", done.stderr
    )
    assert summary is not None, done.stderr[-3000:]
    counts = re.findall(r"([\w.-]+): ([\d,]+)", summary[2])
    return WorkerRun(
        messages=int(summary[1].replace(",", "")),
        counts={k: int(v.replace(",", "")) for k, v in counts},
        dead={k: int(v) for k, v in re.findall(r"'(\w+)': (\d+)", summary[3])},
        stderr=done.stderr,
    )
