"""Run the Kubernetes producer (the real client, over HTTP) against a FakeCluster in tests."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from types import TracebackType
from typing import Any

from gpugap.groundfloor.kafka.publish import JsonlPublisher, Publisher
from gpugap.groundfloor.settings import Settings
from gpugap.producers import run_producer
from gpugap.producers.kubernetes.producer import KubernetesProducer
from gpugap.producers.kubernetes.settings import KubernetesSettings
from gpugap.schemas import DeadLetter, K8sPodEvent, decode
from gpugap.schemas.topics import DEAD_LETTER, K8S_PODS
from tests.harness.k8s_api import ApiServer, FakeCluster


def settings_for(kubeconfig: Path, **k8s: Any) -> tuple[Settings, KubernetesSettings]:
    opts: dict[str, Any] = {
        "kubeconfig": kubeconfig,
        "request_timeout_s": 5.0,
        "connect_timeout_s": 2.0,
        "watch_timeout_s": 30,
        "backoff_initial_s": 0.05,
        "backoff_max_s": 0.5,
        **k8s,
    }
    return Settings(cluster="test"), KubernetesSettings(**opts)


def _read(path: Path, topic: str) -> list[bytes]:
    if not path.exists():
        return []
    lines = (json.loads(line) for line in path.read_text().splitlines())
    return [json.dumps(doc["value"]).encode() for doc in lines if doc["topic"] == topic]


def read_events(path: Path) -> list[K8sPodEvent]:
    """The pod events a JSONL run published (dead letters share the file)."""
    return [decode(K8S_PODS, value) for value in _read(path, K8S_PODS.name)]


def read_dead_letters(path: Path) -> list[DeadLetter]:
    return [decode(DEAD_LETTER, value) for value in _read(path, DEAD_LETTER.name)]


class Running:
    """``async with Running(server, out, tmp) as run:`` a producer publishing JSONL to ``out``;
    ``await run.synced()`` waits until everything up to the cluster's current resourceVersion
    is published and flushed; leaving the block stops it (and re-raises what it raised)."""

    def __init__(
        self,
        server: ApiServer,
        out: Path,
        *,
        publisher: Publisher | None = None,
        once: bool = False,
        **k8s: Any,
    ) -> None:
        self.server, self.cluster, self.out = server, server.cluster, out
        kubeconfig = server.kubeconfig(out.with_suffix(".kubeconfig"))
        self.producer = KubernetesProducer(*settings_for(kubeconfig, **k8s))
        self.publisher = publisher or JsonlPublisher(out)
        self.once = once
        self.stop = asyncio.Event()
        self.task: asyncio.Task[int] | None = None

    async def __aenter__(self) -> Running:
        self.task = asyncio.create_task(
            run_producer(self.producer, self.publisher, once=self.once, stop=self.stop)
        )
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop.set()
        assert self.task is not None
        await asyncio.wait_for(self.task, 30)

    async def synced(self, timeout: float = 20.0, namespace: str = "") -> None:
        deadline = time.monotonic() + timeout
        while True:
            assert self.task is not None
            if self.task.done():
                self.task.result()  # raises the producer's error
                raise AssertionError("the producer stopped before it synced")
            rv = self.producer.synced_rv.get(namespace)
            if rv is not None and int(rv) >= cluster_rv(self.cluster):
                return
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"not synced: producer at {rv}, cluster at {cluster_rv(self.cluster)}"
                )
            await asyncio.sleep(0.02)

    def events(self) -> list[K8sPodEvent]:
        return read_events(self.out)


def cluster_rv(cluster: FakeCluster) -> int:
    with cluster.cond:
        return cluster.rv
