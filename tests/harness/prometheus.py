"""A real Prometheus server for the tests: built once from the Go module proxy (``go install
github.com/prometheus/prometheus/cmd/{prometheus,promtool}@v0.316.0``, about 8 min cold on
2 busy cores) into ``~/.cache/gpugap/prometheus-<version>/``, like tests/harness/alertmanager.py.

History is loaded the way a site would backfill it: an OpenMetrics file of recorded series
goes through ``promtool tsdb create-blocks-from openmetrics FILE DIR``, and the server starts
on that TSDB directory (with a retention long enough that old blocks stay) on a free
loopback port. The build runs under a lock file, so two pytest sessions never build at once,
and the binaries are renamed into place when complete. A build that fails raises: the tests
that need Prometheus fail rather than skip.
"""

from __future__ import annotations

import fcntl
import os
import sys
import tempfile
import time
from pathlib import Path

from gpugap.groundfloor.settings import ServicesSettings
from tests.harness.go_build import find_go, run
from tests.harness.prom_process import PromProcess

VERSION = "0.316.0"
MODULE = "github.com/prometheus/prometheus"
TOOLS = ("prometheus", "promtool")


class PrometheusBuildError(RuntimeError):
    pass


def cache_path(cache_dir: Path | None = None) -> Path:
    cache = cache_dir or ServicesSettings().cache_dir
    return cache / f"prometheus-{VERSION}"


def ensure_built(cache_dir: Path | None = None) -> tuple[Path, Path]:
    """(prometheus, promtool): the cached binaries, else built now (once, under a lock)."""
    root = cache_path(cache_dir)
    exes = tuple(root / tool for tool in TOOLS)
    if all(exe.exists() for exe in exes):
        return exes[0], exes[1]
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another session building: wait for it
        if all(exe.exists() for exe in exes):
            return exes[0], exes[1]
        go = find_go(PrometheusBuildError, "Prometheus")
        print(
            f"building Prometheus {VERSION} and promtool from the Go module proxy into {root} "
            "(once, about 8 min on 2 cores)...",
            file=sys.stderr,
            flush=True,
        )
        started = time.monotonic()
        with tempfile.TemporaryDirectory(dir=root, prefix=".build-") as tmp:
            env = {**os.environ, "GOBIN": tmp, "GOFLAGS": "-buildvcs=false"}
            run(
                [go, "install", *(f"{MODULE}/cmd/{t}@v{VERSION}" for t in TOOLS)],
                PrometheusBuildError,
                env=env,
            )
            for tool, exe in zip(TOOLS, exes, strict=True):
                Path(tmp, tool).rename(exe)  # atomic: never a half-built binary in place
        print(f"built Prometheus in {time.monotonic() - started:.0f}s", file=sys.stderr, flush=True)
    return exes[0], exes[1]


def load_openmetrics(promtool: Path, text: str, tsdb: Path) -> None:
    """Write ``text`` (OpenMetrics, ``# EOF`` last) as TSDB blocks under ``tsdb``."""
    tsdb.mkdir(parents=True, exist_ok=True)
    source = tsdb.parent / f"{tsdb.name}.om"
    source.write_text(text)
    run(
        [str(promtool), "tsdb", "create-blocks-from", "openmetrics", str(source), str(tsdb)],
        PrometheusBuildError,
        timeout=300,
    )


class Prometheus(PromProcess):
    """One Prometheus server on a TSDB directory (history loaded with promtool), a free
    loopback port and no scrape targets: ``with Prometheus(exe, tsdb) as prom:``."""

    name = "Prometheus"

    def __init__(self, exe: Path, tsdb: Path) -> None:
        super().__init__(exe, tsdb.parent / "prometheus.log")
        self.tsdb = tsdb
        self.config = tsdb.parent / "prometheus.yml"
        self.config.write_text("global:\n  scrape_interval: 1h\n")  # no targets: history only

    def args(self) -> list[str]:
        return [
            f"--config.file={self.config}",
            f"--storage.tsdb.path={self.tsdb}",
            "--storage.tsdb.retention.time=100y",  # the loaded blocks are old: keep them
            f"--web.listen-address=127.0.0.1:{self.port}",
            "--log.level=warn",
        ]

    def __enter__(self) -> Prometheus:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


if __name__ == "__main__":  # python -m tests.harness.prometheus: build (or find) the binaries
    print(*ensure_built())
