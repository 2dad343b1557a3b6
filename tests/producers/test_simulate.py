"""The simulator: deterministic, its ground truth agrees with an independent reading of the
events it emits, every pattern shows up, and its fast encoder is byte-identical to the codec."""

from __future__ import annotations

import asyncio
import base64
import json
import statistics
from collections import Counter, defaultdict
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from gpugap.cli import main
from gpugap.groundfloor.kafka.publish import JsonlPublisher
from gpugap.groundfloor.settings import load
from gpugap.producers.base import run_producer
from gpugap.schemas import GpuSample, decode, encode
from gpugap.schemas.errors import ConfigError, InvalidRecord
from gpugap.schemas.shares import mig_share
from gpugap.schemas.topics import K8S_PODS, NODE_CAPACITY, SAMPLES, SLURM_JOBS, by_name
from gpugap.simulator import build
from gpugap.simulator import scenario as scenarios
from gpugap.simulator.simulator import Simulator
from gpugap.simulator.truth import compute
from gpugap.simulator.wire import gpu_json

TOPICS = {t.name: t for t in (SAMPLES, SLURM_JOBS, K8S_PODS)}


def simulate(tmp: Path, scenario: str, **kw: Any) -> tuple[Path, dict[str, Any]]:
    out = tmp / f"{scenario}.jsonl"
    truth = tmp / f"{scenario}.truth.json"
    sim = Simulator(load(), scenario, speed=None, truth=truth, **kw)
    asyncio.run(run_producer(sim, JsonlPublisher(out)))
    return out, json.loads(truth.read_text())


# --- an independent reading of the events -------------------------------------------------


