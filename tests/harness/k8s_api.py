"""A Kubernetes API server for tests: the real wire protocol for pods, in a thread.

Kept only for what a real apiserver cannot be made to do on demand: a connection that never
answers or streams that go silent (``hang``), a malformed or non-event watch line, a watch
held back to script exactly what a gap contains (``pause``), ERROR 410 in the stream versus a
silently closed one (``expire``), an expired list continuation, 100,000-GPU or otherwise
invalid pods the real API refuses, and benchmarks that need no build. Everything a real
apiserver can do (lifecycles through pods/binding and status, owner references, RBAC, paged
lists, 410 after a restart or compaction, outages) is tested against one:
tests/harness/kube_apiserver.py and tests/producers/kubernetes/test_real.py.

Speaks what the kubernetes client sends and expects (../shared/reference/stack.md):
- ``GET /api/v1/pods`` and ``/api/v1/namespaces/{ns}/pods``: a ``PodList`` with
  ``metadata.resourceVersion``; ``limit``/``continue`` pages from one consistent snapshot
  (an expired continue token is HTTP 410 ``Expired``);
- the same with ``watch=true``: HTTP 200, chunked, one JSON event per line (ADDED, MODIFIED,
  DELETED, BOOKMARK, ERROR), from ``resourceVersion``; ``allowWatchBookmarks`` (true/True)
  gets a BOOKMARK every ``bookmark_every_s`` of quiet and at the end; ``timeoutSeconds`` ends
  the stream; a resourceVersion older than the compaction floor gets ERROR 410 ``Expired``;
- ``GET /apis/{group}/{version}/namespaces/{ns}/{plural}/{name}``: owner objects, else 404;
- bearer-token authentication (401 otherwise).

Test controls: ``add``/``patch`` (JSON merge patch)/``delete`` pods, ``expire()`` (compact the
history: active watches get ERROR 410, and so does any watch from an older version),
``pause()`` (hold watch delivery, to script what happens during a gap), ``hang()`` (silent
connections: the next watch requests never answer, or the active streams go quiet), and a
request log. ``close()`` stops the server and joins every thread it started.
"""

from __future__ import annotations

import base64
import bisect
import contextlib
import copy
import json
import socket
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import yaml

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "k8s"
TOKEN = "gpugap-test-token"
#: kind -> resource plural, for owner objects the server can serve (its own table)
PLURALS = {
    "ReplicaSet": "replicasets",
    "Deployment": "deployments",
    "StatefulSet": "statefulsets",
    "Job": "jobs",
    "CronJob": "cronjobs",
    "PyTorchJob": "pytorchjobs",
    "Notebook": "notebooks",
    "JobSet": "jobsets",
    "LeaderWorkerSet": "leaderworkersets",
}


def status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch (what ``kubectl patch --type merge`` sends)."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


@dataclass
class Entry:
    rv: int
    raw: bytes  # the object as served (with its resourceVersion)
    obj: dict[str, Any] | None = None  # kept for patches; None for bulk-loaded pods

    def object(self) -> dict[str, Any]:
        if self.obj is None:
            self.obj = json.loads(self.raw)
        return self.obj


@dataclass
class Request:
    path: str
    params: dict[str, str]
    at: float = field(default_factory=time.monotonic)

    @property
    def watch(self) -> bool:
        return self.params.get("watch", "").lower() == "true"


