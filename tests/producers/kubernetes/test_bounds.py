"""One pod never silences the Kubernetes producer: values over the schema's bounds are
truncated with a marker, a pod that cannot be reported at all is one dead letter with its
reason, every other pod is published, and neither the list nor the watch loops on it.

Against the test API server (tests/harness/k8s_api.py), through the real kubernetes client."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpugap.schemas import DeadLetter, K8sPodEvent
from gpugap.schemas.types import DeadLetterKind
from tests.harness.k8s_api import ApiServer, FakeCluster
from tests.harness.k8s_run import Running, read_dead_letters

NS = "ml"
LONG = 5000  # over every Text bound of the schema (4096)


@pytest.fixture
def server() -> Iterator[ApiServer]:
    with ApiServer(FakeCluster()) as srv:
        yield srv


def pod(
    name: str,
    *,
    gpus: object = "1",
    node: str = "gpu-01",
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    owners: list[dict[str, Any]] | None = None,
    container: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A running pod holding ``gpus`` GPUs on ``node``."""
    at = "2026-11-02T08:30:00Z"
    meta: dict[str, Any] = {
        "name": name,
        "namespace": NS,
        "uid": f"uid-{name}",
        "labels": labels or {},
        "annotations": annotations or {},
    }
    if owners:
        meta["ownerReferences"] = owners
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": meta,
        "spec": {
            "nodeName": node,
            "restartPolicy": "Never",
            "containers": [
                container or {"name": "main", "resources": {"limits": {"nvidia.com/gpu": gpus}}}
            ],
        },
        "status": {
            "phase": "Running",
            "startTime": at,
            "conditions": [{"type": "PodScheduled", "status": "True", "lastTransitionTime": at}],
            "containerStatuses": [{"name": "main", "state": {"running": {"startedAt": at}}}],
        },
    }


def long_pod(name: str = "long") -> dict[str, Any]:
    """Every enrichment value over its bound: owner and team annotations, gang label, and a
    controller the producer does not resolve (so its kind and name come from the reference)."""
    ref = {"apiVersion": "example.com/v1", "kind": "K" * LONG, "name": "n" * LONG}
    return pod(
        name,
        annotations={"gpugap.io/owner": "o" * LONG, "gpugap.io/team": "t" * LONG},
        labels={"gpugap.io/gang": "g" * LONG, "gpugap.io/gang-size": "99999999999"},
        owners=[{**ref, "uid": "uid-owner", "controller": True}],
    )


def unpublishable() -> list[dict[str, Any]]:
    """Pods nothing can be truncated in: a GPU count no node has, a node name the schema
    refuses ('/' is a key separator), and a container whose resources are not an object."""
    return [
        pod("huge-gpus", gpus="100000"),
        pod("bad-node", node="gpu/01"),
        pod("broken", container={"name": "main", "resources": "lots"}),
    ]


