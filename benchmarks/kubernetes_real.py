"""The Kubernetes producer benchmark against a real kube-apiserver + etcd, beside the same run
against the test server (benchmarks/kubernetes.py): the same 50,000 pods listed, the same burst
of 10,000 watch events, the producer authenticated as its ServiceAccount (the shipped RBAC).

    python -m benchmarks kubernetes-real [--pods 50000] [--burst 10000] [--repeats 1]

The pods (and the burst) go into etcd directly, as the apiserver stores them
(``--storage-media-type=application/json``, keys ``/registry/pods/<ns>/<name>``), through etcd's
HTTP gateway: writing 60,000 pods through the API would measure the API's write path, not the
producer. The apiserver lists them from etcd into its watch cache on start and serves the
producer's paginated list from there; the burst reaches the producer through the apiserver's
watch of etcd and its watch cache, as any controller's changes do. Owners are real objects
(Deployments, ReplicaSets, Jobs, a PyTorchJob CRD). Binaries: tests/harness/kube_apiserver.py (built
once into ~/.cache/gpugap/kube-<version>).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import statistics
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from tests.harness.k8s_load import burst_events, owners, pod, wait_synced
from tests.harness.k8s_load import measure as measure_test_server


class Etcd:
    """Puts and deletes through etcd's v3 HTTP gateway, a keep-alive connection per thread."""

    def __init__(self, port: int) -> None:
        import http.client

        self.port = port
        self._local = threading.local()
        self._http = http.client

    def _call(self, path: str, body: dict[str, str]) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._local.conn = self._http.HTTPConnection("127.0.0.1", self.port, timeout=60)
        conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
        resp = conn.getresponse()
        data = resp.read()
        if resp.status != 200:
            raise RuntimeError(f"etcd {path}: {resp.status} {data[:300]!r}")

    def put(self, key: str, value: bytes) -> None:
        self._call("/v3/kv/put", {"key": _b64(key.encode()), "value": _b64(value)})

    def delete(self, key: str) -> None:
        self._call("/v3/kv/deleterange", {"key": _b64(key.encode())})


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def stored(raw: bytes) -> bytes:
    """A pod as the benchmark's test server serves it -> as the apiserver stores it."""
    obj = json.loads(raw)
    obj["metadata"].pop("resourceVersion", None)
    return json.dumps(obj, separators=(",", ":")).encode()


def _key(ns: str, name: str) -> str:
    return f"/registry/pods/{ns}/{name}"


def load(etcd: Etcd, items: list[tuple[str, str, str, bytes]], threads: int = 8) -> float:
    """Write (type, ns, name, object) to etcd, in order per pod; seconds taken."""
    t0 = time.perf_counter()
    lanes: dict[int, list[tuple[str, str, str, bytes]]] = {}
    for item in items:  # one pod's changes stay in one lane, in order
        lanes.setdefault(hash((item[1], item[2])) % threads, []).append(item)

    def run(lane: list[tuple[str, str, str, bytes]]) -> None:
        for kind, ns, name, raw in lane:
            if kind == "DELETED":
                etcd.delete(_key(ns, name))
            else:
                etcd.put(_key(ns, name), stored(raw))

    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(run, lanes.values()))
    return time.perf_counter() - t0


def setup(kube: Any, pods: int, burst: int) -> None:
    from tests.harness.kube_apiserver import ApiError, crd

    kube.apply(crd("kubeflow.org", "PyTorchJob", "pytorchjobs"))
    time.sleep(2)  # established, served
    for ns in sorted({o["metadata"]["namespace"] for o in owners(pods + burst)}):
        kube.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    for original in owners(pods + burst):
        obj = json.loads(json.dumps(original))
        meta = obj["metadata"]
        meta.pop("uid", None)
        for r in meta.get("ownerReferences") or ():
            r["uid"] = r["uid"] or "x"
        spec = obj.setdefault("spec", {})
        if obj["kind"] in ("Deployment", "ReplicaSet"):
            tmpl = {
                "metadata": {"labels": {"app": meta["name"]}},
                "spec": {
                    "containers": [
                        {
                            "name": "main",
                            "image": "x",
                            "resources": {"limits": {"nvidia.com/gpu": "1"}},
                        }
                    ]
                },
            }
            obj["spec"] = {"selector": {"matchLabels": {"app": meta["name"]}}, "template": tmpl}
        elif obj["kind"] == "Job":
            spec["template"]["spec"]["restartPolicy"] = "Never"
            spec["template"]["spec"]["containers"][0]["image"] = "x"
        for attempt in range(20):
            try:
                kube.apply(obj)
                break
            except ApiError as exc:
                if exc.code == 409:
                    break
                if attempt == 19:
                    raise
                time.sleep(0.5)  # the CRD is not served yet


