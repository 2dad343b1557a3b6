"""The worker processes a benchmark starts (``gpugap worker``, the Faust pass-through): the
engines it may ask for, their ``/metrics``, their CPU time, and stopping them. Shared by
benchmarks/worker.py, worker_latency.py, worker_scale.py and fuzz.py; imports none of them."""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import urllib.request
from collections.abc import Sequence
from pathlib import Path

#: ``gpugap worker --engine``: the Faust app, the only engine (the asyncio one was removed)
ENGINES = ("faust",)


def engines(text: str) -> list[str]:
    """``--engines faust``: comma-separated, each one of ``ENGINES``."""
    out = [e.strip() for e in text.split(",") if e.strip()]
    bad = [e for e in out if e not in ENGINES]
    if bad or not out:
        raise argparse.ArgumentTypeError(
            f"engines: {', '.join(ENGINES)} (the asyncio engine was removed), not {text!r}"
        )
    return out


def metrics(port: int) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        text = r.read().decode()
    out = {}
    for line in text.splitlines():
        name, _, value = line.rpartition(" ")
        if name:
            out[name] = float(value)
    return out


def cpu_seconds(pid: int) -> float:
    """CPU time a process has used (user + system, all its threads)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def stop(procs: Sequence[subprocess.Popen[bytes]]) -> None:
    """SIGTERM all, then wait for each (SIGKILL after 30 s); their stderr pipes closed."""
    for p in procs:
        p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
        if p.stderr is not None:
            p.stderr.close()