def ts(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


class Reference:
    """Allocated and consumed GPU-seconds from the emitted records alone, with plain code:
    dedupe by event id / (node, time), allocations from scheduler events, consumption by
    time-weighting each sample's activity over (t - interval, t] inside the window, owned by
    the pod its attribution names, the Slurm job holding its index, or nobody. GPU-seconds are
    GPU-equivalents: a MIG slice counts its share of its GPU (a pod's from its
    ``nvidia.com/mig-<profile>`` resource, a sample's from its ``mig.profile``), and capacity
    counts physical GPUs."""

    def __init__(self, path: Path, window: dict[str, Any]) -> None:
        self.w0, self.w1 = ts(window["start"]), ts(window["end"])
        self.lines = 0
        self.malformed = 0
        self.events: dict[str, dict[str, Any]] = {}
        self.event_bytes: dict[str, set[bytes]] = defaultdict(set)
        self.samples: dict[tuple[str, str, str], dict[str, Any]] = {}
        self.sample_bytes: dict[tuple[str, str, str], set[bytes]] = defaultdict(set)
        self.out_of_order: Counter[str] = Counter()
        self.polls = 0
        self.models: dict[tuple[str, str], str] = {}
        last: dict[str, float] = defaultdict(float)
        with path.open("rb") as fh:
            for line in fh:
                self.lines += 1
                env = json.loads(line)
                topic = env["topic"]
                if "value_b64" in env:
                    with pytest.raises(InvalidRecord):
                        decode(TOPICS[topic], base64.b64decode(env["value_b64"]))
                    self.malformed += 1
                    continue
                raw = line[line.index(b',"value":') + 9 : -2]
                v = env["value"]
                t = ts(v["time"])
                if t < last[topic]:
                    self.out_of_order[topic] += 1
                last[topic] = max(last[topic], t)
                if topic == SAMPLES.name:
                    for g in v["gpus"]:
                        self.models[v["cluster"], v["node"]] = g["model"]
                    k = (v["cluster"], v["node"], v["time"])
                    self.samples[k] = v
                    self.sample_bytes[k].add(raw)
                elif topic == NODE_CAPACITY.name:  # tests/simulator/test_stranded.py
                    self.polls += 1
                else:
                    self.events[v["event_id"]] = v
                    self.event_bytes[v["event_id"]].add(raw)
        self._allocations()

    def _allocations(self) -> None:
        self.allocs: dict[str, dict[str, Any]] = {}
        self.pod_by_name: dict[tuple[str, str, str], str] = {}
        self.jobs_on: dict[tuple[str, str, int], list[str]] = defaultdict(list)
        for e in sorted(self.events.values(), key=lambda e: e["time"]):
            if "job_id" in e:
                aid = f"slurm/{e['cluster']}/{e['job_id']}"
                a = self.allocs.setdefault(aid, {"end": None})
                a.update(
                    start=ts(e["start_time"]),
                    gpus=e["gpus_total"],
                    cls="interactive" if e["interactive"] else "batch",
                    team=e["account"],
                    cluster=e["cluster"],
                    scheduler="slurm",
                )
                if e["kind"] == "end":
                    a["end"] = ts(e["end_time"])
                for n in e["nodes"]:
                    for i in n["gpu_indices"]:
                        if aid not in self.jobs_on[e["cluster"], n["node"], i]:
                            self.jobs_on[e["cluster"], n["node"], i].append(aid)
            else:
                aid = f"k8s/{e['cluster']}/{e['uid']}"
                if e["kind"] == "bound":
                    a = self.allocs.setdefault(aid, {"end": None})
                    resource = e.get("gpu_resource") or ""
                    share = 1.0
                    if resource.startswith("nvidia.com/mig-"):
                        model = self.models[e["cluster"], e["node"]]
                        share = mig_share(resource.removeprefix("nvidia.com/mig-"), model) or 1.0
                    a.update(
                        start=ts(e["time"]),
                        gpus=e["gpus"] * share,
                        cls=e["workload_class"],
                        team=e["team"],
                        cluster=e["cluster"],
                        scheduler="kubernetes",
                    )
                    self.pod_by_name[e["cluster"], e["namespace"], e["name"]] = aid
                elif e["kind"] in ("terminated", "deleted") and aid in self.allocs:
                    end = self.allocs[aid]["end"]
                    self.allocs[aid]["end"] = (
                        ts(e["time"]) if end is None else min(end, ts(e["time"]))
                    )
        for a in self.allocs.values():
            s, e = max(a["start"], self.w0), min(a["end"] or self.w1, self.w1)
            a["allocated"] = a["gpus"] * max(0.0, e - s)
            a["consumed"] = 0.0

    def consume(self) -> tuple[float, Counter[str]]:
        """Unattributed GPU-seconds, and physical GPUs per cluster."""
        unattributed = 0.0
        devices: Counter[str] = Counter()
        seen = set()
        for (cluster, node, _), v in self.samples.items():
            t, dt = ts(v["time"]), v["interval_s"]
            overlap = min(t, self.w1) - max(t - dt, self.w0)
            for g in v["gpus"]:
                mig = g.get("mig")
                physical = mig["parent_uuid"] if mig else g["uuid"]
                if physical not in seen:
                    seen.add(physical)
                    devices[cluster] += 1
                share = (mig_share(mig["profile"], g["model"]) or 1.0) if mig else 1.0
                a = g["activity"] * share
                if overlap <= 0 or not a:
                    continue
                owner = None
                if "attribution" in g:
                    at = g["attribution"]
                    owner = self.pod_by_name[cluster, at["namespace"], at["pod"]]
                else:
                    mid = t - dt / 2
                    for aid in self.jobs_on.get((cluster, node, g["index"]), ()):
                        job = self.allocs[aid]
                        if job["start"] <= mid < (job["end"] or float("inf")):
                            owner = aid
                if owner is None:
                    unattributed += a * overlap
                else:
                    self.allocs[owner]["consumed"] += a * overlap
        return unattributed, devices


def close(a: float, b: float) -> bool:
    return abs(a - b) <= max(1e-4 * max(abs(a), abs(b)), 1e-6)  # within 0.01 %


def check_against_truth(path: Path, truth: dict[str, Any]) -> Reference:
    ref = Reference(path, truth["window"])
    unattributed, devices = ref.consume()
    window = truth["window"]["duration_s"]
    mine = {k: a for k, a in ref.allocs.items() if a["allocated"] > 0}
    theirs = {a["id"]: a for a in truth["allocations"]}
    assert sorted(mine) == sorted(theirs)
    for aid, a in mine.items():
        t = theirs[aid]
        assert close(a["allocated"], t["allocated_gpu_s"]), (aid, a, t)
        assert close(a["consumed"], t["consumed_gpu_s"]), (aid, a, t)
    for dim, key in (
        ("by_class", "cls"),
        ("by_team", "team"),
        ("by_scheduler", "scheduler"),
        ("by_cluster", "cluster"),
    ):
        sums: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
        for a in mine.values():
            sums[a[key]][0] += a["allocated"]
            sums[a[key]][1] += a["consumed"]
        assert sorted(sums) == sorted(truth[dim])
        for k, (alloc, cons) in sums.items():
            assert close(alloc, truth[dim][k]["allocated_gpu_s"]), (dim, k)
            assert close(cons, truth[dim][k]["consumed_gpu_s"]), (dim, k)
    capacity = sum(devices.values()) * window
    allocated = sum(a["allocated"] for a in mine.values())
    assert close(capacity - allocated, truth["totals"]["unallocated_gpu_s"])
    assert close(unattributed, truth["totals"]["unattributed_consumed_gpu_s"])
    assert unattributed > 0
    return ref


def test_small_events_reproduce_the_ground_truth(tmp_path: Path) -> None:
    out, truth = simulate(tmp_path, "small")
    ref = check_against_truth(out, truth)
    assert ref.malformed == sum(truth["emitted"]["malformed"].values()) > 0


@pytest.fixture(scope="module")
def demo6(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    """The first 6 hours of the demo day (the whole day is 4x the bytes, same code paths)."""
    return simulate(tmp_path_factory.mktemp("demo"), "demo", duration=6 * 3600)


def test_demo_events_reproduce_the_ground_truth(demo6: tuple[Path, dict[str, Any]]) -> None:
    out, truth = demo6
    ref = check_against_truth(out, truth)
    emitted = truth["emitted"]
    # faults: exact duplicates, late delivery, malformed bytes, as the truth counts them
    dup_events = [k for k, raws in ref.event_bytes.items() if len(raws) == 1]
    assert len(dup_events) == len(ref.events)  # a duplicate is byte-identical
    assert sum(emitted["duplicates"].values()) > 10
    total = sum(emitted["records"].values())
    assert ref.lines == total + ref.malformed
    assert len(ref.samples) + len(ref.events) < total  # duplicates were delivered
    assert ref.out_of_order[SAMPLES.name] > 0 and ref.out_of_order[SLURM_JOBS.name] > 0
    assert ref.malformed == sum(emitted["malformed"].values()) > 0
    variants = {k.split(":")[1] for k in emitted["malformed"]}
    assert {"truncated", "not_json", "naive_time", "out_of_range"} <= variants
    # MIG slices are sampled with their parent, and pods are attributed on them
    mig = [g for v in ref.samples.values() for g in v["gpus"] if "mig" in g]
    assert mig and any("attribution" in g for g in mig)
    assert all(g["activity_metric"] == "sm_active" for g in mig)


def test_fast_encoder_is_byte_identical_to_the_codec(demo6: tuple[Path, dict[str, Any]]) -> None:
    out, _ = demo6
    checked = 0
    with out.open("rb") as fh:
        for i, line in enumerate(fh):
            if i % 7 or not line.startswith(b'{"topic":"gpu.samples.v1","key"'):
                continue
            if b'"value_b64"' in line:
                continue
            raw = line[line.index(b',"value":') + 9 : -2]
            assert encode(decode(SAMPLES, raw)) == raw
            checked += 1
    assert checked > 5000
    # and every value the encoder can produce, on every kind of device
    plan = build(scenarios.load("demo"), 600)
    kinds = {(d.metric, d.is_mig): d for d in plan.estate.devices()}
    holding = next(h for d in plan.estate.devices() for h in d.timeline if h.attribution)
    for d in kinds.values():
        for a in range(0, 1001, d.quantum):
            for h in (None, holding):
                fast = gpu_json(d, h, a)
                assert encode(GpuSample.model_validate_json(fast)) == fast


def test_same_seed_same_bytes_other_seed_other_bytes(tmp_path: Path) -> None:
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    for d, seed in ((a, 1), (b, 1), (c, 2)):
        d.mkdir()
        code = main(
            [
                "simulate",
                "--scenario",
                "small",
                "--seed",
                str(seed),
                "--as-fast-as-possible",
                "--out",
                str(d / "e.jsonl"),
            ]
        )
        assert code == 0
    assert (a / "e.jsonl").read_bytes() == (b / "e.jsonl").read_bytes()
    assert (a / "e.truth.json").read_bytes() == (b / "e.truth.json").read_bytes()
    assert (a / "e.jsonl").read_bytes() != (c / "e.jsonl").read_bytes()


def test_a_shorter_window_is_a_prefix_of_the_plan() -> None:
    sc = scenarios.load("demo")
    day, morning = compute(sc, build(sc), 86400), compute(sc, build(sc, 3 * 3600), 3 * 3600)
    starts = {a["id"]: a["start"] for a in day["allocations"]}
    assert all(starts[a["id"]] == a["start"] for a in morning["allocations"])


@pytest.fixture(scope="module")
def demo_day() -> dict[str, Any]:
    sc = scenarios.load("demo")
    return compute(sc, build(sc), sc.scenario.duration)


def test_every_pattern_shows_up_in_the_demo_truth(demo_day: dict[str, Any]) -> None:
    t = demo_day
    allocs = t["allocations"]
    by_pattern: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for a in allocs:
        by_pattern[a["pattern"]].append(a)
    idle_by_alloc: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for ep in t["idle_episodes"]:
        idle_by_alloc[ep["allocation_id"]].append(ep)
    assert t["estate"]["nodes"] == 36
    # Slurm multi-node training: several nodes, idle checkpoint/barrier phases on all GPUs
    training = by_pattern["slurm_training"]
    assert training and all(len(a["nodes"]) >= 2 for a in training)
    assert any(len(ep["gpus"]) >= 16 for a in training for ep in idle_by_alloc[a["id"]])
    # over-request: ask 8, use 2 -> six GPUs idle for (nearly) the whole job
    for a in by_pattern["slurm_overrequest"]:
        assert a["gpus"] == 8 and a["consumed_gpu_s"] < 0.25 * a["allocated_gpu_s"]
        assert max(len(ep["gpus"]) for ep in idle_by_alloc[a["id"]]) >= 6
    # padded limits, and jobs that failed, were cancelled, timed out
    pad = t["time_limit_padding"]
    assert pad["median_ratio"] > 2
    assert {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"} <= {j["state"] for j in pad["jobs"]}
    assert all(j["ratio"] == 1 for j in pad["jobs"] if j["state"] == "TIMEOUT")
    # salloc sessions: interactive class
    assert by_pattern["slurm_interactive"]
    assert all(
        a["interactive"] and a["workload_class"] == "interactive"
        for a in by_pattern["slurm_interactive"]
    )
    # sweeps: Slurm job arrays and Kubernetes trial Jobs
    arrays = {a["job_id"].split("_")[0] for a in by_pattern["slurm_array"]}
    assert len(arrays) >= 3 and len(by_pattern["k8s_sweep"]) >= 10
    # inference sized for peak: a service class that uses a fraction of what it holds
    inference = by_pattern["k8s_inference"]
    assert inference and all(a["workload_class"] == "service" for a in inference)
    assert (
        t["by_pattern"]["k8s_inference"]["consumed_gpu_s"]
        < 0.5 * t["by_pattern"]["k8s_inference"]["allocated_gpu_s"]
    )
    # notebooks: held all day, idle most of it; some on MIG slices
    notebooks = by_pattern["k8s_notebook"]
    assert max(a["idle_gpu_s"] / a["allocated_gpu_s"] for a in notebooks) > 0.8
    assert statistics.median(a["idle_gpu_s"] / a["allocated_gpu_s"] for a in notebooks) > 0.8
    assert any(a["gpu_resource"].startswith("nvidia.com/mig-") for a in notebooks)
    assert t["estate"]["mig_devices"] > 0
    # batch Jobs
    assert len(by_pattern["k8s_job"]) >= 20
    # partial gangs: 3 of 4 bound and idle while one is Pending; both endings
    gangs = t["partial_gangs"]
    assert gangs and all(g["running_pods"] == 3 and g["pending_pods"] == 1 for g in gangs)
    assert {g["outcome"] for g in gangs} >= {"all_bound", "deleted"}
    gang_allocs = {a["id"] for a in by_pattern["k8s_gang"]}
    assert any(ep["allocation_id"] in gang_allocs for ep in t["idle_episodes"])
    # GPUs nobody holds, and a little unattributed use
    assert t["estate"]["never_held"] and t["totals"]["unallocated_gpu_s"] > 0
    assert 0 < t["totals"]["unattributed_consumed_gpu_s"] < 0.01 * t["totals"]["consumed_gpu_s"]
    assert t["unattributed"]


def test_speed_paces_event_time_against_the_wall(tmp_path: Path) -> None:
    import time

    sim = Simulator(load(), "small", duration=60, speed=60.0)
    started = time.monotonic()
    asyncio.run(run_producer(sim, JsonlPublisher(tmp_path / "e.jsonl")))
    assert 0.8 < time.monotonic() - started < 10


@pytest.mark.parametrize(
    ("patch", "message"),
    [
        (("gpus = 8\n", 'gpus = "eight"\n'), "clusters.0.node_groups.0.gpus"),
        (("count = 3\ngpus = [1, 2]", "count = 3\ngpu = [1, 2]"), "gpu: unknown key"),
        (('kind = "k8s_job"', 'kind = "k8s_jobs"'), "clusters.1.workloads.2"),
        (('duration = "1h"', 'duration = "an hour"'), "scenario.duration: not a duration"),
        (('group = "l40s"\nreplicas', 'group = "v100"\nreplicas'), "no node group 'v100'"),
        (('kind = "unattributed"', 'kind = "k8s_job"'), "workloads.5.kind: k8s_job needs a kube"),
        (("08:00:00Z", "08:00:30Z"), "scenario.start: must be on a whole minute"),
    ],
)
def test_bad_scenarios_name_the_key(tmp_path: Path, patch: tuple[str, str], message: str) -> None:
    text = (Path(scenarios.__file__).parent / "scenarios" / "small.toml").read_text()
    assert patch[0] in text
    bad = tmp_path / "bad.toml"
    bad.write_text(text.replace(patch[0], patch[1], 1))
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        scenarios.load(bad)


def test_unknown_scenario_and_yaml(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--scenario", "nope", "--out", str(tmp_path / "x.jsonl")]) == 2
    assert "shipped: demo, scale, small" in capsys.readouterr().err
    import tomllib

    import yaml

    data = tomllib.loads((Path(scenarios.__file__).parent / "scenarios" / "small.toml").read_text())
    (tmp_path / "small.yaml").write_text(yaml.safe_dump(data))
    assert scenarios.load(tmp_path / "small.yaml") == scenarios.load("small")


def test_scale_is_ten_thousand_gpus() -> None:
    plan = build(scenarios.load("scale"), 600)
    gpus = {d.parent_uuid or d.uuid for d in plan.estate.devices()}
    assert len(gpus) == 10_000
    assert by_name("gpu.samples.v1") is SAMPLES
