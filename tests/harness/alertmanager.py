"""A real Prometheus Alertmanager for the tests: built once from the Go module proxy into
``~/.cache/gpugap/alertmanager-<version>/alertmanager`` (like the Kafka jars), then run on a
free loopback port with a storage directory of its own and a webhook receiver that the test
serves itself.

``go install ...@v0.35.0`` fails (the module zip lacks the web UI's built assets), so the
build copies the module out of the module cache and stubs ``ui/app/dist`` (see
/work/shared/reference/real-services.md). The build runs under a lock file, so two pytest
sessions never build at once, and the binary is renamed into place when complete, so a
half-built one is never taken for a finished one. A build that fails raises: the tests that
need Alertmanager fail rather than skip.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from gpugap.groundfloor.settings import ServicesSettings
from gpugap.services.kafka import free_port
from tests.harness.prom_process import PromProcess

VERSION = "0.35.0"
MODULE = "github.com/prometheus/alertmanager"


class AlertmanagerBuildError(RuntimeError):
    pass


def binary_path(cache_dir: Path | None = None) -> Path:
    cache = cache_dir or ServicesSettings().cache_dir
    return cache / f"alertmanager-{VERSION}" / "alertmanager"


def _go() -> str:
    for candidate in (shutil.which("go"), "/usr/local/go/bin/go"):
        if candidate and Path(candidate).exists():
            return candidate
    raise AlertmanagerBuildError(
        "Go is needed once to build Alertmanager from the Go module proxy; install it "
        "(https://go.dev/dl) or put `go` on PATH"
    )


def _run(cmd: list[str], cwd: Path | None = None, timeout: float = 1800) -> str:
    proc = subprocess.run(
        cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False
    )
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-20:])
        raise AlertmanagerBuildError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{tail}")
    return proc.stdout.strip()


def ensure_built(cache_dir: Path | None = None) -> Path:
    """The Alertmanager binary: the cached one, else built now (once, under a lock)."""
    exe = binary_path(cache_dir)
    if exe.exists():
        return exe
    exe.parent.mkdir(parents=True, exist_ok=True)
    with open(exe.parent / ".build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another session building: wait for it
        if exe.exists():
            return exe
        go = _go()
        print(
            f"building Prometheus Alertmanager {VERSION} from the Go module proxy into "
            f"{exe} (once, about 90 s)...",
            file=sys.stderr,
            flush=True,
        )
        started = time.monotonic()
        _run([go, "mod", "download", f"{MODULE}@v{VERSION}"], cwd=exe.parent, timeout=600)
        src = Path(_run([go, "env", "GOMODCACHE"])) / f"{MODULE}@v{VERSION}"
        with tempfile.TemporaryDirectory(dir=exe.parent, prefix=".build-") as tmp:
            work = Path(tmp, "am")
            shutil.copytree(src, work)
            for path in (work, *work.rglob("*")):
                if not path.is_symlink():
                    path.chmod(path.stat().st_mode | 0o200)
            dist = work / "ui" / "app" / "dist"
            dist.mkdir(parents=True, exist_ok=True)
            (dist / "index.html").write_text("<html></html>\n")
            built = Path(tmp, "alertmanager")
            _run([go, "build", "-buildvcs=false", "-o", str(built), "./cmd/alertmanager"], cwd=work)
            built.rename(exe)  # atomic: a half-built binary is never taken for a whole one
        print(
            f"built Alertmanager in {time.monotonic() - started:.0f}s", file=sys.stderr, flush=True
        )
    return exe


def _config(webhook_url: str) -> str:
    # JSON is YAML: no YAML writer needed, and the URL is quoted properly
    return json.dumps(
        {
            "route": {
                "receiver": "webhook",
                "group_by": ["alertname", "alert_id"],
                "group_wait": "1s",
                "group_interval": "1s",
                "repeat_interval": "1h",
            },
            "receivers": [
                {
                    "name": "webhook",
                    "webhook_configs": [{"url": webhook_url, "send_resolved": True}],
                }
            ],
        },
        indent=2,
    )


class Alertmanager(PromProcess):
    """One Alertmanager process: ``start()``/``stop()`` (again and again, on the same port
    and storage: an outage), or ``with Alertmanager(exe, webhook_url) as am:``."""

    name = "Alertmanager"
    poll_s = 0.1

    def __init__(self, exe: Path, webhook_url: str, root: Path | None = None) -> None:
        self._own_root = root is None
        self.root = root or Path(tempfile.mkdtemp(prefix="gpugap-am-"))
        self.root.mkdir(parents=True, exist_ok=True)
        super().__init__(exe, self.root / "alertmanager.log")
        self.config = self.root / "alertmanager.yml"
        self.config.write_text(_config(webhook_url))
        self.storage = self.root / "data"

    def args(self) -> list[str]:
        return [
            f"--config.file={self.config}",
            f"--storage.path={self.storage}",
            f"--web.listen-address=127.0.0.1:{self.port}",
            "--cluster.listen-address=",  # empty: no gossip port, no peers
            "--log.level=warn",
        ]

    def close(self) -> None:
        self.stop()
        if self._own_root:
            shutil.rmtree(self.root, ignore_errors=True)

    def pause(self) -> None:
        """Freeze the process (SIGSTOP): it still accepts connections (the kernel does) but
        answers nothing until ``resume()``, then handles what waited: a hung Alertmanager,
        unlike a stopped one, keeps its alerts and processes requests the client gave up on."""
        assert self.proc is not None and self.proc.poll() is None, "not running"
        os.kill(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        """Thaw a ``pause()``d process (SIGCONT)."""
        assert self.proc is not None, "not running"
        os.kill(self.proc.pid, signal.SIGCONT)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGCONT)  # a paused process cannot act on SIGTERM
        super().stop()

    def alerts(self, **filters: str) -> list[dict[str, Any]]:
        """``GET /api/v2/alerts`` (active, silenced, inhibited and unprocessed by default)."""
        query = "&".join(f"{k}={v}" for k, v in filters.items())
        url = f"{self.url}/api/v2/alerts" + (f"?{query}" if query else "")
        with urllib.request.urlopen(url, timeout=5) as r:
            out: list[dict[str, Any]] = json.load(r)
        return out


class WebhookReceiver:
    """The receiver Alertmanager's ``webhook_configs`` posts to: an aiohttp server the test
    runs in its own event loop (``async with receiver.serving():``), on a port chosen before
    Alertmanager starts (it retries a receiver that does not answer yet)."""

    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/hook"
        #: every notification body, in arrival order
        self.received: list[dict[str, Any]] = []

    @asynccontextmanager
    async def serving(self) -> AsyncIterator[WebhookReceiver]:
        from aiohttp import web

        async def hook(request: web.Request) -> web.Response:
            self.received.append(await request.json())
            return web.Response(status=200)

        app = web.Application()
        app.router.add_post("/hook", hook)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        try:
            await web.TCPSite(runner, "127.0.0.1", self.port).start()
            yield self
        finally:
            await runner.cleanup()

    def statuses(self, alert_id: str) -> list[str]:
        """The status of each notification about ``alert_id``: 'firing', 'resolved'..."""
        return [
            a["status"]
            for body in self.received
            for a in body.get("alerts", ())
            if a.get("labels", {}).get("alert_id") == alert_id
        ]


if __name__ == "__main__":  # python -m tests.harness.alertmanager: build (or find) the binary
    print(ensure_built())