class FakeCluster:
    def __init__(self, *, bookmark_every_s: float = 0.2, token: str | None = TOKEN) -> None:
        self.cond = threading.Condition()
        self.rv = 100
        self.floor = self.rv  # oldest resourceVersion a watch may resume from
        self.generation = 0  # bumped by expire(): active watches end with 410
        self.pods: dict[tuple[str, str], Entry] = {}
        self.history: list[tuple[int, str, bytes]] = []  # (rv, namespace, event line)
        self.dropped = 0  # history entries compacted away (positions stay absolute)
        self.expire_how = "error"
        self.fail_continue = 0  # the next N list continuations are refused (410 Expired)
        self.objects: dict[str, bytes] = {}
        self.snapshots: dict[str, tuple[int, list[tuple[str, bytes]]]] = {}
        self.requests: list[Request] = []
        self.bookmark_every_s = bookmark_every_s
        self.token = token
        self.paused = False
        self.hang_requests = 0  # the next N watch requests never answer
        self.hang_generation = 0  # bumped by hang(streams=True): active streams go quiet
        self.closed = False

    # --- pods -----------------------------------------------------------------------------
    def _bump(self) -> int:
        self.rv += 1
        return self.rv

    def _event(self, kind: str, ns: str, raw: bytes, rv: int) -> None:
        self.history.append((rv, ns, b'{"type":"' + kind.encode() + b'","object":' + raw + b"}\n"))

    def _store(self, obj: dict[str, Any], kind: str) -> None:
        rv = self._bump()
        obj["metadata"]["resourceVersion"] = str(rv)
        raw = json.dumps(obj, separators=(",", ":")).encode()
        meta = obj["metadata"]
        self.pods[meta["namespace"], meta["name"]] = Entry(rv, raw, obj)
        self._event(kind, meta["namespace"], raw, rv)
        self.cond.notify_all()

    def add(self, pod: Mapping[str, Any]) -> None:
        with self.cond:
            obj = copy.deepcopy(dict(pod))
            key = (obj["metadata"]["namespace"], obj["metadata"]["name"])
            assert key not in self.pods, f"pod {key} exists"
            self._store(obj, "ADDED")

    def patch(self, ns: str, name: str, patch: Mapping[str, Any]) -> None:
        with self.cond:
            obj = merge_patch(self.pods[ns, name].object(), patch)
            self._store(obj, "MODIFIED")

    def delete(self, ns: str, name: str) -> None:
        with self.cond:
            entry = self.pods.pop((ns, name))
            rv = self._bump()
            obj = copy.deepcopy(entry.object())
            obj["metadata"]["resourceVersion"] = str(rv)
            self._event("DELETED", ns, json.dumps(obj, separators=(",", ":")).encode(), rv)
            self.cond.notify_all()

    def load_raw(self, pods: list[tuple[str, str, bytes]]) -> None:
        """Bulk-load pods already encoded, with ``"resourceVersion":"RV"`` left to fill in
        (for benchmarks: no history, they exist before anyone watches)."""
        with self.cond:
            for ns, name, raw in pods:
                rv = self._bump()
                self.pods[ns, name] = Entry(rv, raw.replace(b'"RV"', b'"%d"' % rv))
            self.floor = self.rv

    def apply_raw(self, events: list[tuple[str, str, str, bytes]]) -> int:
        """Apply encoded watch events at once (type, namespace, name, object with
        ``"resourceVersion":"RV"`` to fill in); returns the resourceVersion after them."""
        with self.cond:
            for kind, ns, name, template in events:
                rv = self._bump()
                raw = template.replace(b'"RV"', b'"%d"' % rv)
                if kind == "DELETED":
                    self.pods.pop((ns, name), None)
                else:
                    self.pods[ns, name] = Entry(rv, raw)
                self._event(kind, ns, raw, rv)
            self.cond.notify_all()
            return self.rv

    def add_object(self, obj: Mapping[str, Any]) -> None:
        """An owner object for GETs, at /apis/{apiVersion}/namespaces/{ns}/{plural}/{name}."""
        meta = obj["metadata"]
        path = f"/apis/{obj['apiVersion']}/namespaces/{meta['namespace']}/"
        path += f"{PLURALS[obj['kind']]}/{meta['name']}"
        with self.cond:
            self.objects[path] = json.dumps(obj).encode()

    # --- test controls --------------------------------------------------------------------
    def expire(self, how: str = "error") -> None:
        """Compact: nothing before now can be resumed. Active watches end, with ERROR 410
        (``how="error"``) or silently (``"close"``, as for a watcher too slow to keep up:
        it then learns of the 410 when it reconnects from its old resourceVersion)."""
        with self.cond:
            self.floor = self.rv
            self.dropped += len(self.history)
            self.history.clear()
            self.snapshots.clear()
            self.generation += 1
            self.expire_how = how
            self.paused = False
            self.cond.notify_all()

    def pause(self) -> None:
        with self.cond:
            self.paused = True

    def resume(self) -> None:
        with self.cond:
            self.paused = False
            self.cond.notify_all()

    def hang(self, *, requests: int = 0, streams: bool = False) -> None:
        """The next ``requests`` watch requests never answer; ``streams``: the active ones go
        silent (connections stay open, nothing more is sent)."""
        with self.cond:
            self.hang_requests += requests
            if streams:
                self.hang_generation += 1
            self.cond.notify_all()

    def watches(self) -> list[Request]:
        with self.cond:
            return [r for r in self.requests if r.watch]

    def lists(self) -> list[Request]:
        with self.cond:
            return [r for r in self.requests if r.path.endswith("/pods") and not r.watch]

    # --- serving --------------------------------------------------------------------------
    def list_page(self, ns: str | None, limit: int, cont: str | None) -> dict[str, Any] | bytes:
        with self.cond:
            if cont:
                snap_id, _, offset = base64.b64decode(cont).decode().partition(":")
                if self.fail_continue > 0:
                    self.fail_continue -= 1
                    self.snapshots.pop(snap_id, None)
                if snap_id not in self.snapshots:
                    return status(410, "Expired", "The provided continue parameter is too old")
                rv, items = self.snapshots[snap_id]
                start = int(offset)
            else:
                rv = self.rv
                items = [(k[0], e.raw) for k, e in sorted(self.pods.items()) if ns in (None, k[0])]
                snap_id, start = f"s{len(self.snapshots) + 1}-{rv}", 0
                if limit and len(items) > limit:
                    self.snapshots[snap_id] = (rv, items)
        page = items[start : start + limit] if limit else items[start:]
        meta = b'{"resourceVersion":"%d"' % rv
        if limit and start + limit < len(items):
            token = base64.b64encode(f"{snap_id}:{start + limit}".encode())
            meta += b',"continue":"' + token + b'"'
        return (
            b'{"kind":"PodList","apiVersion":"v1","metadata":'
            + meta
            + b'},"items":['
            + b",".join(raw for _, raw in page)
            + b"]}"
        )

    def watch_stream(
        self, ns: str | None, rv_param: str | None, bookmarks: bool, timeout_s: float
    ) -> Iterator[bytes | None]:
        """Event lines to send; ``None`` means: hold the connection, say nothing, forever."""
        deadline = time.monotonic() + timeout_s
        with self.cond:
            generation, hang_generation = self.generation, self.hang_generation
            if rv_param in (None, "", "0"):
                initial = [
                    b'{"type":"ADDED","object":' + e.raw + b"}\n"
                    for k, e in sorted(self.pods.items())
                    if ns in (None, k[0])
                ]
                since = self.rv
            else:
                since = int(rv_param)
                if since < self.floor:
                    err = status(
                        410, "Expired", f"too old resource version: {since} ({self.floor})"
                    )
                    initial = [json.dumps({"type": "ERROR", "object": err}).encode() + b"\n"]
                    since = -1
                else:
                    initial = []
            pos = self.dropped + bisect.bisect_right(self.history, since, key=lambda h: h[0])
        if initial:
            yield b"".join(initial)
        if since < 0:
            return
        last_sent = time.monotonic()
        while True:
            with self.cond:
                while True:
                    if self.closed:
                        return
                    if self.hang_generation != hang_generation:
                        break
                    if self.generation != generation:
                        break
                    now = time.monotonic()
                    ready = not self.paused and pos < self.dropped + len(self.history)
                    due = bookmarks and now - last_sent >= self.bookmark_every_s
                    if ready or due or now >= deadline:
                        break
                    wait = deadline - now
                    if bookmarks:
                        wait = min(wait, self.bookmark_every_s - (now - last_sent))
                    self.cond.wait(max(wait, 0.001))
                if self.hang_generation != hang_generation:
                    lines: list[bytes] | None = None
                elif self.generation != generation:
                    err = status(410, "Expired", "the watch cache was compacted")
                    lines = [json.dumps({"type": "ERROR", "object": err}).encode() + b"\n"]
                    if self.expire_how == "close":
                        lines = []
                    deadline = 0.0
                else:
                    lines = []
                    if not self.paused:
                        pending = self.history[max(0, pos - self.dropped) :]
                        pos = self.dropped + len(self.history)
                        lines = [line for _, hns, line in pending if ns in (None, hns)]
                    if (
                        bookmarks
                        and (not lines)
                        and (
                            time.monotonic() - last_sent >= self.bookmark_every_s
                            or time.monotonic() >= deadline
                        )
                    ):
                        lines.append(
                            b'{"type":"BOOKMARK","object":{"kind":"Pod","apiVersion":"v1",'
                            b'"metadata":{"resourceVersion":"%d"}}}\n' % self.rv
                        )
            if lines is None:
                yield None
                return
            if lines:
                yield b"".join(lines)
                last_sent = time.monotonic()
            if time.monotonic() >= deadline:
                return

    def wait_hung(self) -> None:
        """Block a handler while the server lives (a connection that never answers)."""
        with self.cond:
            while not self.closed:
                self.cond.wait(1.0)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body go out at once, no delayed-ACK stalls
    wbufsize = 1 << 16  # buffered: a response is one write (handle_one_request flushes)
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    def _send(self, code: int, body: bytes | dict[str, Any]) -> None:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        cluster = self.server.cluster
        url = urlsplit(self.path)
        params = {k: v[-1] for k, v in parse_qs(url.query).items()}
        with cluster.cond:
            cluster.requests.append(Request(url.path, params))
        if cluster.token and self.headers.get("Authorization") != f"Bearer {cluster.token}":
            self._send(401, status(401, "Unauthorized", "Unauthorized"))
            return
        parts = url.path.strip("/").split("/")
        if parts[:2] == ["api", "v1"] and parts[-1] == "pods" and len(parts) in (3, 5):
            ns = parts[3] if len(parts) == 5 else None
            if params.get("watch", "").lower() == "true":
                self._watch(ns, params)
            else:
                body = cluster.list_page(ns, int(params.get("limit") or 0), params.get("continue"))
                self._send(410 if isinstance(body, dict) else 200, body)
            return
        obj = cluster.objects.get(url.path)
        if obj is not None:
            self._send(200, obj)
        else:
            self._send(404, status(404, "NotFound", f"{url.path} not found"))

    def _watch(self, ns: str | None, params: dict[str, str]) -> None:
        cluster = self.server.cluster
        with cluster.cond:
            hang = cluster.hang_requests > 0
            cluster.hang_requests -= hang
        if hang:
            cluster.wait_hung()
            return
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self.wfile.flush()
        bookmarks = params.get("allowWatchBookmarks", "").lower() == "true"
        timeout_s = float(params.get("timeoutSeconds") or 1800)
        try:
            for data in cluster.watch_stream(
                ns, params.get("resourceVersion"), bookmarks, timeout_s
            ):
                if data is None:
                    cluster.wait_hung()
                    return
                # one chunk per event line, as the API server flushes them
                out = b"".join(
                    b"%x\r\n%s\n\r\n" % (len(line) + 1, line) for line in data.split(b"\n") if line
                )
                self.wfile.write(out)
                self.wfile.flush()
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except OSError:
            self.close_connection = True


