"""A real kube-apiserver + etcd for the tests, built from the Go module proxy.

``build()`` compiles kube-apiserver (k8s.io/kubernetes at ``VERSION``) and etcd (the version that
kube-apiserver's go.mod pins) once into ``~/.cache/gpugap/kube-<version>/bin`` (under a file lock,
so concurrent sessions build it once). k8s.io/kubernetes has ``replace => ./staging/...`` lines, so
``go install`` fails: a scratch module requires it with each staging module replaced by its
published v0.<minor>.<patch> (../shared/reference/kube-apiserver-local.sh). Cold: ~7 min and
1.8 GB on 2 cores; warm: a stat.

``KubeApiServer`` runs etcd and kube-apiserver on 127.0.0.1 free ports, detached from the test
process (own session; stopped by PID), with RBAC and a static token file holding one setup token
(group system:masters). ``install_producer_identity()`` applies deploy/kubernetes-producer-rbac.yaml
through the API and asks the API (TokenRequest) for a token of the producer's ServiceAccount: the
producer runs with the shipped ClusterRole and nothing else. ``restart()`` restarts only the
apiserver against the same etcd; ``stop_apiserver()``/``start_apiserver()`` leave a gap.
"""

from __future__ import annotations

import contextlib
import fcntl
import http.client
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import yaml

VERSION = os.environ.get("GPUGAP_KUBE_VERSION", "1.35.4")
RBAC_YAML = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes-producer-rbac.yaml"
SETUP_TOKEN = "gpugap-setup-token"
PRODUCER_SA = ("gpugap", "gpugap-kubernetes-producer")


class KubeUnavailable(RuntimeError):
    """The apiserver could not be built or started (the fixture turns it into unavailable())."""


def cache_root(version: str = VERSION) -> Path:
    base = Path(os.environ.get("GPUGAP_CACHE", Path.home() / ".cache" / "gpugap"))
    return base / f"kube-{version}"


def _go() -> str:
    for cand in (shutil.which("go"), "/usr/local/go/bin/go"):
        if cand and os.access(cand, os.X_OK):
            return cand
    raise KubeUnavailable(
        "no Go toolchain (go on PATH or /usr/local/go/bin/go) to build kube-apiserver"
    )


def binaries(version: str = VERSION) -> tuple[Path, Path]:
    bin_dir = cache_root(version) / "bin"
    return bin_dir / "kube-apiserver", bin_dir / "etcd"


def build(version: str = VERSION, log: Path | None = None) -> tuple[Path, Path]:
    """The kube-apiserver and etcd binaries for ``version``, built if not cached."""
    root = cache_root(version)
    apiserver, etcd = binaries(version)
    if apiserver.exists() and etcd.exists():
        return apiserver, etcd
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another session may be building it
        if apiserver.exists() and etcd.exists():
            return apiserver, etcd
        _build(version, root, log or root / "build.log")
    return apiserver, etcd


