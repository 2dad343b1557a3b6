"""The backfill's plan and its answers to bad input: chunks aligned and bounded, checkpoints
that are not this backfill's refused, every wrong setting one clear line (exit 2), and a job
that sacct counted without indices allocated as stand-in GPUs, split over its nodes."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest
from pydantic import ValidationError

from gpugap.producers.backfill.plan import Checkpoint, Progress, chunks
from gpugap.producers.backfill.settings import BackfillSettings
from gpugap.schemas import NodeGpus, SlurmJobEvent
from gpugap.schemas.errors import ConfigError
from gpugap.services.kafka import free_port
from gpugap.streams.allocate import from_slurm

H = 3_600_000


def test_chunks_are_aligned_to_the_chunk_length_and_cover_the_range_once() -> None:
    assert chunks(H + 5, 3 * H + 7, H) == [(H + 5, 2 * H), (2 * H, 3 * H), (3 * H, 3 * H + 7)]
    assert chunks(0, H, H) == [(0, H)]
    with pytest.raises(ConfigError, match="--since must be before --until"):
        chunks(H, H, H)


def test_a_chunk_over_the_point_limit_is_refused_with_what_to_change() -> None:
    with pytest.raises(ValidationError, match="more than points_per_series 10000: a shorter"):
        BackfillSettings(chunk_s=86_400, scrape_interval_s=5)
    with pytest.raises(ValidationError, match="less than or equal to 11000"):
        BackfillSettings(points_per_series=20_000)
    assert BackfillSettings(chunk_s=86_400, scrape_interval_s=10).chunk_s == 86_400


def test_checkpoints_resume_and_refuse_what_is_not_theirs(tmp_path: Path) -> None:
    key = {"source": "prometheus", "cluster": "c", "chunk_s": "3600"}
    cp = Checkpoint.open(tmp_path, key, restart=False)
    cp.mark((0, H), 10)
    again = Checkpoint.open(tmp_path, key, restart=False)
    assert (again.done, again.records) == ({(0, H)}, 10)
    assert Checkpoint.open(tmp_path, key, restart=True).done == set()
    cp.path.write_text("{not json")
    with pytest.raises(ConfigError, match=r"unreadable .*remove it or --restart"):
        Checkpoint.open(tmp_path, key, restart=False)
    cp.path.write_text(json.dumps({"key": {**key, "cluster": "other"}, "done": [[0, H]]}))
    with pytest.raises(ConfigError, match="another backfill's"):
        Checkpoint.open(tmp_path, key, restart=False)


def test_progress_says_rate_and_eta(tmp_path: Path) -> None:
    import io

    out = io.StringIO()
    p = Progress("prometheus", 4, 4 * H, out=out)
    p.skip((0, H))
    p.advance((H, 2 * H), 100)
    line = p.line(p.started + 2.0)
    assert line.startswith("backfill prometheus: 1/3 chunks 33.3% | 0.04 d of 0.12 d | 100 ")
    assert "records 50/s" in line and "ETA 0m04s" in line


def gpugap(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpugap", "backfill", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["prometheus", "--since", "yesterday"], "--since 'yesterday' is not a time"),
        (["prometheus", "--since", "-1h", "--until", "-2h"], "--since must be before --until"),
        (["prometheus", "--since", "-1h"], "no Prometheus: --prometheus URL"),
        (["kubernetes", "--since", "-1h", "--chunk", "10"], "CHUNK_S: Input should be greater"),
        (
            ["prometheus", "--since", "-1h", "--prometheus", f"http://127.0.0.1:{free_port()}"],
            "backfill: http://127.0.0.1",
        ),
        (["slurm", "--since", "-1h", "--sacct", "/nonexistent/sacct"], "sacct failed"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args: list[str], says: str, tmp_path: Path) -> None:
    done = gpugap(*args, "--checkpoint-dir", str(tmp_path), "--out", str(tmp_path / "o.jsonl"))
    assert done.returncode == 2, done.stderr
    errors = [x for x in done.stderr.splitlines() if x.startswith("gpugap: error")]
    assert len(errors) == 1 and says in done.stderr, done.stderr


def test_a_job_sacct_counted_without_indices_holds_stand_in_gpus_on_its_nodes() -> None:
    t = datetime(2026, 10, 1, tzinfo=UTC)
    ev = SlurmJobEvent(
        event_id="slurm/c/7/start", kind="start", time=t, source="poller", cluster="c",
        job_id="7", nodes=(NodeGpus(node="a"), NodeGpus(node="b")), gpus_total=3,
        start_time=t, state="RUNNING",
    )  # fmt: skip
    got = [(a.node, a.gpus, a.gpu_indices, a.event_id) for a in from_slurm(ev)]
    assert got == [("a", 2, None, "slurm/c/7/start/a"), ("b", 1, None, "slurm/c/7/start/b")]
    no_gpus = ev.model_copy(update={"gpus_total": 0})
    assert from_slurm(no_gpus) == []
    known = ev.model_copy(
        update={"nodes": (NodeGpus(node="a", gpu_indices=(0, 1)), NodeGpus(node="b"))}
    )
    assert [(a.node, a.gpu_indices) for a in from_slurm(known)] == [("a", (0, 1))]
