"""``gpugap demo`` end to end on the embedded defaults: its own Kafka, its own ClickHouse
endpoint, the worker and the sink as processes, the scenario replayed; the report it prints
equals the scenario's ground truth, and nothing it started is left behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from gpugap.services.kafka import free_port

pytestmark = pytest.mark.kafka


def close(got: float, want: float) -> bool:
    """Within 0.01 %, beside the report's rounding to 4 decimals of a GPU-hour (0.36 s)."""
    return abs(got - want) <= 1e-4 * abs(want) + 0.5


def test_demo_report_equals_the_ground_truth_and_stops_everything(tmp_path: Path) -> None:
    truth, report = tmp_path / "truth.json", tmp_path / "report.json"
    data = tmp_path / "data"
    demo = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gpugap",
            "demo",
            "--scenario",
            "small",
            "--speed",
            "0",
            "--duration",
            "600",
            "--clickhouse-port",
            str(free_port()),
            "--truth",
            str(truth),
            "--save-report",
            str(report),
            "--data-dir",
            str(data),
        ],
        env={**os.environ, "GPUGAP_LOG_LEVEL": "WARNING", "PYTHONUNBUFFERED": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    out: list[str] = []
    try:
        assert demo.stdout is not None
        for line in demo.stdout:  # until it holds, waiting for Ctrl-C / --duration
            out.append(line)
            if "running for" in line and "(--duration)" in line:
                break
        # SIGTERM (a service manager, `kill`) stops everything it started, like Ctrl-C
        demo.send_signal(signal.SIGTERM)
        rest, _ = demo.communicate(timeout=120)
    finally:
        if demo.poll() is None:
            demo.kill()
    stdout = "".join(out) + rest
    assert demo.returncode == 0, stdout[-3000:]
    assert "Gap by class" in stdout and "ClickHouse answers at" in stdout
    assert "Against the scenario's ground truth" in stdout
    assert "stopped everything the demo started" in stdout
    assert "ERROR" not in stdout, stdout[-3000:]
    t, r = json.loads(truth.read_text()), json.loads(report.read_text())
    got = {row["key"]: row for row in r["breakdown"]}
    assert set(got) == set(t["by_class"])
    for cls, want in t["by_class"].items():
        assert close(got[cls]["allocated_gpu_h"] * 3600, want["allocated_gpu_s"]), (cls, got)
        assert close(got[cls]["consumed_gpu_h"] * 3600, want["consumed_gpu_s"]), (cls, got)
    # the queue section: the scenario's Slurm jobs waited (submitted before they started) and
    # each partition is replayed
    queue = r["queue"]
    assert "What padded limits cost the queue" in stdout
    assert any(row["scheduler"] == "slurm" and row["gpu_h_waited"] > 0 for row in queue["by_queue"])
    assert queue["partitions"], queue
    for p in queue["partitions"]:
        assert p["asked"]["jobs"] == p["jobs"] > 0 and p["measured_gpu_h_waited"] > 0, p
    # (the small day has too few jobs per family for the --time rule: the demo day's are
    # right-sized, tests/queue/test_demo_queue.py)
    # the demo's MIG GPUs (2 x 3g.40gb each) count one GPU of capacity, 1/7 of it never sliced
    assert t["estate"]["mig_devices"] > 0
    cap, totals = r["capacity"], t["totals"]
    assert close(cap["capacity_gpu_h"] * 3600, totals["capacity_gpu_s"]), (cap, totals)
    assert close(cap["unallocated_gpu_h"] * 3600, totals["unallocated_gpu_s"]), (cap, totals)
    assert not ours(str(data)), "the demo left processes behind"


def ours(marker: str) -> list[int]:
    """Processes whose command line or environment names the demo's data directory."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            text = (proc / "cmdline").read_bytes() + (proc / "environ").read_bytes()
        except OSError:
            continue
        if marker.encode() in text:
            found.append(int(proc.name))
    return found


def test_demo_bad_input_is_one_line_and_nonzero(tmp_path: Path) -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        for args, text in (
            (["--duration", "-3"], "--duration must be positive"),
            (["--speed", "-1"], "--speed must be >= 0"),
            (["--clickhouse-port", str(port), "--kafka", "127.0.0.1:1"], f"port {port} is"),
        ):
            done = subprocess.run(
                [sys.executable, "-m", "gpugap", "demo", *args],
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )
            assert done.returncode == 2, (args, done.stderr)
            lines = [x for x in done.stderr.splitlines() if x.strip()]
            assert len(lines) == 1 and text in lines[0], (args, done.stderr)