def _build(version: str, root: Path, log_path: Path) -> None:
    go = _go()
    work = root / "build"
    work.mkdir(exist_ok=True)
    out = root / "bin.partial"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir()
    env = {**os.environ, "GOFLAGS": "-mod=mod", "GO111MODULE": "on"}
    env.setdefault("GOTOOLCHAIN", "auto")
    minor = version.split(".")[1]
    staging_v = "v0." + version.split(".", 1)[1]
    t0 = time.monotonic()
    with open(log_path, "a") as log:

        def go_run(*args: str, cwd: Path = work) -> str:
            log.write(f"$ go {' '.join(args)}\n")
            log.flush()
            proc = subprocess.run(
                ["nice", "-n", "10", go, *args],
                cwd=cwd,
                env=env,
                stdout=subprocess.PIPE,
                stderr=log,
                text=True,
                check=False,
            )
            if proc.returncode:
                raise KubeUnavailable(
                    f"go {' '.join(args)} failed (rc {proc.returncode}); see {log_path}"
                )
            return proc.stdout

        # 1. k8s.io/kubernetes' own go.mod, through the module proxy (go mod download)
        (work / "go.mod").write_text("module example.com/k8sbuild\n\ngo 1.24\n")
        info = json.loads(go_run("mod", "download", "-json", f"k8s.io/kubernetes@v{version}"))
        k8s_mod = Path(info["GoMod"]).read_text()
        go_line = next(
            (line.split()[1] for line in k8s_mod.splitlines() if line.startswith("go ")), "1.24"
        )
        replaces, in_replace, etcd_v = [], False, ""
        for line in k8s_mod.splitlines():
            parts = line.split()
            if line.startswith("replace ("):
                in_replace = True
            elif in_replace and line.startswith(")"):
                in_replace = False
            elif (
                in_replace
                and "=>" in parts
                and parts[parts.index("=>") + 1].startswith("./staging")
            ):
                replaces.append(f"\t{parts[0]} => {parts[0]} {staging_v}")
            if parts[:1] == ["go.etcd.io/etcd/client/v3"] and len(parts) >= 2:
                etcd_v = parts[1]
        if not replaces or not etcd_v:
            raise KubeUnavailable(f"unexpected k8s.io/kubernetes v{version} go.mod")
        (work / "go.mod").write_text(
            f"module example.com/k8sbuild\n\ngo {go_line}\n\n"
            f"require k8s.io/kubernetes v{version}\n\n"
            "replace (\n" + "\n".join(replaces) + "\n)\n"
        )
        (work / "go.sum").unlink(missing_ok=True)
        go_run("get", f"k8s.io/kubernetes/cmd/kube-apiserver@v{version}")
        go_run("get", f"go.etcd.io/etcd/server/v3@{etcd_v}")
        x = "k8s.io/component-base/version"
        ldflags = (
            f"-s -w -X {x}.gitVersion=v{version} -X {x}.gitMajor=1 -X {x}.gitMinor={minor} "
            f"-X {x}.gitTreeState=clean"
        )
        go_run(
            "build",
            "-trimpath",
            f"-ldflags={ldflags}",
            "-o",
            str(out / "kube-apiserver"),
            "k8s.io/kubernetes/cmd/kube-apiserver",
        )
        go_run(
            "build",
            "-trimpath",
            "-ldflags=-s -w",
            "-o",
            str(out / "etcd"),
            "go.etcd.io/etcd/server/v3",
        )
        log.write(f"built in {time.monotonic() - t0:.0f} s\n")
    (out / "VERSION").write_text(f"kube-apiserver v{version}\netcd {etcd_v}\n")
    shutil.rmtree(root / "bin", ignore_errors=True)
    out.rename(root / "bin")


# --- running -------------------------------------------------------------------------------