def by_name(events: list[K8sPodEvent]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for e in events:
        out.setdefault(e.name, []).append(e.kind.value)
    return out


def limit(field: str) -> int:
    """The schema's bound on a K8sPodEvent string field."""
    from gpugap.producers.kubernetes.bounds import text_limit

    n = text_limit(K8sPodEvent, field)
    assert n is not None and n < LONG
    return n


def check_truncated(e: K8sPodEvent) -> None:
    from gpugap.producers.kubernetes.bounds import MARKER

    values = {
        "owner": ("o", e.owner),
        "team": ("t", e.team),
        "owner_kind": ("K", e.owner_kind),
        "owner_name": ("n", e.owner_name),
        "gang_id": ("g", e.gang_id),
    }
    for field, (char, value) in values.items():
        assert value is not None, field
        assert len(value) == limit(field), field
        assert MARKER in value and value.endswith("]"), field
        assert value.removeprefix(f"{NS}/").startswith(char * 1000), field
    assert e.gang_size is None  # 99,999,999,999 pods in one gang: not a gang size


def check_dead(dead: list[DeadLetter], want: dict[str, DeadLetterKind]) -> None:
    """One dead letter per pod in ``want``, of that kind, naming the pod, carrying it."""
    got = {}
    for d in dead:
        body = json.loads(base64.b64decode(d.value_b64))
        name = body["metadata"]["name"]
        assert name not in got, f"{name} dead-lettered twice"
        got[name] = d.kind
        assert f"{NS}/{name}" in d.reason
        assert d.source_topic == "k8s.pods.v1"
        assert d.consumer == "kubernetes-producer"
        assert d.key_b64 is not None
        assert base64.b64decode(d.key_b64) == f"test/uid-{name}".encode()
    assert got == want


UNPUBLISHABLE = {
    "huge-gpus": DeadLetterKind.REJECTED,
    "bad-node": DeadLetterKind.SCHEMA,
    "broken": DeadLetterKind.MALFORMED,
}


def test_a_5000_char_owner_annotation_is_truncated_and_every_pod_is_published(
    server: ApiServer, tmp_path: Path
) -> None:
    cluster = server.cluster
    for p in (pod("a"), long_pod(), pod("b")):
        cluster.add(p)

    async def go() -> list[K8sPodEvent]:
        async with Running(server, tmp_path / "out.jsonl") as run:
            await run.synced()
        return run.events()

    events = asyncio.run(go())
    assert by_name(events) == {n: ["bound", "running"] for n in ("a", "long", "b")}
    for e in events:
        if e.name == "long":
            check_truncated(e)
        else:
            assert (e.owner, e.team, e.gang_id) == (None, NS, None)
    assert read_dead_letters(tmp_path / "out.jsonl") == []
    assert len(cluster.lists()) == 1


def test_a_pod_that_cannot_be_published_is_one_dead_letter_and_never_a_relist_loop(
    server: ApiServer, tmp_path: Path
) -> None:
    cluster = server.cluster
    for p in (pod("a"), *unpublishable(), pod("b")):
        cluster.add(p)
    out = tmp_path / "out.jsonl"

    async def go() -> list[K8sPodEvent]:
        async with Running(server, out) as run:
            await run.synced()
            # the bad pods change; the producer keeps watching, and says nothing more of them
            for name in UNPUBLISHABLE:
                cluster.patch(NS, name, {"metadata": {"labels": {"touched": "yes"}}})
            cluster.add(pod("c"))
            await run.synced()
            await asyncio.sleep(0.5)  # time enough to loop, if it did
            assert run.task is not None and not run.task.done()
            assert run.producer.dead_letters == len(UNPUBLISHABLE)
        return run.events()

    events = asyncio.run(go())
    assert by_name(events) == {n: ["bound", "running"] for n in ("a", "b", "c")}
    check_dead(read_dead_letters(out), UNPUBLISHABLE)
    assert len(cluster.lists()) == 1
    assert len(cluster.watches()) == 1


def test_the_watch_truncates_and_dead_letters_the_same_way_without_reconnecting(
    server: ApiServer, tmp_path: Path
) -> None:
    cluster = server.cluster
    cluster.add(pod("a"))
    out = tmp_path / "out.jsonl"

    async def go() -> list[K8sPodEvent]:
        async with Running(server, out) as run:
            await run.synced()
            for p in (long_pod(), *unpublishable(), pod("b")):
                cluster.add(p)
            await run.synced()
            await asyncio.sleep(0.5)
            assert run.task is not None and not run.task.done()
        return run.events()

    events = asyncio.run(go())
    assert by_name(events) == {n: ["bound", "running"] for n in ("a", "long", "b")}
    check_truncated(next(e for e in events if e.name == "long"))
    check_dead(read_dead_letters(out), UNPUBLISHABLE)
    assert len(cluster.lists()) == 1
    assert len(cluster.watches()) == 1, "the watch went on, no reconnection"


def test_an_unreadable_watch_event_is_a_dead_letter_and_the_watch_goes_on(
    server: ApiServer, tmp_path: Path
) -> None:
    cluster = server.cluster
    cluster.add(pod("a"))
    out = tmp_path / "out.jsonl"
    garbage = b'{"metadata":{"name":"x",'  # the event line is cut off: not JSON

    async def go() -> list[K8sPodEvent]:
        async with Running(server, out) as run:
            await run.synced()
            cluster.apply_raw([("DELETED", NS, "x", garbage)])
            cluster.add(pod("b"))
            await run.synced()
        return run.events()

    events = asyncio.run(go())
    assert by_name(events) == {n: ["bound", "running"] for n in ("a", "b")}
    [dead] = read_dead_letters(out)
    assert dead.kind is DeadLetterKind.MALFORMED and "watch event" in dead.reason
    assert garbage in base64.b64decode(dead.value_b64)
    assert len(cluster.watches()) == 1 and len(cluster.lists()) == 1


# --- the pieces, without a server ---------------------------------------------------------
def test_truncation_keeps_short_values_and_marks_and_distinguishes_long_ones() -> None:
    from gpugap.producers.kubernetes.bounds import MARKER, truncate

    assert truncate("alice", 10) == "alice"
    assert truncate("x" * 10, 10) == "x" * 10
    a, b = truncate("x" * 100 + "a", 60), truncate("x" * 100 + "b", 60)
    assert len(a) == len(b) == 60 and MARKER in a and a != b  # same prefix, told apart


def test_owner_maps_are_cut_to_the_keys_the_rules_read() -> None:
    """An owner with 10,000 labels and a large last-applied annotation: the cache keeps only
    the keys that owner, team, class and gang rules read, and the pod's result is unchanged."""
    from gpugap.producers.kubernetes.owners import OwnerResolver, owner_map_keys
    from gpugap.producers.kubernetes.producer import make_enricher
    from gpugap.producers.kubernetes.resources import GpuRule
    from gpugap.producers.kubernetes.settings import KubernetesSettings

    labels = {f"noise-{i}": "v" for i in range(10_000)}
    labels |= {"team": "vision", "kueue.x-k8s.io/queue-name": "q", "gpugap.io/owner": "bob"}
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": "web",
            "labels": labels,
            "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "{}" * 100_000},
        },
        "spec": {},
    }
    k8s = KubernetesSettings()
    rule = GpuRule(k8s.gpu_resources, k8s.gpu_resource_prefixes)
    resolver = OwnerResolver(lambda *_: deployment, rule, keys=owner_map_keys(k8s))
    p = pod("p", owners=[{"apiVersion": "apps/v1", "kind": "Deployment", "name": "web"}])
    [owner] = resolver.chain(NS, p["metadata"])
    assert dict(owner.labels) == {
        "team": "vision",
        "kueue.x-k8s.io/queue-name": "q",
        "gpugap.io/owner": "bob",
    }
    assert dict(owner.annotations) == {}
    full = make_enricher(k8s, OwnerResolver(lambda *_: deployment, rule))(p)
    assert make_enricher(k8s, resolver)(p) == full
    assert (full.owner, full.team, full.workload_class) == ("bob", "vision", "service")