def measure_real(pods: int, burst: int, kube: Any, root: Path) -> dict[str, float]:
    from kubernetes.client import CoreV1Api, CustomObjectsApi  # noqa: F401

    from gpugap.groundfloor.kafka.publish import JsonlPublisher
    from gpugap.producers import run_producer
    from gpugap.producers.kubernetes.producer import KubernetesProducer
    from tests.harness.k8s_run import settings_for

    etcd = Etcd(kube.etcd_port)
    kubeconfig = kube.kubeconfig(root / "kubeconfig")
    settings = settings_for(kubeconfig, request_timeout_s=60.0, watch_timeout_s=300)
    producer = KubernetesProducer(*settings)
    out = root / f"out-{time.monotonic_ns()}.jsonl"
    publisher = JsonlPublisher(out)
    events = burst_events(pods, burst)

    async def go() -> dict[str, float]:
        stop = asyncio.Event()
        list_rv = kube.rv()
        t0 = time.perf_counter()
        task = asyncio.create_task(run_producer(producer, publisher, stop=stop))
        await wait_synced(producer, list_rv, task)
        t1 = time.perf_counter()
        listed = publisher.sent
        write_s = await asyncio.to_thread(load, etcd, events)
        # the last change's revision: a sentinel pod touched through the API after the burst
        from tests.harness.kube_apiserver import touch_sentinel

        burst_rv = await asyncio.to_thread(touch_sentinel, kube.admin, "team-00")
        await wait_synced(producer, burst_rv, task)
        t2 = time.perf_counter()
        stop.set()
        await task
        assert producer.resolver is not None
        return {
            "list_s": t1 - t0,
            "list_events": listed,
            "owner_gets": producer.resolver.gets,
            "burst_s": t2 - t1,
            "burst_write_s": write_s,
            "burst_events": publisher.sent - listed,
        }

    return asyncio.run(go())


def run_real(pods: int, burst: int, repeats: int) -> tuple[list[dict[str, float]], dict[str, Any]]:
    from tests.harness.kube_apiserver import KubeApiServer, build

    t = time.perf_counter()
    build()
    info: dict[str, Any] = {"build_s": time.perf_counter() - t}
    runs = []
    for _ in range(repeats):  # a fresh cluster each time: the burst changes it
        with tempfile.TemporaryDirectory(prefix="gpugap-kube-bench-") as tmp:
            root = Path(tmp)
            kube = KubeApiServer(
                root / "kube", extra_flags=("--storage-media-type=application/json",)
            )
            try:
                kube.start()
                kube.install_producer_identity()
                setup(kube, pods, burst)
                etcd = Etcd(kube.etcd_port)
                info["load_s"] = load(etcd, [("ADDED", *pod(i)) for i in range(pods)])
                kube.restart()  # the watch cache starts from etcd: every pod in it
                info["ready_s"] = kube.ready_s
                runs.append(measure_real(pods, burst, kube, root))
                info["rss_mib"] = kube.rss_mib()
            finally:
                kube.stop()
    return runs, info


def compare(pods: int = 50_000, burst: int = 10_000, repeats: int = 1) -> int:
    real, info = run_real(pods, burst, repeats)
    fake = [measure_test_server(pods, burst) for _ in range(repeats)]
    print(f"kubernetes producer, JSONL output: {pods:,} pods listed, a burst of {burst:,} watch "
          f"events; median of {repeats}")  # fmt: skip
    print(f"{'':28}{'test server':>16}{'kube-apiserver':>18}")
    rows = []
    for label, fn in (
        ("list: events published", lambda r: r["list_events"]),
        ("list: seconds", lambda r: r["list_s"]),
        ("list: pods/s", lambda r: pods / r["list_s"]),
        ("list: events/s", lambda r: r["list_events"] / r["list_s"]),
        ("owner GETs", lambda r: r["owner_gets"]),
        ("burst: events published", lambda r: r["burst_events"]),
        ("burst: seconds", lambda r: r["burst_s"]),
        ("burst: watch events/s", lambda r: burst / r["burst_s"]),
        ("burst: events/s", lambda r: r["burst_events"] / r["burst_s"]),
    ):
        a = statistics.median(fn(r) for r in fake)
        b = statistics.median(fn(r) for r in real)
        rows.append((label, a, b))
        print(f"{label:28}{a:>16,.2f}{b:>18,.2f}")
    write_s = statistics.median(r["burst_write_s"] for r in real)
    print(
        f"real: burst written to etcd in {write_s:.2f} s (inside the producer's burst time); "
        f"{pods:,} pods loaded into etcd in {info['load_s']:.1f} s, apiserver ready "
        f"(watch cache filled) in {info['ready_s']:.1f} s; etcd + apiserver RSS "
        f"{info['rss_mib']:,.0f} MiB; binaries found/built in {info['build_s']:.1f} s"
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m benchmarks kubernetes-real", description=(__doc__ or "").split("\n\n")[0]
    )
    ap.add_argument("--pods", type=int, default=50_000)
    ap.add_argument("--burst", type=int, default=10_000)
    ap.add_argument("--repeats", type=int, default=1)
    a = ap.parse_args(argv)
    return compare(a.pods, a.burst, a.repeats)


if __name__ == "__main__":
    sys.exit(main())