AUDIT_POLICY = """\
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
  - level: Metadata
    userGroups: ["system:serviceaccounts:gpugap"]
  - level: None
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def _spawn(argv: list[str], log: Path) -> int:
    """Start ``argv`` detached (its own session, not a child of the test process: a restarted
    apiserver is not a process the test leaked) and return its PID."""
    pidfile = log.with_suffix(".pid")
    pidfile.unlink(missing_ok=True)
    proc = subprocess.run(
        ["setsid", "-f", "sh", "-c", 'echo $$ >"$1"; shift; exec "$@" >"$0" 2>&1 </dev/null',
         str(log), str(pidfile), *argv],
        capture_output=True, check=False,
    )  # fmt: skip
    if proc.returncode:
        raise KubeUnavailable(f"could not start {argv[0]}: {proc.stderr.decode()[-500:]}")
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError, ValueError):
            return int(pidfile.read_text())
        time.sleep(0.01)
    raise KubeUnavailable(f"{Path(argv[0]).name} did not start (see {log})")


def _kill(pid: int | None, timeout: float = 15.0) -> None:
    if pid is None or not _alive(pid):
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    if _alive(pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        while _alive(pid):
            time.sleep(0.05)


class ApiError(RuntimeError):
    def __init__(self, code: int, body: Any) -> None:
        super().__init__(f"HTTP {code}: {body}")
        self.code, self.body = code, body


class Api:
    """A small JSON client for one apiserver (the test's own writes; not the producer's path):
    keep-alive HTTPS, one connection per thread."""

    def __init__(self, url: str, token: str) -> None:
        self.url, self.token = url, token
        self.host, self.port = url.removeprefix("https://").split(":")
        self._ctx = ssl.create_default_context()
        self._ctx.check_hostname = False
        self._ctx.verify_mode = ssl.CERT_NONE
        self._local = threading.local()

    def _conn(self) -> http.client.HTTPSConnection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = http.client.HTTPSConnection(
                self.host, int(self.port), context=self._ctx, timeout=30
            )
            self._local.conn = conn
        return conn

    def call(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        content_type: str = "application/json",
        ok: tuple[int, ...] = (200, 201, 202),
        raw: bool = False,
    ) -> Any:
        data = (
            body
            if isinstance(body, bytes)
            else (None if body is None else json.dumps(body).encode())
        )
        headers = {"Authorization": f"Bearer {self.token}", "Accept": "application/json"}
        if data is not None:
            headers["Content-Type"] = content_type
        for attempt in range(2):
            conn = self._conn()
            try:
                conn.request(method, path, body=data, headers=headers)
                resp = conn.getresponse()
                payload = resp.read()
                break
            except (OSError, http.client.HTTPException):
                conn.close()
                self._local.conn = None
                if attempt:
                    raise
        if raw and resp.status in ok:
            return payload
        try:
            doc = json.loads(payload) if payload else None
        except ValueError:
            doc = payload.decode(errors="replace")
        if resp.status not in ok:
            raise ApiError(resp.status, doc)
        return doc

    def get(self, path: str) -> Any:
        return self.call("GET", path)

    def post(self, path: str, body: Any) -> Any:
        return self.call("POST", path, body)

    def patch(self, path: str, body: Any) -> Any:
        return self.call("PATCH", path, body, content_type="application/merge-patch+json")

    def delete(self, path: str, grace: int | None = None) -> Any:
        opts: dict[str, Any] = {"apiVersion": "v1", "kind": "DeleteOptions"}
        if grace is not None:
            opts["gracePeriodSeconds"] = grace
        return self.call("DELETE", path, opts)

    def close(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None


#: kind -> (collection path template, namespaced) for what the tests create
COLLECTIONS = {
    "Namespace": "/api/v1/namespaces",
    "ServiceAccount": "/api/v1/namespaces/{ns}/serviceaccounts",
    "Node": "/api/v1/nodes",
    "Pod": "/api/v1/namespaces/{ns}/pods",
    "ConfigMap": "/api/v1/namespaces/{ns}/configmaps",
    "ClusterRole": "/apis/rbac.authorization.k8s.io/v1/clusterroles",
    "ClusterRoleBinding": "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
    "CustomResourceDefinition": "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
    "Deployment": "/apis/apps/v1/namespaces/{ns}/deployments",
    "ReplicaSet": "/apis/apps/v1/namespaces/{ns}/replicasets",
    "StatefulSet": "/apis/apps/v1/namespaces/{ns}/statefulsets",
    "Job": "/apis/batch/v1/namespaces/{ns}/jobs",
    "CronJob": "/apis/batch/v1/namespaces/{ns}/cronjobs",
}


def collection(obj: dict[str, Any]) -> str:
    kind = obj["kind"]
    ns = obj["metadata"].get("namespace", "")
    if kind in COLLECTIONS:
        return COLLECTIONS[kind].format(ns=ns)
    group_version, plural = obj["apiVersion"], kind.lower() + "s"  # the CRDs the tests install
    return f"/apis/{group_version}/namespaces/{ns}/{plural}"


class KubeApiServer:
    """etcd + kube-apiserver(s) on 127.0.0.1, in ``root``. ``url``/``admin`` for the test's own
    requests (system:masters), ``kubeconfig(path)`` for the producer (its ServiceAccount token
    once ``install_producer_identity()`` ran). Extra apiservers (``add_peer()``) share the etcd:
    an HA control plane, the one the producer talks to can be down while writes go on."""

    def __init__(
        self, root: Path, *, watch_cache: bool = True, compaction_s: int = 300,
        extra_flags: tuple[str, ...] = (), version: str = VERSION,
    ) -> None:  # fmt: skip
        self.root = root
        self.version = version
        self.watch_cache, self.compaction_s, self.extra_flags = (
            watch_cache,
            compaction_s,
            extra_flags,
        )
        self.etcd_port, self.peer_port = _free_port(), _free_port()
        self.port = _free_port()
        self.url = f"https://127.0.0.1:{self.port}"
        self.etcd_pid: int | None = None
        self.pids: dict[int, int] = {}  # apiserver port -> PID
        self.admin = Api(self.url, SETUP_TOKEN)
        self.producer_token: str | None = None
        self.audit_log = root / "audit.log"
        self.starts = 0

    # --- processes ------------------------------------------------------------------------
    def start(self) -> None:
        _, etcd = build(self.version)
        self.root.mkdir(parents=True, exist_ok=True)
        key, pub = self.root / "sa.key", self.root / "sa.pub"
        if not key.exists():
            subprocess.run(
                ["openssl", "genrsa", "-out", str(key), "2048"], check=True, capture_output=True
            )
            subprocess.run(
                ["openssl", "rsa", "-in", str(key), "-pubout", "-out", str(pub)],
                check=True, capture_output=True,
            )  # fmt: skip
        (self.root / "tokens.csv").write_text(
            f"{SETUP_TOKEN},gpugap-test-admin,admin-uid,system:masters\n"
        )
        (self.root / "audit-policy.yaml").write_text(AUDIT_POLICY)
        self.etcd_pid = _spawn(
            [
                str(etcd), "--name", "t", "--data-dir", str(self.root / "etcd-data"),
                "--listen-client-urls", f"http://127.0.0.1:{self.etcd_port}",
                "--advertise-client-urls", f"http://127.0.0.1:{self.etcd_port}",
                "--listen-peer-urls", f"http://127.0.0.1:{self.peer_port}",
                "--initial-advertise-peer-urls", f"http://127.0.0.1:{self.peer_port}",
                "--initial-cluster", f"t=http://127.0.0.1:{self.peer_port}",
                "--log-level", "warn", "--unsafe-no-fsync", "--quota-backend-bytes", str(4 << 30),
            ],
            self.root / "etcd.log",
        )  # fmt: skip
        self.start_apiserver()

    def _apiserver_argv(self, port: int) -> list[str]:
        apiserver, _ = binaries(self.version)
        return [
            str(apiserver),
            f"--etcd-servers=http://127.0.0.1:{self.etcd_port}",
            "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1", f"--secure-port={port}",
            f"--cert-dir={self.root / f'certs-{port}'}",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={self.root / 'sa.pub'}",
            f"--service-account-signing-key-file={self.root / 'sa.key'}",
            "--service-cluster-ip-range=10.96.0.0/24",
            f"--token-auth-file={self.root / 'tokens.csv'}", "--authorization-mode=RBAC",
            "--disable-admission-plugins=ServiceAccount",  # no controller-manager, no default SA
            f"--etcd-compaction-interval={self.compaction_s}s",
            f"--watch-cache={'true' if self.watch_cache else 'false'}",
            "--enable-priority-and-fairness=false", "--profiling=false",
            f"--audit-policy-file={self.root / 'audit-policy.yaml'}",
            f"--audit-log-path={self.audit_log}", "--audit-log-maxsize=0",
            *self.extra_flags,
        ]  # fmt: skip

    def start_apiserver(self, port: int | None = None, timeout_s: float = 120.0) -> None:
        port = port or self.port
        t0 = time.monotonic()
        pid = _spawn(self._apiserver_argv(port), self.root / f"apiserver-{port}.log")
        self.pids[port] = pid
        self.starts += 1
        probe = Api(f"https://127.0.0.1:{port}", SETUP_TOKEN)
        try:
            while True:
                with contextlib.suppress(OSError, ApiError, http.client.HTTPException):
                    probe.call("GET", "/readyz", ok=(200,), raw=True)
                    break
                if not _alive(pid):
                    tail = (self.root / f"apiserver-{port}.log").read_text()[-3000:]
                    raise KubeUnavailable(f"kube-apiserver exited:\n{tail}")
                if time.monotonic() - t0 > timeout_s:
                    raise KubeUnavailable(f"kube-apiserver not ready in {timeout_s:.0f} s")
                time.sleep(0.1)
        finally:
            probe.close()
        self.ready_s = time.monotonic() - t0

    def stop_apiserver(self, port: int | None = None) -> None:
        port = port or self.port
        _kill(self.pids.pop(port, None))
        if port == self.port:
            self.admin.close()

    def restart(self) -> None:
        """Restart the apiserver against the same etcd (its watch cache starts empty)."""
        self.stop_apiserver()
        self.start_apiserver()

    def add_peer(self) -> Api:
        """Another apiserver on the same etcd (a second control-plane replica); ``peer_stop``."""
        port = _free_port()
        self.start_apiserver(port)
        self.peer_port_ = port
        return Api(f"https://127.0.0.1:{port}", SETUP_TOKEN)

    def stop_peer(self) -> None:
        self.stop_apiserver(self.peer_port_)

    def stop(self) -> None:
        for port in list(self.pids):
            self.stop_apiserver(port)
        _kill(self.etcd_pid)
        self.etcd_pid = None

    def rss_mib(self) -> float:
        total = 0
        for pid in [*self.pids.values(), self.etcd_pid]:
            with contextlib.suppress(OSError, TypeError):
                for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1])
        return total / 1024

    # --- identities -----------------------------------------------------------------------
    def apply(self, doc: dict[str, Any], api: Api | None = None) -> Any:
        """Create ``doc`` (the test's own requests: system:masters)."""
        return (api or self.admin).post(collection(doc), doc)

    def install_producer_identity(self) -> str:
        """deploy/kubernetes-producer-rbac.yaml applied through the API, and a token of its
        ServiceAccount from the TokenRequest API: the producer runs with exactly that role."""
        ns, sa = PRODUCER_SA
        with contextlib.suppress(ApiError):
            self.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
        for doc in yaml.safe_load_all(RBAC_YAML.read_text()):
            if doc:
                self.apply(doc)
        req = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
               "spec": {"expirationSeconds": 86400}}  # fmt: skip
        got = self.admin.post(f"/api/v1/namespaces/{ns}/serviceaccounts/{sa}/token", req)
        self.producer_token = str(got["status"]["token"])
        # RBAC is cached by the authorizer: wait until the binding is in effect
        probe = Api(self.url, self.producer_token)
        deadline = time.monotonic() + 30
        try:
            while True:
                try:
                    probe.get("/api/v1/pods?limit=1")
                    break
                except ApiError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.1)
        finally:
            probe.close()
        return self.producer_token

    def kubeconfig(self, path: Path, token: str | None = None) -> Path:
        token = token or self.producer_token
        assert token, "install_producer_identity() first"
        path.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [{"name": "real", "cluster": {"server": self.url,
                                                               "insecure-skip-tls-verify": True}}],
                    "users": [{"name": "producer", "user": {"token": token}}],
                    "contexts": [
                        {"name": "real", "context": {"cluster": "real", "user": "producer"}}
                    ],
                    "current-context": "real",
                }
            )
        )  # fmt: skip
        return path

    def audit(self, since: int = 0) -> list[dict[str, Any]]:
        """The producer's requests (audit events of the gpugap ServiceAccounts) from line
        ``since`` of the audit log (``audit_mark()`` says where it ends now)."""
        if not self.audit_log.exists():
            return []
        lines = self.audit_log.read_bytes().splitlines()[since:]
        return [json.loads(line) for line in lines if line.strip()]

    def audit_mark(self) -> int:
        return len(self.audit_log.read_bytes().splitlines()) if self.audit_log.exists() else 0

    def rv(self) -> int:
        """The current resourceVersion of pods (a quorum list, from etcd)."""
        return int(self.admin.get("/api/v1/pods?limit=1")["metadata"]["resourceVersion"])

    def __enter__(self) -> KubeApiServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


