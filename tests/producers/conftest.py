"""A real Slurm for the tests marked ``slurm``: installed (apt-get, only when missing) and
started once per session, stopped by PID at the end. Under CI=true a Slurm that cannot
start fails those tests; elsewhere they are skipped with the reason."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import unavailable
from tests.slurm_cluster import SlurmCluster


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
