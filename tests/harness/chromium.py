"""Debian's Chromium for the tests that drive a real browser (never one Playwright or a test
tool downloads): where it is, and the flags it runs with here (headless, as root, and with no
background networking: this machine's closed network refuses it many times a start)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


def chromium_path() -> str | None:
    for name in ("chromium", "chromium-browser"):
        found = shutil.which(name)
        if found:
            return found
    return "/usr/bin/chromium" if os.path.exists("/usr/bin/chromium") else None


@contextmanager
def chromium_browser() -> Iterator[Any]:
    """Debian's Chromium under Playwright, as a Browser (each ``new_context()`` a fresh
    profile: one per person signing in); a missing browser or driver is the harness's
    ``unavailable`` (a failure under CI=true)."""
    from tests.harness.services import unavailable

    exe = chromium_path()
    if exe is None:
        unavailable("Chromium is not installed (apt-get install chromium)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        unavailable("the playwright package is not installed (pip install -e '.[test]')")
    pw = sync_playwright().start()
    try:
        browser = pw.chromium.launch(executable_path=exe, headless=True, args=CHROMIUM_ARGS)
    except Exception as exc:
        pw.stop()
        unavailable(f"Chromium ({exe}) did not start under Playwright: {exc}")
    try:
        yield browser
    finally:
        browser.close()
        pw.stop()