def test_recorded_owners_give_the_same_result_through_the_cut_maps() -> None:
    from gpugap.producers.kubernetes.owners import Fetch, OwnerResolver, owner_map_keys
    from gpugap.producers.kubernetes.producer import make_enricher
    from gpugap.producers.kubernetes.resources import GpuRule
    from gpugap.producers.kubernetes.settings import KubernetesSettings
    from tests.harness.k8s_api import PLURALS, Scenario, scenarios

    def fetcher(sc: Scenario) -> Fetch:
        objects = {(PLURALS[o["kind"]], o["metadata"]["name"]): o for o in sc.owners}
        return lambda _g, _v, _ns, plural, name: objects.get((plural, name))

    k8s = KubernetesSettings()
    rule = GpuRule(k8s.gpu_resources, k8s.gpu_resource_prefixes)
    for name in scenarios():
        sc = Scenario.load(name)
        fetch = fetcher(sc)
        cut = make_enricher(k8s, OwnerResolver(fetch, rule, keys=owner_map_keys(k8s)))
        full = make_enricher(k8s, OwnerResolver(fetch, rule))
        for key, p in sc.pods.items():
            assert cut(p) == full(p), (name, key)


def test_a_pod_with_more_containers_than_the_bound_is_one_dead_letter() -> None:
    from gpugap.producers.kubernetes.resources import MAX_CONTAINERS, GpuRule
    from gpugap.producers.kubernetes.tracker import Enrichment, Tracker

    t = Tracker("test", GpuRule(["nvidia.com/gpu"], []), lambda _: Enrichment())
    many = pod("many")
    many["spec"]["containers"] *= MAX_CONTAINERS + 1
    assert t.observe("ADDED", many) == []
    assert t.observe("MODIFIED", many) == []
    [dead] = t.take_dead()
    assert dead.kind is DeadLetterKind.REJECTED and "containers" in dead.reason
    assert t.observe("ADDED", pod("fine"))  # the next pod is not affected
    assert t.observe("DELETED", many) == [] and "uid-many" not in t.pods


