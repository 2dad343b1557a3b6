"""What the tests' Go-built tools share (harness/helm.py, harness/prometheus.py): finding ``go`` and
running a build step, each failure raised as the caller's own error so its fixture fails with
it (and says what to do)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path


def find_go(error: type[Exception], what: str) -> str:
    """The ``go`` binary on PATH or in /usr/local/go, else ``error`` naming ``what`` needs it."""
    for candidate in (shutil.which("go"), "/usr/local/go/bin/go"):
        if candidate and Path(candidate).exists():
            return candidate
    raise error(
        f"Go is needed once to build {what} from the Go module proxy; install it "
        "(https://go.dev/dl) or put `go` on PATH"
    )


def run(
    cmd: list[str],
    error: type[Exception],
    timeout: float = 3600,
    env: dict[str, str] | None = None,
) -> str:
    """``cmd``'s stdout; ``error`` with the output's last 20 lines when it fails."""
    proc = subprocess.run(
        cmd, capture_output=True, text=True, timeout=timeout, check=False, env=env
    )
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-20:])
        raise error(f"{' '.join(cmd)} failed ({proc.returncode}):\n{tail}")
    return proc.stdout.strip()
