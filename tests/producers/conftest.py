"""A real kube-apiserver + etcd for the tests marked ``kube``, built once (cached) and started
once per session (the real Slurm, ``slurm``, is in tests/conftest.py: tests/queue uses it too).
Under CI=true a service that cannot start fails those tests; elsewhere they are skipped with
the reason."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

from tests.conftest import unavailable

if TYPE_CHECKING:
    from tests.kube_apiserver import KubeApiServer


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