def test_a_reported_pod_whose_next_version_is_unreadable_still_gets_its_running_and_end() -> None:
    """Bound and reported; one later version cannot be read (a dead letter, nothing of it
    emitted or taken as sent); the next readable version and the deletion are reported."""
    from gpugap.producers.kubernetes.resources import GpuRule
    from gpugap.producers.kubernetes.tracker import Enrichment, Tracker

    t = Tracker("test", GpuRule(["nvidia.com/gpu"], []), lambda _: Enrichment())
    pending = pod("p")
    pending["status"] = {**pending["status"], "phase": "Pending", "containerStatuses": []}
    garbled = pod("p")
    garbled["status"]["containerStatuses"] = "garbled"
    kinds = [[e.kind.value for e in t.observe(kind, p)] for kind, p in [
        ("ADDED", pending), ("MODIFIED", garbled), ("MODIFIED", pod("p")), ("DELETED", pod("p")),
    ]]  # fmt: skip
    assert kinds == [["bound"], [], ["running"], ["deleted"]]
    [dead] = t.take_dead()
    assert dead.kind is DeadLetterKind.MALFORMED and "ml/p" in dead.reason
    assert t.pods == {}


def test_the_labels_the_idle_rules_read_are_carried_bounded_to_the_allocation() -> None:
    """GPUGAP_K8S_CARRY_LABELS (default gpugap.io/*): those labels ride on the pod's records
    and its allocation events, at most 32, sorted; others and oversized ones stay behind."""
    from gpugap.producers.kubernetes.owners import OwnerResolver
    from gpugap.producers.kubernetes.producer import make_enricher
    from gpugap.producers.kubernetes.resources import GpuRule
    from gpugap.producers.kubernetes.settings import KubernetesSettings
    from gpugap.producers.kubernetes.tracker import Tracker
    from gpugap.streams.allocate import from_pod

    labels = {f"gpugap.io/l{i:02d}": f"v{i}" for i in range(40)}
    labels |= {"app": "web", "gpugap.io/idle": "relaxed", "gpugap.io/big": "x" * 300}
    k8s = KubernetesSettings()
    rule = GpuRule(k8s.gpu_resources, k8s.gpu_resource_prefixes)
    t = Tracker("test", rule, make_enricher(k8s, OwnerResolver(lambda *_: None, rule)))
    events = t.observe("ADDED", pod("p", labels=labels))
    assert events
    carried = events[0].labels
    assert len(carried) == 32 and "app" not in carried and "gpugap.io/big" not in carried
    assert list(carried) == sorted(carried) and carried["gpugap.io/idle"] == "relaxed"
    [alloc] = from_pod(events[-1])
    assert alloc.labels == carried
    none = KubernetesSettings(carry_labels=[])
    bare = Tracker("test", rule, make_enricher(none, OwnerResolver(lambda *_: None, rule)))
    assert bare.observe("ADDED", pod("q", labels=labels))[0].labels == {}
