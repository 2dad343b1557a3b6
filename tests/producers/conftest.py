"""A real Slurm for the tests marked ``slurm``: installed (apt-get, only when missing) and
started once per session, stopped by PID at the end; a real kube-apiserver + etcd for the tests
marked ``kube``, built once (cached) and started once per session. Under CI=true a service that
cannot start fails those tests; elsewhere they are skipped with the reason."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.conftest import unavailable
from tests.slurm_cluster import SlurmCluster

if TYPE_CHECKING:
    from tests.kube_apiserver import KubeApiServer


@pytest.fixture(scope="session")
def slurm() -> Iterator[SlurmCluster]:
    if os.geteuid() != 0:
        unavailable("a test Slurm needs root (slurmd, mknod, apt-get)")
    # not under pytest's 0700 tmp: munged and mariadbd run as their own users
    root = Path(tempfile.mkdtemp(prefix="gpugap-slurm-"))
    root.chmod(0o755)
    cluster = SlurmCluster(root)
    try:
        cluster.start()
    except Exception as exc:
        cluster.stop()
        unavailable(f"could not start a test Slurm: {exc}")
    try:
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)


# --- a real kube-apiserver + etcd (tests/kube_apiserver.py) ---------------------------------


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "kube: needs a real kube-apiserver + etcd (built once into ~/.cache/gpugap/kube-<version>,"
        " started once per session)",
    )


@pytest.fixture(scope="session")
def kube(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KubeApiServer]:
    """etcd + kube-apiserver for the session, with deploy/kubernetes-producer-rbac.yaml applied
    and a token of the producer's ServiceAccount (``kube.kubeconfig(path)``); the test's own
    requests go through ``kube.admin`` (system:masters). The first session builds the binaries
    (minutes); a build or start that fails fails the tests under CI=true."""
    from tests.kube_apiserver import ApiError, KubeApiServer, KubeUnavailable, build

    try:
        build()
    except (KubeUnavailable, OSError) as exc:
        unavailable(f"could not build kube-apiserver and etcd: {exc}")
    server = KubeApiServer(tmp_path_factory.mktemp("kube"))
    try:
        server.start()
        server.install_producer_identity()
    except (KubeUnavailable, ApiError, OSError) as exc:
        server.stop()
        unavailable(f"could not start kube-apiserver and etcd: {exc}")
    try:
        yield server
    finally:
        server.stop()
