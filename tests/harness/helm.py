"""The ``helm`` CLI for the chart tests: built once from the Go module proxy (``go install
helm.sh/helm/v4/cmd/helm@v4.3.2``, a few minutes cold on 2 cores) into
``~/.cache/gpugap/helm-<version>/helm``, like tests/harness/prometheus.py.

The build runs under a lock file, so two pytest sessions never build at once, and the binary is
renamed into place when complete. A build that fails raises ``HelmBuildError``: the chart tests
fail rather than skip.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from gpugap.groundfloor.settings import ServicesSettings
from tests.harness.go_build import find_go, run

VERSION = "4.3.2"
MODULE = "helm.sh/helm/v4"
COMMAND = f"{MODULE}/cmd/helm"


class HelmBuildError(RuntimeError):
    pass


def cache_path(cache_dir: Path | None = None) -> Path:
    cache = cache_dir or ServicesSettings().cache_dir
    return cache / f"helm-{VERSION}"


def ensure_built(cache_dir: Path | None = None) -> Path:
    """The cached ``helm`` binary, else built now (once, under a lock)."""
    root = cache_path(cache_dir)
    exe = root / "helm"
    if exe.exists():
        return exe
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another session building: wait for it
        if exe.exists():
            return exe
        go = find_go(HelmBuildError, "helm")
        print(
            f"building helm {VERSION} from the Go module proxy into {root} "
            "(once, a few minutes on 2 cores)...",
            file=sys.stderr,
            flush=True,
        )
        started = time.monotonic()
        with tempfile.TemporaryDirectory(dir=root, prefix=".build-") as tmp:
            env = {**os.environ, "GOBIN": tmp, "GOFLAGS": "-buildvcs=false"}
            env.setdefault("GOTOOLCHAIN", "auto")
            cmd = [go, "install", "-trimpath", "-ldflags=-s -w", f"{COMMAND}@v{VERSION}"]
            run(cmd, HelmBuildError, env=env)
            Path(tmp, "helm").rename(exe)  # atomic: never a half-built binary in place
        print(f"built helm in {time.monotonic() - started:.0f}s", file=sys.stderr, flush=True)
    return exe


def run_helm(
    helm: Path, *args: str, timeout: float = 120, check: bool = True
) -> subprocess.CompletedProcess[str]:
    """``helm ARGS`` with its config, cache and data dirs in a scratch place (never ~/.config)."""
    scratch = Path(tempfile.gettempdir()) / "gpugap-helm-home"
    env = {
        **os.environ,
        "HELM_CONFIG_HOME": str(scratch / "config"),
        "HELM_CACHE_HOME": str(scratch / "cache"),
        "HELM_DATA_HOME": str(scratch / "data"),
    }
    proc = subprocess.run(
        [str(helm), *args], capture_output=True, text=True, timeout=timeout, check=False, env=env
    )
    if check and proc.returncode != 0:
        raise AssertionError(
            f"helm {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
        )
    return proc


if __name__ == "__main__":  # python -m tests.harness.helm: build (or find) the binary
    t = time.monotonic()
    print(ensure_built(), f"{time.monotonic() - t:.1f} s")
