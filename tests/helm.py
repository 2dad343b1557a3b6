"""The ``helm`` CLI for the chart tests: built once from the Go module proxy (``go install
helm.sh/helm/v4/cmd/helm@v4.3.2``, a few minutes cold on 2 cores) into
``~/.cache/gpugap/helm-<version>/helm``, like tests/prometheus.py.

The build runs under a lock file, so two pytest sessions never build at once, and the binary is
renamed into place when complete. A build that fails raises ``HelmBuildError``: the chart tests
fail rather than skip.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from groundfloor.settings import ServicesSettings

VERSION = "4.3.2"
MODULE = "helm.sh/helm/v4"
COMMAND = f"{MODULE}/cmd/helm"


class HelmBuildError(RuntimeError):
    pass


def cache_path(cache_dir: Path | None = None) -> Path:
    cache = cache_dir or ServicesSettings().cache_dir
    return cache / f"helm-{VERSION}"


def _go() -> str:
    for candidate in (shutil.which("go"), "/usr/local/go/bin/go"):
        if candidate and Path(candidate).exists():
            return candidate
    raise HelmBuildError(
        "Go is needed once to build helm from the Go module proxy; install it "
        "(https://go.dev/dl) or put `go` on PATH"
    )


def _run(cmd: list[str], timeout: float = 3600, env: dict[str, str] | None = None) -> str:
    proc = subprocess.run(
        cmd, capture_output=True, text=True, timeout=timeout, check=False, env=env
    )
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-20:])
        raise HelmBuildError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{tail}")
    return proc.stdout.strip()


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
        go = _go()
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
            _run([go, "install", "-trimpath", "-ldflags=-s -w", f"{COMMAND}@v{VERSION}"], env=env)
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


if __name__ == "__main__":  # python -m tests.helm: build (or find) the binary
    t = time.monotonic()
    print(ensure_built(), f"{time.monotonic() - t:.1f} s")
