"""``python -m benchmarks worker --profile DIR``: where a worker's time goes, from py-spy.

py-spy (``pip install py-spy``; not a dependency) samples the worker process from outside
(``py-spy record --pid``, raw collapsed stacks); each sample is put in the first part of the
worker whose function is on its stack, in the order below (the output path before the Kafka
client it calls, and so on), and the shares are printed.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

#: (part, frames that put a sample in it), checked in this order
PARTS: list[tuple[str, tuple[str, ...]]] = [
    ("snapshot (state JSON + zlib)", ("snapshot (streams/shards.py",)),
    ("outputs (encode, publish)", ("publish (streams/join.py",)),
    ("core: close minutes (rows, idle)", ("close (streams/core.py",)),
    ("core: the rest (join, advance)", ("streams/process.py", "streams/core.py")),
    ("decode (codec, pydantic)", ("decode (schemas/codec.py",)),
    (
        "merge in event time, offsets, acks",
        tuple(
            f"{f} (streams/{m}.py"
            for f, m in (
                ("ingest", "join"),
                ("drain", "join"),
                ("frontier", "join"),
                ("resume_points", "join"),
                ("lowest_buffered", "join"),
                ("on_batch", "runtime"),
                ("_lagging", "runtime"),
                ("checkpoint", "runtime"),
            )
        ),
    ),
    ("Kafka client (fetch, produce)", ("aiokafka/", "groundfloor/kafka/publish.py")),
    ("Faust (streams, events)", ("faust/", "mode/")),
    ("asyncio event loop", ("asyncio/",)),
]


def _py_spy() -> str | None:
    beside = Path(sys.executable).parent / "py-spy"  # installed into the virtual environment
    return str(beside) if beside.exists() else shutil.which("py-spy")


def available() -> bool:
    return _py_spy() is not None


def attach(pid: int, out: Path) -> subprocess.Popen[bytes]:
    """Sample ``pid`` until it exits (``--gil``: only while it runs Python, not idle)."""
    cmd = [_py_spy() or "py-spy", "record", "--pid", str(pid), "--format", "raw", "-o", str(out)]
    return subprocess.Popen(
        [*cmd, "--rate", "200", "--nonblocking", "--gil"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def stop(spy: subprocess.Popen[bytes]) -> None:
    """End the recording (py-spy writes its file on SIGINT)."""
    spy.send_signal(signal.SIGINT)
    try:
        spy.wait(60)
    except subprocess.TimeoutExpired:
        spy.kill()
        spy.wait()


def summary(path: Path) -> list[tuple[str, float]]:
    """Share of the samples per part, largest first."""
    counts: Counter[str] = Counter()
    for line in path.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        if not stack or not n.isdigit():
            continue
        part = next((p for p, keys in PARTS if any(k in stack for k in keys)), "other")
        counts[part] += int(n)
    total = sum(counts.values()) or 1
    return [(p, c / total) for p, c in counts.most_common()]


def lines(path: Path, label: str) -> list[str]:
    if not path.exists():
        return [f"  (no profile of {label}: py-spy wrote nothing)"]
    return [f"  {label}: {share:5.1%}  {part}" for part, share in summary(path)]