class _Server(ThreadingHTTPServer):
    daemon_threads = False
    block_on_close = True

    def __init__(self, cluster: FakeCluster, port: int = 0) -> None:
        super().__init__(("127.0.0.1", port), _Handler)
        self.cluster = cluster
        self.connections: set[socket.socket] = set()
        self.conn_lock = threading.Lock()

    def process_request(self, request: Any, client_address: Any) -> None:
        with self.conn_lock:
            self.connections.add(request)
        super().process_request(request, client_address)

    def handle_error(self, request: Any, client_address: Any) -> None:
        if not isinstance(sys.exc_info()[1], ConnectionError):  # a client hanging up is normal
            super().handle_error(request, client_address)

    def shutdown_request(self, request: Any) -> None:
        with self.conn_lock:
            self.connections.discard(request)
        super().shutdown_request(request)


def write_kubeconfig(url: str, path: Path, token: str | None = TOKEN) -> Path:
    """A kubeconfig for the server at ``url``, authenticating with a bearer token."""
    user: dict[str, Any] = {"token": token} if token else {}
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "test", "cluster": {"server": url}}],
                "users": [{"name": "producer", "user": user}],
                "contexts": [{"name": "test", "context": {"cluster": "test", "user": "producer"}}],
                "current-context": "test",
            }
        )
    )
    return path