if __name__ == "__main__":  # python -m tests.harness.kube_apiserver: build (or find) the binaries
    t = time.monotonic()
    print(*build(), f"{time.monotonic() - t:.1f} s")


def crd(group: str, kind: str, plural: str) -> dict[str, Any]:
    schema = {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}}
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{group}"},
        "spec": {
            "group": group,
            "scope": "Namespaced",
            "names": {
                "kind": kind,
                "plural": plural,
                "singular": kind.lower(),
                "listKind": kind + "List",
            },
            "versions": [{"name": "v1", "served": True, "storage": True, "schema": schema}],
        },
    }


def touch_sentinel(api: Api, ns: str) -> int:
    """Create or change a pod without GPUs in ``ns``: its resourceVersion."""
    path = f"/api/v1/namespaces/{ns}/pods/gpugap-sentinel"
    patch = {"metadata": {"annotations": {"gpugap.test/touched": str(time.monotonic_ns())}}}
    try:
        obj = api.patch(path, patch)
    except ApiError as exc:
        if exc.code != 404:
            raise
        with_ns = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}
        try:
            api.post("/api/v1/namespaces", with_ns)
        except ApiError as e:
            if e.code != 409:
                raise
        pod = {"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": "gpugap-sentinel", "namespace": ns},
               "spec": {"containers": [{"name": "c", "image": "busybox"}]}}  # fmt: skip
        obj = api.post(f"/api/v1/namespaces/{ns}/pods", pod)
    return int(obj["metadata"]["resourceVersion"])
