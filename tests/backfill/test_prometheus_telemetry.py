"""``gpugap backfill prometheus`` against a REAL Prometheus (harness/prometheus.py) holding the
recorded dcgm-exporter scrapes (tests/fixtures/dcgm/: 8x A100, MIG, pod labels in both
styles, hpc_job) as history: every scrape at every instant backfills into exactly the node
sample the live scraper makes of the same scrape. Chunked, in parallel, resumable."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpugap.groundfloor.kafka.publish import JsonlPublisher
from gpugap.groundfloor.settings import Settings
from gpugap.producers import run_producer
from gpugap.producers.backfill.settings import BackfillSettings
from gpugap.producers.backfill.telemetry import PrometheusTelemetry
from gpugap.producers.dcgm.parse import parse_scrape
from gpugap.schemas import NodeSample
from tests.backfill.history import Series, prometheus_with, read_jsonl
from tests.harness.prometheus import Prometheus

pytestmark = pytest.mark.timeout(1800)  # the first test may build Prometheus (about 8 min)

FIXTURES = Path(__file__).parents[1] / "fixtures" / "dcgm"
#: fixture -> the exporter's address (the node for a scrape without a Hostname label)
TARGETS = {
    "a100x8.txt": "dgx-a100-017:9400",
    "h100x2_mig.txt": "h100-mig-01:9400",
    "k8s_pods_new_labels.txt": "10.8.0.12:9400",
    "k8s_pods_old_labels.txt": "10.8.0.13:9400",
    "slurm_hpc_job.txt": "[fd00::21]:9400",  # no Hostname left: the node is the host
}
T0 = datetime(2026, 10, 20, 6, 0, tzinfo=UTC)
SCRAPES = 40  # 30 s apart: 20 minutes of history
STEP_MS = 30_000


def scrape_text(name: str, k: int) -> str:
    text = (FIXTURES / name).read_text()
    if name == "slurm_hpc_job.txt":
        text = text.replace(',Hostname="gpu-a40-021"', "")
    # the values move a little from scrape to scrape (otherwise any sample would do)
    return text.replace("} 0.951203\n", "} " + repr(0.95 - k / 1000) + "\n")


def history() -> Series:
    series = Series()
    for name, instance in TARGETS.items():
        for k in range(SCRAPES):
            t = int(T0.timestamp() * 1000) + k * STEP_MS + 137  # the scrape's offset
            for family in text_string_to_metric_families(scrape_text(name, k)):
                for s in family.samples:
                    labels = {**s.labels, "instance": instance, "job": "dcgm"}
                    # stored under the name the text format gave (the parser adds _total)
                    metric = family.name if family.type == "counter" else s.name
                    series.add(metric, labels, t, s.value)
    return series


def live(name: str, k: int) -> list[NodeSample]:
    """What ``gpugap produce dcgm`` makes of the same scrape."""
    host = TARGETS[name].rpartition(":")[0].strip("[]")
    t = T0 + timedelta(milliseconds=k * STEP_MS + 137)
    return parse_scrape(
        scrape_text(name, k), cluster="c1", default_node=host, time=t, interval_s=30.0
    )


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Prometheus]:
    with prometheus_with(history(), tmp_path_factory.mktemp("prom")) as prom:
        yield prom


def backfill(
    prom: Prometheus, out: Path, checkpoints: Path, *, restart: bool = False, **cfg: object
) -> PrometheusTelemetry:
    config = BackfillSettings(
        prometheus_url=prom.url,
        cluster="c1",
        checkpoint_dir=checkpoints,
        **{"chunk_s": 300, "concurrency": 3, "scrape_interval_s": 30.0, **cfg},
    )
    source = PrometheusTelemetry(
        Settings(),
        config,
        since=T0,
        until=T0 + timedelta(seconds=SCRAPES * 30),
        restart=restart,
    )
    asyncio.run(run_producer(source, JsonlPublisher(out)))
    return source


def test_history_backfills_into_the_live_scrapers_samples(
    prometheus: Prometheus, tmp_path: Path
) -> None:
    source = backfill(prometheus, tmp_path / "a.jsonl", tmp_path / "cp")
    got = [r for topic, r in read_jsonl(tmp_path / "a.jsonl") if topic == "gpu.samples.v1"]
    want = [s for k in range(SCRAPES) for name in TARGETS for s in live(name, k)]
    assert len(got) == len(want) == SCRAPES * len(TARGETS)
    key = lambda s: (s.time, s.node)  # noqa: E731
    assert sorted(got, key=key) == sorted(want, key=key)
    assert [s.time for s in got] == sorted(s.time for s in got)  # published in event time
    assert source.client.queries == 4  # 20 minutes in 5-minute chunks: one query each
    nodes = {s.node for s in got}
    assert "fd00::21" in nodes and "dgx-a100-017" in nodes  # instance's host; Hostname
    assert any(g.mig for s in got for g in s.gpus)
    assert any(g.attribution and g.attribution.pod for s in got for g in s.gpus)
    assert any(g.attribution and g.attribution.slurm_job_id for s in got for g in s.gpus)


def test_a_finished_range_publishes_nothing_again_and_restart_the_same(
    prometheus: Prometheus, tmp_path: Path
) -> None:
    first = backfill(prometheus, tmp_path / "a.jsonl", tmp_path / "cp")
    again = backfill(prometheus, tmp_path / "b.jsonl", tmp_path / "cp")
    assert first.published == SCRAPES * len(TARGETS) and again.published == 0
    assert not (tmp_path / "b.jsonl").read_text()
    backfill(prometheus, tmp_path / "c.jsonl", tmp_path / "cp", restart=True)
    assert (tmp_path / "c.jsonl").read_text() == (tmp_path / "a.jsonl").read_text()


def test_exported_pod_labels_are_the_workloads_and_the_exporters_own_are_not() -> None:
    from gpugap.producers.backfill.telemetry import workload_labels

    seen_through_a_service = {
        "pod": "dcgm-exporter-x7k2p",
        "namespace": "gpu-operator",
        "exported_pod": "jupyter-alice",
        "exported_namespace": "nb",
    }
    mine = workload_labels(seen_through_a_service)
    assert (mine["pod"], mine["namespace"], mine.get("container")) == ("jupyter-alice", "nb", None)
    nobody = {"pod": "nvidia-dcgm-exporter-abcde", "namespace": "gpu-operator", "gpu": "0"}
    assert workload_labels(nobody) == {"gpu": "0"}


def test_a_backfill_killed_halfway_resumes_where_it_stopped(
    prometheus: Prometheus, tmp_path: Path
) -> None:
    full = tmp_path / "full.jsonl"
    backfill(prometheus, full, tmp_path / "cp-full", chunk_s=60, concurrency=1)
    out, cp = tmp_path / "killed.jsonl", tmp_path / "cp"
    cmd = [
        sys.executable, "-m", "gpugap", "backfill", "prometheus",
        "--prometheus", prometheus.url, "--cluster", "c1", "--chunk", "60",
        "--concurrency", "1", "--checkpoint-dir", str(cp), "--out", str(out),
        "--since", T0.isoformat(), "--until", (T0 + timedelta(seconds=SCRAPES * 30)).isoformat(),
    ]  # fmt: skip
    env = {**os.environ, "GPUGAP_BACKFILL_SCRAPE_INTERVAL_S": "30"}
    proc = subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE, text=True)
    try:  # kill it (SIGKILL: no clean-up) once a few chunks are in the checkpoint
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            files = list(cp.glob("*.json"))
            if files and len(json.loads(files[0].read_text())["done"]) >= 5:
                break
            time.sleep(0.01)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait()
        assert proc.stderr is not None
        proc.stderr.close()
    done = len(json.loads(next(cp.glob("*.json")).read_text())["done"])
    assert 5 <= done < 20, "killed too late to show a resume"
    resumed = subprocess.run(cmd, check=False, env=env, capture_output=True, text=True, timeout=120)
    assert resumed.returncode == 0, resumed.stderr
    assert "resuming" in resumed.stderr and "ETA" in resumed.stderr
    # every sample once, except what the killed run published of the chunk it was in
    got = {(s.time, s.node) for _, s in read_jsonl(out)}
    want = [(s.time, s.node) for _, s in read_jsonl(full)]
    assert got == set(want)
    assert len(read_jsonl(out)) - len(want) <= 2 * len(TARGETS)  # at most that chunk again


def test_a_later_until_publishes_only_what_is_new(prometheus: Prometheus, tmp_path: Path) -> None:
    """``--until now`` moves on every run: the chunks done before are skipped all the same."""
    full = backfill(prometheus, tmp_path / "full.jsonl", tmp_path / "cp-full")
    config = BackfillSettings(
        prometheus_url=prometheus.url, cluster="c1", checkpoint_dir=tmp_path / "cp",
        chunk_s=300, scrape_interval_s=30.0,
    )  # fmt: skip
    parts = []
    for i, minutes in enumerate((7, 20)):  # the first run ends inside its second chunk
        until = T0 + timedelta(minutes=minutes)
        source = PrometheusTelemetry(Settings(), config, since=T0, until=until)
        asyncio.run(run_producer(source, JsonlPublisher(tmp_path / f"{i}.jsonl")))
        parts.append({(s.time, s.node) for _, s in read_jsonl(tmp_path / f"{i}.jsonl")})
    want = {(s.time, s.node) for _, s in read_jsonl(tmp_path / "full.jsonl")}
    assert parts[0] | parts[1] == want and full.published == len(want)
    assert len(parts[0] & parts[1]) <= 6 * len(TARGETS)  # only the first run's cut chunk again
    assert min(t for t, _ in parts[1]) >= T0 + timedelta(minutes=5)  # the first chunk: skipped