class ApiServer:
    """The server around a FakeCluster: ``url``, ``kubeconfig(path)``, ``close()``."""

    def __init__(self, cluster: FakeCluster | None = None, port: int = 0) -> None:
        self.cluster = cluster or FakeCluster()
        self.cluster.closed = False
        self._server = _Server(self.cluster, port)
        self._closed = False
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, name="k8s-api"
        )
        self._thread.start()

    def kubeconfig(self, path: Path, token: str | None = TOKEN) -> Path:
        return write_kubeconfig(self.url, path, token)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        with self.cluster.cond:
            self.cluster.closed = True
            self.cluster.cond.notify_all()
        self._server.shutdown()
        with self._server.conn_lock:
            conns = list(self._server.connections)
        for conn in conns:  # idle keep-alive connections block their handler in a read
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        self._server.server_close()  # joins the handler threads
        self._thread.join()

    def __enter__(self) -> ApiServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# --- scenarios ----------------------------------------------------------------------------


@dataclass
class Scenario:
    """A recorded scenario: owner objects, pod manifests by key, pods present at the start,
    steps applied while the producer watches, and the events it must emit, in order."""

    name: str
    namespace: str
    owners: list[dict[str, Any]]
    pods: dict[str, dict[str, Any]]
    initial: list[str]
    steps: list[dict[str, Any]]
    expected: list[dict[str, Any]]
    pods_expect: dict[str, dict[str, Any]]

    @classmethod
    def load(cls, name: str) -> Scenario:
        doc = yaml.safe_load((FIXTURES / f"{name}.yaml").read_text())
        pods = {key: json.loads(json.dumps(pod)) for key, pod in doc["pods"].items()}
        return cls(
            name=name,
            namespace=doc["namespace"],
            owners=doc.get("owners") or [],
            pods=pods,
            initial=doc.get("initial") or [],
            steps=doc.get("steps") or [],
            expected=doc.get("expected") or [],
            pods_expect=doc.get("pods_expect") or {},
        )

    def fields(self, key: str) -> dict[str, Any]:
        """What every event of pod ``key`` must carry."""
        return {**self.pods_expect.get("all", {}), **self.pods_expect.get(key, {})}

    def pod_name(self, key: str) -> str:
        return str(self.pods[key]["metadata"]["name"])

    def uid(self, key: str) -> str:
        return str(self.pods[key]["metadata"]["uid"])

    def setup(self, cluster: FakeCluster) -> None:
        for obj in self.owners:
            cluster.add_object(obj)
        for key in self.initial:
            cluster.add(self.pods[key])

    def apply(self, cluster: FakeCluster, step: Mapping[str, Any]) -> None:
        if "add" in step:
            cluster.add(self.pods[step["add"]])
        elif "patch" in step:
            cluster.patch(self.namespace, self.pod_name(step["patch"]), step["merge"])
        elif "delete" in step:
            cluster.delete(self.namespace, self.pod_name(step["delete"]))
        else:
            raise ValueError(f"unknown step {step}")


def scenarios() -> list[str]:
    return sorted(p.stem for p in FIXTURES.glob("*.yaml") if not p.stem.startswith("_"))
