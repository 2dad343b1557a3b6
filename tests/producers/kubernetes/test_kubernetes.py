"""The Kubernetes producer end to end: the real kubernetes client, over HTTP, against a test
API server that speaks the wire protocol, driven by recorded scenarios (tests/fixtures/k8s)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpugap.schemas import K8sPodEvent, to_utc
from tests.harness.k8s_api import ApiServer, FakeCluster, Scenario, scenarios
from tests.harness.k8s_run import Running

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture
def server() -> Iterator[ApiServer]:
    with ApiServer(FakeCluster()) as srv:
        yield srv


def check(scenario: Scenario, events: list[K8sPodEvent]) -> None:
    """The events are exactly the expected sequence, with the expected fields."""
    by_uid = {scenario.uid(k): k for k in scenario.pods}
    got = [(by_uid.get(e.uid, e.uid), e.kind.value) for e in events]
    want = [(x["pod"], x["kind"]) for x in scenario.expected]
    assert got == want
    for e, x in zip(events, scenario.expected, strict=True):
        key = x["pod"]
        assert e.event_id == f"k8s/test/{e.uid}/{e.kind.value}"
        assert (e.cluster, e.namespace, e.name) == (
            "test",
            scenario.namespace,
            scenario.pod_name(key),
        )
        assert e.time == to_utc_str(x["time"]), (key, e.kind)
        assert (e.reason.value if e.reason else None) == x.get("reason"), (key, e.kind)
        if "node" in x:
            assert e.node == x["node"]
        if "phase" in x:
            assert e.phase.value == x["phase"]
        fields = {k: getattr(e, k) for k in scenario.fields(key)}
        fields = {k: v.value if hasattr(v, "value") else v for k, v in fields.items()}
        assert fields == scenario.fields(key), (key, e.kind)
    assert len({e.event_id for e in events}) == len(events), "an event was emitted twice"


def to_utc_str(text: str) -> Any:
    from datetime import datetime

    return to_utc(datetime.fromisoformat(text))


async def play(server: ApiServer, scenario: Scenario, out: Path, **k8s: Any) -> list[K8sPodEvent]:
    scenario.setup(server.cluster)
    async with Running(server, out, **k8s) as run:
        await run.synced()
        for step in scenario.steps:
            scenario.apply(server.cluster, step)
        await run.synced()
    return run.events()


@pytest.mark.parametrize("name", scenarios())
def test_scenario_yields_the_expected_events_exactly(
    name: str, server: ApiServer, tmp_path: Path
) -> None:
    scenario = Scenario.load(name)
    events = asyncio.run(play(server, scenario, tmp_path / "out.jsonl"))
    check(scenario, events)
    # owners were resolved over HTTP, each object once (the cache)
    gets = [r.path for r in server.cluster.requests if r.path.startswith("/apis/")]
    assert sorted(gets) == sorted(set(gets))
    assert len(gets) == len(scenario.owners)


def test_namespaced_watch_sees_only_its_namespace(server: ApiServer, tmp_path: Path) -> None:
    a, b = Scenario.load("notebook"), Scenario.load("cronjob-oom-retry")
    a.setup(server.cluster)
    b.setup(server.cluster)

    async def go() -> list[K8sPodEvent]:
        async with Running(server, tmp_path / "out.jsonl", namespaces=[a.namespace]) as run:
            await run.synced(namespace=a.namespace)
            for step in a.steps:
                a.apply(server.cluster, step)
            for step in b.steps:
                b.apply(server.cluster, step)
            await run.synced(namespace=a.namespace)
        return run.events()

    check(a, asyncio.run(go()))
    paths = {r.path for r in server.cluster.requests if r.path.endswith("/pods")}
    assert paths == {f"/api/v1/namespaces/{a.namespace}/pods"}


def test_once_lists_publishes_and_exits(server: ApiServer, tmp_path: Path) -> None:
    scenario = Scenario.load("inference-deployment")
    scenario.setup(server.cluster)

    async def go() -> list[K8sPodEvent]:
        async with Running(server, tmp_path / "out.jsonl", once=True) as run:
            assert run.task is not None
            await asyncio.wait_for(run.task, 20)
        return run.events()

    events = asyncio.run(go())
    assert [(e.name, e.kind.value) for e in events] == [
        ("llm-serve-7d9c6b5f4d-x2v9q", "bound"),
        ("llm-serve-7d9c6b5f4d-x2v9q", "running"),
    ]
    assert not server.cluster.watches()


# wrong credentials (401 from a real apiserver): tests/producers/kubernetes/test_real.py


def test_cli_produce_kubernetes_once_with_namespace_and_kubeconfig(
    server: ApiServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gpugap.cli import main
    from tests.harness.k8s_run import read_events

    for name in ("notebook", "eviction"):
        Scenario.load(name).setup(server.cluster)
    monkeypatch.setenv("GPUGAP_K8S_NAMESPACES", "nowhere")  # the option wins
    monkeypatch.setenv("GPUGAP_CLUSTER", "east")
    kubeconfig = server.kubeconfig(tmp_path / "kubeconfig")
    out = tmp_path / "out.jsonl"
    argv = ["produce", "kubernetes", "--once", "--out", str(out)]
    assert main([*argv, "--namespace", "vision", "--kubeconfig", str(kubeconfig)]) == 0
    events = read_events(out)
    assert [(e.cluster, e.namespace, e.name, e.kind.value) for e in events] == [
        ("east", "vision", "triton-0", "bound"),
        ("east", "vision", "triton-0", "running"),
    ]
    assert {r.path for r in server.cluster.lists()} == {"/api/v1/namespaces/vision/pods"}


def test_cli_without_a_kubeconfig_is_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from gpugap.cli import main

    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "missing"))
    monkeypatch.setenv("HOME", str(tmp_path))
    assert main(["produce", "kubernetes", "--once", "--out", str(tmp_path / "o.jsonl")]) == 2
    assert "no usable Kubernetes configuration" in capsys.readouterr().err


def test_benchmark_runs_end_to_end_on_a_small_cluster() -> None:
    """`python -m benchmarks kubernetes`'s load and measure (harness/k8s_load.py; here 300 pods, a
    100-event burst): every expected event out; and the command itself prints its figures."""
    from tests.harness.k8s_load import measure

    got = measure(300, 100)
    assert got["list_events"] == 2 * 240  # 80% of the pods request GPUs: bound + running each
    assert got["burst_events"] == 2 * 20 + 25 + 20  # new (GPU ones x2), completed, deleted
    # owners of pods 0-299: 2 Deployments (+ their ReplicaSets), 3 Jobs, 1 PyTorchJob; the
    # burst's new pods belong to one more Job: each fetched once
    assert got["owner_gets"] == 2 * 2 + 3 + 1 + 1
    # the command, as a child (tests import nothing from benchmarks/)
    cmd = ["-m", "benchmarks.kubernetes", "--pods", "300", "--burst", "100", "--repeats", "1"]
    done = subprocess.run(
        [sys.executable, *cmd], cwd=ROOT, capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "events/s" in done.stdout
