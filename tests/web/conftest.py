"""The page's tests share one warehouse (the demo's day, tests/harness/demo_data.py, ~100 s), one
page server over it (as the read-only user) and one headless Chromium (Debian's, driven by
Playwright; never a browser Playwright downloads). A missing browser or driver fails the
tests under CI=true and skips them elsewhere, like every other service."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.harness.chromium import CHROMIUM_ARGS, chromium_path
from tests.harness.services import unavailable
from tests.harness.warehouse import DemoWarehouse


@pytest.fixture(scope="session")
def page_url(demo_warehouse: DemoWarehouse) -> Iterator[str]:
    """The page over the demo's warehouse, served from a thread (as ``gpugap web`` does)."""
    from tests.harness.web_page import Background

    server = Background(demo_warehouse.settings)
    try:
        yield server.url
    finally:
        server.stop()


@pytest.fixture(scope="module")
def browser(demo_warehouse: DemoWarehouse) -> Iterator[Any]:
    """A headless Chromium context with a fresh profile of its own, per test file. Playwright's
    sync API keeps an event loop running in the main thread while it lives, and ``asyncio.run``
    refuses to start under it: per file, so that the files a pytest-xdist worker runs after
    this one start theirs (the demo's warehouse, loaded with it, first)."""
    exe = chromium_path()
    if exe is None:
        unavailable("Chromium is not installed (apt-get install chromium)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        unavailable("the playwright package is not installed (pip install -e '.[test]')")
    profile = tempfile.mkdtemp(prefix="gpugap-chromium-")
    pw = sync_playwright().start()
    try:
        context = pw.chromium.launch_persistent_context(
            profile,
            executable_path=exe,
            headless=True,
            args=CHROMIUM_ARGS,
            viewport={"width": 1400, "height": 1000},
        )
    except Exception as exc:
        pw.stop()
        shutil.rmtree(profile, ignore_errors=True)
        unavailable(f"Chromium ({exe}) did not start under Playwright: {exc}")
    try:
        yield context
    finally:
        context.close()
        pw.stop()
        shutil.rmtree(profile, ignore_errors=True)


@dataclass
class Tab:
    page: Any  # a Playwright Page
    url: str  # the page server's
    errors: list[str] = field(default_factory=list)  # console errors, uncaught exceptions
    foreign: list[str] = field(default_factory=list)  # requests beyond the page's server

    def open(self, query: str = "") -> None:
        """Load the page (with ``query``) and wait until it drew everything."""
        self.page.goto(self.url + query)
        self.ready(0)

    def generation(self) -> int:
        return int(self.page.get_attribute("body", "data-generation") or 0)

    def ready(self, after: int) -> None:
        """Wait until a view newer than generation ``after`` is drawn, or the page says why not."""
        # a function, not an expression: the page's CSP forbids eval, which an expression needs
        self.page.wait_for_function(
            "(after) => document.body.dataset.state === 'error' || "
            "(document.body.dataset.state === 'ready' && "
            "Number(document.body.dataset.generation) > after)",
            arg=after,
            timeout=60_000,
        )
        state = self.page.get_attribute("body", "data-state")
        assert state == "ready", self.page.text_content("#status")

    def value(self, element_id: str) -> float:
        return float(self.page.get_attribute(f"#{element_id}", "data-value") or "nan")

    def window(self) -> tuple[int, int]:
        since = self.page.get_attribute("body", "data-since")
        until = self.page.get_attribute("body", "data-until")
        return int(since or 0), int(until or 0)


@pytest.fixture
def tab(browser: Any, page_url: str) -> Iterator[Tab]:
    """A new tab on the page's server; console errors and foreign requests are recorded."""
    t = Tab(browser.new_page(), page_url)
    t.page.on("console", lambda m: t.errors.append(m.text) if m.type == "error" else None)
    t.page.on("pageerror", lambda e: t.errors.append(str(e)))
    t.page.on("request", lambda r: None if r.url.startswith(page_url) else t.foreign.append(r.url))
    try:
        yield t
    finally:
        t.page.close()


@pytest.fixture
def artifacts(tmp_path: Path) -> list[Path]:
    """Where screenshots go: the test's tmp dir, and $GPUGAP_ARTIFACTS when it is set."""
    dirs = [tmp_path]
    extra = os.environ.get("GPUGAP_ARTIFACTS")
    if extra:
        Path(extra).mkdir(parents=True, exist_ok=True)
        dirs.append(Path(extra))
    return dirs


def screenshot(page: Any, dirs: list[Path], name: str) -> list[Path]:
    # the bytes, written here: Playwright writes a path= in a thread it starts then (a leak)
    png = page.screenshot(full_page=True)
    paths = [d / f"web-{name}.png" for d in dirs]
    for p in paths:
        p.write_bytes(png)
    return paths
