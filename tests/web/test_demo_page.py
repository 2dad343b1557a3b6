"""``gpugap demo`` serves the page while it runs and prints its URL; the page shows the demo's
warehouse (as the endpoint's read-only user), and stops with the demo."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import requests

from gpugap.services.kafka import free_port
from tests.web.conftest import screenshot

pytestmark = pytest.mark.kafka


def test_the_demo_prints_the_pages_url_and_serves_it(
    tmp_path: Path, browser: Any, artifacts: list[Path]
) -> None:
    demo = subprocess.Popen(
        [sys.executable, "-m", "gpugap", "demo", "--scenario", "small", "--speed", "0",
         "--duration", "600", "--clickhouse-port", str(free_port()),
         "--data-dir", str(tmp_path / "data")],
        env={**os.environ, "GPUGAP_LOG_LEVEL": "WARNING", "PYTHONUNBUFFERED": "1"},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    out: list[str] = []
    try:
        assert demo.stdout is not None
        for line in demo.stdout:  # until it holds, waiting for Ctrl-C / --duration
            out.append(line)
            if "running for" in line and "(--duration)" in line:
                break
        text = "".join(out)
        found = re.search(r"The capacity-gap page: (http://127\.0\.0\.1:\d+/)", text)
        assert found, text[-3000:]
        url = found.group(1)
        summary = requests.get(url + "api/summary?from=0&to=86400", timeout=30)
        assert summary.status_code == 200, summary.text
        page = browser.new_page()
        try:
            page.goto(url + "?preset=24")
            page.wait_for_function(
                "() => ['ready', 'error'].includes(document.body.dataset.state)", timeout=60_000
            )
            assert page.get_attribute("body", "data-state") == "ready", page.text_content("#status")
            allocated = float(page.get_attribute("#sum-allocated", "data-value") or 0)
            assert allocated > 0, "the page shows no allocated GPU-hours of the demo"
            screenshot(page, artifacts, "demo")
        finally:
            page.close()
        demo.send_signal(signal.SIGTERM)
        rest, _ = demo.communicate(timeout=120)
    finally:
        if demo.poll() is None:
            demo.kill()
            demo.wait()
    assert demo.returncode == 0, (text + rest)[-3000:]
    with pytest.raises(requests.ConnectionError):  # it stopped with the demo
        requests.get(url, timeout=5)
